"""What every command shares: the consoles, the one-line failure (``fail``: stderr, exit
code 1), the exceptions that count as bad input, and the progress bar."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

# Off a terminal (pipes, CI logs) rich would assume 80 columns and cut numbers short.
console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

# Bad input and file-system refusals (a missing file, a directory where a file goes, no
# permission), and a workload too large for memory: one line, exit 1.
INPUT_ERRORS = (ValueError, OSError, MemoryError)


def fail(message: str) -> NoReturn:
    """Print one line to stderr and exit with code 1. Called while a MemoryError is being
    handled (Python's, empty, or numpy's "Unable to allocate ..."), the line is
    :func:`memory_line`'s instead of ``message``."""
    handled = sys.exc_info()[1]
    if isinstance(handled, MemoryError):
        message = memory_line(handled)
    message = message or "an error with no message"
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def warn(message: str) -> None:
    """Print one ``warning:`` line to stderr; the command goes on."""
    err_console.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)


def memory_line(exc: MemoryError) -> str:
    """The line for a command that ran out of memory: what could not be allocated (numpy
    says how much) and what to change. A workload's size sets the memory of a run, and of
    the sweep, plan, validation or report built on runs, so the line names
    --num-requests."""
    what = f"out of memory ({exc})" if str(exc) else "out of memory"
    return (f"{what}: the workload does not fit in this machine's memory; lower "
            "--num-requests, or cut a trace with --window")


def progress_bar() -> Any:
    """The commands' progress bar (a rich Progress on stderr, off when stderr is not a
    terminal, gone when done)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress("[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=err_console,
                    transient=True, disable=not sys.stderr.isatty())
