"""The comparison of ``servesim validate --engine vllm``: the three runs of
sim/app/runs/validate_vllm.py reduced to validate's error table, step error and files.

Owns :func:`rule_agreement` (where servesim's decisions part from vLLM's, both on
vLLM's step times), :func:`vllm_validation_dict` (validation.json, format
``servesim-validation`` with ``target`` "vllm-engine") and the terminal lines of such a
run. Both sides are reduced by sim/app/runs/against.py's client_summary, summary.json's
definitions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.app.runs.run_files import resolved_config
from sim.app.runs.runner import Prepared
from sim.app.runs.validate_vllm import AlsoPriced, Schedule, VllmValidation

TARGET = "vllm-engine"


def per_request(schedule: Schedule, n: int) -> list[tuple[tuple[int, int], ...]]:
    """Each request's (step index, new tokens) pairs over ``schedule``."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for k, step in enumerate(schedule):
        for i, tokens in step:
            out[i].append((k, tokens))
    return [tuple(x) for x in out]


def rule_agreement(vllm: Schedule, sim: Schedule, n: int) -> dict[str, Any]:
    """Where servesim's decisions part from vLLM's, both on vLLM's step times: the first
    step whose scheduled (request, tokens) differ (None: none), the steps of each run,
    and the requests scheduled identically in every step (same steps, same tokens)."""
    from sim.app.runs.validate import first_difference

    a, b = per_request(vllm, n), per_request(sim, n)
    same = sum(x == y for x, y in zip(a, b, strict=True))
    return {"first_different_step": first_difference(vllm, sim),
            "num_steps": {"vllm": len(vllm), "servesim": len(sim)},
            "num_requests": n, "requests_scheduled_alike": same}


def vllm_validation_dict(prep: Prepared, v: VllmValidation,
                         also: AlsoPriced | None = None) -> dict[str, Any]:
    """validation.json of a run against the vLLM engine: validate's format with
    ``target`` "vllm-engine", the engine's facts, the error table (ITL included), the
    step error, the agreement check, the same errors of another profile (``also``,
    None when not asked), and the per-step and per-request columns."""
    from sim.app.runs.against import METRICS_AGAINST, client_summary, simulated_summary
    from sim.app.runs.validate import (
        FORMAT,
        VERSION,
        error_rows,
        first_difference,
        json_floats,
        step_error,
    )
    from sim.request import RequestStatus

    r, w = v.requests, prep.workload
    measured = client_summary(r["arrival_time"], r["finish_time"], r["done"], r["ttft_s"],
                              r["tpot_s"], r["e2e_latency_s"], r["num_output_tokens"],
                              np.asarray(w.num_prompt_tokens), r["itl"])
    predicted = simulated_summary(v.predicted)
    t = v.predicted.request_table
    order = {str(rid): k for k, rid in enumerate(t["request_id"])}
    pos = np.array([order[rid] for rid in w.request_id], dtype=np.int64)
    diff = first_difference(v.predicted_schedule, v.schedules[0])
    return {
        "format": FORMAT, "version": VERSION, "target": TARGET,
        "config": resolved_config(prep),
        "real": _real(prep, v),
        "wall_s": {k: round(x, 3) for k, x in v.wall_s.items()},
        "errors": error_rows(predicted, measured, METRICS_AGAINST),
        "step_error": step_error(v.steps["predicted_s"], v.steps["measured_s"]),
        "same_schedule": diff is None, "first_different_step": diff,
        "same_admission_order": _admission(t["first_scheduled_time"][pos])
        == _admission(r["first_scheduled_time"]),
        "num_steps": {"predicted": len(v.predicted_schedule), "measured": len(v.steps)},
        "agreement": rule_agreement(*v.schedules, len(w)),
        "also": None if also is None else {
            "profile": also.profile, "cost_model": also.label,
            "errors": error_rows(simulated_summary(also.predicted), measured,
                                 METRICS_AGAINST),
            "step_error": step_error(also.prices, v.steps["measured_s"])},
        "rejected": [{"request": int(x["request"]), "reason": x["reason"]}
                     for x in v.rejected],
        "simulation_rejected": int((t["status"] == RequestStatus.REJECTED.value).sum()),
        "predicted": predicted, "measured": measured,
        "steps": {c: (json_floats(v.steps[c]) if v.steps[c].dtype.kind == "f"
                      else [int(x) for x in v.steps[c]]) for c in v.steps.columns},
        "requests": _request_columns(prep, v, pos),
    }


def _real(prep: Prepared, v: VllmValidation) -> dict[str, Any]:
    """The engine that ran: setup and start-up facts."""
    s = v.setup
    return {"engine": "vllm" if s.fake is None else "fake",
            "vllm_version": v.facts.get("vllm_version"), "model": s.spec.name,
            "dtype": s.dtype, "device": s.device, "threads": s.threads, "timer": s.timer,
            "repeats": 1, "seed": s.seed, "block_size": s.block_size,
            "num_gpu_blocks": prep.num_gpu_blocks, "warmup_requests": s.warmup_requests,
            "python": s.python, "device_name": v.facts.get("device_name"),
            "startup_s": v.facts.get("startup_s"), "device_note": _device_note(prep, v)}


def _device_note(prep: Prepared, v: VllmValidation) -> str | None:
    """Why the profile may not price this machine's steps (calibration.measure
    device_mismatch), or None."""
    from calibration.measure import device_mismatch
    from calibration.profile import load_profile
    from calibration.vllm_measure import with_cpu_kind

    if prep.config.profile is None or v.facts.get("device_name") is None:
        return None
    here = with_cpu_kind(str(v.facts["device_name"]), v.facts.get("cpu_capability"))
    return device_mismatch(load_profile(prep.config.profile).device_name, here)


def _request_columns(prep: Prepared, v: VllmValidation, pos: np.ndarray) -> dict[str, Any]:
    """Per request (workload order; ``pos``: each one's row in the simulation's table),
    predicted and measured TTFT, TPOT and E2E latency."""
    from sim.app.runs.validate import json_floats

    t, r = v.predicted.request_table, v.requests
    out: dict[str, Any] = {"request_id": list(prep.workload.request_id),
                           "arrival_time": json_floats(r["arrival_time"])}
    for c in ("ttft_s", "tpot_s", "e2e_latency_s"):
        out[f"predicted_{c}"] = json_floats(t[c][pos])
        out[f"measured_{c}"] = json_floats(r[c])
    return out


def _admission(first_scheduled: np.ndarray) -> list[int]:
    """Request indices in order of first scheduling (ties: workload order)."""
    ok = np.flatnonzero(~np.isnan(first_scheduled))
    return [int(i) for i in ok[np.argsort(first_scheduled[ok], kind="stable")]]


def agreement_line(data: dict[str, Any]) -> str:
    """The live check of the decisions, in one line."""
    a = data["agreement"]
    steps = a["num_steps"]
    where = ("in every step" if a["first_different_step"] is None
             else f"until step {a['first_different_step']}")
    return (f"decisions on vLLM's step times: servesim scheduled as vLLM {where} "
            f"({steps['vllm']:,} vLLM steps, {steps['servesim']:,} simulated); "
            f"{a['requests_scheduled_alike']:,} of {a['num_requests']:,} requests "
            "scheduled alike in every step")


def rejected_line(data: dict[str, Any]) -> str | None:
    """Requests refused by vLLM or the simulation, when any."""
    n, m = len(data["rejected"]), data["simulation_rejected"]
    if not n and not m:
        return None
    return f"rejected: {n:,} by vLLM, {m:,} by the simulation (prompt >= max_model_len)"
