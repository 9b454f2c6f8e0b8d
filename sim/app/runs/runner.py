"""The composition root for ``servesim run``: resolve one RunConfig (flags > scenario >
defaults), build the workload, the KV plan, the cost model and the policy, simulate, and
write the run directory whole or not at all. The only module besides the CLI that imports
all four packages."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.gpus import get_gpu
from calibration.hf_config import deployed, resolve_model
from calibration.memory import KVCachePlan, check_max_model_len, plan_for
from calibration.quantization import check_kv_cache_dtype, check_quantization_name
from calibration.roofline import RooflineCostModel
from calibration.specs import DTYPE_BYTES, GIB, ModelSpec
from policies.registry import get_policy_class
from policies.routers import ROUTERS, check_prefix_cache, make_router
from scenarios.build import build_workload
from scenarios.workload import Workload
from sim.app.runs.config_file import absolute_paths
from sim.app.runs.defaults import batch_limits, default_prefix_cache
from sim.app.runs.prompt_content import prompt_content, workload_segments
from sim.config import PREFIX_CACHE_MODES, SchedulerConfig
from sim.cost_model import ConstantCostModel, CostModel
from sim.engine import ReleaseHook, StepExecutor, StepObserver
from sim.simulate import SimResult, simulate
from sim.source import ArrivalSource, ClosedLoopArrivals, ColumnArrivals

#: Host <-> GPU copy rate for swap preemption, GB/s: PCIe 4.0 x16 is 16 GT/s x 16 lanes
#: with 128b/130b encoding = 31.5 GB/s a direction (PCI-SIG PCIe 4.0 base specification);
#: about 25 GB/s is what pinned-memory copies reach in practice (CUDA bandwidthTest).
PCIE_BANDWIDTH_GB_S = 25.0


@dataclass(frozen=True)
class RunConfig:
    """Everything a run depends on; written to config.json. None means "derive":
    max_num_seqs and max_num_batched_tokens as vLLM's API server sets them for the GPU,
    prefix_cache as vLLM does (sim/app/runs/defaults.py)."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100-sxm"
    dtype: str = "bf16"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    policy: str = "chunked"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_model_len: int | None = None
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    max_tokens: int | None = None
    step_time: float | None = None
    profile: str | None = None
    trace: str | None = None
    trace_format: str | None = None
    scenario: str | None = None
    arrival: str | None = None
    rate: float | None = None
    burstiness: float | None = None
    num_requests: int | None = None
    window: float | None = None
    time_scale: float | None = None
    seed: int = 0
    slo_ttft: float | None = None
    slo_tpot: float | None = None
    queue: str = "fcfs"
    preemption_mode: str = "recompute"
    kv_allocation: str = "paged"
    swap_space: float = 4.0
    pcie_bandwidth: float = PCIE_BANDWIDTH_GB_S
    tensor_parallel_size: int = 1
    replicas: int = 1
    router: str = "round-robin"
    concurrency: int | None = None
    think_time: float = 0.0
    trace_sample: bool = False
    prefix_cache: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        check_quantization_name(self.quantization)
        check_kv_cache_dtype(self.kv_cache_dtype)
        if not (self.swap_space >= 0 and math.isfinite(self.swap_space)):
            raise ValueError(f"swap_space must be a finite number >= 0 GiB, got {self.swap_space}")
        if not (self.pcie_bandwidth > 0 and math.isfinite(self.pcie_bandwidth)):
            raise ValueError(f"pcie_bandwidth must be a finite number > 0 GB/s, got "
                             f"{self.pcie_bandwidth}")
        for name in ("step_time", "slo_ttft", "slo_tpot"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number > 0 seconds, got {v}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.trace is not None and not str(self.trace).strip():
            raise ValueError("trace must name a file, got an empty string")
        _check_scale_out(self)
        _check_prefix_cache(self)


def _check_prefix_cache(cfg: RunConfig) -> None:
    """Validate prefix_cache against the policy (the scheduler config checks the queue
    and the KV allocation)."""
    if cfg.prefix_cache is None:
        return
    if cfg.prefix_cache not in PREFIX_CACHE_MODES:
        raise ValueError(f"prefix_cache must be one of {', '.join(PREFIX_CACHE_MODES)}, "
                         f"got {cfg.prefix_cache!r}")
    if cfg.prefix_cache == "none":
        return
    if cfg.policy == "static":
        raise ValueError("prefix_cache applies to iteration-level policies (chunked, "
                         "continuous): static batching pads and computes every prompt")


def check_router(cfg: RunConfig, prefix_cache: str | None = None) -> None:
    """Raise ValueError when the router needs what the run lacks: ``cache-aware`` routes
    by the replicas' prefix caches. Checked where a run's final config is known (a
    compare cell or a sweep cell may bring the cache), not in RunConfig itself; the rule
    is the router's (policies/routers.py check_prefix_cache, which its start applies).
    ``prefix_cache`` is the run's mode where known (its scheduler's), else the config's;
    a default (None) is decided with the workload (prepare), so it passes here."""
    mode = prefix_cache or cfg.prefix_cache
    if mode is not None:
        check_prefix_cache(cfg.router, mode != "none")


#: Most replicas one run simulates (each has its own engine, pool and records in memory).
MAX_REPLICAS = 1024


def _check_scale_out(cfg: RunConfig) -> None:
    """Validate the tensor-parallel, replica, router and closed-loop fields."""
    for name in ("tensor_parallel_size", "replicas"):
        v = getattr(cfg, name)
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if cfg.replicas > MAX_REPLICAS:
        raise ValueError(f"replicas must be at most {MAX_REPLICAS} (every replica is "
                         f"simulated in this process, about 1 MB each), got {cfg.replicas}")
    if cfg.router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {cfg.router!r}")
    if cfg.concurrency is not None:
        if int(cfg.concurrency) != cfg.concurrency or cfg.concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {cfg.concurrency!r}")
        if cfg.rate is not None:
            raise ValueError("give rate (open loop) or concurrency (closed loop), not both")
        for name in ("arrival", "burstiness", "time_scale"):
            if getattr(cfg, name) is not None:
                raise ValueError(f"{name} shapes open-loop arrivals; closed-loop users "
                                 "(concurrency) send when their previous request ends")
    if not (cfg.think_time >= 0 and math.isfinite(cfg.think_time)):
        raise ValueError(f"think_time must be a finite number >= 0 seconds, got "
                         f"{cfg.think_time}")
    if cfg.think_time > 0 and cfg.concurrency is None:
        raise ValueError("think_time applies only to closed-loop clients (concurrency)")


@dataclass
class Prepared:
    """A resolved run, ready to simulate."""

    config: RunConfig
    scheduler: SchedulerConfig
    workload: Workload
    cost_model: CostModel
    num_gpu_blocks: int
    kv_plan: KVCachePlan | None
    cost_model_label: str
    model: ModelSpec | None = None


def prepare(cfg: RunConfig) -> Prepared:
    """Resolve presets, the workload, the KV capacity and the cost model.

    Raises ValueError (one line naming the field) or FileNotFoundError on bad input.
    """
    cfg, sched, num_blocks, plan, cost, label, model = _engine(cfg)
    w = _workload(cfg)
    if cfg.prefix_cache is None:
        sched = dataclasses.replace(sched, prefix_cache=prefix_cache_mode(cfg, w))
    check_router(cfg, sched.prefix_cache)  # before anything is printed or run
    return Prepared(cfg, sched, w, cost, num_blocks, plan, label, model)


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
    cfg = _engine(cfg)[0]
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
        trace_sample=cfg.trace_sample,
    )


def _engine(cfg: RunConfig) -> tuple[RunConfig, SchedulerConfig, int, KVCachePlan,
                                     CostModel, str, ModelSpec]:
    """prepare's engine side: the config (with a profile's model, absolute file paths
    and vLLM's batch limits where unset), scheduler config, number of GPU blocks, KV plan
    and cost model with its label, and the model's spec as deployed (quantization, KV
    cache dtype)."""
    cfg = dataclasses.replace(cfg, **absolute_paths(cfg.trace, cfg.profile, cfg.policy,
                                                    cfg.model, cfg.gpu))
    if cfg.profile is not None:
        cfg, model = _with_profile_model(cfg)
    else:
        model = resolve_model(cfg.model)
    model = deployed(model, cfg.quantization, cfg.kv_cache_dtype)
    gpu = get_gpu(cfg.gpu)
    get_policy_class(cfg.policy)
    max_model_len = (model.max_position_embeddings if cfg.max_model_len is None
                     else cfg.max_model_len)
    if cfg.max_num_seqs is None or cfg.max_num_batched_tokens is None:
        lim = batch_limits(gpu, cfg.policy, max_model_len, cfg.max_num_seqs,
                           cfg.max_num_batched_tokens)
        cfg = dataclasses.replace(cfg, max_num_seqs=lim.max_num_seqs,
                                  max_num_batched_tokens=lim.max_num_batched_tokens)
    assert cfg.max_num_seqs is not None and cfg.max_num_batched_tokens is not None
    plan = plan_for(model, gpu, cfg.dtype, cfg.gpu_memory_utilization,
                    cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.block_size,
                    tensor_parallel_size=cfg.tensor_parallel_size,
                    kv_cache_memory_bytes=cfg.kv_cache_memory_bytes)
    if cfg.num_gpu_blocks is not None:
        num_blocks = cfg.num_gpu_blocks
        if num_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2, got {num_blocks}")
        # vLLM would refuse to start when max_model_len exceeds the pool; a simulator keeps
        # going and rejects each request that can never fit, with its reason.
    else:
        num_blocks = plan.num_gpu_blocks
        check_max_model_len(plan, max_model_len)
    sched = SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
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
    cost, label = _cost_model(cfg, model, gpu)
    return cfg, sched, num_blocks, plan, cost, label, model


def _with_profile_model(cfg: RunConfig) -> tuple[RunConfig, ModelSpec]:
    """A profile prices steps of the model it measured, so that model also sizes the KV
    cache: ``model`` becomes the profile's model name, and its spec is the one the
    profile records (a preset's, or a config.json's that no preset names)."""
    from calibration.profile import load_profile

    assert cfg.profile is not None
    spec = ModelSpec(**load_profile(cfg.profile).model)
    return (dataclasses.replace(cfg, model=spec.name) if spec.name != cfg.model else cfg), spec


def _cost_model(cfg: RunConfig, model: Any, gpu: Any) -> tuple[CostModel, str]:
    if cfg.step_time is not None:
        return ConstantCostModel(cfg.step_time), f"constant {cfg.step_time} s per step"
    if cfg.profile is not None:
        if cfg.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size must be 1 with a profile: calibrated "
                             "profiles are measured on one GPU (use the roofline model)")
        from calibration.profile import ProfileCostModel, load_profile

        prof = load_profile(cfg.profile)
        return ProfileCostModel(prof), (f"profile {cfg.profile} ({prof.model.get('name')} "
                                        f"on {prof.device_name}, {prof.dtype})")
    tp = cfg.tensor_parallel_size
    rl = RooflineCostModel(model, gpu, cfg.dtype, tensor_parallel_size=tp)
    return rl, f"roofline {model.name} on {gpu.name} ({cfg.dtype}" + (
        f", TP {tp})" if tp > 1 else ")")


def simulate_prepared(
    prep: Prepared, progress: Callable[[int], None] | None = None,
    observer: StepObserver | None = None, executor: StepExecutor | None = None,
    fast_path: bool = True,
) -> SimResult:
    """Run the engine over the prepared workload; ``progress(num_done)`` is called about
    100 times over the workload's arrival span; ``observer`` after every step (see
    sim.engine.StepObserver; the slot diagram uses it); ``executor`` runs every step for
    real and times it instead of the cost model (sim.engine.StepExecutor; validation);
    ``fast_path`` False runs the step-by-step reference (sim/fastpath.py)."""
    w, cfg = prep.workload, prep.config
    check_router(cfg, prep.scheduler.prefix_cache)
    arrivals, on_release = arrival_source(prep)
    span = float(w.arrival_time[-1] - w.arrival_time[0]) if len(w) else 0.0
    common: dict[str, Any] = dict(
        policy_factory=get_policy_class(cfg.policy), config=prep.scheduler,
        cost_model=prep.cost_model, num_gpu_blocks=prep.num_gpu_blocks,
        block_size=cfg.block_size, slo_ttft_s=cfg.slo_ttft, slo_tpot_s=cfg.slo_tpot,
        progress=progress, on_release=on_release,
        slice_s=span / 100 if span > 0 and cfg.concurrency is None else math.inf,
    )
    if cfg.replicas > 1:
        if observer is not None or executor is not None:
            raise ValueError("a step observer (slot diagram) or executor (validation) needs "
                             "replicas 1")
        from sim.cluster import simulate_cluster

        router = make_router(cfg.router, prompt_segments=workload_segments(w))
        return simulate_cluster(arrivals, num_replicas=cfg.replicas, router=router,
                                fast_path=fast_path, **common)
    result = simulate(arrivals, observer=observer, executor=executor, fast_path=fast_path,
                      **common)
    result.summary["replicas"] = [{"replica": 0, "num_routed": len(w), **result.summary}]
    return result


def arrival_source(prep: Prepared) -> tuple[ArrivalSource, ReleaseHook | None]:
    """The run's arrival source and the release hook it needs: the workload's own
    arrivals (open loop), or closed-loop users over its rows (``concurrency``)."""
    w, cfg = prep.workload, prep.config
    content = (prompt_content(w, cfg.block_size, cfg.replicas)
               if prep.scheduler.prefix_cache != "none" else None)
    if cfg.concurrency is None:
        return ColumnArrivals(w.arrival_time, w.num_prompt_tokens, w.output_len,
                              w.max_tokens, w.priority, w.request_id, content), None
    src = ClosedLoopArrivals(w.num_prompt_tokens, w.output_len, w.max_tokens,
                             cfg.concurrency, cfg.think_time, w.priority, w.request_id,
                             content)
    return src, src.release
