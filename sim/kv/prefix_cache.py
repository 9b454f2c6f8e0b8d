"""Prefix caching: the base class both caches share and their statistics. vLLM's
automatic prefix cache (``BlockHashCache``) is sim/kv/block_cache.py, SGLang's radix tree
sim/kv/radix_cache.py, the factory sim/kv/factory.py; what a prompt says and what names
each of its blocks (segments, chains, spans) is sim/kv/prefix_content.py. User guide:
docs/prefix_caching.md.

**The cache interface** (both modes subclass KVCacheManager, so the engine and the
decode paths use them unchanged) is vLLM's two calls: ``get_computed_blocks(req)`` gives a
waiting request's hit, a frozen ``ComputedBlocks``: the cached blocks of its longest cached
prefix, capped so the last known token is always computed (vLLM's ``num_tokens - 1``, in
whole blocks), and the tokens they hold; ``allocate_slots(req, n, hit)`` admits it with
those blocks (reference counted) and ``n`` new tokens after them, setting
``num_computed_tokens`` to the hit, so the engine schedules only the rest and the cost
model prices the prefill over the cached context; None (nothing changes) when the blocks
do not fit. Between the two, ``get_num_blocks_to_allocate(req, num_tokens, hit)`` says how
many free blocks that would take (a policy's admission test), and ``may_fit`` rules out,
without a lookup, a request whose whole sequence cannot fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np
from mypy_extensions import mypyc_attr

from sim.kv.block_pool import KVCacheManager, cdiv
from sim.kv.prefix_content import prefix_spans
from sim.kv.prefix_index import PrefixIndex
from sim.request import Request

_NO_BLOCKS = np.zeros(0, np.int64)
_NO_BLOCKS.flags.writeable = False
# A lookup as long as this that finds what the request's last one found keeps its list
# (no Python int per block made again).
_SAME_CHECK = 32


@dataclass(frozen=True, slots=True)
class ComputedBlocks:
    """A waiting request's prefix-cache hit, from ``get_computed_blocks`` for
    ``allocate_slots`` (vLLM's KVCacheBlocks with num_new_computed_tokens): the cached
    blocks of its longest cached prefix, first block first, and the tokens they hold.
    ``array`` is ``block_ids`` as int64 (the cache's vector operations read it). Both
    belong to the cache's memo of the lookup: read them, never change them."""

    block_ids: list[int]
    num_computed_tokens: int
    array: np.ndarray = field(repr=False, compare=False)


@dataclass(slots=True)
class PrefixCacheStats:
    """Token counts of the cache lookups that led to an admission, first admissions apart
    from re-admissions after a preemption (as vLLM's PrefixCacheStats), and evictions."""

    num_admissions: int = 0
    num_admissions_with_hit: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    num_readmissions: int = 0
    readmission_queried_tokens: int = 0
    readmission_hit_tokens: int = 0
    evicted_blocks: int = 0

    def record(self, req: Request, hit_tokens: int) -> None:
        if req.num_preemptions:
            self.num_readmissions += 1
            self.readmission_queried_tokens += req.num_tokens
            self.readmission_hit_tokens += hit_tokens
            return
        req.num_cached_tokens = hit_tokens
        self.num_admissions += 1
        self.num_admissions_with_hit += hit_tokens > 0
        self.queried_tokens += req.num_tokens
        self.hit_tokens += hit_tokens


def prefix_cache_summary(mode: str, stats: PrefixCacheStats | None,
                         block_size: int) -> dict[str, Any]:
    """summary.json's ``prefix_cache``: hit rate (cached / looked-up prompt tokens over
    first admissions), prefill tokens saved (every hit, re-admissions included), evicted
    cached blocks, and the counts behind them."""
    s = stats or PrefixCacheStats()
    return {
        "mode": mode,
        "hit_rate_tokens": s.hit_tokens / s.queried_tokens if s.queried_tokens else None,
        "prefill_tokens_saved": s.hit_tokens + s.readmission_hit_tokens,
        "evictions": s.evicted_blocks,
        "evicted_tokens": s.evicted_blocks * block_size,
        "queried_tokens": s.queried_tokens,
        "hit_tokens": s.hit_tokens,
        "num_admissions": s.num_admissions,
        "num_admissions_with_hit": s.num_admissions_with_hit,
        "preempted_queried_tokens": s.readmission_queried_tokens,
        "preempted_hit_tokens": s.readmission_hit_tokens,
    }


def cache_summary(kvs: Sequence[KVCacheManager], block_size: int) -> dict[str, Any]:
    """summary.json's ``prefix_cache`` over the pools of a run: one engine's, or a
    cluster's replicas' with their statistics summed (so the hit rate is the cluster's
    cached over looked-up tokens); mode "none" when the pools cache nothing."""
    caches = [kv for kv in kvs if isinstance(kv, PrefixCachingKV)]
    if not caches:
        return prefix_cache_summary("none", None, block_size)
    total = PrefixCacheStats(*(sum(getattr(kv.stats, f.name) for kv in caches)
                               for f in fields(PrefixCacheStats)))
    return prefix_cache_summary(caches[0].mode, total, block_size)


@mypyc_attr(allow_interpreted_subclasses=True)  # the radix cache
class PrefixCachingKV(KVCacheManager):
    """What both cache modes share: the block index (sim/kv/prefix_index.py), reference
    counts (a numpy array, so a chunk's blocks are counted in one operation), how many of
    each request's blocks are registered, the lookup and the statistics. Subclasses own
    the free pool, eviction and registration."""

    __slots__ = ("_arrays", "_committed", "_index", "_last_lookup", "_ref_cnt", "_registered",
                 "_touched", "_unregistered", "stats")
    mode: ClassVar[str] = ""

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self._ref_cnt = np.zeros(num_gpu_blocks, np.int64)
        self._index = PrefixIndex(num_gpu_blocks, block_size,
                                  lambda req: prefix_spans(req, block_size))
        self._committed: dict[Request, int] = {}
        # Holding requests with a full prompt block not indexed yet (_decodes_registering).
        self._unregistered: set[Request] = set()
        # A holding request's block_ids as an array: [buffer, n], buffer[:n] ==
        # block_ids[:n]; blocks appended one at a time (decodes) are copied when needed.
        self._arrays: dict[Request, list[Any]] = {}
        # A waiting request's last lookup: the counts of blocks registered and evicted
        # then, its limit and its hit (get_computed_blocks, may_fit); blocks ever
        # registered (a hit grows by at most one each).
        self._last_lookup: dict[Request, tuple[int, int, int, ComputedBlocks]] = {}
        self._registered = 0
        # The last hit asked about in get_num_blocks_to_allocate and how many of its
        # blocks were free, for the admission that follows at once; reset by lookups and
        # admissions.
        self._touched: tuple[ComputedBlocks | None, int] = (None, 0)
        self.stats = PrefixCacheStats()

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - 1 - self.num_free_blocks

    def can_fit(self, request: Request, num_tokens: int) -> bool:
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        return need <= self.num_free_blocks

    # -- lookup --
    def get_computed_blocks(self, req: Request) -> ComputedBlocks:
        """``req``'s hit: the cached blocks of its longest cached prefix, at most
        (num_tokens - 1) // block_size of them, so the last known token is always
        computed (vLLM's ``max_cache_hit_length``; SGLang's ``input_len - 1``). Changes
        nothing. A lookup is kept with the counts of blocks registered and evicted then,
        which every change of the index moves: asked again before either moved (a head of
        waiting that did not fit, asked by may_fit and then by the policy), it gives the
        same hit without looking up again."""
        limit = (req.num_tokens - 1) // self.block_size
        last = self._last_lookup.get(req)
        evicted = self.stats.evicted_blocks
        if (last is not None and last[0] == self._registered and last[1] == evicted
                and last[2] == limit):
            hit = last[3]
        else:
            found = (self._index.lookup(self._index.positions(req, limit), limit)
                     if limit > 0 else _NO_BLOCKS)
            if (last is not None and len(found) == len(last[3].block_ids) > _SAME_CHECK
                    and (found == last[3].array).all()):
                hit = last[3]  # unchanged: a blocked head of waiting, asked again
            else:
                hit = ComputedBlocks(found.tolist(), len(found) * self.block_size, found)
            self._last_lookup[req] = (self._registered, evicted, limit, hit)
        self._touched = (None, 0)
        return hit

    def peek_hit_tokens(self, req: Request) -> int:
        """Tokens of ``req``'s prompt a lookup would find cached here now, recording
        nothing for ``req`` (a router asking every replica about a request that only one
        of them will get). Slots the lookup needs may be made, as any lookup makes
        them."""
        limit = (req.num_tokens - 1) // self.block_size
        if limit <= 0:
            return 0
        found = self._index.lookup(self._index.positions(req, limit), limit)
        self._index.forget(req)  # (a request is routed before any replica holds it)
        return len(found) * self.block_size

    def cached_prefix_tokens(self, req: Request) -> int:
        """Tokens of ``req``'s prompt a lookup now would find cached."""
        return self.get_computed_blocks(req).num_computed_tokens

    def may_fit(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        """False when admitting ``req`` for ``num_tokens`` tokens certainly needs more
        than the free blocks less ``reserve`` (a necessary condition: its uncached
        blocks fit). Its hit is the last lookup's when no block was registered since
        (evictions only shrink it); otherwise, unless even a hit grown by every block
        registered since could not make it fit, it is looked up again. So the answer
        is exact as far as the hit goes, which is what lets a policy's
        ``waiting_blocked`` see a head of waiting blocked for lack of blocks, and the
        engine advance the running requests' decodes in runs meanwhile (the answer
        stays False while they only decode: they register nothing and free nothing)."""
        last = self._last_lookup.get(req)
        if last is None:
            return True
        need = -(-num_tokens // self.block_size)
        room = self.num_free_blocks - reserve
        registered = self._registered - last[0]
        hit = len(last[3].block_ids)
        if need - hit - registered > room:
            return False
        if registered:
            return need - len(self.get_computed_blocks(req).block_ids) <= room
        return need - hit <= room

    # -- admission --
    def get_num_blocks_to_allocate(self, req: Request, num_tokens: int,
                                   hit: ComputedBlocks) -> int:
        """Free blocks that admitting ``req`` with ``hit`` for ``num_tokens`` tokens in
        all would take: new blocks plus the hit blocks that were free (evictable), whose
        count it leaves in ``_touched`` (allocate_slots asks it first)."""
        if hit is self._touched[0]:  # asked again about the same lookup, nothing changed
            touched = self._touched[1]
        else:
            touched = (len(hit.block_ids) - int(np.count_nonzero(self._ref_cnt[hit.array]))
                       if hit.block_ids else 0)
            self._touched = (hit, touched)
        return (cdiv(num_tokens, self.block_size) - len(hit.block_ids) - len(req.block_ids)
                + touched)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       hit: ComputedBlocks | None = None) -> list[int] | None:
        """Make room for ``num_new_tokens`` more computed tokens of ``request``. With
        ``hit`` (get_computed_blocks' answer for a request holding no blocks) admit it:
        it holds the hit's blocks (a reference each), its num_computed_tokens starts at
        the hit (recorded in ``stats``) and the new tokens follow. Returns the newly
        allocated block ids, or None when the blocks do not fit; nothing changes then."""
        if hit is None:
            return self.allocate_up_to(request, request.num_computed_tokens + num_new_tokens)
        assert not request.block_ids, "a hit is for a request holding no blocks"
        num_tokens = request.num_computed_tokens + hit.num_computed_tokens + num_new_tokens
        if self.get_num_blocks_to_allocate(request, num_tokens, hit) > self.num_free_blocks:
            return None
        if hit.block_ids:
            self._reuse(hit)
        self._set_blocks(request, hit)
        self._admitted(request, hit)
        self._touched = (None, 0)
        new = self.allocate_up_to(request, num_tokens)
        assert new is not None, "checked above"
        return new

    def _reuse(self, hit: ComputedBlocks) -> None:
        """Give each of the hit's blocks one more reference, taking those that were free
        (``_touched``) out of the free pool; the caller checked the blocks fit."""
        raise NotImplementedError

    # -- a request's blocks as an array --
    def _set_blocks(self, req: Request, hit: ComputedBlocks) -> None:
        """Admission: ``req`` holds the hit's blocks."""
        req.block_ids = list(hit.block_ids)
        h = hit.array
        # Room for every known token's block (a re-admission's hit may cover generated
        # ones) and some output: seldom grown.
        buf = np.empty(req.num_tokens // self.block_size + 64, np.int64)
        buf[:len(h)] = h
        self._arrays[req] = [buf, len(h)]

    def _add_blocks(self, req: Request, start: int, new: np.ndarray) -> None:
        """``new`` were appended to ``req.block_ids`` at ``start``."""
        a = self._arrays.get(req)
        if a is None:
            a = self._arrays[req] = [np.empty(max(64, 2 * (start + len(new))), np.int64), 0]
        buf, n = a
        end = start + len(new)
        if end > len(buf):
            buf = np.empty(2 * end, np.int64)
            buf[:n] = a[0][:n]
            a[0] = buf
        if n < start:
            buf[n:start] = req.block_ids[n:start]
        buf[start:end] = new
        a[1] = end

    def _blocks(self, req: Request) -> np.ndarray:
        """``req.block_ids`` as an array (a view: valid until its blocks change)."""
        blocks = req.block_ids
        a = self._arrays.get(req)
        if a is None:
            return np.array(blocks, np.int64)
        buf, n = a
        if n < len(blocks):
            if len(blocks) > len(buf):
                buf = np.empty(2 * len(blocks), np.int64)
                buf[:n] = a[0][:n]
                a[0] = buf
            buf[n:len(blocks)] = blocks[n:]
            a[1] = len(blocks)
        return buf[:len(blocks)]

    def _changed_blocks(self, req: Request, start: int) -> None:
        """``req.block_ids`` from ``start`` on were replaced."""
        a = self._arrays.get(req)
        if a is not None and a[1] > start:
            a[1] = start

    # -- registration --
    def _register(self, req: Request, full: int, drop: np.ndarray | None = None) -> bool:
        """Index the request's first ``full`` blocks (all full, their tokens known) from
        the first one not indexed yet; the caller checks there is one. ``drop``, and
        what it returns: as ``PrefixIndex.index``."""
        raise NotImplementedError

    def _decodes_registering(self, requests: list[Request]) -> bool:
        """allocate_one_each's start: when a prompt of ``requests`` is not wholly indexed
        yet (a prompt whose last chunk filled its last block without taking a new one:
        allocate_up_to indexes that block at the request's first decode, as the
        step-by-step path does), give each its next block through allocate_up_to and
        return True; otherwise do nothing and return False."""
        if self._unregistered.isdisjoint(requests):
            return False
        for r in requests:
            got = self.allocate_up_to(r, len(r.block_ids) * self.block_size + 1)
            assert got, "the caller checked the free blocks"
        return True

    def _committed_to(self, req: Request, full: int) -> None:
        """``req``'s first ``full`` blocks are indexed (or, at admission, its hit)."""
        self._committed[req] = full
        if full >= req.num_prompt_tokens // self.block_size:
            self._unregistered.discard(req)
        else:
            self._unregistered.add(req)

    def _release(self, request: Request) -> int:
        """Before freeing: index every computed full block not indexed yet (decode
        blocks, and prompt blocks that filled without a later allocation), then forget
        the request. Returns how many of its blocks (its first ones) are indexed."""
        full = request.num_computed_tokens // self.block_size
        if full > self._committed.get(request, 0):
            self._register(request, full)
        self._index.forget(request)
        self._unregistered.discard(request)
        return self._committed.pop(request, 0)

    def _admitted(self, req: Request, hit: ComputedBlocks) -> None:
        """Book-keeping of an admission with ``hit``: its blocks are registered already,
        its computed tokens start at the hit."""
        self._committed_to(req, len(hit.block_ids))
        self._last_lookup.pop(req, None)
        n = hit.num_computed_tokens
        req.num_computed_tokens = n
        self.stats.record(req, n)

    def _check_common(self, free: set[int]) -> None:
        ref = self._ref_cnt
        assert 0 not in free, "null block in free pool"
        assert ref.min() >= 0, "a block was freed more often than held"
        for b in free:
            assert ref[b] == 0, f"free block {b} has ref {ref[b]}"
        self._index.check()
