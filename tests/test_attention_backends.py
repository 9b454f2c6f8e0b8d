"""The MLA attention backend vLLM 0.32 picks, and the block size it then starts with when
the user gives none (calibration/attention_backends.py; vLLM's rules cited there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.attention_backends import mla_backend, mla_default_block_size
from sim.app.runs.runner import RunConfig, prepare

#: An MLA model (tests/data/hf_configs): qk_nope_head_dim 128, 27 layers.
DEEPSEEK_V2_LITE = str(Path(__file__).parent / "data" / "hf_configs" / "DeepSeek-V2-Lite")


@pytest.mark.parametrize(("gpu", "nope", "kv", "backend", "block_size"), [
    # 10.x: FLASHINFER_MLA (kernel blocks 32, 64: 16 is not one, so its smallest).
    ("b200", 128, "auto", "FLASHINFER_MLA", 32),
    ("b200", 128, "fp8", "FLASHINFER_MLA", 32),
    # ... unless its kernel refuses the head: CUTLASS_MLA, kernel blocks of 128.
    ("b200", 96, "auto", "CUTLASS_MLA", 128),
    # 9.x: FLASH_ATTN_MLA (any multiple of 16), which has no FP8 KV cache: FLASHMLA (64).
    ("h100-sxm", 128, "auto", "FLASH_ATTN_MLA", 16),
    ("h200-sxm", 128, "bfloat16", "FLASH_ATTN_MLA", 16),
    ("h100-pcie", 128, "fp8", "FLASHMLA", 64),
    # Elsewhere TRITON_MLA, on ROCm too (AITER is off by default).
    ("a100-80gb", 128, "fp8", "TRITON_MLA", 16),
    ("rtx-5090", 128, "auto", "TRITON_MLA", 16),
    ("mi300x", 128, "auto", "TRITON_MLA", 16),
    # A GPU spec file's GPU: no compute capability known, CacheConfig's 16.
    ("my-gpu", 128, "auto", None, 16),
])
def test_the_mla_backend_sets_the_default_block_size(
        gpu: str, nope: int, kv: str, backend: str | None, block_size: int) -> None:
    assert mla_backend(gpu, nope, kv) == backend
    assert mla_default_block_size(gpu, nope, kv) == block_size


def test_a_given_block_size_passes_over_the_backends_that_cannot_take_it() -> None:
    # The selector checks a user's block size against each backend's kernels in turn.
    assert mla_backend("b200", 128, block_size=16) == "TRITON_MLA"
    assert mla_backend("b200", 128, block_size=64) == "FLASHINFER_MLA"
    # FlashMLA's dense kernel runs on 9.x only: on a B200 Triton-MLA takes 64.
    assert mla_backend("b200", 96, block_size=64) == "TRITON_MLA"
    assert mla_backend("h100-sxm", 128, "fp8", block_size=64) == "FLASHMLA"
    assert mla_backend("h100-sxm", 128, "fp8", block_size=16) == "TRITON_MLA"


def test_a_latent_head_size_only_triton_mla_takes_keeps_16() -> None:
    # MLACommonBackend.get_supported_head_sizes: 320, 512 or 576 (kv_lora_rank +
    # qk_rope_head_dim); TRITON_MLA takes any.
    assert mla_backend("b200", 128, head_size=320) == "FLASHINFER_MLA"
    assert mla_backend("b200", 128, head_size=288) == "TRITON_MLA"
    assert mla_default_block_size("h100-sxm", 128, "fp8", head_size=288) == 16


@pytest.mark.parametrize(("model", "gpu", "kv", "block_size"), [
    (DEEPSEEK_V2_LITE, "b200", "auto", 32), (DEEPSEEK_V2_LITE, "h100-sxm", "fp8", 64),
    (DEEPSEEK_V2_LITE, "h100-sxm", "auto", 16), (DEEPSEEK_V2_LITE, "a100-80gb", "auto", 16),
    ("llama-3.1-8b", "b200", "auto", 16), ("llama-3.1-8b", "h100-sxm", "fp8", 16),
    # A preset's alias, in any case.
    (DEEPSEEK_V2_LITE, "B200", "auto", 32), (DEEPSEEK_V2_LITE, "H100-SXM", "fp8", 64),
])
def test_a_run_without_block_size_takes_vllms(model: str, gpu: str, kv: str,
                                              block_size: int) -> None:
    assert RunConfig(model=model, gpu=gpu, kv_cache_dtype=kv).block_size == block_size
    # A block size given is kept.
    assert RunConfig(model=model, gpu=gpu, kv_cache_dtype=kv, block_size=48).block_size == 48


def test_disaggregated_pools_on_one_gpu_take_its_block_size() -> None:
    both = RunConfig(model=DEEPSEEK_V2_LITE, disagg="1P1D", prefill_gpu="b200",
                     decode_gpu="b200")
    assert both.block_size == 32
    # Pools on different GPUs share the run's --gpu's (vLLM would pick one per pool).
    mixed = RunConfig(model=DEEPSEEK_V2_LITE, gpu="h100-sxm", disagg="1P1D",
                      prefill_gpu="b200")
    assert mixed.block_size == 16


def test_an_mla_model_on_b200_runs_full_graphs_at_vllms_default_block_size() -> None:
    # With no --block-size vLLM picks FLASHINFER_MLA and its 32: FULL runs as FULL, no
    # warning (at a given 16 it falls back: tests/test_cudagraph_settings.py).
    prep = prepare(RunConfig(model=DEEPSEEK_V2_LITE, gpu="b200", cudagraph_mode="FULL",
                             num_requests=2))
    assert prep.config.block_size == 32
    assert prep.warnings == ()
