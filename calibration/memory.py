"""KV-cache capacity planning as vLLM's GPU worker does it at start-up: the memory left for
the KV cache after weights, the profile run's activation peak and non-torch memory, cut into
blocks. Owns KVCachePlan, the activation-peak estimate, the non-torch default and the
max_model_len check.

The accounting follows vLLM V1's Worker.determine_available_memory (vllm/v1/worker/
gpu_worker.py) and memory_profiling (vllm/utils/mem_utils.py) as of vLLM 0.19-0.20:

    requested  = ceil(total_gpu_memory * gpu_memory_utilization)   # total as torch reports it
    kv_bytes   = requested - weights - activation peak - non_torch
    num_gpu_blocks = kv_bytes // (block_size * kv_bytes_per_token)

weights include the rotary cos/sin cache vLLM builds at load time; the activation peak is
that of profile_run (a dummy forward of max_num_batched_tokens tokens, then the dummy
sampler over max_num_seqs rows). From vLLM 0.21 the KV cache also gives up vLLM's estimate
of the CUDA graphs' memory (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, "default since
v0.21.0" in vLLM 0.32's gpu_worker.py; calibration/cuda_graphs.py); through 0.20, or with
--enforce-eager, nothing is deducted for them (plan_for's ``cuda_graphs``). vLLM 0.32
counts the profile's consumption as the drop in free memory plus the transient peak
(vllm/utils/mem_utils.py), the same sum as 0.19's weights + peak + non-torch increase.
``kv_cache_memory_bytes`` (vLLM's --kv-cache-memory) replaces the whole computation, as
vLLM's does.

All sizes in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from calibration.attention_backends import full_cudagraph_support
from calibration.cuda_graphs import CudaGraphConfig, cudagraph_memory_bytes, max_capture_size
from calibration.gpus import GPUSpec
from calibration.specs import DTYPE_BYTES, GIB, ModelSpec

NON_TORCH_BYTES_TP1: int = round(0.25 * GIB)
"""Memory a single-GPU vLLM worker's profile run adds outside PyTorch's allocator (cuBLAS
workspaces, NCCL's and Triton's own allocations), which vLLM deducts from the KV cache: the
"non-torch forward increase memory" of vLLM 0.19.0's H100 start-up logs is 0.24-0.27 GiB in
39 of 42 runs at tensor_parallel_size 1 (llm-d-incubation/llm-d-planner
accuracy/results/v0.19.0/logs at commit d3121e0; the three Granite runs show 0.46). Older V0
engines held more (0.35 GiB on an RTX 3090, vllm-project/vllm#10517)."""

NON_TORCH_BYTES_TP: int = round(0.54 * GIB)
"""The same per GPU of a tensor-parallel group on a GPU whose spec carries no measured figure
(GPUSpec.tp_non_torch_bytes): about 0.54 GiB at tensor_parallel_size 2 in vLLM 0.11 logs
(issue 19's survey), which also fits a PCIe RTX PRO 6000 pair under vLLM 0.28. NVSwitch H100s
hold about 2.1 GiB (calibration/data/gpus.json, tp_non_torch_source)."""

SAMPLER_FP32_BYTES_PER_LOGIT = 12.6
"""Bytes the dummy sampler run holds per vocabulary entry per sampled row at its peak beyond
the LM head's output (which takes the model dtype's bytes): the fp32 logits, the fp32
probabilities and the fp32 exponential noise of the random sample, 12 bytes, with vLLM's
Triton top-k/top-p kernel masking the logits in place (vllm/v1/sample/ops/topk_topp_sampler.py;
Triton kernel from vllm-project/vllm#33538, used for batches of 8 rows and more, where the
sort-based path it replaced held about 37 bytes an entry). Fitted as 12.6 + 2 = 14.6 bytes in
bf16 with SAMPLER_HIDDEN_COPIES to the "torch peak memory increase" of 11 dense vLLM 0.19.0
H100 start-up logs at max_num_seqs 1,024 and 8,192 batched tokens (vocabularies of 100k to
256k entries, hidden sizes 2,304 to 8,192; llm-d-incubation/llm-d-planner
accuracy/results/v0.19.0/logs at commit d3121e0): residuals within 0.03 GiB but for
Mistral-Small-24B (-0.08). The fp32 Llama-3.1-8B run (2.21 GiB against 1.89 in bf16) checks the
dtype term."""

SAMPLER_HIDDEN_COPIES = 1.5
"""Copies of the profile run's max_num_batched_tokens x hidden_size hidden states (model dtype)
alive beside the sampler at its peak, fitted with SAMPLER_FP32_BYTES_PER_LOGIT."""


def sampler_bytes_per_logit(dtype_bytes: int) -> float:
    """Bytes the dummy sampler run holds per vocabulary entry per sampled row:
    dtype_bytes (the LM head's output) + SAMPLER_FP32_BYTES_PER_LOGIT; 14.6 in bf16."""
    return dtype_bytes + SAMPLER_FP32_BYTES_PER_LOGIT


def default_non_torch_bytes(tensor_parallel_size: int = 1, gpu: GPUSpec | None = None) -> int:
    """The GPU spec's own figure where it has one (GPUSpec.non_torch_bytes at
    tensor_parallel_size 1, tp_non_torch_bytes above it), else NON_TORCH_BYTES_TP1 or
    NON_TORCH_BYTES_TP."""
    if tensor_parallel_size <= 1:
        own, default = (gpu.non_torch_bytes if gpu else None), NON_TORCH_BYTES_TP1
    else:
        own, default = (gpu.tp_non_torch_bytes if gpu else None), NON_TORCH_BYTES_TP
    return default if own is None else own


def rope_cache_bytes(model: ModelSpec, dtype_bytes: int) -> int:
    """vLLM's rotary cos/sin cache, built at load time and counted in its "model weights"
    figure: max_position_embeddings x head_dim values in the model dtype, on every GPU
    (vllm/model_executor/layers/rotary_embedding). Llama-3.1-8B bf16: 131,072 x 128 x 2 =
    32 MiB, the difference between vLLM's logged 14.99 GiB of weights and 14.96 of params."""
    return model.max_position_embeddings * model.head_dim * dtype_bytes


def activation_peak_bytes(
    model: ModelSpec,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dtype_bytes: int,
    tensor_parallel_size: int = 1,
) -> int:
    """Estimated activation peak of vLLM's profile run (a forward pass of
    max_num_batched_tokens tokens, then the sampler on max_num_seqs rows), per GPU.

    The forward peak sits in the MLP at the down projection, where the layer input, the
    residual and the down output (3 * hidden) are alive with gate_up (2 * I) and the activated
    product (I) for each of the k experts a token uses (I: a routed expert's width in MoE
    layers, the dense width elsewhere; the larger of the two layer kinds counts); MoE adds
    k * hidden for the fused-MoE output buffer and fp32 router logits (4 * E). The sampler's
    peak holds SAMPLER_HIDDEN_COPIES of the hidden states and, per sampled row and vocabulary
    entry, sampler_bytes_per_logit(dtype) bytes (the logits over the whole vocabulary on every
    GPU of the group); a MoE model's fused-MoE workspace (k * (3I / N + hidden) a token) stays
    allocated through it, as the fused-MoE kernels keep their workspace between calls. The two
    phases do not overlap:

        forward = T * (dtype * (3h + k * 3I / N + [MoE] k * h) + [MoE] 4E)   (k = 1 dense)
        sampler = [MoE] T * dtype * k * (3I / N + h) + 1.5 * T * h * dtype
                  + S * V * (dtype + 12.6)
        peak    = max(forward, sampler)

    T = max_num_batched_tokens, S = max_num_seqs, N = tensor_parallel_size (the MLP is
    sharded N ways). Checks: Llama-3.1-8B bf16, T = 20,000 gives 2.06 GiB, T = 29,000 gives
    2.99 GiB, vLLM 0.6.4 measured 2.07 and 2.99 GiB (vllm#10517: peak_torch_memory 17.06 and
    17.98 GiB minus 14.99 GiB of weights); at T = 8,192 and S = 1,024 it gives 1.88 GiB and
    vLLM 0.19.0 measured 1.89, Qwen3-30B-A3B 2.69 against 2.68 (llm-d-planner's H100 logs,
    SAMPLER_FP32_BYTES_PER_LOGIT). Raises ValueError naming a non-positive argument.
    """
    if max_num_batched_tokens < 1:
        raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    if dtype_bytes < 1:
        raise ValueError(f"dtype_bytes must be >= 1, got {dtype_bytes}")
    model.check_tensor_parallel(tensor_parallel_size)
    h, n = model.hidden_size, tensor_parallel_size
    per_token = 0
    if model.num_moe_layers < model.num_layers:  # dense MLP layers
        per_token = dtype_bytes * (3 * h + 3 * model.intermediate_size // n)
    moe_workspace = 0
    if model.num_moe_layers:
        k = model.num_experts_per_tok
        routed = 3 * k * model.expert_intermediate_size // n + k * h
        per_token = max(per_token,
                        dtype_bytes * (3 * h + routed) + 4 * model.num_experts)
        moe_workspace = max_num_batched_tokens * dtype_bytes * routed
    forward = max_num_batched_tokens * per_token
    sampler = (moe_workspace
               + SAMPLER_HIDDEN_COPIES * max_num_batched_tokens * h * dtype_bytes
               + max_num_seqs * model.vocab_size * sampler_bytes_per_logit(dtype_bytes))
    return max(forward, math.ceil(sampler))


@dataclass(frozen=True, slots=True)
class KVCachePlan:
    """The KV-cache budget of one GPU (bytes, blocks, tokens).

    requested_bytes = ceil(total * gpu_memory_utilization); kv_bytes = requested_bytes -
    weights_bytes - activation_bytes - non_torch_bytes - cudagraph_bytes; num_gpu_blocks =
    kv_bytes // (block_size * kv_bytes_per_token); kv_capacity_tokens = num_gpu_blocks *
    block_size. cudagraph_bytes: vLLM's CUDA-graph estimate where it deducts one (0 with
    --enforce-eager, before vLLM 0.21, or on a CPU).
    """

    num_gpu_blocks: int
    block_size: int
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    kv_bytes: int
    cudagraph_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        """Weights plus activation peak: vLLM's peak torch memory of the profile run."""
        return self.weights_bytes + self.activation_bytes

    def max_concurrency(self, max_model_len: int) -> float:
        """How many requests of max_model_len tokens fit at once (vLLM's "Maximum
        concurrency for N tokens per request"): kv_capacity_tokens / max_model_len."""
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        return self.kv_capacity_tokens / max_model_len


def plan_kv_cache(
    total_gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    peak_memory_bytes: int,
    non_torch_bytes: int,
    kv_bytes_per_token: int,
    block_size: int,
    *,
    weights_bytes: int = 0,
    cudagraph_bytes: int = 0,
) -> KVCachePlan:
    """Cut the memory left after the profile run's peak into KV blocks.

    peak_memory_bytes: weights + activation peak; weights_bytes: the part of it that is
    weights, when known (it only splits the peak in the plan's fields; 0 puts all of it under
    activation_bytes); cudagraph_bytes: the CUDA graphs' estimate vLLM >= 0.21 deducts
    (calibration/cuda_graphs.py), 0 where none is. Raises ValueError naming the field for
    gpu_memory_utilization outside (0, 1] or a non-positive size, and one line naming
    gpu_memory_utilization with the numbers in GiB when not even one block fits.
    """
    _check_plan_args(total_gpu_memory_bytes, gpu_memory_utilization, peak_memory_bytes,
                     non_torch_bytes, kv_bytes_per_token, block_size, weights_bytes)
    if cudagraph_bytes < 0:
        raise ValueError(f"cudagraph_bytes must be >= 0, got {cudagraph_bytes}")
    # vLLM rounds the request up (request_memory in vllm/v1/worker/utils.py).
    requested = math.ceil(total_gpu_memory_bytes * gpu_memory_utilization)
    kv_bytes = requested - peak_memory_bytes - non_torch_bytes - cudagraph_bytes
    num_gpu_blocks = max(kv_bytes, 0) // (block_size * kv_bytes_per_token)
    if num_gpu_blocks < 1:
        raise ValueError(
            f"gpu_memory_utilization {gpu_memory_utilization} leaves no room for the KV cache: "
            f"{requested / GIB:.2f} GiB requested of {total_gpu_memory_bytes / GIB:.2f} GiB, "
            f"weights + activations take {peak_memory_bytes / GIB:.2f} GiB, non-torch "
            f"memory {non_torch_bytes / GIB:.2f} GiB"
            + (f" and CUDA graphs {cudagraph_bytes / GIB:.2f} GiB" if cudagraph_bytes else "")
            + f", leaving {kv_bytes / GIB:.2f} GiB "
            f"(one block needs {block_size * kv_bytes_per_token / GIB:.4f} GiB); raise "
            "gpu_memory_utilization or use a larger GPU, more tensor parallelism or a smaller model"
        )
    return KVCachePlan(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_capacity_tokens=num_gpu_blocks * block_size,
        requested_bytes=requested,
        weights_bytes=weights_bytes,
        activation_bytes=peak_memory_bytes - weights_bytes,
        non_torch_bytes=non_torch_bytes,
        kv_bytes=kv_bytes,
        cudagraph_bytes=cudagraph_bytes,
    )


def _check_plan_args(total: int, util: float, peak: int, non_torch: int,
                     kv_bytes_per_token: int, block_size: int, weights: int) -> None:
    """plan_kv_cache's argument checks: ValueError naming the field."""
    if not 0.0 < util <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util}")
    for name, value in (
        ("total_gpu_memory_bytes", total),
        ("kv_bytes_per_token", kv_bytes_per_token),
        ("block_size", block_size),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if peak < 0 or non_torch < 0:
        raise ValueError(
            f"peak_memory_bytes and non_torch_bytes must be >= 0, got {peak} and {non_torch}"
        )
    if not 0 <= weights <= peak:
        raise ValueError(f"weights_bytes must be in [0, peak_memory_bytes={peak}], got {weights}")


def plan_for(
    model: ModelSpec,
    gpu: GPUSpec | None,
    dtype: str,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int,
    non_torch_bytes: int | None = None,
    tensor_parallel_size: int = 1,
    kv_cache_memory_bytes: int | None = None,
    cuda_graphs: bool = False,
    cudagraph_config: CudaGraphConfig | None = None,
) -> KVCachePlan:
    """The plan for a model on a GPU, per GPU of a tensor-parallel group, budgeted against
    the memory torch reports (gpu.total_memory_bytes): weights / N (every matrix is sharded;
    the replicated norms are negligible) plus the rotary cache, the estimated activation
    peak, non-torch memory (default_non_torch_bytes(N, gpu) unless given) and the per-GPU KV
    bytes per token. kv_cache_memory_bytes, when given, is the KV cache's size as vLLM's
    --kv-cache-memory sets it: gpu_memory_utilization and the profile are then not used for
    it, nor ``gpu`` (None: a device without a GPU spec, which needs it). ``cuda_graphs``:
    also deduct the CUDA graphs' memory, as vLLM >= 0.21 does unless --enforce-eager
    (cudagraph_bytes_for, with ``cudagraph_config``'s settings: None, vLLM's defaults; not
    with kv_cache_memory_bytes, which sizes the pool itself). Raises ValueError as
    plan_kv_cache does, and naming dtype, tensor_parallel_size or kv_cache_memory_bytes
    when invalid (or missing without a GPU), or a CUDA-graph setting vLLM refuses."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    dtype_bytes = DTYPE_BYTES[dtype]
    kv_per_token = model.kv_bytes_per_token(dtype_bytes, tensor_parallel_size)
    weights = (-(-model.weight_bytes(dtype_bytes) // tensor_parallel_size)
               + rope_cache_bytes(model, dtype_bytes))
    activations = activation_peak_bytes(
        model, max_num_batched_tokens, max_num_seqs, dtype_bytes, tensor_parallel_size
    )
    non_torch = (default_non_torch_bytes(tensor_parallel_size, gpu) if non_torch_bytes is None
                 else non_torch_bytes)
    if kv_cache_memory_bytes is not None:
        return _plan_fixed_kv(kv_cache_memory_bytes, kv_per_token, block_size,
                              weights, activations, non_torch)
    if gpu is None:
        raise ValueError("kv_cache_memory_bytes: a device without a GPU spec needs it")
    graphs = (cudagraph_bytes_for(model, gpu, max_num_batched_tokens, max_num_seqs,
                                  block_size, cudagraph_config) if cuda_graphs else 0)
    return plan_kv_cache(
        gpu.total_memory_bytes,
        gpu_memory_utilization,
        weights + activations,
        non_torch,
        kv_per_token,
        block_size,
        weights_bytes=weights,
        cudagraph_bytes=graphs,
    )


def cudagraph_bytes_for(model: ModelSpec, gpu: GPUSpec, max_num_batched_tokens: int,
                        max_num_seqs: int, block_size: int,
                        config: CudaGraphConfig | None = None) -> int:
    """vLLM's CUDA-graph memory estimate for ``model`` on one GPU of ``gpu``
    (cudagraph_memory_bytes over model.num_layers) with the CUDA-graph settings ``config``
    (None: vLLM's defaults), as vLLM 0.32 captures them on that GPU: up to its default
    largest capture size (max_capture_size), and a cudagraph_mode FULL turned into
    FULL_AND_PIECEWISE or FULL_DECODE_ONLY where the GPU's attention backend cannot run
    mixed batches in one full graph (full_cudagraph_support, by the GPU preset, the
    model's attention, MLA or not, and for MLA the cache's ``block_size``; a GPU spec
    file's keeps FULL as given)."""
    mixed = full_cudagraph_support(gpu.name, model.kv_lora_rank is not None, block_size,
                                   model.qk_nope_head_dim, model.attention_head_size)
    return cudagraph_memory_bytes(model.num_layers, max_num_seqs, max_num_batched_tokens,
                                  max_capture_size(gpu.name), config, mixed)


def _plan_fixed_kv(kv_cache_memory_bytes: int, kv_bytes_per_token: int, block_size: int,
                   weights: int, activations: int, non_torch: int) -> KVCachePlan:
    """A plan whose KV cache is kv_cache_memory_bytes (vLLM's kv_cache_memory_bytes skips
    the profile's budget); requested_bytes is what the GPU then holds in all. Raises
    ValueError naming kv_cache_memory_bytes when not one block fits."""
    block_bytes = block_size * kv_bytes_per_token
    num_gpu_blocks = kv_cache_memory_bytes // block_bytes
    if num_gpu_blocks < 1:
        raise ValueError(f"kv_cache_memory_bytes must hold at least one block "
                         f"({block_bytes} bytes), got {kv_cache_memory_bytes}")
    return KVCachePlan(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_capacity_tokens=num_gpu_blocks * block_size,
        requested_bytes=weights + activations + non_torch + kv_cache_memory_bytes,
        weights_bytes=weights,
        activation_bytes=activations,
        non_torch_bytes=non_torch,
        kv_bytes=kv_cache_memory_bytes,
    )


def check_max_model_len(plan: KVCachePlan, max_model_len: int,
                        num_gpu_blocks: int | None = None,
                        option: str = "gpu_memory_utilization") -> None:
    """Raise ValueError, in vLLM's words, when the KV cache cannot hold one request of
    max_model_len tokens, or for max_model_len < 2 (as SchedulerConfig).

    vLLM 0.32 (vllm/v1/core/kv_cache_utils.py get_kv_cache_configs and
    _check_enough_kv_cache_memory) checks the pool's memory less the one block its
    BlockPool holds back (the null block) against cdiv(max_model_len, block_size) blocks,
    and with num_gpu_blocks_override it checks that many blocks instead of the profiled
    memory; so a request fits when cdiv(max_model_len, block_size) <= num_gpu_blocks - 1.
    ``num_gpu_blocks`` is such an override (None: the plan's own); ``option`` the setting
    the message suggests raising (gpu_memory_utilization, num_gpu_blocks or
    kv_cache_memory_bytes). Sizes in the message are GiB rounded as vLLM's format_gib."""
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
    block_bytes = plan.block_size * plan.kv_bytes_per_token
    pool = plan.kv_bytes if num_gpu_blocks is None else num_gpu_blocks * block_bytes
    available = pool - block_bytes
    if available <= 0:
        raise ValueError(f"No available memory for the cache blocks. Try increasing "
                         f"`{option}` when initializing the engine.")
    needed = -(-max_model_len // plan.block_size) * block_bytes
    if needed <= available:
        return
    estimated = available // block_bytes * plan.block_size
    estimate = (f"Based on the available memory, the estimated maximum model length is "
                f"{estimated}. " if estimated > 0 else "")
    raise ValueError(
        f"max_model_len: To serve at least one request with the model's max seq len "
        f"({max_model_len}), ({_gib(needed)} GiB KV cache is needed, which is larger than "
        f"the available KV cache memory ({_gib(available)} GiB). {estimate}Try increasing "
        f"`{option}` or decreasing `max_model_len` when initializing the engine."
    )


def _gib(num_bytes: int) -> str:
    """Bytes as vLLM's format_gib writes them (vllm/utils/mem_utils.py): GiB rounded to
    two decimals, as Python prints the float."""
    return f"{round(num_bytes / GIB, 2)}"
