"""The capacity report of ``servesim plan``: capacity.md and capacity.html (the answer
first, then the evidence), and plan.json (every probe, for a re-analysis).

The evidence: the configs compared, the cluster checks, the answer under the other
arrival timing for a trace (sim/app/reports/trace_timing.py), SLO attainment and p99
latency against the load (every probe of every search), the sensitivity of the chosen
config to burstiness, open- against closed-loop latency at equal throughput, and the method.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from sim.app.reports import by_window_page, trace_timing
from sim.app.reports.deploy_section import deploy_html, deploy_markdown
from sim.app.reports.fleet_text import (
    devices_text,
    fleet_text,
    kinds_lines,
    knobs_text,
    replica_noun,
)
from sim.app.reports.markdown import md_inline, md_table
from sim.app.runs import deploy_config
from sim.app.runs.by_window import LoadOverDay
from sim.app.runs.out_dir import write_files
from sim.app.runs.plan import BURSTINESS_LEVELS, MAX_UP, PlanResult, gpus_estimate
from sim.app.runs.run_config import config_record
from sim.app.runs.runner import MAX_REPLICAS
from sim.saturation import RULE


def _unit(res: PlanResult) -> str:
    return "req/s" if res.spec.load_axis == "rate" else "users"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.1f} ms"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:,.3f} s"


def _workload(res: PlanResult) -> str:
    b = res.spec.base
    what = (f"trace {Path(b.trace).name}" if b.trace else f"scenario {b.scenario or 'default'}")
    if res.spec.arrival == "trace":
        return f"{what}: {trace_timing.replay_text(res.spec)}"
    n = b.num_requests or 2000
    pick = ("drawn at random from the whole trace, per seed" if b.trace_sample is not False
            else "the first")
    timing = ("re-timed by Poisson arrivals" if b.burstiness is None
              else f"re-timed by gamma arrivals (burstiness {b.burstiness:g})")
    if res.spec.load_axis == "concurrency":
        timing = "sent by closed-loop users"
    return f"{what}: {n:,} requests per probe ({pick}), {timing}"


def answer_lines(res: PlanResult) -> list[str]:
    """The answer, one markdown bullet per line (also printed by the CLI); for a trace,
    last, the answer under the timing the plan did not use."""
    return _answer(res) + trace_timing.lines(res)


def _answer(res: PlanResult) -> list[str]:
    spec, best, unit = res.spec, res.best, _unit(res)
    b = spec.base
    lines = [f"**Model / GPU**: {b.model} on {b.gpu} ({b.dtype})",
             f"**Workload**: {_workload(res)}",
             f"**SLO**: {spec.slo.describe()} (at least {spec.slo.percentile:g}% of all "
             "requests must meet each; a saturated run never passes)"]
    if best is None:
        errs = "; ".join(f"{knobs_text(c)}: {c.error}" for c in res.configs if c.error)
        return [*lines, "**No config sustains any load within the SLOs**"
                + (f" ({errs})" if errs else "")]
    med, lo, hi = best.interval(spec.load_axis)
    spread = (f"median over {len(best.searches)} seeds; interval {lo:,.3g}-{hi:,.3g} = "
              "min-max over seeds, each " if len(best.searches) > 1 else "")
    per = (f"**One {replica_noun(best)} sustains {med:,.3g} {unit}** ({spread}found to within "
           f"{spec.tolerance:.0%})")
    if spec.load_axis == "concurrency":
        tm = best.throughput_interval()[0]
        per += f", i.e. {tm:,.3g} req/s"
    g = best.gpus_per_replica
    lines += [per, f"**Config**: {knobs_text(best)}; {devices_text(best)} "
              f"({g} GPU{'s' if g > 1 else ''} per {replica_noun(best)})"]
    if spec.target is None:
        lines.append(f"**Per GPU**: {med / g:,.3g} {unit}; no --target given, so no "
                     "cluster was sized")
        return lines
    est = math.ceil(spec.target / med) if med > 0 else None
    if res.replicas is None:
        tried = len(res.checks.get(best.index, []))
        why = (f"the estimate of {est} replicas and up to {tried} cluster sizes failed the "
               "SLOs; see the cluster checks" if tried else
               f"the estimate of {est} replicas is beyond the {MAX_REPLICAS} replicas one "
               "run simulates, so no cluster was checked")
        lines.append(f"**Target {spec.target:,.4g} {unit}: not confirmed** - {why}")
        return lines
    r = res.replicas
    chk = next(c for c in res.checks[best.index] if c.replicas == r)
    worst_ttft = max((p.p_ttft_s or 0.0) for p in chk.probes)
    worst_tpot = max((p.p_tpot_s or 0.0) for p in chk.probes)
    seeds = f"all {len(chk.probes)} seeds" if len(chk.probes) > 1 else "its one seed"
    cluster = (f"{r}-replica cluster" if best.pools is None
               else f"{best.scaled(r).disagg} system")
    lines.append(
        f"**Target {spec.target:,.4g} {unit}: {fleet_text(best, r)}**, confirmed: the "
        f"{cluster} behind the {spec.router} router at {spec.target:,.4g} {unit} "
        f"meets the SLOs on {seeds} (worst p{spec.slo.percentile:g} "
        f"TTFT {_s(worst_ttft)}, TPOT {_ms(worst_tpot)}; estimate from the median was "
        f"{est})")
    lines += kinds_lines(res)
    others = [c for c in res.configs if c is not best and not c.error
              and c.interval(spec.load_axis)[0] > 0]
    if others:
        lines.append(f"**Cheapest in GPUs** of {len(others) + 1} configs compared (see "
                     "the table)")
    return lines


def configs_frame(res: PlanResult) -> pd.DataFrame:
    """One row per config: capacity interval, per-GPU rate, GPU estimate and check."""
    unit = _unit(res)
    rows = []
    for c in res.configs:
        med, lo, hi = c.interval(res.spec.load_axis)
        checks = res.checks.get(c.index, [])
        passing = [k.replicas for k in checks if k.passes]
        row: dict[str, Any] = {"config": knobs_text(c), "TP": c.tp,
                               f"sustainable {unit} (median)": med, "min": lo, "max": hi,
                               f"{unit} per GPU": med / c.gpus_per_replica}
        if res.spec.target is not None:
            est = gpus_estimate(res.spec, c)
            row["GPUs for target (estimate)"] = None if math.isinf(est) else int(est)
            row["GPUs confirmed"] = min(passing) * c.gpus_per_replica if passing else None
        row["chosen"] = c is res.best
        row["note"] = c.error
        rows.append(row)
    return pd.DataFrame(rows)


def checks_frame(res: PlanResult) -> pd.DataFrame:
    rows = []
    for idx, checks in res.checks.items():
        c = res.configs[idx]
        for k in checks:
            for p in k.probes:
                rows.append({"config": knobs_text(c), "replicas": k.replicas,
                             "GPUs": k.replicas * c.gpus_per_replica, "seed": p.seed,
                             "offered": p.load,
                             "throughput (req/s)": p.throughput_rps,
                             "TTFT attainment": p.ttft_attainment,
                             "TPOT attainment": p.tpot_attainment,
                             "p TTFT (s)": p.p_ttft_s,
                             "p TPOT (ms)": None if p.p_tpot_s is None else 1e3 * p.p_tpot_s,
                             "saturated": p.saturated, "meets SLOs": p.feasible})
    return pd.DataFrame(rows)


def probes_frame(res: PlanResult) -> pd.DataFrame:
    rows = []
    for c in res.configs:
        for s in c.searches:
            for i, p in enumerate(s.probes):
                rows.append({"config": knobs_text(c), "seed": s.seed, "probe": i + 1,
                             "load": p.load, "throughput (req/s)": p.throughput_rps,
                             "TTFT attainment": p.ttft_attainment,
                             "TPOT attainment": p.tpot_attainment, "p TTFT (s)": p.p_ttft_s,
                             "p TPOT (ms)": None if p.p_tpot_s is None else 1e3 * p.p_tpot_s,
                             "saturated": p.saturated, "meets SLOs": p.feasible,
                             "error": p.error})
    return pd.DataFrame(rows)


def burstiness_frame(res: PlanResult) -> pd.DataFrame:
    rows = []
    for k, probes in res.burstiness:
        rows.append({"burstiness k": k, "CV of gaps": 1 / math.sqrt(k),
                     "TTFT attainment (worst seed)": min(p.ttft_attainment for p in probes),
                     "TPOT attainment (worst seed)": min(p.tpot_attainment for p in probes),
                     "p TTFT (s, worst seed)": max((p.p_ttft_s or 0.0) for p in probes),
                     "p TPOT (ms, worst seed)": 1e3 * max((p.p_tpot_s or 0.0) for p in probes),
                     "saturated seeds": sum(p.saturated for p in probes),
                     "meets SLOs (all seeds)": all(p.feasible for p in probes)})
    return pd.DataFrame(rows)


def loops_frame(res: PlanResult) -> pd.DataFrame:
    rows = []
    for r in res.loops:
        load = (f"{int(r.load)} users (closed loop)" if r.kind == "closed"
                else f"Poisson {r.load:.3g} req/s (open loop)")
        rows.append({"load": load, "throughput (req/s)": r.throughput_rps,
                     "TTFT p50 (s)": r.ttft_p50_s, "TTFT p99 (s)": r.ttft_p99_s,
                     "TPOT p50 (s)": r.tpot_p50_s, "TPOT p99 (s)": r.tpot_p99_s,
                     "E2E mean (s)": r.e2e_mean_s, "E2E p99 (s)": r.e2e_p99_s,
                     "queued mean (s)": r.queued_mean_s, "requests measured": r.num_measured,
                     "saturated": r.saturated})
    return pd.DataFrame(rows)


def method_lines(res: PlanResult) -> list[str]:
    spec = res.spec
    n, timed = spec.base.num_requests or 2000, spec.arrival == "trace"
    return [
        f"Each probe simulates {_workload(res)}; a shorter `--window` costs less." if timed
        else f"Each probe simulates {n:,} requests ({_workload(res)}); more requests per "
        "probe narrow the interval and cost time linearly (`--num-requests`).",
        f"A probe meets the SLO when at least {spec.slo.percentile:g}% of all requests meet "
        "each objective (rejected requests miss) and the run is not saturated: "
        f"{RULE}.",
        f"Search per (config, seed): from {spec.start:g} {_unit(res)}, double (or halve) "
        "until feasible and infeasible loads bracket the boundary, then bisect until the "
        f"bracket is within {spec.tolerance:.0%} of its lower end (at most {spec.max_probes} "
        "probes). The seed's value is the highest feasible load found. The report gives "
        "the median over seeds with the min-max interval; "
        + ("the trace's own timing draws nothing at random, so its probes run on the first "
           "seed only." if timed else "seeds change the arrival draws "
           + ("and the requests drawn from the trace." if spec.base.trace
              and spec.base.trace_sample is not False else ".")),
        "Cluster check: replicas start at ceil(target / median), one more while the cluster "
        f"fails on any seed (up to {MAX_UP} more), else bisection down to the smallest "
        "cluster that passes (the router smooths each replica's arrivals, so a cluster may "
        f"carry more than its replicas' probed capacity); the router is {spec.router}; "
        + ("each check replays the probes' requests at the target." if timed else
           "each check simulates "
           f"{spec.check_requests if spec.check_requests else 'num_requests x replicas'}"
           " requests (a trace with fewer rows is oversampled: every row once, then "
           "copies drawn with replacement)."),
        *trace_timing.method(res),
        "Burstiness: the chosen config at the per-replica operating load "
        f"({res.operating_load:.4g} {_unit(res)}) under gamma arrivals of shape k in "
        f"{list(BURSTINESS_LEVELS)} (CV of the gaps 1/sqrt(k); k = 1 is Poisson).",
        ("Open vs closed loop: C users (Little's law: operating rate x mean E2E) send their "
         "next request as the previous one ends; Poisson arrivals then replay the throughput "
         "they reached. Latency and throughput are measured on requests sent after the first "
         "C and before the last C (the start-up wave and the drain). A closed loop slows "
         "its own arrivals when the server slows, so it hides queueing and understates "
         "latency." if res.best is None or res.best.pools is None else
         "Open vs closed loop: not run, disaggregated runs take open-loop arrivals only "
         "(docs/disaggregation.md)."),
        "Cost model and memory: per GPU of a tensor-parallel replica (weights, KV heads and "
        "FLOPs split TP ways, two all-reduces per layer over the GPU's interconnect; see "
        "docs/capacity.md). Calibrated profiles are single-GPU: TP > 1 uses the roofline.",
    ]


def markdown(res: PlanResult, deploy: deploy_config.Deployment | None,
             windows: LoadOverDay | None = None) -> str:
    """capacity.md (with ``windows``: the load over the day, --by-window)."""
    b = res.spec.base
    parts = [f"# Capacity plan: {b.model} on {b.gpu}", "", "## Answer", ""]
    parts += [f"- {line}" for line in answer_lines(res)]
    parts += ["", f"Planned in {res.elapsed_s:,.1f} s of wall time.", "",
              "## Configs compared", "", md_table(configs_frame(res))]
    if res.checks:
        parts += ["", "## Cluster checks", "", md_table(checks_frame(res))]
    if res.other is not None:
        parts += ["", f"## {trace_timing.title(res)}", "", trace_timing.text(res), "",
                  md_table(trace_timing.frame(res))]
    if res.burstiness:
        parts += ["", f"## Sensitivity to burstiness (chosen config at "
                  f"{res.operating_load:.4g} {_unit(res)} per replica)", "",
                  md_table(burstiness_frame(res))]
    if res.loops:
        parts += ["", "## Open vs closed loop at equal throughput", "",
                  md_table(loops_frame(res))]
    if deploy is not None:
        parts += ["", "## Deploy", "", *deploy_markdown(deploy)]
    parts += by_window_page.markdown_section(windows)
    parts += ["", "## Method", ""] + [f"- {m}" for m in method_lines(res)]
    return "\n".join(parts) + "\n"


def html_page(res: PlanResult, deploy: deploy_config.Deployment | None,
              windows: LoadOverDay | None = None) -> str:
    """capacity.html: the same as capacity.md, with the load curves."""
    from sim.app.reports.sweep_page import fig_html, page, table_html

    b = res.spec.base
    body = ["<h2>Answer</h2><div class='answer'><ul>"
            + "".join(f"<li>{md_inline(line)}</li>" for line in answer_lines(res))
            + "</ul></div>",
            f"<p>Planned in {res.elapsed_s:,.1f} s of wall time.</p>",
            "<h2>Configs compared</h2>", table_html(configs_frame(res))]
    probes = probes_frame(res)
    if not probes.empty:
        body += ["<h2>SLO attainment and latency against load</h2>",
                 "<p>Every probe of every search; x = saturated.</p>",
                 fig_html(load_figure(res, probes))]
    if res.checks:
        body += ["<h2>Cluster checks</h2>", table_html(checks_frame(res))]
    if res.other is not None:
        body += [f"<h2>{html.escape(trace_timing.title(res))}</h2>",
                 f"<p>{md_inline(trace_timing.text(res))}</p>",
                 table_html(trace_timing.frame(res))]
    if res.burstiness:
        body += [f"<h2>Sensitivity to burstiness (chosen config at "
                 f"{res.operating_load:.4g} {_unit(res)} per replica)</h2>",
                 table_html(burstiness_frame(res))]
    if res.loops:
        body += ["<h2>Open vs closed loop at equal throughput</h2>", table_html(loops_frame(res))]
    if deploy is not None:
        body += ["<h2>Deploy</h2>", deploy_html(deploy)]
    body += by_window_page.html_section(windows)
    body += ["<h2>Method</h2><ul>"
             + "".join(f"<li>{md_inline(m)}</li>" for m in method_lines(res)) + "</ul>",
             "<h2>All probes</h2>", table_html(probes)]
    return page(f"Capacity plan: {b.model} on {b.gpu}", body)


def load_figure(res: PlanResult, probes: pd.DataFrame) -> Any:
    """Attainment (worse of TTFT and TPOT) and p TTFT / p TPOT against load, per config."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    p = res.spec.slo.percentile
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "SLO attainment (worse of TTFT, TPOT)", f"p{p:g} TTFT (s)", f"p{p:g} TPOT (ms)"))
    palette = qualitative.Plotly
    ok = probes[probes["error"] == ""].sort_values(["config", "seed", "load"])
    for i, ((config, seed), sub) in enumerate(ok.groupby(["config", "seed"], sort=False)):
        name = f"{config} / seed {seed}"
        color = palette[i % len(palette)]
        sym = ["x" if s else "circle" for s in sub["saturated"]]
        att = sub[["TTFT attainment", "TPOT attainment"]].min(axis=1)
        for col, y in ((1, att), (2, sub["p TTFT (s)"]), (3, sub["p TPOT (ms)"])):
            fig.add_trace(go.Scatter(x=sub["load"], y=y, mode="lines+markers", name=name,
                                     legendgroup=name, showlegend=col == 1,
                                     line={"color": color},
                                     marker={"symbol": sym, "size": 8, "color": color}),
                          row=1, col=col)
    fig.add_hline(y=p / 100, line_dash="dash", line_color="red", row=1, col=1)
    if res.spec.slo.ttft_s is not None:
        fig.add_hline(y=res.spec.slo.ttft_s, line_dash="dash", line_color="red", row=1, col=2)
    if res.spec.slo.tpot_s is not None:
        fig.add_hline(y=res.spec.slo.tpot_s * 1e3, line_dash="dash", line_color="red",
                      row=1, col=3)
    fig.update_xaxes(title_text=f"load ({_unit(res)}, one replica)", type="log")
    fig.update_layout(height=460, margin={"t": 40})
    return fig


def to_json(res: PlanResult, deploy: deploy_config.Deployment | None,
            windows: LoadOverDay | None = None) -> dict[str, Any]:
    """plan.json: the spec, every search and probe, the checks and the evidence."""
    def conv(x: Any) -> Any:
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return {k: conv(v) for k, v in dataclasses.asdict(x).items()}
        if isinstance(x, dict):
            return {str(k): conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        if isinstance(x, float) and not math.isfinite(x):
            return None
        return x
    spec = res.spec
    out: dict[str, Any] = conv({
        "base": config_record(spec.base), "slo": spec.slo, "load_axis": spec.load_axis,
        "arrival": spec.arrival, "trace_timing": spec.trace,
        "target": spec.target, "router": spec.router, "seeds": list(spec.grid.seeds),
        "tolerance": spec.tolerance, "answer": answer_lines(res),
        "best_config": res.best.index if res.best else None, "replicas": res.replicas,
        "configs": [{"index": c.index, "knobs": c.knobs, "error": c.error,
                     "interval": c.interval(spec.load_axis), "searches": c.searches}
                    for c in res.configs],
        "cluster_checks": {str(i): trace_timing.checks_record(ks)
                           for i, ks in res.checks.items()},
        "operating_load": res.operating_load, "other_timing": trace_timing.record(res.other),
        "burstiness": [{"k": k, "probes": ps} for k, ps in res.burstiness],
        "open_vs_closed": res.loops, "elapsed_s": res.elapsed_s,
        "deploy": deploy_config.record(deploy),
    })
    if windows is not None:
        out["by_window"] = by_window_page.record(windows)
    return out


def write_plan(out_dir: Path, res: PlanResult,
               windows: LoadOverDay | None = None) -> list[Path]:
    """capacity.md, capacity.html, plan.json and vllm_serve.yaml (the chosen config to
    deploy, sim/app/runs/deploy_config.py) in ``out_dir``, all or none
    (sim/app/runs/out_dir.py write_files); returns their paths."""
    deploy = deploy_config.plan_deployment(res)
    return write_files(out_dir, {
        "capacity.md": lambda: markdown(res, deploy, windows),
        "capacity.html": lambda: html_page(res, deploy, windows),
        "plan.json": lambda: json.dumps(to_json(res, deploy, windows), indent=2) + "\n",
        deploy_config.SERVE_FILE: lambda: deploy_config.serve_file(deploy)})
