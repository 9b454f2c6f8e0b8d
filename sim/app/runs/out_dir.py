"""Which places a command may write, and writing its outputs there whole or not at all.

The rule, for every command: a file or directory servesim did not write is never
replaced; outputs are staged beside their place and renamed into place once complete;
the staging of a run that was killed is removed by the next write into the same place
(sim/staging.py: staging names record the writing process, so a live writer's staging is
never taken for debris, and never read as output).

What servesim wrote is known by its mark: a run directory by its config.json (which
records ``servesim_version``); an HTML page by ``GENERATOR_META`` in its head; a JSON
file by ``servesim_version`` or a ``format`` of servesim's (``servesim-validation``); a
PNG by a ``Software: servesim`` text chunk (``mark_png``); a YAML file (a plan's
vllm_serve.yaml) by ``YAML_MARK`` as its first line. A file whose kind carries no
mark (sweep.csv, capacity.md, sweep.json, plan.json) is replaced only with its command's
set (``check_files``' names) when a marked member of that set is present and servesim's.
Anything else at an output's place is refused before any work, in one line naming the
option and the path.

A *run directory* (requests.csv, steps.csv, summary.json, config.json, and report.html
when asked for) is staged in a sibling directory and swapped in once complete
(``stage_dir``, ``commit_dirs``); several (the cells of ``--compare``, validate's two runs)
are staged first and swapped in together, so a failure in the last leaves the previous
set as it was. A directory is only ever replaced when it is empty or a previous run
directory (``check_run_dir``), never the current directory or one that holds it. Loose
files (sweep.csv, capacity.md, report.html, ...) are staged beside their places and
renamed into place once all are written (``write_files``). An OS error while writing
(no space, a read-only disk, no permission) is one ValueError line naming the option.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from sim.app.runs.config_file import VERSION
from sim.staging import remove_stale_staging as remove_stale_staging  # for out_dir callers
from sim.staging import staging_dir, staging_file, staging_match, swap_in, write_error

#: What servesim writes into a run directory (its config.json, which records
#: servesim_version, marks one).
RUN_DIR_FILES = frozenset({"requests.csv", "steps.csv", "summary.json", "config.json",
                           "report.html"})

#: The mark in the head of every HTML page servesim writes (sim/app/reports/html_page.py
#: and sweep_page.py put it before the title, within the first bytes of the file).
GENERATOR_META = f'<meta name="generator" content="servesim {VERSION}">'
_HTML_MARK = b'<meta name="generator" content="servesim '
#: The comment line that heads every YAML file servesim writes (a plan's vllm_serve.yaml,
#: which a user may edit by hand: without the line it is theirs).
YAML_MARK = f"# generator: servesim {VERSION}"
_YAML_MARK = b"# generator: servesim "

#: The PNG text chunk (keyword Software) that marks servesim's figures.
_PNG_MARK = b"tEXtSoftware\x00servesim "
_HEAD_BYTES = 4096


def check_run_dir(out_dir: Path, option: str = "--out") -> Path:
    """The directory a run will be written to (``out_dir`` with symlinks resolved),
    after checking that replacing it loses nothing. Raises ValueError naming ``option``
    when it is a file, the current directory or one holding it, or a non-empty directory
    other than a previous run directory: one holding servesim's config.json and only the
    files of RUN_DIR_FILES (ignoring .DS_Store and the staging files of a write into it)."""
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
    """A Finder file, or the staging file of a write of one of a run directory's files
    (``.report.html.servesim-...tmp``, or the unmarked ``.report.html.tmp``), which
    replacing the directory drops."""
    return p.name == ".DS_Store" or (p.is_file() and any(
        p.name == f".{n}.tmp" or staging_match(p.name, n) for n in RUN_DIR_FILES))


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds the config.json of a servesim run (it records the
    version)."""
    data = _json_object(Path(path) / "config.json")
    return data is not None and "servesim_version" in data


def _json_object(path: Path) -> dict[str, object] | None:
    """The JSON object in ``path``; None when it cannot be read or is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def written_by_servesim(path: Path) -> bool | None:
    """Whether the file ``path`` carries servesim's mark: True when it does; False for an
    HTML page, PNG or YAML file without it (the kinds servesim always marks); None for a
    JSON file without it and any other kind (CSV, Markdown), which carry no mark of their
    own."""
    suffix = path.suffix.lower()
    marks = {".html": _HTML_MARK, ".htm": _HTML_MARK, ".png": _PNG_MARK,
             ".yaml": _YAML_MARK, ".yml": _YAML_MARK}
    if suffix in marks:
        try:
            with path.open("rb") as f:
                head = f.read(_HEAD_BYTES)
        except OSError:
            return False
        return marks[suffix] in head
    if suffix == ".json":
        data = _json_object(path)
        if data is not None and ("servesim_version" in data or str(
                data.get("format", "")).startswith("servesim-")):
            return True
    return None


def mark_png(data: bytes) -> bytes:
    """The PNG ``data`` with servesim's mark: a text chunk (Software: servesim VERSION)
    after the IHDR chunk, which every PNG has first (PNG specification, 5.6 and 11.3.4)."""
    import struct
    import zlib

    ihdr_end = 8 + 4 + 4 + 13 + 4  # signature, then IHDR's length, type, data and CRC
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG image")
    body = _PNG_MARK + VERSION.encode("ascii")
    chunk = (struct.pack(">I", len(body) - 4) + body
             + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF))
    return data[:ihdr_end] + chunk + data[ihdr_end:]


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


def stage_dir(out_dir: Path, write: Callable[[Path], None], option: str = "--out") -> Path:
    """Check ``out_dir`` (check_run_dir), clear the staging a killed run left beside it,
    create a staging directory, have ``write`` fill it and return it, for commit_dirs.
    On any error the staging directory is removed and the error raised; an OS error as
    a ValueError naming ``option`` (sim/staging.py write_error)."""
    path = check_run_dir(out_dir, option)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(path.parent, path.name)
        tmp = staging_dir(path.parent, path.name)
    except OSError as e:
        raise write_error(e, option, out_dir) from e
    try:
        write(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise write_error(e, option, out_dir) from e
        raise
    return tmp


def commit_dirs(staged: Sequence[tuple[Path, Path]], option: str = "--out") -> None:
    """Swap each staged (staging directory, run directory) pair into place; a run
    directory there before is removed once replaced. On an error the staged directories
    not yet swapped in are removed; an OS error is raised as a ValueError naming
    ``option``."""
    done = 0
    try:
        for tmp, out_dir in staged:
            try:
                swap_in(tmp, Path(out_dir).resolve())
            except OSError as e:
                raise write_error(e, option, out_dir) from e
            done += 1
    except BaseException:
        discard(staged[done:])
        raise


def discard(staged: Sequence[tuple[Path, Path]]) -> None:
    """Remove staged directories (after a failure)."""
    for tmp, _ in staged:
        shutil.rmtree(tmp, ignore_errors=True)


def check_files(out_dir: Path, names: Sequence[str], option: str = "--out") -> Path:
    """``out_dir`` made ready for the set of files ``names`` that one command writes.
    Raises ValueError naming ``option`` when ``out_dir`` is a file, one of the names there
    is a directory, or one is a file servesim did not write: an HTML page or PNG without
    servesim's mark, or an unmarked file (CSV, Markdown, JSON) with no marked member of
    the set beside it (written_by_servesim)."""
    path = Path(out_dir)
    _check_folders(path.resolve(), out_dir, option)
    for name in names:
        if (path / name).is_dir():
            raise ValueError(f"{option}: {path / name} is a directory; servesim writes a "
                             "file there")
    present = [n for n in names if (path / n).exists() or (path / n).is_symlink()]
    marks = {n: written_by_servesim(path / n) for n in present}
    anchored = any(marks.values())
    foreign = [n for n in present if marks[n] is False or (marks[n] is None and not anchored)]
    if foreign:
        shown = ", ".join(str(path / n) for n in foreign)
        were = "exists and carries" if len(foreign) == 1 else "exist and carry"
        raise ValueError(f"{option}: {shown} {were} no servesim mark (another program's, or "
                         "written by a servesim that did not mark its files); give another "
                         "path or remove it")
    return path


def write_files(out_dir: Path, files: dict[str, Callable[[], str | bytes]],
                option: str = "--out") -> list[Path]:
    """Write each ``name: data()`` (text as UTF-8, or bytes) into ``out_dir`` whole or
    not at all: the staging a killed write left is cleared, every file is staged beside
    its place, and only when all are written are they renamed into place. Returns the
    paths. Raises ValueError as check_files, and naming ``option`` on an OS error."""
    path = check_files(out_dir, list(files), option)
    tmps: list[tuple[Path, Path]] = []
    try:
        path.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            remove_stale_staging(path, name)
            tmps.append((staging_file(path, name, data()), path / name))
        for tmp, final in tmps:
            os.replace(tmp, final)
    except OSError as e:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        raise write_error(e, option, out_dir) from e
    except BaseException:
        _finish_or_discard(tmps)
        raise
    return [final for _, final in tmps]


def _finish_or_discard(tmps: list[tuple[Path, Path]]) -> None:
    """After a stop (a signal, Ctrl-C) in write_files: once some staged file has been
    renamed into place, every file is complete, so the rest are renamed too (a set half
    old, half new would be neither run's); before that, the staged files are removed."""
    if any(not tmp.exists() for tmp, _ in tmps):
        for tmp, final in tmps:
            if tmp.exists():
                os.replace(tmp, final)
        return
    for tmp, _ in tmps:
        tmp.unlink(missing_ok=True)
