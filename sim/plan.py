"""``servesim plan``: how much traffic one replica sustains within the SLOs, which engine
config does it best, and how many replicas (GPUs = replicas x TP) a target load needs.

Owns the probe (one simulation judged against the SLOs), the search over load for one
(config, seed), the cluster confirmation and the evidence runs (burstiness, open vs closed
loop). Reports are written by sim/plan_report.py. Method (docs/capacity.md):

- A probe replays the workload's first ``num_requests`` requests (their lengths) re-timed
  by Poisson arrivals at a rate (or by ``concurrency`` closed-loop users). It is feasible
  when at least ``percentile``% of all requests meet each SLO (rejected requests miss) and
  the run is not saturated (sim/saturation.py).
- The search for one (config, seed) doubles (or halves) the load from ``start`` until it
  brackets the boundary between feasible and infeasible, then bisects until the bracket is
  within ``tolerance`` of its lower end. The seed's sustainable load is the bracket's lower
  end. Over seeds, the plan reports the median with the [min, max] interval.
- Replicas for a target start from ceil(target / median) and are confirmed by simulating
  the whole cluster (router included) at the target on every seed: one more replica while
  it fails, one fewer while that still passes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.backends import Executor
from sim.engine import SchedulerStuck
from sim.runner import RunConfig, prepare, simulate_prepared
from sim.sweep import Grid

PLAN_AXES = ("policy", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
             "long_prefill_token_threshold", "tensor_parallel_size")
"""Engine knobs a plan may compare (the config grid)."""

BURSTINESS_LEVELS = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Gamma shapes of the burstiness evidence (CV = 1/sqrt(k); 1 = Poisson)."""

MIN_RATE = 1e-3
MAX_DOWN, MAX_UP = 2, 4


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
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ValueError(f"slo_{name[:-2]} must be a finite number > 0 seconds, got {v}")
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
    """A probe to run in a worker: the config (load, seed and replicas set) and the SLO."""

    config: RunConfig
    slo: SLO
    load_axis: str


def with_load(cfg: RunConfig, load_axis: str, load: float, seed: int) -> RunConfig:
    """``cfg`` at one load and seed: Poisson (or the base's gamma) at ``load`` req/s, or
    ``load`` closed-loop users."""
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
    """The load search for one (config, seed)."""

    config_index: int
    config: RunConfig
    seed: int
    slo: SLO
    load_axis: str = "rate"
    start: float = 1.0
    tolerance: float = 0.02
    max_probes: int = 16


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
    """Bracket (doubling / halving from task.start) then bisect the load (top-level: runs
    in workers). Concurrency is searched over integers."""
    integer = task.load_axis == "concurrency"
    lo: Probe | None = None
    hi: Probe | None = None
    probes: list[Probe] = []
    load = max(1.0, round(task.start)) if integer else task.start
    while len(probes) < task.max_probes:
        p = run_probe(ProbeTask(with_load(task.config, task.load_axis, load, task.seed),
                                task.slo, task.load_axis))
        probes.append(p)
        if p.error:
            break
        if p.feasible:
            lo = p
        else:
            hi = p
        nxt = _next_load(lo, hi, integer, task.tolerance)
        if nxt is None:
            break
        load = nxt
    error = probes[-1].error if probes and probes[-1].error else ""
    return SearchResult(task.config_index, task.seed, tuple(probes),
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


@dataclass
class ConfigResult:
    """One engine config of the grid: its knobs, searches and the derived capacity."""

    index: int
    knobs: dict[str, Any]
    config: RunConfig
    searches: list[SearchResult] = field(default_factory=list)
    error: str = ""

    @property
    def tp(self) -> int:
        return self.config.tensor_parallel_size

    def interval(self, load_axis: str = "rate") -> tuple[float, float, float]:
        """(median, min, max) over seeds of the sustainable load: req/s for a rate search,
        users for a concurrency search."""
        return _interval([s.sustainable for s in self.searches])

    def throughput_interval(self) -> tuple[float, float, float]:
        """(median, min, max) over seeds of the throughput (req/s) at the sustainable load."""
        return _interval([s.sustainable_throughput for s in self.searches])


def _interval(values: list[float]) -> tuple[float, float, float]:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return (0.0, 0.0, 0.0)
    return float(np.median(v)), float(v.min()), float(v.max())


@dataclass
class ClusterCheck:
    """A cluster of ``replicas`` at the target on every seed; passes when all do."""

    replicas: int
    probes: list[Probe]

    @property
    def passes(self) -> bool:
        return all(p.feasible for p in self.probes)


@dataclass
class PlanSpec:
    """What to plan: the base run (workload, model, GPU), the SLO, the config grid, the
    seeds and search settings, and the optional target."""

    base: RunConfig
    slo: SLO
    grid: Grid
    load_axis: str = "rate"
    target: float | None = None
    start: float = 1.0
    tolerance: float = 0.02
    max_probes: int = 16
    router: str = "least-outstanding"
    check_requests: int | None = None

    def __post_init__(self) -> None:
        if self.load_axis not in ("rate", "concurrency"):
            raise ValueError(f"load axis must be rate or concurrency, got {self.load_axis!r}")
        if self.target is not None and not (self.target > 0 and math.isfinite(self.target)):
            raise ValueError(f"target must be a finite number > 0, got {self.target}")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance must be in (0, 1), got {self.tolerance}")
        if not self.start > 0:
            raise ValueError(f"start must be > 0, got {self.start}")
        if self.max_probes < 2:
            raise ValueError(f"max_probes must be >= 2, got {self.max_probes}")
        unknown = set(self.grid.axes) - set(PLAN_AXES)
        if unknown:
            raise ValueError(f"a plan's config grid takes {', '.join(PLAN_AXES)}; "
                             f"got {', '.join(sorted(unknown))}")


@dataclass
class PlanResult:
    """Everything the reports show."""

    spec: PlanSpec
    configs: list[ConfigResult]
    best: ConfigResult | None
    checks: dict[int, list[ClusterCheck]]
    replicas: int | None
    operating_load: float
    burstiness: list[tuple[float, list[Probe]]]
    loops: list[LoopRun]
    elapsed_s: float = 0.0


#: ``runner(fn, items)`` maps a top-level function over items in parallel, in order.
Runner = Callable[[Callable[[Any], Any], list[Any]], list[Any]]


def run_plan(spec: PlanSpec, runner: Runner) -> PlanResult:
    """The whole plan. ``runner(fn, items)`` maps fn over items in parallel, in order
    (sim.backends.map_ordered with the CLI's workers and backend)."""
    configs = [ConfigResult(i, knobs, dataclasses.replace(spec.base, **knobs))
               for i, knobs in enumerate(spec.grid.cells())]
    for c in configs:
        try:
            prepare(dataclasses.replace(c.config, num_requests=1))
        except (ValueError, FileNotFoundError) as e:
            c.error = str(e)
    tasks = [SearchTask(c.index, c.config, s, spec.slo, spec.load_axis, spec.start,
                        spec.tolerance, spec.max_probes)
             for c in configs if not c.error for s in spec.grid.seeds]
    for res in runner(search, tasks):
        configs[res.config_index].searches.append(res)
        if res.error and not configs[res.config_index].error:
            configs[res.config_index].error = res.error
    best, checks, replicas = choose(spec, configs, runner)
    if best is None:
        return PlanResult(spec, configs, None, checks, None, 0.0, [], [])
    load = operating_load(spec, best, replicas)
    bursts = burstiness_evidence(spec, best, load, runner)
    loops = loop_comparison(spec, best, load, runner)
    return PlanResult(spec, configs, best, checks, replicas, load, bursts, loops)


def gpus_estimate(spec: PlanSpec, c: ConfigResult) -> float:
    """GPUs for the target from the median rate (inf when it sustains nothing)."""
    med = c.interval(spec.load_axis)[0]
    if spec.target is None:
        return c.tp / med if med > 0 else math.inf  # GPUs per req/s
    return math.ceil(spec.target / med) * c.tp if med > 0 else math.inf


def choose(spec: PlanSpec, configs: list[ConfigResult],
           runner: Runner) -> tuple[ConfigResult | None, dict[int, list[ClusterCheck]],
                                    int | None]:
    """The best config: fewest GPUs for the target, confirmed by cluster checks (the next
    candidate is checked too while its estimate beats the best confirmed count); without
    a target, the highest median rate per GPU."""
    ok = [c for c in configs if not c.error and c.interval(spec.load_axis)[0] > 0]
    ok.sort(key=lambda c: (gpus_estimate(spec, c), -c.interval(spec.load_axis)[0] / c.tp,
                           c.index))
    checks: dict[int, list[ClusterCheck]] = {}
    if not ok or spec.target is None:
        return (ok[0] if ok else None), checks, None
    best: ConfigResult | None = None
    best_gpus = math.inf
    for c in ok[:3]:
        if gpus_estimate(spec, c) >= best_gpus:
            break
        n, cl = confirm_replicas(spec, c, runner)
        checks[c.index] = cl
        if n is not None and n * c.tp < best_gpus:
            best, best_gpus = c, n * c.tp
    if best is None:
        return ok[0], checks, None
    return best, checks, int(best_gpus // best.tp)


def confirm_replicas(spec: PlanSpec, c: ConfigResult,
                     runner: Runner) -> tuple[int | None, list[ClusterCheck]]:
    """Smallest cluster that meets the SLOs at the target on every seed, searched from
    ceil(target / median): up while it fails (at most MAX_UP), down while it passes (at
    most MAX_DOWN, not below ceil(target / max))."""
    assert spec.target is not None
    med, _, top = c.interval(spec.load_axis)
    r = max(1, math.ceil(spec.target / med))
    floor = max(1, math.ceil(spec.target / top))
    checks = [cluster_check(spec, c, r, runner)]
    if checks[-1].passes:
        while r > floor and len(checks) <= MAX_DOWN:
            trial = cluster_check(spec, c, r - 1, runner)
            checks.append(trial)
            if not trial.passes:
                break
            r -= 1
        return r, checks
    for _ in range(MAX_UP):
        r += 1
        checks.append(cluster_check(spec, c, r, runner))
        if checks[-1].passes:
            return r, checks
    return None, checks


def cluster_check(spec: PlanSpec, c: ConfigResult, replicas: int,
                  runner: Runner) -> ClusterCheck:
    """Simulate ``replicas`` replicas of config ``c`` behind the router at the target."""
    assert spec.target is not None
    # Each replica sees about as many requests as a single-replica probe did.
    n = spec.check_requests or (spec.base.num_requests or 2000) * replicas
    cfg = dataclasses.replace(c.config, replicas=replicas, router=spec.router,
                              num_requests=n)
    target = math.ceil(spec.target) if spec.load_axis == "concurrency" else spec.target
    tasks = [ProbeTask(with_load(cfg, spec.load_axis, target, s), spec.slo, spec.load_axis)
             for s in spec.grid.seeds]
    return ClusterCheck(replicas, list(runner(run_probe, tasks)))


def operating_load(spec: PlanSpec, c: ConfigResult, replicas: int | None) -> float:
    """The load one replica carries in the plan: target / replicas when the cluster was
    confirmed, else the lowest sustainable load over seeds."""
    if spec.target is not None and replicas:
        return spec.target / replicas
    return c.interval(spec.load_axis)[1]


def burstiness_evidence(spec: PlanSpec, c: ConfigResult, load: float,
                        runner: Runner) -> list[tuple[float, list[Probe]]]:
    """The chosen config at the operating rate under gamma arrivals of each
    BURSTINESS_LEVELS shape, on every seed (rate plans only)."""
    if spec.load_axis != "rate" or load <= 0:
        return []
    tasks = [ProbeTask(dataclasses.replace(c.config, rate=load, arrival="gamma",
                                           burstiness=k, seed=s), spec.slo, "rate")
             for k in BURSTINESS_LEVELS for s in spec.grid.seeds]
    probes = runner(run_probe, tasks)
    n = len(spec.grid.seeds)
    return [(k, list(probes[i * n:(i + 1) * n])) for i, k in enumerate(BURSTINESS_LEVELS)]


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


def loop_comparison(spec: PlanSpec, c: ConfigResult, load: float,
                    runner: Runner) -> list[LoopRun]:
    """Closed and open loop at equal throughput (first seed): C closed-loop users (Little's
    law, C = rate x mean E2E at the operating rate, or the operating concurrency), then
    Poisson arrivals at the steady throughput those users reached."""
    seed = spec.grid.seeds[0]
    cfg = dataclasses.replace(c.config, seed=seed)
    if spec.load_axis == "rate":
        probe = runner(run_loop, [LoopTask(cfg, "open", load, 0)])[0]
        users = max(1, round(load * (probe.e2e_mean_s or 0.0)))
    else:
        users = max(1, int(load))
    per = spec.base.num_requests or 2000
    cfg = dataclasses.replace(cfg, num_requests=max(per, 10 * users))
    closed = runner(run_loop, [LoopTask(cfg, "closed", users, users)])[0]
    if closed.error or closed.throughput_rps <= 0:
        return [closed]
    matched = runner(run_loop, [LoopTask(cfg, "open", closed.throughput_rps, users)])[0]
    return [closed, matched]


def make_runner(ex: Executor) -> Runner:
    """A Runner over an open sim.backends.Executor."""
    def runner(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        return ex.map(fn, items)
    return runner
