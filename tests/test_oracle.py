"""servesim's ``chunked`` policy against vLLM 0.33's own scheduler, recorded step by step
by ../shared/vllm-oracle/oracle.py and vendored, trimmed, in tests/data/vllm_oracle (no
vLLM and no ../shared needed; tests/data/README.md says how). With a constant step time of
1 s and arrival_time = arrival_step, a request's first token time equals vLLM's
first_token_step and its finish time equals finish_step; per-step token totals and
preemptions match."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from policies.chunked import ChunkedPolicy
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.request import Request
from sim.simulate import simulate
from sim.source import ColumnArrivals, RequestListArrivals

ORACLE = Path(__file__).resolve().parent / "data" / "vllm_oracle"
CASES = ["a_preempt_fcfs", "b1_long_prefill_no_threshold", "b2_long_prefill_threshold_2048",
         "b3_threshold_2048_with_background", "d_four_slots", "t_upstream_concurrent_partial",
         "e1_random_fcfs", "c_priority", "c2_priority_tight_pool"]
#: With prefix caching on shared content (../shared/vllm-oracle/prefix): ports of vLLM's
#: tests/v1/core/test_prefix_caching.py and two probes, v06 (freed blocks without a hash
#: are reused first) and v07 (a block computed twice is cached twice).
PREFIX_CASES = ["v01_test_prefill", "v02_test_evict", "v03_test_computed_blocks_not_evicted",
                "v04_test_hash_block_correct_reuse", "v05_hit_capped_num_tokens_minus_1",
                "v06_probe_unhashed_blocks_reused_first", "v07_probe_duplicate_cached_blocks"]


def test_every_vendored_trace_is_checked() -> None:
    """A trace file that vanishes fails here (and in its case); a new one needs a case."""
    assert sorted(p.name for p in ORACLE.glob("*.trace.json")) == sorted(
        f"{c}.trace.json" for c in CASES)
    assert sorted(p.name for p in (ORACLE / "prefix").glob("*.trace.json")) == sorted(
        f"{c}.trace.json" for c in PREFIX_CASES)


def _config(ec: dict[str, Any], **extra: Any) -> SchedulerConfig:
    """The scheduler settings of an oracle trace's ``effective_config``."""
    return SchedulerConfig(
        max_num_seqs=ec["max_num_seqs"], max_num_batched_tokens=ec["max_num_batched_tokens"],
        max_model_len=ec["max_model_len"],
        long_prefill_token_threshold=ec["long_prefill_token_threshold"],
        scheduler_reserve_full_isl=ec["scheduler_reserve_full_isl"], queue=ec["policy"],
        **extra)


@pytest.mark.parametrize("case", CASES)
def test_chunked_matches_vllm(case: str) -> None:
    trace = json.loads((ORACLE / f"{case}.trace.json").read_text())
    ec, reqs = trace["effective_config"], trace["requests"]
    cfg = _config(ec)
    arrivals = ColumnArrivals(
        [float(r["arrival_step"]) for r in reqs], [r["num_prompt_tokens"] for r in reqs],
        [r["output_len"] for r in reqs], [r["output_len"] for r in reqs],
        [r["priority"] for r in reqs], [r["request_id"] for r in reqs],
    )
    res = simulate(arrivals, policy_factory=ChunkedPolicy, config=cfg,
                   cost_model=ConstantCostModel(1.0), num_gpu_blocks=ec["num_gpu_blocks"],
                   block_size=ec["block_size"])
    got = res.requests.set_index("request_id")
    for r in reqs:
        row = got.loc[r["request_id"]]
        assert (row["first_token_time"], row["finish_time"], row["num_preemptions"]) == (
            r["first_token_step"], r["finish_step"], r["num_preemptions"]), r["request_id"]
        assert row["num_output_tokens"] == r["num_output_tokens"]
    # Per busy step: total scheduled tokens and preemptions, in step order.
    busy = [s for s in trace["steps"] if not s.get("idle")]
    steps = res.steps
    assert len(steps) == len(busy)
    assert list(steps["num_prefill_tokens"] + steps["num_decode_tokens"]) == [
        s["total_scheduled_tokens"] for s in busy]
    assert list(steps["num_preempted"]) == [len(s["preempted"]) for s in busy]
    assert list(steps["start_time"] + 1) == [s["step"] for s in busy]


@pytest.mark.parametrize("case", PREFIX_CASES)
def test_block_cache_matches_vllm(case: str) -> None:
    """vLLM's prefix caching (``--prefix-cache block``): per request the first-token and
    finish steps and the prompt tokens found cached at its first admission; per run the
    cached blocks evicted."""
    trace = json.loads((ORACLE / "prefix" / f"{case}.trace.json").read_text())
    ec = trace["effective_config"]
    reqs = []
    for i, r in enumerate(trace["requests"]):
        q = Request(r["request_id"], float(r["arrival_step"]), r["num_prompt_tokens"],
                    r["output_len"], r["output_len"], r["priority"], i)
        q.prompt_segments = tuple((s, n) for s, n in r["prompt_segments"])
        reqs.append(q)
    reqs.sort(key=lambda q: (q.arrival_time, q.index))
    res = simulate(RequestListArrivals(reqs), policy_factory=ChunkedPolicy,
                   config=_config(ec, prefix_cache="block"), cost_model=ConstantCostModel(1.0),
                   num_gpu_blocks=ec["num_gpu_blocks"], block_size=ec["block_size"])
    got = res.requests.set_index("request_id")
    by_id = {q.request_id: q for q in reqs}
    for r in trace["requests"]:
        row = got.loc[r["request_id"]]
        assert (row["first_token_time"], row["finish_time"],
                by_id[r["request_id"]].num_cached_tokens) == (
            r["first_token_step"], r["finish_step"], r["num_cached_tokens"]), r["request_id"]
    assert res.summary["prefix_cache"]["evictions"] == trace["evicted_blocks"]
