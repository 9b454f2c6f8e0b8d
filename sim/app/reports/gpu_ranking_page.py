"""The report of ``servesim plan --gpu a,b,c``: capacity.md and capacity.html (the
ranking first: per GPU type replicas, TP, GPUs, $/hour, $/M output tokens, headroom and
the binding SLO; the prices and their sources; then each type's answer and configs; the
cheapest type's deployment), plan.json (the ranking and every type's whole plan, as
sim/app/reports/plan_page.py records one) and the cheapest type's vllm_serve.yaml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from sim.app.reports import fleet_text, plan_page
from sim.app.reports.deploy_section import deploy_html, deploy_markdown
from sim.app.reports.markdown import md_inline, md_table
from sim.app.runs import deploy_config
from sim.app.runs.gpu_ranking import GpuPlan, GpuRanking
from sim.app.runs.out_dir import write_files


def _usd(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"${x:,.{digits}f}"


def _config(p: GpuPlan) -> str:
    if p.error:
        return "cannot run: " + p.error
    res = p.result
    if res is None or res.best is None:
        return "no config sustains any load"
    return fleet_text.knobs_text(res.best)


def ranking_frame(r: GpuRanking) -> pd.DataFrame:
    """One row per GPU type, cheapest first."""
    rows = []
    for i, p in enumerate(r.plans, start=1):
        rows.append({
            "rank": i, "GPU": p.gpu, "replicas": p.replicas, "TP": p.tp, "GPUs": p.gpus,
            "$/GPU-hour": p.price.usd_per_gpu_hour if p.price else None,
            "$/hour": p.usd_per_hour, "$/M output tokens": p.usd_per_million_output_tokens,
            "headroom": None if p.headroom is None else f"{p.headroom:.0%}",
            "binding SLO": p.binding_slo, "config": _config(p)})
    return pd.DataFrame(rows)


def prices_frame(r: GpuRanking) -> pd.DataFrame:
    """The price of every GPU type planned, and where it comes from."""
    rows = []
    for p in r.plans:
        q = p.price
        rows.append({"GPU": p.gpu, "$/GPU-hour": q.usd_per_gpu_hour if q else None,
                     "provider": q.provider if q else "no price known: give --price "
                     f"{p.gpu}=USD_PER_HOUR", "product": q.product if q else "",
                     "date": q.date if q else "", "source": q.source if q else ""})
    return pd.DataFrame(rows)


def answer_lines(r: GpuRanking) -> list[str]:
    """The ranking's answer, one markdown bullet per line (also printed by the CLI)."""
    c = r.chosen
    first = next((p.result for p in r.plans if p.result is not None), None)
    lines = plan_page.answer_lines(first)[:3] if first else []
    lines[:1] = [f"**Model / GPU types**: {first.spec.base.model} on "
                 f"{', '.join(p.gpu for p in r.plans)}"] if first else []
    if c is None or c.result is None:
        return [*lines, "**No GPU type was confirmed at the target** (see the table)"]
    target = c.result.spec.target
    unit = "req/s" if c.result.spec.load_axis == "rate" else "users"
    cost = (f" = **{_usd(c.usd_per_hour)}/hour** at {c.price.describe()}"
            if c.price else " (no price known)")
    per_m = c.usd_per_million_output_tokens
    fleet = (fleet_text.fleet_text(c.result.best, c.replicas)
             if c.result.best is not None and c.replicas is not None
             and c.result.best.pools is not None
             else f"{c.replicas} replica(s) x TP {c.tp} = {c.gpus} GPU(s)")
    lines.append(f"**Cheapest at {target:,.4g} {unit}: {c.gpu}**, {fleet}{cost}"
                 + (f", {_usd(per_m, 3)} per million output tokens "
                    f"({c.output_tokens_per_request:,.1f} output tokens per request)"
                    if per_m is not None else ""))
    unpriced = [p.gpu for p in r.plans if p.price is None]
    if unpriced:
        lines.append(f"**No price known** for {', '.join(unpriced)}: ranked after the priced "
                     "types; give --price GPU=USD_PER_HOUR")
    return lines


def method_lines() -> list[str]:
    return [
        "Each GPU type is planned as `servesim plan --gpu TYPE` plans it (its own searches, "
        "configs and cluster checks; the method of one plan is in plan.json's answer and "
        "docs/capacity.md). A type the model does not fit at TP 1 gets the smallest TP of "
        "1, 2, 4, 8 that fits, unless --tensor-parallel-size is given.",
        "$/hour = GPUs x $/GPU-hour; $/M output tokens = $/hour / (target req/s x mean "
        "output tokens per request x 3600 / 10^6), the mean over the requests the probes "
        "replay. Headroom = replicas x one replica's median sustainable rate / target - 1.",
        "Binding SLO: what failed at the lowest load the chosen config's searches found "
        "infeasible (the most common over seeds): TTFT, TPOT, both, or saturation.",
        "Ranked by $/hour (confirmed answers first, then priced ones), ties by GPUs.",
    ]


def markdown(r: GpuRanking) -> str:
    """capacity.md across GPU types."""
    parts = ["# Capacity plan across GPU types", "", "## Answer", ""]
    parts += [f"- {line}" for line in answer_lines(r)]
    parts += ["", f"Planned in {r.elapsed_s:,.1f} s of wall time.", "",
              "## GPU types compared", "", md_table(ranking_frame(r)), "",
              "## Prices", "", md_table(prices_frame(r))]
    for p in r.plans:
        if p.result is not None:
            parts += ["", f"## {p.gpu}", ""]
            parts += [f"- {line}" for line in plan_page.answer_lines(p.result)[3:]]
            parts += ["", md_table(plan_page.configs_frame(p.result))]
    deploy = _deployment(r)
    if deploy is not None:
        parts += ["", f"## Deploy ({deploy.gpu})", "", *deploy_markdown(deploy)]
    parts += ["", "## Method", ""] + [f"- {m}" for m in method_lines()]
    return "\n".join(parts) + "\n"


def html_page(r: GpuRanking) -> str:
    """capacity.html across GPU types: capacity.md's sections as HTML."""
    from sim.app.reports.sweep_page import page, table_html

    body = ["<h2>Answer</h2><div class='answer'><ul>"
            + "".join(f"<li>{md_inline(line)}</li>" for line in answer_lines(r))
            + "</ul></div>", "<h2>GPU types compared</h2>", table_html(ranking_frame(r)),
            "<h2>Prices</h2>", table_html(prices_frame(r))]
    for p in r.plans:
        if p.result is not None:
            body += [f"<h2>{p.gpu}</h2><ul>"
                     + "".join(f"<li>{md_inline(line)}</li>"
                               for line in plan_page.answer_lines(p.result)[3:]) + "</ul>",
                     table_html(plan_page.configs_frame(p.result))]
    deploy = _deployment(r)
    if deploy is not None:
        body += [f"<h2>Deploy ({deploy.gpu})</h2>", deploy_html(deploy)]
    body += ["<h2>Method</h2><ul>" + "".join(f"<li>{md_inline(m)}</li>"
                                            for m in method_lines()) + "</ul>"]
    return page("Capacity plan across GPU types", body)


def _deployment(r: GpuRanking) -> deploy_config.Deployment | None:
    c = r.chosen
    return deploy_config.plan_deployment(c.result) if c and c.result else None


def to_json(r: GpuRanking) -> dict[str, Any]:
    """plan.json across GPU types: the ranking, the prices, every type's plan."""
    table = ranking_frame(r).astype(object).where(lambda d: d.notna(), None)
    return {"answer": answer_lines(r), "gpu_types": table.to_dict(orient="records"),
            "prices": prices_frame(r).astype(object).where(lambda d: d.notna(), None)
            .to_dict(orient="records"),
            "output_tokens_per_request": {p.gpu: p.output_tokens_per_request
                                          for p in r.plans},
            "plans": {p.gpu: plan_page.to_json(p.result, deploy_config.plan_deployment(p.result))
                      for p in r.plans if p.result},
            "errors": {p.gpu: p.error for p in r.plans if p.error},
            "deploy": deploy_config.record(_deployment(r)), "elapsed_s": r.elapsed_s}


def write_gpu_ranking(out_dir: Path, r: GpuRanking) -> list[Path]:
    """capacity.md, capacity.html, plan.json and vllm_serve.yaml (the cheapest type's
    config) in ``out_dir``, all or none (sim/app/runs/out_dir.py write_files)."""
    deploy = _deployment(r)
    return write_files(out_dir, {
        "capacity.md": lambda: markdown(r), "capacity.html": lambda: html_page(r),
        "plan.json": lambda: json.dumps(to_json(r), indent=2) + "\n",
        deploy_config.SERVE_FILE: lambda: deploy_config.serve_file(deploy)})
