"""Trace files: reading real request traces into a Workload, and writing servesim's own CSV.

Owns the file formats (see ``../shared/traces/README.md``), detected from the first line:

- ``servesim``: CSV with ``arrival_time`` (s), ``num_prompt_tokens``, ``output_len`` and
  optional ``max_tokens``, ``priority``, ``request_id``, ``hash_ids`` (space-separated ints),
  ``prompt_segments`` (space-separated ``id:tokens`` pairs; see sim/kv/prefix_content.py).
  Arrival times are kept as written.
- ``azure``: Azure LLM inference trace 2023 (Splitwise), CSV ``TIMESTAMP`` (``YYYY-MM-DD
  HH:MM:SS.fffffff``, wall clock), ``ContextTokens``, ``GeneratedTokens``; CRLF. Arrival =
  seconds since the earliest row (the first row: the files are sorted), computed exactly in
  integer nanoseconds before the one conversion to float.
- ``mooncake``: Mooncake FAST'25 JSON Lines ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids`` (512-token prefix blocks). Arrival = timestamp / 1000.
- ``vllm-bench``: the JSON of ``vllm bench serve --save-result --save-detailed`` (one object
  with vLLM's per-request lists; read by scenarios/vllm_bench.py, which owns the format).
  Told from Mooncake by vLLM's keys. Arrival = start_times minus the earliest.
- length-only CSVs (``num_prefill_tokens``, ``num_decode_tokens``: Vidur, Sarathi-Serve) have
  no arrival times; ``load_lengths`` reads them (and any trace above) for ``lengths.Empirical``.

Every error is one line: missing file (FileNotFoundError with the path), unknown format, or a
bad row ("trace.csv line 7: ContextTokens 'abc' is not an integer"; line 1 is the header).
"""

from __future__ import annotations

import codecs
import csv
import datetime
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from scenarios import vllm_bench
from scenarios.workload import Workload

TRACE_FORMATS = ("servesim", "azure", "mooncake", "vllm-bench")
_SERVESIM_REQUIRED = ("arrival_time", "num_prompt_tokens", "output_len")
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_LENGTH_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")
_NS_PER_S = 1_000_000_000
#: An Azure 2023 TIMESTAMP as the bulk parser takes it (anything else: row by row).
_AZURE_TIMESTAMP = re.compile(r"\s*\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,9})?\s*")


def _read_lines(path: Path) -> list[str]:
    """The file's lines, trailing blank lines dropped. Raises FileNotFoundError when it
    does not exist; ValueError when it is a directory, not a regular file (a device, a
    pipe), empty, or not UTF-8 text (naming the line)."""
    if not path.exists():
        raise FileNotFoundError(f"trace file not found: {path}")
    if path.is_dir():
        raise ValueError(f"trace {path} is a directory; give a trace file")
    if not path.is_file():
        raise ValueError(f"trace {path} is not a regular file")
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path.name} line {line}: not UTF-8 text (byte 0x{data[e.start]:02x}); "
                         "a trace is a UTF-8 CSV or JSON Lines file") from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ValueError(f"{path.name}: file is empty")
    return lines


def _header(lines: list[str]) -> list[str]:
    return [c.strip() for c in next(csv.reader(lines[:1]))]


def detect_format(path: Path, lines: list[str] | None = None) -> str:
    """The trace format of ``path`` (one of ``TRACE_FORMATS``), from its first line (a JSON
    object: a vLLM benchmark result when it has vLLM's keys, else Mooncake JSON Lines).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the first line matches no known format (length-only CSVs included:
            they carry no arrival times).
    """
    lines = _read_lines(path) if lines is None else lines
    first = lines[0].lstrip()
    if first.startswith("{"):
        return "vllm-bench" if vllm_bench.is_result(lines) else "mooncake"
    columns = set(_header(lines))
    if columns.issuperset(_AZURE_COLUMNS):
        return "azure"
    if columns.issuperset(_SERVESIM_REQUIRED):
        return "servesim"
    if columns.issuperset(_LENGTH_COLUMNS):
        raise ValueError(
            f"{path.name} holds lengths only (num_prefill_tokens, num_decode_tokens), no "
            "arrival times: sample it with lengths.Empirical.from_file and an arrival process"
        )
    raise ValueError(
        f"{path.name}: unknown trace format (first line {first[:80]!r}); expected a servesim "
        f"CSV ({', '.join(_SERVESIM_REQUIRED)}), an Azure 2023 CSV "
        f"({', '.join(_AZURE_COLUMNS)}) or Mooncake JSONL"
    )


#: The largest integer a trace field may hold: the workload's columns are int64.
_INT_MAX = 2**63 - 1


def _parse_int(text: str, field: str, where: str, minimum: int | None = 1,
               bounded: bool = True) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{where}: {field} {text!r} is not an integer") from None
    _check_range(value, field, where, minimum, bounded)
    return value


def _check_range(value: int, field: str, where: str, minimum: int | None,
                 bounded: bool = True) -> None:
    """ValueError naming ``where`` and ``field`` when ``value`` is below ``minimum`` or
    (``bounded``: a count or a priority, not an identifier) outside int64."""
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: {field} {value} must be >= {minimum}")
    if bounded and abs(value) > _INT_MAX:
        raise ValueError(f"{where}: {field} {value} is out of range (at most 2**63 - 1 "
                         "in magnitude)")


def _rows(path: Path, lines: list[str], required: tuple[str, ...]
          ) -> tuple[dict[str, int], list[tuple[int, list[str]]]]:
    """Column index by name, and (line number, fields) for every non-blank data row."""
    header = _header(lines)
    missing = [c for c in required if c not in header]
    if missing:
        raise ValueError(f"{path.name} line 1: missing column(s) {', '.join(missing)}")
    index = {name: i for i, name in enumerate(header)}
    rows = [(n, row) for n, row in enumerate(csv.reader(lines[1:]), start=2) if row]
    if not rows:
        raise ValueError(f"{path.name}: no requests after the header")
    for n, row in rows:
        if len(row) != len(header):
            raise ValueError(
                f"{path.name} line {n}: expected {len(header)} fields "
                f"({','.join(header)}), got {len(row)}"
            )
    return index, rows


def _azure_ns(text: str, where: str, dates: dict[str, int]) -> int:
    """Integer nanoseconds of an Azure ``YYYY-MM-DD HH:MM:SS.fffffff`` timestamp."""
    try:
        date_s, time_s = text.strip().split(" ")
        day = dates.get(date_s)
        if day is None:
            day = dates[date_s] = datetime.date.fromisoformat(date_s).toordinal()
        hms, _, frac = time_s.partition(".")
        h, m, s = (int(x) for x in hms.split(":"))
        if not (0 <= h < 24 and 0 <= m < 60 and 0 <= s < 61 and len(frac) <= 9):
            raise ValueError
        frac_ns = int(frac.ljust(9, "0")) if frac else 0
    except ValueError:
        raise ValueError(
            f"{where}: TIMESTAMP {text!r} is not a 'YYYY-MM-DD HH:MM:SS.fffffff' time"
        ) from None
    return ((day * 24 + h) * 60 + m) * 60 * _NS_PER_S + s * _NS_PER_S + frac_ns


def _azure_bulk(rows: list[tuple[int, list[str]]], it: int, ip: int, io: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The TIMESTAMP column as int64 nanoseconds and the two token columns, parsed in
    bulk by numpy; None when any field is not plainly valid (the row-by-row parser then
    names the line at fault). Same values as the row-by-row parser."""
    stamps = [row[it] for _, row in rows]
    if not all(map(_AZURE_TIMESTAMP.fullmatch, stamps)):
        return None
    try:
        ns = np.array([x.strip() for x in stamps], dtype="datetime64[ns]").astype(np.int64)
        prompt = np.array([row[ip] for _, row in rows], dtype=np.int64)
        out = np.array([row[io] for _, row in rows], dtype=np.int64)
    except (ValueError, OverflowError):
        return None
    if prompt.min() < 1 or out.min() < 1:
        return None
    return ns, prompt, out


def _load_azure(path: Path, lines: list[str]) -> Workload:
    index, rows = _rows(path, lines, _AZURE_COLUMNS)
    it, ip, io = (index[c] for c in _AZURE_COLUMNS)
    bulk = _azure_bulk(rows, it, ip, io)
    if bulk is not None:
        ns_col, prompt_col, out_col = bulk
        arrival = (ns_col - ns_col.min()).astype(np.float64) / _NS_PER_S
        return _workload(path, arrival, prompt_col, out_col,
                         source=f"azure trace {path.name}")
    dates: dict[str, int] = {}
    ns, prompt, out = [], [], []
    for n, row in rows:
        where = f"{path.name} line {n}"
        ns.append(_azure_ns(row[it], where, dates))
        prompt.append(_parse_int(row[ip], "ContextTokens", where))
        out.append(_parse_int(row[io], "GeneratedTokens", where))
    t0 = min(ns)
    arrival = np.array([t - t0 for t in ns], dtype=np.float64) / _NS_PER_S
    return _workload(path, arrival, prompt, out, source=f"azure trace {path.name}")


def _workload(path: Path, *args: Any, **kwargs: Any) -> Workload:
    """Workload.from_arrays; its ValueError is raised with the file's name in front."""
    try:
        return Workload.from_arrays(*args, **kwargs)
    except ValueError as e:
        raise ValueError(f"{path.name}: {e}") from None


def _json_int(obj: dict[str, object], field: str, where: str, minimum: int) -> int:
    value = obj.get(field)
    if value is None:
        raise ValueError(f"{where}: missing field {field}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {field} {value!r} is not an integer")
    _check_range(value, field, where, minimum)
    return value


def _load_mooncake(path: Path, lines: list[str]) -> Workload:
    ms, prompt, out, hashes = [], [], [], []
    any_hashes = False
    for n, line in enumerate(lines, start=1):
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
        ms.append(_json_int(obj, "timestamp", where, minimum=0))
        prompt.append(_json_int(obj, "input_length", where, minimum=1))
        out.append(_json_int(obj, "output_length", where, minimum=1))
        row_hashes = obj.get("hash_ids", [])
        any_hashes = any_hashes or "hash_ids" in obj
        if not isinstance(row_hashes, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in row_hashes
        ):
            raise ValueError(f"{where}: hash_ids must be a list of integers")
        hashes.append(tuple(row_hashes))
    arrival = np.asarray(ms, dtype=np.float64) / 1000.0
    return _workload(
        path, arrival, prompt, out, hash_ids=hashes if any_hashes else None,
        source=f"mooncake trace {path.name}",
    )


def _parse_float(text: str, field: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {field} {text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{where}: {field} {value} must be finite and >= 0")
    return value


def _load_servesim(path: Path, lines: list[str]) -> Workload:
    index, rows = _rows(path, lines, _SERVESIM_REQUIRED)
    arrival: list[float] = []
    prompt: list[int] = []
    out: list[int] = []
    cap: list[int] = []
    priority: list[int] = []
    ids: list[str] = []
    hashes: list[tuple[int, ...]] = []
    segments: list[tuple[tuple[int, int], ...]] = []

    def cell(row: list[str], name: str) -> str:
        return row[index[name]].strip() if name in index else ""

    for n, row in rows:
        where = f"{path.name} line {n}"
        arrival.append(_parse_float(row[index["arrival_time"]], "arrival_time", where))
        prompt.append(_parse_int(row[index["num_prompt_tokens"]], "num_prompt_tokens", where))
        out.append(_parse_int(row[index["output_len"]], "output_len", where))
        text = cell(row, "max_tokens")
        cap.append(_parse_int(text, "max_tokens", where) if text else out[-1])
        text = cell(row, "priority")
        priority.append(_parse_int(text, "priority", where, None) if text else 0)
        ids.append(cell(row, "request_id") or str(n - 2))
        hashes.append(tuple(_parse_int(h, "hash_ids", where, None, bounded=False)
                            for h in cell(row, "hash_ids").split()))
        segments.append(tuple(_parse_segment(x, where)
                              for x in cell(row, "prompt_segments").split()))
    return _workload(
        path, arrival, prompt, out, max_tokens=cap, priority=priority, request_id=ids,
        hash_ids=hashes if "hash_ids" in index else None, source=f"servesim trace {path.name}",
        prompt_segments=segments if "prompt_segments" in index else None,
    )


def _parse_segment(text: str, where: str) -> tuple[int, int]:
    sid, sep, length = text.partition(":")
    if not sep:
        raise ValueError(f"{where}: prompt_segments entry {text!r} is not id:tokens")
    return (_parse_int(sid, "prompt_segments id", where, None),
            _parse_int(length, "prompt_segments tokens", where))


def load_trace(path: Path | str, fmt: str | None = None) -> Workload:
    """Load a trace file as a Workload sorted by arrival_time.

    Args:
        path: the trace file.
        fmt: one of ``TRACE_FORMATS`` to force a format; None detects it from the first line.

    Raises:
        FileNotFoundError: no such file (the message holds the path).
        ValueError: unknown ``fmt`` or format, or a malformed row (the message names the
            file, the line number and the field), or a token count < 1.
    """
    path = Path(path)
    if fmt is not None and fmt not in TRACE_FORMATS:
        raise ValueError(f"trace_format must be one of {', '.join(TRACE_FORMATS)}; got {fmt!r}")
    lines = _read_lines(path)
    fmt = detect_format(path, lines) if fmt is None else fmt
    loaders = {"servesim": _load_servesim, "azure": _load_azure, "mooncake": _load_mooncake,
               "vllm-bench": vllm_bench.load_workload}
    return loaders[fmt](path, lines)


def load_lengths(path: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """(num_prompt_tokens, output_len) int64 pairs, in file order, from any length source.

    Reads length-only CSVs (``num_prefill_tokens``, ``num_decode_tokens``) and every format
    ``load_trace`` reads. Errors as ``load_trace``.
    """
    path = Path(path)
    lines = _read_lines(path)
    if set(_header(lines)).issuperset(_LENGTH_COLUMNS) and not lines[0].lstrip().startswith("{"):
        index, rows = _rows(path, lines, _LENGTH_COLUMNS)
        ip, io = (index[c] for c in _LENGTH_COLUMNS)
        prompt = [_parse_int(r[ip], _LENGTH_COLUMNS[0], f"{path.name} line {n}") for n, r in rows]
        out = [_parse_int(r[io], _LENGTH_COLUMNS[1], f"{path.name} line {n}") for n, r in rows]
        return np.asarray(prompt, dtype=np.int64), np.asarray(out, dtype=np.int64)
    workload = load_trace(path)
    return workload.num_prompt_tokens.copy(), workload.output_len.copy()


def save_trace(workload: Workload, path: Path | str) -> None:
    """Write ``workload`` as a servesim CSV that ``load_trace`` reads back equal.

    Columns: arrival_time (s, shortest exact float repr), num_prompt_tokens, output_len,
    max_tokens, priority, request_id, and hash_ids (space-separated) and prompt_segments
    (space-separated id:tokens) when present. The
    parent folder is created if needed; ``source`` is not stored.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [*_SERVESIM_REQUIRED, "max_tokens", "priority", "request_id"]
    if workload.hash_ids is not None:
        header.append("hash_ids")
    if workload.prompt_segments is not None:
        header.append("prompt_segments")
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        for i in range(len(workload)):
            row: list[object] = [
                repr(float(workload.arrival_time[i])), int(workload.num_prompt_tokens[i]),
                int(workload.output_len[i]), int(workload.max_tokens[i]),
                int(workload.priority[i]), workload.request_id[i],
            ]
            if workload.hash_ids is not None:
                row.append(" ".join(str(h) for h in workload.hash_ids[i]))
            if workload.prompt_segments is not None:
                row.append(" ".join(f"{sid}:{n}" for sid, n in workload.prompt_segments[i]))
            writer.writerow(row)
