"""Several engines behind a router in one SimPy environment (sim/cluster.py, the routers
of policies/routers.py): one replica is exactly one engine; each router decides from the
replicas' state at arrival time; a router object of the user's is used as given;
per-replica and total metrics; a prefix cache per replica and the cache-aware router;
the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import sim.app.runs.prompt_content as workload_content
from policies.chunked import ChunkedPolicy
from policies.routers import ROUTERS, imbalanced, make_router
from sim.app.cli.main import app
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from sim.cluster import Replica, simulate_cluster
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.interface import ReplicaView, Router
from sim.kv.factory import make_kv
from sim.kv.prefix_cache import PrefixCachingKV
from sim.kv.prefix_slots import PrefixSlotTable
from sim.metrics import Recorder
from sim.request import Request
from sim.simulate import SimResult, simulate
from sim.source import RequestListArrivals
from tests.conftest import make_requests

runner = CliRunner()


def cluster(requests: list[Request], n: int, router: str | Router,
            **config: object) -> SimResult:
    """``requests`` on ``n`` replicas behind ``router`` (a name or a router object)."""
    return simulate_cluster(
        RequestListArrivals(requests), num_replicas=n,
        router=make_router(router) if isinstance(router, str) else router,
        policy_factory=ChunkedPolicy, config=SchedulerConfig(**config),  # type: ignore[arg-type]
        cost_model=ConstantCostModel(1.0), num_gpu_blocks=1000)


def mixed(n: int = 40) -> list[Request]:
    outs = [(7 * i) % 23 + 1 for i in range(n)]
    return make_requests(outs, prompt=[(13 * i) % 50 + 4 for i in range(n)],
                         arrivals=[i * 0.7 for i in range(n)])


@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_is_exactly_one_engine(router: str) -> None:
    cache = "block" if router == "cache-aware" else "none"  # it needs one
    one = simulate(RequestListArrivals(mixed()), policy_factory=ChunkedPolicy,
                   config=SchedulerConfig(max_num_seqs=4, prefix_cache=cache),
                   cost_model=ConstantCostModel(1.0), num_gpu_blocks=1000)
    many = cluster(mixed(), 1, router, max_num_seqs=4, prefix_cache=cache)
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


class Pack:
    """A user's router: the replica with the most outstanding requests, ties to the
    highest index (none of the built-in routers would); it logs what it read."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, list[int]]] = []
        self.num_replicas = 0

    def start(self, replicas: list[ReplicaView]) -> None:
        self.num_replicas = len(replicas)

    def choose(self, request: Request, replicas: list[ReplicaView], now: float) -> int:
        self.calls.append((request.request_id, now, [r.outstanding for r in replicas]))
        return max(replicas, key=lambda r: (r.outstanding, r.index)).index


def test_a_user_router_object_is_used() -> None:
    # 1 s steps. r0 (t = 0) and r1 (t = 1) each sample 5 tokens, the first after their
    # prefill step: both are outstanding at t = 3 and finished (t = 5 and 6) by t = 10.
    pack = Pack()
    res = cluster(make_requests([5, 5, 5, 5], arrivals=[0.0, 1.0, 3.0, 10.0]), 2, pack)
    assert pack.num_replicas == 2
    assert pack.calls == [("0", 0.0, [0, 0]), ("1", 1.0, [0, 1]), ("2", 3.0, [0, 2]),
                          ("3", 10.0, [0, 0])]
    assert list(res.requests["replica"]) == [1, 1, 1, 1]
    assert list(res.requests["finish_time"][:2]) == [5.0, 6.0]


def test_a_router_must_choose_a_replica() -> None:
    class Outside:
        def choose(self, request: Request, replicas: list[ReplicaView], now: float) -> int:
            return len(replicas)

    with pytest.raises(ValueError, match="chose replica 2 for request '0'"):
        cluster(make_requests([1]), 2, Outside())
    with pytest.raises(ValueError, match="router must have choose"):
        cluster(make_requests([1]), 2, object())  # type: ignore[arg-type]


class Replay:
    """A user's router: each request to the replica ``where[request.index]``."""

    def __init__(self, where: np.ndarray) -> None:
        self.where = where

    def choose(self, request: Request, replicas: list[ReplicaView], now: float) -> int:
        return int(self.where[request.index])


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
    assert kv.allocate_slots(a, a.num_tokens, kv.get_computed_blocks(a)) is not None
    before = (dataclasses.astuple(kv.stats), kv._touched, dict(kv._last_lookup))
    assert kv.peek_hit_tokens(b) == 48  # the 3 shared blocks
    assert (dataclasses.astuple(kv.stats), kv._touched, dict(kv._last_lookup)) == before
    assert b not in kv._index._pos  # no positions kept for a request routed elsewhere
    assert kv.get_computed_blocks(b).block_ids == a.block_ids[:3]


@pytest.mark.parametrize("mode", ["block", "radix"])
def test_cache_aware_cluster_same_with_per_request_slots(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's lookups on every replica change nothing but the routing: fixed slots
    and slots made per request (which the lookups make on replicas that never get the
    request) give the same records, under eviction and preemption."""
    prep = prepare(RunConfig(scenario="multi-turn", num_requests=300, rate=30.0,
                             prefix_cache=mode, num_gpu_blocks=500, max_model_len=7984,
                             max_num_seqs=16,
                             replicas=3, router="cache-aware"))
    fixed = simulate_prepared(prep)
    monkeypatch.setattr(workload_content, "MAX_FIXED_SLOTS", 10)
    per_request = simulate_prepared(prep)
    pc = fixed.summary["prefix_cache"]
    assert pc["hit_tokens"] > 0 and pc["evictions"] > 0 and fixed.summary["num_preemptions"] > 0
    assert fixed.summary == per_request.summary
    for col, a in fixed.request_table.items():
        np.testing.assert_array_equal(a, per_request.request_table[col], err_msg=col)


@pytest.mark.parametrize(("prompt", "where"), [(160, [0, 1]), (159, [0, 0])])
def test_cache_aware_needs_more_than_30_percent_cached(prompt: int, where: list[int]) -> None:
    # r1 finds r0's 3 shared blocks (48 tokens) on replica 0 only: 48 / 160 = 0.3 is not
    # more than 0.3, so least-kv sends it to replica 1 (both idle, 1 routed to least so
    # far); 48 / 159 > 0.3 keeps it on replica 0.
    reqs = []
    for i in range(2):
        r = Request(str(i), 10.0 * i, prompt, 1, 1, 0, i)
        r.prompt_segments = ((1, 48), (100 + i, prompt - 48))
        reqs.append(r)
    res = cluster(reqs, 2, "cache-aware", prefix_cache="block")
    assert list(res.requests["replica"]) == where


def test_cache_aware_load_guard_needs_both_thresholds() -> None:
    def guard(a: int, b: int) -> bool:
        reps = [Replica(i, make_kv("block", 10, 16), Recorder()) for i in range(2)]
        reps[0].routed.extend(range(a))
        reps[1].routed.extend(range(b))
        return imbalanced(reps)

    assert guard(65, 0) and not guard(64, 0)  # a gap of more than 64
    assert not guard(200, 135)  # a gap of 65, but 200 <= 1.5 x 135 = 202.5
    assert guard(203, 135)


def test_cache_aware_lookups_change_only_the_routing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replaying the cache-aware router's choices with no lookups at all gives the same
    records, under eviction and preemption: the lookups leave no trace in the caches."""
    prep = prepare(RunConfig(scenario="multi-turn", num_requests=300, rate=30.0,
                             prefix_cache="radix", num_gpu_blocks=500, max_model_len=7984,
                             max_num_seqs=16,
                             replicas=3, router="cache-aware"))
    routed = simulate_prepared(prep)
    where = routed.requests["replica"].to_numpy()  # workload order
    assert len(set(where)) == 3 and routed.summary["prefix_cache"]["evictions"] > 0
    # The runner imports make_router when a run has replicas: patched at its module.
    monkeypatch.setattr("policies.routers.make_router", lambda name, **_: Replay(where))
    replay = simulate_prepared(prep)
    assert replay.summary == routed.summary
    for col, a in routed.request_table.items():
        np.testing.assert_array_equal(a, replay.request_table[col], err_msg=col)


def test_fixed_slots_are_capped_over_all_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each replica's cache has an arena of the workload's slots: at a cap of exactly one
    # arena, one replica fixes its slots and two name blocks per request.
    prep = prepare(RunConfig(scenario="system-prompts", num_requests=20, prefix_cache="block"))
    w = prep.workload
    num_slots = PrefixSlotTable.for_workload(
        w.num_prompt_tokens, w.output_len, w.request_id, 16,
        prompt_segments=w.prompt_segments, hash_ids=w.hash_ids).num_slots
    monkeypatch.setattr(workload_content, "MAX_FIXED_SLOTS", num_slots)
    for replicas, fixed in ((1, True), (2, False)):
        content = workload_content.prompt_content(w, 16, replicas)
        assert content is not None
        req = Request("0", 0.0, int(w.num_prompt_tokens[0]), 1, 1, 0, 0)
        content(req)
        assert (req.prefix_slots is not None) == fixed
        assert (req.prompt_segments is not None) == (not fixed)


def test_cli_cache_aware_takes_the_cache_from_compare_cells_and_sweep_axes(
        tmp_path: Path) -> None:
    common = ["--scenario", "system-prompts", "--num-requests", "30", "--step-time", "0.02",
              "--replicas", "2", "--router", "cache-aware"]
    ok = runner.invoke(app, ["run", *common, "--compare", "chunked:block,chunked:radix",
                             "--out", str(tmp_path / "c")])
    assert ok.exit_code == 0, ok.output
    summary = json.loads((tmp_path / "c" / "chunked-radix" / "summary.json").read_text())
    assert summary["prefix_cache"]["mode"] == "radix" and summary["prefix_cache"]["hit_tokens"] > 0
    bad = runner.invoke(app, ["run", *common, "--compare", "chunked:none,chunked:radix",
                              "--out", str(tmp_path / "d")])
    assert bad.exit_code == 1 and bad.output.count("\n") == 1
    assert "cell 'chunked:none'" in bad.output and "prefix cache" in bad.output
    assert not (tmp_path / "d").exists()
    ok = runner.invoke(app, ["sweep", *common, "--prefix-cache", "block,radix", "--workers",
                             "1", "--out", str(tmp_path / "s")])
    assert ok.exit_code == 0, ok.output
    df = pd.read_csv(tmp_path / "s" / "sweep.csv", keep_default_na=False)
    assert list(df["error"]) == ["", ""] and (df["prefix_hit_rate"] > 0).all()
    for axis in ("none,radix", "radix,RADIX"):
        bad = runner.invoke(app, ["sweep", *common, "--prefix-cache", axis,
                                  "--out", str(tmp_path / "t")])
        assert bad.exit_code == 1 and bad.output.count("\n") == 1, bad.output
