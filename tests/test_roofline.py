"""RooflineCostModel: operators priced one by one (memory-bound decode, compute-bound prefill,
a mixed step paying both), per-sequence cost, monotonicity, MoE, validation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calibration.gpus import get_gpu
from calibration.roofline import (
    DEFAULT_COMPUTE_EFFICIENCY,
    DEFAULT_MEMORY_EFFICIENCY,
    DEFAULT_PER_SEQ_OVERHEAD_S,
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


def bare(model: str = "llama-3.1-8b", gpu: str = "h100-sxm",
         **kwargs: float) -> RooflineCostModel:
    """The roofline without its step and per-sequence overheads."""
    return RooflineCostModel(get_model(model), get_gpu(gpu), step_overhead_s=0.0,
                             per_seq_overhead_s=0.0, **kwargs)  # type: ignore[arg-type]


H100_BYTES_PER_S = 3.35e12 * 0.9
H100_FLOPS = 989.4e12 * 0.77


def test_is_a_cost_model(llama_h100: RooflineCostModel) -> None:
    assert isinstance(llama_h100, CostModel)
    assert llama_h100.compute_efficiency is None  # the GPU's measured GEMM fraction
    assert get_gpu("h100-sxm").gemm_efficiency == 0.77 and DEFAULT_COMPUTE_EFFICIENCY == 0.75
    assert llama_h100.memory_efficiency == DEFAULT_MEMORY_EFFICIENCY == 0.9
    assert llama_h100.step_overhead_s == DEFAULT_STEP_OVERHEAD_S == 1.25e-3
    assert llama_h100.per_seq_overhead_s == DEFAULT_PER_SEQ_OVERHEAD_S == 40e-6


def test_batch_one_decode_is_memory_bound() -> None:
    # Independent of the model code: spec-sheet numbers and the Llama-3.1-8B shapes.
    params = 8_030_261_248
    embedding_table = 128_256 * 4096  # a lookup reads one row, not the table
    weight_bytes_read = (params - embedding_table) * 2
    expected = weight_bytes_read / H100_BYTES_PER_S
    got = bare().step_time(decode(1, 100))
    # Activations, element-wise work and 101 tokens of KV add about 0.1%.
    assert got == pytest.approx(expected, rel=0.003) and got > expected
    full = RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm"))
    assert full.step_time(decode(1, 100)) == pytest.approx(got + 1.25e-3 + 40e-6, rel=1e-12)


def test_large_prefill_is_compute_bound() -> None:
    tokens = 8192
    lm_head = 128_256 * 4096
    norms = 32 * 2 * 4096 + 4096  # weights but no matmul
    body = 8_030_261_248 - 2 * lm_head - norms  # no embedding lookup, LM head apart
    pairs = tokens * (tokens + 1) // 2
    flops = 2 * body * tokens + 4 * 32 * 32 * 128 * pairs
    got = bare().step_time(prefill(tokens, sampled=0))
    # Only the element-wise work is memory-bound: 32 layers x (4h + 2 (q + kv) + 3f + 6h)
    # elements of 2 bytes a token.
    elementwise = 32 * 2 * (10 * 4096 + 2 * (4096 + 1024) + 3 * 14_336) * tokens
    assert got == pytest.approx(flops / H100_FLOPS + elementwise / H100_BYTES_PER_S, rel=1e-6)


def test_mixed_step_pays_compute_bound_linears_and_memory_bound_attention() -> None:
    # A 450-token chunk beside 62 decodes over 2,000 tokens each: the chunk's linear layers
    # are compute-bound, the decodes' KV reads memory-bound, and the two add up.
    cost = bare("llama-2-7b", "a100-80gb")
    chunk = prefill(450, sampled=0)
    decodes = decode(62, 2000)
    mixed = BatchShape(450, 1, 0, chunk.prefill_attention_pairs, 62,
                       decodes.decode_context_tokens, 62)
    kv_read = 62 * 2001 * 2 * 32 * 32 * 128 * 2 / (2.039e12 * 0.9)
    assert cost.step_time(mixed) > cost.step_time(chunk) + 0.9 * kv_read
    one_max = max(cost.step_time(prefill(512, sampled=62)), kv_read)
    assert cost.step_time(mixed) > 1.3 * one_max


def test_decode_step_grows_with_batch_by_the_per_sequence_cost() -> None:
    cost = RooflineCostModel(get_model("qwen2.5-0.5b"), get_gpu("l4"))
    no_seq = RooflineCostModel(get_model("qwen2.5-0.5b"), get_gpu("l4"), per_seq_overhead_s=0.0)
    for b in (1, 8, 32):
        assert cost.step_time(decode(b, 0)) - no_seq.step_time(decode(b, 0)) == pytest.approx(
            b * 40e-6, rel=1e-9)


def test_lm_head_only_for_sampled_rows(llama_h100: RooflineCostModel) -> None:
    chunk = llama_h100.step_time(prefill(8192, sampled=0))
    last = llama_h100.step_time(prefill(8192, sampled=1))
    # One row: the head's weights are read (memory-bound); the sequence count is the same.
    assert last - chunk == pytest.approx(2 * 128_256 * 4096 / H100_BYTES_PER_S, rel=1e-9)


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
    assert llama_h100.step_time(BatchShape()) == 1.25e-3


def test_efficiencies_scale_their_bound() -> None:
    base = bare(compute_efficiency=0.7)
    slow_compute = bare(compute_efficiency=0.35)
    slow_memory = bare(compute_efficiency=0.7, memory_efficiency=0.45)
    big = prefill(8192, sampled=0)
    # All but the element-wise work (memory-bound, about 4% of this step) doubles.
    e = 32 * 2 * (10 * 4096 + 2 * (4096 + 1024) + 3 * 14_336) * 8192 / H100_BYTES_PER_S
    assert slow_compute.step_time(big) - e == pytest.approx(2 * (base.step_time(big) - e),
                                                            rel=1e-9)
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
    cost = bare("mixtral-8x7b", "h200-sxm")
    byte_rate = 4.8e12 * 0.9
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
        ({"per_seq_overhead_s": -1e-6}, "per_seq_overhead_s"),
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
    tp2 = RooflineCostModel(model, gpu, tensor_parallel_size=2, step_overhead_s=0.0,
                            per_seq_overhead_s=0.0)
    tp4 = RooflineCostModel(model, gpu, tensor_parallel_size=4, step_overhead_s=0.0,
                            per_seq_overhead_s=0.0)
    big = prefill(4096)
    assert tp4.step_time(big) < tp2.step_time(big)
    # Decode of one token: weights / N plus 2 * 80 all-reduce latencies.
    weights_per_gpu = (model.weight_bytes() - 128_256 * 8192 * 2) / 4
    comm = 160 * (1e-5 + 1.5 * 8192 * 2 / 300e9)
    assert tp4.step_time(decode(1, 10)) == pytest.approx(
        weights_per_gpu / (3.35e12 * 0.9) + comm, rel=0.01
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


def test_chunk_run_times_equal_step_time_of_chunk_shapes_bit_for_bit() -> None:
    from calibration.roofline import RooflineCostModel
    from sim.batch import chunk_shape

    for model, gpu in (("llama-3.1-8b", "h100-sxm"), ("mixtral-8x7b", "h200-sxm")):
        rl = RooflineCostModel(get_model(model), get_gpu(gpu))
        # (prompt + output tokens, sampled before, computed, chunks, members, their context):
        # a first prefill, a tail chunk that samples, a lone prefill (its group's context
        # ignored), a recomputed request's one-token chunk (priced as a decode).
        for num_tokens, has_output, computed, chunks, g, ctx in (
                (2_000, False, 0, [480, 480, 480, 480, 80], 32, 40_000),
                (1_100, False, 600, [500], 12, 9_000),
                (5_000, False, 1_024, [2_048, 1_928], 0, 777),
                (801, True, 800, [1], 5, 4_000)):
            growth = g
            want, c = [], computed
            for j, n in enumerate(chunks):
                want.append(rl.step_time(chunk_shape(num_tokens, has_output, c, n, g,
                                                     ctx + j * growth)))
                c += n
            got = rl.chunk_run_times(num_tokens, has_output, computed, chunks, g, ctx, growth)
            assert got == want
            # With a deadline: the steps whose start (back to back from 50.0) comes
            # before it, and always the first; the next step starts exactly at it.
            k = min(2, len(chunks))
            until = 50.0
            for price in want[:k]:
                until = until + price
            assert rl.chunk_run_times(num_tokens, has_output, computed, chunks, g, ctx,
                                      growth, 50.0, until) == want[:k]
            assert rl.chunk_run_times(num_tokens, has_output, computed, chunks, g, ctx,
                                      growth, 50.0, 49.0) == want[:1]


def test_fp8_weights_run_linear_layers_at_the_fp8_peak_and_read_half_the_bytes() -> None:
    from calibration.quantization import from_name

    model = get_model("llama-3.1-8b")
    fp8 = replace(model, quantization=from_name("fp8"))
    h100 = get_gpu("h100-sxm")
    assert h100.fp8_flops == 1978.9e12  # the vendor's dense FP8 figure
    tokens = 8192
    linear_params = 8_030_261_248 - 2 * 128_256 * 4096 - (32 * 2 * 4096 + 4096)
    bf16_linear_s = 2 * linear_params * tokens / H100_FLOPS
    big = prefill(tokens, sampled=0)
    saved = bare().step_time(big) - RooflineCostModel(
        fp8, h100, step_overhead_s=0.0, per_seq_overhead_s=0.0).step_time(big)
    assert saved == pytest.approx(bf16_linear_s * (1 - 989.4 / 1978.9), rel=1e-6)
    # Decode streams the weights: the linear layers' bytes as ModelSpec counts them.
    one = decode(1, 0)
    cut = bare().step_time(one) - RooflineCostModel(
        fp8, h100, step_overhead_s=0.0, per_seq_overhead_s=0.0).step_time(one)
    assert cut == pytest.approx((model.weight_bytes() - fp8.weight_bytes()) / H100_BYTES_PER_S,
                                rel=1e-6)
    # An A100 has no FP8 tensor cores: the same weights are priced at the bf16 peak.
    a100 = get_gpu("a100-80gb")
    assert a100.fp8_flops is None
    assert bare("llama-3.1-8b", "a100-80gb").step_time(big) == pytest.approx(
        RooflineCostModel(fp8, a100, step_overhead_s=0.0, per_seq_overhead_s=0.0)
        .step_time(big), rel=1e-3)


@pytest.mark.parametrize("model, gpu, kwargs", [
    ("llama-3.1-8b", "h100-sxm", {}),
    ("mixtral-8x7b", "h200-sxm", {"tensor_parallel_size": 2, "compute_efficiency": 0.5}),
    ("llama-2-7b", "a100-80gb", {"dtype": "fp32", "step_overhead_s": 0.0}),
])
def test_pickled_and_rebuilt_it_prices_every_step_the_same(
        model: str, gpu: str, kwargs: dict[str, object]) -> None:
    """Sweeps and window replays send the cost model to worker processes: unpickled, it
    is the same model (the compiled engine's frozen class is rebuilt from its arguments)
    and its step times are the same floats."""
    import pickle

    cm = RooflineCostModel(get_model(model), get_gpu(gpu), **kwargs)  # type: ignore[arg-type]
    back = pickle.loads(pickle.dumps(cm))
    assert back == cm and type(back) is RooflineCostModel
    decode = BatchShape(0, 0, 0, 0, 37, 37 * 900, 37)
    for shape in (prefill(512, 1000), decode, prefill(1), BatchShape()):
        assert back.step_time(shape) == cm.step_time(shape)
    assert back.decode_run_times(37, 37, 37 * 900, 37, 5, 0.0, float("inf")) \
        == cm.decode_run_times(37, 37, 37 * 900, 37, 5, 0.0, float("inf"))
