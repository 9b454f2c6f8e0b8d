"""Slot diagrams: which request holds which batch slot at each engine step.

Owns the SlotRecorder (an engine StepObserver), the SlotGrid it produces, and its text
rendering for the terminal (a textbook figure: ``A``, ``B``, ... for requests that compute
this step, ``.`` for a slot held idle, a blank for an empty slot); the HTML page and
figure are sim/app/reports/slot_page.py's.

Slot rule: a request takes the lowest free slot row when it first holds a slot (admission)
and keeps that row until it stops holding one (finish or preemption; a preempted request
takes a new row when it is admitted again). A cell is *useful* when its request computed
tokens this step, *idle* when the request holds the slot without computing (a finished
member of a static batch; a running decode stalled by a prefill-only step), *empty* when
nobody holds it. The three fractions count cells of max_num_seqs x steps, as the
slots_useful / slots_idle / slots_empty columns of steps.csv do.

Large runs are cut: the grid keeps a window of ``max_steps`` steps (from a given first
step, else the first where the batch is fullest) and ``max_slots`` rows, and its text is
cut again to a terminal's width (fit_width); the whole-run counts are still exact.
``diagram_for_config`` re-simulates a RunConfig through sim.app.runs.runner (imported
lazily) with the recorder attached.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.app.runs.runner import Prepared, RunConfig
    from sim.batch import BatchPlan
    from sim.request import Request

IDLE_CHAR = "."
EMPTY_CHAR = " "


def label_for(i: int) -> str:
    """Spreadsheet-style request letters: 0 -> A, 25 -> Z, 26 -> AA, ..."""
    s = ""
    i += 1
    while i > 0:
        i, r = divmod(i - 1, 26)
        s = chr(ord("A") + r) + s
    return s


@dataclass(frozen=True, slots=True)
class Cell:
    """One occupied cell: the request's letter, its request_id and the tokens it computed
    this step (0 = held idle)."""

    label: str
    request_id: str
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Counts:
    """Cell counts of a grid or a whole run; empty = total - useful - idle."""

    useful: int
    idle: int
    total: int

    @property
    def empty(self) -> int:
        return self.total - self.useful - self.idle

    def fractions_text(self) -> str:
        """``useful 27/56 (48%)  idle 17/56 (30%)  empty 12/56 (21%)``."""
        t = self.total
        parts = []
        for name, n in (("useful", self.useful), ("idle", self.idle), ("empty", self.empty)):
            pct = f" ({n / t:.0%})" if t else ""
            parts.append(f"{name} {n:,}/{t:,}{pct}")
        return "  ".join(parts)


#: One step's shown slot rows: row -> (request_id, tokens computed this step, 0 = idle).
Column = dict[int, tuple[str, int]]


@dataclass(frozen=True, slots=True)
class SlotGrid:
    """The recorded diagram of one run. ``cells[slot][step]`` is a Cell or None (empty).

    num_slots / num_steps are the run's; the grid holds the first len(cells) slot rows
    and len(cells[0]) steps from ``first_step`` (1-based). ``shown`` counts the cells of
    the grid, ``run`` the whole run. Letters follow the order in which requests first
    appear in the grid (by step, then slot row).
    """

    title: str
    num_slots: int
    num_steps: int
    first_step: int
    cells: tuple[tuple[Cell | None, ...], ...]
    shown: Counts
    run: Counts
    legend: tuple[tuple[str, str], ...]  # (letter, request_id) in order of appearance

    @property
    def shown_steps(self) -> int:
        return len(self.cells[0]) if self.cells else 0

    @property
    def shown_slots(self) -> int:
        return len(self.cells)

    @property
    def is_cut(self) -> bool:
        return self.shown_steps < self.num_steps or self.shown_slots < self.num_slots

    def cut_note(self) -> str | None:
        """What part of the run is shown, or None when all of it is."""
        if not self.is_cut:
            return None
        last = self.first_step + self.shown_steps - 1
        return (f"cut: showing steps {self.first_step:,}-{last:,} of {self.num_steps:,} and "
                f"slots 1-{self.shown_slots} of {self.num_slots}; whole run: "
                f"{self.run.fractions_text()}")

    def first_steps(self, num_steps: int) -> SlotGrid:
        """The grid cut to its first ``num_steps`` steps, lettered afresh."""
        columns = [{row: (c.request_id, c.num_tokens) for row, line in enumerate(self.cells)
                    if (c := line[step]) is not None} for step in range(num_steps)]
        return make_grid(self.title, self.num_slots, self.num_steps, self.first_step,
                         columns, self.shown_slots, self.run)


def make_grid(title: str, num_slots: int, num_steps: int, first_step: int,
              columns: list[Column], shown_slots: int, run: Counts) -> SlotGrid:
    """A SlotGrid of ``columns`` (steps from ``first_step``, rows below ``shown_slots``),
    its requests lettered A, B, ... in order of first appearance (by step, then row)."""
    letters: dict[str, str] = {}
    for column in columns:
        for row in sorted(column):
            letters.setdefault(column[row][0], label_for(len(letters)))
    cells = tuple(tuple(None if (held := col.get(row)) is None
                        else Cell(letters[held[0]], held[0], held[1]) for col in columns)
                  for row in range(shown_slots))
    flat = [c for line in cells for c in line if c is not None]
    shown = Counts(sum(c.num_tokens > 0 for c in flat), sum(c.num_tokens == 0 for c in flat),
                   shown_slots * len(columns))
    legend = tuple((lab, rid) for rid, lab in letters.items())
    return SlotGrid(title, num_slots, num_steps, first_step, cells, shown, run, legend)


@dataclass(slots=True)
class SlotRecorder:
    """An engine StepObserver that assigns slot rows and records a window of steps.

    The window is ``max_steps`` steps from ``first_step`` (1-based) when it is given;
    else the busiest: the first window of the run whose steps hold the most slots of the
    whole batch (the whole run when it is shorter). Slot rows are assigned from the first
    step on. Call ``grid(title)`` after the simulation.
    """

    max_num_seqs: int
    max_steps: int = 64
    max_slots: int = 16
    first_step: int | None = None
    num_steps: int = 0
    useful: int = 0
    held: int = 0
    _slot_of: dict[Request, int] = field(default_factory=dict)
    _free: list[int] = field(default_factory=list)
    _next_row: int = 0
    _window: deque[tuple[Column, int]] = field(default_factory=deque)  # (column, slots held)
    _window_held: int = 0
    _best: tuple[int, int, list[Column]] | None = None  # (slots held, first step, columns)

    def __call__(self, plan: BatchPlan, start_s: float, end_s: float) -> None:
        self.num_steps += 1
        self.useful += len(plan.scheduled)
        self.held += plan.num_slots_held
        column = self._assign(plan)
        first = self.first_step
        if first is not None and not first <= self.num_steps < first + self.max_steps:
            return
        self._window.append((column, plan.num_slots_held))
        self._window_held += plan.num_slots_held
        if first is None and len(self._window) > self.max_steps:
            self._window_held -= self._window.popleft()[1]
        if first is None and len(self._window) == self.max_steps and (
                self._best is None or self._window_held > self._best[0]):
            self._best = (self._window_held, self.num_steps - self.max_steps + 1,
                          [c for c, _ in self._window])

    def _assign(self, plan: BatchPlan) -> Column:
        """Give new holders their rows (the lowest free), free the rows of requests that
        stopped holding one; the step's shown rows."""
        tokens = {req: n for req, n in plan.scheduled}
        holders = list(plan.holders) if plan.holders is not None else list(tokens)
        holders += [r for r in tokens if r not in set(holders)]
        held = set(holders)
        for req in [r for r in self._slot_of if r not in held]:
            heapq.heappush(self._free, self._slot_of.pop(req))
        column: Column = {}
        for req in holders:
            row = self._slot_of.get(req)
            if row is None:
                row = self._slot_of[req] = self._take_row()
            if row < self.max_slots:
                column[row] = (req.request_id, tokens.get(req, 0))
        return column

    def _take_row(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next_row += 1
        return self._next_row - 1

    def grid(self, title: str) -> SlotGrid:
        """The recorded window (no steps when ``first_step`` is past the run's end)."""
        if self._best is not None:
            _, first, columns = self._best
        else:
            first, columns = self.first_step or 1, [c for c, _ in self._window]
        run = Counts(self.useful, self.held - self.useful, self.num_steps * self.max_num_seqs)
        return make_grid(title, self.max_num_seqs, self.num_steps, first, columns,
                         min(self.max_num_seqs, self.max_slots), run)


def diagram_for_config(cfg: RunConfig, *, max_steps: int = 64, max_slots: int = 16,
                       first_step: int | None = None) -> SlotGrid:
    """Simulate ``cfg`` with a SlotRecorder attached and return its grid (titled with the
    policy). Raises what ``sim.app.runs.runner.prepare`` and the engine raise."""
    from sim.app.runs.runner import prepare

    return record_grid(prepare(cfg), max_steps=max_steps, max_slots=max_slots,
                       first_step=first_step)


def record_grid(prep: Prepared, *, max_steps: int = 64, max_slots: int = 16,
                first_step: int | None = None,
                progress: Callable[[int], None] | None = None) -> SlotGrid:
    """Simulate the prepared run with a SlotRecorder attached (``progress(num_done)`` as
    sim.app.runs.runner.simulate_prepared calls it) and return its grid, titled with the
    policy. Raises what the engine raises."""
    from sim.app.runs.runner import simulate_prepared

    rec = SlotRecorder(prep.scheduler.max_num_seqs, max_steps, max_slots, first_step)
    simulate_prepared(prep, observer=rec, progress=progress)
    return rec.grid(prep.config.policy)


# -- text rendering --------------------------------------------------------------------


def render_text(grid: SlotGrid, *, idle_letters: bool = False) -> list[str]:
    """The grid as lines of text: a header, a step ruler, one row per slot, the fractions.

    Useful cells show the request's letter; idle cells ``.`` (or the letter in lowercase
    with ``idle_letters``); empty cells a blank. Columns are one space apart, and ``|``
    marks the first and last step; no line but the header is wider than text_width.
    """
    w = _letter_width(grid)
    prefix = _prefix_width(grid)
    lines = [f"{grid.title}: {grid.num_slots} slots x {grid.num_steps:,} steps"]
    lines.append("step".ljust(prefix) + " " + _ruler(grid.first_step, grid.shown_steps, w))
    for i, row in enumerate(grid.cells):
        body = " ".join(_cell_text(c, w, idle_letters) for c in row)
        lines.append(f"slot {i + 1}".ljust(prefix) + f"|{body}|")
    c = grid.shown
    for name, k in (("useful", c.useful), ("idle", c.idle), ("empty", c.empty)):
        pct = f" ({k / c.total:.0%})" if c.total else ""
        lines.append(f"{name} {k:,}/{c.total:,}{pct}")
    return lines


def text_width(grid: SlotGrid) -> int:
    """Characters of a slot row of render_text: label, ``|``, steps, ``|``."""
    return _prefix_width(grid) + 1 + grid.shown_steps * (_letter_width(grid) + 1)


def fit_width(grid: SlotGrid, width: int) -> SlotGrid:
    """The grid cut to the most steps (at least one) whose rows fit ``width`` characters
    (a terminal's columns); cutting may drop long letters, so it is measured again."""
    while True:
        fits = (width - _prefix_width(grid) - 1) // (_letter_width(grid) + 1)
        if grid.shown_steps <= max(fits, 1):
            return grid
        grid = grid.first_steps(max(fits, 1))


def _letter_width(grid: SlotGrid) -> int:
    return max((len(c.label) for row in grid.cells for c in row if c is not None), default=1)


def _prefix_width(grid: SlotGrid) -> int:
    return len(f"slot {grid.shown_slots}") + 1


def _ruler(first: int, num_steps: int, width: int) -> str:
    """Step numbers at the first step and every 5th step, placed over their columns and
    never past the closing ``|`` of the rows."""
    out = ""
    end = num_steps * (width + 1)
    for s in range(first, first + num_steps):
        col = (s - first) * (width + 1)
        if (s == first or s % 5 == 0) and len(out) <= col and col + len(str(s)) <= end:
            out = out.ljust(col) + str(s)
    return out


def _cell_text(cell: Cell | None, width: int, idle_letters: bool) -> str:
    if cell is None:
        return EMPTY_CHAR * width
    if cell.num_tokens > 0:
        return cell.label.ljust(width)
    return (cell.label.lower() if idle_letters else IDLE_CHAR).ljust(width)


def legend_text(idle_letters: bool = False) -> str:
    idle = "lowercase letter" if idle_letters else f"'{IDLE_CHAR}'"
    return (f"legend: A, B, ... = request computing in its slot this step (useful); {idle} = "
            "slot held but idle; blank = empty slot")


def side_by_side(blocks: list[list[str]], *, width: int, gap: int = 4) -> list[str]:
    """Join text blocks in columns when they fit in ``width`` characters, else stack them
    with a blank line between."""
    widths = [max(len(line) for line in b) for b in blocks]
    if sum(widths) + gap * (len(blocks) - 1) > width:
        out: list[str] = []
        for b in blocks:
            out += [*b, ""]
        return out[:-1]
    height = max(len(b) for b in blocks)
    rows = []
    for i in range(height):
        parts = [(b[i] if i < len(b) else "").ljust(w) for b, w in zip(blocks, widths, strict=True)]
        rows.append((" " * gap).join(parts).rstrip())
    return rows
