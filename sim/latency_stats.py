"""Latency statistics of a run: the pooled ITL samples as a weighted multiset
(``ItlSamples``), the mean / percentile / max summaries summary.json reports, and the SLO
test behind goodput. Percentiles are numpy's default linear interpolation (Hyndman &
Fan's 7th method), as vLLM's ``benchmarks/benchmark_serving.py`` computes them, with
numpy's arithmetic in numpy's order, so they equal ``np.percentile`` to the last bit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class ItlSamples:
    """A multiset of ITL samples: ``values_s[i]`` occurs ``counts[i]`` times (float64 s,
    int64 >= 1, same length). Steps hold many equal gaps, so a run keeps one entry per
    step instead of one per token."""

    values_s: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, samples: np.ndarray | ItlSamples) -> ItlSamples:
        if isinstance(samples, ItlSamples):
            return samples
        v = np.asarray(samples, dtype=np.float64)
        return cls(v, np.ones(len(v), dtype=np.int64))

    @classmethod
    def concat(cls, parts: list[ItlSamples]) -> ItlSamples:
        if not parts:
            return cls(np.zeros(0), np.zeros(0, dtype=np.int64))
        return cls(np.concatenate([p.values_s for p in parts]),
                   np.concatenate([p.counts for p in parts]))

    def __len__(self) -> int:
        return int(self.counts.sum())

    def sorted(self) -> ItlSamples:
        """The same multiset with its entries in ascending value, equal values in their
        order here (a stable sort)."""
        order = np.argsort(self.values_s, kind="stable")
        return ItlSamples(self.values_s[order], self.counts[order])

    def expanded(self) -> np.ndarray:
        """Every sample, one by one (for tests and small runs)."""
        return np.repeat(self.values_s, self.counts)


def _lerp(a: float, b: float, t: float) -> float:
    # numpy's own linear interpolation (numpy/lib/_function_base_impl.py ``_lerp``), so
    # weighted percentiles equal np.percentile of the expanded samples to the last bit.
    d = b - a
    return b - d * (1 - t) if t >= 0.5 else a + d * t


def weighted_stats(samples: ItlSamples) -> dict[str, float | None]:
    """``stats`` of the expanded multiset, without expanding it: mean, the linear-method
    percentiles (p50, p90, p95, p99) and max."""
    v, c = samples.values_s, samples.counts
    keep = np.isfinite(v) & (c > 0)
    v, c = v[keep], c[keep]
    n = int(c.sum())
    if n == 0:
        return {k: None for k in ("mean", "p50", "p90", "p95", "p99", "max")}
    out: dict[str, float | None] = {"mean": weighted_mean(v, c, n)}
    ordered = ItlSamples(v, c).sorted()
    v, c = ordered.values_s, ordered.counts
    ends = np.cumsum(c)  # rank r (0-based) holds v[searchsorted(ends, r, "right")]
    for p in PERCENTILES:
        out[f"p{p}"] = _linear_percentile(
            lambda r: float(v[np.searchsorted(ends, r, side="right")]), n, p)
    out["max"] = float(v[-1])
    return out


def weighted_mean(values_s: np.ndarray, counts: np.ndarray, n: int) -> float:
    """sum(values_s * counts) / n (float64, counts int64, n their sum >= 1), the sum
    exact before its one rounding (math.fsum of the float64 products): the same bits in
    any order, chunk by chunk or whole, and on any machine. (np.dot would hand it to
    BLAS, whose threads split the sum by the machine's core count and then spin.) The
    products are made _MEAN_CHUNK at a time, so the Python floats fsum reads are never
    all held at once (a 1M-request run has about 8 million entries)."""
    chunks = ((values_s[i:i + _MEAN_CHUNK] * counts[i:i + _MEAN_CHUNK]).tolist()
              for i in range(0, len(values_s), _MEAN_CHUNK))
    return math.fsum(itertools.chain.from_iterable(chunks)) / n


#: Entries whose products weighted_mean turns into Python floats at a time.
_MEAN_CHUNK = 1 << 16


def _linear_percentile(value_at: Callable[[int], float], n: int, p: float) -> float:
    """The p-th percentile (numpy's default "linear" method, Hyndman & Fan's 7th) of n
    sorted values, the one of rank r read as ``value_at(r)``: the same arithmetic in the
    same order as ``np.percentile`` (numpy/lib/_function_base_impl.py ``_quantile``),
    so the result is identical to the last bit."""
    h = (n - 1) * (p / 100)
    if h >= n - 1:
        return value_at(n - 1)
    lo = math.floor(h)
    return _lerp(value_at(lo), value_at(lo + 1), h - lo)


def stats(values: np.ndarray) -> dict[str, float | None]:
    """mean, p50, p90, p95, p99 and max of the finite values; None for each when empty."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {k: None for k in ("mean", "p50", "p90", "p95", "p99", "max")}
    # np.percentile itself would do, but numpy 2.4 imports numpy.ma on its first call
    # (0.05-0.09 s, a tenth of a small run).
    out: dict[str, float | None] = {"mean": float(v.mean())}  # before sorting: same sum
    v = np.sort(v)
    for p in PERCENTILES:
        out[f"p{p}"] = _linear_percentile(lambda r: float(v[r]), v.size, p)
    out["max"] = float(v[-1])
    return out


#: Largest SLO, in seconds, that is read as seconds: a TTFT objective of minutes, or a
#: TPOT objective of more than a second a token, is no service level anyone sets, while
#: 2000 and 50 are what vLLM users type (``vllm bench serve --goodput ttft:2000
#: tpot:50`` is in milliseconds).
MAX_SLO_S = {"slo_ttft": 60.0, "slo_tpot": 1.0}


def check_slo_seconds(name: str, value_s: float | None) -> None:
    """Raise ValueError (one line naming ``name``, slo_ttft or slo_tpot) unless
    ``value_s`` is None or a number of seconds in (0, MAX_SLO_S[name]]; a larger one
    is refused as milliseconds typed for seconds, with the value in seconds to give."""
    if value_s is None:
        return
    top = MAX_SLO_S[name]
    if not value_s > 0 or math.isnan(value_s):
        raise ValueError(f"{name} must be a number of seconds in (0, {top:g}], got {value_s}")
    if value_s > top:
        raise ValueError(
            f"{name} {value_s:g} s looks like milliseconds (vLLM's --goodput "
            f"{name[4:]}:{value_s:g} is in ms): SLOs here are in seconds, at most {top:g}; "
            f"give {value_s / 1000:g} for {value_s:g} ms")


#: vLLM bench serve's --goodput names (vllm/benchmarks/serve.py, 0.32) and servesim's
#: option for each; e2el (end-to-end latency) has no servesim SLO.
GOODPUT_NAMES = {"ttft": "slo_ttft", "tpot": "slo_tpot"}


def parse_goodput(text: str) -> dict[str, float]:
    """vLLM bench serve's ``--goodput`` value, KEY:VALUE pairs in milliseconds separated
    by spaces or commas (``ttft:2000 tpot:50``), as servesim's SLOs in seconds:
    ``{"slo_ttft": 2.0, "slo_tpot": 0.05}``. A request is good when it meets every one
    (<=), as in vLLM's calculate_metrics. Raises ValueError naming the pair for a
    malformed pair, a name other than ttft or tpot (vLLM's e2el is not modelled), a
    repeated name, or a value outside (0, MAX_SLO_S] (in ms here)."""
    out: dict[str, float] = {}
    pairs = text.replace(",", " ").split()
    if not pairs:
        raise ValueError("goodput: give KEY:VALUE pairs in ms, e.g. --goodput ttft:2000 tpot:50")
    for pair in pairs:
        name, sep, value = pair.partition(":")
        if not sep or (name not in GOODPUT_NAMES and name != "e2el"):
            raise ValueError(f"goodput: {pair!r} is not ttft:MS or tpot:MS (vLLM's "
                             "KEY:VALUE in milliseconds)")
        if name == "e2el":
            raise ValueError("goodput: e2el (end-to-end latency) has no SLO in servesim; "
                             "give ttft:MS and/or tpot:MS")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"goodput: {pair!r}: {value!r} is not a number of ms") from None
        field = GOODPUT_NAMES[name]
        if field in out:
            raise ValueError(f"goodput: {name} given twice")
        top_ms = MAX_SLO_S[field] * 1000
        if not 0 < ms <= top_ms:
            raise ValueError(f"goodput: {name} must be a number of ms in (0, {top_ms:g}], "
                             f"got {value}")
        out[field] = ms / 1000
    return out


def meets_slos(ttft: np.ndarray, tpot: np.ndarray, slo_ttft_s: float | None,
               slo_tpot_s: float | None) -> np.ndarray:
    """Boolean mask of requests meeting every SLO given (<=). A missing TPOT (one-token
    output) meets any TPOT SLO; a missing TTFT (not completed) meets none."""
    ok = np.isfinite(ttft)
    if slo_ttft_s is not None:
        ok &= ttft <= slo_ttft_s
    if slo_tpot_s is not None:
        ok &= ~(tpot > slo_tpot_s)  # NaN (no TPOT sample) passes
    return ok
