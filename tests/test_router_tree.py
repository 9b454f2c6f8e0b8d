"""The SGLang router's approximate prefix tree (policies/router_tree.py) and the
``cache-aware-approx`` router built on it (policies/routers.py): hand-computed matches,
sizes, LRU-leaf eviction, and routing decisions in a cluster."""

from __future__ import annotations

import pytest

from policies.chunked import ChunkedPolicy
from policies.router_tree import ApproxPrefixTree, prompt_path
from policies.routers import make_router
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from sim.cluster import simulate_cluster
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.request import Request
from sim.source import RequestListArrivals

A, B, C = (1, 100), (2, 50), (3, 30)  # (segment id, tokens)


def test_path_keys_name_the_whole_prefix() -> None:
    ab, ac, b = prompt_path([A, B]), prompt_path([A, C]), prompt_path([B])
    assert ab[0] == ac[0] and ab[1] != ac[1]  # same first segment, different second
    assert b[0][0] != ab[1][0]  # segment 2 after A is not segment 2 at the root
    # A shorter cut of the first segment moves everything after it.
    assert prompt_path([(1, 90), B])[1][0] != ab[1][0]
    assert [t for _, t in ab] == [100, 50]


def test_match_and_sizes() -> None:
    tree = ApproxPrefixTree(3)
    tree.insert(prompt_path([A, B]), 0)
    tree.insert(prompt_path([A, C]), 1)
    tree.insert(prompt_path([A]), 1)  # already there: no growth
    assert tree.size_tokens == [150, 130, 0]
    assert tree.match(prompt_path([A, B, C])) == (150, [0], 2)
    assert tree.match(prompt_path([A, (9, 5)])) == (100, [0, 1], 1)
    assert tree.match(prompt_path([B])) == (0, [], 0)
    # A longer cut of a segment matches the cut held; a shorter one matches whole.
    tree.insert(prompt_path([(7, 40)]), 2)
    assert tree.match(prompt_path([(7, 64), B])) == (40, [2], 1)
    assert tree.match(prompt_path([(7, 10)])) == (10, [2], 1)
    tree.insert(prompt_path([(7, 64)]), 2)
    assert tree.size_tokens[2] == 64


def test_eviction_takes_least_recent_leaves_at_the_interval() -> None:
    tree = ApproxPrefixTree(1, max_size_tokens=120, eviction_interval_s=120.0)
    tree.insert(prompt_path([A, B]), 0)  # B is a leaf older than C
    tree.insert(prompt_path([A, C]), 0)
    assert tree.size_tokens == [180]
    tree.evict_due(119.9)  # not due yet
    assert tree.size_tokens == [180]
    # Leaves go oldest first, B then C, until 100 <= 120; A, their parent, stays.
    tree.evict_due(120.0)
    assert tree.size_tokens == [100]
    assert tree.match(prompt_path([A, B])) == (100, [0], 1)
    assert tree.match(prompt_path([A, C])) == (100, [0], 1)
    # The next round is at 240 s: a tree over the limit stays so until then.
    tree.insert(prompt_path([A, B]), 0)
    tree.evict_due(239.0)
    assert tree.size_tokens == [150]
    tree.evict_due(250.0)
    assert tree.size_tokens == [100]
    # A touch refreshes the whole path: after [A, C] and then [A, B], C goes first.
    tree = ApproxPrefixTree(1, max_size_tokens=160)
    tree.insert(prompt_path([A, C]), 0)
    tree.insert(prompt_path([A, B]), 0)
    tree.evict_due(120.0)
    assert tree.size_tokens == [150] and tree.match(prompt_path([A, C])) == (100, [0], 1)


@pytest.mark.parametrize(("args", "field"), [((0,), "num_tenants"),
                                             ((2, 0), "max_size_tokens"),
                                             ((2, 10, 0.0), "eviction_interval_s")])
def test_bad_tree_settings_are_named(args: tuple, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ApproxPrefixTree(*args)


def cluster(requests: list[Request], n: int, router: str, cache: str = "block") -> list[int]:
    res = simulate_cluster(RequestListArrivals(requests), num_replicas=n,
                           router=make_router(router),
                           policy_factory=ChunkedPolicy,
                           config=SchedulerConfig(prefix_cache=cache),
                           cost_model=ConstantCostModel(1.0), num_gpu_blocks=1000)
    return [int(x) for x in res.requests["replica"]]


def shared(n: int, gap: float, prompt: int = 64) -> list[Request]:
    """n requests ``gap`` s apart: a 48-token shared prefix and tokens of their own."""
    out = []
    for i in range(n):
        r = Request(str(i), gap * i, prompt, 1, 1, 0, i)
        r.prompt_segments = ((1, 48), (100 + i, prompt - 48))
        out.append(r)
    return out


def test_simultaneous_shared_prefixes_stay_together() -> None:
    # All 8 arrive at t = 0, before any is scheduled. The first goes to the smaller
    # (both empty: the lower index) tree, and its prompt is recorded there; each next
    # one matches 48 of its 64 tokens (0.75 > 0.3) there. The cache-reading router
    # finds no cache anywhere yet and spreads them by KV load.
    assert cluster(shared(8, 0.0), 2, "cache-aware-approx") == [0] * 8
    assert cluster(shared(8, 0.0), 2, "cache-aware") == [0, 1] * 4


@pytest.mark.parametrize(("prompt", "where"), [(160, [0, 1]), (159, [0, 0])])
def test_approx_needs_more_than_30_percent_matched(prompt: int, where: list[int]) -> None:
    # 48 / 160 = 0.3 is not more than 0.3: the smaller tree (replica 1, empty) gets it.
    assert cluster(shared(2, 10.0, prompt), 2, "cache-aware-approx") == where


def test_a_miss_goes_to_the_smallest_tree() -> None:
    # Prompts of their own, 10 s apart (each done before the next): sizes after each
    # routing 100|0, 100|50, 100|80, 100|120, then 160|120: the smaller tree each time.
    reqs = []
    for i, n in enumerate([100, 50, 30, 40, 60]):
        r = Request(str(i), 10.0 * i, n, 1, 1, 0, i)
        r.prompt_segments = ((1000 + i, n),)
        reqs.append(r)
    assert cluster(reqs, 2, "cache-aware-approx", cache="none") == [0, 1, 1, 1, 0]


def test_load_guard_routes_by_load_and_records_the_prompt() -> None:
    # r0 (t = 0, 200 output tokens) and 70 more at t = 1 sharing its prefix: they follow
    # the tree to replica 0 until it is more than 64 requests and 1.5x ahead; then the
    # guard sends q65 to replica 1 and records the prompt there, so q66 finds both
    # replicas holding the prefix and takes the one with fewer outstanding (1 against
    # 65 + 1): from then on they alternate, as the balanced load allows.
    reqs = shared(71, 0.0)
    for i, r in enumerate(reqs):
        r.arrival_time = 0.0 if i == 0 else 1.0
        r.output_len = r.max_tokens = 200 if i == 0 else 2
    where = cluster(reqs, 2, "cache-aware-approx", cache="radix")
    assert where[:66] == [0] * 65 + [1]
    assert where[66:] == [1, 1, 1, 1, 1]


def test_approx_router_in_a_workload_run() -> None:
    # The router learns prefixes from the workload's segments, also when the caches name
    # blocks by slots fixed before the run (radix), and routes without a cache (none).
    def run(cache: str, router: str) -> dict:
        return simulate_prepared(prepare(RunConfig(
            scenario="multi-turn", num_requests=300, rate=20.0, prefix_cache=cache,
            replicas=2, router=router))).summary

    approx, rr = run("radix", "cache-aware-approx"), run("radix", "round-robin")
    assert approx["prefix_cache"]["hit_tokens"] > rr["prefix_cache"]["hit_tokens"]
    blind = run("none", "cache-aware-approx")
    assert blind["num_finished"] == 300 and blind["prefix_cache"]["mode"] == "none"


def test_a_match_refreshes_the_holders_path() -> None:
    # As SGLang's prefix_match stamps the matched worker's path, whether or not the
    # request then goes there: [A, B] is refreshed past C, so C is evicted first.
    def tree_after(touched: bool) -> ApproxPrefixTree:
        tree = ApproxPrefixTree(1, max_size_tokens=160)
        tree.insert(prompt_path([A, B]), 0)
        tree.insert(prompt_path([C]), 0)
        if touched:
            _, holders, depth = tree.match(prompt_path([A, B, (9, 500)]))
            tree.touch(prompt_path([A, B])[:depth], holders[0])
        tree.evict_due(120.0)
        return tree

    assert tree_after(True).size_tokens == [150]  # C (30) went
    assert tree_after(False).size_tokens == [130]  # B (50) went
