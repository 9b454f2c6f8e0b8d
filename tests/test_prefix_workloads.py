"""The generated shared-prefix workloads (scenarios/prefixes.py): the
system-prompts and multi-turn presets, and prompt segments through a saved trace."""

from __future__ import annotations

import pytest

from scenarios.build import build_workload
from scenarios.traces import load_trace, save_trace
from scenarios.workload import Workload
from sim.kv.prefix_content import answer_segment_id


def scenario(name: str, n: int) -> Workload:
    return build_workload(trace=None, trace_format=None, scenario=name, arrival=None,
                          rate=None, burstiness=None, num_requests=n, window_s=None,
                          time_scale=None, max_tokens=None, seed=3)


def test_system_prompts_preset() -> None:
    w = scenario("system-prompts", 400)
    assert w.prompt_segments is not None
    firsts = [segs[0] for segs in w.prompt_segments]
    assert {n for _, n in firsts} == {2048} and len({sid for sid, _ in firsts}) == 8
    top = max(firsts.count(f) for f in set(firsts)) / len(firsts)
    assert 0.3 < top < 0.45  # Zipf(1) over 8: the most popular has 1 / H_8 = 0.368
    assert all(sum(n for _, n in s) == p
               for s, p in zip(w.prompt_segments, w.num_prompt_tokens, strict=True))


def test_multi_turn_preset_grows_each_prompt_by_the_answer() -> None:
    w = scenario("multi-turn", 200)
    assert w.prompt_segments is not None
    by_id = dict(zip(w.request_id, range(len(w)), strict=True))
    follow_ups = 0
    for i, segs in enumerate(w.prompt_segments):
        if len(segs) < 3:
            continue  # a session's first turn: system prompt + message
        prev_answer = segs[-2]
        prev = next(j for j in range(len(w)) if answer_segment_id(w.request_id[j])
                    == prev_answer[0])
        assert w.prompt_segments[prev] == segs[:-2]
        assert prev_answer[1] == w.output_len[prev]
        assert w.arrival_time[i] >= w.arrival_time[prev]
        follow_ups += 1
    assert follow_ups > 100 and len(by_id) == 200


def test_prompt_segments_validated_and_saved(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"prompt_segments\[1\].*sums to 9"):
        Workload.from_arrays([0, 1], [10, 10], [1, 1],
                             prompt_segments=[[(1, 10)], [(1, 4), (2, 5)]])
    w = scenario("system-prompts", 20)
    save_trace(w, tmp_path / "w.csv")
    assert load_trace(tmp_path / "w.csv") == w


@pytest.mark.parametrize("mode", ["block", "radix"])
def test_a_readmission_hit_longer_than_the_prompt_is_held(mode: str) -> None:
    # block_size 1, a 1-token prompt that generated 80 tokens and was preempted: its
    # re-admission finds its 80 computed blocks (the 81st token is always recomputed):
    # 80 blocks, more than the prompt's 1 + 64 a request's block array first had room
    # for (a cluster fuzz case found it).
    from sim.kv.factory import make_kv
    from sim.request import Request

    kv = make_kv(mode, 200, 1)
    req = Request("r", 0.0, 1, 100, 100, 0, 0)
    req.prompt_segments = ((7, 1),)
    assert kv.allocate_slots(req, 1, kv.get_computed_blocks(req)) is not None
    req.num_computed_tokens = 1
    for _ in range(80):  # decode: one block a token
        req.num_output_tokens += 1
        assert kv.allocate_up_to(req, req.num_output_tokens + 1) is not None
        req.num_computed_tokens += 1
    held = list(req.block_ids)
    kv.free(req)  # preempted
    req.num_preemptions, req.num_computed_tokens = 1, 0
    hit = kv.get_computed_blocks(req)
    assert hit.block_ids == held[:80]
    assert kv.allocate_slots(req, req.num_tokens - hit.num_computed_tokens, hit) is not None
    assert req.block_ids[:80] == held[:80] and req.num_computed_tokens == 80
    kv.free(req)
    kv.check_invariants()
