"""HTML reports of run directories: one self-contained file that works offline.

Owns the report's figures and its page; loading a run directory (config.json,
summary.json, requests.csv, steps.csv) is sim/app/reports/run_dir.py, the tables
sim/app/reports/tables.py, the page shell and HTML tables sim/app/reports/html_page.py. plotly is
imported lazily, inside the functions that draw.

Size control, so a 19,366-request replay stays a few MB on top of plotly.js (~4.7 MB):
- CDFs keep at most ``CDF_POINTS`` points of each empirical CDF: the sorted values at
  evenly spaced ranks, first and last included, each at its exact cumulative fraction.
- The step timeline keeps at most ``TIMELINE_POINTS`` points per series: when a run has
  more steps, the time from the first step's start to the last step's end is cut into
  that many equal buckets and each bucket becomes one point at its midpoint: batch size
  and KV cache usage are means weighted by step duration (the level seen over the busy
  time of the bucket), prefill and decode tokens are means per step, the waiting queue is
  the bucket's peak (a whole number of requests: a mean would draw a queue that held one
  request for a tenth of the bucket as 0.1 requests), preemptions are the bucket's total.
  Buckets without a step are gaps in the line.

Figures show each quantity in one unit, the one the tables use: TTFT and TPOT in ms (as
vLLM's benchmarks), E2E latency and queueing time in s; latency CDFs are on log axes.
- Throughput is tokens (or requests) per second over ``THROUGHPUT_BUCKETS`` equal buckets.
"""

from __future__ import annotations

import functools
import html
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.app.reports.html_page import page
from sim.app.reports.pool_timeline import is_disaggregated, pool_timeline_figure
from sim.app.reports.run_dir import RunData, load_runs
from sim.app.reports.tables import config_table, headline_table, latency_table
from sim.app.runs.out_dir import check_files, mark_png, write_files

CDF_POINTS = 1000
TIMELINE_POINTS = 2000
THROUGHPUT_BUCKETS = 200
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
# -- data reduction ----------------------------------------------------------------------


def cdf_points(values: np.ndarray, max_points: int = CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) of the empirical CDF of the finite values, at most ``max_points`` points
    (evenly spaced ranks, min and max kept)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v)]
    n = v.size
    if n == 0:
        return v, v
    idx = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(np.int64))
    return v[idx], (idx + 1) / n


def _num_steps(steps: pd.DataFrame) -> np.ndarray:
    """How many engine steps each row stands for (steps.csv is run-length compressed;
    see step_compression.compress_steps); 1 per row for an uncompressed frame."""
    if "num_steps" in steps:
        return steps["num_steps"].to_numpy(np.float64)
    return np.ones(len(steps))


def timeline(steps: pd.DataFrame, num_usable_blocks: int,
             max_points: int = TIMELINE_POINTS) -> pd.DataFrame:
    """The step timeline, bucketed in time when longer than ``max_points`` (see the
    module docstring). Columns: time, num_seqs, num_prefill_tokens, num_decode_tokens,
    kv_usage (fraction), num_waiting, num_preempted."""
    t = steps["start_time"].to_numpy(np.float64)
    d = steps["duration_s"].to_numpy(np.float64)
    k = _num_steps(steps)
    cols = {c: steps[c].to_numpy(np.float64) for c in (
        "num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_waiting", "num_preempted")}
    cols["kv_usage"] = steps["kv_blocks_used"].to_numpy(np.float64) / max(num_usable_blocks, 1)
    if len(t) <= max_points:
        return pd.DataFrame({"time": t, **cols})
    t0, t1 = float(t.min()), float((t + d).max())
    idx = np.minimum(((t - t0) / (t1 - t0) * max_points).astype(np.int64), max_points - 1)
    n = np.bincount(idx, weights=k, minlength=max_points)
    busy = np.bincount(idx, weights=d, minlength=max_points)
    with np.errstate(invalid="ignore", divide="ignore"):
        def weighted(x: np.ndarray) -> np.ndarray:
            return np.bincount(idx, weights=x * d, minlength=max_points) / busy

        def per_step(x: np.ndarray) -> np.ndarray:
            return np.bincount(idx, weights=x * k, minlength=max_points) / n

        out = {
            "time": t0 + (np.arange(max_points) + 0.5) * (t1 - t0) / max_points,
            "num_seqs": weighted(cols["num_seqs"]),
            "num_prefill_tokens": per_step(cols["num_prefill_tokens"]),
            "num_decode_tokens": per_step(cols["num_decode_tokens"]),
            "kv_usage": weighted(cols["kv_usage"]),
            "num_waiting": _bucket_peak(idx, cols["num_waiting"], max_points),
            "num_preempted": np.where(n > 0, np.bincount(
                idx, weights=cols["num_preempted"], minlength=max_points), np.nan),
        }
    return pd.DataFrame(out)


def _bucket_peak(idx: np.ndarray, x: np.ndarray, num_buckets: int) -> np.ndarray:
    """The largest of ``x`` in each bucket (``idx``: each value's bucket); NaN where a
    bucket holds no value."""
    peak = np.full(num_buckets, np.nan)
    np.fmax.at(peak, idx, x)
    return peak


def throughput(steps: pd.DataFrame, requests: pd.DataFrame,
               num_buckets: int = THROUGHPUT_BUCKETS) -> pd.DataFrame:
    """Per-second rates over equal time buckets: total_tokens_per_s (prefill + decode
    tokens computed), output_tokens_per_s (decodes plus first tokens) and
    requests_per_s (finished requests)."""
    t = steps["start_time"].to_numpy(np.float64)
    if len(t) == 0:
        return pd.DataFrame(columns=["time", "total_tokens_per_s", "output_tokens_per_s",
                                     "requests_per_s"])
    t0 = float(t.min())
    t1 = float((t + steps["duration_s"].to_numpy(np.float64)).max())
    width = (t1 - t0) / num_buckets if t1 > t0 else 1.0
    edges = t0 + np.arange(num_buckets + 1) * width

    def rate(times: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.histogram(times, bins=edges, weights=weights)[0] / width

    k = _num_steps(steps)
    pre = steps["num_prefill_tokens"].to_numpy(np.float64) * k
    dec = steps["num_decode_tokens"].to_numpy(np.float64) * k
    first = requests["first_token_time"].to_numpy(np.float64)
    fin = requests.loc[requests["status"] == "finished", "finish_time"].to_numpy(np.float64)
    return pd.DataFrame({
        "time": edges[:-1] + width / 2,
        "total_tokens_per_s": rate(t, pre + dec),
        "output_tokens_per_s": rate(t, dec) + rate(first[np.isfinite(first)]),
        "requests_per_s": rate(fin[np.isfinite(fin)]),
    })


# -- figures ------------------------------------------------------------------------------

CDF_METRICS = (("ttft_s", "TTFT", "ms", 1e3), ("tpot_s", "TPOT", "ms", 1e3),
               ("e2e_latency_s", "E2E latency", "s", 1.0),
               ("queued_time_s", "queueing time", "s", 1.0))
"""(requests.csv column, name, unit, scale) of each CDF: TTFT and TPOT in ms as in the
tables (and vLLM's benchmarks), E2E latency and queueing time in s."""


def cdf_figure(runs: list[RunData]) -> Any:
    """2 x 2 CDFs of TTFT, TPOT, E2E latency and queueing time, runs overlaid, on log
    x axes: one saturated run, orders of magnitude slower, leaves the others readable.
    A zero value (a request that never queued) has no place on a log axis: the subplot
    title says how many each run left out, and its curve starts at the fraction at or
    below its smallest drawn value."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    zeros = {col: sum(int((r.requests[col] == 0).sum()) for r in runs)
             for col, *_ in CDF_METRICS}
    titles = [f"{name} ({unit}, log axis" + (f"; {zeros[col]:,} requests at 0 {unit} not "
                                             "drawn)" if zeros[col] else ")")
              for col, name, unit, _ in CDF_METRICS]
    fig = make_subplots(rows=2, cols=2, subplot_titles=titles,
                        vertical_spacing=0.2, horizontal_spacing=0.08)
    for i, run in enumerate(runs):
        colour = COLOURS[i % len(COLOURS)]
        for j, (col, name, unit, scale) in enumerate(CDF_METRICS):
            x, y = cdf_points(run.requests[col].to_numpy())
            fig.add_trace(go.Scatter(
                x=x * scale, y=y, mode="lines", line={"color": colour, "shape": "hv"},
                name=run.name, legendgroup=run.name, showlegend=j == 0,
                hovertemplate=f"{name} %{{x:.4g}} {unit}<br>fraction %{{y:.3f}}"
                              f"<extra>{run.name}</extra>",
            ), row=j // 2 + 1, col=j % 2 + 1)
            fig.update_xaxes(type="log", title_text=f"{name} ({unit})",
                             row=j // 2 + 1, col=j % 2 + 1)
    fig.update_yaxes(range=[0, 1.01], title_text="fraction of requests", col=1)
    fig.update_layout(title="Latency distributions (empirical CDFs)", height=700,
                      margin={"t": 80})
    return fig


TIMELINE_ROWS = (
    ("batch size (seqs)", ("num_seqs",)),
    ("tokens per step (prefill solid, decode dotted)",
     ("num_prefill_tokens", "num_decode_tokens")),
    ("KV cache usage (% of blocks)", ("kv_usage",)),
    ("waiting queue (requests)", ("num_waiting",)),
    ("preemptions (requests)", ("num_preempted",)),
)
COUNT_ROWS = (1, 4, 5)
"""The timeline's rows of counts (1-based): integer ticks, drawn as steps, from 0."""


def timeline_figure(runs: list[RunData]) -> Any:
    """The step timeline, one row per quantity, runs overlaid (bucketed when long); each
    value holds until the next step (or bucket) starts, and every axis starts at 0."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=len(TIMELINE_ROWS), cols=1, shared_xaxes=True,
                        subplot_titles=[t for t, _ in TIMELINE_ROWS], vertical_spacing=0.05)
    bucketed = False
    peaks = [0.0] * len(TIMELINE_ROWS)
    for i, run in enumerate(runs):
        colour = COLOURS[i % len(COLOURS)]
        for name, steps, num_gpu_blocks in _per_replica(run):
            tl = timeline(steps, num_gpu_blocks - 1)
            bucketed |= len(tl) < len(steps)
            first = True
            for r, (_, cols) in enumerate(TIMELINE_ROWS):
                for c in cols:
                    peaks[r] = max(peaks[r], float(np.nan_to_num(tl[c].max())))
                    fig.add_trace(go.Scatter(
                        x=tl["time"].to_numpy(), y=tl[c].to_numpy(), mode="lines", name=name,
                        legendgroup=name, showlegend=first,
                        line={"color": colour, "width": 1, "shape": "hv",
                              "dash": "dot" if c == "num_decode_tokens" else "solid"},
                        hovertemplate=f"{c} %{{y:.4g}} at %{{x:.3f}} s<extra>{name}</extra>",
                    ), row=r + 1, col=1)
                    first = False
    _timeline_axes(fig, peaks)
    note = (f"each point: one of {TIMELINE_POINTS:,} equal time buckets (duration-weighted "
            "means; waiting queue: the bucket's peak; preemptions summed)" if bucketed
            else "one point per engine step")
    fig.update_layout(title=f"Step timeline<br><sup>{note}</sup>", height=1100,
                      margin={"t": 90})
    return fig


def _timeline_axes(fig: Any, peaks: list[float]) -> None:
    """Every y axis from 0 (up to its row's peak, ``peaks``); counts in whole numbers."""
    for r, peak in enumerate(peaks, start=1):
        top = max(peak, 1.0 if r in COUNT_ROWS else 0.0) * 1.05 or 1.0
        fig.update_yaxes(range=[0, top], row=r, col=1)
        if r in COUNT_ROWS:
            fig.update_yaxes(tickformat=",d", dtick=1 if peak <= 5 else None, row=r, col=1)
    fig.update_yaxes(tickformat=".0%", row=3, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=len(TIMELINE_ROWS), col=1)


def _per_replica(run: RunData) -> list[tuple[str, pd.DataFrame, int]]:
    """A run's steps, split by replica for a cluster run (its steps.csv has a
    ``replica`` column), by pool and replica for a disaggregated one (and a ``pool``
    column): each engine's batch and KV cache is its own. With each engine's
    num_gpu_blocks: summary.json's kv_cache.num_gpu_blocks, or for a pool's engine
    disagg.<pool>.kv_cache.num_gpu_blocks (the pools may run on different GPUs or TP;
    the blocks that pool's peak_usage is over)."""
    steps = run.steps
    blocks = int(run.summary["kv_cache"]["num_gpu_blocks"])
    if "pool" in steps:
        pools = run.summary["disagg"]
        return [(f"{run.name} {pool} {k}", g, int(pools[pool]["kv_cache"]["num_gpu_blocks"]))
                for pool in ("prefill", "decode")
                for k, g in steps[steps["pool"] == pool].groupby("replica", sort=True)]
    if "replica" not in steps or steps["replica"].nunique() <= 1:
        return [(run.name, steps, blocks)]
    return [(f"{run.name} replica {k}", g, blocks)
            for k, g in steps.groupby("replica", sort=True)]


def throughput_figure(runs: list[RunData]) -> Any:
    """Token and request throughput over time, runs overlaid."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=["tokens/s (output solid, all computed dashed)",
                                        "finished requests/s"])
    for i, run in enumerate(runs):
        colour = COLOURS[i % len(COLOURS)]
        th = throughput(run.steps, run.requests)
        x = th["time"].to_numpy()
        for col, row, dash, show in (("output_tokens_per_s", 1, "solid", True),
                                     ("total_tokens_per_s", 1, "dash", False),
                                     ("requests_per_s", 2, "solid", False)):
            fig.add_trace(go.Scatter(
                x=x, y=th[col].to_numpy(), mode="lines", name=run.name, legendgroup=run.name,
                showlegend=show, line={"color": colour, "dash": dash, "width": 1.5},
                hovertemplate=f"{col} %{{y:,.1f}} at %{{x:.2f}} s<extra>{run.name}</extra>",
            ), row=row, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="tokens/s", row=1, col=1)
    fig.update_yaxes(title_text="requests/s", row=2, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=2, col=1)
    fig.update_layout(title=f"Throughput over time ({THROUGHPUT_BUCKETS} equal time buckets)",
                      height=600, margin={"t": 80})
    return fig


def report_parts(runs: list[RunData]) -> list[str | Any]:
    """The report, in order: tables and figures."""
    names = ", ".join(html.escape(r.name) for r in runs)
    head = "Comparison" if len(runs) > 1 else "Summary"
    tables = [f"<div><h2>{head}</h2>"
              + headline_table(runs, "comparison" if len(runs) > 1 else "summary") + "</div>"]
    tables.append("<div>" + "".join(f"<h2>Latency: {html.escape(r.name)}</h2>"
                                    + latency_table(r) for r in runs) + "</div>")
    tables.append("<div><h2>Configuration</h2>" + config_table(runs)
                  + "<p class=\"note\">settings left unset in every run are not listed, "
                  "nor the memory plan and model spec (each run's config.json holds them); "
                  "changed settings are highlighted</p></div>")
    parts: list[str | Any] = [f"<p>runs: {names}</p>", '<div class="row">', *tables, "</div>"]
    figs = report_figures(runs)
    parts += ["<h2>Latency CDFs</h2>", figs[0], "<h2>Step timeline</h2>", figs[1],
              "<h2>Throughput over time</h2>", figs[2]]
    pooled = [r for r in runs if is_disaggregated(r)]
    for run, fig in zip(pooled, figs[3:], strict=True):
        parts += [f"<h2>Prefill and decode pools: {html.escape(run.name)}</h2>", fig]
    return parts


def report_figures(runs: list[RunData]) -> list[Any]:
    """The report's figures: CDFs, step timeline, throughput, then the pool timeline of
    each disaggregated run (sim/app/reports/pool_timeline.py)."""
    return [cdf_figure(runs), timeline_figure(runs), throughput_figure(runs),
            *(pool_timeline_figure(r) for r in runs if is_disaggregated(r))]


def write_report(paths: Sequence[Path], out: Path,
                 warn: Callable[[str], None] | None = None) -> int:
    """Load the runs, write the report to ``out`` and return its size in bytes. Raises
    ValueError naming --out, before loading, when ``out`` may not be written
    (sim/app/runs/out_dir.py: a file there that is not a servesim page), or naming a run
    directory that fails its checks (run_dir.load_run, which gives ``warn`` its lines)."""
    out = Path(out)
    check_files(out.parent, [out.name])
    runs = load_runs(paths, warn)
    text = page("servesim report", report_parts(runs))
    write_files(out.parent, {out.name: lambda: text})
    return len(text.encode("utf-8"))


def kaleido_missing() -> str | None:
    """None when plotly can export PNG here, else a one-line reason."""
    if importlib.util.find_spec("kaleido") is None:
        return "PNG export needs kaleido, which is not installed (pip install kaleido)"
    return None


def png_paths(out: Path, count: int) -> list[Path]:
    """Where write_pngs puts ``count`` figures: ``out`` for one, else ``out-1.png``, ..."""
    out = Path(out)
    return [out] if count == 1 else [
        out.with_name(f"{out.stem}-{i + 1}{out.suffix or '.png'}") for i in range(count)]


def write_pngs(figs: Sequence[Any], out: Path, option: str = "--png") -> list[Path]:
    """Write each figure as a PNG at png_paths(out, len(figs)), marked as servesim's
    (sim/app/runs/out_dir.py mark_png), all or none. Raises ValueError with a one-line
    reason when kaleido is missing or fails, or naming ``option`` when a file there may
    not be replaced."""
    reason = kaleido_missing()
    if reason:
        raise ValueError(reason)
    paths = png_paths(out, len(figs))
    check_files(paths[0].parent, [p.name for p in paths], option)
    images = []
    for fig in figs:
        try:
            images.append(mark_png(fig.to_image(format="png", width=1400,
                                                height=fig.layout.height or 700)))
        except Exception as e:  # kaleido's errors vary by version; report them in one line
            raise ValueError(f"PNG export failed: {e}".splitlines()[0]) from e
    files: dict[str, Callable[[], str | bytes]] = {
        p.name: functools.partial(bytes, b) for p, b in zip(paths, images, strict=True)}
    return write_files(paths[0].parent, files, option)
