"""What the capacity report (sim/app/reports/plan_page.py) says about a trace's own arrival
timing against re-timing: the answer line that gives the plan's answer under the timing
the plan did not use (sim/app/runs/plan.py OtherTiming), where the two differ naming the
trace's swings in rate as the cause; the table of both timings' cluster checks; the
paragraph that describes the trace's timing; and their plan.json record.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from sim.app.reports.fleet_text import cluster_text, replicas_text
from sim.app.runs.load_search import PEAK_BINS
from sim.app.runs.plan import MAX_UP, ClusterCheck, OtherTiming, PlanResult
from sim.app.runs.plan_spec import PlanSpec


def label(spec: PlanSpec, arrival: str) -> str:
    """The name of a timing: "Poisson re-timing" (gamma with the base's burstiness) or
    "the trace's own timing"."""
    if arrival == "trace":
        return "the trace's own timing"
    k = spec.base.burstiness
    return "Poisson re-timing" if k is None else f"gamma re-timing (burstiness {k:g})"


def replay_text(spec: PlanSpec) -> str:
    """What a trace-timed probe replays."""
    t, window = spec.trace, spec.base.window
    assert t is not None
    part = f"its first {window:g} s" if window else "the whole trace"
    return (f"{part} ({t.num_requests:,} requests) per probe, in order, its own arrival "
            "times time-scaled to each probed rate (one seed: nothing is drawn at random)")


def cause(spec: PlanSpec, load_rps: float) -> str:
    """Why the two timings differ, in the trace's figures: re-timing keeps its requests
    and replaces its arrival times, so what differs is the timing (PlanSpec.trace)."""
    t = spec.trace
    assert t is not None
    return ("re-timing keeps the trace's requests but not its timing: its busiest tenth "
            f"arrives at {t.peak_ratio:.2f}x its mean rate "
            f"({t.peak_ratio * load_rps:,.3g} req/s when sped up to {load_rps:,.3g}), and "
            f"its gaps have CV {t.gap_cv:.2f} (Poisson: 1)")


def _worst_ttft(check: ClusterCheck) -> str:
    v = max((p.p_ttft_s or 0.0) for p in check.probes)
    return f"{v:,.3f} s"


def lines(res: PlanResult) -> list[str]:
    """The answer's line on the other timing (none when the plan checked none): whether
    it agrees, else what it says and why."""
    o, spec = res.other, res.spec
    if o is None or res.best is None:
        return []
    name, p = label(spec, o.arrival), spec.slo.percentile
    head = name[0].upper() + name[1:]
    hint = (" Plan with `--arrival trace` to size for the trace as it arrives."
            if o.arrival == "trace" else "")
    first, best = o.checks[0], res.best
    if spec.target is None:
        verdict = "meets" if first.passes else "misses"
        one = "one replica" if best.pools is None else replicas_text(1, best)
        line = (f"**{head}**: {one} at {o.load:,.3g} req/s {verdict} the SLOs under "
                f"it (worst p{p:g} TTFT {_worst_ttft(first)})")
        return [line + ("" if first.passes else f"; {cause(spec, o.load)}.{hint}")]
    r, n, gpus = res.replicas, o.replicas, res.best.gpus_per_replica
    assert r is not None
    if n == r:
        below = [k for k in o.checks if k.replicas == r - 1]
        return [f"**{head} agrees: {replicas_text(r, best)}** meet{'s' if r == 1 else ''} the SLOs "
                f"at {o.load:,.4g} req/s "
                f"under it too (worst p{p:g} TTFT {_worst_ttft(first)})"
                + (f" and {r - 1} {'does' if r - 1 == 1 else 'do'} not" if below else "")]
    most = max(k.replicas for k in o.checks)
    says = (f"{replicas_text(n, best)} ({n * gpus} GPU{'s' if n * gpus > 1 else ''})"
            if n is not None else f"more than {replicas_text(most, best)}")
    # The check that shows the difference: the smaller cluster, which only one passes.
    k = next(c for c in o.checks if c.replicas == (r if n is None else min(n, r)))
    verdict = "meets" if k.passes else "misses"
    return [f"**{head} says {says}, not {r}**: at {o.load:,.4g} req/s the "
            f"{cluster_text(k.replicas, best)} {verdict} the SLOs under it (worst p{p:g} TTFT "
            f"{_worst_ttft(k)}); {cause(spec, o.load)}.{hint}"]


def title(res: PlanResult) -> str:
    """The section's heading."""
    return "The trace's own timing against " + label(res.spec, "poisson")


def method(res: PlanResult) -> list[str]:
    """The method's line on arrival timing, for a rate plan over a trace."""
    spec = res.spec
    if spec.trace is None:
        return []
    other = "poisson" if spec.arrival == "trace" else "trace"
    return [f"Arrival timing: the probes and checks use {label(spec, spec.arrival)} "
            f"(`--arrival {spec.arrival}`). The chosen config's answer is then checked "
            f"under {label(spec, other)}: from the plan's replicas, one more while the "
            f"cluster fails (up to {MAX_UP} more), else one fewer and then bisection down "
            "to the smallest that passes; without a target, one replica at its median "
            "sustainable rate."]


def text(res: PlanResult) -> str:
    """The section's paragraph: the trace's timing and what each timing replays."""
    spec, t = res.spec, res.spec.trace
    assert t is not None
    window = f"its first {spec.base.window:g} s, " if spec.base.window else ""
    n = spec.base.num_requests or 2000
    pick = "drawn at random from" if spec.base.trace_sample is not False else "the first of"
    return (f"The trace ({window}{t.num_requests:,} requests over {t.span_s:,.0f} s, mean "
            f"{t.mean_rate_rps:,.3g} req/s): gaps CV {t.gap_cv:.2f} (Poisson: 1); busiest "
            f"of {PEAK_BINS} equal slices at {t.peak_ratio:.2f}x the mean rate. The trace's "
            "own timing replays every request in order, its arrival times divided by "
            "(rate / mean rate), on one seed (nothing is drawn at random); "
            f"{label(spec, 'poisson')} gives {n:,} requests per replica, {pick} the "
            "trace, new arrival times at the rate, on every seed. Both run the chosen "
            f"config behind the {spec.router} router.")


def frame(res: PlanResult) -> pd.DataFrame:
    """One row per cluster check of the chosen config under each timing (worst seed)."""
    o, spec = res.other, res.spec
    if o is None or res.best is None:
        return pd.DataFrame()
    mine = sorted([*res.checks.get(res.best.index, []), *o.own], key=lambda k: -k.replicas)
    rows = [_row(spec, spec.arrival, k, spec.target or o.load) for k in mine]
    rows += [_row(spec, o.arrival, k, o.load) for k in o.checks]
    return pd.DataFrame(rows)


def _row(spec: PlanSpec, arrival: str, k: ClusterCheck, load: float) -> dict[str, Any]:
    return {"timing": label(spec, arrival), "replicas": k.replicas,
            "load (req/s)": load, "seeds": len(k.probes),
            "TTFT attainment (worst seed)": min(p.ttft_attainment for p in k.probes),
            "p TTFT (s, worst seed)": max((p.p_ttft_s or 0.0) for p in k.probes),
            "p TPOT (ms, worst seed)": 1e3 * max((p.p_tpot_s or 0.0) for p in k.probes),
            "saturated seeds": sum(p.saturated for p in k.probes),
            "meets SLOs (all seeds)": k.passes}


def checks_record(checks: list[ClusterCheck]) -> list[dict[str, Any]]:
    """plan.json's record of cluster checks, each with its verdict."""
    return [{"replicas": k.replicas, "passes": k.passes, "probes": k.probes} for k in checks]


def record(o: OtherTiming | None) -> dict[str, Any] | None:
    """plan.json's ``other_timing``: the other timing's checks."""
    if o is None:
        return None
    return {"arrival": o.arrival, "load": o.load, "replicas": o.replicas,
            "checks": checks_record(o.checks)}
