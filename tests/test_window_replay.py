"""Window-parallel replay (sim/app/runs/window_replay.py): the split by hand, a merge
that reproduces a serial run exactly where no request crosses a window, the records
written as the windows complete (backends.Executor.for_each) byte for byte as the merge
held in memory, any worker count and backend giving the same files, and the CLI's
refusals."""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.backends import Executor
from sim.app.runs.durations import parse_duration
from sim.app.runs.run_files import write_run
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from sim.app.runs.window_replay import (
    Window,
    WindowSettings,
    simulate_windows,
    split_windows,
)

INF = math.inf


def test_windows_split_the_arrivals_by_hand() -> None:
    t = np.array([0.0, 1.0, 2.0, 5.0, 6.0, 11.0])
    # windows [0, 5), [5, 10), [10, 15); a 3.5 s warm-up reaches back to 1.5 (the
    # arrival at 2.0) and to 6.5 (none: 6.0 is earlier)
    assert split_windows(t, 5.0, 3.5) == [
        Window(0, 0, 0, 3, -INF, 5.0), Window(1, 2, 3, 5, 5.0, 10.0),
        Window(2, 5, 5, 6, 10.0, INF)]
    # [5, 10) holds no arrival: it joins [0, 5), whose steps then run to 10
    assert split_windows(np.array([0.0, 1.0, 12.0]), 5.0, 0.0) == [
        Window(0, 0, 0, 2, -INF, 10.0), Window(1, 2, 2, 3, 10.0, INF)]
    assert split_windows(np.array([], dtype=np.float64), 5.0, 0.0) == []


def test_durations_read_with_units() -> None:
    assert [parse_duration(s, "--warmup") for s in ("90", "10m", "1.5h", "1d", "0")] == [
        90.0, 600.0, 5400.0, 86400.0, 0.0]
    with pytest.raises(ValueError, match="--warmup must be a duration"):
        parse_duration("1w", "--warmup")
    with pytest.raises(ValueError, match="--parallel-windows must be a duration > 0"):
        WindowSettings.parse("0", None, None, None)


def _sparse() -> RunConfig:
    # A request every 10 s, each done in well under 10 s (at most 128 tokens of 0.01 s
    # steps): no request crosses a 60 s window boundary, so windows are exact.
    return RunConfig(num_requests=60, arrival="constant", rate=0.1, step_time=0.01,
                     max_tokens=128)


def test_windows_without_overlap_reproduce_the_serial_run() -> None:
    prep = prepare(_sparse())
    serial = simulate_prepared(prep)
    merged = simulate_windows(prep, 60.0, 0.0, workers=1)
    assert len(split_windows(prep.workload.arrival_time, 60.0, 0.0)) == 10
    for name in ("request_table", "step_table"):
        a, b = getattr(serial, name), getattr(merged, name)
        assert list(a) == list(b)
        for c in a:
            np.testing.assert_array_equal(a[c], b[c], err_msg=f"{name}.{c}")
    assert merged.summary == serial.summary


def test_warmup_records_are_dropped_and_steps_kept_once() -> None:
    cfg = RunConfig(num_requests=400, rate=20.0, step_time=0.02, max_num_seqs=8)
    prep = prepare(cfg)  # busy: a queue builds, so requests cross window boundaries
    merged = simulate_windows(prep, 5.0, 2.0, workers=1)
    assert list(merged.request_table["request_id"]) == list(prep.workload.request_id)
    start = merged.step_table["start_time"]
    assert np.all(np.diff(start) > 0)
    assert merged.summary["num_requests"] == 400 == merged.summary["num_finished"]


def _slept(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_results_are_handed_over_in_order_as_they_come() -> None:
    events: list[tuple[str, float]] = []
    with Executor(2) as ex:  # item 0 at once, item 1 after 1 s
        ex.for_each(_slept, [0.0, 1.0], lambda r: events.append(("result", r)),
                    lambda n: events.append(("done", n)))
    # item 0's result is handed over before the slow item is done, not after the map
    assert events == [("result", 0.0), ("done", 1), ("result", 1.0), ("done", 2)]


@pytest.mark.parametrize(("cfg", "window", "warmup", "full_steps"), [
    (RunConfig(num_requests=400, rate=20.0, step_time=0.02, max_num_seqs=8), "5s", "2s",
     False),
    (RunConfig(num_requests=400, rate=20.0, step_time=0.02, max_num_seqs=8), "5s", "2s",
     True),
    (RunConfig(scenario="prefix_repetition", prefix_cache="block", num_requests=300,
               rate=10.0, step_time=0.01), "10s", "3s", False),
])
def test_written_as_windows_complete_equals_the_merge_held_in_memory(
        tmp_path: Path, cfg: RunConfig, window: str, warmup: str, full_steps: bool) -> None:
    settings = WindowSettings.parse(window, warmup, None, 2)
    prep = settings.labelled(prepare(cfg))
    held = settings.simulate(prep)
    write_run(tmp_path / "held", prep, held, full_steps=full_steps)
    summary = settings.write(tmp_path / "spooled", prep, full_steps)
    assert summary == held.summary
    for f in ("requests.csv", "steps.csv", "summary.json", "config.json"):
        assert (tmp_path / "held" / f).read_bytes() == (tmp_path / "spooled" / f).read_bytes()
    assert sorted(p.name for p in (tmp_path / "spooled").iterdir()) == [
        "config.json", "requests.csv", "steps.csv", "summary.json"]  # no spill left


@pytest.mark.parametrize("backend", [
    "local",
    pytest.param("ray", marks=pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                                 reason="ray is not installed")),
])
def test_files_do_not_depend_on_workers_or_backend(tmp_path: Path, backend: str) -> None:
    args = ["run", "--num-requests", "300", "--rate", "20", "--step-time", "0.02",
            "--max-num-seqs", "8", "--parallel-windows", "4s", "--warmup", "1s"]
    one = CliRunner().invoke(app, [*args, "--workers", "1", "--out", str(tmp_path / "a")])
    two = CliRunner().invoke(app, [*args, "--backend", backend, "--workers", "2",
                                   "--out", str(tmp_path / "b")])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    for f in ("requests.csv", "steps.csv", "summary.json", "config.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert "windows of 4 s, warm-up 1 s" in (tmp_path / "a" / "config.json").read_text()


@pytest.mark.parametrize(("args", "needle"), [
    (["--warmup", "10m"], "--warmup applies only with --parallel-windows"),
    (["--parallel-windows", "1x"], "--parallel-windows must be a duration"),
    (["--parallel-windows", "1h", "--backend", "spark"], "--backend must be one of"),
    (["--parallel-windows", "1h", "--workers", "0"], "--workers must be an integer >= 1"),
    (["--parallel-windows", "1h", "--concurrency", "4"], "closed-loop users"),
    (["--parallel-windows", "1h", "--replicas", "2"], "--replicas 1"),
    (["--parallel-windows", "1h", "--disagg", "1P1D"], "no --disagg"),
    (["--parallel-windows", "1h", "--compare", "static,chunked"], "without --compare"),
])
def test_bad_window_options_fail_in_one_line(tmp_path: Path, args: list[str],
                                             needle: str) -> None:
    res = CliRunner().invoke(app, ["run", "--num-requests", "20", "--step-time", "0.01",
                                   *args, "--out", str(tmp_path / "r")])
    assert res.exit_code == 1 and needle in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "r").exists()
