"""The pool timeline of a disaggregated run (``servesim run --disagg xPyD``): one row per
engine, prefill engines above and decode engines below, its steps as bars coloured by
composition, and the path of the first requests across the rows (docs/disaggregation.md,
"One request's path"): queued and prefilled on a prefill engine, waiting there for
decode blocks, the KV transfer as a line from the prefill row to the decode row, then
admitted and decoded on a decode engine. A prompt kept local is queued, prefilled and
decoded on its decode engine.

Owns the figure's data (``pool_timeline``: rows, bars, paths, window), computed from a
run directory's requests.csv (the TTFT split of sim/disagg/records.py) and steps.csv
(``pool`` and ``replica``), and its plotly figure (``pool_timeline_figure``; plotly
imported lazily, inside it).

Bounds, so a run of any size draws a readable figure: the first ``MAX_REQUESTS`` finished
requests by arrival; the window from the first one's arrival to the last one's finish,
cut earlier where an engine would draw more than ``MAX_BARS_PER_ROW`` steps (the paths
are cut there too); every engine when a run has at most ``MAX_ROWS``, else only those
the drawn requests reach. The title says what was cut. One bar per steps.csv row:
identical consecutive steps share a row (and a bar, as long as their summed duration)
unless the run was written with --full-steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sim.app.reports.diagram import label_for
from sim.app.reports.run_dir import RunData
from sim.disagg.records import PREFILL_ENGINE_PHASES, has_replica, request_phases

#: Requests whose paths are drawn (the first finished ones by arrival).
MAX_REQUESTS = 20
#: Step bars an engine's row may draw; the window ends before the next one.
MAX_BARS_PER_ROW = 1500
#: Engines drawn when a run has more: only those the drawn requests reach.
MAX_ROWS = 16
#: Phases drawn as computing (thick lines); the others are waiting (dotted), but for the
#: transfer (the last on the prefill engine), a line from its row to the decode engine's.
WORK_PHASES = ("prefill", "decode")
TRANSFER = PREFILL_ENGINE_PHASES[-1]
#: Bar colours by step composition (the chrome trace's step names): the bars of a
#: composition take its two shades in turn, so back-to-back steps stay apart without
#: outlines (which would grey out a row of steps a pixel wide).
STEP_COLOURS = {"prefill": ("#f58518", "#f9b46b"), "decode": ("#4c78a8", "#8fb3d9"),
                "mixed": ("#54a24b", "#93c98c")}
_PALETTE = ("#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d", "#ff9da6", "#17becf",
            "#7f7f7f", "#bcbd22", "#8c564b")


@dataclass(frozen=True, slots=True)
class StepBars:
    """One engine's steps in the window, one per steps.csv row: start and duration (s),
    composition ("prefill", "decode" or "mixed") and the row's counts."""

    start: np.ndarray
    duration: np.ndarray
    kind: tuple[str, ...]
    num_steps: np.ndarray
    num_seqs: np.ndarray
    num_prefill_tokens: np.ndarray
    num_decode_tokens: np.ndarray


@dataclass(frozen=True, slots=True)
class Phase:
    """A part of a request's path, ``start`` to ``end`` (s), from row ``row`` to row
    ``row_to`` (the same row but for the KV transfer)."""

    name: str
    start: float
    end: float
    row: int
    row_to: int


@dataclass(frozen=True, slots=True)
class RequestPath:
    """A drawn request: its letter (A, B, ... by arrival), request_id and phases."""

    label: str
    request_id: str
    phases: tuple[Phase, ...]


@dataclass(frozen=True, slots=True)
class PoolTimeline:
    """The figure's data: row names top to bottom (prefill engines, then decode), each
    row's bars, the paths, the window (s), the run's finished requests and a note of
    what was cut (None: nothing)."""

    rows: tuple[str, ...]
    bars: tuple[StepBars, ...]
    paths: tuple[RequestPath, ...]
    window: tuple[float, float]
    num_finished: int
    cut: str | None


def is_disaggregated(run: RunData) -> bool:
    """Whether ``run`` is a disaggregated run (its summary.json has a ``disagg`` block)."""
    return "disagg" in run.summary


def pool_timeline(run: RunData, max_requests: int = MAX_REQUESTS) -> PoolTimeline:
    """The pool timeline of a disaggregated run (module docstring)."""
    d = run.summary["disagg"]
    engines = [("prefill", r) for r in range(int(d["prefill"]["num_replicas"]))]
    engines += [("decode", r) for r in range(int(d["decode"]["num_replicas"]))]
    req = run.requests
    done = req[req["status"] == "finished"].sort_values("arrival_time", kind="stable")
    drawn = done.head(max_requests)
    notes = []
    on = _engines_of(drawn)
    if len(engines) > MAX_ROWS:
        reached = {("decode", dec) for _, dec in on}
        reached |= {("prefill", pre) for pre, _ in on if pre is not None}
        notes.append(f"only the {len(reached)} of {len(engines)} engines these requests "
                     "reach")
        engines = [e for e in engines if e in reached]
    row_of = {e: i for i, e in enumerate(engines)}
    steps = [_engine_steps(run.steps, *e) for e in engines]
    window = _window(drawn, steps)
    end = _bar_cut(steps, window)
    if end < window[1]:
        notes.append(f"cut at {end:.3f} s (at most {MAX_BARS_PER_ROW:,} steps a row)")
        window = (window[0], end)
    paths = tuple(
        _path(label_for(k), str(rid), phases, stamps,
              (None if pre is None else row_of[("prefill", pre)], row_of[("decode", dec)]),
              window[1])
        for k, (rid, (phases, stamps), (pre, dec)) in enumerate(zip(
            drawn["request_id"], request_phases(_columns(drawn)), on, strict=True)))
    return PoolTimeline(
        rows=tuple(f"{pool} {r}" for pool, r in engines),
        bars=tuple(_bars(s, window) for s in steps), paths=paths, window=window,
        num_finished=len(done), cut="; ".join(notes) or None)


def _engine_steps(steps: pd.DataFrame, pool: str, replica: int) -> pd.DataFrame:
    """One engine's steps.csv rows, by start time."""
    mine = steps[(steps["pool"] == pool) & (steps["replica"] == replica)]
    return mine.sort_values("start_time", kind="stable")


def _window(drawn: pd.DataFrame, steps: list[pd.DataFrame]) -> tuple[float, float]:
    """From the first drawn arrival to the last drawn finish; without a drawn request,
    the whole run's steps."""
    if len(drawn):
        return float(drawn["arrival_time"].min()), float(drawn["finish_time"].max())
    starts = [float(s["start_time"].min()) for s in steps if len(s)]
    ends = [float((s["start_time"] + s["duration_s"]).max()) for s in steps if len(s)]
    return (min(starts), max(ends)) if starts else (0.0, 0.0)


def _in_window(steps: pd.DataFrame, window: tuple[float, float]) -> pd.DataFrame:
    """The steps that overlap the window."""
    start = steps["start_time"]
    return steps[(start < window[1]) & (start + steps["duration_s"] > window[0])]


def _bar_cut(steps: list[pd.DataFrame], window: tuple[float, float]) -> float:
    """The window's end, or the earliest start of an engine's step beyond its first
    MAX_BARS_PER_ROW in the window."""
    end = window[1]
    for s in steps:
        shown = _in_window(s, window)
        if len(shown) > MAX_BARS_PER_ROW:
            end = min(end, float(shown["start_time"].iloc[MAX_BARS_PER_ROW]))
    return end


def _bars(steps: pd.DataFrame, window: tuple[float, float]) -> StepBars:
    """An engine's bars: its steps in the window."""
    s = _in_window(steps, window)
    pre = s["num_prefill_tokens"].to_numpy(np.int64)
    dec = s["num_decode_tokens"].to_numpy(np.int64)
    kind = tuple("mixed" if p and q else "prefill" if p else "decode"
                 for p, q in zip(pre.tolist(), dec.tolist(), strict=True))
    num_steps = (s["num_steps"].to_numpy(np.int64) if "num_steps" in s
                 else np.ones(len(s), dtype=np.int64))
    return StepBars(s["start_time"].to_numpy(np.float64), s["duration_s"].to_numpy(np.float64),
                    kind, num_steps, s["num_seqs"].to_numpy(np.int64), pre, dec)


def _columns(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """A DataFrame as a column table (sim/table.py)."""
    return {str(c): frame[c].to_numpy() for c in frame.columns}


def _engines_of(drawn: pd.DataFrame) -> list[tuple[int | None, int]]:
    """Each drawn request's prefill engine (None: kept local) and decode engine."""
    remote = has_replica(drawn["prefill_replica"].to_numpy()).tolist()
    return [(int(p) if k else None, int(d))
            for k, p, d in zip(remote, drawn["prefill_replica"].tolist(),
                               drawn["decode_replica"].tolist(), strict=True)]


def _path(label: str, request_id: str, names: tuple[str, ...], stamps: list[float],
          rows: tuple[int | None, int], end: float) -> RequestPath:
    """One request's phases (``names`` between consecutive ``stamps``, s: records.
    request_phases), on its prefill engine's row (``rows[0]``; None: kept local) up to
    the transfer, which crosses to its decode engine's row (``rows[1]``), and on that
    row after it; those that start after ``end`` left out, the one across it cut
    there."""
    p, d = rows
    if p is None:  # kept local: every phase on the decode engine
        on = [(d, d)] * len(names)
    else:  # the prefill engine's phases, the last (the transfer) across to the decode's
        k = len(PREFILL_ENGINE_PHASES)
        on = [(p, p)] * (k - 1) + [(p, d)] + [(d, d)] * (len(names) - k)
    phases = tuple(Phase(name, t0, min(t1, end), r0, r1)
                   for name, (r0, r1), t0, t1 in zip(names, on, stamps, stamps[1:],
                                                     strict=False)
                   if t0 <= end)
    return RequestPath(label, request_id, phases)


# -- the figure ---------------------------------------------------------------------------

#: Where a row's band puts its bars (centre, thickness) and its request lanes (from, to),
#: in rows below the row's tick.
BAR_CENTRE, BAR_WIDTH = -0.22, 0.4
LANES = (0.06, 0.44)


def pool_timeline_figure(run: RunData) -> Any:
    """The plotly Figure of ``run``'s pool timeline (module docstring)."""
    import plotly.graph_objects as go

    tl = pool_timeline(run)
    fig = go.Figure()
    _add_bars(fig, tl)
    for k, path in enumerate(tl.paths):
        _add_path(fig, path, _PALETTE[k % len(_PALETTE)],
                  LANES[0] + (LANES[1] - LANES[0]) * k / max(len(tl.paths) - 1, 1))
    num_prefill = sum(r.startswith("prefill") for r in tl.rows)
    if 0 < num_prefill < len(tl.rows):
        fig.add_hline(y=num_prefill - 0.5, line={"color": "#333333", "width": 1})
    t0, t1 = tl.window
    title = (f"{run.name}: the first {len(tl.paths)} of {tl.num_finished:,} finished requests "
             f"by arrival, {t0:.3f} to {t1:.3f} s")
    note = ("bars: engine steps, one per steps.csv row, by composition; lines: each "
            "request's path, thick while computing, dotted while waiting, across the rows "
            "for the KV transfer")
    if tl.cut:
        note += f"; {tl.cut}"
    fig.update_layout(
        title=f"{title}<br><sup>{note}</sup>", height=160 + 130 * len(tl.rows),
        barmode="overlay", margin={"t": 90}, legend={"groupclick": "togglegroup"},
        # room on the left for the letters written left of each request's arrival
        xaxis={"title": "simulated time (s)",
               "range": [t0 - 0.03 * (t1 - t0), t1 + 0.01 * (t1 - t0)] if t1 > t0 else None},
        yaxis={"tickvals": list(range(len(tl.rows))), "ticktext": list(tl.rows),
               "range": [len(tl.rows) - 0.5, -0.5], "zeroline": False, "showgrid": False})
    return fig


def _add_bars(fig: Any, tl: PoolTimeline) -> None:
    """One bar trace per step composition over every row (none for a composition no
    drawn step has)."""
    import plotly.graph_objects as go

    for kind, shades in STEP_COLOURS.items():
        x: list[float] = []
        base: list[float] = []
        y: list[float] = []
        colours: list[str] = []
        hover: list[str] = []
        for i, (name, b) in enumerate(zip(tl.rows, tl.bars, strict=True)):
            for j in (j for j, k in enumerate(b.kind) if k == kind):
                x.append(float(b.duration[j]))
                base.append(float(b.start[j]))
                y.append(i + BAR_CENTRE)
                colours.append(shades[len(colours) % 2])  # the first: the legend's
                steps = f"{b.num_steps[j]} steps, " if b.num_steps[j] > 1 else ""
                hover.append(f"{name}: {kind} step at {b.start[j]:.4f} s, {steps}"
                             f"{b.duration[j] * 1e3:.2f} ms, {b.num_seqs[j]} seqs, "
                             f"{b.num_prefill_tokens[j]} prefill + "
                             f"{b.num_decode_tokens[j]} decode tokens")
        if not x:
            continue
        fig.add_trace(go.Bar(
            x=x, base=base, y=y, orientation="h", width=BAR_WIDTH, name=f"{kind} step",
            legendgroup="steps", hovertext=hover, hoverinfo="text",
            marker={"color": colours, "line": {"width": 0}}))


def _add_path(fig: Any, path: RequestPath, colour: str, lane: float) -> None:
    """One request's path in its lane (rows below each row's tick): one trace for the
    computing phases, one for the waiting ones, one for the transfer, and its letter."""
    import plotly.graph_objects as go

    name = f"{path.label} = request {path.request_id}"
    groups: dict[str, tuple[list[float | None], list[float | None], list[str | None]]] = {
        k: ([], [], []) for k in ("work", "wait", "transfer")}
    for ph in path.phases:
        kind = ("transfer" if ph.name == TRANSFER
                else "work" if ph.name in WORK_PHASES else "wait")
        xs, ys, texts = groups[kind]
        text = (f"{path.label} {ph.name}: {ph.start:.4f} to {ph.end:.4f} s "
                f"({(ph.end - ph.start) * 1e3:.2f} ms)")
        xs += [ph.start, ph.end, None]
        ys += [ph.row + lane, ph.row_to + lane, None]
        texts += [text, text, None]
    styles: dict[str, dict[str, Any]] = {"work": {"width": 3},
                                         "wait": {"width": 1.5, "dash": "dot"},
                                         "transfer": {"width": 2}}
    for kind, (xs, ys, texts) in groups.items():
        if xs:
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="lines", name=name, legendgroup=name,
                showlegend=False, hovertext=texts, hoverinfo="text",
                line={"color": colour, **styles[kind]}))
    if path.phases:
        first = path.phases[0]
        fig.add_trace(go.Scatter(
            x=[first.start], y=[first.row + lane], mode="markers+text", text=[path.label],
            textposition="middle left", name=name, legendgroup=name,
            marker={"color": colour, "size": 6}, hoverinfo="skip"))
