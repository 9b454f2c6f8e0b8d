"""Prefix caching, vLLM's block-hash mode and what both modes share: prompt
content as segments, the Mooncake 512-token mapping, hand-computed hits and eviction
order, the cost of a hit, lpm, the CLI, and reference counts under random use
(hypothesis). SGLang's radix mode: tests/test_radix_cache.py; the generated shared-prefix
workloads: tests/test_prefix_workloads.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from policies import get_policy_class
from scenarios.traces import load_trace
from sim.app.cli.main import app
from sim.batch import BatchShape
from sim.config import SchedulerConfig
from sim.kv.block_cache import BlockHashCache
from sim.kv.block_pool import KVCacheManager
from sim.kv.factory import make_kv
from sim.kv.prefix_cache import PrefixCachingKV
from sim.kv.prefix_content import answer_segment_id, mooncake_segments
from sim.kv.prefix_index import PrefixIndex
from sim.kv.radix_cache import RadixCache
from sim.request import Request
from sim.simulate import SimResult, simulate
from sim.source import RequestListArrivals
from tests.conftest import cache_op, make_requests, run_sim, shared_path

MODES = ("block", "radix")


def req(i: int, segments: Sequence[tuple[int, int]], output_len: int = 1,
        arrival: float = 0.0) -> Request:
    r = Request(str(i), arrival, sum(n for _, n in segments), output_len, output_len, 0, i)
    r.prompt_segments = tuple(segments)
    return r


def admit(kv: PrefixCachingKV, r: Request) -> list[int]:
    """Admit ``r`` whole through the cache, as a policy would; returns its hit."""
    hit = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - hit.num_computed_tokens, hit) is not None
    r.num_computed_tokens = r.num_tokens
    return hit.block_ids


class Shapes:
    """A cost model of 1 s a step that records every shape it prices."""

    def __init__(self) -> None:
        self.shapes: list[BatchShape] = []

    def step_time(self, shape: BatchShape) -> float:
        self.shapes.append(shape)
        return 1.0

    def prefills(self) -> list[tuple[int, int, int]]:
        return [(s.num_prefill_tokens, s.prefill_context_tokens, s.prefill_attention_pairs)
                for s in self.shapes if s.num_prefill_tokens]


def run_cached(reqs: list[Request], mode: str, cost: Shapes | None = None,
               policy: str = "chunked", **config: object) -> SimResult:
    cfg = SchedulerConfig(prefix_cache=mode, **config)  # type: ignore[arg-type]
    return simulate(RequestListArrivals(reqs), policy_factory=get_policy_class(policy),
                    config=cfg, cost_model=cost or Shapes(), num_gpu_blocks=1001,
                    block_size=16)


# -- content and the Mooncake mapping --

def test_mooncake_segments_cut_at_the_prompt() -> None:
    assert mooncake_segments((7, 8, 9, 10), 1100, "r") == ((7, 512), (8, 512), (9, 76))
    assert mooncake_segments((7,), 1024, "r")[0] == (7, 512)
    assert mooncake_segments((7,), 1024, "r")[1][1] == 512  # tokens beyond the ids


@pytest.mark.parametrize(("block_size", "hit_tokens"), [
    (16, 1024),   # 16 divides 512: 32 blocks per Mooncake block, two shared -> 64 blocks
    (24, 1008),   # 42 blocks end inside the shared 1024 tokens; block 42 reaches id 2/3
    (512, 1024),  # one engine block per Mooncake block
    (1024, 1024), # one engine block covers ids 0 and 1
])
def test_mooncake_blocks_on_any_block_size(block_size: int, hit_tokens: int) -> None:
    kv = BlockHashCache(1000, block_size)
    a = req(0, mooncake_segments((0, 1, 2), 1536, "a"))
    b = req(1, mooncake_segments((0, 1, 3), 1536, "b"))
    admit(kv, a)
    kv.free(a)
    assert kv.get_computed_blocks(b).num_computed_tokens == hit_tokens


# -- hand-computed hits --

@pytest.mark.parametrize("mode", MODES)
def test_two_requests_share_a_three_block_prefix(mode: str) -> None:
    # A: 48 shared tokens (3 blocks of 16) + 16 of its own; output 3, done at t = 3.
    # B at t = 10: hits the 3 blocks, prefills only 16 tokens over a context of 48:
    # 16 * 48 + 16 * 17 / 2 = 904 attention pairs.
    a, b = req(0, [(7, 48), (100, 16)], 3), req(1, [(7, 48), (101, 16)], 3, arrival=10.0)
    cost = Shapes()
    res = run_cached([a, b], mode, cost)
    assert cost.prefills() == [(64, 0, 64 * 65 // 2), (16, 48, 904)]
    pc = res.summary["prefix_cache"]
    assert pc["mode"] == mode and pc["hit_rate_tokens"] == 48 / 128
    assert pc["prefill_tokens_saved"] == 48 and pc["num_admissions_with_hit"] == 1
    assert b.num_cached_tokens == 48 and a.num_cached_tokens == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_prefix_computed_this_step_is_hit_this_step(mode: str) -> None:
    # vLLM caches a prompt block when it is allocated, so B, admitted right after A in
    # the same step, reuses A's 3 blocks (their KV is written before attention reads it).
    a, b = req(0, [(7, 48), (100, 16)], 2), req(1, [(7, 48), (101, 16)], 2)
    cost = Shapes()
    run_cached([a, b], mode, cost)
    first = cost.shapes[0]
    assert (first.num_prefill_tokens, first.prefill_context_tokens) == (64 + 16, 48)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("prompt", "hit"), [(64, 48), (65, 64), (63, 48), (16, 0)])
def test_a_hit_never_covers_the_whole_prompt(mode: str, prompt: int, hit: int) -> None:
    kv = make_kv(mode, 100, 16)
    assert isinstance(kv, PrefixCachingKV)
    a, b = req(0, [(5, prompt)]), req(1, [(5, prompt)])
    admit(kv, a)
    kv.free(a)
    # At most (prompt - 1) // 16 blocks: the last prompt token is always computed.
    assert kv.get_computed_blocks(b).num_computed_tokens == hit
    admit(kv, b)
    assert b.num_cached_tokens == hit
    assert b.num_computed_tokens == prompt  # admit() computed the rest


def test_block_eviction_takes_the_least_recently_freed_tail_first() -> None:
    kv = BlockHashCache(7, 4)  # 6 usable blocks of 4 tokens
    x, y = req(0, [(1, 8), (2, 4)]), req(1, [(1, 8), (3, 4)])
    assert admit(kv, x) == [] and x.block_ids == [1, 2, 3]
    assert admit(kv, y) == [1, 2] and y.block_ids == [1, 2, 4]
    kv.free(x)  # 1 and 2 are still Y's: only 3 is freed
    kv.free(y)  # tail first: 4, 2, 1
    assert kv.free_block_queue.get_all_free_blocks() == [5, 6, 3, 4, 2, 1]
    z = req(2, [(9, 20)])  # 5 blocks: the 2 never used, then 3, 4 and 2 are evicted
    admit(kv, z)
    assert z.block_ids == [5, 6, 3, 4, 2] and kv.stats.evicted_blocks == 3
    # vLLM may drop a middle block of a chain: block 1 (tokens 0-3) survives, 2 does not.
    assert kv.get_computed_blocks(req(3, [(1, 8), (5, 4)])).block_ids == [1]
    kv.check_invariants()


@pytest.mark.parametrize("mode", MODES)
def test_decode_blocks_hit_in_the_next_turn(mode: str) -> None:
    # Turn 1: prompt 120 (a 100-token system prompt + 20), answer 40, so 159 tokens are
    # computed and 9 full blocks (144 tokens) are cached; blocks 7 and 8 hold answer
    # tokens. Turn 2's prompt is turn 1's prompt + its answer + 10 new tokens (170).
    t1 = req(0, [(3, 100), (11, 20)], 40)
    t2 = req(1, [(3, 100), (11, 20), (answer_segment_id("0"), 40), (12, 10)], 5,
             arrival=100.0)
    cost = Shapes()
    res = run_cached([t1, t2], mode, cost)
    assert t2.num_cached_tokens == 144
    assert cost.prefills()[-1][:2] == (170 - 144, 144)
    assert res.summary["prefix_cache"]["hit_tokens"] == 144


@pytest.mark.parametrize("mode", MODES)
def test_no_shared_content_changes_nothing(mode: str) -> None:
    reqs = make_requests([5, 30, 2, 17, 9], prompt=[40, 300, 17, 64, 129],
                         arrivals=[0.0, 0.0, 1.0, 2.5, 2.5])
    plain = run_sim(reqs, max_num_batched_tokens=128, num_gpu_blocks=1001)
    reqs = make_requests([5, 30, 2, 17, 9], prompt=[40, 300, 17, 64, 129],
                         arrivals=[0.0, 0.0, 1.0, 2.5, 2.5])
    cached = run_sim(reqs, max_num_batched_tokens=128, num_gpu_blocks=1001,
                     prefix_cache=mode)
    cols = ["first_token_time", "finish_time", "num_output_tokens"]
    assert plain.requests[cols].equals(cached.requests[cols])
    assert cached.summary["prefix_cache"]["hit_rate_tokens"] == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_lpm_admits_the_longest_cached_prefix_first(mode: str) -> None:
    # W warms the cache with 64 tokens; at t = 5, A (nothing cached) and B (64 cached)
    # arrive together with one batch slot: FCFS admits A, lpm admits B.
    def workload() -> list[Request]:
        return [req(0, [(7, 64), (50, 16)], 2), req(1, [(8, 80)], 2, arrival=5.0),
                req(2, [(7, 64), (51, 16)], 2, arrival=5.0)]
    for queue, first in (("fcfs", "1"), ("lpm", "2")):
        res = run_cached(workload(), mode, max_num_seqs=1, queue=queue)
        started = res.requests.set_index("request_id")["first_scheduled_time"]
        assert started[first] == 5.0


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="prefix_cache must be one of"):
        SchedulerConfig(prefix_cache="lru")
    with pytest.raises(ValueError, match="queue 'lpm'"):
        SchedulerConfig(queue="lpm")
    with pytest.raises(ValueError, match="kv_allocation 'paged'"):
        SchedulerConfig(prefix_cache="block", kv_allocation="reserve")
    assert type(make_kv("none", 10)) is KVCacheManager


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", ["chunked", "continuous"])
def test_fast_path_gives_the_same_records(mode: str, policy: str) -> None:
    def workload() -> list[Request]:
        segs = [[(1, 40), (10 + i, 7 * i + 3)] for i in range(8)]
        return [req(i, s, 20 + 9 * i, arrival=0.3 * i) for i, s in enumerate(segs)]
    cfg = SchedulerConfig(prefix_cache=mode, max_num_batched_tokens=128)
    runs = [simulate(RequestListArrivals(workload()), policy_factory=get_policy_class(policy),
                     config=cfg, cost_model=Shapes(), num_gpu_blocks=40, block_size=8,
                     fast_path=fast) for fast in (True, False)]
    assert runs[0].summary["num_preemptions"] > 0
    assert runs[0].requests.equals(runs[1].requests)
    assert runs[0].summary["prefix_cache"] == runs[1].summary["prefix_cache"]


# -- reference counts under random use --

def capture(kvs: list[KVCacheManager], policy: str):  # type: ignore[no-untyped-def]
    cls = get_policy_class(policy)

    def factory(cfg: SchedulerConfig, kv: KVCacheManager):  # type: ignore[no-untyped-def]
        kvs.append(kv)
        return cls(cfg, kv)
    return factory


WORKLOADS = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from([0, 8, 13, 40]), st.integers(1, 30),
              st.integers(1, 12), st.floats(0, 6)),
    min_size=1, max_size=12)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(WORKLOADS, st.sampled_from(MODES), st.sampled_from(["chunked", "continuous"]),
       st.sampled_from(["fcfs", "lpm"]), st.integers(10, 40))
def test_refcounts_return_to_zero(rows: list[tuple[int, int, int, int, float]], mode: str,
                                  policy: str, queue: str, blocks: int) -> None:
    """Random shared prefixes, a small pool (preemption, eviction): the pool is consistent
    after every step, and every block is unreferenced and free at the end."""
    reqs = []
    for i, (prefix, plen, own, out, t) in enumerate(sorted(rows, key=lambda r: r[4])):
        segs = [(prefix, plen)] if plen else []
        reqs.append(req(i, [*segs, (100 + i, own)], out, arrival=t))
    kvs: list[KVCacheManager] = []
    cfg = SchedulerConfig(prefix_cache=mode, queue=queue, max_num_batched_tokens=64,
                          max_num_seqs=4, max_model_len=200)
    res = simulate(RequestListArrivals(reqs), policy_factory=capture(kvs, policy),
                   config=cfg, cost_model=Shapes(), num_gpu_blocks=blocks, block_size=4,
                   observer=lambda plan, start, end: kvs[0].check_invariants())
    kv = kvs[0]
    kv.check_invariants()
    assert all(r.is_finished for r in reqs) and not any(r.block_ids for r in reqs)
    assert max(kv._ref_cnt) == 0 and kv.num_free_blocks == kv.num_usable_blocks
    assert res.summary["num_finished"] + res.summary["num_rejected"] == len(reqs)


def general_index(self: PrefixIndex, req: Request, start: int, blocks: np.ndarray,
                  keep: bool, drop: np.ndarray | None = None) -> bool:
    """PrefixIndex.index without its slices: drop, then insert at the positions."""
    if drop is not None:
        self.key[drop] = 0
    self.insert(self.positions(req, start + len(blocks), start), blocks, keep)
    return False


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(WORKLOADS, st.sampled_from(MODES), st.integers(10, 40))
def test_slice_paths_index_as_insert_does(rows: list[tuple[int, int, int, int, float]],
                                          mode: str, blocks: int) -> None:
    """Chunks of a new prompt and answers indexed through arena slices, with evictions
    dropped as the blocks are indexed again (PrefixIndex.index, index_new), give the
    records and counts of plain inserts, chunks ending inside a block, in a pool small
    enough to evict and preempt."""
    def run() -> SimResult:
        reqs = []
        for i, (prefix, plen, own, out, t) in enumerate(sorted(rows, key=lambda r: r[4])):
            segs = [(prefix, plen)] if plen else []
            reqs.append(req(i, [*segs, (100 + i, own)], out, arrival=t))
        cfg = SchedulerConfig(prefix_cache=mode, max_num_batched_tokens=62, max_num_seqs=4,
                              max_model_len=200)
        return simulate(RequestListArrivals(reqs), policy_factory=get_policy_class("chunked"),
                        config=cfg, cost_model=Shapes(), num_gpu_blocks=blocks, block_size=4)
    fast = run()
    with (patch.object(PrefixIndex, "index", general_index),
          patch.object(PrefixIndex, "index_new", lambda *args: False)):
        slow = run()
    assert fast.requests.equals(slow.requests)
    assert fast.summary["prefix_cache"] == slow.summary["prefix_cache"]


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 30), st.booleans()),
                max_size=40), st.sampled_from(MODES))
def test_random_admissions_and_frees_never_leak(ops: list[tuple[int, int, bool]],
                                               mode: str) -> None:
    kv = make_kv(mode, 16, 4)
    assert isinstance(kv, PrefixCachingKV)
    reqs = [req(i, [(i % 2, 8), (50 + i, 12)]) for i in range(6)]
    for who, extra, free in ops:
        cache_op(kv, reqs[who], extra, free, 4)
        kv.check_invariants()
        held = sum(len(x.block_ids) for x in reqs)
        assert held >= kv.num_used_blocks
    for r in reqs:
        kv.free(r)
    kv.check_invariants()
    assert max(kv._ref_cnt) == 0 and kv.num_free_blocks == kv.num_usable_blocks


def test_mooncake_trace_hits_match_an_independent_count() -> None:
    """First 300 Mooncake requests one at a time into an unbounded cache: every hit is
    what a plain count over the 512-token hash ids gives (engine blocks of 16: block j is
    named by the ids up to the one holding its last token, and j)."""
    w = load_trace(shared_path("traces", "mooncake_conversation_trace.jsonl")).cut(300)
    reqs = []
    for i in range(len(w)):
        r = req(i, mooncake_segments(w.hash_ids[i], int(w.num_prompt_tokens[i]),  # type: ignore[index]
                                     str(i)), 1, arrival=1000.0 * i)
        reqs.append(r)
    res = simulate(RequestListArrivals(reqs), policy_factory=get_policy_class("chunked"),
                   config=SchedulerConfig(prefix_cache="block"), cost_model=Shapes(),
                   num_gpu_blocks=400_000, block_size=16)
    known: set[tuple[tuple[int, ...], int]] = set()
    expected = 0
    for i in range(len(w)):
        ids, p = w.hash_ids[i], int(w.num_prompt_tokens[i])  # type: ignore[index]
        names = [(tuple(ids[:(16 * j + 15) // 512 + 1]), j) for j in range(p // 16)]
        hit = 0
        while hit < (p - 1) // 16 and names[hit] in known:
            hit += 1
        assert reqs[i].num_cached_tokens == 16 * hit, i
        expected += 16 * hit
        known.update(names)
    pc = res.summary["prefix_cache"]
    assert pc["hit_tokens"] == expected > 0 and pc["evictions"] == 0


# -- the command line --

def test_cli_reports_the_prefix_cache(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runner = CliRunner()
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--scenario", "system-prompts", "--num-requests", "60",
                              "--prefix-cache", "block", "--step-time", "0.02",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "prefix cache" in res.stdout and "hit rate" in res.stdout
    pc = json.loads((out / "summary.json").read_text())["prefix_cache"]
    assert pc["mode"] == "block" and pc["hit_rate_tokens"] > 0.5
    assert json.loads((out / "config.json").read_text())["prefix_cache"] == "block"


@pytest.mark.parametrize(("args", "message"), [
    (["--queue", "lpm"], "needs a prefix cache"),
    (["--policy", "static", "--prefix-cache", "radix"], "iteration-level policies"),
    (["--prefix-cache", "lru"], "prefix_cache must be one of"),
])
def test_cli_rejects_bad_combinations(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["run", "--num-requests", "5", "--step-time", "0.01",
                                   *args])
    assert res.exit_code == 1 and message in res.output


def test_cli_compare_cells_set_the_prefix_cache(tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = CliRunner().invoke(app, ["run", "--scenario", "system-prompts", "--num-requests",
                                   "40", "--step-time", "0.02", "--out", str(tmp_path),
                                   "--compare", "chunked:none,chunked:block,chunked:radix:lpm"])
    assert res.exit_code == 0, res.output
    hit = {d: json.loads((tmp_path / d / "summary.json").read_text())["prefix_cache"]
           ["hit_rate_tokens"] for d in ("chunked-none", "chunked-block", "chunked-radix-lpm")}
    assert hit["chunked-none"] is None and hit["chunked-block"] > 0.5
    assert hit["chunked-radix-lpm"] > 0.5
    assert "prefix" in res.stdout


def test_radix_and_block_are_both_prefix_caches() -> None:
    assert isinstance(make_kv("radix", 10), RadixCache)
    assert isinstance(make_kv("block", 10), BlockHashCache)
