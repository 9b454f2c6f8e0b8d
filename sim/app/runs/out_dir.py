"""Writing outputs whole or not at all, and never over what servesim did not write.

A *run directory* (requests.csv, steps.csv, summary.json, config.json, and report.html
when asked for) is staged in a temporary sibling directory and swapped in once complete
(``stage_dir``, ``commit_dirs``); several (the cells of ``--compare``, validate's two
runs) are staged first and swapped in together, so a failure in the last leaves the
previous set as it was. A directory is only ever replaced when it is empty or a previous
run directory (``check_run_dir``): one holding anything else is refused, as is the
current directory or one that holds it. Loose files (sweep.csv, capacity.md, ...) are
written to temporary siblings and renamed into place once all are written
(``write_files``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

#: What servesim writes into a run directory (its config.json, which records
#: servesim_version, marks one).
RUN_DIR_FILES = frozenset({"requests.csv", "steps.csv", "summary.json", "config.json",
                           "report.html"})


def check_run_dir(out_dir: Path, option: str = "out") -> Path:
    """The directory a run will be written to (``out_dir`` with symlinks resolved),
    after checking that replacing it loses nothing. Raises ValueError naming ``option``
    when it is a file, the current directory or one holding it, or a non-empty directory
    other than a previous run directory: one holding servesim's config.json and only the
    files of RUN_DIR_FILES (ignoring .DS_Store and servesim's own stale .report.html.tmp
    and the like)."""
    try:
        path = Path(out_dir).resolve()
    except RuntimeError as e:  # a symlink loop
        raise ValueError(f"{option}: {out_dir}: {e}") from None
    _check_folders(path, out_dir, option)
    cwd = Path.cwd().resolve()
    if path == cwd or path in cwd.parents:
        raise ValueError(f"{option}: {out_dir} is the current directory or holds it; "
                         "give a directory of its own")
    if path.is_dir():
        names = {p.name for p in path.iterdir() if not _ignorable(p)}
        other = sorted(names - RUN_DIR_FILES)
        if other or (names and not is_run_dir(path)):
            shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
            raise ValueError(f"{option}: {out_dir} is not a servesim run directory (it holds "
                             f"{shown or 'a config.json servesim did not write'}); it would "
                             "be replaced: give a new or empty directory")
    return path


def _ignorable(p: Path) -> bool:
    """A Finder file, or a temporary servesim left behind (``.report.html.tmp``: a killed
    write_files), which replacing the directory may drop."""
    return p.name == ".DS_Store" or (
        p.is_file() and p.name in {f".{n}.tmp" for n in RUN_DIR_FILES})


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds the config.json of a servesim run (it records the
    version)."""
    try:
        data = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "servesim_version" in data


def _check_folders(path: Path, given: Path, option: str) -> None:
    """ValueError naming ``option`` when ``path``, or the nearest of its parents that
    exists, is not a directory (so it could not be created)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option}: {given} exists and is not a directory")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{option}: cannot make {given}: {parent} is a file")
            return


def stage_dir(out_dir: Path, write: Callable[[Path], None], option: str = "out") -> Path:
    """Check ``out_dir`` (check_run_dir), create a temporary sibling directory, have
    ``write`` fill it and return it, for commit_dirs; on any error the temporary
    directory is removed and the error raised."""
    path = check_run_dir(out_dir, option)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would make the run private
    try:
        write(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def commit_dirs(staged: Sequence[tuple[Path, Path]]) -> None:
    """Swap each staged (temporary directory, run directory) pair into place; a run
    directory there before is removed once replaced. On an error the staged directories
    not yet swapped in are removed."""
    done = 0
    try:
        for tmp, out_dir in staged:
            _swap(tmp, out_dir)
            done += 1
    except BaseException:
        discard(staged[done:])
        raise


def _swap(tmp: Path, out_dir: Path) -> None:
    """Put ``tmp`` where ``out_dir`` is (symlinks resolved), removing what was there."""
    path = Path(out_dir).resolve()
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
        os.rmdir(old)  # a fresh unused name for the previous run
        os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(old, path)  # put the previous run back
            raise
        shutil.rmtree(old)
    else:
        os.replace(tmp, path)


def discard(staged: Sequence[tuple[Path, Path]]) -> None:
    """Remove staged temporary directories (after a failure)."""
    for tmp, _ in staged:
        shutil.rmtree(tmp, ignore_errors=True)


def check_files(out_dir: Path, names: Sequence[str], option: str = "out") -> Path:
    """``out_dir`` made ready for ``names``: raises ValueError naming ``option`` when it is
    a file or one of the names there is a directory."""
    path = Path(out_dir)
    _check_folders(path.resolve(), out_dir, option)
    for name in names:
        if (path / name).is_dir():
            raise ValueError(f"{option}: {path / name} is a directory; servesim writes a "
                             "file there")
    return path


def write_files(out_dir: Path, files: dict[str, Callable[[], str]],
                option: str = "out") -> list[Path]:
    """Write each ``name: text()`` into ``out_dir`` whole or not at all: every text goes
    to a temporary sibling first, and only when all are written are they renamed into
    place. Returns the paths. Raises ValueError as check_files."""
    path = check_files(out_dir, list(files), option)
    path.mkdir(parents=True, exist_ok=True)
    tmps: list[tuple[Path, Path]] = []
    try:
        for name, text in files.items():
            tmp = path / f".{name}.tmp"
            tmp.write_text(text(), encoding="utf-8")
            tmps.append((tmp, path / name))
    except BaseException:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        (path / f".{name}.tmp").unlink(missing_ok=True)
        raise
    for tmp, final in tmps:
        tmp.replace(final)
    return [final for _, final in tmps]
