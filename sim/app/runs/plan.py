"""``servesim plan``: how much traffic one replica sustains within the SLOs, which engine
config does it best, and how many replicas (GPUs = replicas x TP) a target load needs.

Owns the plan: the config grid's searches, the choice of config, the cluster confirmation
and the evidence runs (burstiness, open vs closed loop). What is planned (PlanSpec) and
the candidate configs are sim/app/runs/plan_spec.py; the probe and the search over load
for one (config, seed) are sim/app/runs/load_search.py; reports are written by
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
  it fails, else bisection down to the smallest cluster that passes. A disaggregated
  config's replica is one xPyD unit; n units are one system of nx prefill and ny decode
  engines.
- With ``arrival="trace"`` a probe replays the whole trace (or its window) in order, its
  own arrivals time-scaled to the probed rate, on the first seed only (nothing is drawn
  at random). Re-timing smooths a trace's swings in rate, so a trace plan also checks its
  answer under the other timing (OtherTiming) and the report shows both.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from sim.app.runs.load_search import (
    Probe,
    ProbeTask,
    SearchTask,
    run_probe,
    search_all,
    with_load,
)
from sim.app.runs.loop_comparison import LoopRun, Runner, loop_comparison
from sim.app.runs.plan_spec import ConfigResult, PlanSpec, candidates

BURSTINESS_LEVELS = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Gamma shapes of the burstiness evidence (CV = 1/sqrt(k); 1 = Poisson)."""

MAX_UP = 4
"""The most replicas a cluster search adds to its first size while the cluster fails."""

@dataclass
class ClusterCheck:
    """A cluster of ``replicas`` at the target on every seed; passes when all do."""

    replicas: int
    probes: list[Probe]

    @property
    def passes(self) -> bool:
        return all(p.feasible for p in self.probes)


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
    other: OtherTiming | None = None
    elapsed_s: float = 0.0


def run_plan(spec: PlanSpec, runner: Runner, parallelism: int = 1) -> PlanResult:
    """The whole plan. ``runner(fn, items)`` maps fn over items in parallel, in order
    (sim.app.runs.backends.Executor.map with the CLI's workers and backend), on
    ``parallelism`` workers: the searches probe several loads at once to fill them
    (load_search.search_all; the same answer at any parallelism)."""
    configs = candidates(spec)
    tasks = [SearchTask(c.index, c.config, s, spec.slo, spec.load_axis, spec.start,
                        spec.tolerance, spec.max_probes, spec.trace_rate(spec.arrival))
             for c in configs if not c.error for s in spec.seeds(spec.arrival)]
    for res in search_all(tasks, runner, parallelism):
        configs[res.config_index].searches.append(res)
        if res.error and not configs[res.config_index].error:
            configs[res.config_index].error = res.error
    best, checks, replicas = choose(spec, configs, runner)
    if best is None:
        return PlanResult(spec, configs, None, checks, None, 0.0, [], [])
    load = operating_load(spec, best, replicas)
    other = other_timing(spec, best, replicas, checks.get(best.index, []), runner)
    bursts = burstiness_evidence(spec, best, load, runner)
    first = dataclasses.replace(best.config, seed=spec.grid.seeds[0])
    # Disaggregated runs take open-loop arrivals only (sim/app/runs/pools.py).
    loops = (loop_comparison(first, spec.load_axis, load, spec.base.num_requests or 2000,
                             runner) if best.pools is None else [])
    return PlanResult(spec, configs, best, checks, replicas, load, bursts, loops, other)


def gpus_estimate(spec: PlanSpec, c: ConfigResult) -> float:
    """GPUs for the target from the median rate (inf when it sustains nothing)."""
    med = c.interval(spec.load_axis)[0]
    gpus = c.gpus_per_replica
    if spec.target is None:
        return gpus / med if med > 0 else math.inf  # GPUs per req/s
    return math.ceil(spec.target / med) * gpus if med > 0 else math.inf


def choose(spec: PlanSpec, configs: list[ConfigResult],
           runner: Runner) -> tuple[ConfigResult | None, dict[int, list[ClusterCheck]],
                                    int | None]:
    """The best config: fewest GPUs for the target, confirmed by cluster checks of the
    three best estimates (and, in a grid of aggregated and disaggregated configs, each
    kind's best estimate, so that the report compares two confirmed fleets); without a
    target, the highest median rate per GPU."""
    ok = [c for c in configs if not c.error and c.interval(spec.load_axis)[0] > 0]
    ok.sort(key=lambda c: (gpus_estimate(spec, c),
                           -c.interval(spec.load_axis)[0] / c.gpus_per_replica, c.index))
    checks: dict[int, list[ClusterCheck]] = {}
    if not ok or spec.target is None:
        return (ok[0] if ok else None), checks, None
    # The three best estimates, each confirmed: the cluster search may confirm far below
    # an estimate (a router smooths each replica's arrivals), so none bounds the others;
    # and each kind's best estimate (aggregated, disaggregated), when not among them.
    kind_best: dict[bool, ConfigResult] = {}
    for c in ok:
        kind_best.setdefault(c.pools is None, c)
    picked = ok[:3] + [c for c in kind_best.values() if all(c is not d for d in ok[:3])]
    best: ConfigResult | None = None
    best_gpus = math.inf
    for c in picked:
        n, checks[c.index] = confirm_replicas(spec, c, runner)
        if n is not None and n * c.gpus_per_replica < best_gpus:
            best, best_gpus = c, n * c.gpus_per_replica
    if best is None:
        return ok[0], checks, None
    return best, checks, int(best_gpus // best.gpus_per_replica)


def confirm_replicas(spec: PlanSpec, c: ConfigResult,
                     runner: Runner) -> tuple[int | None, list[ClusterCheck]]:
    """Smallest cluster of config ``c`` that meets the SLOs at the target on every seed:
    smallest_cluster from ceil(target / median), below it too. The router smooths each
    replica's arrivals (round robin hands each of n replicas every n-th, far more regular
    than Poisson), so a cluster may carry more than n times one replica's Poisson-probed
    capacity. None (no check) for a cluster too large to simulate."""
    assert spec.target is not None
    r = max(1, math.ceil(spec.target / c.interval(spec.load_axis)[0]))
    if r + MAX_UP > c.max_replicas():  # too large a cluster to simulate: left unconfirmed
        return None, []
    return smallest_cluster(spec, c, r, spec.arrival, runner)


def cluster_check(spec: PlanSpec, c: ConfigResult, replicas: int, runner: Runner,
                  arrival: str, load: float | None = None) -> ClusterCheck:
    """Simulate ``replicas`` replicas of config ``c`` behind the router at ``load``
    (default: the target) under ``arrival``, on its seeds (PlanSpec.seeds)."""
    load = spec.target if load is None else load
    assert load is not None
    # Each replica sees about as many requests as a single-replica probe did; a
    # trace-timed check replays the whole trace (with_load).
    n = spec.check_requests or (spec.base.num_requests or 2000) * replicas
    cfg = dataclasses.replace(c.scaled(replicas), router=spec.router, num_requests=n)
    load = math.ceil(load) if spec.load_axis == "concurrency" else load
    rate = spec.trace_rate(arrival)
    tasks = [ProbeTask(with_load(cfg, spec.load_axis, load, s, rate), spec.slo,
                       spec.load_axis, load) for s in spec.seeds(arrival)]
    return ClusterCheck(replicas, list(runner(run_probe, tasks)))


@dataclass
class OtherTiming:
    """The plan's answer checked under the other arrival timing (re-timing for a
    trace-timed plan, the trace's own timing for a re-timed one) at ``load`` req/s (the
    target, or one replica's median sustainable rate without one): ``checks`` searched
    from the plan's replicas (smallest_cluster) and ``replicas``, the smallest that passed
    (None when none did, or without a target: then one check of one replica); ``own``,
    the plan's timing checked at that answer where the plan had not, so that the report
    shows both timings at both sizes."""

    arrival: str
    load: float
    checks: list[ClusterCheck]
    replicas: int | None
    own: list[ClusterCheck] = field(default_factory=list)


def other_timing(spec: PlanSpec, best: ConfigResult, replicas: int | None,
                 checked: list[ClusterCheck], runner: Runner) -> OtherTiming | None:
    """The chosen config's answer under the timing the plan did not use, for a rate
    plan over a trace (None otherwise, and when the target was not confirmed);
    ``checked`` are the plan's own checks of ``best``."""
    if spec.trace is None:
        return None
    other = "poisson" if spec.arrival == "trace" else "trace"
    if spec.target is None:
        load = best.interval(spec.load_axis)[0]
        return OtherTiming(other, load, [cluster_check(spec, best, 1, runner, other, load)],
                           None)
    if replicas is None:
        return None
    n, checks = smallest_cluster(spec, best, replicas, other, runner)
    own = ([cluster_check(spec, best, n, runner, spec.arrival)]
           if n is not None and n not in {k.replicas for k in checked} else [])
    return OtherTiming(other, spec.target, checks, n, own)


def smallest_cluster(spec: PlanSpec, c: ConfigResult, r: int, arrival: str,
                     runner: Runner) -> tuple[int | None, list[ClusterCheck]]:
    """Smallest cluster of config ``c`` that meets the SLOs at the target under
    ``arrival``, from ``r`` replicas: up one at a time while it fails (at most MAX_UP;
    None when none passed), else r - 1 and then bisection down to 1 (more replicas never
    serve worse, so the sizes that pass are those from some n up)."""
    checks = [cluster_check(spec, c, r, runner, arrival)]
    if not checks[0].passes:
        for n in range(r + 1, min(r + MAX_UP, c.max_replicas()) + 1):
            checks.append(cluster_check(spec, c, n, runner, arrival))
            if checks[-1].passes:
                return n, checks
        return None, checks
    fails, passes, trial = 0, r, r - 1  # 0 replicas serve nothing
    while passes - fails > 1:
        checks.append(cluster_check(spec, c, trial, runner, arrival))
        fails, passes = (fails, trial) if checks[-1].passes else (trial, passes)
        trial = (fails + passes) // 2
    return passes, checks


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
