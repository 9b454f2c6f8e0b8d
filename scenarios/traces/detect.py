"""Which trace format a file is, told from its first line, and said in words when unknown.

Owns detection. A JSON first line is one of the JSON formats (``json_format``, the
hook to scenarios/json_traces.py, which owns that family); a CSV
header is matched by its column names against each CSV format's required columns, in the
order of ``_CSV_ORDER``. An unknown header is refused naming the columns seen and, when
one format's columns are partly there, the ones it lacks. The JSON readers and servesim's
reader are imported when a file is tried against them, so an Azure CSV loads neither.
"""

from __future__ import annotations

from pathlib import Path

from scenarios.traces.files import first_line, header, read_lines
from scenarios.traces.formats import CSV_FORMATS

#: CSV formats in the order their columns (_required) are tried, the most specific first:
#: Vidur's ``arrived_at`` file is a length-only file plus an arrival column.
_CSV_ORDER = ("azure", "servesim", "burstgpt", "vidur", "splitwise", "lengths")


def _required(name: str) -> tuple[str, ...]:
    """The columns that identify CSV format ``name``: servesim.py's own, else formats.py's."""
    if name == "servesim":
        from scenarios.traces import servesim

        return servesim.REQUIRED
    return CSV_FORMATS[name].required


def json_format(path: Path, lines: list[str]) -> str:
    """The JSON format of a file whose first line opens a JSON value (scenarios/
    json_traces.py tells them apart and names what it saw)."""
    from scenarios import json_traces

    fmt = json_traces.detect_json(path, lines)
    assert fmt is not None, "called for a first line that opens a JSON value"
    return fmt


def csv_format(path: Path, line: str) -> str:
    """The CSV format whose columns the header ``line`` holds. Raises ValueError naming
    the columns seen (and what the nearest format lacks) when none matches."""
    seen = header(line)
    columns = set(seen)
    for name in _CSV_ORDER:
        if columns.issuperset(_required(name)):
            return name
    order = [(name, _required(name)) for name in _CSV_ORDER]
    known = "; ".join(f"{name} ({', '.join(required)})" for name, required in order)
    near = max(order, key=lambda item: len(columns.intersection(item[1])))
    hint = ""
    if columns.intersection(near[1]):
        lacking = ", ".join(c for c in near[1] if c not in columns)
        hint = f"; it looks like {near[0]} but lacks {lacking}"
    shown = ", ".join(seen[:8]) + (", ..." if len(seen) > 8 else "")
    raise ValueError(f"{path.name}: unknown trace format: line 1 has columns {shown or 'none'}"
                     f"{hint}. Known CSV formats: {known}; or Mooncake JSONL, a vllm bench "
                     "serve result")


def detect_format(path: Path, lines: list[str] | None = None) -> str:
    """The trace format of ``path`` (one of ``TRACE_FORMATS``), from its first line.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the first line matches no known format (the message names what it saw).
    """
    line = lines[0] if lines is not None else first_line(path)
    if line.lstrip().startswith(("{", "[")):
        return json_format(path, read_lines(path) if lines is None else lines)
    return csv_format(path, line)
