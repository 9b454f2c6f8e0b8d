"""Slot diagrams: which request holds which batch slot at each engine step.

Owns the SlotRecorder (an engine StepObserver), the SlotGrid it produces, and its two
renderings: text for the terminal (a textbook figure: ``A``, ``B``, ... for requests that
compute this step, ``.`` for a slot held idle, a blank for an empty slot) and HTML
(plotly, imported lazily; held-idle cells hatched).

Slot rule: a request takes the lowest free slot row when it first holds a slot (admission)
and keeps that row until it stops holding one (finish or preemption; a preempted request
takes a new row when it is admitted again). A cell is *useful* when its request computed
tokens this step, *idle* when the request holds the slot without computing (a finished
member of a static batch; a running decode stalled by a prefill-only step), *empty* when
nobody holds it. The three fractions count cells of max_num_seqs x steps, as the
slots_useful / slots_idle / slots_empty columns of steps.csv do.

Large runs are cut: the grid keeps the first ``max_steps`` steps and ``max_slots`` rows;
the whole-run counts are still exact. ``diagram_for_config`` re-simulates a RunConfig
through sim.app.runs.runner (imported lazily) with the recorder attached.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.app.runs.runner import RunConfig
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


@dataclass(frozen=True, slots=True)
class SlotGrid:
    """The recorded diagram of one run. ``cells[slot][step]`` is a Cell or None (empty).

    num_slots / num_steps are the run's; the grid holds the first len(cells) slot rows
    and len(cells[0]) steps from ``first_step`` (1-based). ``shown`` counts the cells of
    the grid, ``run`` the whole run.
    """

    title: str
    num_slots: int
    num_steps: int
    first_step: int
    cells: tuple[tuple[Cell | None, ...], ...]
    shown: Counts
    run: Counts
    legend: tuple[tuple[str, str], ...]  # (letter, request_id) in order of admission

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
        return (f"cut: showing steps {self.first_step}-{last} of {self.num_steps:,} and slots "
                f"1-{self.shown_slots} of {self.num_slots}; whole run: "
                f"{self.run.fractions_text()}")


@dataclass(slots=True)
class SlotRecorder:
    """An engine StepObserver that assigns slot rows and records the first steps.

    Records steps first_step .. first_step + max_steps - 1 (1-based); slot rows are
    assigned from the first step on. Call ``grid(title)`` after the simulation.
    """

    max_num_seqs: int
    max_steps: int = 64
    max_slots: int = 16
    first_step: int = 1
    num_steps: int = 0
    useful: int = 0
    held: int = 0
    _slot_of: dict[Request, int] = field(default_factory=dict)
    _free: list[int] = field(default_factory=list)
    _next_row: int = 0
    _columns: list[dict[int, Cell]] = field(default_factory=list)
    _labels: dict[Request, str] = field(default_factory=dict)
    _legend: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, plan: BatchPlan, start_s: float, end_s: float) -> None:
        self.num_steps += 1
        self.useful += len(plan.scheduled)
        self.held += plan.num_slots_held
        if self.num_steps < self.first_step + self.max_steps:
            self._record(plan, self.num_steps >= self.first_step)

    def _record(self, plan: BatchPlan, keep: bool) -> None:
        tokens = {req: n for req, n in plan.scheduled}
        holders = list(plan.holders) if plan.holders is not None else list(tokens)
        holders += [r for r in tokens if r not in set(holders)]
        held = set(holders)
        for req in [r for r in self._slot_of if r not in held]:
            heapq.heappush(self._free, self._slot_of.pop(req))
        column: dict[int, Cell] = {}
        for req in holders:
            row = self._slot_of.get(req)
            if row is None:
                row = self._slot_of[req] = self._take_row()
            if keep and row < self.max_slots:
                column[row] = Cell(self._label(req), req.request_id, tokens.get(req, 0))
        if keep:
            self._columns.append(column)

    def _take_row(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next_row += 1
        return self._next_row - 1

    def _label(self, req: Request) -> str:
        label = self._labels.get(req)
        if label is None:
            label = self._labels[req] = label_for(len(self._labels))
            self._legend.append((label, req.request_id))
        return label

    def grid(self, title: str) -> SlotGrid:
        slots = min(self.max_num_seqs, self.max_slots)
        cells = tuple(tuple(col.get(row) for col in self._columns) for row in range(slots))
        flat = [c for row in cells for c in row if c is not None]
        shown = Counts(sum(c.num_tokens > 0 for c in flat), sum(c.num_tokens == 0 for c in flat),
                       slots * len(self._columns))
        run = Counts(self.useful, self.held - self.useful, self.num_steps * self.max_num_seqs)
        return SlotGrid(title, self.max_num_seqs, self.num_steps, self.first_step, cells,
                        shown, run, tuple(self._legend))


def diagram_for_config(cfg: RunConfig, *, max_steps: int = 64, max_slots: int = 16,
                       first_step: int = 1) -> SlotGrid:
    """Simulate ``cfg`` with a SlotRecorder attached and return its grid (titled with the
    policy). Raises what ``sim.app.runs.runner.prepare`` and the engine raise."""
    from sim.app.runs.runner import prepare, simulate_prepared

    prep = prepare(cfg)
    rec = SlotRecorder(prep.scheduler.max_num_seqs, max_steps, max_slots, first_step)
    simulate_prepared(prep, observer=rec)
    return rec.grid(cfg.policy)


# -- text rendering --------------------------------------------------------------------


def render_text(grid: SlotGrid, *, idle_letters: bool = False) -> list[str]:
    """The grid as lines of text: a header, a step ruler, one row per slot, the fractions.

    Useful cells show the request's letter; idle cells ``.`` (or the letter in lowercase
    with ``idle_letters``); empty cells a blank. Columns are one space apart, and ``|``
    marks the first and last step.
    """
    w = max((len(c.label) for row in grid.cells for c in row if c is not None), default=1)
    n = grid.shown_steps
    prefix = len(f"slot {grid.shown_slots}") + 1
    lines = [f"{grid.title}: {grid.num_slots} slots x {grid.num_steps:,} steps"]
    lines.append("step".ljust(prefix) + " " + _ruler(grid.first_step, n, w))
    for i, row in enumerate(grid.cells):
        body = " ".join(_cell_text(c, w, idle_letters) for c in row)
        lines.append(f"slot {i + 1}".ljust(prefix) + f"|{body}|")
    c = grid.shown
    for name, k in (("useful", c.useful), ("idle", c.idle), ("empty", c.empty)):
        pct = f" ({k / c.total:.0%})" if c.total else ""
        lines.append(f"{name} {k:,}/{c.total:,}{pct}")
    return lines


def _ruler(first: int, num_steps: int, width: int) -> str:
    """Step numbers at the first step and every 5th step, placed over their columns."""
    out = ""
    for s in range(first, first + num_steps):
        col = (s - first) * (width + 1)
        if (s == first or s % 5 == 0) and len(out) <= col:
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


# -- HTML rendering (plotly) -------------------------------------------------------------

_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b",
            "#9d755d", "#ff9da6", "#bab0ac")


def figure(grid: SlotGrid) -> Any:
    """A plotly Figure of one grid: one horizontal bar per cell; useful cells in their
    request's colour with its letter, idle cells hatched, empty cells outlined."""
    import plotly.graph_objects as go

    colour = {lab: _PALETTE[i % len(_PALETTE)] for i, (lab, _) in enumerate(grid.legend)}
    groups: dict[str, dict[str, list[Any]]] = {
        k: {"x": [], "y": [], "text": [], "hover": [], "colour": []}
        for k in ("useful", "idle", "empty")
    }
    for slot, row in enumerate(grid.cells):
        for step, cell in enumerate(row):
            kind = "empty" if cell is None else "useful" if cell.num_tokens else "idle"
            g = groups[kind]
            g["x"].append(step)
            g["y"].append(slot + 1)
            g["text"].append("" if cell is None or kind == "idle" else cell.label)
            who = "" if cell is None else f"{cell.label} = request {cell.request_id}, "
            g["hover"].append(f"step {step + grid.first_step}, slot {slot + 1}: {who}"
                              + (f"{cell.num_tokens} tokens" if cell else "empty"))
            g["colour"].append("#ffffff" if cell is None else colour[cell.label])
    fig = go.Figure()
    styles = {
        "useful": {"pattern": {"shape": ""}, "name": "useful (computing)"},
        # Hatch lines in the holder's colour on white; an array colour in "overlay" mode
        # makes plotly.js warn when it draws the legend swatch.
        "idle": {"pattern": {"shape": "/", "fillmode": "replace", "bgcolor": "#ffffff",
                             "fgcolor": groups["idle"]["colour"], "solidity": 0.4},
                 "name": "held idle (hatched)"},
        "empty": {"pattern": {"shape": ""}, "name": "empty"},
    }
    for kind, g in groups.items():
        st = styles[kind]
        fig.add_trace(go.Bar(
            x=[1] * len(g["x"]), base=g["x"], y=g["y"], orientation="h", width=0.92,
            name=f"{st['name']}: {getattr(grid.shown, kind)}/{grid.shown.total}",
            text=g["text"], textposition="inside", insidetextanchor="middle",
            hovertext=g["hover"], hoverinfo="text",
            marker={"color": g["colour"], "pattern": st["pattern"],
                    "line": {"color": "#999999", "width": 1}},
        ))
    title = f"{grid.title}: {grid.shown.fractions_text()}"
    note = grid.cut_note()
    if note:
        title += f"<br><sup>{note}</sup>"
    fig.update_layout(
        title={"text": title}, barmode="overlay", plot_bgcolor="#ffffff",
        height=170 + 28 * max(grid.shown_slots, 1), margin={"l": 60, "r": 20, "t": 70, "b": 80},
        legend={"orientation": "h", "yanchor": "top", "x": 0,
                "y": -60 / (28 * max(grid.shown_slots, 1))},
        xaxis={"title": "step", "range": [0, max(grid.shown_steps, 1)], "dtick": 1,
               "tickvals": [i + 0.5 for i in range(grid.shown_steps)],
               "ticktext": [str(i + grid.first_step) for i in range(grid.shown_steps)]},
        yaxis={"title": "slot", "range": [grid.shown_slots + 0.5, 0.5],
               "tickvals": list(range(1, grid.shown_slots + 1))},
        uniformtext={"minsize": 8, "mode": "hide"},
    )
    return fig


def render_html(grids: list[SlotGrid], *, idle_letters: bool = False) -> str:
    """A self-contained HTML page: one figure per grid (plotly.js inlined once) and the
    text rendering of each under it."""
    import html

    from sim.app.reports.html_page import page

    parts: list[Any] = [
        "<p>One row per batch slot, one column per engine step. Coloured cell with a letter:"
        " the request computed tokens in its slot (useful); hatched: the request holds the "
        "slot without computing (idle); white: empty slot. Text rendering: "
        f"{html.escape(legend_text(idle_letters))}</p>"]
    for g in grids:
        text = "\n".join(render_text(g, idle_letters=idle_letters))
        parts += [figure(g), f"<pre>{html.escape(text)}</pre>"]
    return page("servesim slot diagram", parts)
