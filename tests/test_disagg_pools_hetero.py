"""Heterogeneous pools (``--prefill-gpu``, ``--decode-tensor-parallel-size``, ...;
sim/app/runs/disagg.py pool_engines): each pool's engines get the KV pool and the cost
model an aggregated run on that GPU and TP gets, the KV transfer between different TPs
moves total / min(TP_p, TP_d) bytes a port pair, num_gpus counts x x TP_p + y x TP_d,
and bad input is one line naming the pool's field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibration.roofline import RooflineCostModel
from sim.app.cli.main import app
from sim.app.runs.run_config import RunConfig
from sim.app.runs.runner import prepare, simulate_prepared

runner = CliRunner()

#: llama-3.1-8b's KV bytes a token in bf16, all 8 KV heads: 32 layers x 8 x 128 x (K, V)
#: x 2 B.
LLAMA_8B_KV_BYTES = 32 * 8 * 128 * 2 * 2

#: A link of 8 Gb/s = 1e9 B/s and 10 us.
GBPS, LATENCY_US = 8.0, 10.0
BANDWIDTH = GBPS * 1e9 / 8

CPU_PROFILE = str(Path(__file__).resolve().parents[1]
                  / "calibration/profiles/cpu-qwen2.5-0.5b.json")


def one_request(**pools: object) -> tuple[float, int]:
    """(kv_transfer_time_s, num_prompt_tokens) of one request through 1P1D, a constant
    10 ms step, the 1e9 B/s link."""
    cfg = RunConfig(disagg="1P1D", num_requests=1, step_time=0.01, kv_link_gbps=GBPS,
                    kv_link_latency_us=LATENCY_US, **pools)  # type: ignore[arg-type]
    result = simulate_prepared(prepare(cfg))
    t = result.request_table
    return float(t["kv_transfer_time_s"][0]), int(t["num_prompt_tokens"][0])


@pytest.mark.parametrize(("pools", "min_tp"), [
    ({}, 1),
    ({"prefill_tensor_parallel_size": 2}, 1),  # 2 prefill shards, 1 decode GPU: all of it
    ({"decode_tensor_parallel_size": 2}, 1),
    ({"prefill_tensor_parallel_size": 2, "decode_tensor_parallel_size": 2}, 2),
    ({"prefill_tensor_parallel_size": 2, "decode_tensor_parallel_size": 4}, 2),
])
def test_transfer_moves_total_over_the_smaller_tp(pools: dict[str, int], min_tp: int) -> None:
    # Alone on the link: latency + prompt x (all heads' KV bytes / min TP) / bandwidth.
    took, prompt = one_request(**pools)
    expected = LATENCY_US * 1e-6 + prompt * (LLAMA_8B_KV_BYTES / min_tp) / BANDWIDTH
    assert took == pytest.approx(expected, abs=1e-9)


def test_pool_on_another_gpu_and_tp_gets_that_aggregated_engine() -> None:
    prep = prepare(RunConfig(disagg="1P1D", num_requests=4, decode_gpu="h200-sxm",
                             decode_tensor_parallel_size=2))
    assert prep.pools is not None
    decode, prefill = prep.pools["decode"], prep.pools["prefill"]
    alone = prepare(RunConfig(num_requests=4, gpu="h200-sxm", tensor_parallel_size=2))
    assert decode.num_gpu_blocks == alone.num_gpu_blocks > prep.num_gpu_blocks
    assert decode.cost_model == alone.cost_model  # the roofline of H200 at TP 2
    assert decode.scheduler.kv_bytes_per_block == alone.scheduler.kv_bytes_per_block
    # The prefill pool keeps the run's engine (H100, TP 1).
    assert (prefill.gpu, prefill.tensor_parallel_size) == ("h100-sxm", 1)
    assert prefill.num_gpu_blocks == prep.num_gpu_blocks
    assert prefill.cost_model is prep.cost_model


def test_pool_gpu_takes_its_own_fitted_compute_efficiency_and_memory_share() -> None:
    # L40S has no fitted GEMM efficiency (the default), H100 has 0.77: the pool's roofline
    # is an L40S run's, its KV pool an L40S run's at util 0.5 (same batch limits).
    limits = {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "max_model_len": 8192,
              "num_requests": 4}
    prep = prepare(RunConfig(disagg="1P1D", prefill_gpu="l40s",
                             prefill_gpu_memory_utilization=0.5, **limits))  # type: ignore[arg-type]
    alone = prepare(RunConfig(gpu="l40s", gpu_memory_utilization=0.5, **limits))  # type: ignore[arg-type]
    assert prep.pools is not None
    pool = prep.pools["prefill"]
    assert isinstance(pool.cost_model, RooflineCostModel)
    assert isinstance(prep.cost_model, RooflineCostModel)
    assert pool.cost_model.compute_efficiency != prep.cost_model.compute_efficiency
    assert pool.cost_model == alone.cost_model
    assert pool.num_gpu_blocks == alone.num_gpu_blocks


def test_num_gpus_counts_each_pools_tp() -> None:
    cfg = RunConfig(disagg="2P3D", tensor_parallel_size=2, decode_tensor_parallel_size=4)
    assert cfg.num_gpus == 2 * 2 + 3 * 4
    assert RunConfig(disagg="2P3D", tensor_parallel_size=2).num_gpus == 5 * 2
    assert RunConfig(disagg="1P1D", prefill_tensor_parallel_size=8).num_gpus == 8 + 1


def test_run_files_name_each_pools_gpu_tp_and_blocks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--disagg", "1P2D", "--num-requests", "20",
                              "--step-time", "0.01", "--decode-gpu", "h200-sxm",
                              "--prefill-tensor-parallel-size", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads((out / "summary.json").read_text())["disagg"]
    h200 = prepare(RunConfig(num_requests=4, gpu="h200-sxm")).num_gpu_blocks
    h100_tp2 = prepare(RunConfig(num_requests=4, tensor_parallel_size=2)).num_gpu_blocks
    assert {k: d["decode"][k] for k in ("gpu", "tensor_parallel_size", "num_gpu_blocks")} == {
        "gpu": "h200-sxm", "tensor_parallel_size": 1, "num_gpu_blocks": h200}
    assert {k: d["prefill"][k] for k in ("gpu", "tensor_parallel_size", "num_gpu_blocks")} == {
        "gpu": "h100-sxm", "tensor_parallel_size": 2, "num_gpu_blocks": h100_tp2}
    assert d["decode"]["kv_cache"]["num_gpu_blocks"] == h200  # usage over its own blocks
    config = json.loads((out / "config.json").read_text())
    assert (config["decode_gpu"], config["prefill_tensor_parallel_size"]) == ("h200-sxm", 2)
    assert "prefill_gpu" not in config  # unset pool fields are left out
    assert config["resolved"]["num_gpus"] == 1 * 2 + 2 * 1


@pytest.mark.parametrize(("args", "field"), [
    (["--disagg", "1P1D", "--decode-gpu", "nosuch"], "decode_gpu"),
    (["--disagg", "1P1D", "--prefill-tensor-parallel-size", "0"],
     "prefill_tensor_parallel_size"),
    (["--disagg", "1P1D", "--decode-gpu-memory-utilization", "1.5"],
     "decode_gpu_memory_utilization"),
    (["--decode-gpu", "l4"], "decode_gpu"),  # an aggregated run
    (["--disagg", "1P1D", "--profile", CPU_PROFILE, "--prefill-gpu", "l4"], "prefill_gpu"),
    (["--disagg", "1P1D", "--profile", CPU_PROFILE, "--decode-tensor-parallel-size", "2"],
     "decode_tensor_parallel_size"),
])
def test_bad_pool_input_is_one_line_naming_the_field(tmp_path: Path, args: list[str],
                                                     field: str) -> None:
    base = ["run", "--num-requests", "5", "--out", str(tmp_path / "x")]
    res = runner.invoke(app, [*base, *([] if "--profile" in args else ["--step-time", "0.01"]),
                              *args])
    assert res.exit_code == 1 and field in res.output, res.output
    assert res.output.count("\n") == 1, res.output


@pytest.mark.parametrize(("args", "named"), [
    # llama-3.1-8b's 16 GB of bf16 weights on a 12 GiB GPU.
    (["--decode-gpu", "rtx-3060"], "decode pool (decode_gpu rtx-3060)"),
    # 32 attention heads do not split over 3 GPUs.
    (["--prefill-tensor-parallel-size", "3"], "prefill pool (prefill_tensor_parallel_size 3)"),
])
def test_pool_whose_engine_cannot_start_is_refused_naming_it(
        tmp_path: Path, args: list[str], named: str) -> None:
    res = runner.invoke(app, ["run", "--disagg", "1P1D", "--num-requests", "5",
                              "--out", str(tmp_path / "x"), *args])
    assert res.exit_code == 1, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith(f"error: {named}: "), res.output
    assert "Traceback" not in res.output and not (tmp_path / "x").exists()
