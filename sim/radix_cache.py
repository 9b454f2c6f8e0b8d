"""SGLang's RadixAttention cache (``python/sglang/srt/mem_cache/radix_cache.py``) at KV-block
granularity (SGLang with ``page_size`` = block_size).

The tree. A node of SGLang's radix tree is a *run* here: a chain of cached full blocks,
top to bottom, whose last block (the run's *end*) carries the run (``_run``), its child
count and, for eviction, its access time; every block knows its run's end
(``_run_end``), a run's first block its parent (a run end, or 0 for the root: block 0
is the null block). Blocks are found through the per-segment index (sim/prefix_cache.py),
whose keys name the whole path from the root, so it is the tree's child lookup
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
from sim.prefix_cache import PrefixCachingKV
from sim.request import Request


class RadixCache(PrefixCachingKV):
    """The radix-tree prefix cache; same interface as BlockHashCache. ``_free`` holds the
    empty blocks (no node); free blocks = empty + unreferenced nodes (all evictable)."""

    __slots__ = ("_children", "_clock", "_heap", "_num_evictable", "_parent", "_run",
                 "_run_end", "_run_slots", "_tick")
    mode: ClassVar[str] = "radix"

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self._run: list[list[int] | None] = [None] * num_gpu_blocks
        self._run_end = [0] * num_gpu_blocks
        # Where a run's blocks sit in the segment index: (slot list, first slot, count).
        self._run_slots: list[list[tuple[list[int], int, int]] | None] = [None] * num_gpu_blocks
        self._parent = [0] * num_gpu_blocks
        self._children = [0] * num_gpu_blocks
        self._tick = [0] * num_gpu_blocks
        self._clock = 0
        self._heap: list[tuple[int, int]] = []  # (tick, run end) of leaf runs, lazily
        self._num_evictable = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self._num_evictable

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
            ref = self._ref_cnt
            for b in new:
                ref[b] = 1
            request.block_ids.extend(new)
        full = min(num_tokens, request.num_prompt_tokens) // self.block_size
        if full > self._committed.get(request, 0):
            self._register(request, full)
        return new

    # -- the tree --
    def _split(self, m: int) -> None:
        """Make node ``m`` the end of a run (split its run below it, as SGLang splits a
        node where a match or an insert ends)."""
        end = self._run_end[m]
        if end == m:
            return
        run = self._run[end]
        assert run is not None
        k = run.index(m) + 1
        top, bottom = run[:k], run[k:]
        self._run[m], self._run[end] = top, bottom
        parts = self._run_slots[end]
        assert parts is not None
        left = k
        for j, (slots, s0, n) in enumerate(parts):
            if left >= n:
                left -= n
                continue
            top_parts = [*parts[:j], (slots, s0, left)] if left else parts[:j]
            self._run_slots[m] = top_parts
            self._run_slots[end] = [(slots, s0 + left, n - left), *parts[j + 1:]]
            break
        run_end = self._run_end
        for b in top:
            run_end[b] = m
        self._parent[bottom[0]] = m
        self._children[m] = 1

    def _register(self, req: Request, full: int) -> None:
        """Insert the request's blocks [committed, full) as a run below its path; a
        leading stretch whose nodes exist already is adopted instead (deduplicated)."""
        done = self._committed.get(req, 0)
        blocks = req.block_ids
        parent = blocks[done - 1] if done else 0
        self._registered += full - done
        ranges = self._slot_ranges(req, done, full)
        held: list[int] = []
        for slots, i0, i1, _ in ranges:
            held += slots[i0:i1]
        # A node's parent is never evicted before it, so existing nodes come first.
        k = held.index(0) if 0 in held else len(held)
        assert not any(held[k:]), "an existing node below a missing one"
        if k:
            self._adopt(blocks, held[:k], done)
            parent = held[k - 1]
            self._split(parent)
        pos = done + k
        if pos < full:
            parts = []
            for slots, i0, i1, a in ranges:
                lo, hi = max(a, pos), a + i1 - i0
                if lo < hi:
                    self._index_blocks(slots, i0 + lo - a, blocks[lo:hi])
                    parts.append((slots, i0 + lo - a, hi - lo))
            new = blocks[pos:full]
            run_end, end = self._run_end, new[-1]
            for b in new:
                run_end[b] = end
            self._run[end] = new
            self._run_slots[end] = parts
            self._parent[new[0]] = parent
            self._children[end] = 0
            self._children[parent] += 1
        self._committed[req] = full

    def _adopt(self, blocks: list[int], nodes: list[int], start: int) -> None:
        """The request's blocks from ``start`` become ``nodes`` (existing, same
        content); its own copies go back to the empty pool."""
        ref = self._ref_cnt
        for i, x in enumerate(nodes, start=start):
            if not ref[x]:
                self._num_evictable -= 1
            ref[x] += 1
            b = blocks[i]
            ref[b] = 0
            self._free.append(b)
            blocks[i] = x

    def _evict(self, num_blocks: int) -> None:
        """Evict at least ``num_blocks`` unreferenced blocks, a whole leaf run at a time,
        least recently used first."""
        heap, ref, children = self._heap, self._ref_cnt, self._children
        tick, runs, free, where = self._tick, self._run, self._free, self._where
        evicted = 0
        while evicted < num_blocks:
            t, e = heapq.heappop(heap)
            run = runs[e]
            if run is None or ref[e] or children[e] or tick[e] != t:
                continue  # a stale entry: touched, grown or evicted since it was pushed
            for slots, s0, n in self._run_slots[e]:  # type: ignore[union-attr]
                slots[s0:s0 + n] = [0] * n
            for b in run:
                where[b] = None
            self._count_evictions(len(run))
            runs[e] = self._run_slots[e] = None
            free += run
            evicted += len(run)
            p = self._parent[run[0]]
            children[p] -= 1
            if p and not children[p] and not ref[p]:
                heapq.heappush(heap, (tick[p], p))
        self._num_evictable -= evicted
        if len(heap) > 4 * self.num_gpu_blocks + 1024:
            self._heap = [(t, e) for t, e in heap if runs[e] is not None
                          and not ref[e] and not children[e] and tick[e] == t]
            heapq.heapify(self._heap)

    # -- admission and release --
    def allocate_cached(self, req: Request, hit: list[int], num_tokens: int) -> bool:
        if self.num_new_blocks(req, hit, num_tokens) > self.num_free_blocks:
            return False
        if hit:
            self._split(hit[-1])  # SGLang splits the matched node here
        ref = self._ref_cnt
        for b in hit:
            if not ref[b]:
                self._num_evictable -= 1
            ref[b] += 1
        req.block_ids = list(hit)
        self._admitted(req, hit)
        self._touched = (None, 0)
        ok = self.allocate_up_to(req, num_tokens)
        assert ok is not None, "checked above"
        return True

    def free(self, request: Request) -> int:
        """Release the request's path: its nodes are stamped now and stay cached (its
        deepest run, when childless, becomes an eviction candidate); its other blocks go
        back to the empty pool. Returns how many blocks became free."""
        num_nodes = self._release(request)  # its first num_nodes blocks are nodes
        blocks = request.block_ids
        request.block_ids = []
        nodes = self._unref(blocks[:num_nodes])  # deepest first
        private = blocks[num_nodes:]  # never shared: the request held them alone
        for b in private:
            self._ref_cnt[b] = 0
        self._free += private
        if nodes:
            self._clock += 1
            clock, tick = self._clock, self._tick
            self._num_evictable += len(nodes)
            for b in nodes:
                tick[b] = clock
            # The path's deepest node ends a run (the path is whole runs); every other
            # node of the path has a child on it.
            if not self._children[nodes[0]]:
                heapq.heappush(self._heap, (clock, nodes[0]))
        return len(nodes) + len(private)

    def check_invariants(self) -> None:
        """Assert the tree and pool are consistent (for tests)."""
        ref, where, runs = self._ref_cnt, self._where, self._run
        empty = set(self._free)
        assert len(empty) == len(self._free), "duplicate block in the empty pool"
        self._check_common(empty)
        for b in empty:
            assert where[b] is None, f"empty block {b} is a node"
        nodes = {b for b in range(1, self.num_gpu_blocks) if where[b] is not None}
        children = [0] * self.num_gpu_blocks
        in_runs = 0
        for e in range(1, self.num_gpu_blocks):
            run = runs[e]
            if run is None:
                continue
            assert run[-1] == e and all(b in nodes for b in run), f"run of {e}"
            assert len({ref[b] for b in run}) == 1, f"run {e} partly held"
            assert all(self._run_end[b] == e for b in run), f"run ends of {e}"
            parts = self._run_slots[e] or []
            assert [b for sl, s0, n in parts for b in sl[s0:s0 + n]] == run, f"slots of {e}"
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
