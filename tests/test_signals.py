"""Stop signals (sim/app/cli/stop.py, sim/app/runs/backends.py): SIGINT, SIGTERM and SIGHUP
end a command within about a second, its worker pools included, with its staged outputs
removed, one line saying what was kept and exit code 128 + the signal; SIGKILL of the
command leaves no worker behind. The chaos test is tests/test_chaos.py; the process
helpers are tests/processes.py.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.backends import Executor
from tests.processes import (
    COMMANDS,
    NEW,
    PREVIOUS,
    cmdlines,
    kill_tagged,
    snapshot,
    staging,
    start,
    stop_and_time,
    survivors,
    tagged,
    wait_for,
    workers_running,
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                                reason="finds processes through Linux's /proc")

runner = CliRunner()


# -- the local pool ------------------------------------------------------------------

def test_an_interrupted_map_ends_its_running_tasks_at_once() -> None:
    """A map left by an exception (here the progress callback's; Ctrl-C's in the CLI)
    ends the workers still running tasks instead of waiting for them."""
    workers: list[int] = []
    interrupted: list[float] = []

    def interrupt(done: int) -> None:
        workers.extend(p.pid for p in multiprocessing.active_children())
        interrupted.append(time.monotonic())
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"), Executor(2) as ex:
        ex.map(time.sleep, [0.0, 20.0], on_done=interrupt)  # one worker sleeps 20 s
    # far below the 20 s a wait would take, with room for a slow or loaded machine
    assert time.monotonic() - interrupted[0] < 5.0
    assert len(workers) == 2 and not multiprocessing.active_children()


PARENT = """
import time
from sim.app.runs.backends import Executor
if __name__ == "__main__":
    with Executor(2) as ex:
        ex.map(time.sleep, [60.0, 60.0])
"""


def test_no_worker_outlives_a_killed_parent(tmp_path: Path) -> None:
    """SIGKILL of the process holding a pool: its workers, the forkserver they were forked
    from and multiprocessing's resource tracker all end (each worker's lifeline closes)."""
    tag = uuid.uuid4().hex
    proc = start(["-c", PARENT], tmp_path, tag)
    try:
        wait_for(workers_running(tag, 2), proc, 60, tmp_path)
        proc.kill()
        proc.wait(10)
        assert survivors(tag, within=3.0) == []
    finally:
        kill_tagged(tag)


# -- the command line ----------------------------------------------------------------

BIG_SWEEP = ["sweep", "--num-requests", "20000", "--max-num-seqs", "64,128", "--workers", "2"]
BIG_PLAN = ["plan", "--num-requests", "50000", "--seeds", "0,1", "--slo-ttft", "0.5",
            "--workers", "2"]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "signum"), [
    pytest.param(BIG_SWEEP, signal.SIGINT, id="sweep-SIGINT"),
    pytest.param(BIG_PLAN, signal.SIGTERM, id="plan-SIGTERM"),
    pytest.param(BIG_SWEEP, signal.SIGHUP, id="sweep-SIGHUP")])
def test_a_stop_signal_ends_a_command_and_its_workers_within_a_second(
        tmp_path: Path, args: list[str], signum: int) -> None:
    """Ctrl-C (SIGINT), SIGTERM and SIGHUP while both workers compute a cell of several
    seconds: the command exits within a second with 128 + the signal and one line, and
    no process it started is left."""
    tag = uuid.uuid4().hex
    proc = start(["-m", "sim.app.cli", *args, "--out", "out"], tmp_path, tag)
    try:
        wait_for(workers_running(tag, 2), proc, 60, tmp_path)
        time.sleep(0.5)  # the workers are inside their tasks
        took = stop_and_time(proc, signum)
        assert survivors(tag, within=1.0) == []
    finally:
        kill_tagged(tag)
    assert proc.returncode == 128 + signum
    assert took < 2.0, f"{took:.2f} s"  # ~0.5 s measured: 0.1 s to the line, then exit
    name = signal.Signals(signum).name
    assert (tmp_path / "stderr").read_text().splitlines()[-1] == (
        f"stopped by {name}: nothing written to out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stderr", "stdout"]


@pytest.mark.slow
def test_sigkill_of_a_sweep_leaves_no_worker(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    proc = start(["-m", "sim.app.cli", *BIG_SWEEP, "--out", "out"], tmp_path, tag)
    try:
        wait_for(workers_running(tag, 2), proc, 60, tmp_path)
        time.sleep(0.5)
        proc.kill()
        proc.wait(10)
        assert survivors(tag, within=3.0) == []
    finally:
        kill_tagged(tag)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "signum"), [
    pytest.param("run", signal.SIGTERM, id="run-SIGTERM"),
    pytest.param("sweep", signal.SIGINT, id="sweep-SIGINT")])
def test_a_stop_signal_while_writing_removes_the_staging(tmp_path: Path, name: str,
                                                         signum: int) -> None:
    """The signal arrives while the output is being written (a run directory staged
    beside its place, sweep's files staged inside theirs): the staging is removed, the
    previous output is intact, and the line says so."""
    cmd, out = COMMANDS[name], tmp_path / "out"
    assert runner.invoke(app, cmd.argv(PREVIOUS, out, workers=1)).exit_code == 0
    before = snapshot(out)
    tag = uuid.uuid4().hex
    proc = start(["-m", "sim.app.cli", *cmd.argv(NEW, out, workers=2)], tmp_path, tag)
    try:
        wait_for(lambda: bool(staging(tmp_path) or staging(out)), proc, 120, tmp_path)
        stop_and_time(proc, signum)
        assert survivors(tag, within=1.0) == []
    finally:
        kill_tagged(tag)
    assert proc.returncode == 128 + signum
    assert staging(tmp_path) == [] and staging(out) == []
    last = (tmp_path / "stderr").read_text().splitlines()[-1]
    stopped = f"stopped by {signal.Signals(signum).name}: "
    if snapshot(out) == before:
        assert last == f"{stopped}nothing written to {out}; what was there is as it was"
    else:  # the stop came while the staged files were renamed in: the new set, whole
        assert last == f"{stopped}{out} was written in full before the signal"
        assert sorted(snapshot(out)) == sorted(before)



# -- Ray -----------------------------------------------------------------------------

#: Ray's agents, which outlive a driver killed by SIGKILL by a minute: they see their raylet
#: die at once, then wait 60 s to report it to the GCS, dead too (ray 2.60:
#: ray/_private/utils.py publish_error_to_driver's fixed timeout), idle, and exit.
RAY_AGENTS = ("DashboardAgent", "RuntimeEnvAgent", "dashboard/agent.py", "runtime_env/agent")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="ray is not installed (pip install 'servesim[ray]')")
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGKILL, id="SIGKILL"),
                                    pytest.param(signal.SIGTERM, id="SIGTERM")])
def test_a_stopped_ray_sweep_leaves_nothing(tmp_path: Path, signum: int) -> None:
    """A sweep on the local Ray instance it started, stopped while Ray's workers compute:
    by SIGTERM the tasks are cancelled and Ray shut down (2.2 s measured, most of it
    ray.shutdown), with the usual line and 143, and nothing is left; by SIGKILL Ray's
    GCS, raylet and workers fate-share with the driver (gone 2.3 s after it, measured),
    and only its two idle agents stay their minute (RAY_AGENTS)."""
    tag = uuid.uuid4().hex
    proc = start(["-m", "sim.app.cli", *BIG_SWEEP[:-2], "--backend", "ray", "--out", "out"],
                 tmp_path, tag)
    try:
        wait_for(lambda: any("ray::_run_shipped" in c for c in cmdlines(tagged(tag))), proc, 180,
                 tmp_path)
        stop_and_time(proc, signum)
        ignoring = RAY_AGENTS if signum == signal.SIGKILL else ()
        assert survivors(tag, within=10.0, ignoring=ignoring) == []
    finally:
        kill_tagged(tag)
    assert proc.returncode == (-signum if signum == signal.SIGKILL else 128 + signum)
    assert not (tmp_path / "out").exists()


# -- the pieces ----------------------------------------------------------------------

def test_the_line_says_what_was_kept(tmp_path: Path) -> None:
    from sim.app.cli.stop import Stopped, kept_line

    old, new, none = tmp_path / "old", tmp_path / "new.html", tmp_path / "none"
    old.mkdir()
    (old / "sweep.csv").write_text("x\n")
    os.utime(old / "sweep.csv", (1000.0, 1000.0))
    new.write_text("<html></html>")
    since = new.stat().st_mtime - 1.0
    assert kept_line(Stopped(signal.SIGTERM), [old, new, none], since) == (
        f"stopped by SIGTERM: nothing written to {old}; what was there is as it was; "
        f"{new} was written in full before the signal; nothing written to {none}")
    assert kept_line(Stopped(signal.SIGINT), [], since) == (
        "stopped by SIGINT: nothing is half-written (outputs are written whole or not at "
        "all)")


def test_the_outputs_of_a_command_line_are_its_out_html_and_png() -> None:
    from sim.app.cli.main import outputs as command_outputs

    assert command_outputs(["sweep", "--max-num-seqs", "4,8"]) == [Path("runs/sweep")]
    assert command_outputs(["plan", "--out", "p", "--slo-ttft", "1"]) == [Path("p")]
    assert command_outputs(["diagram", "--html", "d.html", "--png", "d.png"]) == [
        Path("d.html"), Path("d.png")]
    assert command_outputs(["run"]) == [Path("runs/latest")]  # run.py's defaults
    assert command_outputs(["run", "--compare", "static,chunked"]) == [Path("runs/compare")]
    assert command_outputs(["list"]) == command_outputs(["--version"]) == []


def test_a_stop_rebuilt_from_its_args_is_the_same_stop() -> None:
    """SimPy re-raises a process's exception as ``type(e)(*e.args)``."""
    from sim.app.cli.stop import Stopped, exit_code

    stop = Stopped(signal.SIGTERM)
    again = type(stop)(*stop.args)
    assert again.signum == signal.SIGTERM and exit_code(again) == 143
    assert not isinstance(stop, Exception)  # no `except Exception` stops it
