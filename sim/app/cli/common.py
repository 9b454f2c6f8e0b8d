"""What every command shares: the consoles, the one-line failure (``fail``: stderr, exit
code 1), the exceptions that count as bad input, and the progress of long work (a bar with
the time left on a terminal, a plain line every few seconds elsewhere; stderr only, so
stdout stays the same whether or not anyone watches). rich's progress module is imported
when a bar is drawn: a command off a terminal never loads it."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import typer
from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import ProgressColumn

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


#: Wall-clock seconds between progress lines off a terminal, and before the first one, so
#: that a command which ends sooner prints none.
LINE_INTERVAL_S = 5.0


class ProgressDisplay(Protocol):
    """What the commands use of a progress display (rich's Progress, ProgressLines): tasks
    added with a ``total`` and an optional ``unit`` field, updated with ``completed``."""

    def __enter__(self) -> ProgressDisplay: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...

    def add_task(self, description: str, /, *, total: float | None = ...,
                 unit: str | None = ...) -> Any: ...

    def update(self, task: Any, /, *, completed: float | None = ...) -> None: ...

    def reset(self, task: Any, /, *, total: float | None = ...,
              description: str | None = ...) -> None: ...


def progress_bar(*, terminal: bool | None = None, interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> ProgressDisplay:
    """The commands' progress, on stderr (never stdout). On a terminal (``terminal`` None:
    whether stderr is one) a rich bar: description, bar, done/total with the task's
    ``unit`` field, time elapsed and time left, gone when done. Elsewhere (a pipe, a CI
    log) ProgressLines, a line every ``interval_s`` seconds (LINE_INTERVAL_S by
    default). ``clock``: wall-clock seconds (a fake one in tests)."""
    if not (sys.stderr.isatty() if terminal is None else terminal):
        return ProgressLines(_progress_line,
                             LINE_INTERVAL_S if interval_s is None else interval_s, clock)
    from rich.progress import BarColumn, Progress, TimeElapsedColumn

    count_column, time_left_column = _bar_columns()
    return Progress("[progress.description]{task.description}", BarColumn(), count_column(),
                    TimeElapsedColumn(), time_left_column(), console=err_console,
                    transient=True, get_time=clock)


def _progress_line(line: str) -> None:
    err_console.print(line, markup=False, highlight=False, soft_wrap=True)


def time_left_s(elapsed_s: float, done: float, total: float | None) -> float | None:
    """Seconds left at the mean pace so far (``elapsed_s`` per ``done`` units); None
    before the first unit is done or without a total."""
    if total is None or done <= 0:
        return None
    return max(total - done, 0.0) * elapsed_s / done


def time_left_text(elapsed_s: float, done: float, total: float | None) -> str:
    """"~2 min left" (time_left_s); "" with no estimate or nothing left."""
    left = time_left_s(elapsed_s, done, total)
    return "" if left is None or left <= 0 else f"~{duration_text(left)} left"


def duration_text(seconds: float) -> str:
    """A duration as rough as an estimate: "38 s", "12 min", "2.3 h"."""
    if seconds < 89.5:
        return f"{seconds:.0f} s"
    if seconds < 89.5 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def count_text(done: float, total: float | None, unit: str | None) -> str:
    """"4,210/19,366 requests" (no total: the count alone; no unit: the numbers alone)."""
    count = f"{done:,.0f}" + ("" if total is None else f"/{total:,.0f}")
    return f"{count} {unit}" if unit else count


@functools.cache
def _bar_columns() -> tuple[type[ProgressColumn], type[ProgressColumn]]:
    """The bar's CountColumn and TimeLeftColumn, rich progress columns: classes made
    once, when the first bar is drawn, as their base class is in rich's progress module,
    which a command off a terminal never imports."""
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    class CountColumn(ProgressColumn):
        """Done/total and the task's ``unit`` field (count_text)."""

        def render(self, task: Task) -> Text:
            return Text(count_text(task.completed, task.total, task.fields.get("unit")),
                        style="progress.download")

    class TimeLeftColumn(ProgressColumn):
        """"~2 min left" at the mean pace since the task started (time_left_text)."""

        def render(self, task: Task) -> Text:
            return Text(time_left_text(task.elapsed or 0.0, task.completed, task.total),
                        style="progress.remaining")

    return CountColumn, TimeLeftColumn


def __getattr__(name: str) -> type[ProgressColumn]:
    """``CountColumn`` and ``TimeLeftColumn``, the bar's columns (_bar_columns)."""
    if name == "CountColumn":
        return _bar_columns()[0]
    if name == "TimeLeftColumn":
        return _bar_columns()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(slots=True)
class LineTask:
    """One task of ProgressLines: what it counts and since when (clock seconds)."""

    description: str
    total: float | None
    unit: str | None
    start_s: float
    completed: float = 0.0


class ProgressLines:
    """Progress off a terminal: on an update, a line such as "servesim: simulating:
    4,210/19,366 requests, 38 s elapsed, ~2 min left" through ``echo`` when
    ``interval_s`` seconds of ``clock`` have passed since the last line (the first after
    ``interval_s`` from construction, so work that ends sooner prints none)."""

    def __init__(self, echo: Callable[[str], None], interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._echo, self._interval_s, self._clock = echo, interval_s, clock
        self._tasks: list[LineTask] = []
        self._next_line_s = clock() + interval_s

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        return None

    def add_task(self, description: str, /, *, total: float | None = None,
                 unit: str | None = None) -> int:
        """A new task (its index), started now."""
        self._tasks.append(LineTask(description, total, unit, self._clock()))
        return len(self._tasks) - 1

    def reset(self, task: int, /, *, total: float | None = None,
              description: str | None = None) -> None:
        """Start ``task`` again from 0 (a new phase: the pace is measured afresh)."""
        t = self._tasks[task]
        t.completed, t.start_s = 0.0, self._clock()
        t.total = t.total if total is None else total
        t.description = t.description if description is None else description

    def update(self, task: int, /, *, completed: float | None = None) -> None:
        """Record ``completed`` units; print a line when one is due."""
        t = self._tasks[task]
        if completed is not None:
            t.completed = completed
        now = self._clock()
        if now < self._next_line_s:
            return
        self._next_line_s = now + self._interval_s
        elapsed = now - t.start_s
        left = time_left_text(elapsed, t.completed, t.total)
        self._echo(f"servesim: {t.description}: {count_text(t.completed, t.total, t.unit)}, "
                   f"{duration_text(elapsed)} elapsed" + (f", {left}" if left else ""))
