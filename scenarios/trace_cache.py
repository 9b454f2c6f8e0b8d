"""Parsed traces kept per process, so that the many runs of one process (sweep cells,
plan probes, a worker's share of them) read and validate a trace file once.

Owns the cache key and the per-process cache. A parse is keyed by everything that changes
it: the file's absolute path, size and modification time (a file rewritten in place is
read again), the format asked for and any other argument given to the reader
(scenarios.traces.load_trace). Workloads are immutable, so every caller may share one.

A process that cannot read the file itself (a Ray worker on another host) is given the
whole parse its driver made: ``ship`` lists it, ``receive`` installs it, and a shipped
parse is used for its path, format and reader arguments whatever the local file system
holds (it is the driver's file that the run names), cut as each run asks (CUT_ARGS,
Workload.cut, as load_trace cuts); the driver has already refused a length-only file
that no rate re-times.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scenarios.traces import load_trace
from scenarios.workload import Workload

CUT_ARGS = ("num_requests", "window_s")
"""load_trace's arguments that cut the parse (Workload.cut's); a shipped parse is whole."""

SHIP_IGNORES = (*CUT_ARGS, "retimed")
"""load_trace's arguments a shipped parse stands for any value of (``retimed`` only
refuses a length-only file, which the driver's checks have done)."""

MAX_TRACES = 4
"""Trace file versions one process keeps parses of (least recently used dropped first)."""

WHOLE_READ_BYTES = 64 * 2**20
"""Files under this size (bytes) are parsed whole, whatever cut a run asks for."""


@dataclass(frozen=True)
class ReadKey:
    """What a parse is asked for: the file's absolute path, the format (None = detect)
    and the reader's other arguments, as sorted (name, value) pairs."""

    path: str
    fmt: str | None
    read_args: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class FileKey:
    """One version of the file, as parsed for ``read`` (the cut left out): ``read`` plus
    the file's size (bytes) and modification time (ns)."""

    read: ReadKey
    size_bytes: int
    mtime_ns: int


def read_key(path: Path | str, fmt: str | None, **read_args: Any) -> ReadKey:
    """The ReadKey of ``load_trace(path, fmt, **read_args)``; an argument given as None
    is load_trace's default, so it keys as if not given."""
    given = ((k, v) for k, v in read_args.items() if v is not None)
    return ReadKey(str(Path(path).absolute()), fmt, tuple(sorted(given)))


def file_key(read: ReadKey, given: Path | str | None = None) -> FileKey:
    """``read`` with the file's current size and mtime. FileNotFoundError naming the
    path (``given``, as the user wrote it, else the absolute one) when there is no such
    file, as load_trace raises."""
    try:
        st = Path(read.path).stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"trace file not found: {given or read.path}") from None
    return FileKey(read, st.st_size, st.st_mtime_ns)


class TraceCache:
    """Parsed traces by file version and reader arguments (at most ``capacity`` files
    and versions, least recently used dropped), and the parses shipped from a driver by
    ReadKey (``receive``).

    A cut parse serves a smaller cut of its own (the same window, fewer requests: both
    are prefixes of one time-ordered table), a whole parse every cut. A file under
    WHOLE_READ_BYTES is parsed whole whatever cut is asked for, so that one parse serves
    every run; a larger one only as far as the cut asks (load_trace stops reading early).
    A parse made for ``retimed`` runs serves only those (for a length-only file a run that
    keeps the arrivals is refused), one made without serves both."""

    def __init__(self, capacity: int = MAX_TRACES) -> None:
        self.capacity = capacity
        self._parsed: OrderedDict[FileKey, list[_Parse]] = OrderedDict()
        self._shipped: dict[ReadKey, Workload] = {}
        self.num_parses = 0  # files read by this cache (a test's and a benchmark's count)

    def load(self, path: Path | str, fmt: str | None = None, **read_args: Any) -> Workload:
        """``load_trace(path, fmt, **read_args)``, parsed once per file version (or as
        shipped). Raises what load_trace raises."""
        base_args = _shipped_args(read_args)
        num_requests, window_s = (read_args.get(a) for a in CUT_ARGS)
        shipped = self._shipped.get(read_key(path, fmt, **base_args))
        if shipped is not None:
            return shipped.cut(num_requests, window_s)
        key = file_key(read_key(path, fmt, **base_args), path)
        retimed = bool(read_args.get("retimed", False))
        parses = self._parsed.setdefault(key, [])
        self._parsed.move_to_end(key)
        hit = next((p for p in parses if p.serves(num_requests, window_s, retimed)), None)
        if hit is None:
            whole = key.size_bytes < WHOLE_READ_BYTES
            cut = (None, None) if whole else (num_requests, window_s)
            args = {**read_args, **dict(zip(CUT_ARGS, cut, strict=True))}
            args = {k: v for k, v in args.items() if k in read_args}  # what was asked
            hit = _Parse(cut[0], cut[1], retimed, load_trace(Path(key.read.path), fmt,
                                                             **args))
            self.num_parses += 1
            parses.append(hit)
            while len(self._parsed) > self.capacity:
                self._parsed.popitem(last=False)
        return hit.workload.cut(num_requests, window_s)

    def ship(self, path: Path | str, fmt: str | None = None,
             **read_args: Any) -> dict[ReadKey, Workload]:
        """The whole parse of one trace (not cut; a length-only file read as re-timed),
        for ``receive`` in another process; ``read_args`` as load_trace's, SHIP_IGNORES
        ignored."""
        args = _shipped_args(read_args)
        return {read_key(path, fmt, **args): self.load(path, fmt, retimed=True, **args)}

    def receive(self, shipment: dict[ReadKey, Workload]) -> None:
        """Use these parses (a driver's ``ship``) for their files from now on."""
        self._shipped.update(shipment)


@dataclass(frozen=True)
class _Parse:
    """One parse of a file version: the cut it was read with and ``retimed``."""

    num_requests: int | None
    window_s: float | None
    retimed: bool
    workload: Workload

    def serves(self, num_requests: int | None, window_s: float | None,
               retimed: bool) -> bool:
        """Whether this parse, cut, is what load_trace reads for these arguments."""
        if self.retimed and not retimed:
            return False
        if self.num_requests is None and self.window_s is None:
            return True
        return (window_s == self.window_s and num_requests is not None
                and (self.num_requests is None or num_requests <= self.num_requests))


def _shipped_args(read_args: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in read_args.items() if k not in SHIP_IGNORES}


PROCESS_CACHE = TraceCache()
"""This process's cache: the one scenarios.build reads traces through."""


def load_trace_cached(path: Path | str, fmt: str | None = None,
                      **read_args: Any) -> Workload:
    """``load_trace`` through this process's cache (PROCESS_CACHE)."""
    return PROCESS_CACHE.load(path, fmt, **read_args)
