"""Run records and their summary: the Recorder, the step row (StepRow), the run-length
compression of step tables and ``summarize``.

The Recorder collects one row per request (when it finishes or is rejected), one row
per engine step, and the pooled inter-token latencies (booked only through its
``book_itl*`` methods), and hands them out as column tables (sim/table.py: numpy only,
so the run path never imports pandas). ``summarize`` turns them into summary.json.
Definitions follow vLLM's benchmarks (``benchmarks/benchmark_serving.py``): ttft =
first_token_time - arrival_time (queueing included); tpot = (finish_time -
first_token_time) / (num_output_tokens - 1), left out for one-token outputs; itl = gaps
between successive token times of a request (TTFT is never an ITL sample); throughput
counts completed requests only, over first arrival to last finish; goodput counts
completed requests meeting every SLO given (<=). Percentiles are numpy's linear
interpolation, as vLLM's benchmark uses (sim/latency_stats.py).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from operator import sub
from typing import Any

import numpy as np

from sim.latency_stats import ItlSamples, meets_slos, stats, weighted_stats
from sim.request import Request, RequestStatus
from sim.saturation import saturation_summary
from sim.table import Table, column

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
#: The step columns that stay constant over a decode run, as record_step stores them.
_CONST_STEP_COLUMNS = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_waiting",
                       "slots_useful", "slots_idle", "slots_empty", "num_preempted")
#: Constant-column tuples held before they are packed into an array (bounds memory).
_PACK_ROWS = 1 << 16
#: What record_request stores per request, in this order.
_RAW_REQUEST_COLUMNS = (
    "request_id", "arrival_time", "first_scheduled_time", "first_token_time", "finish_time",
    "num_prompt_tokens", "num_output_tokens", "num_preemptions", "status", "finish_reason",
    "reason", "num_swaps",
)
_FLOAT_REQUEST_COLUMNS = ("arrival_time", "first_scheduled_time", "first_token_time",
                          "finish_time")
_OBJECT_REQUEST_COLUMNS = ("request_id", "status", "finish_reason", "reason")


@dataclass(slots=True)
class StepRow:
    """One engine step's row (STEP_COLUMNS, in that order; times in seconds)."""

    start_time: float
    duration_s: float
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    kv_blocks_used: int
    num_waiting: int
    slots_useful: int
    slots_idle: int
    slots_empty: int
    num_preempted: int


class Recorder:
    """Append-only columns of request rows, step rows and ITL samples (seconds).

    Step rows are stored in typed arrays (8 bytes a field), the columns that stay
    constant over a decode run once per run, so a long run does not hold a Python object
    per step or per token. ``request_columns`` and ``step_columns`` return
    them as column tables (sim/table.py).
    """

    def __init__(self) -> None:
        self._req_rows: list[tuple[Any, ...]] = []
        self._req_index: array[int] = array("q")
        # ITL samples: irregular gaps one by one (a request that skipped steps: a
        # preemption stall, a decode left out by the token budget) and, for every step,
        # its duration with the number of tokens whose gap was exactly that step.
        self._itl = array("d")
        self._itl_step_s = array("d")
        self._itl_step_count = array("q")
        # Step rows. start_time, duration_s and kv_blocks_used change from step to step:
        # typed arrays (8 bytes a field). The other columns are constant over a decode
        # run: one tuple of them per record call with the number of steps it covers,
        # packed into int64 arrays every _PACK_ROWS calls.
        self._start = array("d")
        self._duration = array("d")
        self._blocks = array("q")
        self._start_append, self._duration_append = self._start.append, self._duration.append
        self._blocks_append = self._blocks.append
        self._rows: list[tuple[int, ...]] = []
        self._rows_append = self._rows.append
        self._row_steps = array("q")
        self._row_steps_append = self._row_steps.append
        self._packed: list[np.ndarray] = []

    def record_request(self, req: Request) -> None:
        """Store the final state of a finished or rejected request."""
        self._req_index.append(req.index)
        self._req_rows.append((
            req.request_id, req.arrival_time, req.first_scheduled_time, req.first_token_time,
            req.finish_time, req.num_prompt_tokens, req.num_output_tokens,
            req.num_preemptions, req.status.value, req.finish_reason, req.reason,
            req.num_swaps,
        ))

    def record_step(self, row: StepRow) -> None:
        """Store one engine step."""
        self._start_append(row.start_time)
        self._duration_append(row.duration_s)
        self._blocks_append(row.kv_blocks_used)
        self._rows_append((row.num_seqs, row.num_prefill_tokens, row.num_decode_tokens,
                           row.num_waiting, row.slots_useful, row.slots_idle, row.slots_empty,
                           row.num_preempted))
        self._row_steps_append(1)
        if len(self._rows) >= _PACK_ROWS:
            self._pack()

    # -- ITL samples: every path of the engine books them here --
    def book_itl(self, gap_s: float, copies: int = 1) -> None:
        """``copies`` irregular samples of ``gap_s`` seconds (tokens whose previous token
        came before the step that produced them: after a stall or a skipped step)."""
        if copies == 1:
            self._itl.append(gap_s)
        else:
            self._itl.extend(array("d", [gap_s]) * copies)

    def book_itl_step(self, duration_s: float, count: int) -> None:
        """``count`` tokens whose previous token came at the start of the step that
        produced them, which lasted ``duration_s`` seconds."""
        self._itl_step_s.append(duration_s)
        self._itl_step_count.append(count)

    def book_itl_run(self, times: list[float], count: int, first_count: int) -> None:
        """book_itl_step for each step of a run with boundaries ``times``: ``first_count``
        tokens in its first step (those whose previous token came at the run's start),
        ``count`` in each later one."""
        if first_count:
            self._itl_step_s.append(times[1] - times[0])
            self._itl_step_count.append(first_count)
        if len(times) > 2:
            self._itl_step_s.extend(map(sub, times[2:], times[1:-1]))
            self._itl_step_count.extend(array("q", [count]) * (len(times) - 2))

    def _pack(self) -> None:
        """Move the pending constant-column tuples into an int64 array."""
        if self._rows:
            self._packed.append(np.array(self._rows, dtype=np.int64))
            self._rows.clear()

    def itl_samples(self) -> ItlSamples:
        """Every ITL sample so far, as (values_s, counts)."""
        v = np.concatenate([np.frombuffer(self._itl_step_s, dtype=np.float64),
                            np.frombuffer(self._itl, dtype=np.float64)]) \
            if len(self._itl) + len(self._itl_step_s) else np.zeros(0)
        c = np.concatenate([np.frombuffer(self._itl_step_count, dtype=np.int64),
                            np.ones(len(self._itl), dtype=np.int64)]) \
            if len(v) else np.zeros(0, dtype=np.int64)
        return ItlSamples(v.copy(), c.copy())

    def record_decode_run(
        self, times: list[float], dts: list[float], num_seqs: int, kv_blocks_used: list[int],
        num_waiting: int, slots_idle: int, slots_empty: int,
    ) -> None:
        """Rows for a run of decode-only steps (the fast path): step j starts at times[j],
        lasts dts[j] and holds kv_blocks_used[j] blocks; the rest is constant."""
        k = len(dts)
        self._start.extend(times[:k])
        self._duration.extend(dts)
        self._blocks.extend(kv_blocks_used)
        self._rows_append((num_seqs, 0, num_seqs, num_waiting, num_seqs, slots_idle,
                           slots_empty, 0))
        self._row_steps_append(k)
        if len(self._rows) >= _PACK_ROWS:
            self._pack()

    @property
    def num_requests(self) -> int:
        """Requests recorded so far (finished or rejected)."""
        return len(self._req_rows)

    @property
    def num_steps(self) -> int:
        """Steps recorded so far."""
        return len(self._start)

    def request_columns(self) -> dict[str, np.ndarray]:
        """One row per request, in workload order, with the derived latency columns: a
        column table (sim/table.py) of REQUEST_COLUMNS. Times are float64 seconds (NaN
        where the event never happened or the metric is undefined), counts int64,
        request_id / status / finish_reason / reason object arrays (str or None)."""
        rows = self._req_rows
        n = len(rows)
        order = np.argsort(np.frombuffer(self._req_index, dtype=np.int64), kind="stable") \
            if n else np.zeros(0, dtype=np.int64)
        raw = dict(zip(_RAW_REQUEST_COLUMNS, zip(*rows, strict=True) if n
                       else [()] * len(_RAW_REQUEST_COLUMNS), strict=True))
        cols: dict[str, np.ndarray] = {}
        for c, values in raw.items():
            if c in _OBJECT_REQUEST_COLUMNS:
                a = np.empty(n, dtype=object)
                a[:] = values
            else:  # None (an event that never happened) becomes NaN
                a = np.array(values, dtype=np.float64 if c in _FLOAT_REQUEST_COLUMNS
                             else np.int64)
            cols[c] = a[order]
        arrival, first_token = cols["arrival_time"], cols["first_token_time"]
        finish, n_out = cols["finish_time"], cols["num_output_tokens"]
        done = cols["status"] == RequestStatus.FINISHED.value
        cols["ttft_s"] = np.where(done, first_token - arrival, np.nan)
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = (finish - first_token) / (n_out - 1)
        cols["tpot_s"] = np.where(done & (n_out > 1), tpot, np.nan)
        cols["e2e_latency_s"] = np.where(done, finish - arrival, np.nan)
        cols["queued_time_s"] = cols["first_scheduled_time"] - arrival
        return {c: cols[c] for c in REQUEST_COLUMNS}

    def step_columns(self) -> dict[str, np.ndarray]:
        """One row per engine step: a column table of STEP_COLUMNS (start_time and
        duration_s float64 seconds, the rest int64 counts)."""
        self._pack()
        rows = (np.concatenate(self._packed) if self._packed
                else np.zeros((0, len(_CONST_STEP_COLUMNS)), dtype=np.int64))
        steps = np.repeat(rows, np.frombuffer(self._row_steps, dtype=np.int64)
                          if len(self._row_steps) else np.zeros(0, dtype=np.int64), axis=0)
        out = {"start_time": np.array(self._start, dtype=np.float64),
               "duration_s": np.array(self._duration, dtype=np.float64),
               "kv_blocks_used": np.array(self._blocks, dtype=np.int64)}
        out.update({c: steps[:, i].copy() for i, c in enumerate(_CONST_STEP_COLUMNS)})
        return {c: out[c] for c in STEP_COLUMNS}


#: Columns that must be equal for consecutive steps to share one compressed row.
RLE_KEY = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_waiting",
           "slots_useful", "slots_idle", "slots_empty")


def compress_steps(steps: Table) -> dict[str, np.ndarray]:
    """Run-length compress a step table (columns as in STEP_COLUMNS, and any others,
    such as a cluster's ``replica``): consecutive steps with the
    same composition (RLE_KEY) and no preemption share one row with ``num_steps`` = how
    many, the first step's ``start_time`` (and other columns), the summed ``duration_s``
    and the largest ``kv_blocks_used``. A step with a preemption always keeps its own
    row. Returns a column table: the input's columns in their order, then ``num_steps``
    (int64). An uncompressed table is the same with ``num_steps`` = 1 everywhere."""
    cols = {c: column(steps, c) for c in steps}
    n = len(cols["start_time"])
    if n == 0:
        return {**cols, "num_steps": np.zeros(0, dtype=np.int64)}
    pre = cols["num_preempted"] > 0
    new = np.ones(n, dtype=bool)
    new[1:] = pre[1:] | pre[:-1]
    for c in RLE_KEY:
        k = cols[c]
        new[1:] |= k[1:] != k[:-1]
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    out = {c: v[first] for c, v in cols.items()}
    out["duration_s"] = np.bincount(group, weights=cols["duration_s"])
    out["kv_blocks_used"] = np.maximum.reduceat(cols["kv_blocks_used"], first)
    out["num_steps"] = np.bincount(group).astype(np.int64)
    return out


def summarize(
    requests: Table, steps: Table,
    itl: np.ndarray | ItlSamples, *, max_num_seqs: int,
    num_gpu_blocks: int, block_size: int, slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict[str, Any]:
    """The summary.json dictionary (keys listed in the README; later versions add keys,
    never rename). ``requests`` holds REQUEST_COLUMNS and ``steps`` STEP_COLUMNS, as
    column tables (sim/table.py); ``itl`` is the pooled ITL samples in
    seconds (an array or ItlSamples)."""
    status = column(requests, "status")
    done = status == RequestStatus.FINISHED.value

    def fin(name: str) -> np.ndarray:
        return column(requests, name)[done]

    n_fin = int(done.sum())
    # nanmax / nanmin: a time that never happened (NaN) is left out.
    duration = (float(np.nanmax(fin("finish_time"))
                      - np.nanmin(column(requests, "arrival_time"))) if n_fin else 0.0)
    goodput = None
    if slo_ttft_s is not None or slo_tpot_s is not None:
        ok = meets_slos(fin("ttft_s"), fin("tpot_s"), slo_ttft_s, slo_tpot_s)
        goodput = _per_s(float(ok.sum()), duration)
    num_seqs = column(steps, "num_seqs")
    return {
        "num_requests": len(status),
        "num_finished": n_fin,
        "num_rejected": int((status == RequestStatus.REJECTED.value).sum()),
        "duration_s": duration,
        "throughput": _throughput(fin("num_output_tokens"), fin("num_prompt_tokens"), n_fin,
                                  duration),
        "ttft_s": stats(fin("ttft_s")),
        "tpot_s": stats(fin("tpot_s")),
        "itl_s": weighted_stats(ItlSamples.of(itl)),
        "e2e_latency_s": stats(fin("e2e_latency_s")),
        "queued_time_s": stats(column(requests, "queued_time_s")),
        "goodput_requests_per_s": goodput,
        "num_preemptions": int(column(requests, "num_preemptions").sum()),
        "num_swaps": int(column(requests, "num_swaps").sum()),
        "kv_cache": _kv_cache(steps, num_gpu_blocks, block_size),
        # float64 sum / count: what pandas' mean of an int column computes.
        "batch": {"mean_num_seqs": float(num_seqs.sum(dtype=np.float64) / len(num_seqs))
                  if len(num_seqs) else 0.0},
        "slots": _slots(steps, len(num_seqs) * max_num_seqs),
        **saturation_summary(requests),
    }


def _per_s(x: float, duration: float) -> float:
    """``x`` per second of ``duration`` (s); 0 for an empty run."""
    return x / duration if duration > 0 else 0.0


def _throughput(num_output_tokens: np.ndarray, num_prompt_tokens: np.ndarray,
                num_finished: int, duration: float) -> dict[str, float]:
    """summary.json's ``throughput``: the finished requests' tokens and count per second."""
    n_out = int(num_output_tokens.sum())
    n_tot = n_out + int(num_prompt_tokens.sum())
    return {
        "output_tokens_per_s": _per_s(n_out, duration),
        "total_tokens_per_s": _per_s(n_tot, duration),
        "requests_per_s": _per_s(float(num_finished), duration),
    }


def _kv_cache(steps: Table, num_gpu_blocks: int,
              block_size: int) -> dict[str, Any]:
    """summary.json's ``kv_cache``: the pool, and its usage (blocks in use / usable
    blocks) at its peak step and as a mean weighted by step duration."""
    dur = column(steps, "duration_s")
    usage = column(steps, "kv_blocks_used") / max(num_gpu_blocks - 1, 1)
    return {
        "num_gpu_blocks": int(num_gpu_blocks),
        "block_size": int(block_size),
        "peak_usage": float(usage.max()) if len(usage) else 0.0,
        "mean_usage": float((usage * dur).sum() / dur.sum()) if dur.sum() > 0 else 0.0,
    }


def _slots(steps: Table, slot_total: int) -> dict[str, float]:
    """summary.json's ``slots``: useful, idle and empty slot-steps over ``slot_total``
    (steps x max_num_seqs)."""
    return {f"{k}_fraction": (float(column(steps, f"slots_{k}").sum()) / slot_total
                              if slot_total else 0.0)
            for k in ("useful", "idle", "empty")}
