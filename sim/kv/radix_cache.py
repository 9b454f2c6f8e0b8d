"""SGLang's RadixAttention cache (``python/sglang/srt/mem_cache/radix_cache.py``) at KV-block
granularity (SGLang with ``page_size`` = block_size).

The tree. A node of SGLang's radix tree is a *run* here: a chain of cached full blocks,
top to bottom, whose last block (the run's *end*) carries the run (``_run``), its child
count and, for eviction, its access time; every block knows its run's end
(``_run_end``), a run's first block its parent (a run end, or 0 for the root: block 0
is the null block). Blocks are found through the per-segment index (sim/kv/prefix_index.py),
whose slots name the whole path from the root, so it is the tree's child lookup
flattened. Reference counts play SGLang's ``lock_ref``: a request holds whole runs from
the root down (where a request's path would end inside a run the run is split, as
SGLang splits a node where a match or an insert ends), so the blocks of a run always
have the same count.

Behaviour, as SGLang:
- A full prompt block is inserted when allocated, each allocation's blocks as one run
  (SGLang inserts each prefill chunk as it is computed); decode blocks when the request
  finishes or is preempted (SGLang inserts the output when the request finishes). A
  block whose node exists already is deduplicated: the request adopts the tree's block
  and its own goes back to the pool (SGLang frees the duplicate indices in
  ``cache_unfinished_req``).
- The pool hands out empty blocks first; only when they run out are cached blocks
  evicted: unreferenced *leaf runs*, least recently used first, a whole run at a time
  (SGLang evicts whole leaf nodes; a parent becomes a candidate once its last child is
  gone), so a shared prefix outlives the branches below it, unlike vLLM's free queue,
  which may drop a middle block of a chain.
- Access times (a logical clock) order the evictable leaves: a run is stamped (at its
  end; a split copies the stamp) when its last holder frees it, the moment it becomes
  evictable (SGLang stamps nodes on every match and insert; only the stamp a node has
  while unreferenced decides its turn, so stamping at release orders them the same
  way, except that a lookup which does not lead to admission refreshes nothing here).
"""

from __future__ import annotations

import heapq
from typing import ClassVar

import numpy as np

from sim.kv.block_pool import cdiv
from sim.kv.prefix_cache import ComputedBlocks, PrefixCachingKV
from sim.request import Request


class RadixCache(PrefixCachingKV):
    """The radix-tree prefix cache; same interface as BlockHashCache. ``_free`` holds the
    empty blocks (no node), a stack mirrored by the array ``_free_arr`` (so a chunk's
    blocks are taken as an array); free blocks = empty + unreferenced nodes (all
    evictable). Per-run state (``_run`` and its array ``_run_arr``, ``_children``,
    ``_tick``) lives at the run's end, the parent at its first block; ``_run_end`` (an
    array: a run's blocks are written at once) at every block."""

    __slots__ = ("_children", "_clock", "_free_arr", "_heap", "_num_evictable", "_parent",
                 "_run", "_run_arr", "_run_end", "_tick")
    mode: ClassVar[str] = "radix"

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self._run: list[list[int] | None] = [None] * num_gpu_blocks
        self._run_arr: list[np.ndarray | None] = [None] * num_gpu_blocks
        self._free_arr = np.zeros(num_gpu_blocks, np.int64)
        self._free_arr[:len(self._free)] = self._free
        self._run_end = np.zeros(num_gpu_blocks, np.int64)
        self._parent = [0] * num_gpu_blocks
        self._children = [0] * num_gpu_blocks
        self._tick = [0] * num_gpu_blocks
        self._clock = 0
        self._heap: list[tuple[int, int]] = []  # (tick, run end) of leaf runs, lazily
        self._num_evictable = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self._num_evictable

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - 1 - len(self._free) - self._num_evictable

    def allocate_up_to(self, request: Request, num_tokens: int) -> list[int] | None:
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        new: list[int] = []
        if need == 1 and self._free:  # a decode's next block
            b = self._free.pop()
            self._ref_cnt[b] = 1
            request.block_ids.append(b)
            new = [b]
        elif need > 0:
            free = self._free
            if need > len(free):
                if need > len(free) + self._num_evictable:
                    return None
                self._evict(need - len(free))
            new = free[-need:]
            del free[-need:]
            new.reverse()
            arr = self._free_arr[len(free):len(free) + need][::-1]
            self._ref_cnt[arr] = 1
            self._add_blocks(request, len(request.block_ids), arr)  # copies arr
            request.block_ids += new
        full = min(num_tokens, request.num_prompt_tokens) // self.block_size
        if full > self._committed.get(request, 0):
            self._register(request, full)
        return new

    def allocate_one_each(self, requests: list[Request]) -> None:
        free, ref = self._free, self._ref_cnt
        n = len(requests)
        if self._decodes_registering(requests):
            return
        if n > len(free):  # as one at a time: a leaf run is evicted when none is empty
            for r in requests:
                if not free:
                    self._evict(1)
                b = free.pop()
                ref[b] = 1
                r.block_ids.append(b)
            return
        if n > 8:  # a decode run's blocks (sim/decode_group.py): as arrays
            k = len(free)
            ref[self._free_arr[k - n:k]] = 1
            new = free[k - n:]
            del free[k - n:]
            for r, b in zip(requests, reversed(new), strict=True):  # popped last first
                r.block_ids.append(b)
            return
        for r in requests:
            b = free.pop()
            ref[b] = 1
            r.block_ids.append(b)

    def _push_free(self, blocks: list[int], arr: np.ndarray | list[int]) -> None:
        """Put ``blocks`` (``arr``: the same as an array) on the empty pool."""
        n = len(self._free)
        self._free_arr[n:n + len(blocks)] = arr
        self._free += blocks

    # -- the tree --
    def _split(self, m: int) -> None:
        """Make node ``m`` the end of a run (split its run below it, as SGLang splits a
        node where a match or an insert ends)."""
        end = int(self._run_end[m])
        if end == m:
            return
        run = self._run[end]
        assert run is not None
        k = run.index(m) + 1
        top, bottom = run[:k], run[k:]
        self._run[m], self._run[end] = top, bottom
        arr = self._run_arr[end]
        assert arr is not None
        self._run_arr[m], self._run_arr[end] = arr[:k], arr[k:]
        self._run_end[top] = m
        self._tick[m] = self._tick[end]
        self._parent[bottom[0]] = m
        self._children[m] = 1

    def _register(self, req: Request, full: int, drop: np.ndarray | None = None) -> bool:
        """Insert the request's blocks [committed, full) as a run below its path; a
        leading stretch whose nodes exist already is adopted instead (deduplicated).
        ``drop`` is never given here (blocks come from the empty pool, not indexed)."""
        done = self._committed.get(req, 0)
        blocks = req.block_ids
        parent = blocks[done - 1] if done else 0
        self._registered += full - done
        ids = self._blocks(req)[done:full]
        k = 0
        if not self._index.index_new(req, done, ids):  # not an answer of its own
            pos = self._index.positions(req, full, done)
            # A node's parent is never evicted before it, so existing nodes come first
            # (an existing node after them would be overwritten below: check_invariants
            # finds such a block away from its slot).
            held = self._index.held(pos)
            k = len(held)
            if k:
                self._adopt(req, held.tolist(), done)
                parent = int(held[-1])
                self._split(parent)
            if done + k < full:
                ids = self._blocks(req)[done + k:full]
                self._index.insert(pos[k:], ids, keep=False)
        if done + k < full:
            run = blocks[done + k:full]
            end = run[-1]
            self._run_end[ids] = end
            self._run[end] = run
            self._run_arr[end] = ids.copy()
            self._parent[run[0]] = parent
            self._children[end] = 0
            self._children[parent] += 1
        self._committed_to(req, full)
        return True

    def _adopt(self, req: Request, nodes: list[int], start: int) -> None:
        """The request's blocks from ``start`` become ``nodes`` (existing, same
        content); its own copies go back to the empty pool."""
        ref = self._ref_cnt
        x = np.array(nodes, np.int64)
        self._num_evictable -= int(np.count_nonzero(ref[x] == 0))
        ref[x] += 1
        blocks = req.block_ids
        own = blocks[start:start + len(nodes)]
        ref[own] = 0
        self._push_free(own, own)
        blocks[start:start + len(nodes)] = nodes
        self._changed_blocks(req, start)

    def _evict(self, num_blocks: int) -> None:
        """Evict at least ``num_blocks`` unreferenced blocks, a whole leaf run at a time,
        least recently used first."""
        heap, ref, children = self._heap, self._ref_cnt, self._children
        tick, runs, run_arr, free = self._tick, self._run, self._run_arr, self._free
        first = len(free)
        gone: list[np.ndarray] = []
        while len(free) - first < num_blocks:
            t, e = heapq.heappop(heap)
            run = runs[e]
            if run is None or ref[e] or children[e] or tick[e] != t:
                continue  # a stale entry: touched, grown or evicted since it was pushed
            free += run
            gone.append(run_arr[e])  # type: ignore[arg-type]
            runs[e] = run_arr[e] = None
            p = self._parent[run[0]]
            children[p] -= 1
            if p and not children[p] and not ref[p]:
                heapq.heappush(heap, (tick[p], p))
        evicted = len(free) - first
        blocks = gone[0] if len(gone) == 1 else np.concatenate(gone)
        self._free_arr[first:len(free)] = blocks
        self._index.unindex(blocks)  # a run's blocks are all nodes
        self.stats.evicted_blocks += evicted
        self._num_evictable -= evicted
        if len(heap) > 4 * self.num_gpu_blocks + 1024:
            self._heap = [(t, e) for t, e in heap if runs[e] is not None
                          and not ref[e] and not children[e] and tick[e] == t]
            heapq.heapify(self._heap)

    # -- admission and release --
    def _reuse(self, hit: ComputedBlocks) -> None:
        self._split(hit.block_ids[-1])  # SGLang splits the matched node here
        self._num_evictable -= self._touched[1]  # the hit blocks that were free
        self._ref_cnt[hit.array] += 1

    def free(self, request: Request) -> int:
        """Release the request's path: its runs are stamped now and stay cached (its
        deepest run, when childless, becomes an eviction candidate); its other blocks go
        back to the empty pool. Returns how many blocks became free."""
        num_nodes = self._release(request)  # its first num_nodes blocks are nodes
        blocks = request.block_ids
        arr = self._blocks(request)
        self._arrays.pop(request, None)
        request.block_ids = []
        ref = self._ref_cnt
        nodes = arr[:num_nodes]
        left = ref[nodes]
        left -= 1
        ref[nodes] = left
        private = blocks[num_nodes:]  # never shared: the request held them alone
        ref[arr[num_nodes:]] = 0
        self._push_free(private, arr[num_nodes:])
        num_zero = int(np.count_nonzero(left == 0))
        if num_zero:
            # The unreferenced nodes are the path's last runs (a held run never hangs
            # below an unreferenced one), the deepest ending the path.
            self._clock += 1
            self._num_evictable += num_zero
            tick, parent, runs = self._tick, self._parent, self._run
            e = deepest = blocks[num_nodes - 1]
            while True:
                tick[e] = self._clock
                p = parent[runs[e][0]]  # type: ignore[index]
                if not p or ref[p]:
                    break
                e = p
            if not self._children[deepest]:
                heapq.heappush(self._heap, (self._clock, deepest))
        return num_zero + len(private)

    def check_invariants(self) -> None:
        """Assert the tree and pool are consistent (for tests)."""
        ref, runs, key = self._ref_cnt, self._run, self._index.key
        empty = set(self._free)
        assert len(empty) == len(self._free), "duplicate block in the empty pool"
        assert self._free_arr[:len(self._free)].tolist() == self._free, "empty pool array"
        self._check_common(empty)
        for b in empty:
            assert not key[b], f"empty block {b} is a node"
        nodes = {b for b in range(1, self.num_gpu_blocks) if key[b]}
        children = [0] * self.num_gpu_blocks
        in_runs = 0
        for e in range(1, self.num_gpu_blocks):
            run = runs[e]
            if run is None:
                continue
            assert run[-1] == e and all(b in nodes for b in run), f"run of {e}"
            assert len({int(ref[b]) for b in run}) == 1, f"run {e} partly held"
            assert all(self._run_end[b] == e for b in run), f"run ends of {e}"
            assert self._run_arr[e].tolist() == run, f"run array of {e}"  # type: ignore[union-attr]
            in_runs += len(run)
            p = self._parent[run[0]]
            assert p == 0 or runs[p] is not None, f"run {e} hangs off a non-run end"
            children[p] += 1
            if ref[e]:
                assert p == 0 or ref[p], f"held run {e} below an unreferenced run"
        assert in_runs == len(nodes), "a node outside every run"
        ends = [e for e in range(1, self.num_gpu_blocks) if runs[e] is not None]
        assert all(children[e] == self._children[e] for e in ends), "child counts"
        evictable = [b for b in nodes if not ref[b]]
        assert len(evictable) == self._num_evictable, "evictable count"
        live = set(self._heap)
        for e in ends:
            if not ref[e] and not children[e]:
                assert (self._tick[e], e) in live, f"evictable leaf run {e} not in the heap"
        held = sum(1 for b in range(1, self.num_gpu_blocks) if ref[b] > 0)
        assert held + len(empty) + len(evictable) == self.num_usable_blocks
