"""vLLM's defaults for what a run leaves unset: the batch limits (max_num_seqs,
max_num_batched_tokens) that vLLM's OpenAI API server picks for the GPU it runs on, and
prefix caching, on wherever it can do anything.

Source: vLLM 0.32.0, vllm/engine/arg_utils.py: ``EngineArgs.get_batch_defaults`` (the
per-device tables), ``_set_default_max_num_seqs_and_batched_tokens_args`` (applied only to
what the user left unset: doubled with performance_mode throughput, the budget raised to
max_model_len when chunked prefill is off and capped at max_num_seqs x max_model_len, a
default max_num_seqs lowered to the budget) and
``_set_default_chunked_prefill_and_prefix_caching_args`` (prefix caching on for every
model that supports it: all of vLLM V1's decoder-only generators).
"""

from __future__ import annotations

from dataclasses import dataclass

from calibration.gpus import GPUSpec

GIB = 1 << 30

#: Policies that never chunk a prompt (vLLM with enable_chunked_prefill off).
UNCHUNKED_POLICIES = ("continuous", "static")

#: Policies without a token budget: static batching prefills a whole batch in one step
#: and decodes it to the end, whatever the tokens (docs/policies.md). A run of one takes
#: no max_num_batched_tokens and records none.
UNBUDGETED_POLICIES = ("static",)


@dataclass(frozen=True)
class BatchDefaults:
    """The batch limits vLLM's API server sets on one kind of GPU."""

    max_num_seqs: int
    max_num_batched_tokens: int


def api_server_batch_defaults(gpu: GPUSpec | None) -> BatchDefaults:
    """vLLM 0.32's OPENAI_API_SERVER defaults for ``gpu`` (None: its CPU engine, 128
    sequences and 2,048 tokens at world size 1), chosen by the device's total
    memory (vLLM reads what torch reports; a GPUSpec holds that or the vendor label, on
    the same side of each threshold for every preset) and its name: at least 160 GiB
    (B200, MI300X): 1,024 sequences and 16,384 tokens; at least 70 GiB and not an A100
    (H100, H200; vLLM PR #17885 found the larger budget slower on A100): 1,024 and 8,192;
    any other GPU: 256 and 2,048. The usage context ``LLM`` (offline) has larger budgets;
    servesim models the server."""
    if gpu is None:
        return BatchDefaults(128, 2048)
    if gpu.memory_bytes >= 160 * GIB:
        return BatchDefaults(1024, 16384)
    if gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower():
        return BatchDefaults(1024, 8192)
    return BatchDefaults(256, 2048)


def batch_limits(gpu: GPUSpec | None, policy: str, max_model_len: int,
                 max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None,
                 throughput: bool = False) -> BatchDefaults:
    """The run's batch limits: those given, and vLLM's API-server defaults on ``gpu`` for
    those not (None; twice them with ``throughput``, vLLM's performance_mode throughput),
    adjusted as vLLM adjusts them: a default token budget is raised to
    ``max_model_len`` for a policy that never chunks a prompt (vLLM then needs a whole
    prompt to fit one step) and capped at max_num_seqs x max_model_len; a default
    max_num_seqs is lowered to the budget (so a budget given alone, below the default
    max_num_seqs, starts; only a max_num_seqs given above the budget is refused,
    sim/app/runs/startup_checks.py). For a policy without a budget (static) the token
    count is the one vLLM's profile run would use, which sizes the KV cache
    (calibration/memory.py), not a budget."""
    d = api_server_batch_defaults(gpu)
    if throughput:
        d = BatchDefaults(2 * d.max_num_seqs, 2 * d.max_num_batched_tokens)
    seqs = d.max_num_seqs if max_num_seqs is None else max_num_seqs
    # Out-of-range inputs pass through unadjusted, for the check that names them.
    valid = seqs >= 1 and max_model_len >= 1
    if max_num_batched_tokens is None:
        max_num_batched_tokens = d.max_num_batched_tokens
        if policy in UNCHUNKED_POLICIES:
            max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
        if valid:
            max_num_batched_tokens = min(seqs * max_model_len, max_num_batched_tokens)
    if max_num_seqs is None and max_num_batched_tokens >= 1:
        seqs = min(seqs, max_num_batched_tokens)
    return BatchDefaults(seqs, max_num_batched_tokens)


def default_prefix_cache(policy: str, kv_allocation: str, has_content: bool) -> str:
    """The prefix cache a run gets when it names none: vLLM's block cache ("block"), on
    by default in vLLM V1, where it can hit: an iteration-level policy, a paged pool,
    and a workload whose prompts carry content (a scenario's prompt segments or a
    trace's Mooncake hash_ids). Otherwise "none": prompts without content are all
    distinct, so the cache would only hash and evict what nothing reuses; the plain pool
    schedules the same steps, cheaper. Static batching and reserved pools take no cache
    (RunConfig refuses one)."""
    if policy == "static" or kv_allocation != "paged" or not has_content:
        return "none"
    return "block"

