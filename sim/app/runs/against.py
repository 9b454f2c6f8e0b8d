"""``servesim validate --against RESULT.json``: a real server's own benchmark result as the
target. The result's successful requests (scenarios/vllm_bench.py) are replayed as they
were sent, the simulation prices them with the chosen cost model, and the client-side
figures of both are compared in validate's error table; then again with the API server's
term (calibration/frontend.py), fitted to the result or given.

Owns: the config of such a run (:func:`against_config`: the result's workload, validate's
default profile unless another cost model is named), :func:`run_against`, the client-side
summaries both sides are reduced to (:func:`client_summary`, one definition for the
simulation and the result: summary.json's), and the validation.json of such a run
(:func:`against_dict`). The table, the error figures and the JSON's format are validate's
(sim/app/runs/validate.py); the page is sim/app/reports/validation_page.py.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibration.frontend import Frontend, FrontendFit, fit_frontend
from scenarios.vllm_bench import BenchResult, read_result
from sim.app.runs.run_files import resolved_config
from sim.app.runs.runner import Prepared, RunConfig, prepare, simulate_prepared
from sim.app.runs.validate import (
    FORMAT,
    METRICS,
    VERSION,
    error_rows,
    json_floats,
    validation_config,
)
from sim.latency_stats import ItlSamples, stats, weighted_stats
from sim.request import RequestStatus
from sim.simulate import SimResult

TARGET = "vllm-bench"
#: validate's metrics and the ITL percentiles (the result's chunk gaps against the
#: simulation's token gaps: equal when the server streams one token a chunk).
METRICS_AGAINST: tuple[tuple[str, str], ...] = (
    *METRICS, *((f"ITL {p} (s)", f"itl_s.{p}") for p in ("p50", "p90", "p99")))
#: Workload options that would change the requests the result recorded.
WORKLOAD_OPTIONS = ("scenario", "trace", "trace_format", "arrival", "rate", "burstiness",
                    "num_requests", "window", "time_scale", "max_tokens", "trace_sample")
#: Options that name a cost model other than a profile (the run's roofline or constant).
COST_OPTIONS = ("step_time", "model", "gpu", "dtype")
#: Options that mean something only against a result (the real run takes the profile's
#: model and dtype, and has no API server).
AGAINST_ONLY = ("model", "gpu", "dtype", "quantization", "kv_cache_dtype", "frontend_ttft_s",
                "frontend_token_s", "fit_frontend")


def check_without_against(**given: Any) -> None:
    """Raise ValueError naming the first of AGAINST_ONLY given (not None) without
    --against."""
    for name in AGAINST_ONLY:
        if given.get(name) is not None:
            raise ValueError(f"{name} applies only with --against (the real run executes the "
                             "profile's model and dtype, with no API server in front)")


def against_config(result: Path | str, **fields: Any) -> RunConfig:
    """The RunConfig that replays ``result``: its trace is the result (format vllm-bench).
    Priced by ``profile`` (default: validate's shipped profile, its grid limits as
    validate takes them, its dtype), or, when step_time, model, gpu or dtype is given,
    by the run's constant or roofline model. Raises ValueError naming a workload option
    (the workload is the result's), or a profile given with another cost model."""
    for name in WORKLOAD_OPTIONS:
        if fields.pop(name, None) not in (None, False):
            raise ValueError(f"{name} does not apply with --against: the workload is the "
                             "result's own requests, as they were sent")
    named = [k for k in COST_OPTIONS if fields.get(k) is not None]
    fields = {k: v for k, v in fields.items() if v is not None}
    if named and "profile" in fields:
        raise ValueError(f"{named[0]} and profile name two cost models; give one")
    if named:
        cfg = RunConfig(**fields)
    else:
        from calibration.profile import load_profile

        cfg = validation_config(**fields)
        assert cfg.profile is not None, "validation_config names a profile"
        cfg = dataclasses.replace(cfg, dtype=load_profile(cfg.profile).dtype)
    return dataclasses.replace(cfg, trace=str(result), trace_format=TARGET)


def prepare_against(result: Path | str, **fields: Any) -> tuple[Prepared, BenchResult]:
    """Read ``result`` (one-line errors naming the field and the request index), then
    resolve its run (against_config's fields). Raises FileNotFoundError or ValueError."""
    bench = read_result(result)
    return prepare(against_config(result, **fields)), bench


@dataclass
class Against:
    """One comparison: the result, the simulation of its workload, and the frontend term
    applied (None: none fitted or given)."""

    result: BenchResult
    predicted: SimResult
    frontend: FrontendFit | None
    wall_s: float


def run_against(prep: Prepared, result: BenchResult, ttft_s: float | None = None,
                token_s: float | None = None, fit: bool = True) -> Against:
    """Simulate ``prep`` (the result's workload); with ``fit``, fit the frontend terms not
    given, else apply those given (0 for the other; no term when neither is)."""
    t0 = time.perf_counter()
    predicted = simulate_prepared(prep)
    wall = time.perf_counter() - t0
    term = None
    if fit or ttft_s is not None or token_s is not None:
        if not fit:
            ttft_s, token_s = ttft_s or 0.0, token_s or 0.0
        sim = paired(result, predicted)
        term = fit_frontend(sim["ttft_s"], sim["e2e_latency_s"], result.ttft_s,
                            result.latency_s, result.output_len, ttft_s, token_s)
    return Against(result, predicted, term, wall)


def paired(result: BenchResult, predicted: SimResult) -> dict[str, np.ndarray]:
    """The simulation's request table in the result's order (request_id = file index)."""
    table = predicted.request_table
    pos = {str(rid): k for k, rid in enumerate(table["request_id"])}
    order = np.array([pos[str(i)] for i in result.index], dtype=np.int64)
    return {c: v[order] for c, v in table.items()}


# -- both sides as the client sees them -----------------------------------------------------


def client_summary(arrival: np.ndarray, finish: np.ndarray, done: np.ndarray,
                   ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray,
                   num_output_tokens: np.ndarray, num_prompt_tokens: np.ndarray,
                   itl: ItlSamples) -> dict[str, Any]:
    """summary.json's figures (sim/metrics.py summarize) from per-request client times
    (s): duration from the first arrival (of any request) to the last finish of a
    ``done`` request; throughput, TTFT, TPOT and E2E over the done requests; ITL over
    ``itl``."""
    n = int(done.sum())
    duration = float(np.max(finish[done]) - np.min(arrival)) if n else 0.0
    n_out = int(num_output_tokens[done].sum())
    n_tot = n_out + int(num_prompt_tokens[done].sum())

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    return {"num_requests": len(arrival), "num_finished": n, "duration_s": duration,
            "throughput": {"output_tokens_per_s": per_s(n_out),
                           "total_tokens_per_s": per_s(n_tot), "requests_per_s": per_s(n)},
            "ttft_s": stats(ttft[done]), "tpot_s": stats(tpot[done]),
            "itl_s": weighted_stats(itl), "e2e_latency_s": stats(e2e[done])}


def measured_summary(result: BenchResult) -> dict[str, Any]:
    """The result's client-side figures, as client_summary defines them."""
    n = result.output_len
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(n > 1, (result.latency_s - result.ttft_s) / (n - 1), np.nan)
    arrival = measured_arrival(result)
    return client_summary(arrival, arrival + result.latency_s,
                          np.ones(len(result), dtype=bool), result.ttft_s, tpot,
                          result.latency_s, n, result.num_prompt_tokens,
                          ItlSamples.of(result.itl_s))


def measured_arrival(result: BenchResult) -> np.ndarray:
    """Each request's send time from the earliest (s), as the workload replays it."""
    assert result.start_time is not None, "a replayed result has start times"
    return result.start_time - result.start_time.min()


def predicted_summary(a: Against, frontend: Frontend) -> dict[str, Any]:
    """The simulation's client-side figures with ``frontend`` added (Frontend(): the
    engine's own, equal to its summary.json)."""
    return simulated_summary(a.predicted, frontend)


def simulated_summary(result: SimResult, frontend: Frontend | None = None) -> dict[str, Any]:
    """A simulation's client-side figures (client_summary) with ``frontend`` added
    (None: the engine's own, equal to its summary.json)."""
    frontend = frontend or Frontend()
    t = result.request_table
    ttft, tpot, e2e = frontend.client_view(t["ttft_s"], t["tpot_s"], t["e2e_latency_s"],
                                           t["num_output_tokens"])
    itl = result.itl
    finish = t["finish_time"] + frontend.finish_delay(t["num_output_tokens"])
    return client_summary(t["arrival_time"], finish,
                          t["status"] == RequestStatus.FINISHED.value, ttft, tpot, e2e,
                          t["num_output_tokens"], t["num_prompt_tokens"],
                          ItlSamples(itl.values_s + frontend.token_s, itl.counts))


# -- validation.json ----------------------------------------------------------------------


def against_dict(prep: Prepared, a: Against) -> dict[str, Any]:
    """validation.json of a run against a result: validate's format, with ``target``
    "vllm-bench", the result's description, the error table without the frontend term
    (``errors``) and with it (``errors_with_frontend``, None when no term), the term and
    its fit, the three summaries and the per-request columns."""
    measured = measured_summary(a.result)
    engine = predicted_summary(a, Frontend())
    term = a.frontend
    client = predicted_summary(a, term.frontend) if term else None
    r = a.result
    return {
        "format": FORMAT, "version": VERSION, "target": TARGET,
        "config": resolved_config(prep),
        "against": {"file": str(prep.config.trace), "num_requests": len(r) + r.num_failed,
                    "num_failed": r.num_failed, "num_replayed": len(r), "vllm": r.meta},
        "wall_s": {"predicted": round(a.wall_s, 3)},
        "errors": error_rows(engine, measured, METRICS_AGAINST),
        "frontend": None if term is None else {
            "ttft_s": term.frontend.ttft_s, "token_s": term.frontend.token_s,
            "fitted": list(term.fitted), "raw_ttft_s": term.raw_ttft_s,
            "raw_token_s": term.raw_token_s, "num_requests": term.num_requests,
            "num_gaps": term.num_gaps},
        "errors_with_frontend": None if client is None else error_rows(
            client, measured, METRICS_AGAINST),
        "predicted": engine, "predicted_with_frontend": client, "measured": measured,
        "requests": _request_columns(a),
    }


def _request_columns(a: Against) -> dict[str, Any]:
    """Per request, in the result's order: predicted_* (with the term when there is one),
    engine_* (without it, only when there is one) and measured_* TTFT, TPOT, E2E."""
    r, sim = a.result, paired(a.result, a.predicted)
    n = r.output_len
    with np.errstate(divide="ignore", invalid="ignore"):
        meas_tpot = np.where(n > 1, (r.latency_s - r.ttft_s) / (n - 1), np.nan)
    out: dict[str, Any] = {"request_id": [str(i) for i in r.index],
                           "arrival_time": json_floats(measured_arrival(r))}
    engine = (sim["ttft_s"], sim["tpot_s"], sim["e2e_latency_s"])
    client = a.frontend.frontend.client_view(*engine, sim["num_output_tokens"]) \
        if a.frontend else engine
    for k, col in enumerate(("ttft_s", "tpot_s", "e2e_latency_s")):
        out[f"predicted_{col}"] = json_floats(client[k])
        if a.frontend:
            out[f"engine_{col}"] = json_floats(engine[k])
    for col, values in (("ttft_s", r.ttft_s), ("tpot_s", meas_tpot),
                        ("e2e_latency_s", r.latency_s)):
        out[f"measured_{col}"] = json_floats(values)
    return out


# -- terminal output --------------------------------------------------------------------


def target_line(data: dict[str, Any]) -> str:
    """What the result is: file, server, model, requests."""
    a, meta = data["against"], data["against"]["vllm"]
    about = ", ".join(f"{k} {meta[k]}" for k in ("backend", "model_id", "date",
                                                  "request_rate", "max_concurrency")
                      if meta.get(k) is not None)
    failed = f" ({a['num_failed']} failed, left out)" if a["num_failed"] else ""
    return (f"target: vllm bench serve result {a['file']}"
            f"{f' ({about})' if about else ''}: {a['num_replayed']:,} requests{failed}, "
            "client-side figures")


def frontend_line(data: dict[str, Any]) -> str:
    """The frontend term applied, and how it was found."""
    f = data["frontend"]
    if f is None:
        return "no frontend term (--no-fit-frontend and none given)"
    term = Frontend(f["ttft_s"], f["token_s"]).describe()
    if not f["fitted"]:
        return f"frontend term (given): {term}"
    raw = [f"{name} {f['raw_' + name] * 1e3:+.3f} ms" for name in f["fitted"]
           if f["raw_" + name] is not None and f["raw_" + name] < 0]
    clamped = f"; clamped at 0 from {', '.join(raw)}" if raw else ""
    return (f"frontend term, least squares over {f['num_requests']:,} requests "
            f"({f['num_gaps']:,} token gaps; fitted: {', '.join(f['fitted'])}): "
            f"{term}{clamped}")


def unfinished_line(data: dict[str, Any]) -> str | None:
    """A warning when some of the result's requests did not finish in the simulation
    (rejected: a prompt beyond max_model_len or the KV pool), else None."""
    n, done = data["against"]["num_replayed"], data["predicted"]["num_finished"]
    if done == n:
        return None
    return (f"note: {n - done:,} of the result's {n:,} requests did not finish in the "
            "simulation (predicted/requests.csv says why): give the server's "
            "--max-model-len and KV capacity")
