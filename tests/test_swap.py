"""Preemption by swap (vLLM V0): the victim's computed blocks go to a CPU swap space and
come back, keeping num_computed_tokens; transfers cost bytes / PCIe bandwidth.

Workload (c = 1 s): A and B with prompt 16 and 64 output tokens at t = 0, C (prompt 16,
4 tokens) at t = 60; 8 usable blocks of 16 tokens; 2 slots. At step 50 A needs its 5th
block: B (64 computed tokens = 4 blocks) is swapped out. With 1,000 bytes a block at
100,000 B/s each block costs 0.01 s: step 50 lasts 1.04 s. A finishes at the end of step 64
(64.04 s); at step 65 B's 4 blocks come back (+0.04 s) and it decodes its 50th token at
once: no re-prefill. C, though present since t = 60, waits while B is swapped out.
"""

from __future__ import annotations

from typing import Any

import pytest

from sim.config import SchedulerConfig
from tests.conftest import make_requests, run_sim

SWAP: dict[str, Any] = {"preemption_mode": "swap", "kv_bytes_per_block": 1000,
        "pcie_bandwidth_bytes_per_s": 1e5, "num_gpu_blocks": 9, "max_num_seqs": 2}


def workload() -> list:
    return make_requests([64, 64, 4], prompt=16, arrivals=[0, 0, 60])


@pytest.mark.parametrize(("policy", "b_finish", "c_start"), [
    ("chunked", 79.08, 64.04),      # C joins B's swap-in step
    ("continuous", 80.08, 65.08),   # C's prefill-only step stalls B one step
])
def test_swap_keeps_computed_tokens_and_charges_transfers(
    policy: str, b_finish: float, c_start: float
) -> None:
    res = run_sim(workload(), policy, **SWAP)
    df, steps = res.requests, res.steps
    assert list(df["num_preemptions"]) == [0, 1, 0]
    assert list(df["num_swaps"]) == [0, 1, 0]
    assert res.summary["num_swaps"] == 1 and res.summary["num_preemptions"] == 1
    slow = steps[steps["duration_s"] > 1]
    assert list(slow.index + 1) == [50, 65]  # swap-out step, swap-in step
    assert list(slow["duration_s"]) == pytest.approx([1.04, 1.04])
    # Swap-in is a decode: only the three prompts are ever prefilled (no recompute).
    assert steps["num_prefill_tokens"].sum() == 3 * 16
    assert df.loc[0, "finish_time"] == pytest.approx(64.04)
    assert df.loc[1, "finish_time"] == pytest.approx(b_finish)
    assert df.loc[1, "first_token_time"] == 1  # TTFT of its first run
    assert df.loc[2, "first_scheduled_time"] == pytest.approx(c_start)
    assert (df["num_output_tokens"] == [64, 64, 4]).all()


@pytest.mark.parametrize("policy", ["chunked", "continuous"])
def test_full_swap_space_falls_back_to_recompute(policy: str) -> None:
    # 3,000 bytes = 3 blocks of swap space < B's 4 blocks: B is recomputed (prompt 16 +
    # 49 generated tokens re-prefilled at step 65), with no transfer time.
    res = run_sim(workload(), policy, **{**SWAP, "swap_space_bytes": 3000})
    df = res.requests
    assert list(df["num_preemptions"]) == [0, 1, 0] and res.summary["num_swaps"] == 0
    assert (res.steps["duration_s"] == 1).all()
    assert res.steps["num_prefill_tokens"].sum() == 3 * 16 + 65
    assert list(df["finish_time"]) == [64, 79, 68]


def test_swap_requires_block_bytes() -> None:
    with pytest.raises(ValueError, match="kv_bytes_per_block"):
        SchedulerConfig(preemption_mode="swap")
    with pytest.raises(ValueError, match="pcie_bandwidth_bytes_per_s"):
        SchedulerConfig(pcie_bandwidth_bytes_per_s=0)
    with pytest.raises(ValueError, match="swap_space_bytes"):
        SchedulerConfig(swap_space_bytes=-1)
