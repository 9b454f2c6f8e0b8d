"""The composition root for ``servesim run``: resolve one RunConfig (flags > scenario >
defaults; sim/app/runs/run_config.py), refuse what vLLM refuses at start-up
(sim/app/runs/startup_checks.py), build the workload, the KV plan, the cost model and the
policy, and simulate. The only module besides the CLI that imports all four packages."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibration.gpus import GPUSpec
from calibration.hf_config import context_limit, deployed, resolve_model
from calibration.memory import KVCachePlan
from calibration.roofline import (
    DEFAULT_MEMORY_EFFICIENCY,
    DEFAULT_PER_SEQ_OVERHEAD_S,
    DEFAULT_STEP_OVERHEAD_S,
    RooflineCostModel,
    gemm_efficiency,
)
from calibration.specs import DTYPE_BYTES, GIB, ModelSpec
from policies.registry import get_policy_class
from scenarios.build import build_workload
from scenarios.workload import Workload
from sim.app.runs.config_file import absolute_paths
from sim.app.runs.cudagraph_settings import graph_notes
from sim.app.runs.defaults import (
    UNBUDGETED_POLICIES,
    UNCHUNKED_POLICIES,
    batch_limits,
    default_prefix_cache,
)
from sim.app.runs.device import range_warnings, run_device
from sim.app.runs.kv_pool import kv_pool
from sim.app.runs.resources import check_memory
from sim.app.runs.run_arrivals import arrival_source
from sim.app.runs.run_config import MAX_REPLICAS as MAX_REPLICAS
from sim.app.runs.run_config import ROOFLINE_FIELDS, RunConfig, check_router, sample_trace
from sim.app.runs.startup_checks import check_engine, engine_platform
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel, CostModel
from sim.engine import StepExecutor, StepObserver
from sim.simulate import SimResult, simulate
from sim.source import ArrivalSource

if TYPE_CHECKING:
    from calibration.profile import MeasuredRange, Profile
    from sim.app.runs.disagg import EngineSide, PoolEngine


@dataclass
class Prepared:
    """A resolved run, ready to simulate; ``warnings``: one line each for the user (a
    profile's measured range exceeded)."""

    config: RunConfig
    scheduler: SchedulerConfig
    workload: Workload
    cost_model: CostModel
    num_gpu_blocks: int
    kv_plan: KVCachePlan | None
    cost_model_label: str
    model: ModelSpec | None = None
    warnings: tuple[str, ...] = ()
    pools: dict[str, PoolEngine] | None = None


def prepare(cfg: RunConfig) -> Prepared:
    """Resolve presets, the workload, the KV capacity and the cost model.

    Raises ValueError (one line naming the field; a Refused for what vLLM refuses at
    start-up) or FileNotFoundError on bad input.
    """
    engine, pools = _engines(cfg, memory=True)
    return _with_workload(engine, pools, _workload(engine[0]))


def prepare_on(cfg: RunConfig, w: Workload) -> Prepared:
    """prepare with its workload already built: a compare cell, one engine of its own
    (its policy's batch limits and KV plan, as a vLLM launch of its own has) on the
    workload every cell shares."""
    return _with_workload(*_engines(cfg), w)


def _with_workload(engine: _Engine, pools: dict[str, PoolEngine] | None,
                   w: Workload) -> Prepared:
    cfg, sched, num_blocks, plan, cost, label, model, measured, notes = engine
    if cfg.prefix_cache is None:
        sched = dataclasses.replace(sched, prefix_cache=prefix_cache_mode(cfg, w))
    check_router(cfg, sched.prefix_cache)  # before anything is printed or run
    pool_notes = () if pools is None else tuple(n for e in pools.values() for n in e.notes)
    return Prepared(cfg, sched, w, cost, num_blocks, plan, label, model,
                    (*notes, *pool_notes, *range_warnings(measured, cfg, sched, w)), pools)


def _engines(cfg: RunConfig, memory: bool = False
             ) -> tuple[_Engine, dict[str, PoolEngine] | None]:
    """The run's engine side (_engine) and its pools' (disagg.pool_engines), with
    check_memory on the run's config when ``memory`` (before the workload is built). A
    pool's own engine is prepare's engine side on the pool's config, its memory checked.
    Where every pool of a disaggregated run has an engine of its own
    (pools.own_pool_engines), no pool runs the run's: its KV pool is not planned, so the
    run's own batch limits and memory share refuse nothing, and it reports the decode
    pool's KV plan and blocks, as summary.json's kv_cache block does (the decode pool's):
    the KV capacity run prints, and config.json's resolved num_gpu_blocks,
    kv_capacity_tokens and kv_plan. Its CUDA-graph notes, of an engine no pool runs, are
    left out; each pool's own are its PoolEngine's. An aggregated run never imports the
    pools' modules."""
    if cfg.disagg is not None:
        from sim.app.runs.pools import own_pool_engines

        if own_pool_engines(cfg):
            pools = _pools(cfg, None)
            assert pools is not None, "a disaggregated run has pools"
            decode = pools["decode"]
            return _engine(cfg, (decode.kv_plan, decode.num_gpu_blocks)), pools
    engine = _engine(cfg)
    if memory:
        check_memory(engine[0])
    return engine, _pools(cfg, engine)


def _pools(cfg: RunConfig, e: _Engine | None) -> dict[str, PoolEngine] | None:
    """disagg.pool_engines of ``cfg``, ``e`` its run's engine side (None where no pool
    runs it); a pool's own engine is prepare's engine side on the pool's config, its
    memory checked; None for an aggregated run."""
    if cfg.disagg is None:
        return None
    from sim.app.runs.disagg import pool_engines

    def side(own: _Engine) -> EngineSide:
        return own[0], own[1], own[4], own[2], own[3], own[8]

    def engine_of(c: RunConfig) -> EngineSide:
        own = _engine(c)
        check_memory(own[0])
        return side(own)
    return pool_engines(cfg, None if e is None else side(e), engine_of)


def prefix_cache_mode(cfg: RunConfig, w: Workload) -> str:
    """The run's prefix cache: the config's, else vLLM's default for its policy, pool
    and workload (sim/app/runs/defaults.py)."""
    has_content = w.prompt_segments is not None or w.hash_ids is not None
    return cfg.prefix_cache or default_prefix_cache(cfg.policy, cfg.kv_allocation, has_content)


def check_config(cfg: RunConfig, workload: bool = True) -> RunConfig:
    """Raise what ``prepare(cfg)`` would raise on its engine side (model, GPU, policy, KV
    plan, scheduler, cost model), without simulating anything; then, when ``workload``,
    check_workload. Returns the config as prepare resolves it (a profile's model). For
    sweep and plan, which check every cell before the first run."""
    cfg = _engines(cfg)[0][0]
    if workload:
        check_workload(cfg)
    return cfg


def check_workload(cfg: RunConfig) -> Workload:
    """Raise what building ``cfg``'s workload would raise (built with at most 8
    requests; a trace is still read whole); return that workload."""
    n = cfg.num_requests
    return _workload(dataclasses.replace(cfg, num_requests=8 if n is None else min(n, 8)))


def _workload(cfg: RunConfig) -> Workload:
    return build_workload(
        trace=Path(cfg.trace) if cfg.trace else None, trace_format=cfg.trace_format,
        scenario=cfg.scenario, arrival=cfg.arrival, rate=cfg.rate,
        burstiness=cfg.burstiness, num_requests=cfg.num_requests, window_s=cfg.window,
        time_scale=cfg.time_scale, max_tokens=cfg.max_tokens, seed=cfg.seed,
        trace_sample=sample_trace(cfg), tokenizer=cfg.tokenizer,
        diurnal_amplitude=cfg.diurnal_amplitude,
    )


#: What prepare's engine side resolves (see _engine).
_Engine = tuple[RunConfig, SchedulerConfig, int, KVCachePlan, CostModel, str, ModelSpec,
                "MeasuredRange | None", tuple[str, ...]]


def _engine(cfg: RunConfig, kv: tuple[KVCachePlan, int] | None = None) -> _Engine:
    """prepare's engine side: the config (with absolute file paths, vLLM's batch limits
    where unset and the roofline's constants when it prices the run), scheduler config,
    number of GPU blocks, KV plan and cost model with its label, the model's spec as
    deployed (quantization, KV cache dtype), the profile's measured range (None
    without one) and what vLLM would warn of the CUDA graphs
    (cudagraph_settings.graph_notes). vLLM's start-up checks come first
    (sim/app/runs/startup_checks.py). ``kv``: the KV plan and number of blocks to report
    instead of planning the KV pool (kv_pool.kv_pool) and its CUDA-graph notes, for the
    run-level engine of a disaggregated run that no pool runs (_engines)."""
    assert cfg.model is not None and cfg.gpu is not None, "RunConfig resolves them"
    cfg = dataclasses.replace(cfg, **absolute_paths(cfg.trace, cfg.profile, cfg.policy,
                                                    cfg.model, cfg.gpu))
    profile = _load_profile(cfg.profile) if cfg.profile is not None else None
    cfg, model = _model_spec(cfg, profile)
    assert cfg.model is not None and cfg.gpu is not None, "RunConfig resolves them"
    limit = None if profile is not None else context_limit(cfg.model)  # a profile has none
    model = deployed(model, cfg.quantization, cfg.kv_cache_dtype)
    gpu = run_device(cfg.gpu, profile, cfg.profile)
    get_policy_class(cfg.policy)
    max_model_len = (model.max_position_embeddings if cfg.max_model_len is None
                     else cfg.max_model_len)
    cfg, tokens = _batch_limits(cfg, gpu, max_model_len)
    assert cfg.max_num_seqs is not None
    assert cfg.block_size is not None, "RunConfig resolves the block size"
    check_engine(model=model, policy=cfg.policy, chunked=cfg.policy not in UNCHUNKED_POLICIES,
                 max_model_len=max_model_len,
                 allow_long_max_model_len=cfg.allow_long_max_model_len,
                 tensor_parallel_size=cfg.tensor_parallel_size, block_size=cfg.block_size,
                 platform=engine_platform(cfg.step_time, profile),
                 max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                 long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                 context_limit=limit)
    plan, num_blocks = kv or kv_pool(cfg, model, gpu, profile, tokens, max_model_len)
    sched = _scheduler_config(cfg, model, max_model_len, tokens)
    cfg, cost, label = _cost_model(cfg, model, gpu, profile)
    measured = None if profile is None else profile.measured_range
    notes = () if kv is not None else graph_notes(cfg, model, gpu)
    return cfg, sched, num_blocks, plan, cost, label, model, measured, notes


def _batch_limits(cfg: RunConfig, gpu: GPUSpec | None,
                  max_model_len: int) -> tuple[RunConfig, int]:
    """``cfg`` with vLLM's batch limits where unset (sim/app/runs/defaults.py), and the
    step's token count: the budget, or for a policy without one (static) the tokens
    vLLM's profile run would take, which size the KV cache and are not recorded."""
    lim = batch_limits(gpu, cfg.policy, max_model_len, cfg.max_num_seqs,
                       cfg.max_num_batched_tokens, cfg.performance_mode == "throughput")
    budget = None if cfg.policy in UNBUDGETED_POLICIES else lim.max_num_batched_tokens
    return (dataclasses.replace(cfg, max_num_seqs=lim.max_num_seqs,
                                max_num_batched_tokens=budget), lim.max_num_batched_tokens)


def _scheduler_config(cfg: RunConfig, model: ModelSpec, max_model_len: int,
                      tokens: int) -> SchedulerConfig:
    """What the policy knows; ``tokens`` is the step's token count (_batch_limits)."""
    assert cfg.dtype is not None, "RunConfig resolves the dtype"
    assert cfg.max_num_seqs is not None
    assert cfg.block_size is not None, "RunConfig resolves the block size"
    return SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=tokens,
        max_model_len=max_model_len,
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        scheduler_reserve_full_isl=cfg.scheduler_reserve_full_isl,
        queue=cfg.queue, preemption_mode=cfg.preemption_mode, kv_allocation=cfg.kv_allocation,
        kv_bytes_per_block=model.kv_bytes_per_token(
            DTYPE_BYTES[cfg.dtype], cfg.tensor_parallel_size) * cfg.block_size,
        swap_space_bytes=int(cfg.swap_space * GIB),
        pcie_bandwidth_bytes_per_s=cfg.pcie_bandwidth * 1e9,
        prefix_cache=cfg.prefix_cache or "none",
    )


def _load_profile(path: str) -> Profile:
    from calibration.profile import load_profile

    return load_profile(path)


def _model_spec(cfg: RunConfig, profile: Profile | None) -> tuple[RunConfig, ModelSpec]:
    """The model's spec, and ``cfg`` naming it. A profile prices steps of the model it
    measured, so that model also sizes the KV cache; a ``model`` that is another model is
    refused (ValueError naming --model and --profile), and so are a ``dtype`` other than
    the profile's, a quantization and a KV-cache dtype (its steps were measured in the
    profile's dtype, unquantized)."""
    assert cfg.model is not None, "RunConfig resolves the model"
    if profile is None:
        return cfg, resolve_model(cfg.model)
    for flag, value in (("--quantization", cfg.quantization),
                        ("--kv-cache-dtype", None if cfg.kv_cache_dtype == "auto"
                         else cfg.kv_cache_dtype)):
        if value is not None:
            raise ValueError(f"{flag} {value} conflicts with --profile {cfg.profile}: its "
                             "step costs were measured without it (calibrate a profile "
                             "with it, or use the roofline model)")
    if cfg.dtype != profile.dtype:
        raise ValueError(f"--dtype {cfg.dtype} conflicts with --profile {cfg.profile}, "
                         f"measured in {profile.dtype} (its step costs and KV bytes are "
                         f"that dtype's): give --dtype {profile.dtype} or no --dtype")
    spec = ModelSpec(**profile.model)
    if cfg.model == spec.name:
        return cfg, spec
    try:
        same = resolve_model(cfg.model).name == spec.name
    except ValueError:
        same = False
    if not same:
        raise ValueError(f"--model {cfg.model} conflicts with --profile {cfg.profile}, a "
                         f"profile of {spec.name} (it prices that model's steps and sizes "
                         f"its KV cache): give --model {spec.name} or no --model")
    return dataclasses.replace(cfg, model=spec.name), spec


def _cost_model(cfg: RunConfig, model: ModelSpec, gpu: GPUSpec | None,
                profile: Profile | None) -> tuple[RunConfig, CostModel, str]:
    """The run's cost model and its label, and ``cfg`` with the roofline's constants
    when the roofline prices it (a constant step time or a profile takes none)."""
    if cfg.step_time is not None:
        return cfg, ConstantCostModel(cfg.step_time), f"constant {cfg.step_time} s per step"
    if profile is not None:
        if cfg.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size must be 1 with a profile: calibrated "
                             "profiles are measured on one GPU (use the roofline model)")
        from calibration.profile import ProfileCostModel

        return cfg, ProfileCostModel(profile), (
            f"profile {cfg.profile} ({profile.model.get('name')} on {profile.device_name}, "
            f"{profile.dtype})")
    assert gpu is not None, "only a profile runs on the CPU (run_device)"
    assert cfg.dtype is not None, "RunConfig resolves the dtype"
    tp = cfg.tensor_parallel_size
    rl = RooflineCostModel(
        model, gpu, cfg.dtype, tensor_parallel_size=tp,
        compute_efficiency=_given(cfg.roofline_compute_efficiency, gemm_efficiency(gpu)),
        memory_efficiency=_given(cfg.roofline_memory_efficiency, DEFAULT_MEMORY_EFFICIENCY),
        step_overhead_s=_given(cfg.roofline_step_overhead_s, DEFAULT_STEP_OVERHEAD_S),
        per_seq_overhead_s=_given(cfg.roofline_per_seq_overhead_s, DEFAULT_PER_SEQ_OVERHEAD_S))
    cfg = dataclasses.replace(cfg, **{f: getattr(rl, a) for f, a in ROOFLINE_FIELDS.items()})
    return cfg, rl, f"roofline {model.name} on {gpu.name} ({cfg.dtype}" + (
        f", TP {tp})" if tp > 1 else ")")


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


def simulate_prepared(
    prep: Prepared, progress: Callable[[int], None] | None = None,
    observer: StepObserver | None = None, executor: StepExecutor | None = None,
    fast_path: bool = True,
) -> SimResult:
    """Run the engine over the prepared workload; ``progress(num_done)`` is called about
    100 times over the arrival span; ``observer`` after every step (StepObserver: the slot
    diagram); ``executor`` runs and times every step for real instead of the cost model
    (StepExecutor: validation); ``fast_path`` False: the step-by-step reference."""
    w, cfg = prep.workload, prep.config
    if cfg.disagg is not None:
        from sim.app.runs.disagg import simulate_disagg_prepared

        return simulate_disagg_prepared(prep, progress, fast_path, observer or executor)
    arrivals, common = engine_args(prep, progress)
    if cfg.replicas > 1:
        if observer is not None or executor is not None:
            raise ValueError("a step observer (slot diagram) or executor (validation) needs "
                             "replicas 1")
        from policies.routers import make_router
        from sim.app.runs.prompt_content import workload_segments
        from sim.cluster import simulate_cluster

        router = make_router(cfg.router, prompt_segments=workload_segments(w))
        # (RunConfig checked it is integral; a sweep may hand it as a numpy int)
        return simulate_cluster(arrivals, num_replicas=int(cfg.replicas), router=router,
                                fast_path=fast_path, **common)
    result = simulate(arrivals, observer=observer, executor=executor, fast_path=fast_path,
                      **common)
    result.summary["replicas"] = [{"replica": 0, "num_routed": len(w), **result.summary}]
    return result


def engine_args(prep: Prepared, progress: Callable[[int], None] | None = None
                ) -> tuple[ArrivalSource, dict[str, Any]]:
    """The run's arrival source and the arguments of simulate every engine shares."""
    w, cfg = prep.workload, prep.config
    check_router(cfg, prep.scheduler.prefix_cache)
    arrivals, on_release = arrival_source(w, cfg, prep.scheduler.prefix_cache)
    span = float(w.arrival_time[-1] - w.arrival_time[0]) if len(w) else 0.0
    return arrivals, dict(
        policy_factory=get_policy_class(cfg.policy), config=prep.scheduler,
        cost_model=prep.cost_model, num_gpu_blocks=prep.num_gpu_blocks,
        block_size=cfg.block_size, slo_ttft_s=cfg.slo_ttft, slo_tpot_s=cfg.slo_tpot,
        progress=progress, on_release=on_release,
        slice_s=span / 100 if span > 0 and cfg.concurrency is None else math.inf)
