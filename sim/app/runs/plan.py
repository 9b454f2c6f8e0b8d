"""``servesim plan``: how much traffic one replica sustains within the SLOs, which engine
config does it best, and how many replicas (GPUs = replicas x TP) a target load needs.

Owns the plan: the config grid's searches, the choice of config, the cluster confirmation
and the evidence runs (burstiness, open vs closed loop). The probe and the search over
load for one (config, seed) are sim/app/runs/load_search.py; reports are written by
sim/app/reports/plan_page.py. Method (docs/capacity.md):

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

from sim.app.runs.axes import PLAN_AXES
from sim.app.runs.load_search import (
    SLO,
    Probe,
    ProbeTask,
    SearchResult,
    SearchTask,
    run_probe,
    search,
    with_load,
)
from sim.app.runs.runner import MAX_REPLICAS, RunConfig, prepare, simulate_prepared
from sim.app.runs.startup_checks import Refused
from sim.app.runs.sweep import Grid
from sim.engine import SchedulerStuck

BURSTINESS_LEVELS = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Gamma shapes of the burstiness evidence (CV = 1/sqrt(k); 1 = Poisson)."""

MAX_DOWN, MAX_UP = 2, 4


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
    (sim.app.runs.backends.map_ordered with the CLI's workers and backend)."""
    configs = candidates(spec)
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


def candidates(spec: PlanSpec) -> list[ConfigResult]:
    """The grid's configs, each prepared once (one request) before any search: one that
    cannot be built or run carries its error and is not searched; one vLLM refuses at
    start-up (startup_checks.Refused) is skipped, and its note says why."""
    configs = []
    for i, knobs in enumerate(spec.grid.cells()):
        try:
            c = ConfigResult(i, knobs, dataclasses.replace(spec.base, **knobs))
        except ValueError as e:  # knobs that make no config (static with a budget)
            configs.append(ConfigResult(i, knobs, spec.base, error=str(e)))
            continue
        try:
            prepare(dataclasses.replace(c.config, num_requests=1))
        except Refused as e:
            c.error = f"skipped: vLLM refuses it at start-up: {e}"
        except (ValueError, FileNotFoundError) as e:
            c.error = str(e)
        configs.append(c)
    return configs


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
    if r + MAX_UP > MAX_REPLICAS:  # too large a cluster to simulate: left unconfirmed
        return None, []
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
