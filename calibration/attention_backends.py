"""Which attention backend vLLM 0.32 picks on each GPU preset, and what follows from it:
the block size vLLM starts with when the user gives none (``default_block_size``), and
whether the backend runs mixed prefill-decode batches in one full CUDA graph
(``full_cudagraph_support``, which calibration/cuda_graphs.py settles the graph mode with).

vLLM selects the backend before it settles the block size: the selector
(vllm/v1/attention/selector.py) passes the block size only when the user gave one, takes
the first backend of the platform's priority list (vllm/platforms/cuda.py
``_get_backend_priorities``, vllm/platforms/rocm.py) that accepts the GPU's compute
capability, the KV-cache dtype, the model and that block size, and then, with no
--block-size, sets the block size to that backend's preferred one
(vllm/platforms/interface.py ``update_block_size_for_backend``: CacheConfig's 16 where
the backend takes it, else the smallest of its kernel block sizes,
``AttentionBackend.get_preferred_block_size`` in vllm/v1/attention/backend.py).
"""

from __future__ import annotations

COMPUTE_CAPABILITY_MAJOR = {
    "a100-40gb": 8, "a100-80gb": 8, "l4": 8, "l40s": 8, "rtx-3060": 8, "rtx-3090": 8,
    "rtx-4090": 8, "h100-sxm": 9, "h100-pcie": 9, "h200-sxm": 9, "b200": 10, "rtx-5090": 12}
"""The major CUDA compute capability of each NVIDIA GPU preset (NVIDIA's CUDA GPUs table,
developer.nvidia.com/cuda-gpus: A100 8.0, RTX 30xx 8.6, L4, L40S and RTX 4090 8.9, H100
and H200 9.0, B200 10.0, RTX 5090 12.0), which picks vLLM's attention backend and its
largest default capture size. GPUSpec records no capability: a GPU spec file's GPU has
none known here."""

ROCM_GPUS = frozenset({"mi300x"})
"""GPU presets vLLM runs on its ROCm platform (AMD Instinct MI300X, gfx942)."""

DEFAULT_BLOCK_SIZE = 16
"""vLLM's CacheConfig.DEFAULT_BLOCK_SIZE (vllm/config/cache.py)."""

MLA_KERNEL_BLOCK_SIZES = {"FLASHINFER_MLA": (32, 64), "CUTLASS_MLA": (128,),
                          "FLASHMLA": (64,), "FLASH_ATTN_MLA": (16,), "TRITON_MLA": (16,)}
"""Each MLA backend's get_supported_kernel_block_sizes in vLLM 0.32
(vllm/v1/attention/backends/mla/: flashinfer_mla.py [32, 64], cutlass_mla.py [128],
flashmla.py [64], flashattn_mla.py and triton_mla.py MultipleOf(16)); a cache block size
is accepted when one of them divides it (AttentionBackend.supports_block_size)."""

FLASHINFER_MLA_QK_NOPE_HEAD_DIMS = (64, 128, 192)
"""The qk_nope_head_dim FLASHINFER_MLA's kernel takes (its supports_combination)."""

UNQUANTIZED_KV_DTYPES = ("auto", "float16", "bfloat16")
"""FLASH_ATTN_MLA's supported_kv_cache_dtypes (mla/flashattn_mla.py): no fp8 KV cache."""


def _accepts(backend: str, block_size: int | None) -> bool:
    return block_size is None or any(block_size % k == 0
                                     for k in MLA_KERNEL_BLOCK_SIZES[backend])


MLA_HEAD_SIZES = (320, 512, 576)
"""The latent head sizes (kv_lora_rank + qk_rope_head_dim) every MLA backend but
TRITON_MLA takes (MLACommonBackend.get_supported_head_sizes,
model_executor/layers/attention/mla_attention.py); TRITON_MLA takes any."""


def mla_backend(gpu_name: str, qk_nope_head_dim: int, kv_cache_dtype: str = "auto",
                block_size: int | None = None, head_size: int = 576) -> str | None:
    """The MLA attention backend vLLM 0.32 picks for a model with multi-head latent
    attention on the GPU preset ``gpu_name`` (None for a GPU no preset names: a spec
    file's GPU has no compute capability known here), with ``block_size`` None when the
    user gives none.

    Compute capability 10.x: FLASHINFER_MLA (qk_nope_head_dim 64, 128 or 192), then
    CUTLASS_MLA, then TRITON_MLA (TOKENSPEED_MLA, second in vLLM's list, takes
    DeepSeek-R1's dimensions with an FP8 KV cache only, which FLASHINFER_MLA takes
    first; FLASHMLA's dense kernel runs on 9.x only: is_flashmla_dense_supported).
    9.x: FLASH_ATTN_MLA (no FP8 KV cache), then FLASHMLA, then TRITON_MLA. Other CUDA
    GPUs (8.x, 12.x): TRITON_MLA. ROCm: TRITON_MLA (ROCM_AITER_MLA only with
    VLLM_ROCM_USE_AITER, off by default; it takes any block size). A ``head_size``
    (kv_lora_rank + qk_rope_head_dim) outside MLA_HEAD_SIZES: TRITON_MLA. Not modelled:
    the sparse MLA backends (models with index_topk)."""
    if gpu_name in ROCM_GPUS:
        return "TRITON_MLA"
    major = COMPUTE_CAPABILITY_MAJOR.get(gpu_name)
    if major is None:
        return None
    if head_size not in MLA_HEAD_SIZES:
        return "TRITON_MLA"
    if major == 10:
        candidates = ["CUTLASS_MLA", "TRITON_MLA"]
        if qk_nope_head_dim in FLASHINFER_MLA_QK_NOPE_HEAD_DIMS:
            candidates.insert(0, "FLASHINFER_MLA")
    elif major == 9:
        candidates = ["FLASHMLA", "TRITON_MLA"]
        if kv_cache_dtype in UNQUANTIZED_KV_DTYPES:
            candidates.insert(0, "FLASH_ATTN_MLA")
    else:
        candidates = ["TRITON_MLA"]
    return next((b for b in candidates if _accepts(b, block_size)), "TRITON_MLA")


def mla_default_block_size(gpu_name: str, qk_nope_head_dim: int,
                           kv_cache_dtype: str = "auto", head_size: int = 576) -> int:
    """The block size vLLM 0.32 starts an MLA model with on ``gpu_name`` when the user
    gives none: the picked backend's preferred size (16 where it takes 16, else its
    smallest kernel block size). B200 with FLASHINFER_MLA: 32; H100 or H200 with an FP8
    KV cache (FLASHMLA): 64; CacheConfig's 16 elsewhere and for a GPU no preset names."""
    backend = mla_backend(gpu_name, qk_nope_head_dim, kv_cache_dtype, head_size=head_size)
    if backend is None or _accepts(backend, DEFAULT_BLOCK_SIZE):
        return DEFAULT_BLOCK_SIZE
    return min(MLA_KERNEL_BLOCK_SIZES[backend])


def full_cudagraph_support(gpu_name: str, mla: bool = False, block_size: int | None = None,
                           qk_nope_head_dim: int = 128, head_size: int = 576) -> bool | None:
    """Whether the attention backend vLLM 0.32 picks by default on the GPU preset
    ``gpu_name`` runs mixed prefill-decode batches in one full CUDA graph
    (AttentionCGSupport.ALWAYS), for a model with multi-head latent attention (``mla``,
    its ``qk_nope_head_dim`` and latent ``head_size``) or without; None for a GPU no
    preset names (a GPU spec file: GPUSpec records no compute capability), whose FULL is
    kept as given.

    Without MLA, on CUDA (vllm/platforms/cuda.py _get_backend_priorities): FlashAttention
    everywhere but compute capability 10.x, where FlashInfer comes first.
    FlashAttentionMetadataBuilder._cudagraph_support (v1/attention/backends/flash_attn.py)
    is ALWAYS only with FlashAttention 3, which get_flash_attn_version
    (v1/attention/backends/fa_utils.py) picks on 9.x only (4 on 10.x, 2 elsewhere), and
    FlashInferMetadataBuilder.get_cudagraph_support (flashinfer.py) is UNIFORM_BATCH at
    best: ALWAYS on H100 and H200 only. On ROCm (vllm/platforms/rocm.py): ROCM_ATTN first,
    ALWAYS (rocm_attn.py). With MLA: ALWAYS only for FLASHINFER_MLA
    (mla/flashinfer_mla.py), which mla_backend picks on 10.x at a ``block_size`` its
    kernels take (a multiple of 32; None: vLLM picks it, 32); CUTLASS_MLA, FLASHMLA,
    FLASH_ATTN_MLA, TRITON_MLA and ROCM_AITER_MLA are UNIFORM_BATCH at best. Not
    modelled: a backend or FlashAttention version chosen by hand, FA3's fallbacks for
    head sizes above 256."""
    if gpu_name in ROCM_GPUS:
        return not mla
    major = COMPUTE_CAPABILITY_MAJOR.get(gpu_name)
    if major is None:
        return None
    if not mla:
        return major == 9
    return mla_backend(gpu_name, qk_nope_head_dim, block_size=block_size,
                       head_size=head_size) == "FLASHINFER_MLA"
