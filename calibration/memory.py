"""KV-cache capacity planning as vLLM's GPU worker does it at start-up (profile run, then
``determine_num_available_blocks``): the memory left for the KV cache after weights, the
profile run's activation peak and non-torch memory, cut into blocks. Owns KVCachePlan, the
activation-peak estimate and the max_model_len check.

    requested  = total_gpu_memory * gpu_memory_utilization
    kv_bytes   = requested - peak (weights + activations) - non_torch
    num_gpu_blocks = kv_bytes // (block_size * kv_bytes_per_token)

All sizes in bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from calibration.gpus import GPUSpec
from calibration.specs import DTYPE_BYTES, GIB, ModelSpec

DEFAULT_NON_TORCH_BYTES: int = round(0.35 * GIB)
"""Memory the GPU process holds outside PyTorch's allocator (CUDA context, cuBLAS/NCCL
workspaces): 0.35 GiB, as vLLM logged for Llama-3.1-8B on one RTX 3090
(vllm-project/vllm#10517, "non_torch_memory=0.35GiB"); other single-GPU logs show 0.16-0.20 GiB
(vllm#12126 on H100, vllm#14447), tensor-parallel runs more (NCCL buffers), so pass a
measured value when you have one."""

_SAMPLER_BYTES_PER_LOGIT_FP32 = 8
"""fp32 logits plus one fp32 softmax/log-softmax copy, per vocab entry per sampled row."""


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
    product (I) for each of the k experts a token uses; MoE adds k * hidden for the fused-MoE
    output buffer and fp32 router logits (4 * E). The sampler peak keeps the final hidden
    states and, per sampled row, the LM-head output (dtype) plus fp32 logits and one fp32
    softmax copy (8 bytes) over the vocabulary. The two phases do not overlap:

        forward = T * (dtype * (3h + k * 3I / N + [MoE] k * h) + [MoE] 4E)
        sampler = T * h * dtype + S * V * (dtype + 8)
        peak    = max(forward, sampler)

    T = max_num_batched_tokens, S = max_num_seqs, N = tensor_parallel_size (the MLP is
    sharded N ways). Check: Llama-3.1-8B bf16, T = 20,000 gives 2.06 GiB, T = 29,000 gives
    2.99 GiB; vLLM measured 2.07 and 2.99 GiB (vllm#10517: peak_torch_memory 17.06 and
    17.98 GiB minus 14.99 GiB of weights). Raises ValueError naming a non-positive argument.
    """
    if max_num_batched_tokens < 1:
        raise ValueError(f"max_num_batched_tokens must be >= 1, got {max_num_batched_tokens}")
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    if dtype_bytes < 1:
        raise ValueError(f"dtype_bytes must be >= 1, got {dtype_bytes}")
    model.check_tensor_parallel(tensor_parallel_size)
    h, k = model.hidden_size, model.num_experts_per_tok
    mlp_elems = 3 * k * model.intermediate_size // tensor_parallel_size
    per_token = dtype_bytes * (3 * h + mlp_elems)
    if model.num_experts > 1:
        per_token += dtype_bytes * k * h + 4 * model.num_experts
    forward = max_num_batched_tokens * per_token
    sampler = max_num_batched_tokens * h * dtype_bytes + max_num_seqs * model.vocab_size * (
        dtype_bytes + _SAMPLER_BYTES_PER_LOGIT_FP32
    )
    return max(forward, sampler)


@dataclass(frozen=True, slots=True)
class KVCachePlan:
    """The KV-cache budget of one GPU (bytes, blocks, tokens).

    requested_bytes = total * gpu_memory_utilization; kv_bytes = requested_bytes -
    weights_bytes - activation_bytes - non_torch_bytes; num_gpu_blocks = kv_bytes //
    (block_size * kv_bytes_per_token); kv_capacity_tokens = num_gpu_blocks * block_size.
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
) -> KVCachePlan:
    """Cut the memory left after the profile run's peak into KV blocks.

    peak_memory_bytes: weights + activation peak; weights_bytes: the part of it that is
    weights, when known (it only splits the peak in the plan's fields; 0 puts all of it under
    activation_bytes). Raises ValueError naming the field for gpu_memory_utilization outside
    (0, 1] or a non-positive size, and one line naming gpu_memory_utilization with the
    numbers in GiB when not even one block fits (weights + activations don't fit).
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    for name, value in (
        ("total_gpu_memory_bytes", total_gpu_memory_bytes),
        ("kv_bytes_per_token", kv_bytes_per_token),
        ("block_size", block_size),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if peak_memory_bytes < 0 or non_torch_bytes < 0:
        raise ValueError(
            "peak_memory_bytes and non_torch_bytes must be >= 0, "
            f"got {peak_memory_bytes} and {non_torch_bytes}"
        )
    if not 0 <= weights_bytes <= peak_memory_bytes:
        raise ValueError(
            f"weights_bytes must be in [0, peak_memory_bytes={peak_memory_bytes}], "
            f"got {weights_bytes}"
        )
    requested = math.floor(total_gpu_memory_bytes * gpu_memory_utilization)
    kv_bytes = requested - peak_memory_bytes - non_torch_bytes
    num_gpu_blocks = max(kv_bytes, 0) // (block_size * kv_bytes_per_token)
    if num_gpu_blocks < 1:
        raise ValueError(
            f"gpu_memory_utilization {gpu_memory_utilization} leaves no room for the KV cache: "
            f"{requested / GIB:.2f} GiB requested of {total_gpu_memory_bytes / GIB:.2f} GiB, "
            f"weights + activations take {peak_memory_bytes / GIB:.2f} GiB and non-torch "
            f"memory {non_torch_bytes / GIB:.2f} GiB, leaving {kv_bytes / GIB:.2f} GiB "
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
    )


def plan_for(
    model: ModelSpec,
    gpu: GPUSpec,
    dtype: str,
    gpu_memory_utilization: float,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    block_size: int,
    non_torch_bytes: int = DEFAULT_NON_TORCH_BYTES,
    tensor_parallel_size: int = 1,
) -> KVCachePlan:
    """The plan for a preset model on a preset GPU, per GPU of a tensor-parallel group:
    weights / N (every matrix is sharded; the replicated norms are negligible), the
    estimated activation peak and the per-GPU KV bytes per token. Raises ValueError as
    plan_kv_cache does, and naming dtype or tensor_parallel_size when invalid."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    dtype_bytes = DTYPE_BYTES[dtype]
    kv_per_token = model.kv_bytes_per_token(dtype_bytes, tensor_parallel_size)
    weights = -(-model.weight_bytes(dtype_bytes) // tensor_parallel_size)
    activations = activation_peak_bytes(
        model, max_num_batched_tokens, max_num_seqs, dtype_bytes, tensor_parallel_size
    )
    return plan_kv_cache(
        gpu.memory_bytes,
        gpu_memory_utilization,
        weights + activations,
        non_torch_bytes,
        kv_per_token,
        block_size,
        weights_bytes=weights,
    )


def check_max_model_len(plan: KVCachePlan, max_model_len: int) -> None:
    """Raise ValueError (as vLLM does at start-up) when one request of max_model_len tokens
    cannot fit in the whole KV cache, or for max_model_len < 2 (as SchedulerConfig)."""
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
    if max_model_len > plan.kv_capacity_tokens:
        raise ValueError(
            f"max_model_len ({max_model_len}) is larger than the maximum number of tokens that "
            f"can be stored in KV cache ({plan.kv_capacity_tokens}); increase "
            "gpu_memory_utilization or decrease max_model_len"
        )
