"""What ``servesim plan`` plans (sim/app/runs/plan.py runs it): the PlanSpec (the base
run, the SLO, the config grid, the search settings, the target and the arrival timing,
checked once) and the grid's candidate configs (ConfigResult: a config's knobs, its
searches, and what one replica of it is: an engine of TP GPUs, or one xPyD unit of
disaggregated pools, scaled to a cluster in whole units)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.app.runs.axes import AGGREGATED, PLAN_AXES
from sim.app.runs.load_search import SLO, SearchResult, TraceTiming, trace_timing
from sim.app.runs.pools import MAX_POOL_REPLICAS, parse_disagg
from sim.app.runs.runner import MAX_REPLICAS, RunConfig, prepare
from sim.app.runs.startup_checks import Refused
from sim.app.runs.sweep import Grid, cell_config, driver_inputs

ARRIVALS = ("poisson", "trace")
"""How a rate probe reaches its load: poisson re-times the requests (gamma with the base's
burstiness); trace time-scales the trace's own arrivals."""


@dataclass
class ConfigResult:
    """One engine config of the grid: its knobs, searches and the derived capacity;
    ``prefix_cache``, the cache its engines run with as prepared (vLLM's default where
    the config names none)."""

    index: int
    knobs: dict[str, Any]
    config: RunConfig
    searches: list[SearchResult] = field(default_factory=list)
    error: str = ""
    prefix_cache: str = "none"

    @property
    def tp(self) -> int:
        return self.config.tensor_parallel_size

    @property
    def pools(self) -> tuple[int, int] | None:
        """(prefill, decode) engines of one unit of a disaggregated config (its xPyD);
        None for aggregated serving."""
        return parse_disagg(self.config.disagg) if self.config.disagg is not None else None

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one replica: TP, or (x + y) x TP for one xPyD unit (the plan scales a
        disaggregated config in whole units: scaled)."""
        return self.config.num_gpus

    def scaled(self, replicas: int) -> RunConfig:
        """The config at ``replicas`` replicas: that many engines, or that many xPyD
        units as one disaggregated system of (replicas x x) prefill and (replicas x y)
        decode engines."""
        if self.pools is None:
            return dataclasses.replace(self.config, replicas=replicas)
        x, y = self.pools
        return dataclasses.replace(self.config, disagg=f"{replicas * x}P{replicas * y}D")

    def max_replicas(self) -> int:
        """The most replicas (units) a cluster check may simulate."""
        if self.pools is None:
            return MAX_REPLICAS
        return MAX_POOL_REPLICAS // max(self.pools)

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
class PlanSpec:
    """What to plan: the base run (workload, model, GPU), the SLO, the config grid, the
    seeds and search settings, the optional target, and the arrival timing (ARRIVALS).
    ``trace``, derived at construction for a rate plan over a trace, is the trace's own
    timing (read once: FileNotFoundError for a missing file; None for a trace whose
    arrivals cannot be time-scaled, which arrival "trace" refuses)."""

    base: RunConfig
    slo: SLO
    grid: Grid
    load_axis: str = "rate"
    target: float | None = None
    start: float = 1.0
    tolerance: float = 0.02
    max_probes: int = 16
    router: str = "round-robin"
    check_requests: int | None = None
    arrival: str = "poisson"
    trace: TraceTiming | None = field(default=None, init=False)

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
        pools = [v for v in self.grid.axes.get("disagg", ()) if v != AGGREGATED]
        if self.load_axis == "concurrency" and (pools or self.base.disagg is not None):
            raise ValueError("--disagg takes open-loop arrivals: plan it with --load rate")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got "
                             f"{self.arrival!r}")
        if self.arrival == "trace" and self.base.trace is None:
            raise ValueError("--arrival trace time-scales a trace's own arrivals: give --trace")
        if self.arrival == "trace" and self.load_axis != "rate":
            raise ValueError("--arrival trace times open-loop arrivals; with --load "
                             "concurrency each user sends when its previous request ends")
        if self.base.trace is not None and self.load_axis == "rate":
            self.trace = trace_timing(self.base)
        if self.arrival == "trace" and self.trace is None:
            raise ValueError(f"--arrival trace time-scales the trace's own arrivals, and "
                             f"{self.base.trace} has fewer than two at different times"
                             + (" in its --window" if self.base.window else ""))

    def seeds(self, arrival: str) -> tuple[int, ...]:
        """The seeds probes under ``arrival`` run on: a trace-timed probe draws nothing at
        random, so the first seed stands for all."""
        return self.grid.seeds[:1] if arrival == "trace" else self.grid.seeds

    def trace_rate(self, arrival: str) -> float | None:
        """The trace's mean rate (req/s) that trace-timed probes scale; None when
        re-timed."""
        return self.trace.mean_rate_rps if arrival == "trace" and self.trace else None


def candidates(spec: PlanSpec) -> list[ConfigResult]:
    """The grid's configs, each prepared once (one request) before any search: one that
    cannot be built or run carries its error and is not searched; one vLLM refuses at
    start-up (startup_checks.Refused) is skipped, and its note says why; so is a config
    an earlier cell already is (an aggregated cell of a pool axis: the pool options
    apply to xPyD cells only). Their files are absolute paths as this process finds them
    (sweep.driver_inputs), whatever directory a worker runs in."""
    configs: list[ConfigResult] = []
    built: list[ConfigResult] = []  # the cells whose config was built, to compare with
    base = driver_inputs(spec.base, "local")[0]
    for i, knobs in enumerate(spec.grid.cells()):
        try:
            c = ConfigResult(i, knobs, cell_config(base, knobs))
        except ValueError as e:  # knobs that make no config (static with a budget)
            configs.append(ConfigResult(i, knobs, base, error=str(e)))
            continue
        same = next((k for k in built if k.config == c.config), None)
        built.append(c)
        if same is not None:
            c.error = ("skipped: the same engine config as "
                       + ", ".join(f"{k}={v}" for k, v in same.knobs.items()))
            configs.append(c)
            continue
        try:
            prep = prepare(dataclasses.replace(c.config, num_requests=1))
            # a disaggregated run's pools have no prefix cache (sim/app/runs/pools.py)
            c.prefix_cache = "none" if c.pools else prep.scheduler.prefix_cache
        except Refused as e:
            c.error = f"skipped: vLLM refuses it at start-up: {e}"
        except (ValueError, FileNotFoundError) as e:
            c.error = str(e)
        configs.append(c)
    return configs


