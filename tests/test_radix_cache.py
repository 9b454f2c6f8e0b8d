"""SGLang's radix-tree mode (sim/kv/radix_cache.py): hand-computed hits, splits where a match
ends, deduplication, leaf-first LRU eviction of whole runs, and the tree's invariants
under random use (hypothesis). What both modes share is in tests/test_prefix_cache.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.block_cache import BlockHashCache
from sim.kv.radix_cache import RadixCache
from tests.conftest import cache_op
from tests.test_prefix_cache import admit, req, run_cached


def test_shared_prefix_is_split_where_the_match_ends() -> None:
    kv = RadixCache(9, 4)  # 8 usable blocks of 4 tokens
    x = req(0, [(1, 8), (2, 4)])
    y = req(1, [(1, 8), (3, 4)])
    assert admit(kv, x) == [] and x.block_ids == [1, 2, 3]
    assert kv._run[3] == [1, 2, 3]  # one insert, one run (SGLang node)
    assert admit(kv, y) == [1, 2] and y.block_ids == [1, 2, 4]
    assert kv._run[2] == [1, 2] and kv._run[3] == [3] and kv._run[4] == [4]
    assert kv._children[2] == 2 and kv._ref_cnt[1] == kv._ref_cnt[2] == 2
    kv.check_invariants()


def test_eviction_takes_the_least_recently_used_leaf_run() -> None:
    kv = RadixCache(7, 4)  # 6 usable blocks
    x, y = req(0, [(1, 8), (2, 4)]), req(1, [(1, 8), (3, 4)])
    admit(kv, x)
    admit(kv, y)
    kv.free(y)  # Y's leaf [4] becomes evictable first; the prefix is still X's
    kv.free(x)  # then X's leaf [3]; the prefix [1, 2] has two children
    assert kv.num_free_blocks == 6 and kv._free == [6, 5]
    z = req(2, [(9, 12)])  # 3 blocks: the 2 empty ones, then the oldest leaf: Y's
    admit(kv, z)
    assert sorted(z.block_ids) == [4, 5, 6] and kv.stats.evicted_blocks == 1
    assert kv.get_computed_blocks(req(3, [(1, 8), (2, 4), (7, 4)])).block_ids == [1, 2, 3]
    assert kv.get_computed_blocks(req(4, [(1, 8), (3, 4), (7, 4)])).block_ids == [1, 2]
    kv.check_invariants()


def test_a_referenced_prefix_is_never_evicted() -> None:
    kv = RadixCache(7, 4)
    x, y = req(0, [(1, 8), (2, 4)]), req(1, [(1, 8), (3, 4)])
    admit(kv, x)
    admit(kv, y)
    kv.free(x)  # only X's leaf [3] is free; the prefix is Y's
    assert kv.num_free_blocks == 2 + 1
    big = req(2, [(9, 16)])
    miss = kv.get_computed_blocks(big)
    assert miss.block_ids == []
    assert kv.allocate_slots(big, 16, miss) is None  # 4 blocks: more than empty + leaf
    # 3 blocks: X's leaf evicted onto the empty stack, so taken first, then 5 and 6.
    assert kv.allocate_slots(big, 12, miss) == [3, 5, 6]
    assert kv.stats.evicted_blocks == 1 and kv.get_computed_blocks(
        req(3, [(1, 8), (3, 4), (7, 4)])).block_ids == [1, 2, 4]
    kv.check_invariants()


def test_whole_leaf_runs_are_evicted_like_sglang_nodes() -> None:
    kv = RadixCache(9, 4)  # 8 usable blocks
    a = req(0, [(1, 20)])  # one insert of 5 blocks: one run
    admit(kv, a)
    kv.free(a)
    b = req(1, [(2, 8)])  # 2 blocks: the 3 empty ones suffice
    admit(kv, b)
    assert kv.stats.evicted_blocks == 0
    c = req(2, [(3, 8)])  # 2 more: 1 empty, then the run goes whole (5 blocks)
    admit(kv, c)
    assert kv.stats.evicted_blocks == 5 and len(kv._free) == 4
    kv.check_invariants()


def test_a_recomputed_block_is_deduplicated() -> None:
    # Identical 16-token prompts: B hits 3 blocks (its last token is always computed),
    # recomputes the 4th, and adopts A's copy of it (SGLang frees the duplicate);
    # vLLM's block mode caches B's own copy too, as a second copy: 5 cached blocks.
    for cls, shared, cached in ((RadixCache, True, 4), (BlockHashCache, False, 5)):
        kv = cls(20, 4)
        a, b = req(0, [(1, 16)]), req(1, [(1, 16)])
        admit(kv, a)
        a_blocks = list(a.block_ids)
        kv.free(a)
        assert admit(kv, b) == a_blocks[:3]
        assert (b.block_ids == a_blocks) is shared
        assert kv.num_used_blocks == 4 and kv._index.num_cached() == cached
        kv.check_invariants()


def test_radix_and_block_give_the_same_hits_without_eviction() -> None:
    def workload() -> list:  # type: ignore[type-arg]
        return [req(i, [(i % 3, 40), (50 + i, 9 * i + 5)], 6, arrival=2.0 * i)
                for i in range(12)]
    block = run_cached(workload(), "block").summary["prefix_cache"]
    radix = run_cached(workload(), "radix").summary["prefix_cache"]
    assert block["hit_tokens"] == radix["hit_tokens"] > 0
    assert block["evictions"] == radix["evictions"] == 0


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 12), st.booleans()),
                max_size=50))
def test_random_use_keeps_the_tree_consistent(ops: list[tuple[int, int, bool]]) -> None:
    """Prompts from a small tree of segments (so hits end inside runs and split them,
    copies get deduplicated and leaves evicted); the tree and the pool stay consistent
    and every block is free once every request is released."""
    kv = RadixCache(14, 4)
    trunks = [[(1, 8)], [(1, 8), (2, 6)], [(1, 8), (3, 4)], [(1, 16)]]
    reqs = [req(i, [*trunks[i % 4], (40 + i, 1 + i)]) for i in range(8)]
    for who, extra, free in ops:
        cache_op(kv, reqs[who], extra, free, 4)
        kv.check_invariants()
    for r in reqs:
        kv.free(r)
    kv.check_invariants()
    assert max(kv._ref_cnt) == 0 and kv.num_free_blocks == kv.num_usable_blocks
