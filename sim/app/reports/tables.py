"""The HTML report's tables (sim/app/reports/report.py draws the figures and assembles the page):
headline metrics (one column per run, the best starred), latency percentiles, and the
configuration with the settings that differ between runs highlighted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.app.reports.html_page import table
from sim.app.reports.run_dir import HEADLINE, RunData


def _flat_config(cfg: dict[str, Any]) -> dict[str, str]:
    """config.json as setting -> text; the resolved values under ``resolved.``, less
    those that are objects (the memory plan, the model's spec: dozens of fields that
    config.json keeps and the model's name already stands for)."""
    out = {k: "-" if v is None else str(v) for k, v in cfg.items() if k != "resolved"}
    for k, v in (cfg.get("resolved") or {}).items():
        if not isinstance(v, dict):
            out[f"resolved.{k}"] = "-" if v is None else str(v)
    return out


def config_table(runs: list[RunData]) -> str:
    """Configuration, one column per run; rows that differ between runs are marked."""
    flat = [_flat_config(r.config) for r in runs]
    keys = [k for k in dict.fromkeys(k for f in flat for k in f)
            if any(f.get(k, "-") != "-" for f in flat)]
    rows = [[k, *(f.get(k, "-") for f in flat)] for k in keys]
    diff = {i for i, row in enumerate(rows) if len(set(row[1:])) > 1}
    return table(["setting", *(r.name for r in runs)], rows, table_id="config",
                  bold_rows=diff)


def _num(x: Any, scale: float = 1.0, fmt: str = ",.3f") -> str:
    return "-" if x is None else format(x * scale, fmt)


LATENCY_ROWS = (("ttft_s", "TTFT (ms)", 1000.0), ("tpot_s", "TPOT (ms)", 1000.0),
                ("itl_s", "ITL (ms)", 1000.0), ("e2e_latency_s", "E2E latency (s)", 1.0),
                ("queued_time_s", "queueing time (s)", 1.0))


def latency_table(run: RunData) -> str:
    """mean / p50 / p90 / p95 / p99 / max of each latency metric of one run."""
    stats = ("mean", "p50", "p90", "p95", "p99", "max")
    rows = [[label, *(_num(run.summary[key][s], scale, ",.1f" if scale > 1 else ",.3f")
                      for s in stats)] for key, label, scale in LATENCY_ROWS]
    return table(["metric", *stats], rows)


def _pick(path: str) -> Callable[[dict[str, Any]], Any]:
    def get(summary: dict[str, Any]) -> Any:
        v: Any = summary
        for part in path.split("."):
            v = None if v is None else v.get(part)
        return v
    return get


def headline_table(runs: list[RunData], table_id: str) -> str:
    """Headline metrics, one column per run, first whether the run saturated; with
    several runs the best value of each metric that has a direction is starred."""
    rows = [["saturated (latency not steady-state)",
             *("YES" if r.summary.get("saturated") else "no" for r in runs)]]
    for label, path, scale, fmt, better in HEADLINE:
        vals = [_pick(path)(r.summary) for r in runs]
        cells = [_num(v, scale, fmt) for v in vals]
        known = [v for v in vals if v is not None]
        if len(runs) > 1 and better and known and len(set(known)) > 1:
            best = max(known) if better == "higher" else min(known)
            cells = [c + " *" if v == best else c for c, v in zip(cells, vals, strict=True)]
        rows.append([label + (f" ({better} is better)" if len(runs) > 1 and better else ""),
                     *cells])
    return table(["metric", *(r.name for r in runs)], rows, table_id=table_id)
