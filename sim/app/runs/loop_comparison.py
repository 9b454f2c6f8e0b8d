"""Open against closed loop at equal throughput, the evidence ``servesim plan``
(sim/app/runs/plan.py) gives for its chosen config: closed-loop users slow their own
arrivals when the server slows, so they hide queueing that open-loop arrivals at the
same throughput show. run_loop is top-level so that workers can run it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.app.runs.load_search import with_load
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from sim.engine import SchedulerStuck

#: ``runner(fn, items)`` maps a top-level function over items in parallel, in order.
Runner = Callable[[Callable[[Any], Any], list[Any]], list[Any]]


@dataclass(frozen=True)
class LoopRun:
    """Steady-window latency of one open- or closed-loop run: requests sent after the
    first ``trim`` and before the last ``trim`` (the closed loop's start-up wave and
    drain), throughput = completions per second between those two send times."""

    kind: str
    load: float
    num_measured: int
    throughput_rps: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    e2e_mean_s: float | None
    e2e_p99_s: float | None
    queued_mean_s: float | None
    saturated: bool
    error: str = ""


@dataclass(frozen=True)
class LoopTask:
    config: RunConfig
    kind: str
    load: float
    trim: int


def run_loop(task: LoopTask) -> LoopRun:
    """Simulate one side of the open/closed comparison (top-level: runs in workers)."""
    axis = "concurrency" if task.kind == "closed" else "rate"
    cfg = with_load(task.config, axis, task.load, task.config.seed)
    try:
        res = simulate_prepared(prepare(cfg))
    except (ValueError, FileNotFoundError, SchedulerStuck) as e:
        return LoopRun(task.kind, task.load, 0, 0.0, None, None, None, None, None, None,
                       None, False, str(e))
    req = res.requests
    n, trim = len(req), task.trim
    if n <= 2 * trim + 10:
        trim = 0
    window = req.iloc[trim:n - trim] if trim else req
    t_a, t_b = float(window["arrival_time"].iloc[0]), float(window["arrival_time"].iloc[-1])
    fin = req["finish_time"].to_numpy()
    done = int(((fin >= t_a) & (fin <= t_b)).sum())
    ok = window[window["status"] == "finished"]

    def q(col: str, p: float) -> float | None:
        v = ok[col].dropna().to_numpy()
        return float(np.percentile(v, p)) if v.size else None

    return LoopRun(
        task.kind, task.load, len(window), done / (t_b - t_a) if t_b > t_a else 0.0,
        q("ttft_s", 50), q("ttft_s", 99), q("tpot_s", 50), q("tpot_s", 99),
        float(ok["e2e_latency_s"].mean()) if len(ok) else None, q("e2e_latency_s", 99),
        float(window["queued_time_s"].mean()), bool(res.summary["saturated"]))


def loop_comparison(cfg: RunConfig, load_axis: str, load: float, num_requests: int,
                    runner: Runner) -> list[LoopRun]:
    """Closed and open loop at equal throughput (``cfg``'s seed): C closed-loop users
    (Little's law, C = rate x mean E2E at the operating rate ``load``, or the operating
    concurrency), then Poisson arrivals at the steady throughput those users reached;
    each side simulates at least ``num_requests`` requests (10 per user)."""
    if load_axis == "rate":
        probe = runner(run_loop, [LoopTask(cfg, "open", load, 0)])[0]
        users = max(1, round(load * (probe.e2e_mean_s or 0.0)))
    else:
        users = max(1, int(load))
    cfg = dataclasses.replace(cfg, num_requests=max(num_requests, 10 * users))
    closed = runner(run_loop, [LoopTask(cfg, "closed", users, users)])[0]
    if closed.error or closed.throughput_rps <= 0:
        return [closed]
    matched = runner(run_loop, [LoopTask(cfg, "open", closed.throughput_rps, users)])[0]
    return [closed, matched]
