"""vLLM's automatic prefix caching as a KV pool (``--prefix-cache block``): full blocks
indexed by the hash chain of their content, reused at admission, kept in an LRU free
queue after release and evicted only when a free block is reused (vLLM
``vllm/v1/core/kv_cache_manager.py`` and ``block_pool.py``). The content model is
sim/kv/prefix_content.py, the block index sim/kv/prefix_index.py and the base class both
caches share sim/kv/prefix_cache.py; docs/prefix_caching.md explains the whole.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from sim.kv.block_pool import cdiv
from sim.kv.free_block_queue import FreeKVCacheBlockQueue
from sim.kv.prefix_cache import ComputedBlocks, PrefixCachingKV
from sim.request import Request


class BlockHashCache(PrefixCachingKV):
    """vLLM V1's automatic prefix caching (``vllm/v1/core/block_pool.py``): every full
    prompt block is indexed under its identity (vLLM: its chained hash) when allocated; a
    freed block stays indexed and joins the tail of the free queue (a request's blocks
    tail first, so its last blocks are evicted first); allocation takes the head of the
    queue, the least recently freed block, and drops it from the index then (an
    eviction). A hit on a free block takes it out of the queue. A block whose content is
    indexed already (two requests computing the same prefix at once) is indexed as a
    second copy, which a lookup finds once the first is evicted. Unlike vLLM,
    decode blocks are registered when the request releases its blocks (finish or
    preemption) rather than as they fill: only a later request can contain a request's
    generated tokens (the next turn of its session, or itself after a preemption), so
    the hits are the same, without a hash per block_size generated tokens.

    The free queue is sim/kv/free_block_queue.py (``free_block_queue``); what taking a
    block from it evicts is decided here."""

    __slots__ = ("free_block_queue",)
    mode: ClassVar[str] = "block"

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self._free = []  # the queue below is the free pool
        self.free_block_queue = FreeKVCacheBlockQueue(num_gpu_blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - 1 - self.free_block_queue.num_free_blocks

    def allocate_up_to(self, request: Request, num_tokens: int) -> list[int] | None:
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        queue = self.free_block_queue
        new: list[int] = []
        if need == 1 and queue.num_free_blocks:  # a decode's next block
            b = queue.popleft()
            if self._index.dups:
                self._index.dups.evicting(np.array([b], np.int64), self._index.key,
                                          self._index.arena)
            key = self._index.key
            if key.item(b):
                key[b] = 0
                self.stats.evicted_blocks += 1
            self._ref_cnt[b] = 1
            request.block_ids.append(b)
            new = [b]
        elif need > 0:
            if need > queue.num_free_blocks:
                return None
            arr, new = queue.popleft_n_array(need)
            if self._index.dups:
                self._index.dups.evicting(arr, self._index.key, self._index.arena)
            start = len(request.block_ids)
            # The taken blocks still indexed are evicted now; their entries are dropped
            # as they are indexed again below (most are), one write a block.
            evicted = int(np.count_nonzero(self._index.key[arr]))
            self.stats.evicted_blocks += evicted
            self._ref_cnt[arr] = 1
            self._add_blocks(request, start, arr)
            request.block_ids += new
            full = min(num_tokens, request.num_prompt_tokens) // self.block_size
            if full <= self._committed.get(request, 0):
                if evicted:
                    self._index.key[arr] = 0
            elif (self._register(request, full, arr if evicted else None)
                    and evicted and full < start + need):
                self._index.key[arr[max(0, full - start):]] = 0  # those not indexed again
            return new
        full = min(num_tokens, request.num_prompt_tokens) // self.block_size
        if full > self._committed.get(request, 0):
            self._register(request, full)
        return new

    def allocate_one_each(self, requests: list[Request]) -> None:
        if self._decodes_registering(requests):
            return
        key, ref = self._index.key, self._ref_cnt
        if len(requests) > 8 or self._index.dups:  # a decode run's blocks: as arrays
            arr, got = self.free_block_queue.popleft_n_array(len(requests))
            if self._index.dups:
                self._index.dups.evicting(arr, self._index.key, self._index.arena)
            evicted = int(np.count_nonzero(key[arr]))
            if evicted:
                key[arr] = 0
                self.stats.evicted_blocks += evicted
            ref[arr] = 1
            for r, b in zip(requests, got, strict=True):
                r.block_ids.append(b)
            return
        evicted = 0
        for r, b in zip(requests, self.free_block_queue.popleft_n(len(requests)), strict=True):
            if key.item(b):
                key[b] = 0
                evicted += 1
            ref[b] = 1
            r.block_ids.append(b)
        self.stats.evicted_blocks += evicted

    def _register(self, req: Request, full: int, drop: np.ndarray | None = None) -> bool:
        done = self._committed.get(req, 0)
        # Those from done on were allocated after any hit: not indexed. The first copy
        # of a block's content indexed stays.
        fresh = self._index.index(req, done, self._blocks(req)[done:full], True, drop)
        self._registered += full - done
        self._committed_to(req, full)
        return fresh

    def _reuse(self, hit: ComputedBlocks) -> None:
        h = hit.array
        ref = self._ref_cnt
        if self._touched[1]:  # hit blocks that were free leave the queue
            self.free_block_queue.remove(h[ref[h] == 0])
        ref[h] += 1

    def free(self, request: Request) -> int:
        self._release(request)
        blocks = self._blocks(request)
        self._arrays.pop(request, None)
        held = request.block_ids
        request.block_ids = []
        left = self._ref_cnt[blocks]
        left -= 1  # in place: one array of a request's hundreds of blocks the fewer
        self._ref_cnt[blocks] = left
        # The blocks left unreferenced, last first (vLLM frees tail first): usually all
        # of them, or all but a prefix that other requests hold (then slices).
        m = int(np.count_nonzero(left))
        if not m:
            zero, zero_list = blocks[::-1], held[::-1]
        elif np.count_nonzero(left[:m]) == m:
            zero, zero_list = blocks[:m - 1:-1], held[:m - 1:-1]
        else:
            zero = blocks[::-1][left[::-1] == 0]
            zero_list = zero.tolist()
        n = len(zero)
        if n:
            # Blocks that carry no hash (a partial last block) go to the head, the
            # cached ones to the tail (vLLM 0.33 BlockPool.free_blocks).
            cached = self._index.key[zero] != 0
            if cached.all():
                self.free_block_queue.append_n(zero, zero_list)
            else:
                self.free_block_queue.prepend_n(zero[~cached].tolist())
                if cached.any():
                    self.free_block_queue.append_n(zero[cached], zero[cached].tolist())
        return n

    def check_invariants(self) -> None:
        queue = self.free_block_queue
        queue.check()
        free = set(queue.get_all_free_blocks())
        self._check_common(free)
        held = int(np.count_nonzero(self._ref_cnt[1:] > 0))
        assert held + len(free) == self.num_usable_blocks, "a block is neither free nor held"
