"""The prefix caches' block index: which cached block, if any, holds each block of a
prompt, found by position rather than by hash, so that a prefill chunk of hundreds of
blocks is looked up, indexed and evicted in a few numpy operations.

**Slots.** A *slot* is one block of one segment chain: (chain, block index within the
chain's span; see ``prefix_spans`` in sim/kv/prefix_content.py), at a fixed position in
one array, the arena. A chain's slots are an extent of consecutive positions made when a
request first needs them (more extents when a later request needs more, as a
conversation's answer or a cut Mooncake block grows). A request's blocks map to an array
of arena positions, ``positions(req)``, computed once per request.

**Fixed slots.** A workload run fixes every block's slot before it starts
(sim/kv/prefix_slots.py) and hands each request its runs of positions at arrival
(``Request.prefix_slots``): the arena is sized once and never compacted. The
per-request mapping (with ``_make_room``) serves prompts without content and requests
built by hand. One index serves one kind of request.

**Lazy validity.** ``arena[p]`` is the block last put at slot p, ``key[b]`` the slot
block b is indexed at (0: none; position 0 is never a slot), and slot p holds a cached
block exactly when ``key[arena[p]] == p`` (later copies of it wait in ``dups``,
sim/kv/second_copies.py). Evicting blocks is one write to ``key``. When the arena fills,
the extents of chains no block is cached under are dropped and the rest moved together
(``_make_room``), which renumbers positions: positions kept per request carry the
compaction count (``epoch``) they belong to.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.kv.second_copies import SecondCopies
from sim.request import Request

#: A request's spans, flat: segment chain, first block, end block, chain, ...; see
#: sim/kv/prefix_content.py.
Spans = list[int]
_EMPTY = np.zeros(0, np.int64)
_PROBE = 64  # lookups check this many blocks first: most prompts miss early
_SHIFT = 32  # a chain of one extent is base << _SHIFT | slots
_SLOTS = (1 << _SHIFT) - 1


def _concat(starts: list[int], lens: list[int], old: np.ndarray = _EMPTY) -> np.ndarray:
    """``old`` followed by the positions of runs (first position, length)."""
    if len(starts) == 1 and not len(old):
        return np.arange(starts[0], starts[0] + lens[0], dtype=np.int64)
    if len(starts) <= 8:
        return np.concatenate([old, *(np.arange(s, s + k, dtype=np.int64)
                                      for s, k in zip(starts, lens, strict=True))])
    ln = np.array(lens, np.int64)
    skip = np.array(starts, np.int64) - (np.cumsum(ln) - ln)
    return np.concatenate((old, np.arange(int(ln.sum()), dtype=np.int64) + np.repeat(skip, ln)))


class PrefixIndex:
    """Slots of segment chains in one arena, and the slot each cached block is indexed
    at. Owns no block lifetimes: the caches decide what is indexed and evicted."""

    __slots__ = ("_block_size", "_chains", "_dynamic", "_ext_base", "_ext_chain", "_ext_off",
                 "_multi", "_pos", "_spans", "_top", "arena", "dups", "epoch", "key")

    def __init__(self, num_gpu_blocks: int, block_size: int,
                 spans: Callable[[Request], Spans]) -> None:
        self._block_size = block_size
        self._spans = spans  # a request's spans (computed once, by the caller)
        self.arena = np.zeros(1 << 12, np.int64)
        self.key = np.zeros(num_gpu_blocks, np.int64)
        self._top = 1  # position 0 is no slot, so key 0 means "not indexed"
        self._dynamic = False  # slots were made here (not fixed before the run)
        # chain -> base << _SHIFT | slots, or -1 for a chain of several extents, kept in
        # _multi as (slots, base_0, count_0, base_1, count_1, ...). Ints, not tuples: a
        # long run makes hundreds of thousands of chains, which the garbage collector
        # would otherwise keep visiting.
        self._chains: dict[int, int] = {}
        self._multi: dict[int, tuple[int, ...]] = {}
        # Every extent in arena order (bases increase): its chain, and its first slot
        # index where that is not 0 (by extent number).
        self._ext_base: list[int] = []
        self._ext_chain: list[int] = []
        self._ext_off: dict[int, int] = {}
        self.epoch = 0
        self.dups = SecondCopies()  # later copies of cached blocks (sim/kv/second_copies.py)
        # (epoch, spans done, positions, first block and first position of the last run)
        self._pos: dict[Request, tuple[int, int, np.ndarray, int, int]] = {}

    # -- positions --
    def positions(self, req: Request, n: int, start: int = 0) -> np.ndarray:
        """Arena positions of ``req``'s blocks ``start`` to ``n``; slots not made yet are
        made. The positions of all its full prompt blocks are kept (blocks after them,
        its answer's, are asked for once, at release, when ``start`` is past them)."""
        got = self._pos.get(req)
        if got is not None and got[0] == self.epoch:
            if len(got[2]) >= n:
                return got[2][start:n]
            old, first = got[2], got[1]
        elif req.prefix_slots is not None:
            pos = self._fixed(req, req.prefix_slots)
            assert len(pos) >= n, "a block past the request's fixed slots"
            return pos[start:n]
        else:
            old, first = _EMPTY, 0
        assert req.prefix_slots is None, "a block past the request's fixed slots"
        self._dynamic = True
        upto = max(n, req.num_prompt_tokens // self._block_size)
        if self._top + upto - len(old) > len(self.arena):
            self._make_room(upto)  # may renumber every position
            old, first = _EMPTY, 0
        starts, lens, k = self._runs(self._spans(req), first, len(old), upto)
        if len(old) and start >= len(old):  # only blocks after the kept ones
            return _concat(starts, lens)[start - len(old):n - len(old)]
        pos = _concat(starts, lens, old)
        # Also its last run (first block, first position): a new prompt's chunks mostly
        # lie in it and are indexed through slices of the arena (``index``).
        tail = len(pos) - lens[-1] if starts else len(pos)
        self._pos[req] = (self.epoch, k, pos, tail, starts[-1] if starts else 0)
        return pos[start:n]

    def _fixed(self, req: Request, slots: tuple[list[int], list[int], int]) -> np.ndarray:
        """Positions of a request whose slots were fixed before the run
        (sim/kv/prefix_slots.py: ``slots`` are its runs, first positions and lengths, and
        the number of slots of the whole workload, which the arena is sized to once);
        kept as ``positions`` keeps them. Such slots are never renumbered; an index
        serves requests of one kind only."""
        assert not self._dynamic, "fixed slots in an index that made slots of its own"
        starts, lens, num_slots = slots
        if num_slots >= len(self.arena):
            self.arena = np.zeros(num_slots + 1, np.int64)
        if not starts:  # no block ends in its prompt or answer
            self._pos[req] = (self.epoch, 0, _EMPTY, 0, 0)
            return _EMPTY
        if len(starts) == 1:
            s = starts[0]
            pos = np.arange(s, s + lens[0], dtype=np.int64)
        else:
            pos = np.concatenate([np.arange(s, s + k, dtype=np.int64)
                                  for s, k in zip(starts, lens, strict=True)])
        self._pos[req] = (self.epoch, 0, pos, len(pos) - lens[-1], starts[-1])
        return pos

    def _runs(self, spans: Spans, first: int, start: int, n: int
              ) -> tuple[list[int], list[int], int]:
        """Positions of blocks [start, n) as runs (first position, length), from the
        span at ``first`` (the one holding block ``start``) on; also the span to resume
        from. Slots are made as needed (the caller checked there is room); a chain seen
        for the first time gets the next free positions, so a new prompt's slots are
        mostly one run."""
        starts: list[int] = []
        lens: list[int] = []
        chains = self._chains
        get = chains.get
        new_base, new_chain = self._ext_base.append, self._ext_chain.append
        top, end = self._top, -1
        k = first
        for k, chain, j0, j1 in zip(range(first, len(spans), 3), spans[first::3],  # noqa: B007
                                    spans[first + 1::3], spans[first + 2::3], strict=True):
            if j0 >= n:
                break
            i1 = (j1 if j1 < n else n) - j0
            ext = get(chain)
            if ext is None:  # a new chain (so start <= j0: from its first slot)
                chains[chain] = top << _SHIFT | i1
                new_base(top)
                new_chain(chain)
                s = top
                top += i1
                i0 = 0
            elif ext >= 0 and ext & _SLOTS >= i1:  # one extent, large enough
                i0 = start - j0 if start > j0 else 0
                s = (ext >> _SHIFT) + i0
            else:
                i0 = start - j0 if start > j0 else 0
                self._top = top
                self._emit(self._extend(chain, i1), i0, i1, starts, lens)
                top, end = self._top, starts[-1] + lens[-1]
                if j1 > n:
                    break
                continue
            if s == end:
                lens[-1] += i1 - i0
            else:
                starts.append(s)
                lens.append(i1 - i0)
            end = s + i1 - i0
            if j1 > n:
                break  # the answer span: positions end inside it
        self._top = top
        return starts, lens, k

    @staticmethod
    def _emit(ext: tuple[int, ...], i0: int, i1: int, starts: list[int], lens: list[int]) -> None:
        """Append the positions of slots [i0, i1) of a chain with extents ``ext``."""
        off = 0
        for e in range(1, len(ext), 2):
            base, count = ext[e], ext[e + 1]
            lo, hi = max(i0, off), min(i1, off + count)
            if lo < hi:
                s = base + lo - off
                if starts and starts[-1] + lens[-1] == s:
                    lens[-1] += hi - lo
                else:
                    starts.append(s)
                    lens.append(hi - lo)
            off += count

    def _extents(self, chain: int) -> tuple[int, ...]:
        """(slots, base_0, count_0, ...) of a known chain."""
        ext = self._chains[chain]
        if ext < 0:
            return self._multi[chain]
        return (ext & _SLOTS, ext >> _SHIFT, ext & _SLOTS)

    def _extend(self, chain: int, slots: int) -> tuple[int, ...]:
        """The extents of a known ``chain``, given ``slots`` slots if it has fewer (room
        checked by the caller)."""
        ext = self._extents(chain)
        have = ext[0]
        if have >= slots:
            return ext
        base = self._top
        self._top += slots - have
        self._ext_off[len(self._ext_base)] = have
        self._ext_base.append(base)
        self._ext_chain.append(chain)
        ext = (slots, *ext[1:], base, slots - have)
        self._chains[chain] = -1
        self._multi[chain] = ext
        return ext

    def forget(self, req: Request) -> None:
        """Drop ``req``'s positions (it released its blocks)."""
        self._pos.pop(req, None)

    def _make_room(self, n: int) -> None:
        """Compact: keep only the chains some cached block is indexed under, each as one
        extent in arena order, in an arena with room for ``n`` more slots and, so that
        compactions stay rare, for at least as many as are kept and a million more.
        Renumbers ``key`` and starts a new epoch."""
        key, arena = self.key, self.arena
        cached = np.flatnonzero(key)
        pos = key[cached]
        bases = np.array(self._ext_base, np.int64)
        ext = np.searchsorted(bases, pos, side="right") - 1
        shift = np.zeros(len(bases), np.int64)
        chains: dict[int, int] = {}
        ext_base, ext_chain, copies = [], [], []
        top = 1
        for e in np.unique(ext).tolist():
            chain = self._ext_chain[e]
            new = chains.get(chain)
            if new is None:
                slots = self._extents(chain)[0]
                new = chains[chain] = top << _SHIFT | slots
                ext_base.append(top)
                ext_chain.append(chain)
                top += slots
            dst = (new >> _SHIFT) + self._ext_off.get(e, 0)
            end = self._ext_base[e + 1] if e + 1 < len(bases) else self._top
            copies.append((dst, self._ext_base[e], end))
            shift[e] = dst - self._ext_base[e]
        need = top + n
        self.arena = np.zeros(max(2 * need, need + (1 << 20)), np.int64)
        if copies:  # every kept extent's slots in one copy
            dsts, srcs, ends = np.array(copies, np.int64).T
            size = ends - srcs
            skip = np.repeat(dsts - (np.cumsum(size) - size), size)
            idx = np.arange(int(size.sum()), dtype=np.int64) + skip
            self.arena[idx] = arena[idx - np.repeat(dsts - srcs, size)]
        old_key = key.copy() if self.dups else key
        key[cached] = pos + shift[ext]
        self.dups.renumber(old_key, key)
        self._chains, self._top = chains, top
        self._ext_base, self._ext_chain = ext_base, ext_chain
        self._ext_off, self._multi = {}, {}
        self.epoch += 1
        self._pos.clear()

    # -- lookup and update --
    def lookup(self, pos: np.ndarray, limit: int) -> np.ndarray:
        """The cached blocks at positions ``pos[:limit]``, up to the first slot that
        holds none."""
        if limit <= 0:
            return _EMPTY
        arena, key = self.arena, self.key
        m = limit if limit < _PROBE else _PROBE
        while True:
            p = pos[:m]
            got = arena[p]
            ok = key[got] == p
            i = int(ok.argmin())
            if not ok[i]:
                return got[:i]
            if m == limit:
                return got
            m = limit

    def index(self, req: Request, start: int, blocks: np.ndarray, keep: bool,
              drop: np.ndarray | None = None) -> bool:
        """``insert(positions(req, stop, start), blocks, keep)``, stop = start +
        len(blocks). ``drop``: blocks just taken for reuse whose entries are still to be
        dropped (each in ``blocks`` or not). When the blocks lie in the request's last
        run of positions and, with ``keep``, its slots there were never written (a new
        prompt's chunk: the usual case), they are written through slices of the arena
        and True is returned: the blocks of ``drop`` not in ``blocks`` are then still
        indexed, for the caller to drop. Otherwise ``drop`` is dropped first and False
        returned."""
        stop = start + len(blocks)
        got = self._pos.get(req)
        if got is not None and got[0] == self.epoch and len(got[2]) >= stop >= start >= got[3]:
            p = got[4] + start - got[3]
            arena = self.arena
            if not keep or not np.count_nonzero(arena[p:p + len(blocks)]):
                arena[p:p + len(blocks)] = blocks
                self.key[blocks] = got[2][start:stop]
                return True
        if drop is not None:
            self.key[drop] = 0
        if not self.index_new(req, start, blocks):
            self.insert(self.positions(req, stop, start), blocks, keep)
        return False

    def index_new(self, req: Request, start: int, blocks: np.ndarray) -> bool:
        """Index ``blocks`` as ``req``'s blocks from ``start`` when nothing can be there
        yet, as slices: with slots made here, when that is where its last segment begins
        (its answer: indexed at release) and no request met that chain before
        (one new extent); with fixed slots, when the blocks lie in its last run of
        positions and none of those slots was ever written. False, and nothing done,
        otherwise."""
        got = self._pos.get(req)
        if req.prefix_slots is not None:  # fixed slots: write them if never written
            stop = start + len(blocks)
            if got is None or not got[3] <= start <= stop <= len(got[2]):
                return False
            p = got[4] + start - got[3]
            if np.count_nonzero(self.arena[p:p + len(blocks)]):
                return False
            self.arena[p:p + len(blocks)] = blocks
            self.key[blocks] = got[2][start:stop]
            return True
        if got is None or got[0] != self.epoch or len(got[2]) != start:
            return False
        spans = self._spans(req)
        k = got[1]
        m = len(blocks)
        if (k != len(spans) - 3 or spans[k + 1] != start or spans[k] in self._chains
                or self._top + m > len(self.arena)):
            return False
        base = self._top
        self._top += m
        self._chains[spans[k]] = base << _SHIFT | m
        self._ext_base.append(base)
        self._ext_chain.append(spans[k])
        self.arena[base:base + m] = blocks
        self.key[blocks] = np.arange(base, base + m, dtype=np.int64)
        return True

    def insert(self, pos: np.ndarray, blocks: np.ndarray, keep: bool) -> None:
        """Index ``blocks`` (not indexed) at ``pos``; with ``keep``, a slot holding a cached
        block keeps it (found first, as vLLM's) and the new block there waits in ``dups``.
        Slots never written (0: most of a new prompt's) hold none."""
        arena = self.arena
        if keep:
            cur = arena[pos]
            if np.count_nonzero(cur):
                free = self.key[cur] != pos
                if np.count_nonzero(free) < len(free):
                    taken = ~free
                    self.dups.add(pos[taken], blocks[taken])
                    self.key[blocks[taken]] = pos[taken]
                    pos, blocks = pos[free], blocks[free]
        arena[pos] = blocks
        self.key[blocks] = pos

    def held(self, pos: np.ndarray) -> np.ndarray:
        """The cached blocks at ``pos`` (a request's next blocks) while there are any."""
        if not len(pos):
            return _EMPTY
        p = pos.item(0)
        if self.key.item(self.arena.item(p)) != p:  # the usual answer, without arrays
            return _EMPTY
        return self.lookup(pos, len(pos))

    def unindex(self, blocks: np.ndarray) -> None:
        """Unindex ``blocks`` (evicted; their slots need no clearing: lazy validity)."""
        self.key[blocks] = 0

    def num_cached(self) -> int:
        return int(np.count_nonzero(self.key))

    def check(self) -> None:
        """Assert every indexed block is at its slot, or a second copy of the block
        there (for tests)."""
        cached = np.flatnonzero(self.key)
        assert not self.key[0], "the null block is indexed"
        away = cached[self.arena[self.key[cached]] != cached].tolist()
        assert all(self.dups.holds(self.key.item(b), b) for b in away), "a block off its slot"
