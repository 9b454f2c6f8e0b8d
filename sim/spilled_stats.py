"""Statistics over columns spilled to disk (``ColumnFile``: raw little-endian arrays,
appended chunk by chunk), computed in bounded memory: numpy's pairwise float sum
reproduced over a file (``pairwise_sum``: the same additions in the same order, so the
same bits), and the ITL summary of spilled samples (``spilled_itl_stats``): in memory
with today's weighted_stats when the samples fit, else by exact order-statistic
selection (radix passes over the files) with a chunked mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from sim.latency_stats import PERCENTILES, ItlSamples, _linear_percentile, weighted_stats

#: Elements numpy sums in one call at the leaves of pairwise_sum (8 MiB of float64).
LEAF = 1 << 20
#: Most ITL entries (value, count) summarised in memory (about 60 bytes an entry at the
#: peak of weighted_stats: 0.5 GB); above it the selection passes take over.
ITL_IN_MEMORY = 1 << 23
#: Entries read at a time by the selection passes.
CHUNK = 1 << 21
#: Bits of the sort key decided per selection pass (four passes for 64 bits).
_DIGIT_BITS = 16


class ColumnFile:
    """One column appended to a raw file (dtype fixed at creation), read back whole or
    by ranges; ``len`` counts the elements written."""

    def __init__(self, path: Path, dtype: type | np.dtype) -> None:
        self.path, self.dtype = path, np.dtype(dtype)
        self._f = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._n = 0

    def append(self, values: np.ndarray) -> None:
        """Append ``values`` (converted to the column's dtype)."""
        self._f.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self._n += len(values)

    def close(self) -> None:
        """Flush and close the file for writing (reads need it closed)."""
        self._f.close()

    def __len__(self) -> int:
        return self._n

    def read(self, lo: int = 0, n: int | None = None) -> np.ndarray:
        """Elements [lo, lo + n) (to the end when n is None), as a fresh array."""
        count = self._n - lo if n is None else n
        return np.fromfile(self.path, dtype=self.dtype, count=count,
                           offset=lo * self.dtype.itemsize)

    def chunks(self, size: int = CHUNK) -> Iterator[np.ndarray]:
        """The column in order, ``size`` elements at a time."""
        for lo in range(0, self._n, size):
            yield self.read(lo, min(size, self._n - lo))


def pairwise_sum(read: Callable[[int, int], np.ndarray], n: int, leaf: int = LEAF) -> float:
    """``np.add.reduce`` of a float64 column of ``n`` elements, read as ``read(lo,
    count)``, with numpy's own pairwise recursion (numpy/_core/src/umath/
    loops_utils.h.src ``pairwise_sum``: halves split at a multiple of 8) down to runs of
    at most ``leaf``, which numpy sums itself: the same additions in the same order as
    summing the whole contiguous column at once, so the same bits, in O(leaf) memory."""
    if n <= leaf:
        return float(np.add.reduce(read(0, n))) if n else 0.0
    half = n // 2
    half -= half % 8
    return (pairwise_sum(read, half, leaf)
            + pairwise_sum(lambda lo, k: read(half + lo, k), n - half, leaf))


def spilled_itl_stats(step_s: ColumnFile, step_counts: ColumnFile,
                      irregular_s: ColumnFile) -> dict[str, float | None]:
    """weighted_stats of the ITL samples spilled as per-step gaps (s) with counts and
    irregular gaps (s), in that order (metrics.Recorder.itl_samples' order). Up to
    ITL_IN_MEMORY entries: read back and summarised by weighted_stats (identical
    figures). Above: p50-p99 and max exact (selection passes), and the mean too: the
    exact sum of the same products, rounded once (latency_stats.weighted_mean), read chunk
    by chunk."""
    if len(step_s) + len(irregular_s) <= ITL_IN_MEMORY:
        return weighted_stats(ItlSamples.concat([ItlSamples(step_s.read(), step_counts.read()),
                                                 ItlSamples.of(irregular_s.read())]))
    def parts() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return _itl_chunks(step_s, step_counts, irregular_s)

    n, top = 0, -math.inf

    def products() -> Iterator[float]:  # counting the samples and their max on the way
        nonlocal n, top
        for v, c in parts():
            n += int(c.sum())
            if len(v):
                top = max(top, float(v.max()))
            yield from (v * c).tolist()

    total = math.fsum(products())
    if n == 0:
        return weighted_stats(ItlSamples.concat([]))  # every figure None
    at = _select(parts, sorted({r for p in PERCENTILES for r in _ranks(n, p)}))
    out: dict[str, float | None] = {"mean": total / n}
    for p in PERCENTILES:
        out[f"p{p}"] = _linear_percentile(lambda r: at[r], n, p)
    out["max"] = top
    return out


def _itl_chunks(step_s: ColumnFile, step_counts: ColumnFile, irregular_s: ColumnFile
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(values, counts) chunks of the finite samples with positive counts, read from
    the files (CHUNK entries at a time)."""
    for lo in range(0, len(step_s), CHUNK):
        k = min(CHUNK, len(step_s) - lo)
        v, c = step_s.read(lo, k), step_counts.read(lo, k)
        keep = np.isfinite(v) & (c > 0)
        yield v[keep], c[keep]
    for v in irregular_s.chunks():
        v = v[np.isfinite(v)]
        yield v, np.ones(len(v), dtype=np.int64)


def _ranks(n: int, p: float) -> list[int]:
    """The 0-based ranks _linear_percentile reads for the p-th percentile of n values."""
    seen: list[int] = []

    def note(r: int) -> float:
        seen.append(r)
        return 0.0
    _linear_percentile(note, n, p)
    return seen


def _sort_keys(v: np.ndarray) -> np.ndarray:
    """uint64 keys ordered as the float64 values (IEEE bits, sign-folded)."""
    u = v.view(np.uint64)
    return u ^ np.where(u >> np.uint64(63), np.uint64(0xFFFFFFFFFFFFFFFF),
                        np.uint64(0x8000000000000000))


def _select(parts: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
            ranks: list[int]) -> dict[int, float]:
    """The values of the given 0-based ranks of the expanded multiset: each pass fixes
    the next _DIGIT_BITS bits of every rank's sort key from a count-weighted histogram
    of the entries that share its bits so far."""
    prefix = dict.fromkeys(ranks, 0)  # key bits fixed so far, per rank
    below = dict.fromkeys(ranks, 0)   # samples with a smaller prefix, per rank
    for shift in range(64 - _DIGIT_BITS, -1, -_DIGIT_BITS):
        hist = {p: np.zeros(1 << _DIGIT_BITS) for p in set(prefix.values())}
        for v, c in parts():
            keys = _sort_keys(v)
            high = keys >> np.uint64(shift + _DIGIT_BITS) if shift + _DIGIT_BITS < 64 \
                else np.zeros(len(keys), dtype=np.uint64)
            digit = ((keys >> np.uint64(shift)) & np.uint64((1 << _DIGIT_BITS) - 1))
            for p, h in hist.items():
                m = high == np.uint64(p)
                h += np.bincount(digit[m].astype(np.int64), weights=c[m],
                                 minlength=1 << _DIGIT_BITS)
        for r in ranks:
            ends = np.cumsum(hist[prefix[r]]) + below[r]
            d = int(np.searchsorted(ends, r, side="right"))
            below[r] = int(ends[d - 1]) if d else below[r]
            prefix[r] = (prefix[r] << _DIGIT_BITS) | d
    out = {}
    for r, key in prefix.items():
        k = np.array([key], dtype=np.uint64)
        u = k ^ np.where(k >> np.uint64(63), np.uint64(0x8000000000000000),
                         np.uint64(0xFFFFFFFFFFFFFFFF))
        out[r] = float(u.view(np.float64)[0])
    return out
