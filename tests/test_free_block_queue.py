"""The block cache's LRU free queue (sim/kv/free_block_queue.py): vLLM's
FreeKVCacheBlockQueue operations on a hand-computed sequence, and against a plain list
under random use (hypothesis), stale entries, their bound and the queue's compaction
included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.free_block_queue import FreeKVCacheBlockQueue


def append(q: FreeKVCacheBlockQueue, blocks: list[int]) -> None:
    q.append_n(np.array(blocks, np.int64), list(blocks))


def test_blocks_leave_in_the_order_they_were_freed() -> None:
    q = FreeKVCacheBlockQueue(7)  # blocks 1-6; 0 is the null block
    assert q.get_all_free_blocks() == [1, 2, 3, 4, 5, 6] and q.num_free_blocks == 6
    assert q.popleft() == 1
    assert q.popleft_n(2) == [2, 3]
    append(q, [3, 2])  # a request's blocks, tail first
    assert q.get_all_free_blocks() == [4, 5, 6, 3, 2]
    q.remove(np.array([5]))  # a hit on a free block: out of the middle
    assert q.get_all_free_blocks() == [4, 6, 3, 2] and q.num_free_blocks == 4
    arr, got = q.popleft_n_array(3)  # past the removed block's entry
    assert got == [4, 6, 3] and arr.tolist() == [4, 6, 3]
    assert q.popleft() == 2 and q.num_free_blocks == 0
    append(q, [5, 1])
    assert q.popleft() == 5 and q.get_all_free_blocks() == [1]
    q.prepend_n([4, 6])  # blocks without a hash: reused before any cached block
    assert q.get_all_free_blocks() == [4, 6, 1] and q.num_free_blocks == 3
    arr, got = q.popleft_n_array(2)
    assert got == [4, 6] and arr.tolist() == [4, 6]
    q.prepend_n([3])
    assert q.popleft_n(2) == [3, 1] and q.num_free_blocks == 0
    q.check()


@settings(deadline=None)
@given(st.integers(2, 12), st.lists(st.tuples(st.integers(0, 4), st.integers(0, 99)),
                                    max_size=80))
def test_the_queue_behaves_as_a_list(num_blocks: int, ops: list[tuple[int, int]]) -> None:
    q = FreeKVCacheBlockQueue(num_blocks + 1)
    model = list(range(1, num_blocks + 1))
    held: list[int] = []
    uncached: set[int] = set()  # put at the head: never removed from the middle
    for op, x in ops:
        if op == 0 and model:  # popleft
            assert q.popleft() == model[0]
            held.append(model.pop(0))
        elif op == 1 and model:  # popleft_n, as a list or also as an array
            k = x % len(model) + 1
            if x % 2:
                arr, got = q.popleft_n_array(k)
                assert arr.tolist() == got
            else:
                got = q.popleft_n(k)
            assert got == model[:k]
            held += model[:k]
            del model[:k]
        elif op == 2 and model:  # remove a few free (cached) blocks
            gone = [b for b in model[x % len(model)::3] if b not in uncached]
            q.remove(np.array(gone, np.int64))
            model = [b for b in model if b not in gone]
            held += gone
        elif op == 3 and held:  # free some held blocks, in a shuffled order
            back = held[x % len(held)::2][::-1]
            append(q, back)
            model += back
            held = [b for b in held if b not in back]
        elif op == 4 and held:  # free some held blocks that carry no hash: to the head
            front = held[x % len(held)::2]
            q.prepend_n(front)
            model = front + model
            uncached |= set(front)
            held = [b for b in held if b not in front]
        assert q.get_all_free_blocks() == model and q.num_free_blocks == len(model)
        q.check()
