"""Engine and scheduler configuration shared by the engine and every policy.

Field names are vLLM's (``vllm/config/scheduler.py``, ``cache.py``). Validated once at
construction: a bad value raises ValueError naming the field and the allowed range.
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUE_ORDERS = ("fcfs", "priority", "sjf", "oracle-srpt", "lpm")
PREEMPTION_MODES = ("recompute", "swap")
KV_ALLOCATIONS = ("paged", "reserve")
PREFIX_CACHE_MODES = ("none", "block", "radix")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """What a policy may know about the engine it schedules for.

    max_num_seqs: most requests in a batch (running), >= 1.
    max_num_batched_tokens: token budget per step, >= 1.
    max_model_len: most tokens (prompt + output) one request may hold, >= 2.
    long_prefill_token_threshold: cap of one request's chunk per step (0 = off).
    scheduler_reserve_full_isl: admit a waiting request only if the free pool can hold
      all of its current tokens (vLLM 0.33 default True).
    queue: waiting-queue order, one of QUEUE_ORDERS.
    preemption_mode: "recompute" or "swap".
    kv_allocation: "paged" (blocks on demand) or "reserve" (prompt + max_tokens at admission).
    kv_bytes_per_block: KV bytes of one block (all layers); required by swap preemption.
    swap_space_bytes: CPU swap space for swapped-out blocks (vLLM V0's swap_space, 4 GiB).
    pcie_bandwidth_bytes_per_s: host <-> GPU copy rate that prices swap transfers.
    prefix_cache: "none", "block" (vLLM's block-hash cache) or "radix" (SGLang's radix
      tree); see sim/kv/prefix_cache.py. Needs kv_allocation "paged"; queue "lpm" needs it.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131072
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    queue: str = "fcfs"
    preemption_mode: str = "recompute"
    kv_allocation: str = "paged"
    kv_bytes_per_block: int | None = None
    swap_space_bytes: int = 4 << 30
    pcie_bandwidth_bytes_per_s: float = 25e9
    prefix_cache: str = "none"

    def __post_init__(self) -> None:
        _at_least("max_num_seqs", self.max_num_seqs, 1)
        _at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _at_least("max_model_len", self.max_model_len, 2)
        _at_least("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        _one_of("queue", self.queue, QUEUE_ORDERS)
        _one_of("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _one_of("kv_allocation", self.kv_allocation, KV_ALLOCATIONS)
        _one_of("prefix_cache", self.prefix_cache, PREFIX_CACHE_MODES)
        if self.prefix_cache != "none" and self.kv_allocation != "paged":
            raise ValueError("prefix_cache needs kv_allocation 'paged' (a reservation "
                             "would cache blocks before their tokens are computed)")
        if self.queue == "lpm" and self.prefix_cache == "none":
            raise ValueError("queue 'lpm' (longest cached prefix first) needs a prefix "
                             "cache: prefix_cache 'block' or 'radix'")
        _at_least("swap_space_bytes", self.swap_space_bytes, 0)
        if self.kv_bytes_per_block is not None:
            _at_least("kv_bytes_per_block", self.kv_bytes_per_block, 1)
        elif self.preemption_mode == "swap":
            raise ValueError("kv_bytes_per_block is required with preemption_mode 'swap'")
        bw = self.pcie_bandwidth_bytes_per_s
        if not (isinstance(bw, (int, float)) and 0 < bw < float("inf")):
            raise ValueError(f"pcie_bandwidth_bytes_per_s must be a finite number > 0, got {bw!r}")


def _at_least(name: str, value: int, low: int) -> None:
    if not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
