"""The row-by-row reader of the column-mapped CSV formats: every error names its line.

Owns the reading bulk.py falls back to: each field parsed in Python, so a bad file gives
one line naming the file, the line and the field ("trace.csv line 7: ContextTokens 'abc'
is not an integer"; line 1 is the header). Same values as the bulk reader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scenarios.traces.files import csv_rows, parse_int, parse_seconds
from scenarios.traces.formats import Columns, CsvFormat, Progress
from scenarios.traces.timestamps import row_ns

#: Rows between two looks at whether the cut is met.
_BATCH = 4096


def read(path: Path, spec: CsvFormat, filters: dict[str, str],
         num_requests: int | None = None, window_s: float | None = None) -> Columns:
    """The file's kept rows (as bulk.read). Raises ValueError naming the line and field."""
    index, rows = csv_rows(path, spec.columns)
    dates: dict[str, int] = {}
    progress = Progress(spec.clock, num_requests, window_s)
    clock: list[float] | list[int] = []
    prompt: list[int] = []
    output: list[int] = []
    kept: list[int] = []
    failed = filtered = 0
    for data_row, (line, row) in enumerate(rows):
        where = f"{path.name} line {line}"
        p = parse_int(row[index[spec.prompt]], spec.prompt, where)
        o = parse_int(row[index[spec.output]], spec.output, where,
                      minimum=0 if spec.drop_failed else 1)
        if spec.clock == "timestamp":
            t: float | int = row_ns(row[index[spec.arrival]], where, dates)  # type: ignore[index]
        elif spec.clock == "seconds":
            t = parse_seconds(row[index[spec.arrival]], spec.arrival, where)  # type: ignore[index, arg-type]
        else:
            t = 0.0
        if any(row[index[c]].strip() != v for c, v in filters.items()):
            filtered += 1
            continue
        if o == 0:
            failed += 1
            continue
        clock.append(t)  # type: ignore[arg-type]
        prompt.append(p)
        output.append(o)
        kept.append(data_row)
        if len(kept) % _BATCH == 0 and progress.add(np.asarray(clock[-_BATCH:])):
            break
    dtype = np.int64 if spec.clock == "timestamp" else np.float64
    return Columns(np.asarray(clock, dtype=dtype), np.asarray(prompt, dtype=np.int64),
                   np.asarray(output, dtype=np.int64), np.asarray(kept, dtype=np.int64),
                   failed, filtered)
