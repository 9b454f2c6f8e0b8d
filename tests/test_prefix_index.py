"""The prefix caches' block index (sim/kv/prefix_index.py) against a plain dict model: slots
named by (chain, block within it), lazy validity, chains that grow a second extent, and
compaction, which renumbers every position but must change no answer (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.prefix_index import PrefixIndex
from sim.request import Request

OPEN = 1 << 62


def request(i: int, spans: list[tuple[int, int]]) -> Request:
    """A request whose segments are (chain, blocks) pairs, then an open answer chain."""
    r = Request(str(i), 0.0, 16 * sum(n for _, n in spans), 1, 1)
    flat: list[int] = []
    j = 0
    for chain, n in spans:
        flat += (chain, j, j + n)
        j += n
    flat += (1000 + i, j, OPEN)
    r.prefix_spans = flat
    return r


def names(r: Request, n: int) -> list[tuple[int, int]]:
    """(chain, block within it) of the request's blocks 0 .. n - 1."""
    spans = r.prefix_spans or []
    out = []
    for k in range(0, len(spans), 3):
        chain, j0, j1 = spans[k:k + 3]
        out += [(chain, j - j0) for j in range(j0, min(j1, n))]
    return out[:n]


def test_positions_are_per_chain_slots() -> None:
    ix = PrefixIndex(64, 16, lambda r: r.prefix_spans or [])
    a, b = request(0, [(1, 2), (2, 3)]), request(1, [(1, 2), (3, 1)])
    pa, pb = ix.positions(a, 5), ix.positions(b, 3)
    assert pa[:2].tolist() == pb[:2].tolist()  # chain 1 is one extent, shared
    assert len(set(pa.tolist())) == 5 and pb[2] not in pa
    ix.insert(pa, np.arange(1, 6), keep=True)
    assert ix.lookup(pb, 3).tolist() == [1, 2]  # b's chain 3 holds nothing
    ix.unindex(np.array([2]))
    assert ix.lookup(pa, 5).tolist() == [1]  # lazily invalid: the slot still says 2
    ix.check()


def test_a_grown_chain_survives_compaction() -> None:
    # A's answer chain gets 2 slots, then 3 more (a second extent); B shares nothing.
    # After compaction every block is found where it was, under new positions.
    ix = PrefixIndex(64, 16, lambda r: r.prefix_spans or [])
    a, b = request(0, [(1, 2)]), request(1, [(2, 2)])
    ix.insert(ix.positions(a, 4), np.array([1, 2, 3, 4]), keep=True)
    ix.insert(ix.positions(b, 2), np.array([5, 6]), keep=True)
    ix.insert(ix.positions(a, 7)[4:], np.array([7, 8, 9]), keep=True)
    ix.unindex(np.array([5, 6]))  # b's chain is dropped by the compaction
    before = ix.positions(a, 7).tolist()
    ix._make_room(0)
    assert ix.positions(a, 7).tolist() != before
    assert ix.lookup(ix.positions(a, 7), 7).tolist() == [1, 2, 3, 4, 7, 8, 9]
    assert ix.lookup(ix.positions(b, 2), 2).tolist() == []
    ix.check()


OPS = st.lists(st.tuples(st.sampled_from(["look", "index", "evict", "compact", "grow"]),
                         st.integers(0, 5), st.integers(0, 12), st.booleans()), max_size=60)


@settings(deadline=None)
@given(OPS)
def test_the_index_agrees_with_a_dict_model(ops: list[tuple[str, int, int, bool]]) -> None:
    """Lookups give the blocks a dict of (chain, block within it) -> block gives, through
    inserts (vLLM's: the first copy is found, later copies kept to take over when it is
    evicted; or into empty slots only, as the radix tree does), evictions, answers that
    grow past their first extent, and compactions."""
    ix = PrefixIndex(40, 16, lambda r: r.prefix_spans or [])
    trunks = [[(1, 2)], [(1, 2), (2, 3)], [(1, 2), (2, 1)], [(4, 3)]]
    reqs = [request(i, trunks[i % 4] + [(10 + i % 3, 1 + i % 2)]) for i in range(6)]
    slot_of: dict[int, tuple[int, int]] = {}  # block -> (chain, block within it)
    block_at: dict[tuple[int, int], int] = {}
    copies: dict[tuple[int, int], list[int]] = {}  # later copies, oldest first
    free = list(range(39, 0, -1))
    for op, who, n, keep in ops:
        r = reqs[who]
        if op == "look":
            want = []
            for name in names(r, n):
                if name not in block_at:
                    break
                want.append(block_at[name])
            assert ix.lookup(ix.positions(r, n), n).tolist() == want
        elif op == "index" and 0 < n <= len(free):
            todo = [(i, name) for i, name in enumerate(names(r, n))
                    if keep or name not in block_at]
            blocks = [free.pop() for _ in todo]
            for b, (_, name) in zip(blocks, todo, strict=True):
                slot_of[b] = name
                if name in block_at:
                    copies.setdefault(name, []).append(b)
                else:
                    block_at[name] = b
            pos = ix.positions(r, n)[[i for i, _ in todo]]
            ix.insert(pos, np.array(blocks, np.int64), keep=keep)
            free += [b for b in blocks if b not in slot_of]
        elif op == "evict" and slot_of:
            gone = sorted(slot_of)[:n % 4 + 1]
            assert ix.key[gone].all()  # each still indexed
            if ix.dups:
                ix.dups.evicting(np.array(gone), ix.key, ix.arena)
            ix.unindex(np.array(gone))
            for b in gone:
                name = slot_of.pop(b)
                if block_at.get(name) != b:  # a later copy: forgotten
                    if b in copies.get(name, ()):
                        copies[name].remove(b)
                    continue
                alts = [a for a in copies.pop(name, []) if a not in gone]
                if alts:
                    block_at[name], copies[name] = alts[0], alts[1:]
                else:
                    del block_at[name]
            free += gone
        elif op == "compact":
            ix._make_room(0)
        elif op == "grow":  # further into the open answer chain
            ix.positions(r, r.num_prompt_tokens // 16 + n)
        ix.check()
        assert ix.num_cached() == len(slot_of)
