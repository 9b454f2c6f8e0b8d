"""Parsed CSV trace columns kept on disk between processes, so that the next run on the same
trace file skips pandas (0.2-0.4 s of start-up to import it) and the parse itself (seconds
for a file of millions of rows).

Owns the cache's place, its key and its file format. An entry is the Columns the bulk
reader (bulk.py) made of one whole file, keyed by the file's absolute path, size,
modification time (ns) and a SHA-256 of its first and last FINGERPRINT_BYTES, the format's
definition and the filters, and the reader itself (a SHA-256 of READER_MODULES' source and
pandas' version): a file rewritten in place, or a servesim or pandas that parses it
otherwise, parses it again. Entries are .npz
files without pickles, each holding the key it was made for; an entry whose key differs,
or that cannot be read, is a miss. An entry is written to a temporary file and renamed
into place, so that another process reads a whole entry or none. At most MAX_ENTRIES are
kept, and at most MAX_BYTES of them, the least recently written dropped first.

Where: $SERVESIM_CACHE_DIR/traces, else $XDG_CACHE_HOME/servesim/traces, else
~/.cache/servesim/traces; SERVESIM_TRACE_CACHE=0 turns the cache off. A cache that cannot
be written (a read-only home) is passed over without a word: it only saves time, and a
run's results are the same with or without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from scenarios.traces.formats import Columns, CsvFormat

FORMAT_VERSION = 1
"""Part of every key: entries of another layout are misses."""

FINGERPRINT_BYTES = 1 << 20
"""Bytes hashed at each end of the file (the whole file when it is at most twice this)."""

MAX_ENTRIES = 16
"""Entries kept; writing one more removes the least recently written."""

MAX_BYTES = 2 * 2**30
"""Bytes of entries kept (about 32 a row: 60 million rows); past it the oldest go."""

READER_MODULES = ("bulk.py", "column_cache.py", "formats.py", "timestamps.py")
"""The modules of scenarios/traces whose code decides an entry's columns."""

STALE_TEMP_S = 3600.0
"""A temporary file this old (s) is a killed writer's, removed when an entry is written."""

_ARRAYS = ("clock", "prompt", "output", "row")


def cache_dir() -> Path | None:
    """The directory entries live in, or None when SERVESIM_TRACE_CACHE is 0 or there is
    no home directory to put it in."""
    if os.environ.get("SERVESIM_TRACE_CACHE", "1").strip() == "0":
        return None
    root = os.environ.get("SERVESIM_CACHE_DIR")
    if root:
        return Path(root) / "traces"
    xdg = os.environ.get("XDG_CACHE_HOME")
    try:
        base = Path(xdg) if xdg else Path.home() / ".cache"
    except RuntimeError:  # no HOME and no password entry
        return None
    return base / "servesim" / "traces"


def file_key(path: Path, spec: CsvFormat, filters: dict[str, str]) -> str | None:
    """The key of ``path`` parsed as ``spec`` with ``filters`` (a JSON string), or None
    when the cache is off (nothing is hashed then) or the file cannot be read."""
    if cache_dir() is None:
        return None
    try:
        st = path.stat()
        digest = hashlib.sha256()
        with path.open("rb") as f:
            if st.st_size <= 2 * FINGERPRINT_BYTES:
                digest.update(f.read())
            else:
                digest.update(f.read(FINGERPRINT_BYTES))
                f.seek(-FINGERPRINT_BYTES, os.SEEK_END)
                digest.update(f.read(FINGERPRINT_BYTES))
    except OSError:
        return None
    return json.dumps({
        "version": FORMAT_VERSION,
        "reader": _reader_version(),
        "path": str(path.absolute()),
        "size_bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ends_sha256": digest.hexdigest(),
        "format": dataclasses.asdict(spec),
        "filters": sorted(filters.items()),
    }, sort_keys=True)


def _reader_version() -> str:
    """A SHA-256 of READER_MODULES' source and pandas' installed version (read from its
    metadata: pandas is not imported)."""
    from importlib import metadata

    digest = hashlib.sha256()
    here = Path(__file__).parent
    for name in READER_MODULES:
        digest.update((here / name).read_bytes())
    with contextlib.suppress(metadata.PackageNotFoundError):
        digest.update(metadata.version("pandas").encode())
    return digest.hexdigest()


def _entry(directory: Path, key: str) -> Path:
    return directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"


def load(key: str | None) -> Columns | None:
    """The columns stored under ``key``, or None (no key, no cache, no entry, an entry made
    for another key, or one that cannot be read)."""
    directory = cache_dir()
    if key is None or directory is None:
        return None
    try:
        with np.load(_entry(directory, key), allow_pickle=False) as data:
            if str(data["key"]) != key:
                return None
            arrays = {name: np.array(data[name]) for name in _ARRAYS}
            return Columns(**arrays, failed=int(data["failed"]),
                           filtered=int(data["filtered"]))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


def store(key: str | None, cols: Columns) -> None:
    """Keep ``cols`` under ``key`` (nothing without a key or a cache; an error writing is
    passed over), then drop entries past MAX_ENTRIES and stale temporary files."""
    directory = cache_dir()
    if key is None or directory is None:
        return
    tmp: str | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=directory)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, key=np.array(key), failed=np.int64(cols.failed),
                     filtered=np.int64(cols.filtered),
                     **{name: getattr(cols, name) for name in _ARRAYS})
        os.replace(tmp, _entry(directory, key))
        tmp = None
        _trim(directory)
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _trim(directory: Path) -> None:
    """Remove the entries past MAX_ENTRIES or MAX_BYTES (oldest first; the newest stays
    whatever its size) and temporary files older than STALE_TEMP_S."""
    now = time.time()
    entries = []
    for p in directory.glob("*.npz"):
        with contextlib.suppress(OSError):
            st = p.stat()
            if p.name.startswith(".tmp-"):
                if now - st.st_mtime > STALE_TEMP_S:
                    p.unlink()
            else:
                entries.append((st.st_mtime_ns, st.st_size, p))
    entries.sort(reverse=True)  # newest first
    kept_bytes = 0
    for i, (_, size, p) in enumerate(entries):
        kept_bytes += size
        if i >= MAX_ENTRIES or (i and kept_bytes > MAX_BYTES):
            with contextlib.suppress(OSError):
                p.unlink()
