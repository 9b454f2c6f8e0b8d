"""Processes a test started, found again: a tag in each one's environment
(/proc/PID/environ), which every process it starts inherits (an orphan is re-parented,
so a walk of the process tree would miss it); starting, waiting for, stopping and
killing them; and what they left in an output place (hidden staging, file bytes). Shared
by tests/test_signals.py and tests/test_chaos.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TAG = "SERVESIM_TEST_SIGNALS"


def tagged(tag: str) -> list[int]:
    """The live processes whose environment holds TAG=tag (a zombie's is empty)."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def cmdlines(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                       .decode(errors="replace")[:120])
        except OSError:
            continue
    return out


def survivors(tag: str, within: float, ignoring: tuple[str, ...] = ()) -> list[str]:
    """The command lines of tagged processes still alive ``within`` seconds from now, but
    those holding one of ``ignoring`` (polled; empty as soon as none is left)."""
    deadline = time.monotonic() + within
    while True:
        left = [c for c in cmdlines(tagged(tag)) if not any(i in c for i in ignoring)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def kill_tagged(tag: str) -> None:
    """SIGKILL whatever a test's child left running, so that a failure leaks nothing."""
    for pid in tagged(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start(argv: list[str], cwd: Path, tag: str) -> subprocess.Popen[bytes]:
    """``argv`` in a new Python process tagged ``tag``, output to cwd/stdout and
    cwd/stderr (files: a pipe held open by an orphan would hang the reader)."""
    env = {**os.environ, TAG: tag, "PYTHONPATH": str(ROOT)}
    with open(cwd / "stdout", "wb") as out, open(cwd / "stderr", "wb") as err:
        return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=out,
                                stderr=err)


def wait_for(what: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float,
             cwd: Path) -> None:
    """Poll until ``what()`` holds; fail when ``proc`` ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not what():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"not ready (exit {proc.returncode}): "
                        f"{(cwd / 'stderr').read_text(errors='replace')[-2000:]}")
        time.sleep(0.005)


def stop_and_time(proc: subprocess.Popen[bytes], signum: int, timeout: float = 60) -> float:
    """Send ``signum`` and wait for the process; seconds until it exited."""
    t0 = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout)
    return time.monotonic() - t0


def workers_running(tag: str, n: int) -> Callable[[], bool]:
    """Whether the tagged process tree has its forkserver and ``n`` workers."""
    return lambda: sum("forkserver" in c for c in cmdlines(tagged(tag))) >= n + 1



def staging(parent: Path) -> list[str]:
    """Hidden entries of ``parent``: staging (sim/staging.py names start with a dot)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (hidden ones included) by relative name: its bytes."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


# -- the commands under test ------------------------------------------------------

@dataclass(frozen=True)
class Command:
    """A small workload of one command: its arguments (without --out, the seed and the
    workers), what it writes into --out, which of those two runs of the same arguments
    write byte for byte alike (the others hold the wall time), and how long after its
    first line it may be stopped (seconds: its work, its writing and a little past its
    end, as measured on a shared two-core machine)."""

    args: tuple[str, ...]
    seed_option: str
    files: tuple[str, ...]
    exact: tuple[str, ...]
    span: float
    workers: bool = True  # takes --workers

    def argv(self, seed: int, out: Path, workers: int) -> list[str]:
        return [*self.args, self.seed_option, str(seed), "--out", str(out),
                *(["--workers", str(workers)] if self.workers else [])]


RUN_FILES = ("config.json", "requests.csv", "steps.csv", "summary.json")
COMMANDS = {
    "run": Command(("run", "--num-requests", "300"), "--seed", RUN_FILES, RUN_FILES, 1.0,
                   workers=False),
    "sweep": Command(("sweep", "--num-requests", "20", "--max-num-seqs", "8,16"), "--seeds",
                     ("frontier.csv", "sweep.csv", "sweep.html", "sweep.json"),
                     ("frontier.csv", "sweep.csv", "sweep.json"),
                     3.0),
    "plan": Command(("plan", "--num-requests", "20", "--max-probes", "2", "--slo-ttft", "0.5"),
                    "--seeds", ("capacity.html", "capacity.md", "plan.json", "vllm_serve.yaml"), (),
                    3.0),
}
PREVIOUS, NEW = 1, 2  # the seed of the run already in place, and of the one stopped
