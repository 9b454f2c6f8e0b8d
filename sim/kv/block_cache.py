"""vLLM's automatic prefix caching as a KV pool (``--prefix-cache block``): full blocks
indexed by the hash chain of their content, reused at admission, kept in an LRU free
queue after release and evicted only when a free block is reused (vLLM
``vllm/v1/core/kv_cache_manager.py`` and ``block_pool.py``). The content model is
sim/kv/prefix_content.py, the block index sim/kv/prefix_index.py and the base class both
caches share sim/kv/prefix_cache.py; docs/prefix_caching.md explains the whole.
"""

from __future__ import annotations

from array import array
from itertools import compress
from typing import ClassVar

import numpy as np

from sim.kv.block_pool import cdiv
from sim.kv.prefix_cache import PrefixCachingKV
from sim.request import Request

_SCAN = 4096  # queue entries looked ahead for the next stale one


class BlockHashCache(PrefixCachingKV):
    """vLLM V1's automatic prefix caching (``vllm/v1/core/block_pool.py``): every full
    prompt block is indexed under its identity (vLLM: its chained hash) when allocated; a
    freed block stays indexed and joins the tail of the free queue (a request's blocks
    tail first, so its last blocks are evicted first); allocation takes the head of the
    queue, the least recently freed block, and drops it from the index then (an
    eviction). A hit on a free block takes it out of the queue. Unlike vLLM, a block whose
    content is indexed already (two requests computing the same prefix at once) is not
    indexed a second time, and
    decode blocks are registered when the request releases its blocks (finish or
    preemption) rather than as they fill: only a later request can contain a request's
    generated tokens (the next turn of its session, or itself after a preemption), so
    the hits are the same, without a hash per block_size generated tokens.

    The queue is an array read from ``_head`` to ``_tail``, each entry stamped with the
    free that put it there (``_qstamp``); taking a free block out of the middle (a hit)
    only changes its ``_stamp``, so the entry is skipped when the head reaches it
    (``_nstale`` such entries wait in the queue). Taking blocks is a slice of the queue
    up to ``_clear_to``, a bound below which no entry is stale: each free's entries are
    one group, pushed in stamp order, whose first position (``_group_at``, counted from
    the queue's first push: ``_base`` is what was dropped from the front) bounds a stale
    entry of that group from below; when the head reaches the bound, the entries ahead
    are scanned for the next stale one. ``_qlist`` holds the same entries as Python
    ints, the ones of the freed requests' block lists: a request's ``block_ids`` are
    slices of it, so no int is made per block (``_qlist[i] == _queue[i]`` from
    ``_head`` to ``_tail``)."""

    __slots__ = ("_base", "_clear_to", "_group_at", "_head", "_nfree", "_nstale", "_qlist",
                 "_qstamp", "_queue", "_stamp", "_stamps", "_tail")
    mode: ClassVar[str] = "block"

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self._free = []  # the queue below is the free pool
        n = num_gpu_blocks - 1
        self._queue = np.zeros(2 * n + 16, np.int64)
        self._queue[:n] = np.arange(1, num_gpu_blocks)
        self._qlist = list(range(1, num_gpu_blocks))
        self._qstamp = np.zeros(2 * n + 16, np.int64)
        self._qstamp[:n] = 1
        self._stamp = np.ones(num_gpu_blocks, np.int64)  # a block's live entry; 0 = none
        self._stamps = 1
        self._head, self._tail = 0, n
        self._nfree = n
        self._nstale = 0
        # By stamp: where its entries start (stamp 1: all blocks); 8 bytes a free.
        self._group_at = array("q", [0, 0])
        self._base = 0
        self._clear_to = 0

    @property
    def num_free_blocks(self) -> int:
        return self._nfree

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - 1 - self._nfree

    def _take(self, k: int) -> tuple[np.ndarray, list[int]]:
        """The k blocks at the head of the free queue (k <= the free blocks), as an
        array and as a list."""
        assert k <= self._nfree, "the caller checked the free blocks"
        q, ql, h = self._queue, self._qlist, self._head
        if not self._nstale or k == 0 or self._base + h + k <= self._clear_to:
            out, out_list = q[h:h + k], ql[h:h + k]
            h += k
        else:
            # Windows of the queue, each larger than the blocks still wanted by a margin
            # that doubles (a freed request hit whole by its next turn leaves hundreds
            # of stale entries in a row), cut after the last live entry wanted.
            qs, stamp = self._qstamp, self._stamp
            parts, out_list = [], []
            margin = 16
            while len(out_list) < k:
                want = k - len(out_list)
                m = min(h + want + min(margin, self._nstale), self._tail)
                seg = q[h:m]
                live = stamp[seg] == qs[h:m]
                at = np.flatnonzero(live)
                if len(at) > want:
                    m = h + int(at[want - 1]) + 1
                    seg, live = seg[:m - h], live[:m - h]
                parts.append(seg[live])
                out_list += compress(ql[h:m], live.tolist())
                self._nstale -= m - h - len(parts[-1])
                h = m
                margin *= 2
            out = np.concatenate(parts)
            if self._nstale:  # the next stale entry, or a bound _SCAN entries ahead
                end = min(h + _SCAN, self._tail)
                ahead = np.flatnonzero(self._stamp[q[h:end]] != self._qstamp[h:end])
                self._clear_to = self._base + h + (int(ahead[0]) if len(ahead) else end - h)
        self._head = h
        self._nfree -= k
        return out, out_list

    def _push(self, blocks: np.ndarray, blocks_list: list[int], stamp: int) -> None:
        """Append ``blocks`` (``blocks_list``: the same as a list) to the tail of the
        free queue with ``stamp``."""
        n, t = len(blocks), self._tail
        if t + n > len(self._queue):  # move the live part to the front, grow if need be
            h = self._head
            size = len(self._queue)
            while 2 * (t - h + n) > size:
                size *= 2
            for name in ("_queue", "_qstamp"):
                old = getattr(self, name)
                arr = old if size == len(old) else np.zeros(size, np.int64)
                arr[:t - h] = old[h:t]
                setattr(self, name, arr)
            del self._qlist[:h]
            self._base += h
            self._head, t = 0, t - h
        self._queue[t:t + n] = blocks
        self._qstamp[t:t + n] = stamp
        self._group_at.append(self._base + t)
        self._qlist += blocks_list
        self._tail = t + n

    def allocate_up_to(self, request: Request, num_tokens: int) -> list[int] | None:
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        new: list[int] = []
        if need == 1 and self._nfree and (not self._nstale or self._base + self._head
                                          < self._clear_to):  # a decode's next block
            b = self._qlist[self._head]
            self._head += 1
            self._nfree -= 1
            key = self._index.key
            if key.item(b):
                key[b] = 0
                self.stats.evicted_blocks += 1
            self._ref_cnt[b] = 1
            request.block_ids.append(b)
            new = [b]
        elif need > 0:
            if need > self._nfree:
                return None
            arr, new = self._take(need)
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
        n = len(requests)
        if self._decodes_registering(requests):
            return
        key, ref = self._index.key, self._ref_cnt
        if n > 8 or self._nstale:
            # A decode run's blocks (sim/decode_group.py), or blocks behind stale queue
            # entries (hits on free blocks): the next n live ones, as arrays, in the order
            # one allocate_up_to per request would take them.
            arr, got = self._take(n)
            evicted = int(np.count_nonzero(key[arr]))
            if evicted:
                key[arr] = 0
                self.stats.evicted_blocks += evicted
            ref[arr] = 1
            for r, b in zip(requests, got, strict=True):
                r.block_ids.append(b)
            return
        ql = self._qlist
        h = self._head
        self._head = h + n
        self._nfree -= n
        evicted = 0
        for r in requests:
            b = ql[h]
            h += 1
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

    def allocate_cached(self, req: Request, hit: list[int], num_tokens: int) -> bool:
        if self.num_new_blocks(req, hit, num_tokens) > self._nfree:
            return False
        if hit:
            h = self._hit_array(hit)
            ref = self._ref_cnt
            if self._touched[1]:  # free blocks leave the queue: their entries go stale
                taken = h[ref[h] == 0]
                if len(taken):  # their entries' groups start at or before them
                    first = self._group_at[int(self._stamp[taken].min())]
                    if not self._nstale or first < self._clear_to:
                        self._clear_to = first
                self._stamp[taken] = 0
                self._nfree -= len(taken)
                self._nstale += len(taken)
            ref[h] += 1
        return self._finish_admission(req, hit, num_tokens)

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
            self._stamps += 1
            self._stamp[zero] = self._stamps
            self._push(zero, zero_list, self._stamps)
            self._nfree += n
        return n

    def free_queue(self) -> list[int]:
        """The free blocks in eviction order (head first; for tests)."""
        q = self._queue[self._head:self._tail]
        return q[self._stamp[q] == self._qstamp[self._head:self._tail]].tolist()

    def check_invariants(self) -> None:
        queue = self.free_queue()
        free = set(queue)
        assert len(free) == len(queue) == self._nfree, "free queue count"
        self._check_common(free)
        held = int(np.count_nonzero(self._ref_cnt[1:] > 0))
        assert held + len(free) == self.num_usable_blocks, "a block is neither free nor held"
        h, t = self._head, self._tail
        assert self._qlist[h:t] == self._queue[h:t].tolist(), "queue list"
        stale = np.flatnonzero(self._stamp[self._queue[h:t]] != self._qstamp[h:t])
        assert len(stale) == self._nstale, "stale entries miscounted"
        if self._nstale:
            assert self._base + h + stale[0] >= self._clear_to, "a stale entry below the bound"
        assert len(self._group_at) == self._stamps + 1, "a free's group start missing"
