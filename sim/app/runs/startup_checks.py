"""vLLM's start-up checks: every configuration vLLM 0.32 refuses to start with is refused
here too, before anything is simulated, in vLLM's words where it has them (prefixed by
the field). One function per check, each naming the vLLM function it mirrors;
``check_engine`` runs those that need no KV plan in vLLM's order (the model config, the
parallel config, the cache config, the scheduler config, the attention backend), and
sim/app/runs/runner.py the KV cache's two once the plan is made. docs/vllm_checks.md is
the table of them.

A refusal is a ``Refused`` (a ValueError): sweep refuses a grid cell that raises one,
plan skips a candidate that raises one, and both keep other failures as they were.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from calibration.attention_backends import mla_default_block_size
from calibration.gpus import get_gpu
from calibration.hf_config import ContextLimit, resolve_model
from calibration.memory import KVCachePlan, check_max_model_len
from calibration.specs import ModelSpec

if TYPE_CHECKING:
    from calibration.profile import Profile

#: FlashAttention's kernel block sizes on CUDA, MultipleOf(16); FlashInfer's (16, 32, 64),
#: Triton's, FlexAttention's and the MLA backends' are multiples of 16 too.
CUDA_BLOCK_MULTIPLE = 16

#: The attention backends vLLM 0.32 tries on CUDA for a decoder without MLA, in order.
CUDA_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")

#: vLLM's CPU attention backend's kernel block sizes, MultipleOf(32)
#: (v1/attention/backends/cpu_attn.py CPUAttentionBackend.get_supported_kernel_block_sizes).
CPU_BLOCK_MULTIPLE = 32

#: vLLM's block size when the user gives none: CacheConfig.DEFAULT_BLOCK_SIZE
#: (vllm/config/cache.py), which the CUDA backends keep (FlashAttention takes any
#: multiple of 16).
DEFAULT_BLOCK_SIZE = 16

#: vLLM's CPU platform's block size when the user gives none (vllm/platforms/cpu.py
#: ``CpuPlatform.check_and_update_config``: ``elif not
#: cache_config.user_specified_block_size: cache_config.block_size = 128``).
CPU_DEFAULT_BLOCK_SIZE = 128


class Refused(ValueError):
    """A configuration vLLM 0.32 refuses at start-up."""


def engine_platform(step_time: float | None, profile: Profile | None) -> str | None:
    """The vLLM platform whose attention backends a run's block size must suit: "cuda"
    for a GPU's steps (the roofline, a profile measured on CUDA), "cpu" for a profile of
    vLLM's CPU engine, None for a constant step time or a torch profile (no vLLM
    backend)."""
    if step_time is not None:
        return None
    if profile is None or profile.device == "cuda":
        return "cuda"
    return "cpu" if profile.engine.get("name") == "vllm" else None


def default_block_size(platform: str | None, model: ModelSpec | None,
                       gpu_name: str | None = None, kv_cache_dtype: str = "auto") -> int:
    """The block size vLLM 0.32 starts with when the user gives none: 128 on its CPU
    platform for a model without MLA (an MLA model gets 16 there, given or not:
    vllm/platforms/cpu.py ``check_and_update_config``); on a GPU, for an MLA model, the
    preferred block size of the MLA backend it picks on ``gpu_name`` for
    ``kv_cache_dtype`` (calibration.attention_backends.mla_default_block_size: 32 on a
    B200, 64 on an H100 or H200 with an FP8 KV cache); else CacheConfig's 16.
    ``platform`` as engine_platform; ``model`` the run's (None: not an MLA model)."""
    mla = model is not None and model.kv_lora_rank is not None
    if platform == "cpu":
        return DEFAULT_BLOCK_SIZE if mla else CPU_DEFAULT_BLOCK_SIZE
    if platform == "cuda" and mla and gpu_name is not None:
        assert model is not None
        return mla_default_block_size(gpu_name, model.qk_nope_head_dim, kv_cache_dtype,
                                      model.attention_head_size)
    return DEFAULT_BLOCK_SIZE


def run_block_size(cfg: Any, platform: str | None, spec: ModelSpec | None) -> int:
    """default_block_size for a RunConfig ``cfg`` that gives none, on ``platform``
    (engine_platform), ``spec`` its profile's model (None: resolved here from cfg.model
    when it matters, a GPU run; one that does not resolve is taken as no MLA model, and
    the run names it where it resolves it). The GPU is the disaggregated pools' when both
    name the same one, else the run's --gpu, by its canonical name (aliases, any case)."""
    if spec is None and platform == "cuda" and cfg.model is not None:
        try:  # an MLA model's backend picks its block size
            spec = resolve_model(cfg.model)
        except ValueError:
            spec = None
    names = {cfg.prefill_gpu or cfg.gpu, cfg.decode_gpu or cfg.gpu}
    name = names.pop() if len(names) == 1 else cfg.gpu
    try:
        gpu = None if name is None else get_gpu(name).name
    except (ValueError, OSError):
        gpu = None  # the run reports a bad --gpu where it resolves it
    return default_block_size(platform, spec, gpu, cfg.kv_cache_dtype)


def check_max_model_len_within_model(max_model_len: int, model: ModelSpec,
                                     allow_long: bool,
                                     limit: ContextLimit | None = None) -> None:
    """max_model_len no longer than the model's context, unless the user allows it.

    vLLM 0.32 vllm/config/model.py ``_get_and_verify_max_len``: a user-specified
    max_model_len above the length derived from the model's config.json
    (max_position_embeddings times ``limit``'s RoPE factor) and above its
    model_max_length is refused unless the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    (servesim: --allow-long-max-model-len, or that env var) is set. ``limit``: what the
    model's config.json adds (calibration/hf_config.py context_limit; None: nothing,
    as for a preset or a profile). The tokenizer's model_max_length is not read."""
    limit = limit or ContextLimit()
    derived: float = model.max_position_embeddings
    if limit.rope_factor is not None:
        derived *= limit.rope_factor
    mml = limit.model_max_length
    if allow_long or max_model_len <= derived or (mml is not None and max_model_len <= mml):
        return
    raise Refused(
        f"User-specified max_model_len ({max_model_len}) is greater than the derived "
        f"max_model_len (max_position_embeddings={derived} or model_max_length={mml} in "
        f"model's config.json of {model.name}). To allow overriding this maximum, give "
        "--allow-long-max-model-len or set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
        "(vLLM: with RoPE, positions past the derived length lead to nan).")


def check_tensor_parallel_heads(model: ModelSpec, tensor_parallel_size: int) -> None:
    """tensor_parallel_size divides the attention heads.

    vLLM 0.32 vllm/config/model.py ``ModelConfig.verify_with_parallel_config``."""
    heads = model.num_attention_heads
    if heads % tensor_parallel_size:
        raise Refused(f"tensor_parallel_size: Total number of attention heads ({heads}) must "
                      f"be divisible by tensor parallel size ({tensor_parallel_size}).")


def check_tensor_parallel_shards(model: ModelSpec, tensor_parallel_size: int) -> None:
    """The KV heads and the dense MLP's widths shard evenly over tensor_parallel_size.

    vLLM 0.32 builds the layers at start-up with vllm/distributed/utils.py ``divide``,
    which asserts "{numerator} is not divisible by {denominator}": in
    vllm/model_executor/layers/linear.py ``QKVParallelLinear`` the KV heads are split
    (fewer GPUs than KV heads) or replicated (as many or more), and
    ``MergedColumnParallelLinear`` splits the gate and up projections (a dense MLP's
    intermediate_size, a shared expert's). A dense MLP exists in a model without experts
    and in an MoE model's num_dense_layers (DeepSeek's first_k_dense_replace, Qwen-MoE's
    mlp_only_layers); an all-MoE model (Mixtral, Qwen3-MoE) builds none. Routed experts
    are split by floor division (fused_moe), and MLA caches one latent on every GPU:
    neither is checked."""
    tp = tensor_parallel_size
    kv = model.num_kv_heads
    parts = [] if model.kv_lora_rank is not None else [
        ("num_kv_heads", kv, (tp, kv) if tp >= kv else (kv, tp))]
    if model.num_experts <= 1 or model.num_dense_layers > 0:
        parts.append(("intermediate_size", model.intermediate_size,
                      (model.intermediate_size, tp)))
    if model.shared_expert_intermediate_size:
        n = model.shared_expert_intermediate_size
        parts.append(("shared_expert_intermediate_size", n, (n, tp)))
    for name, value, (num, den) in parts:
        if num % den:
            raise Refused(f"tensor_parallel_size: {num} is not divisible by {den} ({name} "
                          f"{value} of {model.name} over {tp} GPUs; vLLM's model loading "
                          "fails)")


def check_block_size_positive(block_size: int) -> None:
    """block_size > 0: vLLM 0.32 vllm/config/cache.py ``CacheConfig.block_size``
    (``Field(gt=0)``; the message is pydantic's)."""
    if block_size < 1:
        raise Refused(f"block_size: Input should be greater than 0, got {block_size}")


def check_budget_covers_max_model_len(max_num_batched_tokens: int, max_model_len: int,
                                      policy: str) -> None:
    """Without chunked prefill a whole prompt must fit one step's budget.

    vLLM 0.32 vllm/config/scheduler.py ``SchedulerConfig.verify_max_model_len`` (with
    enable_chunked_prefill off); ``policy`` is one that never chunks (continuous)."""
    if max_num_batched_tokens >= max_model_len:
        return
    raise Refused(
        f"policy {policy} (no chunked prefill): max_num_batched_tokens "
        f"({max_num_batched_tokens}) is smaller than max_model_len ({max_model_len}). This "
        "effectively limits the maximum sequence length to max_num_batched_tokens and makes "
        "vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
        "max_model_len.")


def check_budget_covers_max_num_seqs(max_num_batched_tokens: int, max_num_seqs: int) -> None:
    """A step's budget gives every sequence of a full batch at least one token.

    vLLM 0.32 vllm/config/scheduler.py ``SchedulerConfig.verify_max_model_len``."""
    if max_num_batched_tokens < max_num_seqs:
        raise Refused(f"max_num_batched_tokens ({max_num_batched_tokens}) must be greater "
                      f"than or equal to max_num_seqs ({max_num_seqs}).")


def check_long_prefill_threshold(long_prefill_token_threshold: int,
                                 max_model_len: int) -> None:
    """long_prefill_token_threshold at most max_model_len.

    vLLM 0.32 vllm/config/scheduler.py ``SchedulerConfig.verify_max_model_len``."""
    if long_prefill_token_threshold > max_model_len:
        raise Refused(f"long_prefill_token_threshold ({long_prefill_token_threshold}) cannot "
                      f"be greater than the max_model_len ({max_model_len}).")


def check_cuda_block_size(block_size: int) -> None:
    """A block size some CUDA attention backend supports: a multiple of 16.

    vLLM 0.32 vllm/platforms/cuda.py ``CudaPlatform.get_attn_backend_cls`` keeps the
    backends whose ``supports_block_size`` (vllm/v1/attention/backend.py) accepts it, a
    multiple of one of ``get_supported_kernel_block_sizes``: FlashAttention's
    MultipleOf(16) (v1/attention/backends/flash_attn.py), FlashInfer's 16, 32, 64,
    Triton's and FlexAttention's MultipleOf(16), and for MLA models 16, 32, 64 or 128;
    with none left it raises "No valid attention backend found"."""
    if block_size % CUDA_BLOCK_MULTIPLE:
        reasons = ", ".join(f"{b}: [block_size not supported]" for b in CUDA_BACKENDS)
        raise Refused(f"block_size ({block_size}) must be a multiple of {CUDA_BLOCK_MULTIPLE} "
                      f"on a GPU: No valid attention backend found for cuda. Reasons: "
                      f"{{{reasons}}}.")


def check_cpu_block_size(block_size: int, model: ModelSpec) -> None:
    """A block size vLLM's CPU attention backend takes: a multiple of 32.

    vLLM 0.32 vllm/v1/worker/utils.py ``select_common_block_size``, which
    ``GPUModelRunner.initialize_kv_cache`` (v1/worker/gpu_model_runner.py, inherited by
    v1/worker/cpu_model_runner.py) applies to CPU_ATTN's MultipleOf(32): no common size
    raises. An MLA model is exempt: vLLM's CPU platform sets its block size to 16
    (vllm/platforms/cpu.py ``check_and_update_config``)."""
    if model.kv_lora_rank is None and block_size % CPU_BLOCK_MULTIPLE:
        raise Refused(f"block_size ({block_size}) must be a multiple of {CPU_BLOCK_MULTIPLE} "
                      f"on vLLM's CPU engine: No common block size for {block_size} "
                      f"(CPU_ATTN: [MultipleOf({CPU_BLOCK_MULTIPLE})]). vLLM's CPU default "
                      "is 128 (--block-size 128).")


def check_kv_cache_memory(plan: KVCachePlan, max_model_len: int,
                          num_gpu_blocks: int | None, option: str) -> None:
    """The KV cache holds one request of max_model_len tokens.

    vLLM 0.32 vllm/v1/core/kv_cache_utils.py ``check_enough_kv_cache_memory`` (as
    get_kv_cache_configs applies it, num_gpu_blocks_override included): the rule and the
    wording are calibration/memory.py check_max_model_len's."""
    try:
        check_max_model_len(plan, max_model_len, num_gpu_blocks, option)
    except ValueError as e:
        raise Refused(str(e)) from None


def check_kv_pool_fits_gpu(plan: KVCachePlan, pool_bytes: int, total_memory_bytes: int,
                           option: str, cudagraph_bytes: int = 0) -> None:
    """A KV cache sized by hand (num_gpu_blocks x block bytes, or kv_cache_memory_bytes)
    fits the GPU beside the weights, the non-torch memory and the ``cudagraph_bytes`` of
    CUDA graphs vLLM captures after it (0 with --enforce-eager or cudagraph_mode NONE).

    vLLM 0.32 allocates the whole cache on the device at start-up (vllm/v1/worker/utils.py
    ``allocate_kv_cache``; with kv_cache_memory_bytes, gpu_worker.py
    ``determine_available_memory`` skips the budget and says "If OOM'ed ..."): a larger
    one ends in CUDA's out-of-memory error. num_gpu_blocks_override replaces the block
    count that memory allows, with no check against it (vllm/v1/core/kv_cache_utils.py
    get_kv_cache_configs only logs "Overriding num_gpu_blocks"), and then gpu_worker.py
    ``compile_or_warm_up_model`` captures the CUDA graphs into what memory is left: a
    cache that leaves less than vLLM's own estimate of them (the amount its profile
    deducts from an automatic cache) ends in the same error during capture. Sizes per
    GPU, in bytes."""
    used = pool_bytes + plan.weights_bytes + plan.non_torch_bytes
    if used > total_memory_bytes:
        raise Refused(
            f"{option}: a KV cache of {_gib(pool_bytes)} GiB does not fit the GPU's "
            f"{_gib(total_memory_bytes)} GiB beside {_gib(plan.weights_bytes)} GiB of weights "
            f"and {_gib(plan.non_torch_bytes)} GiB of non-torch memory: vLLM runs out of "
            "CUDA memory allocating it (CUDA out of memory)")
    if used + cudagraph_bytes > total_memory_bytes:
        raise Refused(
            f"{option}: a KV cache of {_gib(pool_bytes)} GiB leaves the GPU's "
            f"{_gib(total_memory_bytes)} GiB no room, beside {_gib(plan.weights_bytes)} GiB "
            f"of weights and {_gib(plan.non_torch_bytes)} GiB of non-torch memory, for the "
            f"{_gib(cudagraph_bytes)} GiB of CUDA graphs vLLM captures after allocating "
            "it: it runs out of CUDA memory capturing them (CUDA out of memory; "
            "--enforce-eager captures none)")


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 30):.2f}"


def check_engine(*, model: ModelSpec, policy: str, chunked: bool, max_model_len: int,
                 allow_long_max_model_len: bool, tensor_parallel_size: int,
                 block_size: int, platform: str | None, max_num_seqs: int,
                 max_num_batched_tokens: int | None,
                 long_prefill_token_threshold: int,
                 context_limit: ContextLimit | None = None) -> None:
    """Every check that needs no KV plan, in vLLM's order; ``chunked``: the policy may
    chunk a prompt; ``platform``: the vLLM engine the steps are priced for, "cuda" (a
    GPU: the roofline or a profile measured on CUDA), "cpu" (a profile of vLLM's CPU
    engine), or None (a constant step time, or a torch profile: no vLLM backend);
    ``max_num_batched_tokens`` None for a policy without a token budget (static);
    ``context_limit`` what the model's config.json adds to its context length
    (check_max_model_len_within_model). Raises Refused."""
    check_max_model_len_within_model(max_model_len, model, allow_long_max_model_len,
                                     context_limit)
    check_tensor_parallel_heads(model, tensor_parallel_size)
    check_tensor_parallel_shards(model, tensor_parallel_size)
    check_block_size_positive(block_size)
    if max_num_batched_tokens is not None:
        if not chunked:
            check_budget_covers_max_model_len(max_num_batched_tokens, max_model_len, policy)
        check_budget_covers_max_num_seqs(max_num_batched_tokens, max_num_seqs)
    check_long_prefill_threshold(long_prefill_token_threshold, max_model_len)
    if platform == "cuda":
        check_cuda_block_size(block_size)
    elif platform == "cpu":
        check_cpu_block_size(block_size, model)
