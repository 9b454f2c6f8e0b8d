"""Several engines behind a router in one SimPy environment (sim/cluster.py): one replica
is exactly one engine; each router decides from the replicas' state at arrival time;
per-replica and total metrics; a prefix cache per replica and the cache-aware router;
the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import sim.runner as runner_module
from policies.chunked import ChunkedPolicy
from sim.cli import app
from sim.cluster import ROUTERS, simulate_cluster
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.prefix_cache import PrefixCachingKV, make_kv
from sim.request import Request
from sim.runner import RunConfig, prepare, simulate_prepared
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
                                             (["--replicas", "0"], "replicas"),
                                             (["--router", "cache-aware"], "prefix_cache")])
def test_cli_cluster_bad_input(tmp_path: Path, args: list[str], field: str) -> None:
    res = runner.invoke(app, ["run", "--num-requests", "5", "--out", str(tmp_path / "x"),
                              *args])
    assert res.exit_code == 1 and field in res.output and res.output.count("\n") == 1


def turns(n: int) -> list[Request]:
    """n one-step requests, 10 s apart, each a 48-token shared prefix (3 blocks of 16)
    and 16 tokens of its own: a hit can cover the 3 shared blocks (never the 4th, the
    last prompt token's)."""
    out = []
    for i in range(n):
        r = Request(str(i), 10.0 * i, 64, 1, 1, 0, i)
        r.prompt_segments = ((1, 48), (100 + i, 16))
        out.append(r)
    return out


@pytest.mark.parametrize("mode", ["block", "radix"])
def test_each_replica_has_its_own_prefix_cache(mode: str) -> None:
    # Round robin: r0 -> 0 and r1 -> 1 miss, r2 -> 0 and r3 -> 1 find the 3 blocks
    # their replica's first request left: 96 of 256 looked-up tokens. One engine: 144.
    res = cluster(turns(4), 2, "round-robin", prefix_cache=mode)
    pc = res.summary["prefix_cache"]
    assert (pc["mode"], pc["hit_tokens"], pc["queried_tokens"]) == (mode, 96, 256)
    assert pc["hit_rate_tokens"] == pytest.approx(96 / 256)
    assert pc["prefill_tokens_saved"] == 96 and pc["num_admissions_with_hit"] == 2
    assert [r["prefix_cache"]["hit_tokens"] for r in res.summary["replicas"]] == [48, 48]
    assert list(res.requests["replica"]) == [0, 1, 0, 1]
    one = cluster(turns(4), 1, "round-robin", prefix_cache=mode).summary["prefix_cache"]
    assert (one["hit_tokens"], one["queried_tokens"]) == (144, 256)


def test_cluster_without_a_cache_reports_none() -> None:
    pc = cluster(mixed(8), 2, "least-kv").summary["prefix_cache"]
    assert pc["mode"] == "none" and pc["hit_rate_tokens"] is None and pc["evictions"] == 0


def test_cli_cluster_with_a_prefix_cache(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--scenario", "system-prompts", "--num-requests", "60",
                              "--prefix-cache", "radix", "--replicas", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    pc, reps = summary["prefix_cache"], summary["replicas"]
    assert pc["mode"] == "radix" and pc["hit_tokens"] > 0
    for key in ("hit_tokens", "queried_tokens", "evictions", "num_admissions"):
        assert pc[key] == sum(r["prefix_cache"][key] for r in reps), key


def test_cache_aware_follows_the_cached_prefix() -> None:
    # r0 has no hit anywhere: least-kv, replica 0. Each later one finds 48 of its 64
    # tokens (0.75 > 0.3) cached on replica 0 only: all four there, 144 hit tokens.
    res = cluster(turns(4), 2, "cache-aware", prefix_cache="block")
    assert list(res.requests["replica"]) == [0, 0, 0, 0]
    assert res.summary["prefix_cache"]["hit_tokens"] == 144


def test_cache_aware_balances_load_past_its_thresholds() -> None:
    # r0 (t = 0, 200 tokens) holds the shared blocks on replica 0; 70 more arrive at
    # t = 1. q_k goes to replica 0 (the hit) while 0 is not imbalanced: q1..q64 (65
    # outstanding there); from then on each gap of 65 > 64 (and 65 > 1.5 x the other)
    # sends one to replica 1, each gap of 64 one back to replica 0: q65, q67, q69 -> 1.
    reqs = turns(71)
    for i, r in enumerate(reqs):
        r.arrival_time = 0.0 if i == 0 else 1.0
        r.output_len = r.max_tokens = 200 if i == 0 else 2
    res = cluster(reqs, 2, "cache-aware", prefix_cache="radix")
    assert [i for i, rep in enumerate(res.requests["replica"]) if rep == 1] == [65, 67, 69]


@pytest.mark.parametrize("mode", ["block", "radix"])
def test_peek_hit_tokens_records_nothing(mode: str) -> None:
    kv = make_kv(mode, 100, 16)
    assert isinstance(kv, PrefixCachingKV)
    a, b = turns(2)
    assert kv.allocate_cached(a, kv.get_computed_blocks(a), a.num_tokens)
    assert kv.peek_hit_tokens(b) == 48  # the 3 shared blocks
    assert not kv._index.keeps(b) and b not in kv._last_lookup
    assert kv.get_computed_blocks(b) == a.block_ids[:3]


@pytest.mark.parametrize("mode", ["block", "radix"])
def test_cache_aware_cluster_same_with_per_request_slots(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's lookups on every replica change nothing but the routing: fixed slots
    and slots made per request (which the lookups make on replicas that never get the
    request) give the same records, under eviction and preemption."""
    prep = prepare(RunConfig(scenario="multi-turn", num_requests=300, rate=30.0,
                             prefix_cache=mode, num_gpu_blocks=500, max_num_seqs=16,
                             replicas=3, router="cache-aware"))
    fixed = simulate_prepared(prep)
    monkeypatch.setattr(runner_module, "MAX_FIXED_SLOTS", 10)
    per_request = simulate_prepared(prep)
    pc = fixed.summary["prefix_cache"]
    assert pc["hit_tokens"] > 0 and pc["evictions"] > 0 and fixed.summary["num_preemptions"] > 0
    assert fixed.summary == per_request.summary
    for col, a in fixed.request_table.items():
        np.testing.assert_array_equal(a, per_request.request_table[col], err_msg=col)
