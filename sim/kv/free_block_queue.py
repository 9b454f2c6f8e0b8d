"""The LRU free queue of the block-hash prefix cache (sim/kv/block_cache.py): the free
blocks in eviction order, least recently freed first, with vLLM's operations
(``FreeKVCacheBlockQueue`` in ``vllm/v1/core/kv_cache_utils.py``: popleft, popleft_n,
remove, append_n, prepend_n, get_all_free_blocks, num_free_blocks), and
``popleft_n_array`` for the blocks of a prefill chunk, taken as an array. It orders
blocks only: which block is cached, and so what taking one evicts, is the cache's
business (vLLM 0.33's ``BlockPool.free_blocks`` puts freed blocks that carry no hash at
the head, so they are reused before any cached block is evicted, and the rest at the
tail).

Blocks put at the head wait in ``_front`` (reversed: the head is its last entry), ahead
of the array below; they are never cached, so never removed from the middle.

vLLM links the blocks themselves into a doubly linked list, so that a hit on a free block
leaves the middle of the queue in O(1). Here the queue is an array read from ``_head``
to ``_tail`` (numpy, so a prefill chunk's blocks are taken and a request's blocks freed
as slices), each entry stamped with the free that put it there (``_qstamp``); taking a
block out of the middle only clears its ``_stamp``, so its entry is *stale* and skipped
when the head reaches it (``_nstale`` such entries wait in the queue). Taking blocks is a
slice of the queue up to ``_clear_to``, a bound below which no entry is stale: each
free's entries are one group, pushed in stamp order, whose first position (``_group_at``,
counted from the queue's first push: ``_base`` is what was dropped from the front)
bounds a stale entry of that group from below; when the head reaches the bound, the
entries ahead are scanned for the next stale one. ``_qlist`` holds the same entries as
Python ints, the ones of the freed requests' block lists: the blocks handed out are
slices of it, so no int is made per block (``_qlist[i] == _queue[i]`` from ``_head``
to ``_tail``).
"""

from __future__ import annotations

from array import array
from itertools import compress

import numpy as np

_SCAN = 4096  # queue entries looked ahead for the next stale one


class FreeKVCacheBlockQueue:
    """The free blocks of a pool of ``num_gpu_blocks`` (block 0, the null block, never
    among them), in eviction order; at first every usable block, by id. The caller keeps
    the counts right: it takes no more blocks than ``num_free_blocks``, and removes or
    appends only blocks that are free, or held, respectively."""

    __slots__ = ("_base", "_clear_to", "_front", "_group_at", "_head", "_nstale", "_qlist",
                 "_qstamp", "_queue", "_stamp", "_stamps", "_tail", "num_free_blocks")

    def __init__(self, num_gpu_blocks: int) -> None:
        n = num_gpu_blocks - 1
        self._queue = np.zeros(2 * n + 16, np.int64)
        self._queue[:n] = np.arange(1, num_gpu_blocks)
        self._qlist = list(range(1, num_gpu_blocks))
        self._qstamp = np.zeros(2 * n + 16, np.int64)
        self._qstamp[:n] = 1
        self._stamp = np.ones(num_gpu_blocks, np.int64)  # a block's live entry; 0 = none
        self._stamps = 1
        self._head, self._tail = 0, n
        self.num_free_blocks = n
        self._nstale = 0
        # By stamp: where its entries start (stamp 1: all blocks); 8 bytes a free.
        self._group_at = array("q", [0, 0])
        self._base = 0
        self._clear_to = 0
        self._front: list[int] = []  # blocks put at the head, the head last

    def popleft(self) -> int:
        """Take the block at the head of the queue, the least recently freed (a decode's
        next block); the caller checked one is free."""
        if self._front:
            self.num_free_blocks -= 1
            return self._front.pop()
        h = self._head
        if self._nstale and self._base + h >= self._clear_to:
            return self.popleft_n_array(1)[1][0]  # a stale entry may be at the head
        self._head = h + 1
        self.num_free_blocks -= 1
        return self._qlist[h]

    def popleft_n(self, k: int) -> list[int]:
        """Take the ``k`` blocks at the head of the queue (k <= num_free_blocks), in
        order."""
        if self._front:
            return self.popleft_n_array(k)[1]
        h = self._head
        if self._nstale and self._base + h + k > self._clear_to:
            return self.popleft_n_array(k)[1]
        assert k <= self.num_free_blocks, "the caller checked the free blocks"
        self._head = h + k
        self.num_free_blocks -= k
        return self._qlist[h:h + k]

    def popleft_n_array(self, k: int) -> tuple[np.ndarray, list[int]]:
        """``popleft_n``, the blocks also as an array (for the cache's vector
        operations)."""
        assert k <= self.num_free_blocks, "the caller checked the free blocks"
        front = self._front
        if front:
            m = min(k, len(front))
            first = front[len(front) - m:][::-1]
            del front[len(front) - m:]
            self.num_free_blocks -= m
            if m == k:
                return np.array(first, np.int64), first
            arr, rest = self.popleft_n_array(k - m)
            return np.concatenate((np.array(first, np.int64), arr)), first + rest
        q, ql, h = self._queue, self._qlist, self._head
        if not self._nstale or k == 0 or self._base + h + k <= self._clear_to:
            self._head = h + k
            self.num_free_blocks -= k
            return q[h:h + k], ql[h:h + k]
        # Windows of the queue, each larger than the blocks still wanted by a margin
        # that doubles (a freed request hit whole by its next turn leaves hundreds of
        # stale entries in a row), cut after the last live entry wanted.
        qs, stamp = self._qstamp, self._stamp
        parts: list[np.ndarray] = []
        out_list: list[int] = []
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
        if self._nstale:  # the next stale entry, or a bound _SCAN entries ahead
            end = min(h + _SCAN, self._tail)
            ahead = np.flatnonzero(stamp[q[h:end]] != qs[h:end])
            self._clear_to = self._base + h + (int(ahead[0]) if len(ahead) else end - h)
        self._head = h
        self.num_free_blocks -= k
        return np.concatenate(parts), out_list

    def remove(self, blocks: np.ndarray) -> None:
        """Take free ``blocks`` out of the queue wherever they are (a hit on free
        blocks, which are cached, so never ones put at the head): their entries go
        stale."""
        if not len(blocks):
            return
        first = self._group_at[int(self._stamp[blocks].min())]  # their groups start there
        if not self._nstale or first < self._clear_to:
            self._clear_to = first
        self._stamp[blocks] = 0
        self.num_free_blocks -= len(blocks)
        self._nstale += len(blocks)

    def append_n(self, blocks: np.ndarray, blocks_list: list[int]) -> None:
        """Put ``blocks`` (``blocks_list``: the same as a list), which were held, at the
        tail of the queue in order, as one free."""
        self._stamps += 1
        self._stamp[blocks] = self._stamps
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
        self._qstamp[t:t + n] = self._stamps
        self._group_at.append(self._base + t)
        self._qlist += blocks_list
        self._tail = t + n
        self.num_free_blocks += n

    def prepend_n(self, blocks: list[int]) -> None:
        """Put ``blocks``, which were held, at the head of the queue, in order (the
        first is taken next)."""
        self._front += reversed(blocks)
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[int]:
        """The free blocks in eviction order, head first (for tests)."""
        h, t = self._head, self._tail
        q = self._queue[h:t]
        return self._front[::-1] + q[self._stamp[q] == self._qstamp[h:t]].tolist()

    def check(self) -> None:
        """Assert the queue is consistent (for tests): the count, the list mirror, the
        stale entries and their bound, a group start for every free."""
        h, t = self._head, self._tail
        free = self.get_all_free_blocks()
        assert len(set(free)) == len(free) == self.num_free_blocks, "free queue count"
        assert self._qlist[h:t] == self._queue[h:t].tolist(), "queue list"
        stale = np.flatnonzero(self._stamp[self._queue[h:t]] != self._qstamp[h:t])
        assert len(stale) == self._nstale, "stale entries miscounted"
        if self._nstale:
            assert self._base + h + stale[0] >= self._clear_to, "a stale entry below the bound"
        assert len(self._group_at) == self._stamps + 1, "a free's group start missing"
