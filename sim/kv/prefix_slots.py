"""Every block of every request of a workload named once, in bulk, before the run (for
speed): the prefix caches' slots (sim/kv/prefix_index.py) fixed per workload instead of
found per request during the run.

A prefix cache names a request's block by its *slot*: (the segment chain the block ends
in, its index there); see sim/kv/prefix_content.py. Made at a request's first lookup, that
costs a Python loop over its segments, a dict entry per chain and arrays of its slots,
about 40 µs a Mooncake request, which is most of what a cache adds to a replay. Here the
whole workload's chains are computed by numpy, one pass per segment position
(``segment_chains``: the same values as ``chain_hash`` gives ``prefix_spans``), grouped
by one sort and given fixed positions: a chain's slots are as many as the most blocks
any request ends in it (so one extent each), and chains take positions in the order
requests first meet them (so a new prompt's blocks, and its answer's after them, are
mostly one run). A request then carries its positions as a few runs
(``PrefixSlotTable.runs``); the index never renumbers them (no compaction, no dict).

Memory: the table holds about three runs a row (two int64 each); an index's arena holds
one int64 per slot, that is per distinct (chain, block) of the workload: 5.9 million
(47 MB) for the Mooncake conversation trace at block_size 16, sixteen times that at
block_size 1. Past ``sim.app.runs.prompt_content.MAX_FIXED_SLOTS`` (32 M slots, 256 MB, over all the
replicas' caches) a run names its blocks per request instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain as chained

import numpy as np

from sim.kv.prefix_content import (
    CHAIN_ROOT,
    MIX_1,
    MIX_2,
    MIX_GOLD,
    MOONCAKE_BLOCK_TOKENS,
    answer_segment_id,
    unique_segment_id,
)

_ROOT, _M1, _M2, _GOLD = (np.uint64(x) for x in (CHAIN_ROOT, MIX_1, MIX_2, MIX_GOLD))
_BIG = 1 << 63


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def segment_chains(seg_ids: np.ndarray, seg_tokens: np.ndarray,
                   offsets: np.ndarray) -> np.ndarray:
    """Every segment's chain (uint64, flat like ``seg_ids``): ``chain_hash`` of the row's
    previous chain (``CHAIN_ROOT`` first), the previous segment's tokens (0 first) and
    the segment's id, computed one segment position at a time over the rows that reach
    it (rows in order of decreasing segment count, so the active ones are a prefix)."""
    nseg = np.diff(offsets)
    n = len(nseg)
    chains = np.empty(len(seg_ids), np.uint64)
    order = np.argsort(-nseg, kind="stable")
    first = offsets[:-1][order]
    prev = np.full(n, _ROOT, np.uint64)
    prev_tokens = np.zeros(n, np.uint64)
    keys = _mix(seg_ids.astype(np.uint64) ^ _GOLD)
    counts = np.searchsorted(-nseg[order], -np.arange(1, int(nseg.max(initial=0)) + 1),
                             side="right")
    with np.errstate(over="ignore"):
        for k, c in enumerate(counts.tolist()):
            idx = first[:c] + k
            h = _mix(_mix(prev[:c] * _GOLD + prev_tokens[:c]) ^ keys[idx])
            chains[idx] = h
            prev[:c] = h
            prev_tokens[:c] = seg_tokens[idx].astype(np.uint64)
    return chains


def _block_ends(seg_tokens: np.ndarray, offsets: np.ndarray,
                block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The blocks ending in each segment, [j0, j1), as ``prefix_spans`` cuts them."""
    nseg = np.diff(offsets)
    end = np.cumsum(seg_tokens)
    end -= np.repeat(end[offsets[:-1]] - seg_tokens[offsets[:-1]], nseg)
    j1 = end // block_size
    j0 = np.empty_like(j1)
    j0[1:] = j1[:-1]
    j0[offsets[:-1]] = 0
    return j0, j1


def _layout(chains: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, int]:
    """Each span's first position, and the slots in all: a chain gets one extent as large
    as its largest span, chains in the order spans first meet them. Chains are grouped
    by one sort, each group ranked by where it first occurs."""
    m = len(chains)
    if not m:
        return np.zeros(0, np.int64), 0
    order = np.argsort(chains)
    grouped = chains[order]
    opens = np.ones(m, bool)
    opens[1:] = grouped[1:] != grouped[:-1]
    groups = np.flatnonzero(opens)
    inv = np.empty(m, np.int64)
    inv[order] = np.cumsum(opens) - 1
    first_at = np.minimum.reduceat(order, groups)
    slots = np.maximum.reduceat(size[order], groups)
    is_first = np.zeros(m, bool)
    is_first[first_at] = True
    rank = (np.cumsum(is_first) - 1)[first_at]
    ranked = np.empty(len(groups), np.int64)
    ranked[rank] = slots
    return (1 + np.cumsum(ranked) - ranked)[rank][inv], int(ranked.sum())


class PrefixSlotTable:
    """The slot runs of every workload row: row i's blocks, prompt then answer, lie at
    arena positions ``runs(i)`` (first positions, lengths), positions 1 to ``num_slots``
    (0 is no slot). Build with ``from_segments`` or ``for_workload``."""

    __slots__ = ("_off", "_run_len", "_run_start", "num_slots")

    def __init__(self, run_start: np.ndarray, run_len: np.ndarray, offsets: np.ndarray,
                 num_slots: int) -> None:
        self._run_start, self._run_len, self._off = run_start, run_len, offsets
        self.num_slots = num_slots

    def __len__(self) -> int:
        return len(self._off) - 1

    def runs(self, i: int) -> tuple[list[int], list[int], int]:
        """Row ``i``'s runs of positions: (first positions, lengths) as lists, in block
        order, and ``num_slots`` (so that an index sizes its arena once)."""
        a, b = int(self._off[i]), int(self._off[i + 1])
        return self._run_start[a:b].tolist(), self._run_len[a:b].tolist(), self.num_slots

    @classmethod
    def from_segments(cls, seg_ids: np.ndarray, seg_tokens: np.ndarray, offsets: np.ndarray,
                      block_size: int) -> PrefixSlotTable:
        """The table of rows whose segments (ids, token counts: int64, flat) are
        ``seg_ids[offsets[i]:offsets[i+1]]``; a row's last segment is its answer (its
        token count: the most tokens the request generates). A row's blocks are those
        ending in one of its segments, as ``prefix_spans`` cuts them.

        Raises ValueError (one line naming the field) for block_size < 1, ids and token
        counts of different lengths, offsets that do not rise from 0 to the number of
        segments by at least 1 a row, or a token count < 1."""
        seg_ids = np.asarray(seg_ids, np.int64)
        seg_tokens = np.asarray(seg_tokens, np.int64)
        offsets = np.asarray(offsets, np.int64)
        if int(block_size) != block_size or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        if len(seg_tokens) != len(seg_ids):
            raise ValueError(f"segments: {len(seg_ids)} ids but {len(seg_tokens)} token "
                             "counts")
        n = len(offsets) - 1
        if (n < 0 or offsets[0] != 0 or offsets[-1] != len(seg_ids)
                or (np.diff(offsets) < 1).any()):
            raise ValueError("segments: offsets must rise from 0 to the number of segments, "
                             "by at least 1 a row")
        if len(seg_tokens) and seg_tokens.min() < 1:
            raise ValueError("segments: every segment must hold >= 1 token")
        chains = segment_chains(seg_ids, seg_tokens, offsets)
        j0, j1 = _block_ends(seg_tokens, offsets, block_size)
        keep = j1 > j0
        size = (j1 - j0)[keep]
        row = np.repeat(np.arange(n), np.diff(offsets))[keep]
        start, num_slots = _layout(chains[keep], size)
        # Runs: a row's spans merged where one continues the previous.
        cont = np.zeros(len(start), bool)
        cont[1:] = (row[1:] == row[:-1]) & (start[1:] == start[:-1] + size[:-1])
        heads = np.flatnonzero(~cont)
        run_len = np.add.reduceat(size, heads) if len(heads) else np.zeros(0, np.int64)
        run_off = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(row[heads], minlength=n), out=run_off[1:])
        return cls(start[heads], run_len, run_off, num_slots)

    @classmethod
    def for_workload(cls, num_prompt_tokens: np.ndarray, output_len: np.ndarray,
                     request_id: Sequence[str], block_size: int, *,
                     prompt_segments: Sequence[Sequence[tuple[int, int]]] | None = None,
                     hash_ids: Sequence[Sequence[int]] | None = None) -> PrefixSlotTable:
        """The table of a workload's rows: their ``prompt_segments``, or else their
        Mooncake ``hash_ids`` as ``mooncake_segments`` reads them (512 tokens an id, the
        last cut to the prompt), then each row's answer (``answer_segment_id``, output_len
        tokens). Raises ValueError when the workload has neither."""
        prompt = np.asarray(num_prompt_tokens, np.int64)
        out = np.asarray(output_len, np.int64)
        n = len(prompt)
        answers = np.fromiter((answer_segment_id(r) for r in request_id), np.int64, n)
        if prompt_segments is not None:
            counts = np.fromiter(map(len, prompt_segments), np.int64, n)
            flat = _ids(chained.from_iterable(chained.from_iterable(prompt_segments)))
            ids, tokens = flat[0::2], flat[1::2]
        elif hash_ids is not None:
            ids, tokens, counts = _mooncake(hash_ids, prompt, request_id)
        else:
            raise ValueError("a slot table needs prompt_segments or hash_ids")
        # Each row's segments, then its answer.
        off = np.zeros(n + 1, np.int64)
        np.cumsum(counts + 1, out=off[1:])
        at = np.arange(len(ids)) + np.repeat(np.arange(n), counts)
        seg_ids = np.empty(off[-1], np.int64)
        seg_tokens = np.empty(off[-1], np.int64)
        seg_ids[at], seg_tokens[at] = ids, tokens
        seg_ids[off[1:] - 1], seg_tokens[off[1:] - 1] = answers, out
        return cls.from_segments(seg_ids, seg_tokens, off, block_size)


def _ids(values: Iterable[int]) -> np.ndarray:
    """Ints as int64; one outside int64 (a 64-bit unsigned hash, say) stands for its
    Python ``hash``, as ``segment_key`` reads it."""
    values = list(values)
    try:
        return np.array(values, np.int64)
    except OverflowError:
        return np.array([v if -_BIG <= v < _BIG else hash(v) for v in values], np.int64)


def _mooncake(hash_ids: Sequence[Sequence[int]], prompt: np.ndarray,
              request_id: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``mooncake_segments`` of every row, flat: ids, tokens, segments a row."""
    n, per = len(prompt), MOONCAKE_BLOCK_TOKENS
    have = np.fromiter(map(len, hash_ids), np.int64, n)
    flat = _ids(chained.from_iterable(hash_ids))
    k = np.minimum(have, -(-prompt // per))
    # Ids beyond the prompt are dropped: keep the first k of each row.
    pos = np.arange(len(flat)) - np.repeat(np.cumsum(have) - have, have)
    ids = flat[pos < np.repeat(k, have)]
    tokens = np.full(len(ids), per, np.int64)
    ends = np.cumsum(k) - 1
    rows = np.flatnonzero(k > 0)
    covered = k * per
    cut = rows[covered[rows] > prompt[rows]]
    tokens[ends[cut]] -= covered[cut] - prompt[cut]
    short = np.flatnonzero(covered < prompt)
    if not len(short):
        return ids, tokens, k
    # Tokens beyond the ids (never in the shared traces): a segment of the row's own.
    counts = k.copy()
    counts[short] += 1
    off = np.cumsum(counts) - counts
    at = np.arange(len(ids)) + np.repeat(np.cumsum(counts - k) - (counts - k), k)
    all_ids = np.empty(int(counts.sum()), np.int64)
    all_tokens = np.empty_like(all_ids)
    all_ids[at], all_tokens[at] = ids, tokens
    last = off[short] + k[short]
    all_ids[last] = [unique_segment_id(request_id[i]) for i in short.tolist()]
    all_tokens[last] = prompt[short] - covered[short]
    return all_ids, all_tokens, counts
