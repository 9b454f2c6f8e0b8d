"""SGLang's RadixAttention cache (``python/sglang/srt/mem_cache/radix_cache.py``) at KV-block
granularity.

The tree: one node per cached full block, its edge label the block's tokens. A node is
found by its chain hash (sim/prefix_cache.py), which names the whole path from the root,
so the hash index is the tree's child lookup flattened; each node keeps its parent (block
0, the null block, is the root) and its number of children. Reference counts play
SGLang's ``lock_ref``: a request holds every node on its path. Differences from SGLang's
token-level tree: nodes are blocks (SGLang with ``page_size`` = block_size, and without
the edge compression, which changes nothing at block granularity except that eviction
frees one block at a time instead of a whole leaf edge).

Behaviour, as SGLang:
- A full prompt block is inserted when allocated (SGLang inserts each prefill chunk as it
  is computed), decode blocks when the request finishes or is preempted (SGLang inserts
  the output when the request finishes). A block whose node already exists is deduplicated: the
  request adopts the tree's block and its own goes back to the pool (SGLang frees the
  duplicate indices in ``cache_unfinished_req``).
- The pool hands out empty blocks first; only when they run out are cached blocks
  evicted: unreferenced *leaves*, least recently used first (a parent becomes a
  candidate once its last child is gone), so a shared prefix outlives the branches
  below it, unlike vLLM's free queue which may drop a middle block of a chain.
- Access times (a logical clock) order the evictable leaves: a node is stamped when its
  last holder frees it, the moment it becomes evictable (SGLang stamps nodes on every
  match and insert; only the stamp a node has while unreferenced decides its turn, so
  stamping at release orders them the same way, except that a lookup which does not
  lead to admission refreshes nothing here).
"""

from __future__ import annotations

import heapq
from typing import ClassVar

from sim.kv_cache import cdiv
from sim.prefix_cache import PrefixCachingKV, extend_block_hashes
from sim.request import Request


class RadixCache(PrefixCachingKV):
    """The radix-tree prefix cache; same interface as BlockHashCache. ``_free`` holds the
    empty blocks (no node); free blocks = empty + unreferenced nodes (all evictable)."""

    __slots__ = ("_children", "_clock", "_heap", "_num_evictable", "_parent", "_tick")
    mode: ClassVar[str] = "radix"

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self._parent = [0] * num_gpu_blocks
        self._children = [0] * num_gpu_blocks
        self._tick = [0] * num_gpu_blocks
        self._clock = 0
        self._heap: list[tuple[int, int]] = []  # (tick, block) of evictable leaves, lazily
        self._num_evictable = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self._num_evictable

    def allocate_up_to(self, request: Request, num_tokens: int) -> list[int] | None:
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        new: list[int] = []
        if need > 0:
            free = self._free
            if need > len(free):
                if need > len(free) + self._num_evictable:
                    return None
                self._evict(need - len(free))
            new = free[-need:]
            del free[-need:]
            new.reverse()
            ref = self._ref_cnt
            for b in new:
                ref[b] = 1
            request.block_ids.extend(new)
        full = min(num_tokens, request.num_prompt_tokens) // self.block_size
        if full > self._committed.get(request, 0):
            self._register(request, full)
        return new

    def _register(self, req: Request, full: int) -> None:
        """Insert the request's newly full blocks as nodes below its path; a block whose
        node exists already is swapped for the node's block and freed."""
        bs = self.block_size
        done = self._committed.get(req, 0)
        hs = extend_block_hashes(req, bs, full, self._answer_chains)[done:full]
        blocks = req.block_ids
        parent = blocks[done - 1] if done else 0
        index = self._index
        if any(map(index.__contains__, hs)):
            self._register_each(blocks, hs, done, parent)
        else:  # all new: one chain of nodes below parent
            new = blocks[done:full]
            index.update(zip(hs, new, strict=True))
            block_hash, par, children = self._block_hash, self._parent, self._children
            children[parent] += 1
            for h, b in zip(hs, new, strict=True):
                block_hash[b] = h
                par[b] = parent
                children[b] = 1
                parent = b
            children[parent] = 0
        self._committed[req] = full

    def _register_each(self, blocks: list[int], hs: list[int], done: int,
                       parent: int) -> None:
        index, block_hash, ref = self._index, self._block_hash, self._ref_cnt
        for i, h in enumerate(hs, start=done):
            b = blocks[i]
            node = index.get(h)
            if node is None:
                index[h] = b
                block_hash[b] = h
                self._parent[b] = parent
                self._children[parent] += 1
            elif node != b:
                if not ref[node]:
                    self._num_evictable -= 1
                ref[node] += 1
                blocks[i] = node
                ref[b] -= 1
                assert not ref[b], "a fresh block is held by its request only"
                self._free.append(b)
                b = node
            parent = b

    def _evict(self, num_blocks: int) -> None:
        """Evict ``num_blocks`` unreferenced leaves, least recently used first; a parent
        left childless and unreferenced becomes a leaf in its turn (taken at once when
        it is older than every other candidate)."""
        heap, ref, children = self._heap, self._ref_cnt, self._children
        block_hash, tick, parent = self._block_hash, self._tick, self._parent
        index, free = self._index, self._free
        evicted = 0
        while evicted < num_blocks:
            t, b = heapq.heappop(heap)
            h = block_hash[b]
            if h is None or ref[b] or children[b] or tick[b] != t:
                continue  # a stale entry: touched, grown or evicted since it was pushed
            while True:
                del index[h]  # type: ignore[arg-type]
                block_hash[b] = None
                free.append(b)
                evicted += 1
                p = parent[b]
                children[p] -= 1
                if not p or children[p] or ref[p]:
                    break
                if evicted == num_blocks or (heap and heap[0] < (tick[p], p)):
                    heapq.heappush(heap, (tick[p], p))
                    break
                b, h = p, block_hash[p]
        self._num_evictable -= evicted
        self.stats.evicted_blocks += evicted
        if len(heap) > 4 * self.num_gpu_blocks + 1024:
            self._heap = [(t, b) for t, b in heap if block_hash[b] is not None
                          and not ref[b] and not children[b] and tick[b] == t]
            heapq.heapify(self._heap)

    def allocate_cached(self, req: Request, hit: list[int], num_tokens: int) -> bool:
        if self.num_new_blocks(req, hit, num_tokens) > self.num_free_blocks:
            return False
        ref = self._ref_cnt
        for b in hit:
            if not ref[b]:
                self._num_evictable -= 1
            ref[b] += 1
        req.block_ids = list(hit)
        self._admitted(req, hit)
        ok = self.allocate_up_to(req, num_tokens)
        assert ok is not None, "checked above"
        return True

    def free(self, request: Request) -> int:
        """Release the request's path: its nodes are stamped now and stay cached (a
        childless one becomes an eviction candidate); other blocks go back to the empty
        pool. Returns how many blocks became free."""
        self._release(request)
        ref = self._ref_cnt
        zero: list[int] = []
        for b in reversed(request.block_ids):
            left = ref[b] - 1
            ref[b] = left
            if not left:
                zero.append(b)
        request.block_ids = []
        if zero:
            self._clock += 1
            clock, block_hash, children, tick = (self._clock, self._block_hash,
                                                 self._children, self._tick)
            nodes = [b for b in zero if block_hash[b] is not None]
            if len(nodes) < len(zero):
                self._free += [b for b in zero if block_hash[b] is None]
            self._num_evictable += len(nodes)
            for b in nodes:
                tick[b] = clock
                if not children[b]:
                    heapq.heappush(self._heap, (clock, b))
        return len(zero)

    def check_invariants(self) -> None:
        """Assert the tree and pool are consistent (for tests)."""
        ref, block_hash = self._ref_cnt, self._block_hash
        empty = set(self._free)
        assert len(empty) == len(self._free), "duplicate block in the empty pool"
        self._check_common(empty)
        for b in empty:
            assert block_hash[b] is None, f"empty block {b} is a node"
        nodes = [b for b in range(1, self.num_gpu_blocks) if block_hash[b] is not None]
        children = [0] * self.num_gpu_blocks
        for b in nodes:
            p = self._parent[b]
            assert p == 0 or block_hash[p] is not None, f"node {b} hangs off a non-node"
            children[p] += 1
            if ref[b]:
                assert p == 0 or ref[p], f"held node {b} below an unreferenced node"
        assert children[1:] == self._children[1:], "child counts"
        evictable = [b for b in nodes if not ref[b]]
        assert len(evictable) == self._num_evictable, "evictable count"
        live = {(t, b) for t, b in self._heap}
        for b in evictable:
            if not children[b]:
                assert (self._tick[b], b) in live, f"evictable leaf {b} not in the heap"
        held = sum(1 for b in range(1, self.num_gpu_blocks) if ref[b] > 0)
        assert held + len(empty) + len(evictable) == self.num_usable_blocks
