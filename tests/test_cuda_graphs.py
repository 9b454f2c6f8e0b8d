"""vLLM's CUDA-graph capture sizes, the graphs each cudagraph_mode captures and the memory
vLLM >= 0.21 sets aside for them (calibration/cuda_graphs.py), how the optimization level
and compilation mode settle the mode and the GPU's attention backend resolves FULL, how
performance_mode interactivity adds sizes, and how a run's KV cache and deployment
follow --enforce-eager."""

from __future__ import annotations

import dataclasses

import pytest

from calibration.attention_backends import full_cudagraph_support
from calibration.cuda_graphs import (
    CUDA_GRAPH_BYTES_PER_GRAPH_LAYER,
    CUDA_GRAPH_FIRST_CAPTURE_BYTES,
    CudaGraphConfig,
    compilation_mode_name,
    cudagraph_capture_sizes,
    cudagraph_counts,
    cudagraph_memory_bytes,
    cudagraph_mode_name,
    max_capture_size,
)
from calibration.gpus import get_gpu, list_gpus
from calibration.memory import plan_for
from calibration.specs import GIB, get_model
from sim.app.runs.config_file import read_config
from sim.app.runs.deploy_config import serve_keys
from sim.app.runs.runner import RunConfig, prepare


def test_capture_sizes_with_vllms_h100_defaults() -> None:
    # 1, 2, 4; 8..248 every 8 (31 sizes); 256..512 every 16 (17): the 51 graphs of each
    # mode that vLLM 0.19's H100 logs report ("PIECEWISE=51 (largest=512), FULL=51").
    sizes = cudagraph_capture_sizes(1024, 8192)
    assert len(sizes) == 3 + 31 + 17 == 51
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-2:] == [496, 512]


def test_capture_sizes_stop_at_twice_max_num_seqs_and_at_the_budget() -> None:
    # 128 sequences: the largest is 256 (1, 2, 4, 8..248, 256 = 35 sizes).
    assert len(cudagraph_capture_sizes(128, 2048)) == 35
    # max_num_seqs off the stride is captured too; the budget caps the largest.
    assert 100 in cudagraph_capture_sizes(100, 8192)
    assert cudagraph_capture_sizes(256, 100)[-2:] == [96, 100]
    assert cudagraph_capture_sizes(4, 8192) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="max_num_seqs"):
        cudagraph_capture_sizes(0, 8192)


def test_memory_is_first_capture_plus_each_further_graph_per_layer() -> None:
    # H100 defaults, Llama-3.1-8B's 32 layers: 51 piecewise + 51 full graphs, so 100 after
    # the two first captures.
    assert cudagraph_memory_bytes(32, 1024, 8192) == (
        CUDA_GRAPH_FIRST_CAPTURE_BYTES + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 32 * 100)
    assert cudagraph_memory_bytes(32, 1024, 8192) / GIB == pytest.approx(0.84, abs=0.02)
    # 128 sequences: 35 piecewise, 19 full (1, 2, 4, 8..128).
    assert cudagraph_memory_bytes(32, 128, 2048) == (
        CUDA_GRAPH_FIRST_CAPTURE_BYTES + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 32 * (34 + 18))


def test_a_plan_gives_the_graphs_memory_whole_blocks_at_a_time() -> None:
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    eager = plan_for(model, gpu, "bf16", 0.9, 8192, 1024, 16)
    graphs = plan_for(model, gpu, "bf16", 0.9, 8192, 1024, 16, cuda_graphs=True)
    assert eager.cudagraph_bytes == 0
    assert graphs.cudagraph_bytes == cudagraph_memory_bytes(32, 1024, 8192)
    assert graphs.kv_bytes == eager.kv_bytes - graphs.cudagraph_bytes
    block_bytes = 16 * model.kv_bytes_per_token(2)
    assert graphs.num_gpu_blocks == graphs.kv_bytes // block_bytes


def test_a_run_deducts_the_graphs_unless_enforce_eager() -> None:
    base = RunConfig(model="llama-3.1-8b", gpu="rtx-4090", max_model_len=8192, num_requests=5)
    graphs, eager = prepare(base), prepare(dataclasses.replace(base, enforce_eager=True))
    block_bytes = 16 * get_model("llama-3.1-8b").kv_bytes_per_token(2)
    # RTX 4090 defaults: 256 sequences, 2,048 tokens: sizes 1, 2, 4, 8..248 (31), 256..512
    # every 16 (17) = 51 piecewise graphs; those up to 256 = 35 full graphs.
    deducted = CUDA_GRAPH_FIRST_CAPTURE_BYTES + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 32 * (50 + 34)
    assert cudagraph_memory_bytes(32, 256, 2048) == deducted
    assert graphs.kv_plan is not None and eager.kv_plan is not None
    assert graphs.kv_plan.cudagraph_bytes == deducted and eager.kv_plan.cudagraph_bytes == 0
    assert eager.kv_plan.kv_bytes - graphs.kv_plan.kv_bytes == deducted
    assert eager.num_gpu_blocks - graphs.num_gpu_blocks in (
        deducted // block_bytes, deducted // block_bytes + 1)
    assert "enforce_eager" not in serve_keys(graphs)
    assert serve_keys(eager)["enforce_eager"] is True


def test_a_vllm_serve_yaml_sets_enforce_eager(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "serve.yaml"
    path.write_text("model: meta-llama/Llama-3.1-8B\nenforce-eager: true\n")
    assert read_config(path, {"model", "enforce_eager"}).values["enforce_eager"] is True


def test_data_centre_blackwell_captures_up_to_1024() -> None:
    # vLLM's default largest size is 1,024 on compute capability 10.x: 1, 2, 4, 8..248
    # (31), 256..1024 every 16 (49) = 83 sizes; H100 stays at 51.
    assert len(cudagraph_capture_sizes(1024, 8192, max_capture_size("b200"))) == 83
    assert max_capture_size("h100-sxm") == 512
    model = get_model("llama-3.1-8b")
    b200 = plan_for(model, get_gpu("b200"), "bf16", 0.9, 8192, 1024, 16, cuda_graphs=True)
    assert b200.cudagraph_bytes == (CUDA_GRAPH_FIRST_CAPTURE_BYTES
                                    + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 32 * (82 + 82))


# Per-mode graph counts (vLLM 0.32 vllm/v1/cudagraph_dispatcher.py
# CudagraphDispatcher.initialize_cudagraph_keys) on 16 sequences, 64 tokens: the default
# sizes stop at min(2 x 16, 512, 64) = 32 (vllm/config/vllm.py _set_cudagraph_sizes):
# 1, 2, 4, 8, 16, 24, 32 = 7 sizes; 16 (max_num_seqs) is on the stride already. Sizes up
# to 16 (the uniform-decode full graphs of the separate-routine modes): 1, 2, 4, 8, 16 = 5.
PER_LAYER_8 = CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 8


@pytest.mark.parametrize(("mode", "counts", "further"), [
    ("NONE", (0, 0), None),                   # no keys at all: nothing deducted
    ("PIECEWISE", (7, 0), 6),                 # mixed_mode PIECEWISE, one key per size
    ("FULL", (0, 7), 6),                      # mixed_mode FULL, one key per size
    ("FULL_DECODE_ONLY", (0, 5), 4),          # decode routine only: sizes <= 16
    ("FULL_AND_PIECEWISE", (7, 5), 6 + 4),    # both: vLLM's default
])
def test_each_cudagraph_mode_captures_its_graphs(mode: str, counts: tuple[int, int],
                                                 further: int | None) -> None:
    sizes = cudagraph_capture_sizes(16, 64)
    assert sizes == [1, 2, 4, 8, 16, 24, 32]
    assert cudagraph_counts(mode, sizes, 16) == counts
    # profile_cudagraph_memory (vllm/v1/worker/gpu_model_runner.py): the first capture
    # once, then (n - 1) further graphs per mode; 0 when nothing is captured.
    expected = 0 if further is None else CUDA_GRAPH_FIRST_CAPTURE_BYTES + PER_LAYER_8 * further
    assert cudagraph_memory_bytes(8, 16, 64, config=CudaGraphConfig(mode)) == expected


def test_a_given_max_capture_size_replaces_vllms_ceiling() -> None:
    # max_cudagraph_capture_size 64 on 16 sequences, 64 tokens: no 2 x max_num_seqs cap
    # and no max_num_seqs size appended (vllm/config/vllm.py _set_cudagraph_sizes, the
    # uniform_decode_sizes only of a default ceiling): 1, 2, 4, 8..64 every 8 = 11 sizes,
    # 5 of them <= 16.
    config = CudaGraphConfig(max_cudagraph_capture_size=64)
    assert cudagraph_capture_sizes(16, 64, config=config) == [1, 2, 4, *range(8, 65, 8)]
    assert cudagraph_memory_bytes(8, 16, 64, config=config) == (
        CUDA_GRAPH_FIRST_CAPTURE_BYTES + PER_LAYER_8 * (10 + 4))
    # The budget still caps it: 24 tokens -> 1, 2, 4, 8, 16, 24.
    assert cudagraph_capture_sizes(16, 24, config=config) == [1, 2, 4, 8, 16, 24]


def test_an_explicit_capture_size_list_is_kept_up_to_the_budget() -> None:
    # Deduplicated, sorted, sizes above max_num_batched_tokens (64) dropped: 1, 4, 16, 48;
    # FULL_AND_PIECEWISE: 4 piecewise, 3 full (<= 16 sequences).
    config = CudaGraphConfig(cudagraph_capture_sizes=(4, 1, 48, 16, 100, 4))
    assert cudagraph_capture_sizes(16, 64, config=config) == [1, 4, 16, 48]
    assert cudagraph_memory_bytes(8, 16, 64, config=config) == (
        CUDA_GRAPH_FIRST_CAPTURE_BYTES + PER_LAYER_8 * (3 + 2))
    # A maximum given with it must be the largest kept size, as vLLM raises.
    consistent = dataclasses.replace(config, max_cudagraph_capture_size=48)
    assert cudagraph_capture_sizes(16, 64, config=consistent) == [1, 4, 16, 48]
    with pytest.raises(ValueError, match=r"max_cudagraph_capture_size\(=100\) should be "
                                         r"consistent with the max value of "
                                         r"cudagraph_capture_sizes\(=48\)"):
        cudagraph_capture_sizes(16, 64, config=dataclasses.replace(
            config, max_cudagraph_capture_size=100))
    # Every size above the budget: nothing captured, nothing deducted.
    assert cudagraph_memory_bytes(8, 16, 64, config=CudaGraphConfig(
        cudagraph_capture_sizes=(128,))) == 0


@pytest.mark.parametrize(("given", "level", "compilation", "mode"), [
    (None, None, None, "FULL_AND_PIECEWISE"),  # vLLM's default, -O2
    (None, 0, None, "NONE"),                   # -O0: OPTIMIZATION_LEVEL_00
    (None, 1, None, "PIECEWISE"),              # -O1: OPTIMIZATION_LEVEL_01
    (None, 3, None, "FULL_AND_PIECEWISE"),     # -O3: as -O2
    (None, 2, 0, "FULL_DECODE_ONLY"),          # no compilation: piecewise graphs dropped
    ("piecewise", 2, 1, "NONE"),               # STOCK_TORCH_COMPILE is not VLLM_COMPILE
    ("FULL", 0, None, "FULL"),                 # full graphs need no compilation
    (1, 2, None, "PIECEWISE"),                 # vLLM's enum value
    ("PIECEWISE", 0, None, "NONE"),            # -O0 compiles nothing: no piecewise graphs
    ("PIECEWISE", 0, "VLLM_COMPILE", "PIECEWISE"),  # unless compilation is asked for
])
def test_the_optimization_level_and_compilation_mode_settle_the_mode(
        given: str | int | None, level: int | None, compilation: int | str | None,
        mode: str) -> None:
    # vLLM 0.32 VllmConfig.__post_init__ and _normalize_piecewise_cudagraph_mode
    # (vllm/config/vllm.py), CUDAGraphMode.without_piecewise (vllm/config/compilation.py).
    config = CudaGraphConfig(given, optimization_level=level,  # type: ignore[arg-type]
                             compilation_mode=compilation)  # type: ignore[arg-type]
    assert config.mode == mode
    assert CudaGraphConfig(given, optimization_level=level,  # type: ignore[arg-type]
                           compilation_mode=compilation,  # type: ignore[arg-type]
                           enforce_eager=True).mode == "NONE"


# Which GPU's default attention backend runs mixed batches in one full graph
# (AttentionCGSupport.ALWAYS), vLLM 0.32: FlashAttention 3 on compute capability 9.x
# (v1/attention/backends/fa_utils.py get_flash_attn_version, flash_attn.py); FA2 on 8.x
# and 12.x, FlashInfer on 10.x (platforms/cuda.py _get_backend_priorities), both
# UNIFORM_BATCH at best; ROCM_ATTN on ROCm (rocm_attn.py: ALWAYS). With MLA: FLASHINFER_MLA
# on 10.x (ALWAYS), UNIFORM_BATCH backends elsewhere.
@pytest.mark.parametrize(("gpu", "plain", "mla"), [
    ("h100-sxm", True, False), ("h200-sxm", True, False), ("a100-80gb", False, False),
    ("l40s", False, False), ("rtx-4090", False, False), ("rtx-5090", False, False),
    ("b200", False, True), ("mi300x", True, False), ("my-spec-file-gpu", None, None),
])
def test_full_graphs_of_mixed_batches_follow_the_attention_backend(
        gpu: str, plain: bool | None, mla: bool | None) -> None:
    assert full_cudagraph_support(gpu) is plain
    assert full_cudagraph_support(gpu, mla=True) is mla


@pytest.mark.parametrize(("block_size", "always"), [
    (None, True), (16, False), (8, False), (32, True), (48, False), (64, True), (96, True),
    (128, True)])
def test_mla_runs_full_graphs_of_mixed_batches_on_b200_at_flashinfer_mla_block_sizes(
        block_size: int | None, always: bool) -> None:
    # FLASHINFER_MLA's kernels take blocks of 32 or 64 (mla/flashinfer_mla.py); a cache
    # block size is supported when one of them divides it (v1/attention/backend.py
    # supports_block_size): any multiple of 32. At another the selector falls back to an
    # MLA backend short of ALWAYS. None: vLLM picks the block size, FLASHINFER_MLA's.
    assert full_cudagraph_support("b200", mla=True, block_size=block_size) is always
    # Elsewhere the block size changes nothing.
    assert full_cudagraph_support("h100-sxm", mla=True, block_size=block_size) is False
    assert full_cudagraph_support("b200", block_size=block_size) is False
    assert full_cudagraph_support("h100-sxm", block_size=block_size) is True


@pytest.mark.parametrize(("value", "name"), [
    ("full", "FULL"), ("Full_Decode_Only", "FULL_DECODE_ONLY"), (0, "NONE"), (1, "PIECEWISE"),
    (2, "FULL")])
def test_a_cudagraph_mode_is_a_name_or_an_integer_value(value: object, name: str) -> None:
    assert cudagraph_mode_name(value) == name


@pytest.mark.parametrize("value", ["0", "1", " 2", "3", 3, -1, True, 1.0, "", None])
def test_a_cudagraph_mode_as_digits_or_out_of_range_is_refused(value: object) -> None:
    # validate_cudagraph_mode_before (config/compilation.py) looks text up by name only.
    with pytest.raises(ValueError, match=r"^cudagraph_mode must be one of NONE, PIECEWISE, "
                       r"FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE or the integer 0, 1 or 2, "
                       r"got "):
        cudagraph_mode_name(value)


def test_a_compilation_mode_is_a_name_or_an_integer_value() -> None:
    assert [compilation_mode_name(v) for v in (0, 1, 2, 3, "vllm_compile")] == [
        "NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE", "VLLM_COMPILE"]
    for value in ("3", "0", 4, False):  # validate_mode_before: text by name only
        with pytest.raises(ValueError, match=r"^compilation_mode must be one of NONE, "
                           r"STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, VLLM_COMPILE or the "
                           r"integer 0-3, got "):
            compilation_mode_name(value)


def test_every_gpu_preset_has_a_known_attention_platform() -> None:
    from calibration.attention_backends import COMPUTE_CAPABILITY_MAJOR, ROCM_GPUS

    assert set(list_gpus()) == set(COMPUTE_CAPABILITY_MAJOR) | ROCM_GPUS


def test_full_falls_back_where_the_backend_takes_full_graphs_of_decode_batches_only() -> None:
    # CompilationConfig.resolve_cudagraph_mode_and_sizes (vllm/config/compilation.py): FULL
    # on a backend short of ALWAYS becomes FULL_AND_PIECEWISE when the attention ops split
    # the compiled graph (VLLM_COMPILE), else FULL_DECODE_ONLY. On 16 sequences, 64 tokens
    # (7 sizes, 5 of them <= 16): FULL is (0, 7), FULL_AND_PIECEWISE (7, 5),
    # FULL_DECODE_ONLY (0, 5).
    full = CudaGraphConfig("FULL")
    assert full.runtime_mode(True) == full.runtime_mode(None) == "FULL"
    assert full.runtime_mode(False) == "FULL_AND_PIECEWISE"
    uncompiled = CudaGraphConfig("FULL", compilation_mode="NONE")
    assert uncompiled.runtime_mode(False) == "FULL_DECODE_ONLY"
    assert CudaGraphConfig("FULL_DECODE_ONLY").runtime_mode(False) == "FULL_DECODE_ONLY"
    first = CUDA_GRAPH_FIRST_CAPTURE_BYTES
    assert cudagraph_memory_bytes(8, 16, 64, config=full, full_mixed_batches=True) == (
        first + PER_LAYER_8 * 6)
    assert cudagraph_memory_bytes(8, 16, 64, config=full, full_mixed_batches=False) == (
        first + PER_LAYER_8 * (6 + 4))
    assert cudagraph_memory_bytes(8, 16, 64, config=uncompiled,
                                  full_mixed_batches=False) == first + PER_LAYER_8 * 4


def test_a_plan_resolves_full_by_the_gpu() -> None:
    # Llama-3.1-8B with vLLM's defaults: on an A100 80GB (256 sequences, 2,048 tokens: 51
    # sizes, 35 <= 256) FULL is planned as FULL_AND_PIECEWISE, 50 + 34 further graphs; on
    # an H100 (1,024 sequences, 8,192 tokens: 51 sizes) FULL stays FULL, 50.
    model = get_model("llama-3.1-8b")
    full = CudaGraphConfig("FULL")
    per_layer_32 = CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 32
    a100 = plan_for(model, get_gpu("a100-80gb"), "bf16", 0.9, 2048, 256, 16,
                    cuda_graphs=True, cudagraph_config=full)
    default = plan_for(model, get_gpu("a100-80gb"), "bf16", 0.9, 2048, 256, 16,
                       cuda_graphs=True)
    assert a100.cudagraph_bytes == default.cudagraph_bytes == (
        CUDA_GRAPH_FIRST_CAPTURE_BYTES + per_layer_32 * (50 + 34))
    h100 = plan_for(model, get_gpu("h100-sxm"), "bf16", 0.9, 8192, 1024, 16,
                    cuda_graphs=True, cudagraph_config=full)
    assert h100.cudagraph_bytes == CUDA_GRAPH_FIRST_CAPTURE_BYTES + per_layer_32 * 50


def test_interactivity_captures_every_size_up_to_32() -> None:
    # vllm/config/vllm.py _set_cudagraph_sizes: range(1, min(largest, 32) + 1) in place of
    # 1, 2, 4; then 40..248 every 8 (27) and 256..512 every 16 (17): 76 sizes on an H100.
    config = CudaGraphConfig(performance_mode="interactivity")
    sizes = cudagraph_capture_sizes(1024, 8192, config=config)
    assert sizes[:33] == [*range(1, 33), 40] and len(sizes) == 32 + 27 + 17 == 76
    assert cudagraph_capture_sizes(4, 8192, config=config) == list(range(1, 9))
    # An explicit list is kept as given.
    assert cudagraph_capture_sizes(16, 64, config=CudaGraphConfig(
        cudagraph_capture_sizes=(8,), performance_mode="interactivity")) == [8]


def test_bad_graph_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="cudagraph_mode must be one of"):
        CudaGraphConfig("SOMETIMES")
    with pytest.raises(ValueError, match="cudagraph_mode must be one of"):
        CudaGraphConfig("")
    with pytest.raises(ValueError, match="cudagraph_capture_sizes must hold at least one"):
        CudaGraphConfig(cudagraph_capture_sizes=())
    with pytest.raises(ValueError, match=r"max_cudagraph_capture_size must be >= 1 when "):
        CudaGraphConfig(max_cudagraph_capture_size=0)
    with pytest.raises(ValueError, match="optimization_level must be 0, 1, 2 or 3"):
        CudaGraphConfig(optimization_level=4)
    with pytest.raises(ValueError, match="compilation_mode must be one of NONE"):
        CudaGraphConfig(compilation_mode="INDUCTOR")
    with pytest.raises(ValueError, match="performance_mode must be one of balanced"):
        CudaGraphConfig(performance_mode="fast")
    # vLLM asserts a non-empty list and a maximum >= 1 only when it captures graphs
    # (vllm/config/vllm.py _set_cudagraph_sizes).
    for none in (CudaGraphConfig("NONE", (), 0), CudaGraphConfig(None, (), 0, 0),
                 CudaGraphConfig(None, (), -1, enforce_eager=True)):
        assert none.mode == "NONE"
