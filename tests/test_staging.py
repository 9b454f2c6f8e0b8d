"""Staging names and who may clear them (sim/staging.py): a staging name records the
writing process (pid and start time), the staging of a writer that no longer runs is
removed, a running writer's is kept even when its pid is reused, a previous output moved
aside by an unfinished swap is put back, and OS errors become one line naming the option."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.staging import (
    place_file,
    remove_own_staging,
    remove_stale_staging,
    staging_dir,
    staging_file,
    staging_match,
    write_error,
    writer_tag,
)


def _dead_writer_tag() -> str:
    """The tag of a process that has exited (and been waited for)."""
    proc = subprocess.run([sys.executable, "-c", "from sim.staging import writer_tag; "
                           "print(writer_tag())"], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    return proc.stdout.strip()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_the_tag_names_this_process_and_its_start_time() -> None:
    stat = Path("/proc/self/stat").read_text()
    start = stat.rsplit(")", 1)[1].split()[19]  # field 22 of proc(5)
    assert writer_tag() == f"servesim-{os.getpid()}-{start}"


def test_only_the_staging_of_writers_no_longer_running_is_removed(tmp_path: Path) -> None:
    dead = _dead_writer_tag()
    pid = os.getpid()
    reused = f"servesim-{pid}-1"  # this pid, another start time: a previous owner of it
    for tag in (dead, reused):
        (tmp_path / f".latest.{tag}.abcdefgh").mkdir()
        (tmp_path / f".latest.{tag}.abcdefgh" / "steps.csv").write_text("start_time\n0.")
        (tmp_path / f".r.html.{tag}.abcdefgh.tmp").write_text("<html")
    live_dir = staging_dir(tmp_path, "latest")  # this process: running
    live_file = staging_file(tmp_path, "r.html", "<html")
    (tmp_path / f".latest.{dead}").mkdir()  # not a staging name: a user's folder
    (tmp_path / ".latest.abcdefgh").mkdir()  # unmarked: no writer known, kept
    removed = remove_stale_staging(tmp_path, "latest")
    assert sorted(p.name for p in removed) == sorted(
        f".latest.{t}.abcdefgh" for t in (dead, reused))
    assert len(remove_stale_staging(tmp_path, "r.html")) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live_dir.name, live_file.name, f".latest.{dead}", ".latest.abcdefgh"])


def test_a_stopped_command_clears_its_own_staging_beside_and_inside_its_output(
        tmp_path: Path) -> None:
    """A stop signal may land between a staging name's creation and the cleanup that
    would remove it: the entry point then clears this process's staging for each output
    (beside a run directory, inside a sweep's directory), and no one else's."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.csv").write_text("a user's or a previous run's file\n")
    mine = [staging_dir(tmp_path, "out"), staging_file(out, "sweep.csv", "cell\n"),
            staging_file(out, "sweep.html", "<html")]
    other = f"servesim-{os.getpid()}-1"  # another process that had this pid
    (out / f".sweep.csv.{other}.abcdefgh.tmp").write_text("cell\n")
    assert sorted(remove_own_staging(out)) == sorted(mine)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["sweep.csv", f".sweep.csv.{other}.abcdefgh.tmp"])
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_previous_output_moved_aside_is_put_back_or_removed(tmp_path: Path) -> None:
    dead = _dead_writer_tag()
    old = tmp_path / f".latest.{dead}.old.abcdefgh"
    old.mkdir()
    (old / "summary.json").write_text("{}")
    (tmp_path / f".latest.{dead}.ijklmnop").mkdir()  # the new run it made way for
    remove_stale_staging(tmp_path, "latest")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]
    assert (tmp_path / "latest" / "summary.json").read_text() == "{}"
    old.mkdir()  # something took the place since: the previous output is only removed
    remove_stale_staging(tmp_path, "latest")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


def test_staging_names_are_told_apart_from_other_names() -> None:
    tag = writer_tag()
    assert staging_match(f".a.csv.{tag}.x1_y2z3a.tmp", "a.csv")
    assert staging_match(f".a.csv.{tag}.old.x1_y2z3a", "a.csv")["old"]  # type: ignore[index]
    assert not staging_match(f".a.csv.{tag}.x1_y2z3a.tmp", "a")
    assert not staging_match(f".b.csv.{tag}.x1_y2z3a.tmp", "a.csv")
    assert not staging_match(".a.csv.tmp", "a.csv")


def test_a_staged_file_has_the_permissions_of_a_new_file(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        place_file(tmp_path / "p.json", "{}\n", "--out")
    finally:
        os.umask(umask)
    assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == ["p.json"]


@pytest.mark.parametrize(("code", "line"), [
    (errno.ENOSPC, "no space left on device; free space or give another --out"),
    (errno.EDQUOT, "disk quota exceeded; free space or give another --out"),
    (errno.EROFS, "read-only file system; give another --out"),
    (errno.EACCES, "permission denied; give another --out or make it writable"),
    (errno.ENAMETOOLONG, "file name too long; give a shorter --out"),
    (errno.EIO, "Input/output error; give another --out"),
])
def test_os_errors_are_one_line_naming_the_option(code: int, line: str) -> None:
    err = write_error(OSError(code, os.strerror(code)), "--out", "runs/latest")
    assert str(err) == f"--out: cannot write runs/latest: {line}"


def test_a_failed_write_leaves_no_staging(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.fdopen

    class Full:  # a file on a full disk: opens, but no write succeeds
        def __init__(self, fd: int, *args: object, **kwargs: object) -> None:
            self.file = real(fd, *args, **kwargs)  # type: ignore[call-overload]

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *_: object) -> None:
            self.file.close()

        def write(self, _data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdopen", Full)
    with pytest.raises(ValueError, match=r"--out: cannot write .*p\.json: no space left"):
        place_file(tmp_path / "p.json", "{}\n", "--out")
    assert os.listdir(tmp_path) == []
