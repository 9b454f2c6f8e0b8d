"""The fast reader of the column-mapped CSV formats: pandas' C parser, in chunks.

Owns the bulk read. pandas (a servesim dependency) parses the columns in C, so a
2-million-row Azure 2024 file reads in seconds within a few hundred MB, where a row-by-row
Python read took 31 s and 1.6 GB (benchmarks/trace_read_speed.py has the figures). It
returns None for anything it does not plainly take (a bad value, a missing column, a row
of the wrong length), and the row-by-row reader (rows.py) then names the line and the
field at fault: errors keep their line numbers, at the cost of a second read. A whole
file's columns are kept on disk (column_cache.py) for the next process that reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from scenarios.traces import column_cache
from scenarios.traces.formats import Columns, CsvFormat, Progress
from scenarios.traces.timestamps import bulk_ns

if TYPE_CHECKING:
    import pandas as pd

#: Rows per chunk: small enough that a cut met early stops soon and the text of one
#: chunk is all that is held at once, large enough that pandas' per-chunk cost is noise.
CHUNK_ROWS = 1 << 17


def _chunk_columns(chunk: pd.DataFrame, spec: CsvFormat, filters: dict[str, str]
                   ) -> Columns | None:
    """One chunk's kept rows, or None when a value is not plainly valid."""
    prompt = chunk[spec.prompt].to_numpy(dtype=np.int64)
    output = chunk[spec.output].to_numpy(dtype=np.int64)
    if len(prompt) and (prompt.min() < 1 or output.min() < (0 if spec.drop_failed else 1)):
        return None
    if spec.clock == "timestamp":
        assert spec.arrival is not None
        clock = bulk_ns(chunk[spec.arrival])
        if clock is None:
            return None
    elif spec.clock == "seconds":
        clock = chunk[spec.arrival].to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(clock) & (clock >= 0)):
            return None
    else:
        clock = np.zeros(len(chunk))
    keep = np.ones(len(chunk), dtype=bool)
    for column, value in filters.items():
        keep &= (chunk[column].str.strip() == value).to_numpy(dtype=bool)
    filtered = int(len(keep) - keep.sum())
    failed = 0
    if spec.drop_failed:
        ok = output > 0
        failed = int((keep & ~ok).sum())
        keep &= ok
    row = chunk.index.to_numpy(dtype=np.int64)
    return Columns(clock[keep], prompt[keep], output[keep], row[keep], failed, filtered)


def read(path: Path, spec: CsvFormat, filters: dict[str, str],
         num_requests: int | None = None, window_s: float | None = None) -> Columns | None:
    """The file's kept rows (all of them, or as far as the cut when the rows read are in
    time order: see formats.Progress), or None when pandas does not take the file. A whole
    read (no cut) goes through the disk cache of parsed columns (column_cache.py)."""
    if num_requests is not None or window_s is not None:
        return _parse(path, spec, filters, num_requests, window_s)
    key = column_cache.file_key(path, spec, filters)
    cols = column_cache.load(key)
    if cols is None:
        cols = _parse(path, spec, filters, None, None)
        # Kept only when the file is still the one the key was made of.
        if cols is not None and key == column_cache.file_key(path, spec, filters):
            column_cache.store(key, cols)
    return cols


def _parse(path: Path, spec: CsvFormat, filters: dict[str, str],
           num_requests: int | None, window_s: float | None) -> Columns | None:
    """read's rows, parsed by pandas."""
    import pandas as pd  # only here: `servesim --help` does not load it

    seconds = spec.arrival if spec.clock == "seconds" else None
    text = [c for c in (spec.arrival, *filters) if c is not None and c != seconds]
    dtypes: dict[str, object] = {c: str for c in text}
    dtypes.update({spec.prompt: np.int64, spec.output: np.int64})
    if seconds is not None:
        dtypes[seconds] = np.float64
    usecols = list(dtypes)
    progress = Progress(spec.clock, num_requests, window_s)
    parts: list[Columns] = []
    try:
        with pd.read_csv(path, usecols=usecols, dtype=dtypes,
                         encoding="utf-8-sig", skipinitialspace=True, keep_default_na=False,
                         engine="c", chunksize=CHUNK_ROWS) as reader:
            for chunk in reader:
                part = _chunk_columns(chunk, spec, filters)
                if part is None:
                    return None
                parts.append(part)
                if progress.add(part.clock):
                    break
    except (ValueError, OverflowError, TypeError, KeyError):
        return None
    return Columns.joined(parts) if parts else None
