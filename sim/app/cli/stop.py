"""What a stop signal does to a command: SIGINT (Ctrl-C), SIGTERM (``kill``, a scheduler's
time limit) and SIGHUP (a closed terminal) become one exception, ``Stopped``, raised in
the main thread where the command runs.

``Stopped`` is a BaseException, like KeyboardInterrupt, so no ``except Exception`` stops
it and every ``finally`` and ``except BaseException`` on its way out runs: a staged output
is removed (sim/app/runs/out_dir.py), a worker pool ends its workers at once
(sim/app/runs/backends.py). The entry point (sim/app/cli/main.py, the only caller of
``install``) then prints ``kept_line`` and exits with 128 + the signal's number (130 for
Ctrl-C, 143 for SIGTERM), the status a shell reports for a process the signal ended.

A second stop signal while the first is being handled ends the process at once
(``os._exit``), for a user who will not wait: staging left behind is removed by the next
run into the same place (sim/staging.py remove_stale_staging), and local workers end with
this process (backends.py's lifeline). Library code never installs handlers: only the
command line decides what a signal means.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

#: The signals that stop a command.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal ``signum``, raised where the command was when it arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)  # args alone rebuild it (SimPy re-raises type(e)(*e.args))
        self.signum = signum

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


def install() -> None:
    """Turn the first of STOP_SIGNALS into Stopped, and any after it into an immediate
    exit (module docstring). Call from the main thread."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stopped)


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    for s in STOP_SIGNALS:
        signal.signal(s, _exit_now)
    raise Stopped(signum)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    """A stop signal during the cleanup of the first: exit now, without cleaning up."""
    name = signal.Signals(signum).name
    os.write(2, f"stopped by {name} again: exiting without cleaning up; the next run into "
                f"the same place removes what is left\n".encode())
    os._exit(128 + signum)


def exit_code(stop: Stopped) -> int:
    """The exit status for a command ``stop`` ended: 128 + the signal's number."""
    return 128 + stop.signum


def kept_line(stop: Stopped, outputs: Sequence[Path], since: float) -> str:
    """One line on what a stopped command kept: for each of its ``outputs`` (the paths it
    writes), whether it was written in full before the signal (something there was
    modified at or after ``since``, the command's start in seconds since the epoch) or
    not at all (what was there is as it was). Outputs are written whole or not at all
    (out_dir.py), so there is no third case to report."""
    if not outputs:
        return f"{stop}: nothing is half-written (outputs are written whole or not at all)"
    parts = []
    for path in outputs:
        if _written_since(path, since):
            parts.append(f"{path} was written in full before the signal")
        elif path.exists():
            parts.append(f"nothing written to {path}; what was there is as it was")
        else:
            parts.append(f"nothing written to {path}")
    return f"{stop}: " + "; ".join(parts)


def _written_since(path: Path, since: float) -> bool:
    """Whether the file ``path``, or a visible entry of the directory ``path``, was
    modified at or after ``since`` (seconds since the epoch). Staging entries (hidden,
    sim/staging.py) do not count: they are not outputs."""
    try:
        if path.is_dir():
            times = [e.stat().st_mtime for e in path.iterdir() if not e.name.startswith(".")]
        else:
            times = [path.stat().st_mtime]
    except OSError:
        return False
    return max(times, default=0.0) >= since
