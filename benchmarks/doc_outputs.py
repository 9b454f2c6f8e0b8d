"""Re-run the commands a markdown page shows and compare (or rewrite) the outputs it prints.

A page's example is a fenced ``bash`` block followed at once by a plain fenced block: the
command and the terminal output it gives. This script runs every such command from the
repository root (commands name ``../shared/traces/...`` and write under ``runs/``, which
git ignores) and compares its stdout with the block below it, wall-clock times masked
("in 12.3 s" reads "in X s" on both sides, as in golden_runs.sh) and trailing spaces
dropped. stderr (progress lines) is not part of an output block.

    python benchmarks/doc_outputs.py docs/first_hour.md           # check: exit 1 on a diff
    python benchmarks/doc_outputs.py docs/first_hour.md --write   # rewrite the output blocks

The figures are whatever main computes: a page checked here reproduces on main.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Wall-clock figures that differ between runs of the same command.
_WALL = (re.compile(r"in [0-9.]+ s\b"), re.compile(r"[0-9.]+ s wall"))


@dataclass(frozen=True)
class Example:
    """One command of a page and the output block below it (line numbers 0-based, the
    output block's fences excluded: lines[first:last] is its text)."""

    command: str
    first: int
    last: int


def examples(lines: list[str]) -> list[Example]:
    """Every ``bash`` block followed directly by a plain block, in page order."""
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        end = lines.index("```", i + 1)
        command = "\n".join(lines[i + 1:end])
        if end + 1 < len(lines) and lines[end + 1].strip() == "```":
            close = lines.index("```", end + 2)
            out.append(Example(command, end + 2, close))
            i = close + 1
        else:
            i = end + 1
    return out


def masked(text: str) -> str:
    """``text`` with its wall-clock figures replaced."""
    for pattern, repl in zip(_WALL, ("in X s", "X s wall"), strict=True):
        text = pattern.sub(repl, text)
    return text


def run(command: str) -> str:
    """The stdout of ``command`` run by bash from the repository root; raises
    RuntimeError with its stderr when it fails."""
    done = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command!r} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout.rstrip("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("--write", action="store_true", help="rewrite the output blocks")
    args = ap.parse_args()
    lines = args.page.read_text().split("\n")
    failures = 0
    for ex in reversed(examples(lines)):  # from the end: replacing keeps earlier indices
        since = time.monotonic()
        got = [x.rstrip() for x in run(ex.command).split("\n")]
        took = time.monotonic() - since
        want = lines[ex.first:ex.last]
        same = [masked(x) for x in got] == [masked(x.rstrip()) for x in want]
        print(f"{'same' if same else 'DIFFERS'} ({took:.0f} s): {ex.command.splitlines()[0]}")
        if same:
            continue
        if args.write:
            lines[ex.first:ex.last] = got
        else:
            failures += 1
            sys.stdout.writelines(difflib.unified_diff(
                [x + "\n" for x in want], [x + "\n" for x in got], "page", "main"))
    if args.write:
        args.page.write_text("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
