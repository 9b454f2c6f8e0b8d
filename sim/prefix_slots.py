"""Every block of every request of a workload named once, in bulk, before the run (issue 9
speed): the prefix caches' slots (sim/prefix_index.py) fixed per workload instead of
found per request during the run.

A prefix cache names a request's block by its *slot*: (the segment chain the block ends
in, its index there); see sim/prefix_cache.py. Made at a request's first lookup, that
costs a Python loop over its segments, a dict entry per chain and arrays of its slots,
about 40 µs a Mooncake request, which is most of what a cache adds to a replay. Here the
whole workload's chains are computed by numpy, one pass per segment position, numbered,
and given fixed positions: a chain's slots are as many as the most blocks any request
ends in it (so one extent each), and chains take positions in the order requests first
meet them (so a new prompt's blocks, and its answer's after them, are mostly one run).
A request then carries its positions as a few runs (``PrefixSlotTable.runs``); the index
never renumbers them (no compaction, no dict).

The chains equal those of ``prefix_spans`` in meaning (two blocks share a slot exactly
when their requests agree on every token up to the block's end), not in value: they are
64-bit mixes of (previous chain, previous segment's tokens, segment id) by splitmix64
(Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014),
computed by numpy rather than Python's tuple hash.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain as chained

import numpy as np

from sim.prefix_cache import MOONCAKE_BLOCK_TOKENS, answer_segment_id, unique_segment_id

_ROOT = np.uint64(0x5E12E51)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_BIG = 1 << 63


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


class PrefixSlotTable:
    """The slot runs of every workload row: row i's blocks, prompt then answer, lie at
    arena positions ``runs(i)`` (first positions, lengths; int64 arrays), positions 1 to
    ``num_slots`` (0 is no slot). Build with ``from_segments`` or ``for_workload``."""

    __slots__ = ("_off", "_run_len", "_run_start", "num_slots")

    def __init__(self, run_start: np.ndarray, run_len: np.ndarray, offsets: np.ndarray,
                 num_slots: int) -> None:
        # Lists: a request's runs are read once, as Python ints.
        self._run_start: list[int] = run_start.tolist()
        self._run_len: list[int] = run_len.tolist()
        self._off: list[int] = offsets.tolist()
        self.num_slots = num_slots

    def __len__(self) -> int:
        return len(self._off) - 1

    def runs(self, i: int) -> tuple[list[int], list[int], int]:
        """Row ``i``'s runs of positions: (first positions, lengths), in block order, and
        ``num_slots`` (so that an index sizes its arena once)."""
        a, b = self._off[i], self._off[i + 1]
        return self._run_start[a:b], self._run_len[a:b], self.num_slots

    @classmethod
    def from_segments(cls, seg_ids: np.ndarray, seg_tokens: np.ndarray, offsets: np.ndarray,
                      block_size: int) -> PrefixSlotTable:
        """The table of rows whose segments (ids, token counts: int64, flat) are
        ``seg_ids[offsets[i]:offsets[i+1]]``; a row's last segment is its answer (its
        token count: the most tokens the request generates). A row's blocks are those
        ending in one of its segments, as ``prefix_spans`` cuts them.

        Raises ValueError when a token count is < 1 or the offsets do not fit."""
        seg_ids = np.asarray(seg_ids, np.int64)
        seg_tokens = np.asarray(seg_tokens, np.int64)
        offsets = np.asarray(offsets, np.int64)
        n = len(offsets) - 1
        if n < 0 or offsets[0] != 0 or offsets[-1] != len(seg_ids) or len(seg_tokens) != len(
                seg_ids) or (np.diff(offsets) < 1).any():
            raise ValueError("segments: offsets must rise from 0 to the number of segments")
        if len(seg_tokens) and seg_tokens.min() < 1:
            raise ValueError("segments: every segment must hold >= 1 token")
        nseg = np.diff(offsets)
        row = np.repeat(np.arange(n), nseg)
        # Chains, one segment position at a time over the rows that reach it (rows in
        # order of decreasing segment count, so the active ones are a prefix).
        chains = np.empty(len(seg_ids), np.uint64)
        order = np.argsort(-nseg, kind="stable")
        first = offsets[:-1][order]
        prev = np.full(n, _ROOT, np.uint64)
        prev_tokens = np.zeros(n, np.uint64)
        mixed_ids = _mix(seg_ids.astype(np.uint64) ^ _GOLD)
        counts = np.searchsorted(-nseg[order], -np.arange(1, int(nseg.max(initial=0)) + 1),
                                 side="right")
        with np.errstate(over="ignore"):
            for k, c in enumerate(counts.tolist()):
                idx = first[:c] + k
                h = _mix(prev[:c] * _GOLD + prev_tokens[:c]) ^ mixed_ids[idx]
                h = _mix(h)
                chains[idx] = h
                prev[:c] = h
                prev_tokens[:c] = seg_tokens[idx].astype(np.uint64)
        # Blocks ending in each segment: [j0, j1).
        end = np.cumsum(seg_tokens)
        end -= np.repeat(end[offsets[:-1]] - seg_tokens[offsets[:-1]], nseg)
        j1 = end // block_size
        j0 = np.empty_like(j1)
        j0[1:] = j1[:-1]
        j0[offsets[:-1]] = 0
        keep = j1 > j0
        chains, size, row = chains[keep], (j1 - j0)[keep], row[keep]
        # One extent a chain, as large as its largest span, in order of first meeting:
        # chains grouped by one sort, each group ranked by where it first occurs.
        m = len(chains)
        order = np.argsort(chains)
        grouped = chains[order]
        opens = np.ones(m, bool)
        opens[1:] = grouped[1:] != grouped[:-1]
        groups = np.flatnonzero(opens)
        inv = np.empty(m, np.int64)
        inv[order] = np.cumsum(opens) - 1
        first_at = np.minimum.reduceat(order, groups) if m else groups
        slots = np.maximum.reduceat(size[order], groups) if m else groups
        is_first = np.zeros(m, bool)
        is_first[first_at] = True
        rank = (np.cumsum(is_first) - 1)[first_at]
        ranked = np.empty(len(groups), np.int64)
        ranked[rank] = slots
        start = (1 + np.cumsum(ranked) - ranked)[rank][inv]
        # Runs: a row's spans merged where one continues the previous.
        cont = np.zeros(len(start), bool)
        cont[1:] = (row[1:] == row[:-1]) & (start[1:] == start[:-1] + size[:-1])
        heads = np.flatnonzero(~cont)
        run_len = np.add.reduceat(size, heads) if len(heads) else np.zeros(0, np.int64)
        run_off = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(row[heads], minlength=n), out=run_off[1:])
        return cls(start[heads], run_len, run_off, int(ranked.sum()))

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
            flat = _ids(chained.from_iterable(chained.from_iterable(prompt_segments)),
                        2 * int(counts.sum()))
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


def _ids(values: Iterable[int], count: int) -> np.ndarray:
    """``count`` ints as int64; one outside int64 (a 64-bit unsigned hash, say) stands
    for its Python ``hash``, as it does in ``prefix_spans``' tuple hashes."""
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
    flat = _ids(chained.from_iterable(hash_ids), int(have.sum()))
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
