"""Tensor parallelism: weights and KV heads split over the GPUs of a replica (memory is
per GPU), FLOPs split, two all-reduces per layer over the preset's interconnect; plans
count GPUs. Llama-3.1-70B and Mixtral-8x7B become plannable on H100-SXM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibration.gpus import get_gpu, list_gpus
from calibration.memory import plan_for, rope_cache_bytes
from calibration.roofline import RooflineCostModel
from calibration.specs import get_model
from sim.app.cli.main import app
from sim.app.runs.runner import RunConfig, prepare
from sim.batch import BatchShape

runner = CliRunner()


def decode(num_seqs: int, context: int) -> BatchShape:
    return BatchShape(num_prefill_tokens=0, num_decode_seqs=num_seqs,
                      prefill_attention_pairs=0, prefill_context_tokens=0,
                      decode_context_tokens=num_seqs * context, num_sampled_seqs=num_seqs)


def test_every_gpu_preset_carries_sourced_interconnect_numbers() -> None:
    for name in list_gpus():
        gpu = get_gpu(name)
        assert gpu.interconnect_bandwidth_bytes_per_s and gpu.interconnect_latency_s, name
    h100, a100 = get_gpu("h100-sxm"), get_gpu("a100-80gb")
    assert h100.interconnect_bandwidth_bytes_per_s == 450e9  # NVLink 4: 900 GB/s both ways
    assert a100.interconnect_bandwidth_bytes_per_s == 300e9  # NVLink 3: 600 GB/s both ways
    assert get_gpu("h100-pcie").interconnect_bandwidth_bytes_per_s == 64e9  # PCIe Gen5 x16
    assert get_gpu("l40s").interconnect_bandwidth_bytes_per_s == 32e9  # PCIe Gen4 x16
    data = json.loads((Path(__file__).parents[1] / "calibration/data/gpus.json").read_text())
    assert all("interconnect_source" in g and "latency" in g["interconnect_source"]
               for g in data["gpus"])


@pytest.mark.parametrize("tp", [4, 8])
def test_llama_70b_fits_on_h100_with_tp(tp: int) -> None:
    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    # CUDA graphs deducted, as vLLM >= 0.21 does and a run does by default.
    plan = plan_for(model, gpu, "bf16", 0.9, 8192, 256, 16, tensor_parallel_size=tp,
                    cuda_graphs=True)
    # Sharded weights plus the rotary cache every GPU holds (rope_cache_bytes).
    assert plan.weights_bytes == -(-model.weight_bytes(2) // tp) + rope_cache_bytes(model, 2)
    assert plan.kv_bytes_per_token == model.kv_bytes_per_token(2, tp) == 327_680 // tp
    assert plan.kv_capacity_tokens >= model.max_position_embeddings
    cfg = RunConfig(model="llama-3.1-70b", tensor_parallel_size=tp, num_requests=5,
                    max_num_seqs=256, max_num_batched_tokens=8192)
    assert prepare(cfg).num_gpu_blocks == plan.num_gpu_blocks


def test_llama_70b_does_not_fit_on_one_h100_and_mixtral_needs_two() -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        prepare(RunConfig(model="llama-3.1-70b", num_requests=5))
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        prepare(RunConfig(model="mixtral-8x7b", num_requests=5))
    assert prepare(RunConfig(model="mixtral-8x7b", tensor_parallel_size=2,
                             num_requests=5)).num_gpu_blocks > 0


def test_tp_pays_two_all_reduces_per_layer_over_the_preset_interconnect() -> None:
    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    tp4 = RooflineCostModel(model, gpu, tensor_parallel_size=4, step_overhead_s=0.0)
    tp8 = RooflineCostModel(model, gpu, tensor_parallel_size=8, step_overhead_s=0.0)
    comm4 = 2 * 80 * (10e-6 + 2 * 3 / 4 * 8192 * 2 / 450e9)
    head = model.lm_head_params * 2
    weights4 = (model.weight_bytes(2) - model.vocab_size * model.hidden_size * 2 - head) / 4
    # One decode token at tiny context: memory-bound, weights (no embedding) / 4 + comm.
    expected = (weights4 + head / 4) / (gpu.memory_bandwidth_bytes_per_s * 0.9) + comm4
    assert tp4.step_time(decode(1, 10)) == pytest.approx(expected, rel=0.01)
    assert tp8.step_time(decode(1, 10)) < tp4.step_time(decode(1, 10))


def test_cli_tp_run_counts_gpus(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--model", "llama-3.1-70b", "--tensor-parallel-size", "4",
                              "--num-requests", "20", "--replicas", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "GPUs: 8 (2 replicas x TP 4)" in res.output
    assert "TP 4" in res.output  # cost model label
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tensor_parallel_size"] == 4 and cfg["resolved"]["num_gpus"] == 8


@pytest.mark.parametrize(("args", "field"), [
    (["--tensor-parallel-size", "3"], "tensor_parallel_size"),
    (["--tensor-parallel-size", "0"], "tensor_parallel_size"),
    (["--tensor-parallel-size", "2", "--profile", "x.json"], "profile"),
])
def test_cli_tp_bad_input(tmp_path: Path, args: list[str], field: str) -> None:
    res = runner.invoke(app, ["run", "--num-requests", "5", "--out", str(tmp_path / "x"),
                              *args])
    assert res.exit_code == 1 and field in res.output and res.output.count("\n") == 1
