"""The column-mapped CSV trace formats: which columns hold what, and how a read stops early.

Owns the table of CSV formats read by column name (each with its documented source), the
``--trace-format`` spelling with filters (``burstgpt:model=ChatGPT,log_type=API log``), the
parsed columns both readers (``bulk``: pandas; ``rows``: row by row, naming the line at
fault) return, and ``Progress``: when the rows read so far already hold the
``--num-requests`` / ``--window`` cut, so a time-ordered file is not read further.

Formats (a request's arrival in seconds unless said otherwise):

- ``azure``: Azure LLM inference trace 2023 (Splitwise, ``AzureLLMInferenceDataset2023.md``)
  and 2024 (DynamoLLM, ``AzureLLMInferenceDataset2024.md``, repository
  Azure/AzurePublicDataset): ``TIMESTAMP`` (invocation time, wall clock; see
  timestamps.py), ``ContextTokens``, ``GeneratedTokens``. Arrival = seconds since the
  earliest row, computed in integer nanoseconds before the one conversion to float.
- ``burstgpt``: BurstGPT (HPMLL/BurstGPT README "Schema"): ``Timestamp`` (seconds from
  0:00:00 on the first day), ``Model`` (``ChatGPT``, ``GPT-4``), ``Request tokens``,
  ``Response tokens``, ``Total tokens``, ``Log Type`` (``Conversation log``, ``API log``).
  Failed requests (``Response tokens`` 0, as in ``BurstGPT_1.csv``) are dropped and
  counted in the workload's source; filters ``model=`` and ``log_type=`` keep one value.
- ``vidur``: Vidur's processed traces (microsoft/vidur ``data/processed_traces/
  splitwise_{conv,code}.csv``): ``arrived_at`` (s), ``num_prefill_tokens``,
  ``num_decode_tokens``.
- ``splitwise``: splitwise-sim traces (Mutinifni/splitwise-sim ``generate_trace.py``,
  ``traces/test_trace.csv``): ``arrival_timestamp`` (s), ``prompt_size``, ``token_size``;
  its other columns (request_id, request_type, application_id, batch_size) are ignored.
- ``lengths``: length-only CSVs (Vidur's and Sarathi-Serve's ``*_stats_llama2_tokenizer*.csv``):
  ``num_prefill_tokens``, ``num_decode_tokens`` and no arrival times; read only when the
  caller re-times the requests (every arrival 0 s until then).

Arrivals in seconds are kept as written (the workload sorts them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from scenarios.traces.timestamps import NS_PER_S


@dataclass(frozen=True, slots=True)
class CsvFormat:
    """One column-mapped CSV format. ``clock``: "timestamp" (Azure wall-clock times),
    "seconds" (kept as written) or "none" (lengths only)."""

    name: str
    arrival: str | None
    prompt: str
    output: str
    clock: str
    #: Requests with output 0 are failures, dropped and counted (BurstGPT).
    drop_failed: bool = False
    #: filter key -> the column it matches, exactly (after stripping spaces).
    filters: tuple[tuple[str, str], ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns a file of this format must have."""
        names = (self.arrival, self.prompt, self.output, *(c for _, c in self.filters))
        return tuple(c for c in names if c is not None)

    @property
    def required(self) -> tuple[str, ...]:
        """The columns that identify the format (filters' columns are optional to detect)."""
        return tuple(c for c in (self.arrival, self.prompt, self.output) if c is not None)


CSV_FORMATS: dict[str, CsvFormat] = {f.name: f for f in (
    CsvFormat("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", "timestamp"),
    CsvFormat("burstgpt", "Timestamp", "Request tokens", "Response tokens", "seconds",
              drop_failed=True, filters=(("model", "Model"), ("log_type", "Log Type"))),
    CsvFormat("vidur", "arrived_at", "num_prefill_tokens", "num_decode_tokens", "seconds"),
    CsvFormat("splitwise", "arrival_timestamp", "prompt_size", "token_size", "seconds"),
    CsvFormat("lengths", None, "num_prefill_tokens", "num_decode_tokens", "none"),
)}


def parse_filters(fmt: str, spec: str) -> dict[str, str]:
    """Column -> value of a ``--trace-format`` filter list ``key=value,key=value`` for
    format ``fmt``. Raises ValueError naming the key that format does not take."""
    known = dict(CSV_FORMATS[fmt].filters) if fmt in CSV_FORMATS else {}
    if not spec.strip():
        return {}
    if not known:
        raise ValueError(f"trace_format {fmt} takes no filters; got {spec!r}")
    chosen: dict[str, str] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in known or not value.strip():
            raise ValueError(f"trace_format {fmt}: filter {item.strip()!r} is not "
                             f"{' or '.join(f'{k}=VALUE' for k in known)}")
        chosen[known[key]] = value.strip()
    return chosen


@dataclass(slots=True)
class Columns:
    """What a reader parsed: ``clock`` (int64 ns for "timestamp" formats, float64 s
    otherwise), the two token columns, each kept row's data-row index (0 = the first row
    after the header), and how many rows the failure rule and the filters dropped."""

    clock: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    row: np.ndarray
    failed: int = 0
    filtered: int = 0

    def arrival_s(self) -> np.ndarray:
        """Arrival times (s): timestamps as seconds since the earliest, exactly in integer
        nanoseconds first; seconds as written."""
        if self.clock.dtype == np.int64:
            if not len(self.clock):
                return np.zeros(0)
            return (self.clock - self.clock.min()).astype(np.float64) / NS_PER_S
        return self.clock.astype(np.float64)

    def contiguous(self) -> bool:
        """Whether the kept rows are the data rows 0, 1, ... with none dropped (their
        request ids are then the workload's default ones)."""
        return bool(len(self.row) == 0 or (self.row[0] == 0 and self.row[-1] == len(self.row) - 1))

    @classmethod
    def joined(cls, parts: list[Columns]) -> Columns:
        """The parts in order, one after the other."""
        arrays = {f.name: np.concatenate([getattr(p, f.name) for p in parts])
                  for f in dataclasses.fields(cls) if f.name not in ("failed", "filtered")}
        return cls(**arrays, failed=sum(p.failed for p in parts),
                   filtered=sum(p.filtered for p in parts))


class Progress:
    """Whether the kept rows read so far already hold the cut (the first ``num_requests``;
    the arrivals within ``window_s`` of the first, and one past it), so that reading can
    stop. Only while every row read is in time order: a file that goes back in time is
    read whole and sorted. A file in order up to the cut and out of order after it is
    cut as though it were in order (the traces servesim reads are sorted by time)."""

    def __init__(self, clock: str, num_requests: int | None, window_s: float | None) -> None:
        self._ns = clock == "timestamp"
        self._num_requests = num_requests
        self._window_s = window_s
        self._count = 0
        self._first: float | int | None = None
        self._last: float | int | None = None
        self._ordered = num_requests is not None or window_s is not None

    def add(self, clock: np.ndarray) -> bool:
        """Count the kept rows' ``clock`` values (in file order); True once the cut is met."""
        if not self._ordered or not len(clock):
            return False
        if (self._last is not None and clock[0] < self._last) or np.any(np.diff(clock) < 0):
            self._ordered = False
            return False
        if self._first is None:
            self._first = clock[0].item()
        self._last = clock[-1].item()
        self._count += len(clock)
        if self._num_requests is not None and self._count >= self._num_requests:
            return True
        if self._window_s is None:
            return False
        assert self._first is not None and self._last is not None
        if self._ns:  # the arrival Columns.arrival_s gives, the first at 0.0
            return float(self._last - self._first) / NS_PER_S >= self._window_s
        return float(self._last) >= float(self._first) + self._window_s
