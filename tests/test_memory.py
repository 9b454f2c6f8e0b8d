"""KV-cache planning: the RTX 4090 case (vLLM 0.19), case K01 (vllm#10517), activation peak,
non-torch defaults, --kv-cache-memory, errors."""

from __future__ import annotations

import itertools
import math

import pytest

from calibration.gpus import GPUSpec, get_gpu
from calibration.memory import (
    NON_TORCH_BYTES_TP,
    NON_TORCH_BYTES_TP1,
    KVCachePlan,
    activation_peak_bytes,
    check_max_model_len,
    plan_for,
    plan_kv_cache,
    rope_cache_bytes,
)
from calibration.specs import GIB, get_model


def gib(x: float) -> int:
    return round(x * GIB)


# The RTX 3090 of case K01 as vLLM saw it: total_gpu_memory=23.58GiB (936 GB/s, 71 TFLOPS
# are placeholders: the plan reads only memory_bytes).
RTX_3090 = GPUSpec("rtx-3090", gib(23.58), 936e9, 71e12, 71e12, 35.6e12)


def k01_plan(peak_gib: float) -> KVCachePlan:
    return plan_kv_cache(gib(23.58), 0.90, gib(peak_gib), gib(0.35), 131_072, 16)


def test_k01_capacity_at_20000() -> None:
    plan = k01_plan(17.06)
    # (23.58 * 0.9 - 17.06 - 0.35) GiB / 2 MiB per block = 1951.7
    assert abs(plan.num_gpu_blocks - 1951) <= 8
    assert plan.kv_capacity_tokens == plan.num_gpu_blocks * 16
    assert plan.kv_capacity_tokens == pytest.approx(31_200, abs=150)
    assert round(plan.max_concurrency(20_000), 2) == 1.56
    check_max_model_len(plan, 20_000)


def test_k01_max_model_len_29000_does_not_fit() -> None:
    plan = k01_plan(17.98)
    assert abs(plan.num_gpu_blocks - 1480) <= 8
    assert plan.kv_capacity_tokens == pytest.approx(23_700, abs=150)
    with pytest.raises(ValueError) as err:
        check_max_model_len(plan, 29_000)
    message = str(err.value)
    # vLLM 0.32's wording: cdiv(29000, 16) = 1,813 blocks of 2 MiB = 3.54 GiB needed; the
    # pool (21.22 - 17.98 - 0.35 GiB) less vLLM's null block leaves 2.89 GiB.
    assert message.startswith(
        "max_model_len: To serve at least one request with the model's max seq len (29000), "
        "(3.54 GiB KV cache is needed, which is larger than the available KV cache memory "
        f"(2.89 GiB). Based on the available memory, the estimated maximum model length is "
        f"{(plan.num_gpu_blocks - 1) * 16}."
    )
    assert "gpu_memory_utilization" in message and "\n" not in message


def test_plan_fields_are_consistent() -> None:
    plan = plan_kv_cache(gib(23.58), 0.9, gib(17.06), gib(0.35), 131_072, 16, weights_bytes=gib(15))
    assert plan.requested_bytes == math.ceil(gib(23.58) * 0.9)
    assert plan.kv_bytes == plan.requested_bytes - gib(17.06) - gib(0.35)
    assert plan.num_gpu_blocks == plan.kv_bytes // (16 * 131_072)
    assert plan.weights_bytes == gib(15)
    assert plan.peak_bytes == gib(17.06)
    assert plan.activation_bytes == gib(17.06) - gib(15)
    assert plan.kv_bytes_per_token == 131_072 and plan.block_size == 16


def test_max_concurrency_qwen_1_5b_pool() -> None:
    # A pool of 219,328 tokens (13,708 blocks of 16) of Qwen2.5-1.5B (28,672 B/token).
    plan = KVCachePlan(13_708, 16, 28_672, 219_328, 0, 0, 0, 0, 13_708 * 16 * 28_672)
    assert plan.max_concurrency(2048) == pytest.approx(107.09, abs=0.005)
    with pytest.raises(ValueError, match="max_model_len"):
        plan.max_concurrency(0)


def test_activation_peak_by_hand() -> None:
    model = get_model("llama-3.1-8b")
    per_token = 2 * (3 * 4096 + 3 * 14_336)  # 110,592 B: residual/input/output + gate_up + act
    # LM-head output (2 B) and the sampler's fp32 logits, probabilities and noise.
    sampler_rows = 256 * 128_256 * 14.6
    # Small budget: the sampler phase is the peak (504,535,450 B against 226,492,416).
    assert activation_peak_bytes(model, 2048, 256, 2) == math.ceil(
        1.5 * 2048 * 4096 * 2 + sampler_rows) == 504_535_450
    # Large budget: the MLP of the forward pass is (16,384 tokens: 1.81e9 B against the
    # sampler's 1.5 * 16,384 * 8,192 + 4.8e8).
    assert activation_peak_bytes(model, 16_384, 256, 2) == 16_384 * per_token


@pytest.mark.parametrize(("tokens", "measured_gib"), [(20_000, 2.07), (29_000, 2.99)])
def test_activation_peak_matches_vllm_log(tokens: int, measured_gib: float) -> None:
    # vllm#10517: peak_torch_memory 17.06 / 17.98 GiB minus 14.99 GiB of weights.
    got = activation_peak_bytes(get_model("llama-3.1-8b"), tokens, 256, 2) / GIB
    assert got == pytest.approx(measured_gib, rel=0.03)


@pytest.mark.parametrize(("max_model_len", "vllm_blocks"), [(20_000, 1952), (29_000, 1478)])
def test_k01_from_the_spec_alone(max_model_len: int, vllm_blocks: int) -> None:
    # V0 without chunked prefill profiles max_num_batched_tokens = max_model_len.
    plan = plan_for(
        get_model("llama-3.1-8b"), RTX_3090, "bf16", 0.9, max_model_len, 256, 16, gib(0.35)
    )
    assert plan.num_gpu_blocks == pytest.approx(vllm_blocks, rel=0.02)
    if max_model_len == 29_000:
        with pytest.raises(ValueError, match="max_model_len"):
            check_max_model_len(plan, max_model_len)


def test_blocks_fall_as_token_budget_rises() -> None:
    model, gpu = get_model("llama-3.1-8b"), get_gpu("a100-80gb")
    blocks = [
        plan_for(model, gpu, "bf16", 0.9, budget, 256, 16).num_gpu_blocks
        for budget in (512, 2048, 4096, 8192, 16_384, 32_768)
    ]
    assert all(a > b for a, b in itertools.pairwise(blocks))


@pytest.mark.parametrize("util", [0.0, -0.1, 1.01, 2.0])
def test_utilization_outside_unit_interval(util: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        plan_kv_cache(gib(80), util, gib(16), gib(0.35), 131_072, 16)


def test_utilization_of_one_is_allowed() -> None:
    plan = plan_kv_cache(gib(80), 1.0, gib(16), 0, 131_072, 16)
    assert plan.num_gpu_blocks == gib(64) // (16 * 131_072) == 32_768


def test_weights_that_do_not_fit() -> None:
    with pytest.raises(ValueError) as err:
        plan_for(get_model("llama-3.1-70b"), get_gpu("rtx-3060"), "bf16", 0.9, 8192, 256, 16)
    message = str(err.value)
    assert "gpu_memory_utilization" in message and "GiB" in message and "\n" not in message


def test_tensor_parallel_shards_weights_and_kv() -> None:
    model, gpu = get_model("llama-3.1-70b"), get_gpu("a100-80gb")
    with pytest.raises(ValueError):
        plan_for(model, gpu, "bf16", 0.9, 8192, 256, 16)
    plan = plan_for(model, gpu, "bf16", 0.9, 8192, 256, 16, tensor_parallel_size=4)
    assert plan.kv_bytes_per_token == 327_680 // 4
    # The rotary cache (131,072 positions x 128 x bf16) is replicated, not sharded.
    assert plan.weights_bytes == math.ceil(model.weight_bytes() / 4) + 131_072 * 128 * 2
    assert plan.non_torch_bytes == NON_TORCH_BYTES_TP == gib(0.54)


def test_default_non_torch_bytes() -> None:
    # vLLM 0.19's H100 logs: 0.24-0.27 GiB at TP 1, 2.06-2.21 GiB at TP 2-4 (NVSwitch).
    assert gib(0.25) == NON_TORCH_BYTES_TP1
    model, gpu = get_model("qwen2.5-1.5b"), get_gpu("l4")
    assert plan_for(model, gpu, "bf16", 0.9, 8192, 256, 16).non_torch_bytes == gib(0.25)
    assert plan_for(model, gpu, "bf16", 0.9, 8192, 256, 16,
                    tensor_parallel_size=2).non_torch_bytes == gib(0.54)
    h100 = get_gpu("h100-sxm")
    assert h100.tp_non_torch_bytes == gib(2.1) and h100.non_torch_bytes is None
    assert plan_for(model, h100, "bf16", 0.9, 8192, 256, 16,
                    tensor_parallel_size=2).non_torch_bytes == gib(2.1)
    assert plan_for(model, h100, "bf16", 0.9, 8192, 256, 16).non_torch_bytes == gib(0.25)
    # Given explicitly, the figure wins over the spec's.
    assert plan_for(model, h100, "bf16", 0.9, 8192, 256, 16, gib(1.0),
                    tensor_parallel_size=2).non_torch_bytes == gib(1.0)


def test_activation_peak_matches_vllm_0_19_h100_logs() -> None:
    # "torch peak memory increase" of vLLM 0.19.0 at max_num_seqs 1,024 and 8,192 batched
    # tokens, bf16 (llm-d-planner's H100 logs): Llama-3.1-8B 1.89 GiB; by hand 1.5 x 8,192 x
    # 4,096 x 2 B of hidden states + 1,024 x 128,256 entries x 14.6 B = 2,018,141,799 B
    # (1.88 GiB), above the forward's 8,192 x 2 B x (3 x 4,096 + 3 x 14,336) = 0.84 GiB.
    llama = activation_peak_bytes(get_model("llama-3.1-8b"), 8192, 1024, 2)
    assert llama == math.ceil(1.5 * 8192 * 4096 * 2 + 1024 * 128_256 * 14.6) == 2_018_141_799
    assert llama / GIB == pytest.approx(1.89, abs=0.02)
    # fp32 weights: 4-byte hidden states and LM-head output (the log: 2.21 GiB).
    fp32 = activation_peak_bytes(get_model("llama-3.1-8b"), 8192, 1024, 4)
    assert fp32 / GIB == pytest.approx(2.21, abs=0.03)
    # Qwen2.5-7B (152,064 entries): 2.21 GiB logged.
    assert activation_peak_bytes(get_model("qwen2.5-7b"), 8192, 1024, 2) / GIB == (
        pytest.approx(2.21, abs=0.02))


def test_moe_workspace_stays_through_the_sampler() -> None:
    # Mixtral-8x7B at TP 2: each token's 2 experts hold 3 x 14,336 / 2 (gate_up and the
    # activated product, sharded) plus the 4,096-wide output each, 2 B an element, and that
    # workspace is still allocated when the sampler runs.
    model = get_model("mixtral-8x7b")
    tokens, seqs = 8192, 1024
    workspace = tokens * 2 * (3 * 2 * 14_336 // 2 + 2 * 4096)
    sampler = 1.5 * tokens * 4096 * 2 + seqs * 32_000 * 14.6
    forward = tokens * (2 * (3 * 4096 + 3 * 2 * 14_336 // 2 + 2 * 4096) + 4 * 8)
    got = activation_peak_bytes(model, tokens, seqs, 2, tensor_parallel_size=2)
    assert got == max(forward, math.ceil(workspace + sampler))
    # vLLM 0.19 logged 1.21 GiB on an H100 pair.
    assert got / GIB == pytest.approx(1.21, abs=0.12)


def test_rtx_4090_plans_vllm_0_19_blocks() -> None:
    # vLLM 0.19 on an RTX 4090 (torch total 25,250,627,584 B), Llama-3.1-8B bf16, util 0.9,
    # max_num_seqs 256, max_num_batched_tokens 2048: num_gpu_blocks 2,588 (LLMServingSim
    # bench/examples/RTX4090/Llama-3.1-8B/vllm/meta.json). The preset's non-torch memory
    # (0.65 GiB) is implied by this log, so this checks the arithmetic, not a prediction.
    gpu = get_gpu("rtx-4090")
    assert gpu.total_memory_bytes == 25_250_627_584
    plan = plan_for(get_model("llama-3.1-8b"), gpu, "bf16", 0.9, 2048, 256, 16)
    # By hand: requested = ceil(25,250,627,584 * 0.9) = 22,725,564,826; weights
    # 8,030,261,248 * 2 + 32 MiB rotary cache; sampler 1.5 * 2048 * 4096 * 2 + 256 *
    # 128,256 * 14.6 = 504,535,450 (above the forward's 226,492,416); non-torch 0.65 GiB;
    # what is left // 2 MiB per block.
    weights = 8_030_261_248 * 2 + 33_554_432
    sampler = 504_535_450
    left = 22_725_564_826 - weights - sampler - gib(0.65)
    assert plan.requested_bytes == 22_725_564_826
    assert plan.activation_bytes == sampler
    assert plan.num_gpu_blocks == left // (16 * 131_072) == 2588


def test_rope_cache_is_in_vllm_weights_figure() -> None:
    # vLLM logs "model weights take 14.99GiB" for Llama-3.1-8B (vllm#10517: 14.9888 GB):
    # 16,060,522,496 B of parameters plus the 32 MiB cos/sin cache.
    model = get_model("llama-3.1-8b")
    assert rope_cache_bytes(model, 2) == 32 * 2**20
    assert (model.weight_bytes(2) + rope_cache_bytes(model, 2)) / GIB == pytest.approx(
        14.9888, abs=0.0005)


def test_kv_cache_memory_bytes_sets_the_pool() -> None:
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    plan = plan_for(model, gpu, "bf16", 0.5, 8192, 256, 16, kv_cache_memory_bytes=gib(10))
    assert plan.num_gpu_blocks == gib(10) // (16 * 131_072) == 5120
    assert plan.kv_bytes == gib(10)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        plan_for(model, gpu, "bf16", 0.9, 8192, 256, 16, kv_cache_memory_bytes=1000)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"block_size": 0}, "block_size"), ({"kv_bytes_per_token": 0}, "kv_bytes_per_token")],
)
def test_plan_validation_names_the_field(kwargs: dict[str, int], field: str) -> None:
    args: dict[str, int | float] = {
        "total_gpu_memory_bytes": gib(80),
        "gpu_memory_utilization": 0.9,
        "peak_memory_bytes": gib(16),
        "non_torch_bytes": 0,
        "kv_bytes_per_token": 131_072,
        "block_size": 16,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        plan_kv_cache(**args)  # type: ignore[arg-type]


def test_plan_for_rejects_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="dtype"):
        plan_for(get_model("qwen2.5-0.5b"), get_gpu("l4"), "int4", 0.9, 8192, 256, 16)
