"""Stop signals (sim/app/cli/stop.py, sim/app/runs/backends.py): SIGINT, SIGTERM and SIGHUP
end a command within about a second, its worker pools included, with its staged outputs
removed, one line saying what was kept and exit code 128 + the signal; SIGKILL of the
command leaves no worker behind.

The chaos test starts ``run``, ``sweep`` and ``plan`` (sweep and plan with two workers) as
``python -m sim.app.cli`` processes and stops them at seeded random points; afterwards no
process they started is alive, their output place holds either the previous run intact
or the new one complete, and the next run into it succeeds. A process started by a
command is found by a tag in its environment (/proc/PID/environ), which every process it
starts inherits: an orphan is re-parented, so a walk of the process tree would miss it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.backends import Executor

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                                reason="finds processes through Linux's /proc")

ROOT = Path(__file__).resolve().parents[1]
TAG = "SERVESIM_TEST_SIGNALS"
runner = CliRunner()


# -- processes -----------------------------------------------------------------------

def tagged(tag: str) -> list[int]:
    """The live processes whose environment holds TAG=tag (a zombie's is empty)."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def cmdlines(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                       .decode(errors="replace")[:120])
        except OSError:
            continue
    return out


def survivors(tag: str, within: float, ignoring: tuple[str, ...] = ()) -> list[str]:
    """The command lines of tagged processes still alive ``within`` seconds from now, but
    those holding one of ``ignoring`` (polled; empty as soon as none is left)."""
    deadline = time.monotonic() + within
    while True:
        left = [c for c in cmdlines(tagged(tag)) if not any(i in c for i in ignoring)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def kill_tagged(tag: str) -> None:
    """SIGKILL whatever a test's child left running, so that a failure leaks nothing."""
    for pid in tagged(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start(argv: list[str], cwd: Path, tag: str) -> subprocess.Popen[bytes]:
    """``argv`` in a new Python process tagged ``tag``, output to cwd/stdout and
    cwd/stderr (files: a pipe held open by an orphan would hang the reader)."""
    env = {**os.environ, TAG: tag, "PYTHONPATH": str(ROOT)}
    with open(cwd / "stdout", "wb") as out, open(cwd / "stderr", "wb") as err:
        return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=out,
                                stderr=err)


def wait_for(what: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float,
             cwd: Path) -> None:
    """Poll until ``what()`` holds; fail when ``proc`` ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not what():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"not ready (exit {proc.returncode}): "
                        f"{(cwd / 'stderr').read_text(errors='replace')[-2000:]}")
        time.sleep(0.005)


def stop_and_time(proc: subprocess.Popen[bytes], signum: int, timeout: float = 60) -> float:
    """Send ``signum`` and wait for the process; seconds until it exited."""
    t0 = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout)
    return time.monotonic() - t0


def workers_running(tag: str, n: int) -> Callable[[], bool]:
    """Whether the tagged process tree has its forkserver and ``n`` workers."""
    return lambda: sum("forkserver" in c for c in cmdlines(tagged(tag))) >= n + 1


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
    assert time.monotonic() - interrupted[0] < 1.0
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


def staging(parent: Path) -> list[str]:
    """Hidden entries of ``parent``: staging (sim/staging.py names start with a dot)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (hidden ones included) by relative name: its bytes."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


# -- the chaos test ------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    """A small workload of one command: its arguments (without --out, the seed and the
    workers), what it writes into --out, which of those two runs of the same arguments
    write byte for byte alike (the others hold the wall time), and how long after its
    first line it may be stopped (seconds: its work, its writing and a little past its
    end, as measured on a shared two-core machine)."""

    args: tuple[str, ...]
    seed_option: str
    files: tuple[str, ...]
    exact: tuple[str, ...]
    span: float
    workers: bool = True  # takes --workers

    def argv(self, seed: int, out: Path, workers: int) -> list[str]:
        return [*self.args, self.seed_option, str(seed), "--out", str(out),
                *(["--workers", str(workers)] if self.workers else [])]


RUN_FILES = ("config.json", "requests.csv", "steps.csv", "summary.json")
COMMANDS = {
    "run": Command(("run", "--num-requests", "300"), "--seed", RUN_FILES, RUN_FILES, 1.0,
                   workers=False),
    "sweep": Command(("sweep", "--num-requests", "20", "--max-num-seqs", "8,16"), "--seeds",
                     ("sweep.csv", "sweep.html", "sweep.json"), ("sweep.csv", "sweep.json"),
                     3.0),
    "plan": Command(("plan", "--num-requests", "20", "--max-probes", "2", "--slo-ttft", "0.5"),
                    "--seeds", ("capacity.html", "capacity.md", "plan.json"), (), 3.0),
}
PREVIOUS, NEW = 1, 2  # the seed of the run already in place, and of the one stopped
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each command's output for the seed PREVIOUS, written in this process."""
    root = tmp_path_factory.mktemp("previous")
    made = {}
    for name, cmd in COMMANDS.items():
        res = runner.invoke(app, cmd.argv(PREVIOUS, root / name, workers=1))
        assert res.exit_code == 0, res.output
        made[name] = root / name
    return made


@dataclass
class Case:
    """One command stopped by ``signum`` ``delay`` seconds after its first output line
    (its options read and checked: the work begins)."""

    name: str
    signum: int
    delay: float
    where: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    returncode: int | None = None
    took: float = 0.0

    @property
    def out(self) -> Path:
        return self.where / "out"

    def play(self) -> None:
        proc = start(["-m", "sim.app.cli", *COMMANDS[self.name].argv(NEW, self.out, 2)],
                     self.where, self.tag)
        try:
            wait_for(lambda: (self.where / "stdout").stat().st_size > 0, proc, 120,
                     self.where)
        except BaseException:
            proc.kill()
            raise
        time.sleep(self.delay)
        self.took = stop_and_time(proc, self.signum)
        self.returncode = proc.returncode


def play_all(cases: list[Case]) -> None:
    """Play the cases at once, each on a thread of its own; re-raise the first failure."""
    errors: list[BaseException] = []

    def play(case: Case) -> None:
        try:
            case.play()
        except BaseException as e:  # reported below, on the test's thread
            errors.append(e)

    threads = [threading.Thread(target=play, args=(c,)) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def check_case(case: Case, previous: Path) -> None:
    """After the stop: nothing the command started is alive; it ended as its signal
    asks; its place holds the previous output intact or the new one complete; no
    staging is left but by SIGKILL; the next run into the place succeeds (and is what
    the stopped run, when complete, wrote)."""
    cmd = COMMANDS[case.name]
    assert survivors(case.tag, within=3.0) == [], case
    stderr = (case.where / "stderr").read_text(errors="replace")
    # 0: it had finished; -signum: stopped while Python started or finished (importing,
    # nothing started or written yet; or past the end, its handlers gone).
    assert case.returncode in (0, -case.signum, 128 + case.signum), (case, stderr)
    if case.returncode == 128 + case.signum:
        assert stderr.splitlines()[-1].startswith(
            f"stopped by {signal.Signals(case.signum).name}: "), stderr
        # Loose: three commands at once on a shared machine, and a stop while workers
        # start waits for the forkserver's start (the latency tests above are strict).
        assert case.took < 10.0, case
    if case.signum != signal.SIGKILL:
        assert staging(case.where) == [] and staging(case.out) == [], case
    stopped = snapshot(case.out)
    res = runner.invoke(app, cmd.argv(NEW, case.out, workers=1))
    assert res.exit_code == 0, (case, res.output)
    assert staging(case.where) == [] and staging(case.out) == [], case
    new = snapshot(case.out)
    assert sorted(new) == sorted(cmd.files) and all(whole(n, new[n]) for n in new), case
    state = output_state(stopped, snapshot(previous), new, cmd)
    assert state == "previous" or state == "new", (case, state)
    assert state == "new" or case.returncode != 0, case


def output_state(files: dict[str, bytes], previous: dict[str, bytes],
                 new: dict[str, bytes], cmd: Command) -> str:
    """"previous" when ``files`` are byte for byte the ``previous`` run's; "new" when they
    are the new run's, complete: byte for byte ``new``'s where two runs agree, whole
    files otherwise; else what is wrong."""
    if files == previous:
        return "previous"
    visible = sorted(n for n in files if not n.startswith("."))
    if visible != sorted(cmd.files):
        return f"files {visible}"
    for name in cmd.files:
        if name in cmd.exact and files[name] != new[name]:
            return f"{name} differs from an uninterrupted run's"
        if not whole(name, files[name]):
            return f"{name} is cut short"
    return "new"


def whole(name: str, data: bytes) -> bool:
    """Whether ``data`` is a whole file of its kind (not cut short)."""
    if name.endswith(".json"):
        try:
            json.loads(data)
        except ValueError:
            return False
        return True
    if name.endswith(".html"):
        return data.rstrip().endswith(b"</html>")
    return data.endswith(b"\n")


def chaos(tmp_path: Path, previous: dict[str, Path], pairs: list[tuple[str, int]],
          rng: random.Random) -> None:
    """Stop each (command, signal) of ``pairs`` at a random point of its span after its
    first line, all at once, then check each (check_case)."""
    cases = []
    for i, (name, signum) in enumerate(pairs):
        case = Case(name, signum, rng.uniform(0.0, COMMANDS[name].span),
                    tmp_path / f"{i}-{name}")
        case.where.mkdir()
        shutil.copytree(previous[name], case.out)
        cases.append(case)
    try:
        play_all(cases)
        for case in cases:
            check_case(case, previous[case.name])
    finally:
        for case in cases:
            kill_tagged(case.tag)


def latin_rounds(rng: random.Random) -> list[list[tuple[str, int]]]:
    """Three rounds in which every command meets every signal once (a Latin square in a
    random order)."""
    names, signals = list(COMMANDS), list(SIGNALS)
    rng.shuffle(signals)
    rounds = [[(n, signals[(i + r) % 3]) for i, n in enumerate(names)] for r in range(3)]
    rng.shuffle(rounds)
    return rounds


def test_chaos(tmp_path: Path, previous: dict[str, Path]) -> None:
    """run, sweep and plan at once, each stopped by one of SIGINT, SIGTERM and SIGKILL at
    a seeded random point."""
    rng = random.Random(24)
    chaos(tmp_path, previous, latin_rounds(rng)[0], rng)


@pytest.mark.slow
def test_chaos_every_command_with_every_signal(tmp_path: Path,
                                               previous: dict[str, Path]) -> None:
    """Every command with every signal, at random points (three rounds of three)."""
    rng = random.Random(2024)
    for r, pairs in enumerate(latin_rounds(rng)):
        (tmp_path / f"round{r}").mkdir()
        chaos(tmp_path / f"round{r}", previous, pairs, rng)


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
        wait_for(lambda: any("ray::run_cell" in c for c in cmdlines(tagged(tag))), proc, 180,
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
