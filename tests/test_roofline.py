"""RooflineCostModel: memory-bound decode, compute-bound prefill, monotonicity, validation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calibration.gpus import get_gpu
from calibration.roofline import (
    DEFAULT_COMPUTE_EFFICIENCY,
    DEFAULT_MEMORY_EFFICIENCY,
    DEFAULT_STEP_OVERHEAD_S,
    RooflineCostModel,
)
from calibration.specs import get_model
from sim.batch import BatchShape
from sim.cost_model import CostModel


def decode(batch: int, context: int) -> BatchShape:
    """``batch`` decodes, each over ``context`` prior tokens."""
    return BatchShape(
        num_decode_seqs=batch, decode_context_tokens=batch * (context + 1), num_sampled_seqs=batch
    )


def prefill(tokens: int, context: int = 0, sampled: int = 1) -> BatchShape:
    """One prefill chunk of ``tokens`` over ``context`` computed tokens."""
    pairs = tokens * context + tokens * (tokens + 1) // 2
    return BatchShape(
        num_prefill_tokens=tokens,
        num_prefill_seqs=1,
        prefill_context_tokens=context,
        prefill_attention_pairs=pairs,
        num_sampled_seqs=sampled,
    )


@pytest.fixture
def llama_h100() -> RooflineCostModel:
    return RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"))


def test_is_a_cost_model(llama_h100: RooflineCostModel) -> None:
    assert isinstance(llama_h100, CostModel)
    assert llama_h100.compute_efficiency == DEFAULT_COMPUTE_EFFICIENCY == 0.7
    assert llama_h100.memory_efficiency == DEFAULT_MEMORY_EFFICIENCY == 0.85
    assert llama_h100.step_overhead_s == DEFAULT_STEP_OVERHEAD_S == 2e-3


def test_batch_one_decode_is_memory_bound(llama_h100: RooflineCostModel) -> None:
    # Independent of the model code: spec-sheet numbers and the Llama-3.1-8B shapes.
    params = 8_030_261_248
    embedding_table = 128_256 * 4096  # a lookup reads one row, not the table
    weight_bytes_read = (params - embedding_table) * 2
    byte_rate = 3.35e12 * 0.85
    expected = weight_bytes_read / byte_rate + 2e-3
    got = llama_h100.step_time(decode(1, 100))
    assert got == pytest.approx(expected, rel=0.01)
    # ... and within 7% of the plain weight_bytes / bandwidth estimate.
    assert got == pytest.approx(params * 2 / byte_rate + 2e-3, rel=0.07)
    compute_s = 2 * params / (989.4e12 * 0.7)
    assert compute_s < 0.01 * (got - 2e-3)


def test_large_prefill_is_compute_bound(llama_h100: RooflineCostModel) -> None:
    tokens = 8192
    lm_head = 128_256 * 4096
    body = 8_030_261_248 - 2 * lm_head  # no embedding lookup, LM head counted separately
    pairs = tokens * (tokens + 1) // 2
    flops = 2 * body * tokens + 2 * lm_head * 1 + 4 * 32 * 32 * 128 * pairs
    expected = flops / (989.4e12 * 0.7) + 2e-3
    assert llama_h100.step_time(prefill(tokens)) == pytest.approx(expected, rel=1e-9)
    memory_s = (8_030_261_248 * 2 + tokens * 131_072) / (3.35e12 * 0.85)
    assert expected - 2e-3 > 5 * memory_s


def test_lm_head_only_for_sampled_rows(llama_h100: RooflineCostModel) -> None:
    chunk = llama_h100.step_time(prefill(8192, sampled=0))
    last = llama_h100.step_time(prefill(8192, sampled=1))
    assert last - chunk == pytest.approx(2 * 128_256 * 4096 / (989.4e12 * 0.7), rel=1e-9)


def test_monotone_in_tokens_and_context(llama_h100: RooflineCostModel) -> None:
    times = [llama_h100.step_time(decode(b, 1000)) for b in (1, 2, 8, 32, 128, 256, 512)]
    assert times == sorted(times) and len(set(times)) == len(times)
    times = [llama_h100.step_time(decode(64, c)) for c in (0, 100, 1000, 10_000, 100_000)]
    assert times == sorted(times) and len(set(times)) == len(times)
    times = [llama_h100.step_time(prefill(n)) for n in (1, 16, 256, 2048, 8192, 16_384)]
    assert times == sorted(times) and len(set(times)) == len(times)
    times = [llama_h100.step_time(prefill(512, c)) for c in (0, 1000, 10_000, 100_000)]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_empty_step_costs_the_overhead(llama_h100: RooflineCostModel) -> None:
    assert llama_h100.step_time(BatchShape()) == 2e-3


def test_efficiencies_scale_their_bound() -> None:
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    base = RooflineCostModel(model, gpu, step_overhead_s=0.0)
    slow_compute = RooflineCostModel(model, gpu, compute_efficiency=0.35, step_overhead_s=0.0)
    slow_memory = RooflineCostModel(model, gpu, memory_efficiency=0.425, step_overhead_s=0.0)
    big = prefill(8192)
    assert slow_compute.step_time(big) == pytest.approx(2 * base.step_time(big), rel=1e-9)
    assert slow_memory.step_time(decode(1, 10)) == pytest.approx(
        2 * base.step_time(decode(1, 10)), rel=1e-9
    )


def test_faster_gpu_is_faster() -> None:
    model = get_model("qwen2.5-7b")
    times = [
        RooflineCostModel(model, get_gpu(g)).step_time(decode(16, 2000))
        for g in ("l4", "a100-80gb", "h100-sxm", "h200-sxm")
    ]
    assert times == sorted(times, reverse=True)


def test_fp32_is_slower_than_bf16() -> None:
    model, gpu = get_model("qwen2.5-0.5b"), get_gpu("a100-80gb")
    bf16 = RooflineCostModel(model, gpu, dtype="bf16").step_time(prefill(4096))
    fp32 = RooflineCostModel(model, gpu, dtype="fp32").step_time(prefill(4096))
    assert fp32 > 5 * bf16


def test_moe_reads_only_touched_experts() -> None:
    model = get_model("mixtral-8x7b")
    cost = RooflineCostModel(model, get_gpu("h200-sxm"), step_overhead_s=0.0)
    byte_rate = 4.8e12 * 0.85
    expert_bytes = 32 * 8 * 3 * 4096 * 14_336 * 2
    non_expert = model.weight_bytes() - expert_bytes - 32_000 * 4096 * 2  # no embedding read
    one = cost.step_time(decode(1, 10))
    # One token touches 2 of 8 experts per layer.
    assert one == pytest.approx((non_expert + expert_bytes / 4) / byte_rate, rel=0.01)
    times = [cost.step_time(decode(b, 10)) for b in (1, 2, 4, 16, 64)]
    assert times == sorted(times)
    # 64 tokens touch practically all experts: 8 * (1 - (6/8)^64) ~ 8.
    assert times[-1] == pytest.approx((non_expert + expert_bytes) / byte_rate, rel=0.02)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"dtype": "int8"}, "dtype"),
        ({"compute_efficiency": 0.0}, "compute_efficiency"),
        ({"compute_efficiency": 1.2}, "compute_efficiency"),
        ({"memory_efficiency": -0.5}, "memory_efficiency"),
        ({"step_overhead_s": -1e-3}, "step_overhead_s"),
        ({"step_overhead_s": float("nan")}, "step_overhead_s"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"tensor_parallel_size": 3}, "tensor_parallel_size"),
    ],
)
def test_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), **kwargs)  # type: ignore[arg-type]


def test_tensor_parallel_needs_interconnect_numbers() -> None:
    bare = replace(get_gpu("h100-sxm"), interconnect_bandwidth_bytes_per_s=None)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        RooflineCostModel(get_model("llama-3.1-8b"), bare, tensor_parallel_size=2)


def test_tensor_parallel_with_interconnect_numbers() -> None:
    model = get_model("llama-3.1-70b")
    # Illustrative interconnect figures for the test only (not the preset's).
    gpu = replace(
        get_gpu("h100-sxm"), interconnect_bandwidth_bytes_per_s=300e9, interconnect_latency_s=1e-5
    )
    tp2 = RooflineCostModel(model, gpu, tensor_parallel_size=2, step_overhead_s=0.0)
    tp4 = RooflineCostModel(model, gpu, tensor_parallel_size=4, step_overhead_s=0.0)
    big = prefill(4096)
    assert tp4.step_time(big) < tp2.step_time(big)
    # Decode of one token: weights / N plus 2 * 80 all-reduce latencies.
    weights_per_gpu = (model.weight_bytes() - 128_256 * 8192 * 2) / 4
    comm = 160 * (1e-5 + 1.5 * 8192 * 2 / 300e9)
    assert tp4.step_time(decode(1, 10)) == pytest.approx(
        weights_per_gpu / (3.35e12 * 0.85) + comm, rel=0.01
    )


def test_decode_run_times_equal_step_time_bit_for_bit() -> None:
    from calibration.gpus import get_gpu
    from calibration.roofline import RooflineCostModel
    from calibration.specs import get_model
    from sim.batch import BatchShape

    for model, gpu in (("llama-3.1-8b", "h100-sxm"), ("qwen2.5-0.5b", "l4"),
                       ("mixtral-8x7b", "h200-sxm")):
        rl = RooflineCostModel(get_model(model), get_gpu(gpu))
        for n, ctx, growth in ((1, 1, 1), (37, 40_321, 37), (256, 3_000_000, 256)):
            got = rl.decode_run_times(n, n, ctx, growth, 50)
            want = [rl.step_time(BatchShape(0, 0, 0, 0, n, ctx + j * growth, n))
                    for j in range(50)]
            assert got == want
            # With a deadline: the steps whose start (back to back from 100.0) comes
            # before it, and always the first; the 11th step starts exactly at it.
            until = 100.0
            for price in want[:10]:
                until = until + price
            assert rl.decode_run_times(n, n, ctx, growth, 50, 100.0, until) == want[:10]
            assert rl.decode_run_times(n, n, ctx, growth, 50, 100.0, 99.0) == want[:1]
