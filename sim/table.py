"""Column tables: a run's rows as ``dict[str, np.ndarray]``, one array per column, all the
same length, in column order.

The run path (simulate -> summarize -> write_run) works on these, so ``servesim run``
never imports pandas (about 0.2 s of start-up). Owns the column accessor, the CSV
writer (byte for byte what ``DataFrame.to_csv(index=False)`` writes), the growing column
a Recorder fills (ColumnBuffer) and the conversion to a DataFrame for the callers that
want one.
"""

from __future__ import annotations

import csv
import io
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
import orjson

if TYPE_CHECKING:
    import pandas as pd

#: A column table: column name -> one numpy array per column, all of one length.
Table = Mapping[str, np.ndarray]


def column(table: Table, name: str) -> np.ndarray:
    """Column ``name`` of a column table as a numpy array (no copy where none is
    needed). Raises KeyError for a missing column."""
    return np.asarray(table[name])


#: Rows formatted at a time: bounds the strings held at once (a 1M-request run).
CHUNK_ROWS = 1 << 15

#: Characters that make the csv module quote a field (QUOTE_MINIMAL, ',' and '"', line
#: end '\n'; '\r' is quoted by newer Pythons).
_SPECIAL = (",", '"', "\n", "\r")


def concat_tables(tables: list[dict[str, np.ndarray]],
                  order: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Column tables with the same columns (at least one table), rows one after another;
    then, given ``order`` (int64 row numbers of that concatenation), those rows in that
    order."""
    if order is None:
        return {c: np.concatenate([t[c] for t in tables]) for c in tables[0]}
    return {c: np.concatenate([t[c] for t in tables]).take(order) for c in tables[0]}


def csv_fields(values: np.ndarray) -> list[str]:
    """One column as CSV fields, exactly as ``DataFrame.to_csv`` writes each value:
    float64 as ``repr`` (numpy's ``str``, which pandas writes, is the same shortest
    round-trip text), ints as ``str``, strings quoted where the csv module would,
    NaN and None as empty fields."""
    kind = values.dtype.kind
    if kind == "f":
        out = (float64_texts(values) if values.dtype == np.float64
               else values.astype(str).tolist())
        for i in np.flatnonzero(np.isnan(values)).tolist():
            out[i] = ""
        return out
    if kind in "iu":
        if len(values) and values.min() >= 0 and values.max() < max(len(values), 1024):
            # counts: the strings of 0..max looked up by numpy, several times faster
            # than str() of each
            text = np.array(list(map(str, range(int(values.max()) + 1))), dtype=object)
            return text[values].tolist()
        return _json_numbers(values)  # an integer's JSON text is its str()
    out = ["" if x is None or x != x else x if isinstance(x, str) else str(x)
           for x in values.tolist()]  # x != x: NaN
    joined = "\0".join(out)
    if any(c in joined for c in _SPECIAL):  # one scan of the column, then cell by cell
        out = [_quoted(x) for x in out]
    return out


#: The magnitudes orjson and ``repr`` both write positionally, with the same digits:
#: [1e-4, 1e16). Outside it, orjson's exponent notation differs from repr's ("2.5e-7"
#: against "2.5e-07"; "1e16" in orjson < 3.11 against "1e+16").
_POSITIONAL = (1e-4, 1e16)


def float64_texts(values: np.ndarray) -> list[str]:
    """A float64 array's values as ``repr`` writes them: the shortest text that reads back
    as the same float64 (Steele & White / Gay; orjson's Ryu-family formatter finds the
    same digits about ten times faster than CPython's ``float.__repr__``, which was a
    fifth of a 10,000-request run's instructions). orjson writes every finite value in
    [1e-4, 1e16) in magnitude, and zeros; the rest (NaN, infinities, exponent notation)
    are ``repr``'s own. Shape (n,) in, n strings out; NaN as "nan"."""
    flat = np.ascontiguousarray(values, dtype=np.float64)
    out = _json_numbers(flat)
    inside = _positional(flat)
    if not inside.all():
        for i in np.flatnonzero(~inside).tolist():
            out[i] = repr(float(flat[i]))
    return out


def _positional(values: np.ndarray) -> np.ndarray:
    """Which of a float64 array's values orjson writes as ``repr`` does (bool, same
    shape): finite magnitudes in [1e-4, 1e16), and zeros."""
    size = np.abs(values)
    return (size >= _POSITIONAL[0]) & (size < _POSITIONAL[1]) | (values == 0)


def _json_numbers(values: np.ndarray) -> list[str]:
    """orjson's text of each number of a 1-D numeric array (shape (n,) in, n strings out):
    an integer's is its ``str``; a float's, see float64_texts."""
    if values.size == 0:
        return []
    text = orjson.dumps(np.ascontiguousarray(values), option=orjson.OPT_SERIALIZE_NUMPY)
    return text[1:-1].decode().split(",")


def _quoted(text: str) -> str:
    """``text`` as the csv module writes it as one field of a longer row: unchanged
    unless it holds a special character, then quoted by the csv module itself (its
    rules, whatever the Python version)."""
    if not any(c in text for c in _SPECIAL):
        return text
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([text])
    return buf.getvalue()[:-1]


def write_csv(path: Path | str, table: Table) -> None:
    """Write ``table`` as CSV: a header row, then one row per index; ',' separated,
    minimal quoting ('"' doubled inside), LF line ends, NaN and None as empty fields.
    The bytes equal ``pd.DataFrame(table).to_csv(path, index=False)``. Raises ValueError
    when the columns differ in length."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        write_csv_header(f, list(table))
        write_csv_rows(f, table)


def write_csv_header(f: TextIO, names: list[str]) -> None:
    """write_csv's header row, to an open text file (newline="")."""
    f.write(",".join(_quoted(str(c)) for c in names) + "\n")


def write_csv_rows(f: TextIO, table: Table) -> None:
    """write_csv's rows of ``table``, to an open text file (newline=""): rows written in
    several calls read the same as one table written whole. Raises ValueError when the
    columns differ in length."""
    cols = [np.asarray(table[c]) for c in table]
    n = len(cols[0]) if cols else 0
    if any(len(c) != n for c in cols):
        raise ValueError(f"columns differ in length: {[len(c) for c in cols]}")
    for lo in range(0, n, CHUNK_ROWS):
        part = [c[lo:lo + CHUNK_ROWS] for c in cols]
        if len(part) == 1:  # the csv module writes a row of one empty field as ""
            fields = [['""' if x == "" else x for x in csv_fields(part[0])]]
        else:
            fields = _field_groups(part)
        f.write("\n".join(map(",".join, zip(*fields, strict=True))))
        f.write("\n")


def _field_groups(cols: list[np.ndarray]) -> list[list[str]]:
    """The CSV text of columns of one length, each row's fields comma-joined within
    groups: a run of two or more adjacent integer columns, or of float64 columns whose
    every value orjson writes as ``repr`` does (or NaN), is formatted by one orjson call
    over the 2-D block (one string per row, not per field: the per-field joins were
    half of the writer's time); any other column is one group of csv_fields."""
    kinds = [_block_kind(c) for c in cols]
    groups: list[list[str]] = []
    i = 0
    while i < len(cols):
        j = i + 1
        while j < len(cols) and kinds[i] is not None and kinds[j] == kinds[i]:
            j += 1
        groups.append(_block_rows(cols[i:j]) if j - i > 1 else csv_fields(cols[i]))
        i = j
    return groups


def _block_kind(values: np.ndarray) -> str | None:
    """An integer column's dtype (a block holds one integer dtype: int64 beside uint64
    would stack as float64), "f" for a float64 column orjson writes as csv_fields does
    (NaN aside: orjson's null becomes the empty field), else None."""
    if values.dtype.kind in "iu":
        return values.dtype.str
    if values.dtype == np.float64 and (_positional(values) | np.isnan(values)).all():
        return "f"
    return None


def _block_rows(cols: list[np.ndarray]) -> list[str]:
    """Columns of one _block_kind, as one string per row: the fields comma-joined."""
    text = orjson.dumps(np.column_stack(cols), option=orjson.OPT_SERIALIZE_NUMPY)
    # b"[[a,b],[c,d]]": numbers hold no bracket, and "null" is only NaN's
    return text[2:-2].decode().replace("null", "").split("],[")


class ColumnBuffer:
    """A numeric column that grows as a run records: values are appended to ``pending``
    (a list only stores the reference, where numpy and array.array parse every value
    on the way in) and moved by ``settle`` into numpy chunks of ``dtype`` (float64 or
    int64), one conversion per chunk.

    The conversion is ``struct.pack`` of the whole list in the dtype's native C type
    (numpy's type character names the same C type as struct's): about 80 instructions a
    float and 100 an int, where ``np.fromiter`` takes 200 and ``np.array`` 280 (shape
    discovery), and array.array's constructor 165 (it parses each value). Raises
    struct.error for a value of the wrong kind (an int column given a float)."""

    def __init__(self, dtype: type) -> None:
        self.pending: list[Any] = []
        self._chunks: list[np.ndarray] = []
        self._dtype = np.dtype(dtype)
        self._code = self._dtype.char
        self._num_settled = 0

    def __len__(self) -> int:
        return self._num_settled + len(self.pending)

    def settle(self) -> None:
        """Move the pending values into a chunk."""
        if self.pending:
            n = len(self.pending)
            packed = struct.pack(f"{n}{self._code}", *self.pending)
            self._chunks.append(np.frombuffer(packed, dtype=self._dtype))
            self._num_settled += len(self.pending)
            self.pending.clear()  # the same list: callers hold its bound append

    def values(self) -> np.ndarray:
        """Every value (shape (len,), a new array)."""
        self.settle()
        if len(self._chunks) == 1:
            return self._chunks[0].copy()
        return (np.concatenate(self._chunks) if self._chunks
                else np.zeros(0, dtype=self._dtype))

    def clear(self) -> None:
        """Forget every value."""
        self.pending.clear()
        self._chunks.clear()
        self._num_settled = 0


def to_frame(table: Table) -> pd.DataFrame:
    """The table as a pandas DataFrame (imports pandas; copies the arrays)."""
    import pandas as pd

    return pd.DataFrame({n: np.asarray(v) for n, v in table.items()})
