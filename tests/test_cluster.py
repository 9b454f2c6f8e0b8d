"""Several engines behind a router in one SimPy environment (sim/cluster.py): one replica
is exactly one engine; each router decides from the replicas' state at arrival time;
per-replica and total metrics; the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from policies.chunked import ChunkedPolicy
from sim.cli import app
from sim.cluster import ROUTERS, simulate_cluster
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.request import Request
from sim.simulate import SimResult, simulate
from sim.source import RequestListArrivals
from tests.conftest import make_requests

runner = CliRunner()


def cluster(requests: list[Request], n: int, router: str, **config: object) -> SimResult:
    return simulate_cluster(
        RequestListArrivals(requests), num_replicas=n, router=router,
        policy_factory=ChunkedPolicy, config=SchedulerConfig(**config),  # type: ignore[arg-type]
        cost_model=ConstantCostModel(1.0), num_gpu_blocks=1000)


def mixed(n: int = 40) -> list[Request]:
    outs = [(7 * i) % 23 + 1 for i in range(n)]
    return make_requests(outs, prompt=[(13 * i) % 50 + 4 for i in range(n)],
                         arrivals=[i * 0.7 for i in range(n)])


@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_is_exactly_one_engine(router: str) -> None:
    one = simulate(RequestListArrivals(mixed()), policy_factory=ChunkedPolicy,
                   config=SchedulerConfig(max_num_seqs=4), cost_model=ConstantCostModel(1.0),
                   num_gpu_blocks=1000)
    many = cluster(mixed(), 1, router, max_num_seqs=4)
    pd.testing.assert_frame_equal(one.requests, many.requests.drop(columns="replica"))
    pd.testing.assert_frame_equal(one.steps, many.steps.drop(columns="replica"))


def test_round_robin_ignores_state() -> None:
    res = cluster(mixed(12), 3, "round-robin")
    assert list(res.requests["replica"]) == [i % 3 for i in range(12)]


def test_least_outstanding_avoids_the_busy_replica() -> None:
    # r0 holds replica 0 for 100 steps; r1 leaves replica 1 at t = 1; r2 arrives at t = 5.
    reqs = make_requests([100, 1, 3], arrivals=[0.0, 0.0, 5.0])
    rr = cluster(reqs, 2, "round-robin", max_num_seqs=1)
    lo = cluster(make_requests([100, 1, 3], arrivals=[0.0, 0.0, 5.0]), 2,
                 "least-outstanding", max_num_seqs=1)
    assert list(rr.requests["replica"]) == [0, 1, 0]
    assert rr.requests["queued_time_s"][2] == 95  # waits for r0 to finish at t = 100
    assert list(lo.requests["replica"]) == [0, 1, 1]
    assert lo.requests["queued_time_s"][2] == 0


def test_least_kv_reads_kv_usage_and_queued_prompts() -> None:
    # Both replicas hold one running request; replica 0's holds far more KV blocks.
    def reqs() -> list[Request]:
        return make_requests([50, 50, 3], prompt=[1600, 16, 16], arrivals=[0.0, 0.0, 5.0])
    assert list(cluster(reqs(), 2, "least-outstanding").requests["replica"]) == [0, 1, 0]
    assert list(cluster(reqs(), 2, "least-kv").requests["replica"]) == [0, 1, 1]
    # Simultaneous arrivals: queued prompts count, so a burst is spread, not piled up.
    burst = make_requests([5] * 6, prompt=160)
    assert sorted(cluster(burst, 3, "least-kv").requests["replica"].value_counts()) == [2, 2, 2]


def test_per_replica_and_total_metrics_agree() -> None:
    res = cluster(mixed(60), 3, "least-outstanding", max_num_seqs=2)
    s = res.summary
    reps = s["replicas"]
    assert [r["replica"] for r in reps] == [0, 1, 2]
    assert sum(r["num_requests"] for r in reps) == s["num_requests"] == 60
    assert sum(r["num_routed"] for r in reps) == 60
    assert s["num_finished"] == 60 and "saturated" in s
    assert list(res.requests["request_id"]) == [str(i) for i in range(60)]  # workload order
    assert res.steps["start_time"].is_monotonic_increasing
    again = cluster(mixed(60), 3, "least-outstanding", max_num_seqs=2)
    pd.testing.assert_frame_equal(res.requests, again.requests)


def test_cli_cluster_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--num-requests", "80", "--replicas", "2", "--router",
                              "least-kv", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "GPUs: 2 (2 replicas x TP 1), router least-kv" in res.output
    assert "replicas" in res.output  # the per-replica table
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["replicas"]) == 2 and summary["num_requests"] == 80
    assert {"saturated", "latency_steady_state", "saturation"} <= set(summary)
    req = pd.read_csv(out / "requests.csv")
    assert set(req["replica"]) == {0, 1}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["replicas"] == 2 and cfg["resolved"]["num_gpus"] == 2


def test_cli_single_run_has_one_replica_entry(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", "--num-requests", "30", "--out", str(out)]).exit_code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [r["replica"] for r in summary["replicas"]] == [0]
    assert summary["replicas"][0]["num_requests"] == summary["num_requests"]


@pytest.mark.parametrize(("args", "field"), [(["--router", "random"], "router"),
                                             (["--replicas", "0"], "replicas")])
def test_cli_cluster_bad_input(tmp_path: Path, args: list[str], field: str) -> None:
    res = runner.invoke(app, ["run", "--num-requests", "5", "--out", str(tmp_path / "x"),
                              *args])
    assert res.exit_code == 1 and field in res.output and res.output.count("\n") == 1
