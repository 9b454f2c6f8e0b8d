"""Staging names and who may clear them (sim/staging.py): a staging name records the
writing process (pid and start time), the staging of a writer that no longer runs is
removed, a running writer's is kept even when its pid is reused, a previous output moved
aside by an unfinished swap is put back, and OS errors become one line naming the option;
and, through the commands, that a run killed while staging or swapping leaves nothing the
next run into the same place does not clear."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TextIO

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
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


runner = CliRunner()
RUN = ["run", "--num-requests", "20", "--step-time", "0.01"]
SWEEP = ["sweep", "--num-requests", "10", "--step-time", "0.01", "--workers", "1"]


# -- a killed write leaves nothing the next write into the place does not clear ------------

ROOT = Path(__file__).resolve().parents[1]


def _killed_child(script: str, *args: str) -> None:
    """Run ``script`` in a Python process that kills itself with SIGKILL."""
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL


KILLED_WHILE_STAGING = """
import os, signal, sys
from pathlib import Path
from sim.app.runs.out_dir import stage_dir

def write(tmp):
    (tmp / "requests.csv").write_text("request_id,arrival_time\\n0,")  # cut mid-row
    os.kill(os.getpid(), signal.SIGKILL)

stage_dir(Path(sys.argv[1]), write)
"""


def test_the_staging_of_a_killed_run_is_removed_by_the_next_run(tmp_path: Path) -> None:
    out = tmp_path / "latest"
    _killed_child(KILLED_WHILE_STAGING, str(out))
    debris = [p for p in tmp_path.iterdir() if p.name.startswith(".latest.")]
    assert len(debris) == 1 and (debris[0] / "requests.csv").exists()
    res = runner.invoke(app, [*RUN, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


KILLED_WHILE_SWAPPING = """
import os, signal, sys
from pathlib import Path
from sim.app.runs.out_dir import commit_dirs, stage_dir

out = Path(sys.argv[1])
tmp = stage_dir(out, lambda t: (t / "config.json").write_text('{"servesim_version": "new"}'))
real = os.replace

def replace(src, dst):  # killed once the previous run is moved aside
    real(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)

os.replace = replace
commit_dirs([(tmp, out)])
"""


def test_a_swap_killed_halfway_is_cleared_by_the_next_run(tmp_path: Path) -> None:
    out = tmp_path / "latest"
    assert runner.invoke(app, [*RUN, "--out", str(out)]).exit_code == 0
    _killed_child(KILLED_WHILE_SWAPPING, str(out))
    assert not out.exists()  # the previous run is aside, the new one staged
    assert len([p for p in tmp_path.iterdir() if p.name.startswith(".latest.")]) == 2
    res = runner.invoke(app, [*RUN, "--seed", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]
    assert '"seed": 1' in (out / "config.json").read_text()


def test_a_swap_killed_halfway_puts_the_previous_run_back(tmp_path: Path) -> None:
    from sim.app.runs.out_dir import remove_stale_staging

    out = tmp_path / "latest"
    assert runner.invoke(app, [*RUN, "--out", str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _killed_child(KILLED_WHILE_SWAPPING, str(out))
    assert len(remove_stale_staging(tmp_path, "latest")) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# -- an OS error while writing is one line naming the option --------------------------------


def test_no_space_while_writing_a_run_is_one_line(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def full(f: TextIO, table: object) -> None:  # rows streamed into requests.csv
        f.write("0,")  # part written, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f.name)

    monkeypatch.setattr("sim.record_spool.write_csv_rows", full)
    out = tmp_path / "latest"
    res = runner.invoke(app, [*RUN, "--out", str(out)])
    assert res.exit_code == 1
    assert res.output.strip().splitlines()[-1] == (
        f"error: --out: cannot write {out}: no space left on device; free space or give "
        "another --out")
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_folder_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    if os.geteuid() == 0:  # root ignores permissions: /sys is read-only even to root
        folder = Path("/sys")
        if not folder.is_dir() or _can_make(folder):
            pytest.skip("running as root, and no read-only folder here")
    out = folder / "servesim-out"
    for command in (RUN, SWEEP):
        res = runner.invoke(app, [*command, "--out", str(out)])
        assert res.exit_code == 1, res.output
        line = res.output.strip().splitlines()[-1]
        assert line.startswith(f"error: --out: cannot write {out}: ") and line.endswith(
            "; give another --out or make it writable"), line


def _can_make(folder: Path) -> bool:
    try:
        (folder / "servesim-probe").mkdir()
    except OSError:
        return False
    (folder / "servesim-probe").rmdir()
    return True
