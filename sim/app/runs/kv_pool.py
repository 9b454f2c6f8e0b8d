"""A run's KV pool as vLLM sizes it at start-up: the KV plan (calibration/memory.py
plan_for, with the run's batch limits and CUDA-graph settings) and the pool's blocks,
the plan's or a count given by hand (vLLM's num_gpu_blocks_override), with vLLM's
checks on each (sim/app/runs/startup_checks.py; on a profile's CPU, device.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from calibration.gpus import GPUSpec
from calibration.memory import KVCachePlan, cudagraph_bytes_for, plan_for
from calibration.specs import ModelSpec
from sim.app.runs.cudagraph_settings import run_cudagraph_config
from sim.app.runs.device import check_cpu_pool, profile_kv_cache_bytes
from sim.app.runs.run_config import RunConfig
from sim.app.runs.startup_checks import check_kv_cache_memory, check_kv_pool_fits_gpu

if TYPE_CHECKING:
    from calibration.profile import Profile

#: RunConfig's gpu_memory_utilization default (vLLM's), the one value a CPU run may have.
DEFAULT_GPU_MEMORY_UTILIZATION = RunConfig.__dataclass_fields__["gpu_memory_utilization"].default


def kv_pool(cfg: RunConfig, model: ModelSpec, gpu: GPUSpec | None, profile: Profile | None,
            tokens: int, max_model_len: int) -> tuple[KVCachePlan, int]:
    """The run's KV plan and its pool's number of blocks. ``cfg`` has its batch limits
    resolved; ``tokens`` is the step's token count that sizes the profile run
    (runner._batch_limits); ``gpu`` None: a profile's CPU, whose cache is the profile's
    unless sized by hand (ValueError for a gpu_memory_utilization other than vLLM's
    default, which applies to a GPU). The plan deducts vLLM's CUDA-graph estimate for
    the run's settings unless enforce_eager (cudagraph_settings.run_cudagraph_config)."""
    kv_bytes = cfg.kv_cache_memory_bytes
    if gpu is None and cfg.gpu_memory_utilization != DEFAULT_GPU_MEMORY_UTILIZATION:
        raise ValueError(f"gpu_memory_utilization {cfg.gpu_memory_utilization:g} applies to a "
                         f"GPU; on --profile {cfg.profile}'s CPU the KV cache is the profile's "
                         "(--kv-cache-memory or --num-gpu-blocks resizes it)")
    if gpu is None and kv_bytes is None:  # the profile's CPU: the cache it was measured with
        assert profile is not None, "a run on the CPU has a profile (run_device)"
        kv_bytes = profile_kv_cache_bytes(profile, cfg.profile)
    assert cfg.dtype is not None, "RunConfig resolves the dtype"
    assert cfg.max_num_seqs is not None and cfg.block_size is not None, "resolved"
    graphs = run_cudagraph_config(cfg)
    plan = plan_for(model, gpu, cfg.dtype, cfg.gpu_memory_utilization, tokens,
                    cfg.max_num_seqs, cfg.block_size,
                    tensor_parallel_size=cfg.tensor_parallel_size, kv_cache_memory_bytes=kv_bytes,
                    cuda_graphs=graphs is not None, cudagraph_config=graphs)
    graph_bytes = (0 if gpu is None or graphs is None
                   else cudagraph_bytes_for(model, gpu, tokens, cfg.max_num_seqs,
                                                     cfg.block_size, graphs))
    return plan, num_gpu_blocks(cfg, plan, max_model_len, gpu, graph_bytes)


def num_gpu_blocks(cfg: RunConfig, plan: KVCachePlan, max_model_len: int,
                   gpu: GPUSpec | None, cudagraph_bytes: int = 0) -> int:
    """The pool's blocks: num_gpu_blocks when given (vLLM's num_gpu_blocks_override),
    else the plan's; either must hold one request of max_model_len tokens, as vLLM checks
    the override too (startup_checks.check_kv_cache_memory), and a pool sized by hand
    must fit the GPU beside the ``cudagraph_bytes`` vLLM then captures
    (startup_checks.check_kv_pool_fits_gpu) or, on a profile's CPU (``gpu`` None, whose
    plan is the profile's cache unless sized by hand), a CPU socket
    (device.check_cpu_pool)."""

    def fits(pool_bytes: int, option: str) -> None:
        if gpu is None:
            check_cpu_pool(pool_bytes, option)
        else:
            check_kv_pool_fits_gpu(plan, pool_bytes, gpu.total_memory_bytes, option,
                                   cudagraph_bytes)

    if cfg.num_gpu_blocks is None:
        if cfg.kv_cache_memory_bytes is None:
            check_kv_cache_memory(plan, max_model_len, None, "gpu_memory_utilization"
                                  if gpu is not None else "kv_cache_memory_bytes")
            return plan.num_gpu_blocks
        fits(cfg.kv_cache_memory_bytes, "kv_cache_memory_bytes")
        check_kv_cache_memory(plan, max_model_len, None, "kv_cache_memory_bytes")
        return plan.num_gpu_blocks
    if cfg.num_gpu_blocks < 2:
        raise ValueError(f"num_gpu_blocks must be >= 2, got {cfg.num_gpu_blocks}")
    fits(cfg.num_gpu_blocks * plan.block_size * plan.kv_bytes_per_token, "num_gpu_blocks")
    check_kv_cache_memory(plan, max_model_len, cfg.num_gpu_blocks, "num_gpu_blocks")
    return cfg.num_gpu_blocks
