"""Closed-loop clients (--concurrency, --think-time): each user sends its next request when
its previous one ends. With one slot and one user nothing ever queues; open-loop arrivals
at the same throughput do."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.source import ClosedLoopArrivals
from tests.conftest import make_requests

STEP = 0.01
runner = CliRunner()


def fixed_trace(tmp_path: Path, n: int = 200, output_len: int = 4) -> Path:
    path = tmp_path / "fixed.csv"
    path.write_text("arrival_time,num_prompt_tokens,output_len\n"
                    + "".join(f"{i},8,{output_len}\n" for i in range(n)))
    return path


def run(tmp_path: Path, name: str, *args: str) -> tuple[pd.DataFrame, dict]:
    out = tmp_path / name
    res = runner.invoke(app, ["run", "--max-num-seqs", "1", "--step-time", str(STEP),
                              "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    return pd.read_csv(out / "requests.csv"), json.loads((out / "summary.json").read_text())


def test_one_user_never_queues(tmp_path: Path) -> None:
    req, summary = run(tmp_path, "closed", "--trace", str(fixed_trace(tmp_path)),
                       "--concurrency", "1")
    assert np.allclose(req["ttft_s"], STEP, rtol=0, atol=1e-12)  # one prefill step
    assert (req["queued_time_s"] == 0).all()
    # Back to back: each request is sent the instant the previous one finished.
    assert list(req["arrival_time"][1:]) == pytest.approx(list(req["finish_time"][:-1]))
    assert summary["throughput"]["requests_per_s"] == pytest.approx(1 / (4 * STEP), rel=1e-3)
    assert summary["saturated"] is False


def test_open_loop_at_equal_throughput_queues(tmp_path: Path) -> None:
    # One user thinking 0.04 s after each 0.04 s request: 12.5 req/s, utilization 0.5.
    trace = str(fixed_trace(tmp_path, 400))
    closed, cs = run(tmp_path, "closed", "--trace", trace, "--concurrency", "1",
                     "--think-time", "0.04")
    assert (closed["queued_time_s"] == 0).all()
    assert closed["ttft_s"].max() == pytest.approx(STEP)
    rate = cs["throughput"]["requests_per_s"]
    assert rate == pytest.approx(12.5, rel=0.01)
    opened, os_ = run(tmp_path, "open", "--trace", trace, "--arrival", "poisson",
                      "--rate", f"{rate}")
    assert os_["throughput"]["requests_per_s"] == pytest.approx(rate, rel=0.1)
    assert opened["queued_time_s"].mean() > 0.005  # M/D/1 at rho 0.5: Wq = 0.02 s
    assert opened["ttft_s"].quantile(0.99) > 3 * STEP


def test_closed_loop_source_hands_out_rows_in_release_order() -> None:
    reqs = make_requests([3, 1, 2, 5])
    src = ClosedLoopArrivals([r.num_prompt_tokens for r in reqs],
                             [r.output_len for r in reqs], [r.max_tokens for r in reqs],
                             concurrency=2, think_time_s=0.5)
    first = src.pop_arrived(0.0)
    assert [r.index for r in first] == [0, 1] and src.next_arrival_time() is None
    src.release(first[1], 2.0)
    assert src.next_arrival_time() == 2.5 and src.pop_arrived(2.4) == []
    assert [(r.index, r.arrival_time) for r in src.pop_arrived(2.5)] == [(2, 2.5)]
    src.release(first[0], 3.0)
    assert not src.exhausted()
    assert [r.index for r in src.pop_arrived(9.0)] == [3]
    src.release(first[0], 9.0)  # nothing left to send
    assert src.exhausted() and src.next_arrival_time() is None


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"concurrency": 0}, "concurrency"), ({"concurrency": 1, "think_time_s": -1.0},
                                          "think_time")])
def test_closed_loop_source_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ClosedLoopArrivals([1], [1], [1], **kwargs)


def test_integral_floats_for_concurrency_and_replicas_run_as_ints(tmp_path: Path) -> None:
    """A sweep or a config.json may give concurrency (or replicas) as 2.0 or a numpy int:
    RunConfig takes an integral value, and the run is the one with 2 users (replicas)."""
    from sim.app.runs.runner import RunConfig, prepare, simulate_prepared

    trace = str(fixed_trace(tmp_path, n=12))
    runs = [simulate_prepared(prepare(RunConfig(trace=trace, concurrency=c, max_num_seqs=1,
                                                step_time=STEP)))
            for c in (2, 2.0, np.int64(2))]
    for other in runs[1:]:
        assert other.summary == runs[0].summary
    clusters = [simulate_prepared(prepare(RunConfig(trace=trace, replicas=r, max_num_seqs=1,
                                                    step_time=STEP)))
                for r in (2, 2.0, np.int64(2))]
    for other in clusters[1:]:
        assert other.summary == clusters[0].summary


def test_closed_loop_cli_errors(tmp_path: Path) -> None:
    for args, word in ((["--concurrency", "2", "--rate", "3"], "not both"),
                       (["--think-time", "1"], "think_time"),
                       (["--concurrency", "0"], "concurrency")):
        res = runner.invoke(app, ["run", "--num-requests", "5", "--out",
                                  str(tmp_path / "x"), *args])
        assert res.exit_code == 1 and word in res.output, res.output
        assert res.output.count("\n") == 1


def test_closed_loop_over_a_cluster(tmp_path: Path) -> None:
    req, summary = run(tmp_path, "cluster", "--trace", str(fixed_trace(tmp_path, 120)),
                       "--concurrency", "4", "--replicas", "2", "--router",
                       "least-outstanding")
    assert summary["num_finished"] == 120
    assert [r["num_routed"] for r in summary["replicas"]] == [60, 60]
    # Two users per one-slot replica: each request waits for at most one other.
    assert req["queued_time_s"].max() <= 4 * STEP + 1e-9
