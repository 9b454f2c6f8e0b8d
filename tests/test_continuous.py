"""The ``continuous`` policy (prefill-first iteration-level batching, vLLM V0 / Orca):
exact schedules with a constant step time c = 1, hand-computed."""

from __future__ import annotations

import pytest

from tests.conftest import make_requests, run_sim
from tests.test_engine import TEACHING, fractions


def test_teaching_continuous() -> None:
    # Step 1 prefills A..D; step 2 decodes them (B, 2 tokens, finishes). Step 3 is a
    # prefill-only step for E (A, C, D stall); step 4 decodes (C finishes); step 5 is
    # prefill-only for F (A, D, E stall); steps 6-10 decode. 10 steps of 4 slots:
    # useful 27 (= 27 tokens), idle 3 + 3, empty 1 (step 7) + 2 * 3 (steps 8-10).
    res = run_sim(make_requests(TEACHING), "continuous", max_num_seqs=4)
    assert res.summary["duration_s"] == 10
    assert fractions(res.summary) == pytest.approx((27 / 40, 6 / 40, 7 / 40))
    df = res.requests
    assert list(df["first_scheduled_time"]) == [0, 0, 0, 0, 2, 4]
    assert list(df["finish_time"]) == [10, 2, 4, 6, 7, 10]
    steps = res.steps
    assert list(steps["slots_idle"]) == [0, 0, 3, 0, 3, 0, 0, 0, 0, 0]
    assert list(steps["num_decode_tokens"][[2, 4]]) == [0, 0]  # prefill-only steps


def test_k10_preemption_under_continuous() -> None:
    # K10 with whole-prompt prefills: the pool runs out at the same steps as under chunked
    # (watermark int(0.01 * 65) = 0 blocks), the tail is preempted each time.
    res = run_sim(make_requests([192] * 8, prompt=64), "continuous", num_gpu_blocks=65,
                  max_num_seqs=8, max_num_batched_tokens=2048)
    df = res.requests
    assert list(df["num_preemptions"]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert list(res.steps.index[res.steps["num_preempted"] > 0] + 1) == [66, 82, 98, 130]
    assert list(df["finish_time"]) == [192] * 4 + [255, 287, 303, 319]
    assert (df["num_output_tokens"] == 192).all()


def test_prompt_over_token_budget_is_rejected_with_reason() -> None:
    reqs = make_requests([3, 3], prompt=[600, 10])
    res = run_sim(reqs, "continuous", max_num_batched_tokens=512)
    df = res.requests
    assert list(df["status"]) == ["rejected", "finished"]
    assert "max_num_batched_tokens (512)" in df.loc[0, "reason"]
    # chunked serves the same prompt in chunks
    assert (run_sim(make_requests([3, 3], prompt=[600, 10]), "chunked",
                    max_num_batched_tokens=512).requests["status"] == "finished").all()


def test_token_budget_limits_one_prefill_step() -> None:
    # Budget 100: prompts of 60 cannot share a prefill step; each gets its own.
    res = run_sim(make_requests([2, 2, 2], prompt=60), "continuous",
                  max_num_batched_tokens=100)
    assert list(res.requests["first_token_time"]) == [1, 2, 3]


def test_watermark_holds_back_admission_while_others_run() -> None:
    # 201 blocks -> watermark int(0.01 * 201) = 2. A holds 1 block (prompt 16); B's
    # prompt needs 198 blocks: 200 - 1 - 198 = 1 < 2 free -> B waits until A finishes,
    # then, alone, it is admitted without the watermark.
    reqs = make_requests([3, 2], prompt=[16, 198 * 16], arrivals=[0.0, 0.5])
    res = run_sim(reqs, "continuous", num_gpu_blocks=201, max_num_batched_tokens=4096)
    assert list(res.requests["first_scheduled_time"]) == [0, 3]
    res = run_sim(make_requests([3, 2], prompt=[16, 198 * 16], arrivals=[0.0, 0.5]),
                  "chunked", num_gpu_blocks=201, max_num_batched_tokens=4096)
    assert list(res.requests["first_scheduled_time"]) == [0, 1]
