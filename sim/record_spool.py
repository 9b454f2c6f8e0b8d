"""Records streamed to disk as a run goes (metrics.RecordSink): ``RecordSpool`` writes
requests.csv and steps.csv into a run directory while the engine runs, spills the
columns summary.json needs to raw files beside them, and at the end computes the
summary from those files. Memory stays bounded by the requests in flight, not the
requests run.

- requests.csv in workload order: requests arrive in finish order; a reorder buffer
  keyed by workload row writes every row as soon as all earlier rows are out (it holds
  the rows finished since the oldest request still in flight arrived).
- steps.csv run-length compressed as step_compression.compress_steps compresses the whole table:
  the last, still open, group of each chunk is carried into the next as one row that
  stands for its steps, so its sums are the same additions in the same order.
- summary.json equal to metrics.summarize's: the request columns read back one at a
  time and given to summarize itself; the step totals summed exactly as numpy sums a
  whole column (spilled_stats.pairwise_sum); the ITL statistics as spilled_stats states.

The spill files live in ``.records/`` inside the run directory (a staged one: a failed
run leaves nothing behind) and are removed by ``finish``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sim.metrics import REQUEST_COLUMNS, STEP_COLUMNS, summarize
from sim.request import RequestStatus
from sim.spilled_stats import ColumnFile, pairwise_sum, spilled_itl_stats
from sim.step_compression import compress_steps
from sim.step_totals import StepTotals
from sim.table import write_csv_header, write_csv_rows

#: Request columns spilled for the summary (status as its code in _STATUSES).
_SUMMARY_COLUMNS = tuple(c for c in REQUEST_COLUMNS
                         if c not in ("request_id", "finish_reason", "reason"))
_STATUSES = tuple(s.value for s in RequestStatus)
SPILL_DIR = ".records"


class RecordSpool:
    """A metrics.RecordSink writing ``run_dir``/requests.csv and steps.csv as records
    come (``full_steps``: one steps.csv row per step), and summary.json's figures at
    ``finish``. ``num_gpu_blocks`` prices KV usage as summarize does."""

    def __init__(self, run_dir: Path, num_gpu_blocks: int, full_steps: bool = False) -> None:
        self._spill = run_dir / SPILL_DIR
        self._spill.mkdir()
        self._requests_csv = open(run_dir / "requests.csv", "w", newline="",  # noqa: SIM115
                                  encoding="utf-8")
        self._steps_csv = open(run_dir / "steps.csv", "w", newline="",  # noqa: SIM115
                               encoding="utf-8")
        write_csv_header(self._requests_csv, list(REQUEST_COLUMNS))
        write_csv_header(self._steps_csv, [*STEP_COLUMNS, "num_steps"])
        self._full_steps = full_steps
        self._blocks_per_usage = max(num_gpu_blocks - 1, 1)
        self._num_gpu_blocks = num_gpu_blocks
        self._requests = {c: ColumnFile(self._spill / f"requests.{c}",
                                        np.int8 if c == "status" else np.float64
                                        if c.endswith(("_time", "_s")) else np.int64)
                          for c in _SUMMARY_COLUMNS}
        self._steps = {c: ColumnFile(self._spill / f"steps.{c}", t)
                       for c, t in (("duration_s", np.float64), ("kv_blocks_used", np.int64))}
        self._itl = [ColumnFile(self._spill / "itl.step_s", np.float64),
                     ColumnFile(self._spill / "itl.step_counts", np.int64),
                     ColumnFile(self._spill / "itl.irregular_s", np.float64)]
        self._next_index = 0
        self._pending_index = np.zeros(0, dtype=np.int64)
        self._pending: dict[str, np.ndarray] | None = None
        self._carry: dict[str, np.ndarray] | None = None
        self._sums = {"num_steps": 0, "num_seqs": 0, "slots_useful": 0, "slots_idle": 0,
                      "slots_empty": 0}
        self._peak_usage = 0.0

    # -- metrics.RecordSink --
    def write_requests(self, index: np.ndarray, table: dict[str, np.ndarray]) -> None:
        """Buffer the rows; write those whose every earlier workload row is out."""
        index = np.concatenate([self._pending_index, index])
        if self._pending is not None:
            table = {c: np.concatenate([self._pending[c], v]) for c, v in table.items()}
        merged = np.argsort(index, kind="stable")
        index, table = index[merged], {c: v[merged] for c, v in table.items()}
        expected = self._next_index + np.arange(len(index))
        ready = int(np.argmin(index == expected)) if not (index == expected).all() \
            else len(index)
        self._emit_requests({c: v[:ready] for c, v in table.items()})
        self._next_index += ready
        self._pending_index = index[ready:]
        self._pending = {c: v[ready:] for c, v in table.items()}

    def write_steps(self, table: dict[str, np.ndarray]) -> None:
        """Write the steps' rows (compressed across chunks) and add up their totals."""
        blocks, dur = table["kv_blocks_used"], table["duration_s"]
        self._steps["duration_s"].append(dur)
        self._steps["kv_blocks_used"].append(blocks)
        self._sums["num_steps"] += len(dur)
        for c in ("num_seqs", "slots_useful", "slots_idle", "slots_empty"):
            self._sums[c] += int(table[c].sum())
        if len(blocks):  # division is monotone: the peak usage is the peak's usage
            self._peak_usage = max(self._peak_usage,
                                   float(blocks.max() / self._blocks_per_usage))
        if self._full_steps:
            write_csv_rows(self._steps_csv, {**table, "num_steps": np.ones(len(dur), np.int64)})
            return
        counts = np.ones(len(dur), dtype=np.int64)
        if self._carry is not None:
            counts = np.concatenate([self._carry["num_steps"], counts])
            table = {c: np.concatenate([self._carry[c], v]) for c, v in table.items()}
        rows = compress_steps(table, counts)
        write_csv_rows(self._steps_csv, {c: v[:-1] for c, v in rows.items()})
        self._carry = {c: v[-1:] for c, v in rows.items()}

    def write_itl(self, step_s: np.ndarray, step_counts: np.ndarray,
                  irregular_s: np.ndarray) -> None:
        """Spill the ITL samples."""
        for f, v in zip(self._itl, (step_s, step_counts, irregular_s), strict=True):
            f.append(v)

    # -- the end of the run --
    def finish(self, *, max_num_seqs: int, block_size: int, slo_ttft_s: float | None = None,
               slo_tpot_s: float | None = None) -> dict[str, Any]:
        """Write the rows still held, close the CSVs, and return summary.json's dict (as
        metrics.summarize makes it); the spill files are removed. Call once, after the
        Recorder's last flush."""
        if self._pending is not None:  # rows whose earlier rows never came (none normally)
            self._emit_requests(self._pending)
            self._pending = None
        if self._carry is not None:
            write_csv_rows(self._steps_csv, self._carry)
            self._carry = None
        self.close()
        summary = summarize(_SpilledRequests(self._requests), self._step_totals(),
                            spilled_itl_stats(*self._itl), max_num_seqs=max_num_seqs,
                            num_gpu_blocks=self._num_gpu_blocks, block_size=block_size,
                            slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
        shutil.rmtree(self._spill)
        return summary

    def close(self) -> None:
        """Close every file (again: no-op); a failed run's staging is then removed whole."""
        self._requests_csv.close()
        self._steps_csv.close()
        for f in [*self._requests.values(), *self._steps.values(), *self._itl]:
            f.close()

    def _emit_requests(self, table: dict[str, np.ndarray]) -> None:
        """Rows in workload order: to requests.csv, and the summary's columns spilled."""
        if not len(table["request_id"]):
            return
        write_csv_rows(self._requests_csv, table)
        for c, f in self._requests.items():
            f.append(_status_codes(table[c]) if c == "status" else table[c])

    def _step_totals(self) -> StepTotals:
        """StepTotals as StepTotals.of makes them from the whole table: the float sums
        by numpy's pairwise order over the spilled columns."""
        dur, blocks = self._steps["duration_s"], self._steps["kv_blocks_used"]
        s = self._sums

        def usage_s(lo: int, n: int) -> np.ndarray:
            return blocks.read(lo, n) / self._blocks_per_usage * dur.read(lo, n)
        return StepTotals(s["num_steps"], s["num_seqs"], s["slots_useful"], s["slots_idle"],
                          s["slots_empty"], self._peak_usage,
                          pairwise_sum(usage_s, len(dur)), pairwise_sum(dur.read, len(dur)))


def _status_codes(status: np.ndarray) -> np.ndarray:
    """Status strings as their int8 codes (positions in _STATUSES)."""
    codes = np.zeros(len(status), dtype=np.int8)
    for i, name in enumerate(_STATUSES):
        codes[status == name] = i
    return codes


class _SpilledRequests(Mapping[str, np.ndarray]):
    """The spilled request columns as a column table, each read from disk when asked
    for (so summarize holds about one at a time); status as its strings."""

    def __init__(self, files: dict[str, ColumnFile]) -> None:
        self._files = files

    def __getitem__(self, name: str) -> np.ndarray:
        values = self._files[name].read()
        if name == "status":
            return np.array(_STATUSES, dtype=object)[values]
        return values

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)
