"""sim/app/reports/run_dir.py's checks of a run directory on read: a directory cut short or
edited (rows missing, steps missing, NaN or negative values, infinite figures) is refused
by ``servesim report`` with one line naming the file; a run that is odd but real (every
request rejected, so no step) is drawn with a warning. Every case starts from a real run
written into tmp_path and changes one thing by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.reports.run_dir import load_run

runner = CliRunner()
NUM_REQUESTS = 40


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of NUM_REQUESTS requests at 10 ms a step, every one finished."""
    out = tmp_path_factory.mktemp("real") / "run"
    res = runner.invoke(app, ["run", "--num-requests", str(NUM_REQUESTS), "--step-time",
                              "0.01", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def copy_of(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def report(run: Path, tmp_path: Path) -> tuple[int, list[str]]:
    """``servesim report RUN``'s exit code and stderr lines."""
    res = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "r.html")])
    return res.exit_code, res.stderr.splitlines()


def edit_csv(run: Path, file: str, line: int, column: str, value: str) -> None:
    """Set ``column`` of the file's ``line`` (1 = the header) to ``value``, as text."""
    lines = (run / file).read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[line - 1].split(",")
    fields[header.index(column)] = value
    lines[line - 1] = ",".join(fields)
    (run / file).write_text("\n".join(lines) + "\n")


def edit_summary(run: Path, *path: str, value: object) -> None:
    summary = json.loads((run / "summary.json").read_text())
    node = summary
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (run / "summary.json").write_text(json.dumps(summary))


def assert_refused(run: Path, tmp_path: Path, message: str) -> None:
    code, lines = report(run, tmp_path)
    assert code == 1 and len(lines) == 1, lines
    assert lines[0] == f"error: run directory {run}{message}"
    assert not (tmp_path / "r.html").exists()


def test_a_real_run_loads_without_a_warning(real_run: Path, tmp_path: Path) -> None:
    warnings: list[str] = []
    data = load_run(real_run, warn=warnings.append)
    assert len(data.requests) == NUM_REQUESTS and len(data.steps) > 0 and warnings == []
    code, lines = report(real_run, tmp_path)
    assert code == 0 and lines == []


def test_requests_cut_mid_row_is_refused(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    lines = (run / "requests.csv").read_text().splitlines(keepends=True)
    (run / "requests.csv").write_text(lines[0] + lines[1][: len(lines[1]) // 2])
    assert_refused(run, tmp_path, f": requests.csv has 1 rows but summary.json counts "
                                  f"{NUM_REQUESTS} requests (cut short or edited; re-run)")


def test_steps_with_only_a_header_are_refused(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    header = (run / "steps.csv").read_text().splitlines()[0]
    (run / "steps.csv").write_text(header + "\n")
    assert_refused(run, tmp_path, f": steps.csv has no rows, but {NUM_REQUESTS} requests got "
                                  "a first token (cut short or edited; re-run)")


def test_a_nan_step_row_is_refused(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    edit_csv(run, "steps.csv", 3, "duration_s", "")
    assert_refused(run, tmp_path, ": steps.csv line 3: duration_s is nan; a step's values "
                                  "are finite and >= 0")


def test_a_negative_step_count_is_refused(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    edit_csv(run, "steps.csv", 2, "num_seqs", "-1")
    assert_refused(run, tmp_path, ": steps.csv line 2: num_seqs is -1; a step's values "
                                  "are finite and >= 0")


def test_a_step_row_standing_for_no_step_is_refused(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    edit_csv(run, "steps.csv", 2, "num_steps", "0")
    assert_refused(run, tmp_path, ": steps.csv line 2: num_steps is 0; a row stands for a "
                                  "whole number >= 1 of steps")


def test_a_negative_ttft_is_refused(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    edit_csv(run, "requests.csv", 5, "ttft_s", "-0.25")
    assert_refused(run, tmp_path, ": requests.csv line 5: ttft_s is -0.25; a finished "
                                  "request's ttft_s is finite and >= 0")


def test_a_finished_request_without_a_finish_time_is_refused(real_run: Path,
                                                             tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    edit_csv(run, "requests.csv", 2, "finish_time", "")
    assert_refused(run, tmp_path, ": requests.csv line 2: finish_time is nan; a finished "
                                  "request's finish_time is finite and >= 0")


def test_status_counts_must_match_the_summary(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    edit_csv(run, "requests.csv", 2, "status", "rejected")
    assert_refused(run, tmp_path, f": requests.csv has {NUM_REQUESTS - 1} finished requests "
                                  f"but summary.json's num_finished is {NUM_REQUESTS}")
    edit_csv(run, "requests.csv", 2, "status", "lost")
    assert_refused(run, tmp_path, ": requests.csv: status 'lost' is none of finished, "
                                  "preempted, rejected, running, waiting")


def test_config_must_count_the_same_requests(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    config = json.loads((run / "config.json").read_text())
    config["resolved"]["num_requests"] = 7
    (run / "config.json").write_text(json.dumps(config))
    assert_refused(run, tmp_path, ": config.json's resolved.num_requests 7 differs from "
                                  f"summary.json's {NUM_REQUESTS}")


def test_infinite_throughput_is_refused(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    edit_summary(run, "throughput", "requests_per_s", value=float("inf"))
    assert "Infinity" in (run / "summary.json").read_text()  # what Python's json writes
    assert_refused(run, tmp_path, ": summary.json: throughput.requests_per_s must be finite "
                                  "and >= 0, got inf")


def test_a_nan_anywhere_in_the_summary_is_refused(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    edit_summary(run, "saturation", "queue_growth_per_s", value=float("nan"))
    assert_refused(run, tmp_path, ": summary.json: saturation.queue_growth_per_s is nan; a "
                                  "run writes finite figures")


def test_a_negative_latency_statistic_is_refused(real_run: Path, tmp_path: Path) -> None:
    run = copy_of(real_run, tmp_path)
    edit_summary(run, "ttft_s", "p50", value=-0.001)
    assert_refused(run, tmp_path, ": summary.json: ttft_s.p50 must be a finite number >= 0 "
                                  "or null, got -0.001")


def test_a_run_with_every_request_rejected_is_drawn_with_a_warning(tmp_path: Path) -> None:
    """Prompts longer than max_model_len are rejected at arrival: 20 requests, no step."""
    out = tmp_path / "rejected"
    res = runner.invoke(app, ["run", "--num-requests", "20", "--max-model-len", "64",
                              "--max-num-batched-tokens", "256", "--max-num-seqs", "8",
                              "--step-time", "0.01", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["num_requests"], summary["num_rejected"]) == (20, 20)
    assert len((out / "steps.csv").read_text().splitlines()) == 1  # the header alone
    code, lines = report(out, tmp_path)
    assert code == 0 and (tmp_path / "r.html").exists()
    assert lines == [f"warning: run directory {out}: steps.csv has no rows: no request of "
                     "the 20 was scheduled (every one rejected), so the step figures are "
                     "empty"]
