"""Fast-path runs of a prefill's chunks beside the decode group (chunked's promise with
``SteadyDecode.prefill``): the steps they advance at once, and the same records as the
step-by-step reference on workloads whose prompts take several chunks."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.batch import (
    BatchShape,
    ChunkedPrefill,
    LastChunkAdmission,
    SteadyDecode,
    chunk_shape,
    shape_of,
)
from sim.chunk_run import prefill_step_times
from sim.config import SchedulerConfig
from sim.request import Request
from tests.test_fastpath import assert_same, run


def test_prefill_chunks_beside_a_decode_group_run_at_once(fast_runs: list[int]) -> None:
    # A (prompt 20, 200 tokens) is admitted into an idle engine and prefilled by a run
    # of 1 step, then decodes alone until B (prompt 1000, 5 tokens) arrives at
    # 0.5 s (69 ContextCost steps in). B's chunks beside A's decode, 256 - 1 = 255
    # tokens a step (255, 255, 255, 235: the last samples its first token), run as one
    # run of 4 steps, admission included; then A and B decode for B's 4 other tokens,
    # then A alone for the rest of its 200.
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=4096)
    args = {"output_lens": [200, 5], "prompt": [20, 1000], "arrivals": [0.0, 0.5]}
    ref = run(args, cfg, "chunked", 1000, 16, fast=False)
    assert fast_runs == []
    fast = run(args, cfg, "chunked", 1000, 16, fast=True)
    # A's decode steps that start before B's arrival, by ContextCost's formula: its
    # prefill (20 tokens, 20 * 21 / 2 attention pairs), then one decode a step over a
    # context of 21, 22, ... tokens.
    t, before_b = 0.0071 + 1.3e-4 * 20 + 2.9e-6 * (20 * 21 // 2), 0
    while t < 0.5:
        t += 0.0071 + 3.1e-5 + 7.7e-7 * (21 + before_b)
        before_b += 1
    assert before_b == 69
    assert fast_runs == [1, before_b, 4, 4, 200 - 1 - before_b - 4 - 4]
    prefill = fast.steps[fast.steps["num_prefill_tokens"] > 0]
    assert prefill["num_prefill_tokens"].tolist() == [20, 255, 255, 255, 235]
    assert fast.steps.equals(ref.steps)
    assert fast.requests.equals(ref.requests)


def test_a_last_chunk_and_the_admission_beside_it_end_one_run(fast_runs: list[int]) -> None:
    # A (prompt 600) and B (prompt 500) arrive at 0; A is admitted and prefilled 256
    # tokens a step (budget 256, no decodes) while B waits: 256, 256, then A's last chunk
    # of 88 beside B's first chunk of the 168 left (a step schedule() would also plan: no
    # other request waits). One run of 3 steps, the last admitting B.
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=4096)
    args = {"output_lens": [3, 2], "prompt": [600, 500], "arrivals": [0.0, 0.0]}
    ref = run(args, cfg, "chunked", 1000, 16, fast=False)
    assert fast_runs == []
    fast = run(args, cfg, "chunked", 1000, 16, fast=True)
    assert fast_runs[0] == 3
    steps = fast.steps
    assert steps["num_prefill_tokens"].tolist()[:3] == [256, 256, 88 + 168]
    assert steps["num_seqs"].tolist()[:3] == [1, 1, 2]
    assert steps["num_waiting"].tolist()[:3] == [1, 1, 0]
    # B's blocks (168 tokens: 11 of 16) count in that step's row: 600 / 16 -> 38, + 11.
    assert steps["kv_blocks_used"].tolist()[2] == 38 + 11
    assert fast.steps.equals(ref.steps)
    assert fast.requests.equals(ref.requests)


def test_a_run_goes_past_an_arrival_its_full_chunks_leave_waiting(fast_runs: list[int]
                                                                  ) -> None:
    # As above, but B arrives at 1 ms, during A's first step. A's chunks take the whole
    # budget, so B waits whatever the step: the run goes on past its arrival, recording
    # it as waiting from the second step, and stops before A's last chunk of 88, whose
    # leftover 168 tokens admit B (the next run, of that one step). C, arriving at 2 ms
    # with a prompt over max_model_len, is rejected as it arrives and never waits.
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=4096)
    args = {"output_lens": [3, 2, 1], "prompt": [600, 500, 5000],
            "arrivals": [0.0, 0.001, 0.002]}
    ref = run(args, cfg, "chunked", 1000, 16, fast=False)
    fast = run(args, cfg, "chunked", 1000, 16, fast=True)
    assert fast_runs[:2] == [2, 1]
    steps = fast.steps
    assert steps["num_prefill_tokens"].tolist()[:3] == [256, 256, 88 + 168]
    assert steps["num_waiting"].tolist()[:3] == [0, 1, 0]
    assert fast.requests["status"].tolist() == ["finished", "finished", "rejected"]
    assert fast.steps.equals(ref.steps)
    assert fast.requests.equals(ref.requests)
    # With long_prefill_token_threshold 200, B's arrival brings the cap into force (two
    # requests then run or wait): A's next chunk is 200 and the 56 left admit B. That
    # step sees the arrival, so the run before it ends there.
    fast_runs.clear()
    args = {"output_lens": [3, 2], "prompt": [600, 500], "arrivals": [0.0, 0.001]}
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=4096,
                          long_prefill_token_threshold=200)
    ref = run(args, cfg, "chunked", 1000, 16, fast=False)
    fast = run(args, cfg, "chunked", 1000, 16, fast=True)
    assert fast_runs[0] == 1
    assert fast.steps["num_seqs"].tolist()[:2] == [1, 2]
    assert fast.steps.equals(ref.steps)
    assert fast.requests.equals(ref.requests)


def test_a_run_cut_by_an_arrival_prices_no_step_past_the_cut() -> None:
    # A's prompt of 1,000 takes ten chunks of 100 beside two decodes, the last beside
    # B's admission. Every step costs 0.01 s and an arrival comes at 0.015 s: the run is
    # two steps (the second starts at 0.01, before it), and seeing that the third would
    # start at 0.02 takes its price: 3 prices, not the eleven of the whole prompt.
    a = Request("a", 0.0, 1000, 5, 5)
    b = Request("b", 0.0, 300, 5, 5)
    admits = LastChunkAdmission(b, 100, 7, 7, lambda: None)
    steady = SteadyDecode([], [], BatchShape(num_decode_seqs=2, decode_context_tokens=40,
                                             num_sampled_seqs=2), 2,
                          prefill=ChunkedPrefill(a, 100, True, admits))
    priced: list[BatchShape] = []

    def step_time(shape: BatchShape) -> float:
        priced.append(shape)
        return 0.01

    times, dts = prefill_step_times(steady, [100] * 10, step_time, 0.0, 0.015, None,
                                    admits=admits)
    assert dts == [0.01, 0.01] and times == [0.0, 0.01, 0.02]
    assert len(priced) == 3
    assert [s.prefill_context_tokens for s in priced] == [0, 100, 200]


@st.composite
def long_prompts(draw: st.DrawFn) -> tuple[dict, SchedulerConfig, str, int, int]:
    """Chunked prefill with prompts of several chunks beside decoding requests: runs cut
    by arrivals and finishes, by full pools (preemption, recompute prefills of requests
    that sampled before), by a waiting request a last chunk's leftover budget admits, by
    long_prefill_token_threshold and max_model_len."""
    n = draw(st.integers(2, 16))
    outs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 440), min_size=n, max_size=n))  # > 420: rejected
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.3]), min_size=n,
                         max_size=n))
    bs = draw(st.sampled_from([4, 16]))
    blocks = draw(st.integers(30, 120)) if bs == 16 else draw(st.integers(120, 480))
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(2, 10)),
        max_num_batched_tokens=draw(st.integers(16, 160)),
        max_model_len=draw(st.sampled_from([420, 4096])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 24])),
        queue=draw(st.sampled_from(["fcfs", "priority"])),
        kv_allocation=draw(st.sampled_from(["paged", "paged", "reserve"])),
    )
    args = {"output_lens": outs, "prompt": prompts, "arrivals": list(np.cumsum(gaps)),
            "priorities": draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))}
    return args, cfg, "chunked", blocks, bs


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_prompts())
def test_prefill_runs_equal_step_by_step(w: tuple[dict, SchedulerConfig, str, int, int]
                                          ) -> None:
    assert_same(*w)


@given(st.integers(1, 500), st.integers(0, 40), st.integers(0, 500), st.integers(1, 600),
       st.integers(0, 64), st.integers(0, 10_000))
def test_chunk_shape_is_shape_of(prompt: int, output: int, computed: int, n: int,
                                 decodes: int, context: int) -> None:
    req = Request("r", 0.0, prompt, 50, 50)
    req.num_output_tokens = output
    req.num_computed_tokens = computed
    assert chunk_shape(prompt + output, output > 0, computed, n, decodes, context) \
        == shape_of([(req, n)], decodes, context)
