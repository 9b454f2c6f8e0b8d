"""The chaos test: ``run``, ``sweep`` and ``plan`` (sweep and plan with two workers) are
started as ``python -m sim.app.cli`` processes and stopped with SIGINT, SIGTERM and
SIGKILL at seeded random points; afterwards no process they started is alive
(tests/processes.py finds them by an environment tag), their output place holds either
the previous run intact or the new one complete, and the next run into it succeeds."""

from __future__ import annotations

import json
import random
import shutil
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from tests.processes import (
    COMMANDS,
    NEW,
    PREVIOUS,
    Command,
    kill_tagged,
    snapshot,
    staging,
    start,
    stop_and_time,
    survivors,
    wait_for,
)

runner = CliRunner()
pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                                reason="finds processes through Linux's /proc")


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
    def shown(snap: dict[str, bytes]) -> dict[str, bytes]:
        # Hidden names are staging: a SIGKILL may leave it (check_case allows that), and
        # it is not output.
        return {n: b for n, b in snap.items() if not n.startswith(".")}

    if shown(files) == shown(previous):
        return "previous"
    visible = sorted(shown(files))
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


