"""HTML pages for ``servesim sweep`` (sweep.html) and ``servesim plan`` (capacity.html):
plotly figures, plotly.js inlined once per page so the page works offline, plain tables.
plotly is imported only inside these functions (the simulator never needs it).

Also owns the sweep's outputs (``write_sweep``: sweep.csv, every row in grid order;
sweep.json, the base config and the grid; sweep.html), written whole or not at all.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import json
import math
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.app.runs.out_dir import GENERATOR_META, write_files
from sim.app.runs.pareto import PER_GPU, PER_USER, frontier_frame, speeds
from sim.app.runs.runner import RunConfig
from sim.app.runs.sweep import Grid, aggregate

MAX_FACETS = 12
"""Most heatmaps drawn per metric (the remaining axis combinations are left out)."""

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;font-size:13px;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}
.answer{background:#eef6ee;border-left:4px solid #3a3;padding:.6em 1em;font-size:15px}
.warn{background:#fff4e5;border-left:4px solid #e90;padding:.4em 1em}
code{background:#f5f5f5;padding:0 3px}
"""


def page(title: str, body: Sequence[str]) -> str:
    """A whole HTML document: ``title``, plotly.js inline in the head, then ``body``; the
    head carries servesim's generator mark (sim/app/runs/out_dir.py)."""
    from plotly.offline import get_plotlyjs

    return ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
            f"{GENERATOR_META}<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
            f"<h1>{html.escape(title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n")


def fig_html(fig: Any) -> str:
    """One figure as a div (plotly.js is already on the page)."""
    return str(fig.to_html(full_html=False, include_plotlyjs=False,
                           config={"displaylogo": False, "responsive": True}))


def table_html(df: pd.DataFrame, digits: int = 4) -> str:
    """A plain HTML table; floats to ``digits`` significant digits, missing as '-'."""
    def fmt(x: Any) -> str:
        if isinstance(x, bool):
            return "YES" if x else "no"
        if isinstance(x, float):
            return "-" if x != x else f"{x:.{digits}g}"
        return html.escape(str(x))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td>{fmt(v)}</td>" for v in row) + "</tr>"
                   for row in df.itertuples(index=False))
    return (f"<div style='overflow-x:auto'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table></div>")


def _label(keys: Sequence[str], values: Sequence[Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True)) or "all"


def latency_curves(agg: pd.DataFrame, load_axis: str | None, groups: list[str],
                   slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> Any:
    """Throughput-latency curves: p99 TTFT and p99 TPOT (ms, log axes so a saturated
    point does not flatten the others) against throughput (req/s), one line per
    combination of ``groups`` along the load axis; saturated points as x."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("p99 TTFT (ms, log axis)",
                                                        "p99 TPOT (ms, log axis)"))
    grouped = agg.groupby(groups, sort=False) if groups else [((), agg)]
    palette = qualitative.Plotly
    for i, (key, sub) in enumerate(grouped):
        color = palette[i % len(palette)]
        key = key if isinstance(key, tuple) else (key,)
        if load_axis is not None:
            sub = sub.sort_values(load_axis)
        name = _label(groups, key)
        symbols = ["x" if s else "circle" for s in sub["saturated"]]
        hover = [f"{load_axis}={v}" if load_axis else "" for v in
                 (sub[load_axis] if load_axis else [None] * len(sub))]
        hover = [h + (" SATURATED" if s else "") for h, s in zip(hover, sub["saturated"],
                                                                  strict=True)]
        for col, metric in ((1, "ttft_p99_s"), (2, "tpot_p99_s")):
            fig.add_trace(go.Scatter(
                x=sub["throughput_rps"], y=sub[metric] * 1e3, mode="lines+markers", name=name,
                legendgroup=name, showlegend=col == 1, text=hover, line={"color": color},
                marker={"symbol": symbols, "size": 9, "color": color}), row=1, col=col)
    for col, slo in ((1, slo_ttft_s), (2, slo_tpot_s)):
        if slo is not None:
            fig.add_hline(y=slo * 1e3, line_dash="dash", line_color="red", row=1, col=col)
    fig.update_xaxes(title_text="throughput (req/s)")
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="p99 TTFT (ms)", row=1, col=1)
    fig.update_yaxes(title_text="p99 TPOT (ms)", row=1, col=2)
    fig.update_layout(height=450, margin={"t": 40})
    return fig


COLOUR_DIGITS = 3
"""Significant figures a heatmap cell shows, and the precision its colour follows: values
equal to this many figures get one colour."""
MIN_COLOUR_SPREAD = 0.1
"""The least spread a heatmap's colour range covers, as a fraction of its largest value
(on a log scale, the ratio 1 / (1 - this)): a narrower spread of values sits in the middle
of the colour map instead of at its two ends."""


def sig_text(value: float) -> str:
    """``value`` to COLOUR_DIGITS significant figures, in plain digits (52,900, 8.92,
    0.0123: no exponent); '-' for NaN."""
    if value != value:
        return "-"
    if value == 0:
        return "0"
    rounded = float(f"{value:.{COLOUR_DIGITS}g}")
    decimals = max(0, COLOUR_DIGITS - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:,.{decimals}f}"


def colour_values(values: np.ndarray, log: bool) -> np.ndarray:
    """What a heatmap colours by: each value rounded to COLOUR_DIGITS significant
    figures, its log10 on a log scale; NaN stays NaN (an empty cell)."""
    rounded = np.array([v if v != v else float(f"{v:.{COLOUR_DIGITS}g}")
                        for v in np.asarray(values, dtype=np.float64).ravel()])
    rounded = rounded.reshape(np.shape(values))
    if not log:
        return rounded
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(rounded)


def colour_range(values: np.ndarray, log: bool) -> tuple[float, float]:
    """(zmin, zmax) of one metric's colour scale, shared by every heatmap of it: the
    range of its colour_values, widened about its middle to MIN_COLOUR_SPREAD."""
    c = colour_values(values, log)
    c = c[np.isfinite(c)]
    if c.size == 0:
        return 0.0, 1.0
    lo, hi = float(c.min()), float(c.max())
    if log:
        least = -float(np.log10(1 - MIN_COLOUR_SPREAD))
    else:
        least = MIN_COLOUR_SPREAD * max(abs(lo), abs(hi)) or 1.0
    mid, half = (lo + hi) / 2, max(hi - lo, least) / 2
    return mid - half, mid + half


def _log_colour(agg: pd.DataFrame, col: str, log: bool) -> bool:
    """A log colour scale where asked and every value is positive."""
    return log and bool((agg[col].dropna() > 0).all())


def heatmaps(agg: pd.DataFrame, x: str, y: str, facets: list[str],
             metrics: Sequence[tuple[str, str, float]],
             log_colour: Collection[str] = ()) -> list[tuple[str, Any]]:
    """(caption, figure) per facet value combination: one heatmap per metric (column,
    label, scale) over axes ``x`` and ``y``; saturated cells say SAT. Each metric's
    colour scale is shared by all its heatmaps (colour_range over ``agg``); the columns
    in ``log_colour`` are coloured on a log scale (latencies, where a saturated cell is
    orders of magnitude above the rest)."""
    from plotly.subplots import make_subplots

    logs = {col: _log_colour(agg, col, col in log_colour) for col, _, _ in metrics}
    ranges = {col: colour_range(agg[col].to_numpy() * scale, logs[col])
              for col, _, scale in metrics}
    titles = [label.replace(")", ", log colour)") if logs[col] else label
              for col, label, _ in metrics]
    out: list[tuple[str, Any]] = []
    values = [sorted(agg[f].unique()) for f in facets]
    for combo in itertools.islice(itertools.product(*values), MAX_FACETS):
        sub = agg
        for f, v in zip(facets, combo, strict=True):
            sub = sub[sub[f] == v]
        if sub.empty:
            continue
        fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=titles,
                            horizontal_spacing=0.08)
        for i, (col, label, scale) in enumerate(metrics, start=1):
            fig.add_trace(_heatmap_trace(sub, x, y, (col, label, scale), ranges[col],
                                         logs[col]), row=1, col=i)
            fig.update_xaxes(title_text=x, type="category", row=1, col=i)
            fig.update_yaxes(title_text=y, type="category", row=1, col=i)
        fig.update_layout(height=380, margin={"t": 40})
        out.append((_label(facets, combo), fig))
    return out


def _heatmap_trace(sub: pd.DataFrame, x: str, y: str, metric: tuple[str, str, float],
                   zrange: tuple[float, float], log: bool) -> Any:
    """One metric's heatmap over ``x`` and ``y``: coloured by colour_values within
    ``zrange``, the value (COLOUR_DIGITS figures) written in each cell, exact on hover."""
    import plotly.graph_objects as go

    col, label, scale = metric
    z = sub.pivot_table(index=y, columns=x, values=col, aggfunc="mean") * scale
    sat = sub.pivot_table(index=y, columns=x, values="saturated", aggfunc="max")
    text = [[sig_text(v) + (" SAT" if s else "")
             for v, s in zip(zr, sr, strict=True)]
            for zr, sr in zip(z.to_numpy(), sat.reindex_like(z).fillna(False).to_numpy(),
                              strict=True)]
    return go.Heatmap(
        z=colour_values(z.to_numpy(), log), zmin=zrange[0], zmax=zrange[1],
        customdata=z.to_numpy(), x=[str(c) for c in z.columns], y=[str(r) for r in z.index],
        text=text, texttemplate="%{text}", colorscale="Viridis", showscale=False,
        hovertemplate=f"{x}=%{{x}}<br>{y}=%{{y}}<br>{label}=%{{customdata:.4g}}"
                      "<extra></extra>")


def sweep_page(df: pd.DataFrame, grid: Any, base: Any, elapsed_s: float | None) -> str:
    """sweep.html: what was swept, throughput-latency curves, heatmaps, the table."""
    axes = list(grid.axes)
    agg = aggregate(df, axes)
    load = grid.load_axis
    varied = [a for a in axes if len(grid.axes[a]) > 1]
    others = [a for a in varied if a != load]
    body = [f"<p>{len(df)} runs: {len(grid.cells())} cells x {len(grid.seeds)} seed(s) "
            f"{list(grid.seeds)}; model <code>{html.escape(base.model)}</code> on "
            f"<code>{html.escape(base.gpu)}</code>, workload "
            f"<code>{html.escape(str(base.trace or base.scenario or 'default scenario'))}"
            f"</code>, {base.num_requests or 'all'} requests per run"
            + (f"; {elapsed_s:.1f} s wall time" if elapsed_s is not None else "") + ". "
            "Every cell replays the same seeded workload (common random numbers). Metrics are "
            "means over seeds; a cell is SATURATED (x markers, SAT) when a backlog built up "
            "during any seed's run (its latency percentiles are not steady-state).</p>"]
    errors = df[df["error"] != ""]
    if len(errors):
        body.append(f"<p class='warn'>{len(errors)} run(s) could not run; see the error "
                    "column of sweep.csv (first: " + html.escape(errors["error"].iloc[0])
                    + ")</p>")
    if agg.empty:
        return page("servesim sweep", body)
    body.append("<h2>Throughput and latency</h2>")
    body.append(fig_html(latency_curves(agg, load, others, base.slo_ttft, base.slo_tpot)))
    body.extend(frontier_section(agg, axes))
    body.extend(_heatmap_sections(agg, load, varied, base))
    body.append("<h2>All cells (mean over seeds)</h2>")
    body.append(table_html(cells_table(agg, axes)))
    return page("servesim sweep", body)


def frontier_section(agg: pd.DataFrame, axes: list[str]) -> list[str]:
    """The Pareto frontier (sim/app/runs/pareto.py): its figure, labelled, and table."""
    front = frontier_frame(agg, axes)
    head = ["<h2>Pareto frontier: output tokens/s per GPU against per user</h2>",
            "<p>Each cell's output throughput per GPU (replicas x TP) against one "
            "request's output speed (1 / mean TPOT); the frontier joins the cells no other "
            "beats on both (saturated cells left out). Also in frontier.csv.</p>"]
    if front.empty:
        return [*head, "<p>No unsaturated cell with a TPOT: no frontier.</p>"]
    return [*head, fig_html(frontier_figure(agg, axes, front)), table_html(front)]


SHORT_AXES = {"max_num_seqs": "seqs", "max_num_batched_tokens": "budget",
              "gpu_memory_utilization": "mem", "long_prefill_token_threshold": "chunk cap",
              "tensor_parallel_size": "TP", "prefix_cache": "cache"}
"""Axis names as the frontier's point labels spell them (the others as they are)."""


def _short_labels(cells: pd.DataFrame, axes: list[str]) -> list[str]:
    """Each cell's values of the axes that vary over ``cells``, short ("seqs=128, TP 2")."""
    varied = [a for a in axes if cells[a].nunique() > 1] or list(axes)
    return [", ".join(f"{SHORT_AXES.get(a, a)}={v}" for a, v in zip(varied, vals, strict=True))
            for vals in zip(*(cells[a].tolist() for a in varied), strict=True)]


def frontier_figure(agg: pd.DataFrame, axes: list[str], front: pd.DataFrame) -> Any:
    """Every cell (grey; saturated as x) and the frontier (a line, each point labelled
    with the values of its cell's varied axes, alternately above and below so that
    neighbours do not overlap, the fastest per user's to its left so that it stays on
    the plot), output tokens/s per GPU against per user."""
    import plotly.graph_objects as go

    cells = speeds(agg)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=cells[PER_USER], y=cells[PER_GPU], mode="markers", name="cells",
        marker={"color": "#bbb", "size": 8,
                "symbol": ["x" if s else "circle" for s in cells["saturated"]]},
        text=_short_labels(cells, axes)))
    fig.add_trace(go.Scatter(
        x=front[PER_USER], y=front[PER_GPU], mode="lines+markers+text", name="frontier",
        text=_short_labels(front, axes), line={"color": "#d62728"},
        textposition=[("top right" if i % 2 == 0 else "bottom left") if i < len(front) - 1
                      else "top left" for i in range(len(front))],
        marker={"size": 10, "color": "#d62728"}))
    fig.update_xaxes(title_text="output tokens/s per user (1 / mean TPOT)")
    fig.update_yaxes(title_text="output tokens/s per GPU")
    fig.update_layout(height=480, margin={"t": 30, "r": 120})
    return fig


TABLE_COLUMNS = (("throughput_rps", "throughput (req/s)", 1.0),
                 ("ttft_p50_s", "TTFT p50 (ms)", 1e3), ("ttft_p99_s", "TTFT p99 (ms)", 1e3),
                 ("tpot_p99_s", "TPOT p99 (ms)", 1e3), ("e2e_p99_s", "E2E p99 (s)", 1.0),
                 ("goodput_rps", "goodput (req/s)", 1.0),
                 ("kv_peak_usage", "KV cache peak usage (%)", 100.0))
"""The sweep page's table: (sweep.csv column, header with its unit, scale); TTFT and TPOT
in ms as in the figures (and vLLM's benchmarks), E2E latency in s."""


def cells_table(agg: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    """The sweep page's table of cells: the axes, then TABLE_COLUMNS in their units."""
    out = agg[["cell", *axes, "seeds"]].copy()
    for col, header, scale in TABLE_COLUMNS:
        if col in agg.columns:
            out[header] = agg[col] * scale
    out["saturated"] = agg["saturated"]
    return out


def _heatmap_sections(agg: pd.DataFrame, load: str | None, varied: list[str],
                      base: Any) -> list[str]:
    non_load = [a for a in varied if a != load]
    if len(non_load) >= 2:
        x, y = non_load[0], non_load[1]
    elif len(non_load) == 1 and load in varied:
        x, y = non_load[0], load
    else:
        return []
    facets = [a for a in varied if a not in (x, y)]
    metrics: list[tuple[str, str, float]] = [
        ("throughput_rps", "throughput (req/s)", 1.0), ("ttft_p99_s", "p99 TTFT (ms)", 1e3),
        ("tpot_p99_s", "p99 TPOT (ms)", 1e3)]
    if base.slo_ttft is not None or base.slo_tpot is not None:
        metrics.append(("goodput_rps", "goodput (req/s)", 1.0))
    out = ["<h2>Heatmaps</h2>"]
    for caption, fig in heatmaps(agg, x, y, facets, metrics,
                                 log_colour=("ttft_p99_s", "tpot_p99_s")):
        out.append(f"<h3>{html.escape(caption)}</h3>" + fig_html(fig))
    return out


def write_sweep(out_dir: Path, df: pd.DataFrame, base: RunConfig, grid: Grid,
                elapsed_s: float | None = None) -> list[Path]:
    """sweep.csv (every row), sweep.json (the base config and the grid, to reproduce it),
    frontier.csv (the Pareto frontier's cells, sim/app/runs/pareto.py) and sweep.html
    (heatmaps, throughput-latency curves, the frontier), all or none
    (sim/app/runs/out_dir.py write_files); returns the paths."""
    info = {"base": dataclasses.asdict(base), "axes": {k: list(v) for k, v in grid.axes.items()},
            "seeds": list(grid.seeds), "num_cells": len(grid.cells()), "num_rows": len(df)}
    return write_files(out_dir, {
        "sweep.csv": lambda: df.to_csv(index=False),
        "sweep.json": lambda: json.dumps(info, indent=2) + "\n",
        "frontier.csv": lambda: frontier_frame(aggregate(df, list(grid.axes)),
                                               list(grid.axes)).to_csv(index=False),
        "sweep.html": lambda: sweep_page(df, grid, base, elapsed_s)})
