"""Instructions the simulation of the Mooncake replay takes with each prefix cache, counted
by valgrind (cachegrind): a figure that moves by about 0.3% (a few million) from run to
run, so a change worth 1-2% shows, where wall time on a shared 2-core machine moves by
5-10%.

Each figure is the instructions of a process that prepares the first ``--num-requests``
requests of the trace and simulates them, less those of one that only prepares them;
both run with ``PYTHONHASHSEED=0``, one BLAS thread and the garbage collector off during
the simulation (where collections fall would otherwise move the count). Prints figures
(no assertions); needs ``valgrind`` on the PATH. About 20-25 s a mode for 3,000 requests.

Usage, from the repo root:

    python benchmarks/count_instructions.py [--num-requests N] [--modes none,block,radix]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"

CHILD = """
import dataclasses, gc, sys
sys.path.insert(0, {root!r})
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
base = prepare(RunConfig(trace={trace!r}, num_requests={n}))
cfg = dataclasses.replace(base.config, prefix_cache={mode!r})
prep = dataclasses.replace(base, config=cfg,
                           scheduler=dataclasses.replace(base.scheduler, prefix_cache={mode!r}))
gc.collect()
gc.disable()
if {simulate}:
    simulate_prepared(prep)
"""


def instructions(mode: str, n: int, simulate: bool) -> int:
    """Instructions of one child process (cachegrind's ``I refs``)."""
    code = CHILD.format(root=str(ROOT), trace=str(TRACE), n=n, mode=mode, simulate=simulate)
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                          "--cachegrind-out-file=/dev/null", sys.executable, "-c", code],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode or found is None:
        sys.exit(f"valgrind run failed (exit {out.returncode}) or printed no instruction "
                 f"count:\n{out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=3000)
    ap.add_argument("--modes", default="none,block,radix")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind not found: install it (apt install valgrind) to count instructions")
    if not TRACE.exists():
        sys.exit(f"{TRACE} not found: the public traces live in ../shared/traces")
    modes = args.modes.split(",")
    print(f"first {args.num_requests:,} requests of {TRACE.name}; simulation only "
          "(preparing subtracted), millions of instructions")
    counts = {}
    for mode in modes:
        counts[mode] = (instructions(mode, args.num_requests, True)
                        - instructions(mode, args.num_requests, False))
        ratio = f"{counts[mode] / counts[modes[0]]:.2f}x of {modes[0]}"
        print(f"{mode:6} {counts[mode] / 1e6:>9,.0f} M  {ratio}")


if __name__ == "__main__":
    main()
