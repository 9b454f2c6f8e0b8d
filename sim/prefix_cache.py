"""Prefix caching (issue 9): what a prompt says, the block hashes that name it, and vLLM's
automatic prefix cache (``BlockHashCache``); SGLang's radix tree is sim/radix_cache.py.

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

**Block hashes.** Engine block j covers tokens [j*bs, (j+1)*bs) and is named by every token
before its end e = (j+1)*bs: ``h_j = chain_k + e`` with k the segment holding token e - 1,
``chain_0 = hash((ROOT, 0, id_0))`` and ``chain_k+1 = hash((chain_k, len_k, id_k+1))``
(64-bit tuple hashes). Equal hashes mean equal prefixes, up to collisions (two chains
less than 2^21 apart: about 2^-42 per pair of chains, the same order as Python's tuple
hash of (chain, e) would give, at a fraction of its cost), so ``h_j`` plays the part of
vLLM's chained block hash (``hash(parent, block tokens)``). Only full blocks are hashed,
and only as far as their tokens are known (prompt, then sampled tokens). When bs divides
512, block j of a Mooncake prompt lies in Mooncake block j*bs // 512 and its hash stands
for (the Mooncake ids up to that block, sub-index); when it does not, a block straddling
two Mooncake blocks is named by both, so a hit stops at the first engine block that
reaches into a differing Mooncake block. Hashes are computed lazily, when a cache first
looks a request up or registers its blocks, into ``Request.block_hashes`` (no token lists).

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
from typing import Any, ClassVar

from sim.config import PREFIX_CACHE_MODES
from sim.kv_cache import KVCacheManager, cdiv
from sim.request import Request

__all__ = ["PREFIX_CACHE_MODES", "BlockHashCache", "PrefixCachingKV", "make_kv"]
#: Tokens per Mooncake ``hash_ids`` entry (FAST'25 traces).
MOONCAKE_BLOCK_TOKENS = 512
_ROOT = 0x5E12E51

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
    out: list[tuple[int, int]] = []
    left = num_prompt_tokens
    for h in hash_ids:
        if left <= 0:
            break
        n = min(tokens_per_id, left)
        out.append((int(h), n))
        left -= n
    if left > 0:
        out.append((unique_segment_id(request_id), left))
    return tuple(out)


def extend_block_hashes(req: Request, block_size: int, num_blocks: int,
                        answer_chains: dict[Request, int] | None = None) -> list[int]:
    """``req.block_hashes`` grown to hold the hashes of its first ``num_blocks`` blocks
    (the caller makes sure their tokens are known). See the module docstring.
    ``answer_chains`` memoizes the chain value of each request's answer segment, so
    hashing a decode block does not walk the prompt's segments again."""
    hashes = req.block_hashes
    if hashes is None:
        hashes = req.block_hashes = []
    have = len(hashes)
    if have >= num_blocks:
        return hashes
    e = (have + 1) * block_size
    last = num_blocks * block_size
    if answer_chains is not None and e > req.num_prompt_tokens:
        chain = answer_chains.get(req)
        if chain is not None:
            hashes.extend(range(chain + e, chain + last + 1, block_size))
            return hashes
    segments = req.prompt_segments or (
        (unique_segment_id(req.request_id), req.num_prompt_tokens),)
    chain, prev_len, start = _ROOT, 0, 0
    for sid, length in segments:
        chain = hash((chain, prev_len, sid))
        end = start + length
        if e <= end:
            stop = min(end, last)
            hashes.extend(range(chain + e, chain + stop + 1, block_size))
            e += ((stop - e) // block_size + 1) * block_size
        if e > last:
            return hashes
        start, prev_len = end, length
    chain = hash((chain, prev_len, answer_segment_id(req.request_id)))
    if answer_chains is not None:
        answer_chains[req] = chain
    hashes.extend(range(chain + e, chain + last + 1, block_size))
    return hashes


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

    def add(self, other: PrefixCacheStats) -> None:
        for name in self.__slots__:  # type: ignore[attr-defined]
            setattr(self, name, getattr(self, name) + getattr(other, name))


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
    """What both cache modes share: the hash -> block index, each block's hash (None
    when not cached), how many of each request's blocks are registered, the lookup and
    the statistics. Subclasses own the free pool, eviction and registration. Big
    allocations, registrations and frees work on whole lists (prefills are hundreds of
    blocks), keeping a cached run within about 2x the speed of the plain pool."""

    __slots__ = ("_answer_chains", "_block_hash", "_committed", "_index", "stats")
    mode: ClassVar[str] = ""

    def __init__(self, num_gpu_blocks: int, block_size: int = 16) -> None:
        super().__init__(num_gpu_blocks, block_size)
        self._index: dict[int, int] = {}
        self._block_hash: list[int | None] = [None] * num_gpu_blocks
        self._committed: dict[Request, int] = {}
        self._answer_chains: dict[Request, int] = {}
        self.stats = PrefixCacheStats()

    @property
    def num_used_blocks(self) -> int:
        return self.num_gpu_blocks - 1 - self.num_free_blocks

    def can_fit(self, request: Request, num_tokens: int) -> bool:
        need = cdiv(num_tokens, self.block_size) - len(request.block_ids)
        return need <= self.num_free_blocks

    def num_cached_blocks(self) -> int:
        """Blocks whose hash is in the index (held or free)."""
        return len(self._index)

    def summary(self) -> dict[str, Any]:
        return prefix_cache_summary(self.mode, self.stats, self.block_size)

    # -- lookup --
    def get_computed_blocks(self, req: Request) -> list[int]:
        """The cached blocks of ``req``'s longest cached prefix, at most (num_tokens - 1)
        // block_size of them, so the last known token is always computed (vLLM's
        ``max_cache_hit_length``; SGLang's ``input_len - 1``). Changes nothing."""
        bs = self.block_size
        limit = (req.num_tokens - 1) // bs
        if limit <= 0:
            return []
        hashes = extend_block_hashes(req, bs, limit)
        get = self._index.get
        hit: list[int] = []
        i, step = 0, 16
        while i < limit:
            j = min(i + step, limit)
            found = list(map(get, hashes[i:j]))
            if None in found:
                hit += found[:found.index(None)]
                break
            hit += found
            i, step = j, step * 2
        return hit  # type: ignore[return-value]

    def cached_prefix_tokens(self, req: Request) -> int:
        """Tokens of ``req``'s prompt a lookup now would find cached."""
        return len(self.get_computed_blocks(req)) * self.block_size

    def num_new_blocks(self, req: Request, hit: list[int], num_tokens: int) -> int:
        """Free blocks that admitting ``req`` with ``hit`` for ``num_tokens`` tokens
        would take: new blocks plus the hit blocks that were free (evictable)."""
        touched = list(map(self._ref_cnt.__getitem__, hit)).count(0)
        return cdiv(num_tokens, self.block_size) - len(hit) - len(req.block_ids) + touched

    def allocate_cached(self, req: Request, hit: list[int], num_tokens: int) -> bool:
        """Admit ``req`` reusing ``hit`` (from get_computed_blocks) and allocating up to
        ``num_tokens`` tokens; False (nothing changes) when the blocks do not fit."""
        raise NotImplementedError

    def _register(self, req: Request, full: int) -> None:
        """Index the request's first ``full`` blocks (all full, their tokens known) from
        the first one not indexed yet; the caller checks there is one."""
        raise NotImplementedError

    def _release(self, request: Request) -> None:
        """Before freeing: index every computed full block not indexed yet (decode
        blocks, and prompt blocks that filled without a later allocation), then forget
        the request."""
        full = request.num_computed_tokens // self.block_size
        if full > self._committed.get(request, 0):
            self._register(request, full)
        self._committed.pop(request, None)
        self._answer_chains.pop(request, None)

    def _admitted(self, req: Request, hit: list[int]) -> None:
        """Book-keeping of an admission with ``hit``: its blocks are registered already,
        its computed tokens start at the hit."""
        self._committed[req] = len(hit)
        n = len(hit) * self.block_size
        req.num_computed_tokens = n
        self.stats.record(req, n)

    def _check_common(self, free: set[int]) -> None:
        ref = self._ref_cnt
        assert 0 not in free, "null block in free pool"
        for b in free:
            assert ref[b] == 0, f"free block {b} has ref {ref[b]}"
        assert min(ref) >= 0, "a block was freed more often than held"
        for h, b in self._index.items():
            assert self._block_hash[b] == h, f"block {b} indexed under a hash it lacks"
        assert sum(1 for h in self._block_hash if h is not None) == len(self._index)


class BlockHashCache(PrefixCachingKV):
    """vLLM V1's automatic prefix caching (``vllm/v1/core/block_pool.py``): every full
    prompt block is registered under its chain hash when allocated; a freed block keeps its
    hash and joins the tail of the free queue (a request's blocks tail first, so its
    last blocks are evicted first); allocation takes the head of the queue, the least
    recently freed block, and drops its hash then (an eviction). A hit on a free block
    takes it out of the queue. Unlike vLLM, a block whose hash is already indexed (two
    requests computing the same prefix at once) is not indexed a second time, and
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
        if need > 0:
            if need > self._nfree:
                return None
            new = self._take(need)
            block_hash, ref = self._block_hash, self._ref_cnt
            hashes = list(map(block_hash.__getitem__, new))
            cached = need - hashes.count(None)
            if cached:  # evict: the blocks drop their hashes
                index = self._index
                for b, h in zip(new, hashes, strict=True):
                    if h is not None:
                        del index[h]
                        block_hash[b] = None
                self.stats.evicted_blocks += cached
            for b in new:
                ref[b] = 1
            request.block_ids.extend(new)
        full = min(num_tokens, request.num_prompt_tokens) // self.block_size
        if full > self._committed.get(request, 0):
            self._register(request, full)
        return new

    def _register(self, req: Request, full: int) -> None:
        bs = self.block_size
        done = self._committed.get(req, 0)
        hs = extend_block_hashes(req, bs, full, self._answer_chains)[done:full]
        blocks = req.block_ids[done:full]  # allocated after any hit: none is indexed
        index, block_hash = self._index, self._block_hash
        if any(map(index.__contains__, hs)):
            pairs = [(h, b) for h, b in zip(hs, blocks, strict=True) if h not in index]
            index.update(pairs)
            for h, b in pairs:
                block_hash[b] = h
        else:
            index.update(zip(hs, blocks, strict=True))
            for h, b in zip(hs, blocks, strict=True):
                block_hash[b] = h
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
        ok = self.allocate_up_to(req, num_tokens)
        assert ok is not None, "checked above"
        return True

    def free(self, request: Request) -> int:
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
            self._stamps += 1
            s, stamp = self._stamps, self._stamp
            for b in zero:
                stamp[b] = s
            self._queue += zero
            self._qstamp += [s] * len(zero)
            self._nfree += len(zero)
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
