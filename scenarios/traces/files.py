"""Reading a trace file's text: the checks every reader shares, and one-line field errors.

Owns how a file is opened (missing, a directory, not a regular file, empty, not UTF-8:
each one line naming the file, and the line for bad bytes), its lines streamed with their
numbers (line 1 is the header), and the parsers of one field that name the line and the
field at fault ("trace.csv line 7: ContextTokens 'abc' is not an integer").
"""

from __future__ import annotations

import codecs
import csv
import math
from collections.abc import Iterator
from pathlib import Path

#: The largest integer a trace field may hold: the workload's columns are int64.
INT_MAX = 2**63 - 1
_NOT_UTF8 = "not UTF-8 text (byte 0x{:02x}); a trace is a UTF-8 CSV or JSON Lines file"


def check_file(path: Path) -> None:
    """Raise FileNotFoundError (with the path) when ``path`` does not exist; ValueError
    when it is a directory or not a regular file (a device, a pipe)."""
    if not path.exists():
        raise FileNotFoundError(f"trace file not found: {path}")
    if path.is_dir():
        raise ValueError(f"trace {path} is a directory; give a trace file")
    if not path.is_file():
        raise ValueError(f"trace {path} is not a regular file")


def _decode(path: Path, raw: bytes, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path.name} line {line}: {_NOT_UTF8.format(raw[e.start])}") from None


def read_lines(path: Path) -> list[str]:
    """The whole file's lines, trailing blank lines dropped. Errors as ``check_file``, and
    ValueError when it is empty or not UTF-8 text (naming the line)."""
    check_file(path)
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path.name} line {line}: {_NOT_UTF8.format(data[e.start])}") from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError(f"{path.name}: file is empty")
    return lines


def first_line(path: Path) -> str:
    """The file's first line (BOM and line end stripped), read without the rest. Errors
    as ``read_lines``."""
    check_file(path)
    with path.open("rb") as f:
        raw = f.readline().removeprefix(codecs.BOM_UTF8)
        if not raw.strip() and not f.read(1 << 16).strip():
            raise ValueError(f"{path.name}: file is empty")
    return _decode(path, raw, 1).rstrip("\r\n")


def numbered_lines(path: Path) -> Iterator[str]:
    """The file's lines as text (line ends kept), decoded one by one so that bad bytes
    are reported on their own line. Errors as ``read_lines``."""
    check_file(path)
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            yield _decode(path, raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw,
                          number)


def header(line: str) -> list[str]:
    """A CSV header line's column names, stripped."""
    return [c.strip() for c in next(csv.reader([line]), [])]


def csv_rows(path: Path, required: tuple[str, ...]
             ) -> tuple[dict[str, int], Iterator[tuple[int, list[str]]]]:
    """Column index by name, and (line number, fields) for every non-blank data row,
    streamed. Raises ValueError naming line 1 when a ``required`` column is missing, the
    line of a row with the wrong number of fields, or "no requests" for a header alone."""
    reader = csv.reader(numbered_lines(path))
    names = [c.strip() for c in next(reader, [])]
    missing = [c for c in required if c not in names]
    if missing:
        raise ValueError(f"{path.name} line 1: missing column(s) {', '.join(missing)}")

    def rows() -> Iterator[tuple[int, list[str]]]:
        seen = False
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(names):
                raise ValueError(f"{path.name} line {reader.line_num}: expected {len(names)} "
                                 f"fields ({','.join(names)}), got {len(row)}")
            seen = True
            yield reader.line_num, row
        if not seen:
            raise ValueError(f"{path.name}: no requests after the header")

    return {name: i for i, name in enumerate(names)}, rows()


def parse_int(text: str, field: str, where: str, minimum: int | None = 1,
              bounded: bool = True) -> int:
    """``text`` as an integer; ValueError naming ``where`` and ``field`` otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{where}: {field} {text!r} is not an integer") from None
    check_range(value, field, where, minimum, bounded)
    return value


def check_range(value: int, field: str, where: str, minimum: int | None,
                bounded: bool = True) -> None:
    """ValueError naming ``where`` and ``field`` when ``value`` is below ``minimum`` or
    (``bounded``: a count or a priority, not an identifier) outside int64."""
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: {field} {value} must be >= {minimum}")
    if bounded and abs(value) > INT_MAX:
        raise ValueError(f"{where}: {field} {value} is out of range (at most 2**63 - 1 "
                         "in magnitude)")


def parse_seconds(text: str, field: str, where: str) -> float:
    """``text`` as a finite time >= 0 (s); ValueError naming ``where`` and ``field``."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {field} {text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{where}: {field} {value} must be finite and >= 0")
    return value
