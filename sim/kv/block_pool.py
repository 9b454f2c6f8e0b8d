"""Paged KV-cache block allocator: block ids and a free list.

No SimPy and no policy logic: policies ask for slots, the allocator answers.
Conventions follow vLLM V1 (``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``):
block 0 is the null block, so ``num_gpu_blocks`` G leaves G - 1 usable blocks (vLLM's
``num_gpu_blocks_override`` means the same); ``allocate_slots`` returns None when the
blocks do not fit and allocates nothing in that case. A request holding P prompt and O
output tokens has computed P + O - 1 tokens (the last sampled token is never written),
so it holds ceil((P + O - 1) / block_size) blocks at its end.

In this plain pool a block is free or held by exactly one request, so a request's
``block_ids`` is the whole story and no per-block bookkeeping runs on the hot path:
allocation and freeing move slices of the free list. Sharing, and so reference counts,
belong to the prefix-caching pools (sim/kv/prefix_cache.py, sim/kv/radix_cache.py), which
override allocate_up_to and free.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from sim.request import Request


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


@mypyc_attr(allow_interpreted_subclasses=True)  # the prefix-caching pools
class KVCacheManager:
    """Block pool of ``num_gpu_blocks`` blocks of ``block_size`` tokens.

    Raises ValueError when num_gpu_blocks < 2 (one null block plus at least one usable)
    or block_size < 1.
    """

    __slots__ = ("_free", "block_size", "num_gpu_blocks")

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks must be >= 2 (one is vLLM's null block), got {num_gpu_blocks}"
            )
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        # Popping from the end hands out the lowest ids first (block 0 = null block).
        self._free: list[int] = list(range(num_gpu_blocks - 1, 0, -1))

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can hold KV (all but the null block)."""
        return self.num_gpu_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - 1 - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use, in [0, 1] (vLLM's kv_cache_usage)."""
        return self.num_used_blocks / (self.num_gpu_blocks - 1)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return cdiv(num_tokens, self.block_size)

    def can_fit(self, request: Request, num_tokens: int) -> bool:
        """Whether the free pool could grow ``request`` to hold ``num_tokens`` tokens
        (a check, not a reservation: vLLM's full_sequence_must_fit)."""
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        return need <= len(self._free)

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[int] | None:
        """Make room for ``num_new_tokens`` more computed tokens of ``request``.

        Returns the newly allocated block ids ([] when the held blocks suffice), or None
        when the free pool is too small; nothing is allocated then.
        """
        return self.allocate_up_to(request, request.num_computed_tokens + num_new_tokens)

    def allocate_up_to(self, request: Request, num_tokens: int) -> list[int] | None:
        """Grow ``request.block_ids`` to hold ``num_tokens`` tokens in total (used by
        allocate_slots and by reserve-mode admission). None when it does not fit."""
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        if need <= 0:
            return []
        free = self._free
        if need > len(free):
            return None
        new = free[-need:]
        del free[-need:]
        new.reverse()
        request.block_ids.extend(new)
        return new

    def allocate_one_each(self, requests: list[Request]) -> None:
        """Give each of ``requests`` one more block, in order: decoding requests whose
        held blocks are full (the caller checked the free blocks suffice). The same as
        allocate_up_to for one block more, request by request."""
        free = self._free
        for r in requests:
            r.block_ids.append(free.pop())

    def free(self, request: Request) -> int:
        """Release every block of ``request`` (tail first, as vLLM frees); returns how
        many blocks went back to the free list."""
        blocks = request.block_ids
        self._free.extend(reversed(blocks))
        request.block_ids = []
        return len(blocks)

    def check_invariants(self) -> None:
        """Assert the pool is consistent (for tests): no duplicate in the free list, the
        null block never handed out, every block id in range. (Callers check that the
        held blocks and the free list partition the pool.)"""
        free = set(self._free)
        assert len(free) == len(self._free), "duplicate block in free list"
        assert 0 not in free, "null block in free list"
        assert all(0 < b < self.num_gpu_blocks for b in free), "block id out of range"
