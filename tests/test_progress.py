"""Progress of long commands (sim/app/cli/common.py): the time left at the mean pace so
far, the bar's columns on a terminal, the plain lines every few seconds elsewhere (on a
fake clock), and through the CLI: lines on stderr only, stdout unchanged, none for a run
that ends within the first interval."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress
from typer.testing import CliRunner

from sim.app.cli import common
from sim.app.cli.common import (
    ProgressLines,
    TimeLeftColumn,
    duration_text,
    progress_bar,
    time_left_s,
    time_left_text,
)
from sim.app.cli.main import app


class FakeClock:
    """Wall-clock seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def lines_on(clock: FakeClock, interval_s: float = 5.0) -> tuple[ProgressLines, list[str]]:
    lines: list[str] = []
    return ProgressLines(lines.append, interval_s, clock), lines


def test_time_left_is_the_mean_pace_so_far() -> None:
    assert time_left_s(6.0, 300, 1000) == pytest.approx(14.0)  # 700 left at 50 per s
    assert time_left_s(6.0, 1000, 1000) == 0.0
    assert time_left_s(6.0, 0, 1000) is None  # no pace yet
    assert time_left_s(6.0, 5, None) is None
    assert time_left_text(6.0, 300, 1000) == "~14 s left"
    assert time_left_text(6.0, 1000, 1000) == ""  # done: nothing to estimate
    assert time_left_text(6.0, 0, 1000) == ""


@pytest.mark.parametrize(("seconds", "text"), [
    (0.0, "0 s"), (38.4, "38 s"), (89.0, "89 s"), (90.0, "2 min"), (720.0, "12 min"),
    (5340.0, "89 min"), (5400.0, "1.5 h"), (8280.0, "2.3 h")])
def test_duration_text(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_a_line_every_interval_with_the_time_left() -> None:
    clock = FakeClock()
    bar, lines = lines_on(clock)
    with bar:
        task = bar.add_task("simulating", total=1000, unit="requests")
        for t, done in ((2.0, 100), (6.0, 300), (8.0, 400), (11.0, 500), (12.0, 1000)):
            clock.now_s = t
            bar.update(task, completed=done)
    assert lines == [
        "servesim: simulating: 300/1,000 requests, 6 s elapsed, ~14 s left",
        "servesim: simulating: 500/1,000 requests, 11 s elapsed, ~11 s left",
    ]


def test_no_line_for_work_that_ends_within_the_first_interval() -> None:
    clock = FakeClock()
    bar, lines = lines_on(clock)
    task = bar.add_task("simulating", total=10, unit="runs")
    for k in range(1, 11):
        clock.now_s = 0.49 * k
        bar.update(task, completed=k)
    assert lines == []


def test_no_time_left_before_the_first_unit_and_a_reset_starts_a_phase_afresh() -> None:
    clock = FakeClock()
    bar, lines = lines_on(clock)
    task = bar.add_task("planning", total=1)
    clock.now_s = 6.0
    bar.update(task, completed=0)
    clock.now_s = 20.0
    bar.reset(task, total=10, description="simulating probes")
    clock.now_s = 26.0
    bar.update(task, completed=2)
    assert lines == ["servesim: planning: 0/1, 6 s elapsed",
                     "servesim: simulating probes: 2/10, 6 s elapsed, ~24 s left"]


def test_the_terminal_bar_shows_the_count_and_the_time_left() -> None:
    clock = FakeClock()
    bar = progress_bar(terminal=True, clock=clock)
    assert isinstance(bar, Progress)
    assert any(isinstance(c, TimeLeftColumn) for c in bar.columns)
    task = bar.add_task("simulating", total=1000, unit="requests")
    clock.now_s = 10.0
    bar.update(task, completed=250)
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(
        bar.make_tasks_table(bar.tasks))
    row = out.getvalue()
    assert "250/1,000 requests" in row and "0:00:10" in row and "~30 s left" in row, row


def test_off_a_terminal_progress_is_lines() -> None:
    assert isinstance(progress_bar(terminal=False), ProgressLines)


PROGRESS_LINE = re.compile(r"^servesim: simulating: [\d,]+/([\d,]+) (requests|runs), "
                           r"\d+ s elapsed(, ~\d+ s left)?$")


def progress_lines(stderr: str, total: str, unit: str) -> list[str]:
    """The lines of ``stderr``, each checked to be a progress line over ``total`` units."""
    lines = stderr.splitlines()
    for line in lines:
        m = PROGRESS_LINE.match(line)
        assert m is not None and m.groups()[:2] == (total, unit), line
    return lines


def test_run_off_a_terminal_prints_lines_on_stderr_and_stdout_is_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    args = ["run", "--num-requests", "300", "--rate", "20", "--out", str(tmp_path / "r")]
    quiet = runner.invoke(app, args)  # ends within the first interval: no line
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""
    monkeypatch.setattr(common, "LINE_INTERVAL_S", 0.0)  # a line at every report
    loud = runner.invoke(app, args)
    assert loud.exit_code == 0, loud.output
    lines = progress_lines(loud.stderr, "300", "requests")
    assert len(lines) >= 50  # reported about 100 times over the arrival span
    assert any(line.endswith(" left") for line in lines)
    assert loud.stdout == quiet.stdout


def test_compare_counts_every_cells_requests_on_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "LINE_INTERVAL_S", 0.0)
    res = CliRunner().invoke(app, ["run", "--num-requests", "200", "--rate", "20",
                                   "--compare", "continuous,chunked",
                                   "--out", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    lines = progress_lines(res.stderr, "400", "requests")
    done = [int(line.split()[2].split("/")[0].replace(",", "")) for line in lines]
    assert done == sorted(done) and done[-1] == 400 and any(200 < d < 400 for d in done)


def test_sweep_counts_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "LINE_INTERVAL_S", 0.0)
    res = CliRunner().invoke(app, ["sweep", "--num-requests", "40", "--max-num-seqs", "8,16",
                                   "--workers", "1", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    lines = progress_lines(res.stderr, "2", "runs")
    assert [line.split(",")[0] for line in lines] == ["servesim: simulating: 1/2 runs",
                                                      "servesim: simulating: 2/2 runs"]
