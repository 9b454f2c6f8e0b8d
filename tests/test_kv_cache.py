"""The paged allocator: block math, the null block, all-or-nothing allocation, and
invariants under random use (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.block_pool import KVCacheManager
from tests.conftest import make_requests


@pytest.mark.parametrize(("p", "o", "blocks"), [(16, 1, 1), (16, 2, 2), (4080, 16, 256)])
def test_k03_blocks_at_end(p: int, o: int, blocks: int) -> None:
    kv = KVCacheManager(1000, 16)
    (req,) = make_requests([o], prompt=p)
    # At its end a request has computed P + O - 1 tokens (the last token is never written).
    assert kv.allocate_up_to(req, p + o - 1) is not None
    assert len(req.block_ids) == blocks


def test_null_block_and_all_or_nothing() -> None:
    kv = KVCacheManager(5, 16)  # 4 usable
    a, b = make_requests([1, 1], prompt=40)
    assert kv.num_usable_blocks == 4
    assert kv.allocate_slots(a, 40) == [1, 2, 3]
    assert kv.allocate_slots(b, 40) is None
    assert b.block_ids == [] and kv.num_free_blocks == 1
    a.num_computed_tokens = 40
    assert kv.allocate_slots(a, 8) == []  # 48 tokens still fit in 3 blocks
    assert kv.allocate_slots(a, 9) == [4]
    assert kv.usage == 1.0
    assert kv.free(a) == 4 and kv.num_free_blocks == 4
    assert not kv.can_fit(b, 65) and kv.can_fit(b, 64)


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        KVCacheManager(1, 16)
    with pytest.raises(ValueError, match="block_size"):
        KVCacheManager(10, 0)


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40), st.booleans()), max_size=60))
def test_random_use_never_leaks_or_double_frees(ops: list[tuple[int, int, bool]]) -> None:
    kv = KVCacheManager(20, 4)
    reqs = make_requests([1] * 6, prompt=1)
    for who, n, free in ops:
        r = reqs[who]
        if free:
            kv.free(r)
            r.num_computed_tokens = 0
        elif kv.allocate_slots(r, n) is not None:
            r.num_computed_tokens += n
        kv.check_invariants()
        held = sum(len(x.block_ids) for x in reqs)
        assert held + kv.num_free_blocks == kv.num_usable_blocks
        assert len({b for x in reqs for b in x.block_ids}) == held
    for r in reqs:
        kv.free(r)
    assert kv.num_free_blocks == kv.num_usable_blocks
