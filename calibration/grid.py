"""The measurement grid and the measured-point records (no torch).

Owns: :data:`REGIONS`, :class:`GridConfig` (how far the grid reaches and how many rounds
time it), :class:`GridPoint` (one step shape to time, in one region), :func:`make_grid`
(the points, in an order whose every prefix spreads over the grid, so a budget cut keeps a
usable sample) and :class:`MeasuredPoint` (a point plus its measured seconds: the plain
record the fit and the profile file store).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.batch import BatchShape

REGIONS = ("prefill", "decode", "mixed")
"""prefill: one prefill chunk alone; decode: decodes alone; mixed: decodes + one chunk."""


@dataclass(frozen=True, slots=True)
class GridConfig:
    """How far the grid reaches and how each point is timed.

    max_num_seqs: largest decode batch (mixed steps hold up to max_num_seqs - 1 decodes
      beside the chunk). max_num_batched_tokens: largest tokens in one step.
    max_context: longest context a sequence reaches (tokens; keys read by the longest decode).
    repeats: timed rounds over the grid (each point keeps its fastest, median and slowest
      run); warmup: untimed
      rounds before them.
    Raises ValueError naming the field when out of range.
    """

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_context: int = 2048
    repeats: int = 5
    warmup: int = 1

    def __post_init__(self) -> None:
        for name, value, low in (("max_num_seqs", self.max_num_seqs, 1),
                                 ("max_num_batched_tokens", self.max_num_batched_tokens, 2),
                                 ("repeats", self.repeats, 1), ("warmup", self.warmup, 0)):
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if self.max_context < self.max_num_batched_tokens:
            raise ValueError(f"max_context ({self.max_context}) must be >= "
                             f"max_num_batched_tokens ({self.max_num_batched_tokens})")


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One step to time: ``decode_seqs`` decodes, each over ``decode_context`` cached tokens,
    plus (when chunk_tokens > 0) one prefill chunk of ``chunk_tokens`` after
    ``chunk_context`` cached tokens that samples a token when ``chunk_sample``.
    ``index``: the point's position in its region's grid (the held-out split keys on it)."""

    region: str
    index: int
    decode_seqs: int = 0
    decode_context: int = 0
    chunk_tokens: int = 0
    chunk_context: int = 0
    chunk_sample: bool = True

    @property
    def shape(self) -> BatchShape:
        """The BatchShape the simulator would build for this step (sim.batch.shape_of)."""
        n, c, b = self.chunk_tokens, self.chunk_context, self.decode_seqs
        return BatchShape(
            num_prefill_tokens=n, num_prefill_seqs=1 if n else 0, prefill_context_tokens=c,
            prefill_attention_pairs=n * c + n * (n + 1) // 2, num_decode_seqs=b,
            decode_context_tokens=b * (self.decode_context + 1),
            num_sampled_seqs=b + (1 if n and self.chunk_sample else 0))


@dataclass(frozen=True, slots=True)
class MeasuredPoint:
    """A grid point and its measured step time.

    seconds: the fastest of ``repeats`` timed runs, what a fit on "min" takes
      (calibration.fit.STATISTICS): on the wall clock load from other processes only ever
      adds time, so the minimum is the steadiest estimate of the step on a dedicated device
      (on a shared CPU wall-clock medians were often spoilt: fits on them missed by 10-25%).
    seconds_median: the median run, what a fit on "median" takes (the default on the thread
      clock); seconds_max: the slowest.
    peak_bytes: device memory peak during the point (CUDA only, else None).
    """

    point: GridPoint
    seconds: float
    seconds_median: float
    seconds_max: float
    repeats: int
    peak_bytes: int | None = None

    @property
    def region(self) -> str:
        return self.point.region

    @property
    def shape(self) -> BatchShape:
        return self.point.shape

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON record: grid fields, the derived BatchShape fields, timings."""
        p, s = self.point, self.shape
        shape = {f: getattr(s, f) for f in BatchShape.__dataclass_fields__}
        return {"region": p.region, "index": p.index, "decode_seqs": p.decode_seqs,
                "decode_context": p.decode_context, "chunk_tokens": p.chunk_tokens,
                "chunk_context": p.chunk_context, "chunk_sample": p.chunk_sample, **shape,
                "seconds": self.seconds, "seconds_median": self.seconds_median,
                "seconds_max": self.seconds_max, "repeats": self.repeats,
                "peak_bytes": self.peak_bytes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MeasuredPoint:
        """Inverse of to_dict; KeyError / TypeError / ValueError on a malformed record."""
        if d["region"] not in REGIONS:
            raise ValueError(f"region must be one of {REGIONS}, got {d['region']!r}")
        point = GridPoint(str(d["region"]), int(d["index"]), int(d["decode_seqs"]),
                          int(d["decode_context"]), int(d["chunk_tokens"]),
                          int(d["chunk_context"]), bool(d["chunk_sample"]))
        seconds = float(d["seconds"])
        if not seconds > 0:
            raise ValueError(f"seconds must be > 0, got {seconds}")
        peak = d.get("peak_bytes")
        return cls(point, seconds, float(d["seconds_median"]), float(d["seconds_max"]),
                   int(d["repeats"]), None if peak is None else int(peak))


def _levels(low: int, high: int, n: int) -> list[int]:
    """Up to n distinct integers spaced geometrically from low to high inclusive."""
    if high <= low or n < 2:
        return [high]
    ratio = (high / low) ** (1 / (n - 1))
    return sorted({round(low * ratio**i) for i in range(n)} | {high})


def _spread(items: list[GridPoint]) -> list[GridPoint]:
    """Reorder so every prefix spreads over the list (bit-reversal, van der Corput order)."""
    bits = max(1, math.ceil(math.log2(max(len(items), 1))))
    keys = [int(format(i, f"0{bits}b")[::-1], 2) for i in range(len(items))]
    return [p for _, p in sorted(zip(keys, items, strict=True), key=lambda kp: kp[0])]


def make_grid(cfg: GridConfig) -> list[GridPoint]:
    """Prefill chunks (tokens x prior context), decode batches (batch size x context) and
    mixed steps (decodes + one chunk), regions interleaved, each in spread order.

    Prefill: 6 chunk sizes 8..max_num_batched_tokens x prior context 0 and 1/8, 1/2, all of
    the room left under max_context; every other point does not sample (a non-final chunk).
    Decode: 6 batch sizes 1..max_num_seqs x 4 contexts 32..max_context-1.
    Mixed: 4 decode counts 1..max_num_seqs-1 x 3 chunk sizes 16..(budget left) x 2 decode
    contexts (max_context/16, /2); chunk context alternates 0 and max_context/4 over the
    (decodes, chunk size) checkerboard; two of three chunks sample.
    """
    s, t, c = cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_context
    prefill: list[GridPoint] = []
    for ti, n in enumerate(_levels(min(8, t), t, 6)):
        for ci, frac in enumerate((0.0, 0.125, 0.5, 1.0)):
            prefill.append(GridPoint("prefill", len(prefill), chunk_tokens=n,
                                     chunk_context=round((c - n) * frac),
                                     chunk_sample=(ti + ci) % 2 == 0))
    decode = [GridPoint("decode", i, decode_seqs=b, decode_context=ctx)
              for i, (b, ctx) in enumerate((b, ctx) for b in _levels(1, s, 6)
                                           for ctx in _levels(min(32, c - 1), c - 1, 4))]
    mixed: list[GridPoint] = []
    if s >= 2 and t >= 3:
        for bi, b in enumerate(_levels(1, min(s - 1, t - 2), 4)):
            for ni, n in enumerate(_levels(min(16, t - b), t - b, 3)):
                for dctx in (max(1, c // 16), c // 2):
                    cctx = 0 if (bi + ni) % 2 == 0 else min(c // 4, c - n)
                    i = len(mixed)
                    mixed.append(GridPoint("mixed", i, b, dctx, n, cctx, i % 3 != 0))
    lists = [_spread(prefill), _spread(decode), _spread(mixed)]
    order: list[GridPoint] = []
    for i in range(max(len(x) for x in lists)):
        order.extend(x[i] for x in lists if i < len(x))
    return order
