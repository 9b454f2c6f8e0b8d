"""Run records and their summary: the Recorder, the step row (StepRow), the run-length
compression of step tables and ``summarize``.

The Recorder collects one row per request (when it finishes or is rejected), one row
per engine step, and the pooled inter-token latencies (booked only through its
``book_itl*`` methods), and hands them out as column tables (sim/table.py: numpy only,
so the run path never imports pandas), or, given a RecordSink, hands them to it in
chunks as the run goes (sim/record_spool.py streams them to disk) and holds none to the
end. ``summarize`` turns them into summary.json.
Definitions follow vLLM's benchmarks (``benchmarks/benchmark_serving.py``): ttft =
first_token_time - arrival_time (queueing included); tpot = (finish_time -
first_token_time) / (num_output_tokens - 1), left out for one-token outputs; itl = gaps
between successive token times of a request (TTFT is never an ITL sample); throughput
counts completed requests only, over first arrival to last finish; goodput counts
completed requests meeting every SLO given (<=). Percentiles are numpy's linear
interpolation, as vLLM's benchmark uses (sim/latency_stats.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import sub
from typing import Any, Protocol

import numpy as np

from sim.latency_stats import ItlSamples, meets_slos, stats, weighted_stats
from sim.request import Request, RequestStatus
from sim.saturation import saturation_summary
from sim.step_totals import StepTotals
from sim.table import ColumnBuffer, Table, column

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
#: Step record calls whose values are held in lists before they are settled into numpy
#: chunks (bounds memory), and handed to a sink.
_PACK_ROWS = 1 << 16
#: What record_request stores per request, in this order.
_RAW_REQUEST_COLUMNS = tuple(c for c in REQUEST_COLUMNS if c not in (
    "ttft_s", "tpot_s", "e2e_latency_s", "queued_time_s"))
_FLOAT_REQUEST_COLUMNS = ("arrival_time", "first_scheduled_time", "first_token_time",
                          "finish_time")
_OBJECT_REQUEST_COLUMNS = ("request_id", "status", "finish_reason", "reason")


class RecordSink(Protocol):
    """Where a streaming Recorder hands its records, a chunk at a time, in the order the
    run makes them (sim/record_spool.py's RecordSpool)."""

    def write_requests(self, index: np.ndarray, table: dict[str, np.ndarray]) -> None:
        """Finished or rejected requests: ``index`` their workload rows (int64), ``table``
        REQUEST_COLUMNS (as request_columns makes them) in the same order."""

    def write_steps(self, table: dict[str, np.ndarray]) -> None:
        """The next steps, as step_columns makes them (STEP_COLUMNS)."""

    def write_itl(self, step_s: np.ndarray, step_counts: np.ndarray,
                  irregular_s: np.ndarray) -> None:
        """The next ITL samples: per-step gaps (s), their counts, irregular gaps (s)."""


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

    Step rows are stored in numpy chunks (sim.table.ColumnBuffer: 8 bytes a field), the
    columns that stay constant over a decode run once per run, so a long run does not
    hold a Python object per step or per token. ``request_columns`` and ``step_columns`` return
    them as column tables (sim/table.py). Given a ``sink``, every _PACK_ROWS step records
    it hands everything recorded so far to the sink and forgets it (the tables are then
    the sink's: request_columns, step_columns and itl_samples hold only what is pending).
    """

    def __init__(self, sink: RecordSink | None = None) -> None:
        self._sink = sink
        self._num_flushed_requests = self._num_flushed_steps = 0
        self._req_rows: list[tuple[Any, ...]] = []
        self._req_index = ColumnBuffer(np.int64)
        # ITL samples: irregular gaps one by one (a request that skipped steps: a
        # preemption stall, a decode left out by the token budget) and, for every step,
        # its duration with the number of tokens whose gap was exactly that step.
        self._itl = ColumnBuffer(np.float64)
        self._itl_step_s = ColumnBuffer(np.float64)
        self._itl_step_count = ColumnBuffer(np.int64)
        # Step rows. start_time, duration_s and kv_blocks_used change from step to step.
        # The other columns are constant over a decode run: stored once per record call
        # (_consts, flat in _CONST_STEP_COLUMNS order) with the number of steps it covers
        # (_row_steps). Every _PACK_ROWS record calls the values are settled.
        self._start = ColumnBuffer(np.float64)
        self._duration = ColumnBuffer(np.float64)
        self._blocks = ColumnBuffer(np.int64)
        self._consts = ColumnBuffer(np.int64)
        self._row_steps = ColumnBuffer(np.int64)
        self._columns = (self._req_index, self._itl, self._itl_step_s, self._itl_step_count,
                         self._start, self._duration, self._blocks, self._consts,
                         self._row_steps)
        # The hot path appends to the pending lists themselves: ColumnBuffer is not
        # compiled, so reaching its ``pending`` would cost an attribute lookup each time.
        self._new_req_index: list[int] = self._req_index.pending
        self._new_start: list[float] = self._start.pending
        self._new_duration: list[float] = self._duration.pending
        self._new_blocks: list[int] = self._blocks.pending
        self._new_consts: list[int] = self._consts.pending
        self._new_row_steps: list[int] = self._row_steps.pending
        self._new_itl: list[float] = self._itl.pending
        self._new_itl_step_s: list[float] = self._itl_step_s.pending
        self._new_itl_step_count: list[int] = self._itl_step_count.pending

    def record_request(self, req: Request) -> None:
        """Store the final state of a finished or rejected request (its status's text
        read as ``_value_``: the ``value`` property is an interpreted call)."""
        self._new_req_index.append(req.index)
        self._req_rows.append((
            req.request_id, req.arrival_time, req.first_scheduled_time, req.first_token_time,
            req.finish_time, req.num_prompt_tokens, req.num_output_tokens,
            req.num_preemptions, req.status._value_, req.finish_reason, req.reason,
            req.num_swaps,
        ))

    def record_step(self, row: StepRow) -> None:
        """Store one engine step."""
        self._new_start.append(row.start_time)
        self._new_duration.append(row.duration_s)
        self._new_blocks.append(row.kv_blocks_used)
        self._new_consts.extend((row.num_seqs, row.num_prefill_tokens, row.num_decode_tokens,
                                 row.num_waiting, row.slots_useful, row.slots_idle,
                                 row.slots_empty, row.num_preempted))
        self._new_row_steps.append(1)
        if len(self._new_row_steps) >= _PACK_ROWS:
            self._pack()

    # -- ITL samples: every path of the engine books them here --
    def book_itl(self, gap_s: float, copies: int = 1) -> None:
        """``copies`` irregular samples of ``gap_s`` seconds (tokens whose previous token
        came before the step that produced them: after a stall or a skipped step)."""
        if copies == 1:
            self._new_itl.append(gap_s)
        else:
            self._new_itl.extend([gap_s] * copies)

    def book_itl_step(self, duration_s: float, count: int) -> None:
        """``count`` tokens whose previous token came at the start of the step that
        produced them, which lasted ``duration_s`` seconds."""
        self._new_itl_step_s.append(duration_s)
        self._new_itl_step_count.append(count)

    def book_itl_run(self, times: list[float], count: int, first_count: int) -> None:
        """book_itl_step for each step of a run with boundaries ``times``: ``first_count``
        tokens in its first step (those whose previous token came at the run's start),
        ``count`` in each later one."""
        if first_count:
            self._new_itl_step_s.append(times[1] - times[0])
            self._new_itl_step_count.append(first_count)
        if len(times) > 2:
            self._new_itl_step_s.extend(map(sub, times[2:], times[1:-1]))
            self._new_itl_step_count.extend([count] * (len(times) - 2))

    def _pack(self) -> None:
        """Move the pending values into numpy chunks; with a sink, then hand it
        everything recorded so far."""
        for col in self._columns:
            col.settle()
        if self._sink is not None:
            self.flush()

    def flush(self) -> None:
        """Hand every pending record to the sink and forget it (no-op without a sink);
        call it after the run, for the last records."""
        sink = self._sink
        if sink is None:
            return
        if self._req_rows:
            index = self._req_index.values()
            table = _request_table(self._req_rows, index)  # ordered by index
            sink.write_requests(np.sort(index, kind="stable"), table)
            self._num_flushed_requests += len(self._req_rows)
            self._req_rows.clear()
            self._req_index.clear()
        if len(self._start):
            sink.write_steps(self.step_columns())
            self._num_flushed_steps += len(self._start)
            for col in (self._start, self._duration, self._blocks, self._consts,
                        self._row_steps):
                col.clear()
        if len(self._itl) or len(self._itl_step_s):
            sink.write_itl(self._itl_step_s.values(), self._itl_step_count.values(),
                           self._itl.values())
            for col in (self._itl, self._itl_step_s, self._itl_step_count):
                col.clear()

    def itl_samples(self) -> ItlSamples:
        """Every ITL sample so far, as (values_s, counts)."""
        irregular = self._itl.values()
        v = np.concatenate([self._itl_step_s.values(), irregular])
        c = np.concatenate([self._itl_step_count.values(),
                            np.ones(len(irregular), dtype=np.int64)])
        return ItlSamples(v, c)

    def record_decode_run(
        self, times: list[float], dts: list[float], num_seqs: int, kv_blocks_used: list[int],
        num_waiting: int, slots_idle: int, slots_empty: int,
    ) -> None:
        """Rows for a run of decode-only steps (the fast path): step j starts at times[j],
        lasts dts[j] and holds kv_blocks_used[j] blocks; the rest is constant."""
        self.record_steps(times, dts, kv_blocks_used, (num_seqs, 0, num_seqs, num_waiting,
                                                      num_seqs, slots_idle, slots_empty, 0))

    def record_steps(self, times: Sequence[float], dts: Sequence[float],
                     kv_blocks_used: Sequence[int], row: tuple[int, ...]) -> None:
        """Rows for len(dts) steps alike but for their start (times[j]), duration (dts[j])
        and blocks (kv_blocks_used[j]); ``row`` holds the other columns, in
        _CONST_STEP_COLUMNS order, stored once for them all (a fast-path run's stretch
        of steps: no tuple per step)."""
        k = len(dts)
        self._new_start.extend(times[:k])
        self._new_duration.extend(dts)
        self._new_blocks.extend(kv_blocks_used)
        self._new_consts.extend(row)
        self._new_row_steps.append(k)
        if len(self._new_row_steps) >= _PACK_ROWS:
            self._pack()

    @property
    def num_requests(self) -> int:
        """Requests recorded so far (finished or rejected), those flushed included."""
        return self._num_flushed_requests + len(self._req_rows)

    @property
    def num_steps(self) -> int:
        """Steps recorded so far, those flushed included."""
        return self._num_flushed_steps + len(self._start)

    def request_columns(self) -> dict[str, np.ndarray]:
        """One row per request, in workload order, with the derived latency columns: a
        column table (sim/table.py) of REQUEST_COLUMNS. Times are float64 seconds (NaN
        where the event never happened or the metric is undefined), counts int64,
        request_id / status / finish_reason / reason object arrays (str or None)."""
        return _request_table(self._req_rows, self._req_index.values())

    def step_columns(self) -> dict[str, np.ndarray]:
        """One row per engine step: a column table of STEP_COLUMNS (start_time and
        duration_s float64 seconds, the rest int64 counts)."""
        rows = self._consts.values().reshape(-1, len(_CONST_STEP_COLUMNS))
        steps = np.repeat(rows, self._row_steps.values(), axis=0)
        out = {"start_time": self._start.values(), "duration_s": self._duration.values(),
               "kv_blocks_used": self._blocks.values()}
        out.update({c: steps[:, i].copy() for i, c in enumerate(_CONST_STEP_COLUMNS)})
        return {c: out[c] for c in STEP_COLUMNS}


def _request_table(rows: list[tuple[Any, ...]], index: np.ndarray) -> dict[str, np.ndarray]:
    """Request rows (record_request's tuples) as a column table of REQUEST_COLUMNS, ordered
    by ``index`` (their workload rows, int64), with the derived latency columns."""
    n = len(rows)
    order = np.argsort(index, kind="stable") if n else np.zeros(0, dtype=np.int64)
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


def summarize(
    requests: Table, steps: Table | StepTotals,
    itl: np.ndarray | ItlSamples | dict[str, float | None], *, max_num_seqs: int,
    num_gpu_blocks: int, block_size: int, slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict[str, Any]:
    """The summary.json dictionary (keys listed in the README; later versions add keys,
    never rename). ``requests`` holds REQUEST_COLUMNS and ``steps`` STEP_COLUMNS, as
    column tables (sim/table.py), or ``steps`` is their StepTotals; ``itl`` is the pooled
    ITL samples in seconds (an array or ItlSamples), or their weighted_stats."""
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
    totals = steps if isinstance(steps, StepTotals) else StepTotals.of(steps, num_gpu_blocks)
    return {
        "num_requests": len(status),
        "num_finished": n_fin,
        "num_rejected": int((status == RequestStatus.REJECTED.value).sum()),
        "duration_s": duration,
        "throughput": _throughput(fin("num_output_tokens"), fin("num_prompt_tokens"), n_fin,
                                  duration),
        "ttft_s": stats(fin("ttft_s")),
        "tpot_s": stats(fin("tpot_s")),
        "itl_s": itl if isinstance(itl, dict) else weighted_stats(ItlSamples.of(itl)),
        "e2e_latency_s": stats(fin("e2e_latency_s")),
        "queued_time_s": stats(column(requests, "queued_time_s")),
        "goodput_requests_per_s": goodput,
        "num_preemptions": int(column(requests, "num_preemptions").sum()),
        "num_swaps": int(column(requests, "num_swaps").sum()),
        **totals.summary(num_gpu_blocks, block_size, max_num_seqs),
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
