"""A run's KV pool (sim/app/runs/kv_pool.py): the plan vLLM 0.32 sizes at start-up and
the pool's blocks, the plan's or a count or size given by hand, with vLLM's checks on
each, worked by hand for Llama-3.1-8B on an H100 with vLLM's defaults (1,024 sequences,
8,192 tokens) and for the shipped CPU profile."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from calibration.gpus import get_gpu
from calibration.memory import KVCachePlan
from calibration.profile import load_profile
from calibration.specs import get_model
from sim.app.runs.kv_pool import kv_pool, num_gpu_blocks
from sim.app.runs.run_config import RunConfig
from sim.app.runs.startup_checks import Refused

MODEL, H100 = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
LIMITS = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}
#: Llama-3.1-8B's bf16 block: 16 tokens x 32 layers x 8 KV heads x 128 x (K, V) x 2 B.
BLOCK = 16 * 32 * 8 * 128 * 2 * 2
# What torch reports of an H100, and the parts of the default plan
# (tests/test_cudagraph_settings.py derives each): 8,030,261,248 bf16 parameters + the
# rotary cache; the sampler's peak, 1.5 x 8,192 x 4,096 x 2 + 1,024 x 128,256 x 14.6;
# 0.25 GiB of non-torch memory; FULL_AND_PIECEWISE's 51 + 51 graphs, 100 after the first capture.
TOTAL = 85_061_827_297
WEIGHTS = 8_030_261_248 * 2 + 131_072 * 128 * 2
ACTIVATIONS = math.ceil(1.5 * 8_192 * 4_096 * 2 + 1_024 * 128_256 * 14.6)
NON_TORCH = 268_435_456
GRAPHS = 332_859_965 + 182_452 * 32 * 100
#: Room on the GPU for a KV cache sized by hand: beside the weights and non-torch memory,
#: and, when graphs are captured after it, them too.
ROOM_EAGER = TOTAL - WEIGHTS - NON_TORCH
ROOM = ROOM_EAGER - GRAPHS


def pool(**fields: Any) -> tuple[KVCachePlan, int]:
    """kv_pool of a resolved Llama-3.1-8B H100 run with ``fields`` (its context:
    131,072 tokens, 8,192 blocks)."""
    cfg = RunConfig(gpu="h100-sxm", step_time=0.01, **{**LIMITS, **fields})
    return kv_pool(cfg, MODEL, H100, None, 8192, 131_072)


def test_the_plan_deducts_the_graphs_unless_none_are_captured() -> None:
    plan, blocks = pool()
    kv = math.ceil(0.9 * TOTAL) - WEIGHTS - ACTIVATIONS - NON_TORCH - GRAPHS
    assert (plan.kv_bytes, plan.cudagraph_bytes) == (kv, GRAPHS) == (57_258_284_020,
                                                                      916_706_365)
    assert blocks == plan.num_gpu_blocks == kv // BLOCK == 27_302
    for eager in ({"enforce_eager": True}, {"cudagraph_mode": "NONE"},
                  {"optimization_level": 0}):
        plan, blocks = pool(**eager)
        assert plan.cudagraph_bytes == 0 and blocks == (kv + GRAPHS) // BLOCK == 27_739


def test_blocks_by_hand_leave_room_for_the_graphs() -> None:
    # ROOM = 67,782,608,548 B: 32,321 blocks; ROOM_EAGER = 68,699,314,913 B: 32,758.
    assert (ROOM // BLOCK, ROOM_EAGER // BLOCK) == (32_321, 32_758)
    assert pool(num_gpu_blocks=32_321)[1] == 32_321
    with pytest.raises(Refused, match=r"^num_gpu_blocks: a KV cache of 63\.13 GiB leaves "
                                      r"the GPU's 79\.22 GiB no room, .* for the 0\.85 GiB "
                                      r"of CUDA graphs"):
        pool(num_gpu_blocks=32_322)
    assert pool(num_gpu_blocks=32_758, enforce_eager=True)[1] == 32_758
    with pytest.raises(Refused, match=r"does not fit the GPU's 79\.22 GiB"):
        pool(num_gpu_blocks=32_759, enforce_eager=True)
    with pytest.raises(ValueError, match="num_gpu_blocks must be >= 2, got 1"):
        pool(num_gpu_blocks=1)


def test_bytes_by_hand_leave_room_for_the_graphs_too() -> None:
    plan, blocks = pool(kv_cache_memory_bytes=ROOM)
    assert blocks == plan.num_gpu_blocks == ROOM // BLOCK == 32_321
    with pytest.raises(Refused, match=r"^kv_cache_memory_bytes: .* no room"):
        pool(kv_cache_memory_bytes=ROOM + 1)


def test_a_pool_must_hold_one_request_of_max_model_len() -> None:
    # 131,072 tokens take 8,192 blocks beside the null block (check_kv_cache_memory).
    plan, _ = pool()
    assert num_gpu_blocks(RunConfig(gpu="h100-sxm", num_gpu_blocks=8_193, **LIMITS),
                          plan, 131_072, H100, GRAPHS) == 8_193
    with pytest.raises(Refused, match="num_gpu_blocks"):
        num_gpu_blocks(RunConfig(gpu="h100-sxm", num_gpu_blocks=8_192, **LIMITS),
                       plan, 131_072, H100, GRAPHS)


def test_a_profiles_cpu_keeps_the_profiles_cache() -> None:
    # The shipped CPU profile (Qwen2.5-0.5B, bf16) was measured with an 830,472,192 B
    # cache: blocks of 16 tokens x 24 layers x 2 KV heads x 64 x (K, V) x 2 B = 196,608 B.
    path = str(Path(__file__).resolve().parents[1]
               / "calibration/profiles/cpu-qwen2.5-0.5b.json")
    profile, qwen = load_profile(path), get_model("qwen2.5-0.5b")
    cfg = RunConfig(profile=path, max_num_seqs=128, max_num_batched_tokens=2048)
    plan, blocks = kv_pool(cfg, qwen, None, profile, 2048, 32_768)
    assert (plan.cudagraph_bytes, blocks) == (0, 830_472_192 // 196_608) == (0, 4_224)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization 0\.5 applies to a GPU"):
        kv_pool(RunConfig(profile=path, gpu_memory_utilization=0.5, max_num_seqs=128,
                          max_num_batched_tokens=2048), qwen, None, profile, 2048, 32_768)
    with pytest.raises(ValueError, match=r"num_gpu_blocks: a KV cache of .* than one CPU "
                                         r"socket holds"):
        kv_pool(RunConfig(profile=path, num_gpu_blocks=10**8, max_num_seqs=128,
                          max_num_batched_tokens=2048), qwen, None, profile, 2048, 32_768)
