"""The probe and the load search of ``servesim plan`` (sim/app/runs/plan.py): one simulation
judged against the SLOs, and the search over load for one (config, seed), bracketing then
bisecting the boundary between feasible and infeasible loads (method: docs/capacity.md).
Both are top-level functions so that workers (sim/app/runs/backends.py) can run them.
A probe reaches its load by re-timing the requests (Poisson, or gamma with burstiness),
by closed-loop users, or by time-scaling a trace's own arrivals (TraceTiming).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scenarios.build import build_workload
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from sim.engine import SchedulerStuck
from sim.latency_stats import check_slo_seconds

MIN_RATE = 1e-3
"""The lowest rate (req/s) a search probes."""

Runner = Callable[[Callable[[Any], Any], list[Any]], list[Any]]
"""``runner(fn, items)``: fn over items in parallel, results in item order."""

PEAK_BINS = 10
"""A trace's peak rate is that of the busiest of this many equal slices of its span."""


@dataclass(frozen=True)
class SLO:
    """Latency objectives at a percentile: ``percentile``% of requests must have TTFT <=
    ttft_s and (separately) TPOT <= tpot_s. ValueError naming the field when invalid."""

    ttft_s: float | None
    tpot_s: float | None
    percentile: float = 99.0

    def __post_init__(self) -> None:
        if self.ttft_s is None and self.tpot_s is None:
            raise ValueError("a plan needs at least one SLO: slo_ttft or slo_tpot")
        check_slo_seconds("slo_ttft", self.ttft_s)
        check_slo_seconds("slo_tpot", self.tpot_s)
        if not 0 < self.percentile <= 100:
            raise ValueError(f"slo_percentile must be in (0, 100], got {self.percentile}")

    def describe(self) -> str:
        parts = []
        if self.ttft_s is not None:
            parts.append(f"p{self.percentile:g} TTFT <= {self.ttft_s:g} s")
        if self.tpot_s is not None:
            parts.append(f"p{self.percentile:g} TPOT <= {self.tpot_s * 1e3:g} ms")
        return " and ".join(parts)


@dataclass(frozen=True)
class Probe:
    """One simulation judged against the SLOs. load: req/s (rate) or users (concurrency);
    attainments: fraction of all requests meeting each SLO; p_ttft_s / p_tpot_s: the
    percentile over finished requests (as summary.json)."""

    load: float
    seed: int
    replicas: int = 1
    throughput_rps: float = 0.0
    ttft_attainment: float = 0.0
    tpot_attainment: float = 0.0
    p_ttft_s: float | None = None
    p_tpot_s: float | None = None
    p50_ttft_s: float | None = None
    e2e_mean_s: float | None = None
    saturated: bool = False
    feasible: bool = False
    error: str = ""


@dataclass(frozen=True)
class ProbeTask:
    """A probe to run in a worker: the config (load, seed and replicas set) and the SLO;
    ``load`` where the config does not carry it (a trace-timed probe's req/s)."""

    config: RunConfig
    slo: SLO
    load_axis: str
    load: float | None = None


@dataclass(frozen=True)
class TraceTiming:
    """A trace's own arrivals as a trace-timed probe replays them (the whole trace, or
    its first ``window`` seconds, in order): ``num_requests``, ``span_s`` (first to last
    arrival, s), ``mean_rate_rps`` = (num_requests - 1) / span_s, ``gap_cv`` (the
    coefficient of variation of the gaps between arrivals; 1 for Poisson) and
    ``peak_ratio`` (the rate of the busiest of PEAK_BINS equal slices of the span over
    the mean rate; about 1 for a steady rate)."""

    num_requests: int
    span_s: float
    mean_rate_rps: float
    gap_cv: float
    peak_ratio: float


def trace_timing(cfg: RunConfig) -> TraceTiming | None:
    """The timing of ``cfg``'s trace (its window applied; num_requests, the rate and
    the time scale ignored); None when it has fewer than two requests or all at one
    instant (nothing to time-scale). FileNotFoundError for a missing trace."""
    assert cfg.trace is not None
    w = build_workload(trace=Path(cfg.trace), trace_format=cfg.trace_format, scenario=None,
                       arrival=None, rate=None, burstiness=None, num_requests=None,
                       window_s=cfg.window, time_scale=None, max_tokens=None, seed=0,
                       tokenizer=cfg.tokenizer)
    t = np.asarray(w.arrival_time, dtype=np.float64)
    span = float(t[-1] - t[0]) if t.size else 0.0
    if t.size < 2 or not span > 0:
        return None
    gaps = np.diff(t)
    busiest = np.histogram(t, bins=PEAK_BINS, range=(t[0], t[-1]))[0].max()
    return TraceTiming(int(t.size), span, (t.size - 1) / span,
                       float(gaps.std() / gaps.mean()), float(busiest * PEAK_BINS / t.size))


def with_load(cfg: RunConfig, load_axis: str, load: float, seed: int,
              trace_rate_rps: float | None = None) -> RunConfig:
    """``cfg`` at one load and seed: Poisson (or the base's gamma) at ``load`` req/s, or
    ``load`` closed-loop users; with ``trace_rate_rps`` (the trace's own mean rate,
    TraceTiming), the whole trace in order, its own arrivals time-scaled to ``load``
    req/s (time_scale = load / trace_rate_rps; no request drawn at random)."""
    if trace_rate_rps is not None:
        assert load_axis == "rate"
        return dataclasses.replace(cfg, time_scale=load / trace_rate_rps, rate=None,
                                   arrival=None, burstiness=None, concurrency=None,
                                   num_requests=None, trace_sample=False, seed=seed)
    if load_axis == "concurrency":
        return dataclasses.replace(cfg, concurrency=int(load), rate=None, arrival=None,
                                   burstiness=None, seed=seed)
    arrival = "gamma" if cfg.burstiness is not None else "poisson"
    return dataclasses.replace(cfg, rate=float(load), arrival=arrival, concurrency=None,
                               seed=seed)


def run_probe(task: ProbeTask) -> Probe:
    """Simulate ``task.config`` and judge it (top-level: runs in workers)."""
    cfg, slo = task.config, task.slo
    raw = cfg.concurrency if task.load_axis == "concurrency" else cfg.rate
    raw = task.load if task.load is not None else raw
    load, seed, replicas = float(raw or 0.0), cfg.seed, cfg.replicas
    try:
        result = simulate_prepared(prepare(cfg))
    except (ValueError, FileNotFoundError, SchedulerStuck) as e:
        return Probe(load, seed, replicas, error=str(e))
    req, s = result.requests, result.summary
    ttft, tpot = req["ttft_s"].to_numpy(), req["tpot_s"].to_numpy()
    done = req["status"].to_numpy() == "finished"
    att_ttft = float(np.mean(done & (ttft <= slo.ttft_s))) if slo.ttft_s is not None else 1.0
    att_tpot = (float(np.mean(done & ~(tpot > slo.tpot_s))) if slo.tpot_s is not None
                else 1.0)
    need = slo.percentile / 100.0
    fin_ttft, fin_tpot = ttft[done], tpot[done]
    fin_tpot = fin_tpot[np.isfinite(fin_tpot)]
    return Probe(
        load, seed, replicas, throughput_rps=s["throughput"]["requests_per_s"],
        ttft_attainment=att_ttft, tpot_attainment=att_tpot,
        p_ttft_s=_percentile(fin_ttft, slo.percentile),
        p_tpot_s=_percentile(fin_tpot, slo.percentile),
        p50_ttft_s=s["ttft_s"]["p50"], e2e_mean_s=s["e2e_latency_s"]["mean"],
        saturated=bool(s["saturated"]),
        feasible=(att_ttft >= need - 1e-12 and att_tpot >= need - 1e-12
                  and not s["saturated"]),
    )


def _percentile(values: np.ndarray, p: float) -> float | None:
    return float(np.percentile(values, p)) if values.size else None


@dataclass(frozen=True)
class SearchTask:
    """The load search for one (config, seed); with ``trace_rate_rps`` each probe
    time-scales the trace's own arrivals (with_load)."""

    config_index: int
    config: RunConfig
    seed: int
    slo: SLO
    load_axis: str = "rate"
    start: float = 1.0
    tolerance: float = 0.02
    max_probes: int = 16
    trace_rate_rps: float | None = None


@dataclass(frozen=True)
class SearchResult:
    """Every probe of one search; sustainable = the highest feasible load found (0 when
    none), upper = the lowest infeasible one (None when never reached)."""

    config_index: int
    seed: int
    probes: tuple[Probe, ...]
    sustainable: float
    sustainable_throughput: float
    upper: float | None
    error: str = ""


def search(task: SearchTask) -> SearchResult:
    """Bracket (doubling / halving from task.start) then bisect the load, one probe after
    another (top-level: runs in workers). Concurrency is searched over integers."""
    return search_all([task], lambda fn, items: [fn(x) for x in items])[0]


MAX_DEPTH = 4
"""The most bisection levels a search probes at once (2**4 - 1 = 15 probes a round)."""


def speculation_depth(parallelism: int, num_searches: int) -> int:
    """Bisection levels each of ``num_searches`` searches probes per round on
    ``parallelism`` workers: enough that the round's 2**depth - 1 probes per search fill
    the workers (at least 1, at most MAX_DEPTH)."""
    levels = math.ceil(math.log2(max(parallelism, 1) / max(num_searches, 1) + 1))
    return min(max(levels, 1), MAX_DEPTH)


def search_all(tasks: list[SearchTask], runner: Runner,
               parallelism: int = 1) -> list[SearchResult]:
    """Every search of ``tasks``, their probes spread over ``parallelism`` workers by
    ``runner(fn, items)`` (in item order). Each round probes, for every unfinished
    search, every load its next ``speculation_depth`` steps may need (the nodes of its
    decision tree: k-section with k = 2**depth - 1); each search then follows its
    sequential path through them. Probes are deterministic, so every search takes the
    path, and records the probes, that ``search`` takes one at a time: the answer is the
    same at any parallelism, only the probes off the path are spent."""
    searches = [_Search(t) for t in tasks]
    while active := [s for s in searches if not s.done]:
        depth = speculation_depth(parallelism, len(active))
        wanted = [(s, load) for s in active for load in s.loads_ahead(depth)]
        probes = runner(search_probe, [s.probe_task(load) for s, load in wanted])
        for (s, load), p in zip(wanted, probes, strict=True):
            s.known[load] = p
        for s in active:
            s.advance()
    return [s.result() for s in searches]


def search_probe(task: ProbeTask) -> Probe:
    """run_probe for a load search (top-level: runs in workers; the CLI's progress names
    the phase by this name)."""
    return run_probe(task)


class _Search:
    """One search's state: the bracket (lo, hi), the probes on its path, the load it
    probes next, and every probe run for it so far (``known``, by load)."""

    def __init__(self, task: SearchTask) -> None:
        self.task = task
        self.integer = task.load_axis == "concurrency"
        self.lo: Probe | None = None
        self.hi: Probe | None = None
        self.path: list[Probe] = []
        self.load: float = float(max(1.0, round(task.start)) if self.integer else task.start)
        self.known: dict[float, Probe] = {}
        self.done = task.max_probes < 1

    def probe_task(self, load: float) -> ProbeTask:
        t = self.task
        cfg = with_load(t.config, t.load_axis, load, t.seed, t.trace_rate_rps)
        return ProbeTask(cfg, t.slo, t.load_axis, load)

    def loads_ahead(self, depth: int) -> list[float]:
        """The loads the next ``depth`` steps may probe, not yet known, in tree order."""
        out: list[float] = []
        self._tree(self.lo, self.hi, self.load, len(self.path), depth, out)
        return out

    def _tree(self, lo: Probe | None, hi: Probe | None, load: float, n: int, depth: int,
              out: list[float]) -> None:
        if depth == 0 or n >= self.task.max_probes:
            return
        if load not in self.known and load not in out:
            out.append(load)
        guess = Probe(load, self.task.seed)
        for b_lo, b_hi in ((guess, hi), (lo, guess)):  # feasible, infeasible
            nxt = _next_load(b_lo, b_hi, self.integer, self.task.tolerance)
            if nxt is not None:
                self._tree(b_lo, b_hi, nxt, n + 1, depth - 1, out)

    def advance(self) -> None:
        """Follow the sequential path through the known probes as far as they reach."""
        while not self.done and self.load in self.known:
            p = self.known[self.load]
            self.path.append(p)
            if p.error:
                self.done = True
                break
            if p.feasible:
                self.lo = p
            else:
                self.hi = p
            nxt = _next_load(self.lo, self.hi, self.integer, self.task.tolerance)
            self.done = nxt is None or len(self.path) >= self.task.max_probes
            self.load = self.load if nxt is None else nxt

    def result(self) -> SearchResult:
        t, lo, hi = self.task, self.lo, self.hi
        error = self.path[-1].error if self.path and self.path[-1].error else ""
        return SearchResult(t.config_index, t.seed, tuple(self.path),
                            lo.load if lo else 0.0, lo.throughput_rps if lo else 0.0,
                            hi.load if hi else None, error)


def _next_load(lo: Probe | None, hi: Probe | None, integer: bool,
               tolerance: float) -> float | None:
    """The next load to probe, or None when the bracket is narrow enough (or the load
    cannot go lower)."""
    if lo is None:
        assert hi is not None
        nxt = math.floor(hi.load / 2) if integer else hi.load / 2
        return None if nxt < (1 if integer else MIN_RATE) else nxt
    if hi is None:
        return lo.load * 2
    if hi.load - lo.load <= max(tolerance * lo.load, 1.0 if integer else 0.0):
        return None
    mid = (lo.load + hi.load) / 2
    return float(math.floor(mid)) if integer else mid
