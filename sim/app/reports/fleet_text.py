"""How a plan writes a fleet: replicas of an engine, or whole units of a disaggregated
xPyD config (plan_spec.ConfigResult.scaled), their GPUs, and the answer's line that
compares the smallest aggregated and disaggregated fleets the plan confirmed
(plan.choose confirms each kind's best estimate). Text only; the pages are
sim/app/reports/plan_page.py and trace_timing.py."""

from __future__ import annotations

from sim.app.runs.plan import PlanResult
from sim.app.runs.plan_spec import ConfigResult
from sim.app.runs.pools import POOLS, pool_devices_text, pool_value


def knobs_text(c: ConfigResult) -> str:
    """A config's knobs as "max_num_seqs=8, ..." ("the base config" without any)."""
    return ", ".join(f"{k}={v}" for k, v in c.knobs.items()) or "the base config"


def replica_noun(c: ConfigResult) -> str:
    """What one replica of ``c`` is: "replica", or "1P2D unit" for a disaggregated one."""
    return "replica" if c.pools is None else f"{c.config.disagg} unit"


def devices_text(c: ConfigResult) -> str:
    """A replica's TP: "TP 2", or for pools of their own TP or GPU "prefill TP 2,
    decode TP 1 on h200-sxm"."""
    if c.pools is None:
        return f"TP {c.tp}"
    return pool_devices_text(tuple((pool_value(c.config, p, "tensor_parallel_size"),
                                    getattr(c.config, f"{p}_gpu")) for p in POOLS))


def fleet_text(c: ConfigResult, r: int) -> str:
    """``r`` replicas of ``c`` and their GPUs: "3 replicas x TP 1 = 3 GPUs", or
    "2 x 1P2D = 2P4D x TP 1 = 6 GPUs", or with pools of their own TP "2 x 1P1D = 2P2D
    (prefill TP 2, decode TP 1) = 6 GPUs"."""
    gpus = r * c.gpus_per_replica
    n = f"{gpus} GPU{'s' if gpus > 1 else ''}"
    if c.pools is None:
        return f"{r} replica{'s' if r > 1 else ''} x TP {c.tp} = {n}"
    x, y = c.pools
    devices = devices_text(c)
    each = f" x {devices}" if devices.startswith("TP") else f" ({devices})"
    return f"{r} x {c.config.disagg} = {r * x}P{r * y}D{each} = {n}"


def replicas_text(n: int, best: ConfigResult | None = None) -> str:
    """``n`` replicas, or for a disaggregated config ``n`` xPyD units and their system
    (plan.ConfigResult.scaled): "2 units of 3P1D = 6P2D"."""
    if best is None or best.pools is None:
        return f"{n} replica{'s' if n > 1 else ''}"
    return f"{n} unit{'s' if n > 1 else ''} of {best.config.disagg} = {best.scaled(n).disagg}"


def cluster_text(n: int, best: ConfigResult) -> str:
    """"3-replica cluster", or for a disaggregated config "6P2D system"."""
    return f"{n}-replica cluster" if best.pools is None else f"{best.scaled(n).disagg} system"


def kinds_lines(res: PlanResult) -> list[str]:
    """Aggregated against disaggregated serving, where the grid held both: each kind's
    smallest confirmed fleet (plan.choose confirms each kind's best estimate)."""
    fleets: dict[bool, tuple[int, ConfigResult, int]] = {}
    for c in res.configs:
        passing = [k.replicas for k in res.checks.get(c.index, []) if k.passes]
        if c.error or not passing:
            continue
        r = min(passing)
        gpus = r * c.gpus_per_replica
        aggregated = c.pools is None
        if aggregated not in fleets or gpus < fleets[aggregated][0]:
            fleets[aggregated] = (gpus, c, r)
    kinds = {c.pools is None for c in res.configs if not c.error}
    if len(kinds) < 2:
        return []
    if len(fleets) < 2:
        which = "aggregated" if True in fleets else "disaggregated"
        return [f"**Aggregated or disaggregated**: only {which} serving met the SLOs at the "
                "target in the cluster sizes checked"] if fleets else []
    (ga, ca, ra), (gd, cd, rd) = fleets[True], fleets[False]
    verdict = ("the same GPUs" if ga == gd else
               f"disaggregated saves {ga - gd} GPU{'s' if ga - gd > 1 else ''}" if gd < ga
               else f"aggregated saves {gd - ga} GPU{'s' if gd - ga > 1 else ''}")
    cache = (f"; the aggregated fleet with vLLM's {ca.prefix_cache} prefix cache, which "
             "disaggregated runs do not model yet" if ca.prefix_cache != "none" else "")
    return [f"**Aggregated or disaggregated: {verdict}**: aggregated {fleet_text(ca, ra)} "
            f"({knobs_text(ca)}); disaggregated {fleet_text(cd, rd)} ({knobs_text(cd)})"
            + cache]
