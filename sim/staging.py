"""Putting an output in place whole, and clearing what a writer that died left behind.

An output (a run directory, a page, a profile) is first written under a *staging name*
beside its place and renamed into place once complete:

    .NAME.servesim-PID-START.XXXXXXXX        a directory being written
    .NAME.servesim-PID-START.XXXXXXXX.tmp    a file being written
    .NAME.servesim-PID-START.old.XXXXXXXX    the previous NAME, moved aside while the new
                                             one is renamed in (swap_in)

PID and START name the writing process: its process id and its start time in clock
ticks after boot (field 22 of Linux's /proc/PID/stat), so that a process id the system
has since given to another process is not taken for the writer. A writer killed outright
(SIGKILL, a power cut) leaves its staging behind; ``remove_stale_staging``, called by every
write into a place before it writes, removes the staging of writers that are no longer
running, and never a live writer's. A previous output moved aside by a swap that never
finished is put back when nothing took its place (the write it made way for never
completed), else removed.

OS errors while writing become one ValueError line naming the option and what to change
(``write_error``). The module is in the core, beside the CSV writer (sim/table.py), so
that calibration, below the application, writes its profiles the same way as the
application's commands (sim/app/runs/out_dir.py adds which places may be written at all).
Without /proc (macOS) a writer counts as running while its process id is in use.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

#: The staging names after ``.NAME.servesim-``.
_STAGING = re.compile(r"(?P<pid>\d+)-(?P<start>\d+)\.(?P<old>old\.)?[a-z0-9_]+(?:\.tmp)?")

#: What an OS error while writing means, and what to change (``{option}``: the option
#: that gave the path).
_ADVICE = {
    errno.ENOSPC: ("no space left on device", "free space or give another {option}"),
    errno.EDQUOT: ("disk quota exceeded", "free space or give another {option}"),
    errno.EROFS: ("read-only file system", "give another {option}"),
    errno.EACCES: ("permission denied", "give another {option} or make it writable"),
    errno.EPERM: ("operation not permitted", "give another {option} or make it writable"),
    errno.ENAMETOOLONG: ("file name too long", "give a shorter {option}"),
}


def _process_start(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks after boot, from /proc/PID/stat; None
    when there is no such process, it has exited (a zombie awaiting its parent), or there
    is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def writer_tag() -> str:
    """``servesim-PID-START``: this process, as staging names record it."""
    pid = os.getpid()
    return f"servesim-{pid}-{_process_start(pid) or 0}"


def _running(pid: int, start: int) -> bool:
    """Whether the process that wrote a staging name tagged ``pid``, ``start`` still runs."""
    if Path("/proc/self/stat").exists():
        return _process_start(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def staging_match(entry: str, name: str) -> re.Match[str] | None:
    """The parts (pid, start, old) of ``entry`` when it is a staging name of ``name``."""
    prefix = f".{name}.servesim-"
    return _STAGING.fullmatch(entry[len(prefix):]) if entry.startswith(prefix) else None


def remove_stale_staging(parent: Path, name: str) -> list[Path]:
    """Clear the staging of ``parent / name`` left by writers no longer running: staged
    directories and files are removed; a previous output moved aside by an unfinished
    swap is put back at ``parent / name`` when nothing is there, else removed. Staging of
    a running writer (this process included) is kept. Returns the staging paths cleared
    (nothing when ``parent`` does not exist). OSError when one cannot be removed."""
    return _clear(parent, name, lambda pid, start: not _running(pid, start))


def _clear(parent: Path, name: str, whose: Callable[[int, int], bool]) -> list[Path]:
    """Clear the staging of ``parent / name`` whose writer (pid, start) ``whose`` picks,
    as remove_stale_staging says."""
    parent = Path(parent)
    try:
        entries = sorted(parent.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    place = parent / name
    cleared = []
    for entry in entries:
        m = staging_match(entry.name, name)
        if m is None or not whose(int(m["pid"]), int(m["start"])):
            continue
        if m["old"] and not place.exists() and not place.is_symlink():
            os.replace(entry, place)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        cleared.append(entry)
    return cleared


def remove_own_staging(path: Path) -> list[Path]:
    """Clear what this process staged for ``path``, beside it and, when ``path`` is a
    directory, inside it, as remove_stale_staging clears a dead writer's: for a command
    stopped by a signal, which may arrive between a staging name's creation and the
    ``try`` that would remove it. Returns the paths cleared; one that cannot be removed
    is left to the next run's remove_stale_staging."""
    path = Path(path)
    pid = os.getpid()
    me = (pid, _process_start(pid) or 0)
    places = [(path.parent, path.name)]
    if path.is_dir() and not path.is_symlink():
        places += sorted({(path, e.name[1:].split(".servesim-")[0]) for e in path.iterdir()
                          if e.name.startswith(".") and ".servesim-" in e.name})
    cleared = []
    for parent, name in places:
        try:
            cleared += _clear(parent, name, lambda p, s: (p, s) == me)
        except OSError:
            continue
    return cleared


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def staging_dir(parent: Path, name: str) -> Path:
    """A new empty staging directory for ``parent / name``, with the permissions a
    directory made here would have (mkdtemp's 0700 would make the output private)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.{writer_tag()}.", dir=parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


def staging_file(parent: Path, name: str, data: str | bytes, sync: bool = False) -> Path:
    """``data`` (text as UTF-8) written to a new staging file for ``parent / name``, with
    the permissions a file made here would have; flushed to the disk when ``sync``. On
    any error the file is removed and the error raised."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.{writer_tag()}.", suffix=".tmp", dir=parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would make the output private
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def swap_in(tmp: Path, path: Path) -> None:
    """Put the staged directory ``tmp`` where ``path`` is, removing what was there. The
    previous output is moved aside under a staging name first, and put back when the
    new one cannot be renamed in."""
    if not (path.exists() or path.is_symlink()):
        os.replace(tmp, path)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.{writer_tag()}.old.", dir=path.parent))
    os.rmdir(old)  # a fresh unused name for the previous output
    os.replace(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)
        raise
    shutil.rmtree(old)


def place_file(path: Path, data: str | bytes, option: str, sync: bool = False) -> None:
    """Write ``data`` to ``path`` whole or not at all: stale staging of ``path`` removed,
    a staging file written, then renamed over ``path``. Raises ValueError naming
    ``option`` on an OS error (write_error)."""
    path = Path(path)
    try:
        remove_stale_staging(path.parent, path.name)
        tmp = staging_file(path.parent, path.name, data, sync)
        try:
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        raise write_error(e, option, path) from e


def write_error(exc: OSError, option: str, path: Path | str) -> ValueError:
    """One line for an OS error while writing ``path``, given by ``option``: what went
    wrong and what to change, e.g. "--out: cannot write runs/latest: no space left on
    device; free space or give another --out"."""
    what, advice = _ADVICE.get(exc.errno or 0, (exc.strerror or str(exc), "give another {option}"))
    return ValueError(f"{option}: cannot write {path}: {what}; {advice.format(option=option)}")
