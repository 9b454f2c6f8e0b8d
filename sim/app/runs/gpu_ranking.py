"""``servesim plan --gpu a,b,c``: one plan per GPU type (sim/app/runs/plan.py, each with
its own config grid and searches), ranked by what the fleet costs at the target.

Owns the ranking and its figures per GPU type: replicas, TP, GPUs = replicas x TP,
$/hour = GPUs x the GPU's price (sim/app/runs/prices.py), $/M output tokens = $/hour /
(target req/s x mean output tokens per request x 3600 / 1e6), the headroom (the
replicas' capacity at the median sustainable rate over the target, minus one) and which
SLO binds (what failed at the lowest infeasible load of the chosen config's searches).
The tensor parallelism a GPU needs, when the grid gives none, is the smallest power of
two at which the model fits (smallest_tensor_parallel). Reports:
sim/app/reports/gpu_ranking_page.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.app.runs.load_search import Probe, with_load
from sim.app.runs.plan import PlanResult
from sim.app.runs.plan_spec import PlanSpec
from sim.app.runs.prices import GpuPrice
from sim.app.runs.runner import RunConfig, check_config, prepare
from sim.app.runs.startup_checks import Refused
from sim.app.runs.sweep import cell_config

TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
"""The tensor parallel sizes tried, smallest first, for a GPU the model does not fit
at TP 1 (one HGX node's 8 GPUs at most)."""


def smallest_tensor_parallel(cfg: RunConfig) -> int:
    """The smallest of TENSOR_PARALLEL_SIZES at which ``cfg``'s engine can start (the
    weights fit per GPU and vLLM accepts the sharding: runner.check_config); 1 when none
    can, so that the plan reports why."""
    for tp in TENSOR_PARALLEL_SIZES:
        try:
            check_config(dataclasses.replace(cfg, tensor_parallel_size=tp), workload=False)
        except (ValueError, FileNotFoundError, Refused):
            continue
        return tp
    return 1


def grid_tensor_parallel(base: RunConfig, cells: list[dict[str, Any]]) -> int:
    """The smallest TP at which every cell (axis values applied to ``base``) of a plan's
    grid can start: smallest_tensor_parallel of its most restrictive cell (a lower
    --gpu-memory-utilization, say, leaves less room for the weights per GPU)."""
    return max(smallest_tensor_parallel(cell_config(base, cell))
               for cell in cells or [{}])


def mean_output_tokens(spec: PlanSpec, res: PlanResult) -> float | None:
    """Mean output tokens per request (min(output_len, max_tokens)) of the workload the
    chosen config's first probe ran; None without a chosen config."""
    if res.best is None:
        return None
    cfg = with_load(res.best.config, spec.load_axis, spec.start, spec.grid.seeds[0],
                    spec.trace_rate(spec.arrival))
    w = prepare(cfg).workload
    return float(np.mean(np.minimum(w.output_len, w.max_tokens)))


def binding_slo(res: PlanResult) -> str:
    """Which objective failed at the lowest infeasible load of each of the chosen config's
    searches, the most common over seeds: TTFT, TPOT, "TTFT and TPOT", "saturation"
    (the run was saturated while both objectives held), or "-" when no search reached
    an infeasible load."""
    if res.best is None:
        return "-"
    need = res.spec.slo.percentile / 100.0 - 1e-12
    verdicts: list[str] = []
    for s in res.best.searches:
        failed = [p for p in s.probes if s.upper is not None and p.load == s.upper]
        if failed:
            verdicts.append(_failure(failed[0], need))
    return Counter(verdicts).most_common(1)[0][0] if verdicts else "-"


def _failure(p: Probe, need: float) -> str:
    if p.error:
        return "error"
    missed = [n for n, a in (("TTFT", p.ttft_attainment), ("TPOT", p.tpot_attainment))
              if a < need]
    return " and ".join(missed) if missed else "saturation"


@dataclass
class GpuPlan:
    """One GPU type's plan and its cost: ``price`` None when no price is known;
    ``output_tokens_per_request`` the probed workload's mean (None without an answer);
    ``error`` why the GPU could not be planned at all."""

    gpu: str
    result: PlanResult | None
    price: GpuPrice | None
    output_tokens_per_request: float | None = None
    error: str = ""

    @property
    def replicas(self) -> int | None:
        return self.result.replicas if self.result else None

    @property
    def tp(self) -> int | None:
        return self.result.best.tp if self.result and self.result.best else None

    @property
    def gpus(self) -> int | None:
        """The fleet's GPUs: replicas x GPUs per replica (TP, or (x + y) x TP a unit)."""
        best = self.result.best if self.result else None
        r = self.replicas
        return r * best.gpus_per_replica if r is not None and best is not None else None

    @property
    def usd_per_hour(self) -> float | None:
        n = self.gpus
        return n * self.price.usd_per_gpu_hour if n is not None and self.price else None

    @property
    def usd_per_million_output_tokens(self) -> float | None:
        """$/hour over the output tokens an hour at the target rate, in millions."""
        usd, tokens = self.usd_per_hour, self.output_tokens_per_request
        target = self.result.spec.target if self.result else None
        if usd is None or not tokens or target is None or self.result is None \
                or self.result.spec.load_axis != "rate":
            return None
        return usd / (target * tokens * 3600 / 1e6)

    @property
    def headroom(self) -> float | None:
        """replicas x the median sustainable load per replica / target - 1."""
        res = self.result
        if res is None or res.best is None or res.replicas is None or not res.spec.target:
            return None
        med = res.best.interval(res.spec.load_axis)[0]
        return res.replicas * med / res.spec.target - 1

    @property
    def binding_slo(self) -> str:
        return binding_slo(self.result) if self.result else "-"


def rank_key(p: GpuPlan) -> tuple[bool, bool, float, float, str]:
    """Confirmed answers first, priced before unpriced, then $/hour, GPUs, name."""
    usd, gpus = p.usd_per_hour, p.gpus
    return (gpus is None, usd is None, usd if usd is not None else math.inf,
            gpus if gpus is not None else math.inf, p.gpu)


@dataclass
class GpuRanking:
    """Every GPU type's plan, cheapest first (rank_key), and the prices used."""

    plans: list[GpuPlan]
    prices: dict[str, GpuPrice] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def chosen(self) -> GpuPlan | None:
        """The cheapest GPU type with a confirmed answer (None when none has one)."""
        return self.plans[0] if self.plans and self.plans[0].gpus is not None else None


def ranked(plans: list[GpuPlan], prices: dict[str, GpuPrice],
           elapsed_s: float = 0.0) -> GpuRanking:
    """The ranking of ``plans`` (rank_key)."""
    return GpuRanking(sorted(plans, key=rank_key), prices, elapsed_s)
