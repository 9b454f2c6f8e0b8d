"""``servesim plan --by-window 1h``: the load over a long trace, window by window. The
trace's arrivals are cut into windows of ``window_s`` seconds from its first arrival
(window_spans: the last one runs to the last arrival); each window's rate (its requests
/ its length) is a target, and the plan's chosen config is confirmed at it as a plan
with ``--target-rate`` that rate confirms it (plan.confirm_replicas: the same probes,
seeds and cluster checks). From the replicas per window: the peak, the time-weighted
mean, and the GPU-hours of a scaler that follows the load (each window's replicas x TP
for the window's length) against a fleet sized for the peak over the trace's span.
Re-timed (Poisson) plans over a trace only. Method: docs/capacity.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scenarios.build import build_workload
from sim.app.runs.durations import parse_duration
from sim.app.runs.loop_comparison import Runner
from sim.app.runs.plan import ClusterCheck, confirm_replicas
from sim.app.runs.plan_spec import ConfigResult, PlanSpec


@dataclass(frozen=True)
class Window:
    """One window: ``start_s`` after the trace's first arrival, ``length_s`` (window_spans),
    its ``num_requests``, ``rate_rps`` = num_requests / length_s, and the replicas
    confirmed at that rate (0 for an empty window; None when no cluster size passed)."""

    start_s: float
    length_s: float
    num_requests: int
    rate_rps: float
    replicas: int | None
    checks: list[ClusterCheck] = field(default_factory=list)


@dataclass(frozen=True)
class LoadOverDay:
    """The windows of a trace, and the fleet they need at ``tensor_parallel_size``, with
    ``gpus_per_replica`` GPUs a replica (TP, or x x TP_p + y x TP_d for an xPyD unit,
    ``unit`` "1P2D unit" then); the
    figures below are None unless every window was confirmed."""

    window_s: float
    tensor_parallel_size: int
    windows: list[Window]
    gpus_per_replica: int
    unit: str = "replica"

    @property
    def confirmed(self) -> bool:
        return all(w.replicas is not None for w in self.windows)

    @property
    def span_s(self) -> float:
        return sum(w.length_s for w in self.windows)

    def _replicas(self) -> list[int] | None:
        return [w.replicas for w in self.windows if w.replicas is not None] \
            if self.confirmed else None

    @property
    def peak_replicas(self) -> int | None:
        r = self._replicas()
        return None if r is None else max(r)

    @property
    def mean_replicas(self) -> float | None:
        """Replicas averaged over the trace's span (each window weighted by its length)."""
        g = self.gpu_hours_following_load
        return None if g is None else g * 3600 / self.gpus_per_replica / self.span_s

    @property
    def gpu_hours_following_load(self) -> float | None:
        """Each window's GPUs for the window's length, summed, in GPU-hours."""
        r = self._replicas()
        return None if r is None else sum(
            n * w.length_s for n, w in zip(r, self.windows, strict=True)) \
            * self.gpus_per_replica / 3600

    @property
    def gpu_hours_at_peak(self) -> float | None:
        """The peak's GPUs over the trace's span, in GPU-hours."""
        peak = self.peak_replicas
        return None if peak is None else peak * self.gpus_per_replica * self.span_s / 3600


def window_spans(arrival_time: np.ndarray, window_s: float) -> list[tuple[float, float, int]]:
    """(start s, length s, requests) of each window of arrivals (s, shape ``(n,)``,
    sorted) from the first arrival: ``round(span / window_s)`` windows (at least one),
    each ``window_s`` long but the last, which runs from its start to the last arrival
    and holds it, so that each window's requests / its length is the rate the trace
    shows there (a last window shorter than half of ``window_s`` joins the one before
    it rather than resting its rate on a sliver of the trace: the last is between 0.5
    and 1.5 ``window_s`` long). ValueError (naming --by-window) when ``window_s`` is
    longer than the span from the first to the last arrival."""
    t = np.asarray(arrival_time, dtype=np.float64) - float(arrival_time[0])
    span_s = float(t[-1])
    if window_s > span_s:
        raise ValueError(f"--by-window {window_s:g} s is longer than the trace's span "
                         f"({span_s:g} s from its first to its last arrival): give a "
                         "shorter window")
    num_windows = max(1, math.floor(span_s / window_s + 0.5))
    index = np.minimum((t // window_s).astype(np.int64), num_windows - 1)
    counts = np.bincount(index, minlength=num_windows)
    return [(k * window_s, window_s if k < num_windows - 1 else span_s - k * window_s,
             int(counts[k])) for k in range(num_windows)]


def window_counts(spec: PlanSpec, window_s: float) -> list[tuple[float, float, int]]:
    """window_spans of the plan's trace (its --window cut applied)."""
    b = spec.base
    assert b.trace is not None
    w = build_workload(trace=Path(b.trace), trace_format=b.trace_format, scenario=None,
                       arrival=None, rate=None, burstiness=None, num_requests=None,
                       window_s=b.window, time_scale=None, max_tokens=None, seed=0,
                       tokenizer=b.tokenizer)
    return window_spans(w.arrival_time, window_s)


def check_by_window(spec: PlanSpec) -> None:
    """ValueError unless ``spec`` plans re-timed rates over a trace."""
    if spec.base.trace is None or spec.load_axis != "rate" or spec.arrival != "poisson":
        raise ValueError("--by-window cuts a trace into windows and plans each window's "
                         "rate re-timed: give --trace, with --load rate and --arrival poisson")


def window_seconds(spec: PlanSpec, text: str | None) -> float | None:
    """--by-window's ``text`` in seconds (None when not given), checked against the plan
    (check_by_window); ValueError otherwise."""
    if text is None:
        return None
    seconds = parse_duration(text, "--by-window", positive=True)
    check_by_window(spec)
    window_counts(spec, seconds)  # refuses a window longer than the trace
    return seconds


def load_over_day(spec: PlanSpec, best: ConfigResult, window_s: float,
                  runner: Runner) -> LoadOverDay:
    """The replicas of config ``best`` each window of the trace needs (check_by_window
    first)."""
    windows = []
    for start, length, n in window_counts(spec, window_s):
        rate = n / length
        if n == 0:
            windows.append(Window(start, length, 0, 0.0, 0))
            continue
        replicas, checks = confirm_replicas(dataclasses.replace(spec, target=rate), best,
                                            runner)
        windows.append(Window(start, length, n, rate, replicas, checks))
    unit = "replica" if best.pools is None else f"{best.config.disagg} unit"
    return LoadOverDay(window_s, best.tp, windows, best.gpus_per_replica, unit)
