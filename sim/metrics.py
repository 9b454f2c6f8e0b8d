"""Run records and their summary.

The Recorder collects one row per request (when it finishes or is rejected), one row
per engine step, and the pooled inter-token latencies. ``summarize`` turns them into
summary.json. Definitions follow vLLM's benchmarks (``benchmarks/benchmark_serving.py``):
ttft = first_token_time - arrival_time (queueing included); tpot = (finish_time -
first_token_time) / (num_output_tokens - 1), left out for one-token outputs; itl = gaps
between successive token times of a request (TTFT is never an ITL sample); throughput
counts completed requests only, over first arrival to last finish; goodput counts
completed requests meeting every SLO given (<=). Percentiles are numpy's linear
interpolation, as vLLM's benchmark uses.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sim.request import Request, RequestStatus
from sim.saturation import saturation_summary

STEP_COLUMNS = (
    "start_time", "duration_s", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
    "kv_blocks_used", "num_waiting", "slots_useful", "slots_idle", "slots_empty",
    "num_preempted",
)
REQUEST_COLUMNS = (
    "request_id", "arrival_time", "first_scheduled_time", "first_token_time", "finish_time",
    "ttft_s", "tpot_s", "e2e_latency_s", "queued_time_s", "num_prompt_tokens",
    "num_output_tokens", "num_preemptions", "status", "finish_reason", "reason", "num_swaps",
)
PERCENTILES = (50, 90, 95, 99)


class Recorder:
    """Append-only columns of request rows, step rows and ITL samples (seconds).

    Step rows are stored in typed arrays (8 or 16 bytes a field), so a long run does not
    hold a Python object per step or per token.
    """

    def __init__(self) -> None:
        self._req_rows: list[tuple[Any, ...]] = []
        self._req_index: array[int] = array("q")
        # ITL samples: irregular gaps one by one (a request that skipped steps: a
        # preemption stall, a decode left out by the token budget) and, for every step,
        # its duration with the number of tokens whose gap was exactly that step.
        self.itl = array("d")
        self.itl_step_s = array("d")
        self.itl_step_count = array("q")
        self._f = {c: array("d") for c in ("start_time", "duration_s")}
        self._i = {c: array("q") for c in STEP_COLUMNS[2:]}

    def record_request(self, req: Request) -> None:
        """Store the final state of a finished or rejected request."""
        self._req_index.append(req.index)
        self._req_rows.append((
            req.request_id, req.arrival_time, req.first_scheduled_time, req.first_token_time,
            req.finish_time, req.num_prompt_tokens, req.num_output_tokens,
            req.num_preemptions, req.status.value, req.finish_reason, req.reason,
            req.num_swaps,
        ))

    def record_step(
        self, start: float, duration: float, num_seqs: int, num_prefill_tokens: int,
        num_decode_tokens: int, kv_blocks_used: int, num_waiting: int, slots_useful: int,
        slots_idle: int, slots_empty: int, num_preempted: int,
    ) -> None:
        f, i = self._f, self._i
        f["start_time"].append(start)
        f["duration_s"].append(duration)
        for name, v in zip(STEP_COLUMNS[2:], (
            num_seqs, num_prefill_tokens, num_decode_tokens, kv_blocks_used, num_waiting,
            slots_useful, slots_idle, slots_empty, num_preempted,
        ), strict=False):
            i[name].append(v)

    def itl_samples(self) -> ItlSamples:
        """Every ITL sample so far, as (values_s, counts)."""
        v = np.concatenate([np.frombuffer(self.itl_step_s, dtype=np.float64),
                            np.frombuffer(self.itl, dtype=np.float64)]) \
            if len(self.itl) + len(self.itl_step_s) else np.zeros(0)
        c = np.concatenate([np.frombuffer(self.itl_step_count, dtype=np.int64),
                            np.ones(len(self.itl), dtype=np.int64)]) \
            if len(v) else np.zeros(0, dtype=np.int64)
        return ItlSamples(v.copy(), c.copy())

    def record_decode_run(
        self, times: list[float], dts: list[float], num_seqs: int, kv_blocks_used: list[int],
        num_waiting: int, slots_idle: int, slots_empty: int,
    ) -> None:
        """Rows for a run of decode-only steps (the fast path): step j starts at times[j],
        lasts dts[j] and holds kv_blocks_used[j] blocks; the rest is constant."""
        k = len(dts)
        f, i = self._f, self._i
        f["start_time"].extend(times[:k])
        f["duration_s"].extend(dts)
        i["kv_blocks_used"].extend(kv_blocks_used)
        for name, v in (("num_seqs", num_seqs), ("num_prefill_tokens", 0),
                        ("num_decode_tokens", num_seqs), ("num_waiting", num_waiting),
                        ("slots_useful", num_seqs), ("slots_idle", slots_idle),
                        ("slots_empty", slots_empty), ("num_preempted", 0)):
            i[name].extend(array("q", [v]) * k)

    @property
    def num_requests(self) -> int:
        """Requests recorded so far (finished or rejected)."""
        return len(self._req_rows)

    @property
    def num_steps(self) -> int:
        return len(self._f["start_time"])

    def requests_frame(self) -> pd.DataFrame:
        """One row per request, in workload order, with the derived latency columns."""
        cols = ("request_id", "arrival_time", "first_scheduled_time", "first_token_time",
                "finish_time", "num_prompt_tokens", "num_output_tokens", "num_preemptions",
                "status", "finish_reason", "reason", "num_swaps")
        df = pd.DataFrame.from_records(self._req_rows, columns=list(cols))
        df.insert(0, "_index", np.frombuffer(self._req_index, dtype=np.int64)
                  if len(self._req_index) else np.zeros(0, dtype=np.int64))
        df = df.sort_values("_index", kind="stable").drop(columns="_index")
        df = df.reset_index(drop=True)
        for c in ("first_scheduled_time", "first_token_time", "finish_time"):
            df[c] = df[c].astype("float64")
        done = df["status"] == RequestStatus.FINISHED.value
        df["ttft_s"] = np.where(done, df["first_token_time"] - df["arrival_time"], np.nan)
        n_out = df["num_output_tokens"].to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = (df["finish_time"] - df["first_token_time"]) / (n_out - 1)
        df["tpot_s"] = np.where(done & (n_out > 1), tpot, np.nan)
        df["e2e_latency_s"] = np.where(done, df["finish_time"] - df["arrival_time"], np.nan)
        df["queued_time_s"] = df["first_scheduled_time"] - df["arrival_time"]
        return df[list(REQUEST_COLUMNS)]

    def steps_frame(self) -> pd.DataFrame:
        """One row per engine step."""
        data: dict[str, np.ndarray] = {}
        for c in STEP_COLUMNS:
            arr = self._f[c] if c in self._f else self._i[c]
            data[c] = np.array(arr, dtype=np.float64 if c in self._f else np.int64)
        return pd.DataFrame(data)


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
    order = np.argsort(v, kind="stable")
    v, c = v[order], c[order]
    ends = np.cumsum(c)  # rank r (0-based) holds v[searchsorted(ends, r, "right")]
    out: dict[str, float | None] = {"mean": float(np.dot(v, c) / n)}
    for p in PERCENTILES:
        h = (n - 1) * p / 100
        lo = int(np.floor(h))
        a = float(v[np.searchsorted(ends, lo, side="right")])
        b = float(v[np.searchsorted(ends, min(lo + 1, n - 1), side="right")])
        out[f"p{p}"] = _lerp(a, b, h - lo)
    out["max"] = float(v[-1])
    return out


#: Columns that must be equal for consecutive steps to share one compressed row.
RLE_KEY = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_waiting",
           "slots_useful", "slots_idle", "slots_empty")


def compress_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Run-length compress a steps frame: consecutive steps with the same composition
    (RLE_KEY) and no preemption share one row with ``num_steps`` = how many, the first
    step's ``start_time``, the summed ``duration_s`` and the largest ``kv_blocks_used``.
    A step with a preemption always keeps its own row. An uncompressed frame is the same
    with ``num_steps`` = 1 everywhere."""
    if steps.empty:
        return steps.assign(num_steps=np.zeros(0, dtype=np.int64))
    key = steps[list(RLE_KEY)].to_numpy()
    pre = steps["num_preempted"].to_numpy() > 0
    new = np.ones(len(steps), dtype=bool)
    new[1:] = (key[1:] != key[:-1]).any(axis=1) | pre[1:] | pre[:-1]
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    out = steps.iloc[first].reset_index(drop=True)
    out["duration_s"] = np.bincount(group, weights=steps["duration_s"].to_numpy())
    out["kv_blocks_used"] = np.maximum.reduceat(steps["kv_blocks_used"].to_numpy(), first)
    out["num_steps"] = np.bincount(group).astype(np.int64)
    return out


def stats(values: np.ndarray) -> dict[str, float | None]:
    """mean, p50, p90, p95, p99 and max of the finite values; None for each when empty."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {k: None for k in ("mean", "p50", "p90", "p95", "p99", "max")}
    ps = np.percentile(v, PERCENTILES)
    out: dict[str, float | None] = {"mean": float(v.mean())}
    out.update({f"p{p}": float(x) for p, x in zip(PERCENTILES, ps, strict=False)})
    out["max"] = float(v.max())
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


def summarize(
    requests: pd.DataFrame, steps: pd.DataFrame, itl: np.ndarray | ItlSamples, *,
    max_num_seqs: int,
    num_gpu_blocks: int, block_size: int, slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict[str, Any]:
    """The summary.json dictionary (keys listed in the README; later versions add keys,
    never rename). ``itl`` is the pooled ITL samples in seconds (an array or ItlSamples)."""
    done = (requests["status"] == RequestStatus.FINISHED.value).to_numpy()
    fin = requests[done]
    duration = float(fin["finish_time"].max() - requests["arrival_time"].min()) if len(fin) else 0.0
    n_out = int(fin["num_output_tokens"].sum())
    n_tot = n_out + int(fin["num_prompt_tokens"].sum())

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    goodput = None
    if slo_ttft_s is not None or slo_tpot_s is not None:
        ok = meets_slos(fin["ttft_s"].to_numpy(), fin["tpot_s"].to_numpy(), slo_ttft_s,
                        slo_tpot_s)
        goodput = per_s(float(ok.sum()))
    num_steps = len(steps)
    slot_total = num_steps * max_num_seqs
    dur = steps["duration_s"].to_numpy()
    usable = max(num_gpu_blocks - 1, 1)
    usage = steps["kv_blocks_used"].to_numpy() / usable
    return {
        "num_requests": len(requests),
        "num_finished": int(done.sum()),
        "num_rejected": int((requests["status"] == RequestStatus.REJECTED.value).sum()),
        "duration_s": duration,
        "throughput": {
            "output_tokens_per_s": per_s(n_out),
            "total_tokens_per_s": per_s(n_tot),
            "requests_per_s": per_s(float(len(fin))),
        },
        "ttft_s": stats(fin["ttft_s"].to_numpy()),
        "tpot_s": stats(fin["tpot_s"].to_numpy()),
        "itl_s": weighted_stats(ItlSamples.of(itl)),
        "e2e_latency_s": stats(fin["e2e_latency_s"].to_numpy()),
        "queued_time_s": stats(requests["queued_time_s"].to_numpy()),
        "goodput_requests_per_s": goodput,
        "num_preemptions": int(requests["num_preemptions"].sum()),
        "num_swaps": int(requests["num_swaps"].sum()),
        "kv_cache": {
            "num_gpu_blocks": int(num_gpu_blocks),
            "block_size": int(block_size),
            "peak_usage": float(usage.max()) if num_steps else 0.0,
            "mean_usage": float((usage * dur).sum() / dur.sum()) if dur.sum() > 0 else 0.0,
        },
        "batch": {"mean_num_seqs": float(steps["num_seqs"].mean()) if num_steps else 0.0},
        "slots": {
            f"{k}_fraction": (float(steps[f"slots_{k}"].sum()) / slot_total
                              if slot_total else 0.0)
            for k in ("useful", "idle", "empty")
        },
        **saturation_summary(requests),
    }


def finite_or_none(x: float) -> float | None:
    """JSON-safe float: NaN/inf become None."""
    return x if math.isfinite(x) else None
