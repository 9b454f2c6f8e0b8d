"""Prefix caching (issue 9): what a prompt says, what names each of its blocks, the index
both caches share, and vLLM's automatic prefix cache (``BlockHashCache``); SGLang's radix
tree is sim/radix_cache.py. User guide: docs/prefix_caching.md.

**Prompt content without tokens.** A request's prompt is a chain of *segments*, ``(segment
id, tokens)`` pairs summing to its length (``Request.prompt_segments``): token t is named
by the segment it lies in and its offset there, so two prompts agree up to position e
exactly when their segments do. A Mooncake trace's ``hash_ids`` are segments of 512 tokens
(``mooncake_segments``; the last one holds the remainder); a synthetic system prompt or
conversation history is one segment reused by many requests. The tokens a request
generates form one more segment after its prompt, its *answer*, whose id is derived from
the request id (``answer_segment_id``): a multi-turn session puts (answer of turn t, its
length) into the prompt of turn t + 1, so turn t's decode blocks can hit. A request with
no segments gets one segment of its own (``unique_segment_id``): it shares nothing with
other requests but still finds its own blocks after a preemption.

**Block identity.** Engine block j covers tokens [j*bs, (j+1)*bs) and is named by every
token before its end e = (j+1)*bs, i.e. by (the segment chain through the segment k that
holds token e - 1, e), with ``chain_0 = hash((ROOT, 0, id_0))`` and ``chain_k+1 =
hash((chain_k, len_k, id_k+1))`` (64-bit tuple hashes; equal chains mean equal prefixes up
to collisions), which plays the part of vLLM's chained block hash (``hash(parent, block
tokens)``). Blocks are therefore indexed per segment: ``_slots[chain_k]`` lists the cached
blocks of the full blocks ending in segment k, in order (0 = not cached), and a request
keeps its *spans*, (chain_k, first block, end block) per segment (``prefix_spans``,
computed once, lazily: no token lists, no per-block hashes), so lookups and inserts are
list slices. Only full blocks are cached, and only as far as their tokens are known
(prompt, then sampled tokens). When bs divides 512, block j of a Mooncake prompt lies in
Mooncake block j*bs // 512 and is named by (the Mooncake ids up to that block,
sub-index); when it does not, a block straddling two Mooncake blocks is named by the
later one's chain, which covers both, so a hit stops at the first engine block that
reaches into a differing Mooncake block.

**The cache interface** (both modes subclass KVCacheManager, so policies and the engine
use them unchanged): ``get_computed_blocks(req)`` gives the cached blocks of the longest
cached prefix of a waiting request, capped so the last known token is always computed
(vLLM's ``num_tokens - 1``, in whole blocks); ``num_new_blocks(req, hit, n)`` is how many
free blocks admitting it would take; ``allocate_cached(req, hit, n)`` admits it with those
blocks (reference counted) and sets ``num_computed_tokens`` to the hit, so the engine
schedules only the rest and the cost model prices the prefill over the cached context.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, ClassVar

from sim.config import PREFIX_CACHE_MODES
from sim.kv_cache import KVCacheManager, cdiv
from sim.request import Request

__all__ = ["PREFIX_CACHE_MODES", "BlockHashCache", "PrefixCachingKV", "make_kv"]
#: Tokens per Mooncake ``hash_ids`` entry (FAST'25 traces).
MOONCAKE_BLOCK_TOKENS = 512
_ROOT = 0x5E12E51
_OPEN = 1 << 62  # the answer segment's end block

Segments = tuple[tuple[int, int], ...]


def _segment_id(kind: bytes, request_id: str) -> int:
    digest = hashlib.blake2b(request_id.encode(), digest_size=8, person=kind).digest()
    return int.from_bytes(digest, "little") >> 1


def answer_segment_id(request_id: str) -> int:
    """The segment id of the tokens ``request_id`` generates (stable across runs)."""
    return _segment_id(b"servesim-answer", request_id)


def unique_segment_id(request_id: str) -> int:
    """A segment id no other request's prompt uses (for prompts of unknown content)."""
    return _segment_id(b"servesim-prompt", request_id)


def mooncake_segments(hash_ids: Sequence[int], num_prompt_tokens: int, request_id: str,
                      tokens_per_id: int = MOONCAKE_BLOCK_TOKENS) -> Segments:
    """A Mooncake prompt as segments: one per hash id, ``tokens_per_id`` tokens each, the
    last cut to the prompt's end; ids beyond the prompt are ignored, and tokens beyond the
    ids (never in the shared traces) form a segment of the request's own."""
    k = min(len(hash_ids), cdiv(num_prompt_tokens, tokens_per_id))
    out = list(zip(hash_ids[:k], repeat(tokens_per_id, k), strict=True))
    covered = k * tokens_per_id
    if covered > num_prompt_tokens:
        out[-1] = (out[-1][0], tokens_per_id - (covered - num_prompt_tokens))
    elif covered < num_prompt_tokens:
        out.append((unique_segment_id(request_id), num_prompt_tokens - covered))
    return tuple(out)


def prefix_spans(req: Request, block_size: int) -> list[tuple[int, int, int]]:
    """``req.prefix_spans``, computed on first use: for each segment (the answer last,
    open-ended) holding the end of at least one block, (its chain, the first block
    ending in it, the block after the last one). See the module docstring."""
    spans = req.prefix_spans
    if spans is not None:
        return spans
    segments = req.prompt_segments or (
        (unique_segment_id(req.request_id), req.num_prompt_tokens),)
    spans = []
    chain, prev_len, start = _ROOT, 0, 0
    for sid, length in segments:
        chain = hash((chain, prev_len, sid))
        end = start + length
        if end // block_size > start // block_size:
            spans.append((chain, start // block_size, end // block_size))
        start, prev_len = end, length
    chain = hash((chain, prev_len, answer_segment_id(req.request_id)))
    spans.append((chain, start // block_size, _OPEN))
    req.prefix_spans = spans
    return spans


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


class PrefixCachingKV(KVCacheManager):
    """What both cache modes share: the per-segment slot lists, each cached block's place
    in them (``_where``: its slot list, ``_where_i``: its position; None when the block
    is not cached), how many of each request's blocks are registered, the lookup and the
    statistics. Subclasses own the free pool, eviction and registration. Allocations,
    inserts and frees of many blocks work on whole lists (a prefill chunk is hundreds of
    blocks), to keep a cached run near the speed of the plain pool."""

    __slots__ = ("_committed", "_evicted_since_purge", "_last_lookup", "_registered",
                 "_slots", "_touched", "_where", "_where_i", "stats")
    mode: ClassVar[str] = ""

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self._slots: dict[int, list[int]] = {}
        self._where: list[list[int] | None] = [None] * num_gpu_blocks
        self._where_i = [0] * num_gpu_blocks
        self._evicted_since_purge = 0
        self._committed: dict[Request, int] = {}
        # A waiting request's last hit length and the registrations counter then
        # (for may_fit); blocks ever registered (a hit grows by at most one each).
        self._last_lookup: dict[Request, tuple[int, int]] = {}
        self._registered = 0
        # The last hit asked about in num_new_blocks and how many of its blocks were
        # free, for the admission that follows at once; reset by lookups and admissions.
        self._touched: tuple[list[int] | None, int] = (None, 0)
        self.stats = PrefixCacheStats()

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - 1 - self.num_free_blocks

    def can_fit(self, request: Request, num_tokens: int) -> bool:
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        return need <= self.num_free_blocks

    def num_cached_blocks(self) -> int:
        """Blocks in the index (held or free)."""
        return sum(1 for w in self._where if w is not None)

    def summary(self) -> dict[str, Any]:
        return prefix_cache_summary(self.mode, self.stats, self.block_size)

    # -- lookup --
    def get_computed_blocks(self, req: Request) -> list[int]:
        """The cached blocks of ``req``'s longest cached prefix, at most (num_tokens - 1)
        // block_size of them, so the last known token is always computed (vLLM's
        ``max_cache_hit_length``; SGLang's ``input_len - 1``). Changes nothing."""
        limit = (req.num_tokens - 1) // self.block_size
        hit: list[int] = []
        slots_of = self._slots.get
        for chain, j0, j1 in prefix_spans(req, self.block_size):
            if j0 >= limit:
                break
            slots = slots_of(chain)
            if slots is None:
                break
            want = min(j1, limit) - j0
            got = slots[:want]
            if 0 in got:
                hit += got[:got.index(0)]
                break
            hit += got
            if len(got) < want:
                break
        self._last_lookup[req] = (len(hit), self._registered)
        self._touched = (None, 0)
        return hit

    def cached_prefix_tokens(self, req: Request) -> int:
        """Tokens of ``req``'s prompt a lookup now would find cached."""
        return len(self.get_computed_blocks(req)) * self.block_size

    def may_fit(self, req: Request, num_tokens: int, reserve: int = 0) -> bool:
        """False when admitting ``req`` for ``num_tokens`` tokens certainly needs more
        than the free blocks less ``reserve``, judged without a lookup: its hit can
        have grown since its last lookup by at most the blocks registered since. A
        head of waiting blocked for lack of blocks is then not looked up every step."""
        last = self._last_lookup.get(req)
        if last is None:
            return True
        bound = last[0] + self._registered - last[1]
        return cdiv(num_tokens, self.block_size) - bound <= self.num_free_blocks - reserve

    def num_new_blocks(self, req: Request, hit: list[int], num_tokens: int) -> int:
        """Free blocks that admitting ``req`` with ``hit`` for ``num_tokens`` tokens
        would take: new blocks plus the hit blocks that were free (evictable)."""
        if hit is self._touched[0]:  # asked again about the same lookup, nothing changed
            touched = self._touched[1]
        else:
            touched = list(map(self._ref_cnt.__getitem__, hit)).count(0)
            self._touched = (hit, touched)
        return cdiv(num_tokens, self.block_size) - len(hit) - len(req.block_ids) + touched

    def allocate_cached(self, req: Request, hit: list[int], num_tokens: int) -> bool:
        """Admit ``req`` reusing ``hit`` (from get_computed_blocks) and allocating up to
        ``num_tokens`` tokens; False (nothing changes) when the blocks do not fit."""
        raise NotImplementedError

    # -- the index --
    def _slot_ranges(self, req: Request, done: int, full: int
                     ) -> list[tuple[list[int], int, int, int]]:
        """(slot list, first slot, end slot, first block) of the request's blocks
        [done, full), segment by segment; slot lists are created and grown as needed."""
        out = []
        slots_of = self._slots
        for chain, j0, j1 in prefix_spans(req, self.block_size):
            if j1 <= done:
                continue
            if j0 >= full:
                break
            a = max(done, j0)
            i0, i1 = a - j0, min(full, j1) - j0
            slots = slots_of.get(chain)
            if slots is None:
                slots = slots_of[chain] = []
            if len(slots) < i1:
                slots += repeat(0, i1 - len(slots))
            out.append((slots, i0, i1, a))
        return out

    def _index_blocks(self, slots: list[int], i0: int, blocks: list[int]) -> None:
        """Put ``blocks`` (not cached yet) into empty slots ``i0`` on of ``slots``."""
        slots[i0:i0 + len(blocks)] = blocks
        where, where_i = self._where, self._where_i
        for b in blocks:
            where[b] = slots
        for b, i in zip(blocks, range(i0, i0 + len(blocks)), strict=True):
            where_i[b] = i

    def _unindex(self, blocks: list[int]) -> None:
        """Take cached ``blocks`` out of their slots (an eviction)."""
        where, where_i = self._where, self._where_i
        for b in blocks:
            where[b][where_i[b]] = 0  # type: ignore[index]
            where[b] = None
        self._count_evictions(len(blocks))

    def _count_evictions(self, n: int) -> None:
        """Count ``n`` evicted blocks; now and then drop the slot lists left empty."""
        self.stats.evicted_blocks += n
        self._evicted_since_purge += n
        if self._evicted_since_purge > 32 * self.num_gpu_blocks:
            self._evicted_since_purge = 0
            self._slots = {c: s for c, s in self._slots.items() if any(s)}

    def _register(self, req: Request, full: int) -> None:
        """Index the request's first ``full`` blocks (all full, their tokens known) from
        the first one not indexed yet; the caller checks there is one."""
        raise NotImplementedError

    def _release(self, request: Request) -> int:
        """Before freeing: index every computed full block not indexed yet (decode
        blocks, and prompt blocks that filled without a later allocation), then forget
        the request. Returns how many of its blocks (its first ones) are indexed."""
        full = request.num_computed_tokens // self.block_size
        if full > self._committed.get(request, 0):
            self._register(request, full)
        return self._committed.pop(request, 0)

    def _unref(self, blocks: list[int]) -> list[int]:
        """Drop one reference from each of ``blocks``; returns those left unreferenced,
        last block first (vLLM frees tail first)."""
        ref = self._ref_cnt
        for b in blocks:
            ref[b] -= 1
        return [b for b in reversed(blocks) if not ref[b]]

    def _admitted(self, req: Request, hit: list[int]) -> None:
        """Book-keeping of an admission with ``hit``: its blocks are registered already,
        its computed tokens start at the hit."""
        self._committed[req] = len(hit)
        self._last_lookup.pop(req, None)
        n = len(hit) * self.block_size
        req.num_computed_tokens = n
        self.stats.record(req, n)

    def _check_common(self, free: set[int]) -> None:
        ref = self._ref_cnt
        assert 0 not in free, "null block in free pool"
        assert min(ref) >= 0, "a block was freed more often than held"
        for b in free:
            assert ref[b] == 0, f"free block {b} has ref {ref[b]}"
        where, where_i = self._where, self._where_i
        cached = 0
        for slots in self._slots.values():
            for i, b in enumerate(slots):
                if b:
                    assert where[b] is slots and where_i[b] == i, f"block {b} misplaced"
                    cached += 1
        assert cached == self.num_cached_blocks(), "a block is indexed twice or not at all"


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

    The queue is a list read from ``_head``, each entry stamped with the free that put
    it there (``_qstamp``); taking a free block out of the middle (a hit) only changes
    its ``_stamp``, so the entry is skipped when the head reaches it (``_nstale`` such
    entries wait in the queue; with none, taking blocks is a slice)."""

    __slots__ = ("_head", "_nfree", "_nstale", "_qstamp", "_queue", "_stamp", "_stamps")
    mode: ClassVar[str] = "block"

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self._free = []  # the queue below is the free pool
        self._queue = list(range(1, num_gpu_blocks))
        self._qstamp = [1] * (num_gpu_blocks - 1)
        self._stamp = [1] * num_gpu_blocks  # a block's current queue entry; 0 = none
        self._stamps = 1
        self._head = 0
        self._nfree = num_gpu_blocks - 1
        self._nstale = 0

    @property
    def num_free_blocks(self) -> int:
        return self._nfree

    def _take(self, k: int) -> list[int]:
        """The k blocks at the head of the free queue (k <= the free blocks)."""
        q = self._queue
        h = self._head
        if not self._nstale:
            out = q[h:h + k]
            h += k
        else:
            qs, stamp = self._qstamp, self._stamp
            out = []
            while len(out) < k:
                m = h + k - len(out)
                got = [b for b, s in zip(q[h:m], qs[h:m], strict=True) if stamp[b] == s]
                self._nstale -= m - h - len(got)
                out += got
                h = m
        if h > 4096 and h * 2 > len(q):
            del q[:h], self._qstamp[:h]
            h = 0
        self._head = h
        self._nfree -= k
        return out

    def allocate_up_to(self, request: Request, num_tokens: int) -> list[int] | None:
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        new: list[int] = []
        if need == 1 and self._nfree and not self._nstale:  # a decode's next block
            b = self._queue[self._head]
            self._head += 1
            self._nfree -= 1
            if self._where[b] is not None:
                self._unindex([b])
            self._ref_cnt[b] = 1
            request.block_ids.append(b)
            new = [b]
        elif need > 0:
            if need > self._nfree:
                return None
            new = self._take(need)
            where, where_i, ref = self._where, self._where_i, self._ref_cnt
            cached = need
            for b in new:
                w = where[b]
                if w is None:
                    cached -= 1
                else:  # evict: the block leaves its slot
                    w[where_i[b]] = 0
                    where[b] = None
                ref[b] = 1
            if cached:
                self._count_evictions(cached)
            request.block_ids.extend(new)
        full = min(num_tokens, request.num_prompt_tokens) // self.block_size
        if full > self._committed.get(request, 0):
            self._register(request, full)
        return new

    def _register(self, req: Request, full: int) -> None:
        done = self._committed.get(req, 0)
        blocks = req.block_ids  # those from done on were allocated after any hit
        where, where_i = self._where, self._where_i
        for slots, i0, i1, a in self._slot_ranges(req, done, full):
            mine = blocks[a:a + i1 - i0]
            if not any(slots[i0:i1]):
                self._index_blocks(slots, i0, mine)
                continue
            for i, b in zip(range(i0, i1), mine, strict=True):
                if not slots[i]:  # first one wins: a copy cached already stays
                    slots[i] = b
                    where[b] = slots
                    where_i[b] = i
        self._registered += full - done
        self._committed[req] = full

    def allocate_cached(self, req: Request, hit: list[int], num_tokens: int) -> bool:
        if self.num_new_blocks(req, hit, num_tokens) > self._nfree:
            return False
        ref, stamp = self._ref_cnt, self._stamp
        for b in hit:
            if not ref[b]:
                stamp[b] = 0  # its queue entry is now stale
                self._nfree -= 1
                self._nstale += 1
            ref[b] += 1
        req.block_ids = list(hit)
        self._admitted(req, hit)
        self._touched = (None, 0)
        ok = self.allocate_up_to(req, num_tokens)
        assert ok is not None, "checked above"
        return True

    def free(self, request: Request) -> int:
        self._release(request)
        zero = self._unref(request.block_ids)
        request.block_ids = []
        if zero:
            self._stamps += 1
            s, stamp = self._stamps, self._stamp
            for b in zero:
                stamp[b] = s
            self._queue += zero
            self._qstamp += [s] * len(zero)
            self._nfree += len(zero)
            h = self._head
            if h > 4096 and h * 2 > len(self._queue):  # drop the consumed entries
                del self._queue[:h], self._qstamp[:h]
                self._head = 0
        return len(zero)

    def free_queue(self) -> list[int]:
        """The free blocks in eviction order (head first; for tests)."""
        q, qs, stamp = self._queue, self._qstamp, self._stamp
        h = self._head
        return [b for b, s in zip(q[h:], qs[h:], strict=True) if stamp[b] == s]

    def check_invariants(self) -> None:
        queue = self.free_queue()
        free = set(queue)
        assert len(free) == len(queue) == self._nfree, "free queue count"
        self._check_common(free)
        held = sum(1 for b in range(1, self.num_gpu_blocks) if self._ref_cnt[b] > 0)
        assert held + len(free) == self.num_usable_blocks, "a block is neither free nor held"


def make_kv(mode: str, num_gpu_blocks: int, block_size: int = 16) -> KVCacheManager:
    """The block allocator for ``--prefix-cache`` ``mode``: the plain pool for "none",
    BlockHashCache for "block", RadixCache for "radix"."""
    if mode == "none":
        return KVCacheManager(num_gpu_blocks, block_size)
    if mode == "block":
        return BlockHashCache(num_gpu_blocks, block_size)
    if mode == "radix":
        from sim.radix_cache import RadixCache

        return RadixCache(num_gpu_blocks, block_size)
    raise ValueError(f"prefix_cache must be one of {', '.join(PREFIX_CACHE_MODES)}, "
                     f"got {mode!r}")
