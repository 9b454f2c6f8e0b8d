"""Trace files: reading real request traces into a Workload, and writing servesim's own CSV.

Owns the choice of reader. The formats (``TRACE_FORMATS``; see ``../shared/traces/README.md``
for the shared copies), each read by its module:

- ``servesim`` (servesim.py): servesim's CSV, arrival_time in s; written by ``save_trace``.
- ``azure``, ``burstgpt``, ``vidur``, ``splitwise``, ``lengths`` (formats.py, the column
  each reads and its source): CSVs read by column name, in bulk by pandas (bulk.py) and,
  where pandas does not take a value, row by row to name the line at fault (rows.py).
- ``mooncake``, ``vllm-bench``, ``sharegpt``: the JSON family, read by
  scenarios/json_traces.py (Mooncake FAST'25 JSON Lines, timestamp in ms; the JSON of
  ``vllm bench serve --save-result --save-detailed``; ShareGPT with a tokenizer).

The format is detected from the first line (detect.py) or forced; ``burstgpt`` takes
filters: ``burstgpt:model=ChatGPT,log_type=Conversation log``. Every error is one line:
missing file (FileNotFoundError with the path), unknown format (naming the columns seen),
or a bad row ("trace.csv line 7: ContextTokens 'abc' is not an integer"; line 1 is the
header). A reader's module is imported when a file needs it (``save_trace`` too, when
first read), so a CSV that pandas parses loads neither the JSON readers nor rows.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scenarios.request_ids import RequestIds
from scenarios.traces import bulk
from scenarios.traces.detect import detect_format
from scenarios.traces.files import check_file, read_lines
from scenarios.traces.formats import CSV_FORMATS, Columns, CsvFormat, Progress, parse_filters
from scenarios.workload import Workload

if TYPE_CHECKING:
    from scenarios.traces.servesim import save_trace

__all__ = ["TRACE_FORMATS", "detect_format", "load_lengths", "load_trace", "save_trace"]

TRACE_FORMATS = ("servesim", "azure", "mooncake", "vllm-bench", "sharegpt", "burstgpt",
                 "vidur", "splitwise", "lengths")


def _csv_source(path: Path, spec: CsvFormat, filters: dict[str, str], cols: Columns) -> str:
    """The workload's source: the format, the file, and what was dropped and why."""
    parts = [f"{spec.name} trace {path.name}"]
    if filters:
        parts.append(", ".join(f"{c} = {v}" for c, v in filters.items())
                     + f" ({cols.filtered} other requests left out)")
    if spec.drop_failed:
        parts.append(f"{cols.failed} failed requests ({spec.output} 0) dropped")
    return ", ".join(parts)


def _load_csv(path: Path, spec: CsvFormat, filters: dict[str, str],
              num_requests: int | None, window_s: float | None) -> Workload:
    cols = bulk.read(path, spec, filters, num_requests, window_s)
    if cols is None:
        from scenarios.traces import rows

        cols = rows.read(path, spec, filters, num_requests, window_s)
    if not len(cols.row):
        matching = ", ".join(f"{c} = {v}" for c, v in filters.items()) or "no filter"
        raise ValueError(f"{path.name}: no requests left ({cols.failed} failed, "
                         f"{cols.filtered} not matching {matching})")
    try:
        return Workload.from_arrays(
            cols.arrival_s(), cols.prompt, cols.output,
            request_id=None if cols.contiguous() else RequestIds.from_rows(cols.row),
            source=_csv_source(path, spec, filters, cols))
    except ValueError as e:
        raise ValueError(f"{path.name}: {e}") from None


def _no_arrivals(path: Path, spec: CsvFormat) -> ValueError:
    return ValueError(
        f"{path.name} holds lengths only ({spec.prompt}, {spec.output}), no arrival times: "
        "give --rate (requests/s) to time its requests (--arrival picks the process, "
        "default poisson)")


def _check_tokenizer(path: Path, name: str) -> None:
    """ValueError for a tokenizer given with a file of format ``name`` that has token
    counts of its own (any outside the JSON family's, scenarios/json_traces.py)."""
    from scenarios.json_traces import JSON_FORMATS

    if name not in JSON_FORMATS:
        raise ValueError(f"--tokenizer applies to ShareGPT JSON only; {path.name} is {name}, "
                         "with token counts of its own")


def _split_format(fmt: str) -> tuple[str, str]:
    name, _, spec = fmt.partition(":")
    name = name.strip()
    if name not in TRACE_FORMATS:
        raise ValueError(f"trace_format must be one of {', '.join(TRACE_FORMATS)}; got {fmt!r}")
    return name, spec


def load_trace(path: Path | str, fmt: str | None = None, *, num_requests: int | None = None,
               window_s: float | None = None, retimed: bool = False,
               tokenizer: Path | str | None = None) -> Workload:
    """Load a trace file as a Workload sorted by arrival_time, cut as ``Workload.cut``.

    Args:
        path: the trace file.
        fmt: one of ``TRACE_FORMATS`` to force a format, ``burstgpt`` with filters after a
            colon (``burstgpt:model=GPT-4,log_type=API log``); None detects it.
        num_requests, window_s: the cut (``Workload.cut``'s): a CSV or a Mooncake file
            stops being read once the rows read hold it, when they are in time order
            (formats.Progress).
        retimed: the caller gives the requests new arrival times (a rate is set), so a
            length-only file is read (every arrival 0 s) instead of refused.
        tokenizer: a tokenizer.json to count a ShareGPT file's tokens (JSON formats:
            scenarios/json_traces.py).

    Raises:
        FileNotFoundError: no such file (the message holds the path).
        ValueError: unknown ``fmt``, filter or format; a length-only file without
            ``retimed`` (saying to give --rate); a malformed row (the message names the
            file, the line number and the field), or a token count < 1.
    """
    path = Path(path)
    name, filter_spec = _split_format(fmt) if fmt is not None else (None, "")
    check_file(path)
    name = detect_format(path) if name is None else name
    filters = parse_filters(name, filter_spec)
    if tokenizer is not None:
        _check_tokenizer(path, name)
    if name in CSV_FORMATS:
        spec = CSV_FORMATS[name]
        if spec.clock == "none" and not retimed:
            raise _no_arrivals(path, spec)
        workload = _load_csv(path, spec, filters, num_requests, window_s)
        if spec.clock == "none":
            workload = dataclasses.replace(workload, source=f"{workload.source} (lengths only)")
    elif name == "servesim":
        from scenarios.traces import servesim

        workload = servesim.load(path, num_requests, window_s)
    else:
        from scenarios import json_traces

        cut = num_requests is not None or window_s is not None
        stop = Progress("seconds", num_requests, window_s).add if cut else None
        workload = json_traces.load_json(path, read_lines(path), name, tokenizer, stop)
    return workload.cut(num_requests, window_s)


def load_lengths(path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """(num_prompt_tokens, output_len) int64 pairs from any length source: a length-only
    CSV (in file order) or any trace ``load_trace`` reads (in arrival order). Errors as
    ``load_trace``."""
    workload = load_trace(path, retimed=True)
    return workload.num_prompt_tokens.copy(), workload.output_len.copy()


def __getattr__(name: str) -> object:
    """``save_trace`` (servesim.py), imported when first read."""
    if name == "save_trace":
        from scenarios.traces.servesim import save_trace

        return save_trace
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
