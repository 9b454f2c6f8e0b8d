"""The "Load over the day" section of a plan's report (``--by-window``,
sim/app/runs/by_window.py): the replicas per window, the peak and the mean, and the
GPU-hours of a scaler following the load against a fleet sized for the peak."""

from __future__ import annotations

from typing import Any

import pandas as pd

from sim.app.reports.markdown import md_inline, md_table
from sim.app.runs.by_window import LoadOverDay


def windows_frame(d: LoadOverDay) -> pd.DataFrame:
    """One row per window: its start and length (h), requests, rate and replicas."""
    return pd.DataFrame([{"window start (h)": w.start_s / 3600,
                          "length (h)": w.length_s / 3600, "requests": w.num_requests,
                          "rate (req/s)": w.rate_rps, "replicas": w.replicas,
                          "GPUs": None if w.replicas is None
                          else w.replicas * d.gpus_per_replica}
                         for w in d.windows])


def summary_lines(d: LoadOverDay) -> list[str]:
    """The section's answer: peak, mean, and the GPU-hours both ways."""
    size = next(f"{d.window_s / unit:g} {name}" for unit, name in
                ((3600, "h"), (60, "min"), (1, "s")) if d.window_s >= unit or unit == 1)
    lines = [f"{len(d.windows)} windows of {size} (the last runs to the last arrival); "
             "each window's rate (its requests / the window's length) confirmed as "
             "`--target-rate` confirms it, for the chosen config."]
    follow, at_peak = d.gpu_hours_following_load, d.gpu_hours_at_peak
    if follow is None or at_peak is None:
        return [*lines, f"**Not every window was confirmed** (a window's {d.unit}s are "
                "missing where no cluster size passed): no GPU-hours are given."]
    saved = 1 - follow / at_peak if at_peak else 0.0
    return [*lines, f"**Peak {d.peak_replicas} {d.unit}s, mean {d.mean_replicas:.2f}**; a "
            f"scaler following the load uses **{follow:,.4g} GPU-hours** "
            f"against {at_peak:,.4g} for a fleet sized for the peak ({saved:.0%} "
            "fewer), before provisioning delays and the SLO misses of scaling late."]


def record(d: LoadOverDay) -> dict[str, Any]:
    """plan.json's ``by_window``: the peak, the mean and the GPU-hours are null unless
    every window was confirmed."""
    return {"window_s": d.window_s, "tensor_parallel_size": d.tensor_parallel_size,
            "gpus_per_replica": d.gpus_per_replica,
            "peak_replicas": d.peak_replicas, "mean_replicas": d.mean_replicas,
            "gpu_hours_following_load": d.gpu_hours_following_load,
            "gpu_hours_at_peak": d.gpu_hours_at_peak,
            "windows": [{"start_s": w.start_s, "length_s": w.length_s,
                         "num_requests": w.num_requests,
                         "rate_rps": w.rate_rps, "replicas": w.replicas,
                         "checks": [{"replicas": c.replicas, "passes": c.passes}
                                    for c in w.checks]} for w in d.windows]}


def markdown_section(d: LoadOverDay | None) -> list[str]:
    """capacity.md's section (none without --by-window)."""
    if d is None:
        return []
    return ["", "## Load over the day", "", *(f"- {x}" for x in summary_lines(d)), "",
            md_table(windows_frame(d))]


def html_section(d: LoadOverDay | None) -> list[str]:
    """capacity.html's section (none without --by-window)."""
    from sim.app.reports.sweep_page import table_html

    if d is None:
        return []
    return ["<h2>Load over the day</h2>", *(f"<p>{md_inline(x)}</p>" for x in summary_lines(d)),
            table_html(windows_frame(d))]
