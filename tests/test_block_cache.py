"""vLLM 0.33's block pool rules that the block cache (sim/kv/block_cache.py,
``--prefix-cache block``) follows beyond a plain LRU cache, each on a hand-computed
schedule: freed blocks without a hash are reused first (``BlockPool.free_blocks``), and a
block computed twice is cached twice (``BlockPool.cache_full_blocks``). vLLM's own
recorded decisions on the same rules: tests/test_oracle.py (v06, v07)."""

from __future__ import annotations

from policies import get_policy_class
from sim.config import SchedulerConfig
from sim.simulate import simulate
from sim.source import RequestListArrivals
from tests.test_prefix_cache import Shapes, req


def test_freed_blocks_without_a_hash_are_reused_before_cached_ones() -> None:
    # vLLM 0.33 BlockPool.free_blocks: a freed block that carries no hash goes to the head
    # of the free queue. 6 usable blocks of 16 tokens, one token out each. C (t=0, 48
    # tokens) takes blocks 1-3 (all full: cached) and frees them, tail first: queue
    # 4 5 6 3 2 1. A (t=1, 40 tokens) takes 4 5 6; 6 holds 8 tokens, no hash: freed to
    # the head: 6 3 2 1 5 4. B (t=3, 10 tokens) takes block 6, evicting nothing, so D
    # (t=5, C's 48 tokens + 5) finds all three of C's blocks: 48 cached tokens. With
    # block 6 at the tail, B would evict C's block 3 and D would find 32.
    reqs = [req(0, [(1, 48)]), req(1, [(2, 40)], arrival=1.0), req(2, [(3, 10)], arrival=3.0),
            req(3, [(1, 48), (4, 5)], arrival=5.0)]
    res = simulate(RequestListArrivals(reqs), policy_factory=get_policy_class("chunked"),
                   config=SchedulerConfig(prefix_cache="block"), cost_model=Shapes(),
                   num_gpu_blocks=7, block_size=16)
    assert [r.num_cached_tokens for r in reqs] == [0, 0, 0, 48]
    assert res.summary["prefix_cache"]["evictions"] == 0


def test_a_block_computed_twice_is_cached_twice() -> None:
    # vLLM 0.33 BlockPool.cache_full_blocks keeps every full block it computed, so a copy
    # survives the eviction of another. Blocks of 16, 7 usable, a budget of 32 tokens,
    # chunks of 16 while two requests are in. X (t=0, 64 shared + 8 tokens, 8 out) takes
    # 32 tokens in step 1 (blocks 1 2); in step 2 X computes shared block 3 (block 3) and
    # Y (t=0.5, the 64 shared + 8) hits 1 2 3 and computes shared block 4 itself (block
    # 4). In step 3 X computes shared block 4 again (block 5: the second copy) and Y ends
    # (its 8 tokens, block 6, freed to the head; block 4 to the tail). X takes block 6
    # for its last 8 tokens and decodes to t=11 holding 1 2 3 5 6. Z (t=4.5, 32 other
    # tokens) takes 7, then 4: Y's copy is evicted and X's block 5 takes its place, so P
    # (t=7.5, the 64 shared + 8) finds all 64 shared tokens, 48 had only the first copy
    # been cached. Evictions: block 4, then the block P takes (Z's, freed at t=7).
    reqs = [req(0, [(1, 64), (2, 8)], 8), req(1, [(1, 64), (3, 8)], arrival=0.5),
            req(2, [(5, 32)], arrival=4.5), req(3, [(1, 64), (4, 8)], arrival=7.5)]
    cfg = SchedulerConfig(prefix_cache="block", max_num_seqs=4, max_num_batched_tokens=32,
                          long_prefill_token_threshold=16)
    res = simulate(RequestListArrivals(reqs), policy_factory=get_policy_class("chunked"),
                   config=cfg, cost_model=Shapes(), num_gpu_blocks=8, block_size=16)
    assert [r.num_cached_tokens for r in reqs] == [0, 48, 0, 64]
    assert res.summary["prefix_cache"]["evictions"] == 2
    assert list(res.requests["finish_time"]) == [11.0, 3.0, 7.0, 9.0]
