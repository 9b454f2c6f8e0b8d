"""``servesim validate``: run one scenario twice, once priced by a calibrated profile (the
simulation) and once executed for real on the device (calibration/executor.py), and show
how far apart they are.

Owns: :class:`RealSetup` (how the real run executes, read from the profile: its model,
dtype and torch threads), :func:`prepare_validation`, :func:`run_validation` (both runs over
one prepared workload and config: the same engine, policy, KV allocator and arrivals; only
the step times differ), the error figures (:func:`error_rows`, :func:`step_error`), and
validation.json's content (:func:`validation_dict`). The page and the files
(``write_validation``) are sim/app/reports/validation_page.py's. torch is imported only
through calibration.executor, inside :func:`run_validation`. The device probe's figures
(validation.json's ``device_probe``) are calibration/device_probe.py's.

Errors are signed relative errors of the prediction: ``predicted / measured - 1`` (+10%:
the simulation says 10% more than the real run measured).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from calibration.device_probe import PROBE_EVERY_S, Probes, calibrated_seconds, check_probe
from sim.app.runs.defaults import UNBUDGETED_POLICIES
from sim.app.runs.run_files import resolved_config
from sim.app.runs.runner import (
    Prepared,
    RunConfig,
    prepare,
    simulate_prepared,
)

if TYPE_CHECKING:
    from calibration.specs import ModelSpec
    from sim.batch import BatchPlan, BatchShape
    from sim.simulate import SimResult

FORMAT = "servesim-validation"
VERSION = 1
#: Step clocks of the real run (calibration.executor, which checks them again).
TIMERS = ("auto", "thread", "wall")

#: (label, summary path) of the run metrics compared, in table order.
METRICS: tuple[tuple[str, str], ...] = (
    ("throughput (req/s)", "throughput.requests_per_s"),
    ("output tokens/s", "throughput.output_tokens_per_s"),
    *((f"{name} {p} (s)", f"{key}.{p}") for name, key in (
        ("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_latency_s"))
      for p in ("p50", "p90", "p99")),
)


def shipped_profile() -> str:
    """Path of the shipped CPU profile (Qwen2.5-0.5B, bf16, one torch thread)."""
    return str(resources.files("calibration.profiles").joinpath("cpu-qwen2.5-0.5b.json"))


@dataclass(frozen=True, slots=True)
class RealSetup:
    """How the real run executes: a random-weight decoder of ``spec`` in ``dtype`` on
    ``device`` with ``threads`` torch CPU threads (None: torch's default), timed by
    ``timer`` (calibration.executor.TIMERS), each step the run of ``repeats`` that
    ``statistic`` (the profile's fit.statistic) picks; a device probe every
    ``probe_every_s`` seconds of steps and at the end (0: none)."""

    spec: ModelSpec
    dtype: str
    device: str
    threads: int | None
    timer: str = "auto"
    repeats: int = 1
    seed: int = 0
    statistic: str = "min"
    probe_every_s: float = PROBE_EVERY_S


def profile_threads(device_name: str) -> int | None:
    """The torch CPU threads a profile was measured with, read from its device_name
    ("... (2 cores, 1 torch threads)"); None when it does not say (a GPU profile)."""
    m = re.search(r"(\d+) torch threads?\b", device_name)
    return int(m.group(1)) if m else None


def prepare_validation(cfg: RunConfig, device: str | None = None, timer: str = "auto",
                       repeats: int = 1, probe_every_s: float = PROBE_EVERY_S
                       ) -> tuple[Prepared, RealSetup]:
    """Resolve the run (priced by ``cfg.profile``) and its real setup from the profile.

    The real run uses the profile's model, dtype and torch threads; ``device`` defaults
    to the profile's. Raises ValueError (naming the field) for a missing profile, a
    constant step time, an unknown timer, repeats < 1, probe_every_s < 0, several replicas
    or tensor parallelism, or a device other than the profile's.
    """
    from calibration.profile import load_profile
    from calibration.specs import ModelSpec

    if cfg.profile is None:
        raise ValueError("profile: validate compares a run against a calibrated profile")
    if cfg.step_time is not None:
        raise ValueError("step_time: validate prices steps with the profile, not a constant")
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    check_probe(probe_every_s)
    if cfg.replicas != 1 or cfg.tensor_parallel_size != 1:
        raise ValueError("replicas and tensor_parallel_size must be 1: validate executes "
                         "one engine on one device")
    profile = load_profile(cfg.profile)
    if device is not None and not device.strip():
        raise ValueError("device must name a torch device (cpu, cuda, cuda:1), got ''")
    device = device or profile.device
    if device.split(":")[0] != profile.device:
        raise ValueError(f"device {device!r} differs from the profile's device "
                         f"{profile.device!r}: the comparison would be meaningless")
    real = RealSetup(ModelSpec(**profile.model), profile.dtype, device,
                     profile_threads(profile.device_name), timer, repeats, cfg.seed,
                     profile.fit.statistic, probe_every_s)
    return prepare(dataclasses.replace(cfg, dtype=profile.dtype)), real


def validation_config(profile: str | None = None, **fields: Any) -> RunConfig:
    """A RunConfig priced by ``profile`` (default: the shipped CPU profile) whose unset
    (None) max_num_seqs, max_num_batched_tokens and max_model_len are the profile's grid
    limits (max_num_seqs, max_num_batched_tokens, max_context): every step then stays
    inside what the profile measured; and, for a profile of the vLLM engine, whose unset
    block_size and num_gpu_blocks are the engine's at start-up. Raises ValueError for a
    bad profile or field."""
    from calibration.profile import load_profile

    path = profile or shipped_profile()
    prof = load_profile(path)
    for name, key in (("max_num_seqs", "max_num_seqs"),
                      ("max_num_batched_tokens", "max_num_batched_tokens"),
                      ("max_model_len", "max_context")):
        if name == "max_num_batched_tokens" and fields.get("policy") in UNBUDGETED_POLICIES:
            continue  # static batching has no token budget
        if fields.get(name) is None and key in prof.grid:
            fields[name] = int(prof.grid[key])
    for name in ("block_size", "num_gpu_blocks"):  # a vLLM profile's KV pool at start-up
        if fields.get(name) is None and prof.engine.get(name):
            fields[name] = int(prof.engine[name])
    return RunConfig(profile=path, **{k: v for k, v in fields.items() if v is not None})


def cache_capacity(prep: Prepared) -> int:
    """Tokens one request's cache may hold: the longest admissible prompt plus the longest
    output (a static batch pads every prompt to its longest), plus one."""
    w, limit = prep.workload, prep.scheduler.max_model_len
    ok = w.num_prompt_tokens + w.max_tokens <= limit
    if not ok.any():
        return 1
    out = np.minimum(w.output_len, w.max_tokens)[ok]
    return int(w.num_prompt_tokens[ok].max() + out.max()) + 1


@dataclass
class Validation:
    """Both runs of one validation. ``steps``: one row per step of the real run, with
    the profile's prediction for the same shape (``predicted_s``), the seconds the clock
    advanced (``measured_s``), wall and thread-CPU seconds. ``schedules``: per run, per
    step, the (request_id, num_new_tokens) pairs scheduled. ``probes``: its device probes."""

    predicted: SimResult
    measured: SimResult
    steps: pd.DataFrame
    schedules: tuple[list[tuple[tuple[str, int], ...]], list[tuple[tuple[str, int], ...]]]
    setup: RealSetup
    timer: str
    capacity: int
    wall_s: dict[str, float]
    device_note: str | None = None
    probes: Probes | None = None


def _schedule_recorder(out: list[tuple[tuple[str, int], ...]]) -> Callable[..., None]:
    def observe(plan: BatchPlan, start: float, end: float) -> None:
        out.append(tuple((r.request_id, n) for r, n in plan.scheduled))
    return observe


def run_validation(prep: Prepared, real: RealSetup,
                   progress: Callable[[int], None] | None = None) -> Validation:
    """The prediction (prep's cost model), then the real execution of the same workload
    and config; ``progress(num_done)`` during the real run. Raises ValueError for a bad
    setup, ImportError when torch is missing, SchedulerStuck as simulate does."""
    from calibration.executor import TorchExecutor

    pred_sched: list[tuple[tuple[str, int], ...]] = []
    meas_sched: list[tuple[tuple[str, int], ...]] = []
    t0 = time.perf_counter()
    predicted = simulate_prepared(prep, observer=_schedule_recorder(pred_sched))
    t1 = time.perf_counter()
    capacity = cache_capacity(prep)
    ex = TorchExecutor(real.spec, capacity=capacity, max_num_seqs=prep.scheduler.max_num_seqs,
                       dtype=real.dtype, device=real.device, threads=real.threads,
                       timer=real.timer, repeats=real.repeats, seed=real.seed,
                       statistic=real.statistic, probe_every_s=real.probe_every_s)
    price = prep.cost_model.step_time
    prices: list[float] = []

    def execute(plan: BatchPlan, shape: BatchShape) -> float:
        prices.append(price(shape))
        return ex(plan, shape)

    try:
        measured = simulate_prepared(prep, progress, observer=_schedule_recorder(meas_sched),
                                     executor=execute)
        if real.probe_every_s > 0:
            ex.probe()  # the device at the end of the run
    finally:
        ex.close()
    t2 = time.perf_counter()
    st = measured.steps
    assert len(st) == len(ex.timings) == len(prices)
    steps = pd.DataFrame({
        "start_time": st["start_time"].to_numpy(),
        "predicted_s": prices,
        "measured_s": [t.seconds for t in ex.timings],
        "wall_s": [t.wall_s for t in ex.timings],
        "thread_s": [t.thread_s for t in ex.timings],
        "num_seqs": st["num_seqs"].to_numpy(),
        "num_prefill_tokens": st["num_prefill_tokens"].to_numpy(),
        "num_decode_tokens": st["num_decode_tokens"].to_numpy(),
    })
    from calibration.measure import device_mismatch
    from calibration.profile import load_profile

    prof = load_profile(prep.config.profile) if prep.config.profile else None
    note = device_mismatch(prof.device_name, ex.device_name) if prof else None
    then = calibrated_seconds(prof.points, ex.probe_shape, real.statistic) if prof else None
    return Validation(predicted, measured, steps, (pred_sched, meas_sched), real, ex.timer,
                      capacity, {"predicted": t1 - t0, "measured": t2 - t1}, note,
                      Probes.taken(ex.probes, ex.probe_context, price(ex.probe_shape), then))


# -- the comparison ---------------------------------------------------------------------


def _get(summary: dict[str, Any], path: str) -> float | None:
    v: Any = summary
    for part in path.split("."):
        v = None if v is None else v.get(part)
    return None if v is None or not math.isfinite(v) else float(v)


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1, or None when either is missing or measured is 0."""
    if predicted is None or measured is None or measured == 0:
        return None
    return predicted / measured - 1.0


def error_rows(predicted: dict[str, Any], measured: dict[str, Any],
               metrics: Sequence[tuple[str, str]] = METRICS) -> list[dict[str, Any]]:
    """One row per compared metric (``metrics``: (label, summary path) pairs):
    metric, predicted, measured, error."""
    rows = []
    for label, path in metrics:
        p, m = _get(predicted, path), _get(measured, path)
        rows.append({"metric": label, "predicted": p, "measured": m,
                     "error": relative_error(p, m)})
    return rows


def step_error(predicted_s: Sequence[float], measured_s: Sequence[float]) -> dict[str, Any]:
    """The per-step time error distribution: MAPE, bias (mean signed error), percentiles
    of |error|, and the error of the summed busy time."""
    p = np.asarray(predicted_s, dtype=np.float64)
    m = np.asarray(measured_s, dtype=np.float64)
    if p.size == 0:
        return {"num_steps": 0}
    e = p / m - 1.0
    a = np.abs(e)
    return {"num_steps": int(p.size), "mape": float(a.mean()), "bias": float(e.mean()),
            "p50_abs": float(np.percentile(a, 50)), "p90_abs": float(np.percentile(a, 90)),
            "p99_abs": float(np.percentile(a, 99)), "max_abs": float(a.max()),
            "busy_time_error": float(p.sum() / m.sum() - 1.0)}


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first step whose schedule differs (or where one run ends), else None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def admission_order(requests: pd.DataFrame) -> list[str]:
    """request_ids in order of first scheduling (ties: workload order); unscheduled out."""
    r = requests[requests["first_scheduled_time"].notna()]
    return list(r.sort_values("first_scheduled_time", kind="stable")["request_id"].astype(str))


def json_floats(values: Any, digits: int = 6) -> list[float | None]:
    """``values`` for JSON: floats rounded to ``digits``, None where not finite."""
    return [None if not math.isfinite(v) else round(float(v), digits)
            for v in np.asarray(values, dtype=np.float64)]


def _request_columns(v: Validation) -> dict[str, Any]:
    p = v.predicted.requests.set_index("request_id")
    m = v.measured.requests.set_index("request_id")
    ids = list(m.index)
    p = p.reindex(ids)
    out: dict[str, Any] = {"request_id": [str(i) for i in ids],
                           "arrival_time": json_floats(m["arrival_time"])}
    for col in ("ttft_s", "tpot_s", "e2e_latency_s"):
        out[f"predicted_{col}"] = json_floats(p[col])
        out[f"measured_{col}"] = json_floats(m[col])
    return out


def validation_dict(prep: Prepared, v: Validation) -> dict[str, Any]:
    """validation.json: setup, both summaries, the error table, the step error, whether
    both runs scheduled the same, and the per-step and per-request columns."""
    from calibration.profile import load_profile

    prof = load_profile(prep.config.profile) if prep.config.profile else None
    pred_sched, meas_sched = v.schedules
    diff = first_difference(pred_sched, meas_sched)
    s = v.setup
    return {
        "format": FORMAT, "version": VERSION,
        "config": resolved_config(prep),
        "real": {"model": s.spec.name, "dtype": s.dtype, "device": s.device,
                 "threads": s.threads, "timer": v.timer, "repeats": s.repeats,
                 "statistic": s.statistic, "seed": s.seed,
                 "cache_capacity_tokens": v.capacity,
                 "profile_device_name": prof.device_name if prof else None,
                 "device_note": v.device_note},
        "wall_s": {k: round(x, 3) for k, x in v.wall_s.items()},
        "errors": error_rows(v.predicted.summary, v.measured.summary),
        "step_error": step_error(v.steps["predicted_s"], v.steps["measured_s"]),
        "device_probe": (v.probes.summary(s.probe_every_s, v.steps["predicted_s"],
                                          v.steps["measured_s"]) if v.probes else None),
        "same_schedule": diff is None, "first_different_step": diff,
        "same_admission_order": (admission_order(v.predicted.requests)
                                 == admission_order(v.measured.requests)),
        "num_steps": {"predicted": len(pred_sched), "measured": len(meas_sched)},
        "predicted": _summary(v.predicted.summary),
        "measured": _summary(v.measured.summary),
        "steps": {c: (json_floats(v.steps[c]) if v.steps[c].dtype.kind == "f"
                      else [int(x) for x in v.steps[c]]) for c in v.steps.columns},
        "requests": _request_columns(v),
        "predicted_steps": {c: json_floats(v.predicted.steps[c]) for c in (
            "start_time", "duration_s", "num_seqs")},
    }


def _summary(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: x for k, x in summary.items() if k != "replicas"}


# -- terminal output --------------------------------------------------------------------


def error_table(data: dict[str, Any], key: str = "errors",
                title: str = "simulation vs real run") -> Any:
    """The error table ``data[key]`` as a rich Table (the CLI prints it)."""
    from rich.table import Table

    t = Table(title=f"{title} (error = predicted / measured - 1)", header_style="bold")
    for c in ("metric", "predicted", "measured", "error"):
        t.add_column(c, justify="left" if c == "metric" else "right")
    for r in data[key]:
        t.add_row(r["metric"], *("-" if r[k] is None else f"{r[k]:,.3f}"
                                 for k in ("predicted", "measured")),
                  "-" if r["error"] is None else f"{r['error']:+.1%}")
    return t


def step_error_line(data: dict[str, Any]) -> str:
    """The per-step error distribution in one line."""
    e = data["step_error"]
    if not e.get("num_steps"):
        return "step time error: no steps"
    return (f"step time error over {e['num_steps']:,} steps: MAPE {e['mape']:.1%}, bias "
            f"{e['bias']:+.1%}, |error| p50 {e['p50_abs']:.1%} p90 {e['p90_abs']:.1%} "
            f"p99 {e['p99_abs']:.1%} max {e['max_abs']:.1%}; busy time "
            f"{e['busy_time_error']:+.1%}")


def schedule_line(data: dict[str, Any]) -> str:
    """Whether both runs scheduled the same requests in the same steps."""
    if data["same_schedule"]:
        return f"same schedule in both runs ({data['num_steps']['measured']:,} steps)"
    return (f"schedules differ from step {data['first_different_step']} on (step times "
            f"moved arrivals between steps); same admission order: "
            f"{'yes' if data['same_admission_order'] else 'no'}")
