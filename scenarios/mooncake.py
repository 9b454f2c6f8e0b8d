"""Mooncake traces (FAST'25): JSON Lines of ``timestamp`` (ms), ``input_length``,
``output_length`` and optional ``hash_ids`` (512-token prefix blocks), read as a Workload.

Owns the format's reader. Arrival = timestamp / 1000 s; token counts >= 1; timestamps
>= 0; every count within int64; hash_ids a list of integers. Where msgspec is installed (the
optional extra ``fast``), a valid file is decoded in one typed pass (the rows 2-3x
faster than the standard library's json, the same values); without it, or for any file
that pass rejects, the standard library reads the file line by line, and its checks
name the line and the field ("trace.jsonl line 7: input_length 'abc' is not an
integer"), so an error reads the same either way.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from scenarios.workload import Workload

_INT_MAX = 2**63 - 1
_FIELDS = (("timestamp", 0), ("input_length", 1), ("output_length", 1))

#: Lines between two looks at whether a cut is met (``load_workload``'s ``stop``).
BATCH_LINES = 1 << 14

#: Told each batch's arrival times (s, in file order); True once the cut is met.
StopFn = Callable[[np.ndarray], bool]


@functools.cache
def _fast_decoder() -> tuple[Any, Any] | None:
    """(msgspec's typed decoder of a list of rows, its UNSET marker); None without
    msgspec. Imported on first use: ``servesim --help`` does not load it."""
    try:
        import msgspec
    except ImportError:
        return None

    # One line as the fast pass types it: unknown keys ignored (as the checked pass
    # ignores them), hash_ids UNSET when the line has none.
    row: Any = msgspec.defstruct("Row", [
        ("timestamp", int), ("input_length", int), ("output_length", int),
        ("hash_ids", list[int] | msgspec.UnsetType, msgspec.UNSET)])
    return msgspec.json.Decoder(list[row]), msgspec.UNSET


def load_workload(path: Path, lines: list[str], stop: StopFn | None = None) -> Workload:
    """The ``mooncake`` trace loader: ``lines`` (the file's, blank ones skipped) as a
    Workload; with ``stop``, read in batches of BATCH_LINES until ``stop`` says the rows
    read hold the cut (lines after it are not parsed). Raises ValueError naming the file,
    the line and the field of the first bad row read, or the file for a bad workload
    (Workload.from_arrays)."""
    step = len(lines) if stop is None else BATCH_LINES
    parts: list[_Columns] = []
    for start in range(0, len(lines), max(step, 1)):
        batch = lines[start:start + step]
        rows = _fast_rows(batch)
        parts.append(_checked_columns(path, batch, start + 1) if rows is None else rows)
        if stop is not None and stop(np.asarray(parts[-1][0], dtype=np.float64) / 1000.0):
            break
    ms, prompt, out, hashes = parts[0] if len(parts) == 1 else _joined(parts)
    arrival = np.asarray(ms, dtype=np.float64) / 1000.0
    try:
        return Workload.from_arrays(arrival, prompt, out, hash_ids=hashes,
                                    source=f"mooncake trace {path.name}")
    except ValueError as e:
        raise ValueError(f"{path.name}: {e}") from None


_Columns = tuple[np.ndarray | list[int], np.ndarray | list[int], np.ndarray | list[int],
                 list[tuple[int, ...]] | None]


def _joined(parts: list[_Columns]) -> _Columns:
    """Batches' columns one after the other; rows without hash_ids get () when any has."""
    ms, prompt, out = (np.concatenate([np.asarray(p[k], dtype=np.int64) for p in parts])
                       for k in range(3))
    if all(p[3] is None for p in parts):
        return ms, prompt, out, None
    hashes = [h for p in parts for h in (p[3] if p[3] is not None else [()] * len(p[0]))]
    return ms, prompt, out, hashes


def _fast_rows(lines: list[str]) -> _Columns | None:
    """The columns by the typed pass; None when it rejects anything (the checked pass
    then finds and names the fault)."""
    fast = _fast_decoder()
    if fast is None:
        return None
    decoder, unset = fast
    body = [line for line in lines if line.strip()]
    try:
        rows = decoder.decode(("[" + ",".join(body) + "]").encode())
    except ValueError:  # msgspec.DecodeError is a ValueError
        return None
    if len(rows) != len(body):  # two objects on one line: the checked pass names it
        return None
    n = len(rows)
    try:
        ms = np.fromiter((r.timestamp for r in rows), dtype=np.int64, count=n)
        prompt = np.fromiter((r.input_length for r in rows), dtype=np.int64, count=n)
        out = np.fromiter((r.output_length for r in rows), dtype=np.int64, count=n)
    except OverflowError:  # a count beyond int64
        return None
    if n == 0 or ms.min() < 0 or prompt.min() < 1 or out.min() < 1:
        return None
    given = [r.hash_ids for r in rows]
    any_hashes = any(h is not unset for h in given)
    hashes = ([() if h is unset else tuple(h) for h in given]
              if any_hashes else None)
    return ms, prompt, out, hashes


def _int_field(obj: dict[str, object], field: str, where: str, minimum: int) -> int:
    value = obj.get(field)
    if value is None:
        raise ValueError(f"{where}: missing field {field}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {field} {value!r} is not an integer")
    if value < minimum:
        raise ValueError(f"{where}: {field} {value} must be >= {minimum}")
    if abs(value) > _INT_MAX:
        raise ValueError(f"{where}: {field} {value} is out of range (at most 2**63 - 1 "
                         "in magnitude)")
    return value


def _checked_columns(path: Path, lines: list[str], first_line: int = 1) -> _Columns:
    """The columns, each line parsed and checked by the standard library; ValueError
    naming the line (``lines[0]`` is the file's line ``first_line``) and the field at
    the first fault."""
    ms: list[int] = []
    prompt: list[int] = []
    out: list[int] = []
    hashes: list[tuple[int, ...]] = []
    any_hashes = False
    for n, line in enumerate(lines, start=first_line):
        if not line.strip():
            continue
        where = f"{path.name} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: invalid JSON ({err.msg})") from None
        except RecursionError:
            raise ValueError(f"{where}: JSON nested too deeply to read (a Mooncake line "
                             "is one flat object)") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        for column, (field, minimum) in zip((ms, prompt, out), _FIELDS, strict=True):
            column.append(_int_field(obj, field, where, minimum))
        row_hashes = obj.get("hash_ids", [])
        any_hashes = any_hashes or "hash_ids" in obj
        if not isinstance(row_hashes, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in row_hashes
        ):
            raise ValueError(f"{where}: hash_ids must be a list of integers")
        hashes.append(tuple(row_hashes))
    return ms, prompt, out, hashes if any_hashes else None
