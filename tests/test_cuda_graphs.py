"""vLLM's CUDA-graph capture sizes and the memory vLLM >= 0.21 sets aside for them
(calibration/cuda_graphs.py), and how a run's KV cache and deployment follow
--enforce-eager."""

from __future__ import annotations

import dataclasses

import pytest

from calibration.cuda_graphs import (
    CUDA_GRAPH_BYTES_PER_GRAPH_LAYER,
    CUDA_GRAPH_FIRST_CAPTURE_BYTES,
    cudagraph_capture_sizes,
    cudagraph_memory_bytes,
    max_capture_size,
)
from calibration.gpus import get_gpu
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
