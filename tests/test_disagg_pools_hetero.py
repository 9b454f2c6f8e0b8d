"""Heterogeneous pools (``--prefill-gpu``, ``--decode-tensor-parallel-size``, ...;
sim/app/runs/disagg.py pool_engines): each pool's engines get the KV pool and the cost
model an aggregated run on that GPU and TP gets (and with its own batch limits, the KV
pool an aggregated run with them gets, a pool sized by hand checked against its own CUDA
graphs), the KV transfer between different TPs
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


def test_each_pools_batch_limits_size_its_kv_plan() -> None:
    # Both pools on the run's H100 (Llama-3.1-8B, 8,192 tokens each), the prefill pool
    # with 32 sequences, the decode pool with 256; each is planned as a vLLM launch with
    # its own limits. Memory (bytes): ceil(85,061,827,297 x 0.9) = 76,555,644,568 requested,
    # 16,094,076,928 of weights, 268,435,456 non-torch, 2,097,152 a block.
    # Activation peak (calibration/memory.py): max(forward 8,192 x 110,592 = 905,969,664,
    # sampler 100,663,296 + S x 128,256 x 14.6): the forward's at S = 32 and at 256
    # (580,032,922).
    # CUDA graphs (vLLM 0.32 _set_cudagraph_sizes, CudagraphDispatcher): at S = 32 the
    # sizes stop at 64 (1, 2, 4, 8..64: 11 piecewise) and 7 are <= 32 (full): 16 further
    # graphs; at S = 256, 51 piecewise and 35 full (1..256): 84 further; each 182,452 B x
    # 32 layers after the 332,859,965 B first capture.
    prep = prepare(RunConfig(disagg="1P1D", model="llama-3.1-8b", gpu="h100-sxm",
                             num_requests=2, step_time=0.01, prefill_max_num_seqs=32,
                             decode_max_num_seqs=256))
    assert prep.pools is not None
    requested, weights, non_torch, block = 76_555_644_568, 16_094_076_928, 268_435_456, 2 << 20
    graphs_32 = 332_859_965 + 182_452 * 32 * 16  # 426,275,389
    graphs_256 = 332_859_965 + 182_452 * 32 * 84  # 823,290,941
    assert prep.pools["prefill"].num_gpu_blocks == (
        requested - weights - 905_969_664 - non_torch - graphs_32) // block == 28_067
    assert prep.pools["decode"].num_gpu_blocks == (
        requested - weights - 905_969_664 - non_torch - graphs_256) // block == 27_877
    # Every pool has its own engine: the run reports the decode pool's (not the 27,302
    # blocks of the run's own 1,024 sequences, which no pool runs).
    assert prep.num_gpu_blocks == 27_877
    assert prep.kv_plan == prep.pools["decode"].kv_plan
    assert prep.pools["prefill"].scheduler.max_num_seqs == 32
    # Each equals an aggregated run with the pool's limits.
    alone = prepare(RunConfig(model="llama-3.1-8b", gpu="h100-sxm", num_requests=2,
                              step_time=0.01, max_num_seqs=256))
    assert alone.num_gpu_blocks == prep.pools["decode"].num_gpu_blocks


def test_a_hand_sized_pool_is_checked_against_each_pools_own_graphs(tmp_path: Path) -> None:
    # --num-gpu-blocks must leave room for the CUDA graphs each pool's engine captures
    # after allocating it (startup_checks.check_kv_pool_fits_gpu): on an H100 (85,061,827,297
    # B as torch reports it) beside 16,094,076,928 B of weights and 268,435,456 of
    # non-torch memory. 64 sequences: sizes 1, 2, 4, 8..128 (19 piecewise), 11 of them
    # <= 64 (full): 332,859,965 + 182,452 x 32 x (18 + 10) = 496,336,957 B of graphs,
    # room for (68,699,314,913 - 496,336,957) // 2,097,152 = 32,521 blocks. The run's own
    # 1,024 sequences (916,706,365 B of graphs) leave room for 32,321, which no pool uses
    # when both have their own limits.
    base = ["run", "--disagg", "1P1D", "--num-requests", "2", "--step-time", "0.01",
            "--prefill-max-num-seqs", "64", "--num-gpu-blocks"]
    both = ["--decode-max-num-seqs", "64"]
    ok = runner.invoke(app, [*base, "32521", *both, "--out", str(tmp_path / "a")])
    assert ok.exit_code == 0, ok.output
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["num_gpu_blocks"] == 32521
    over = runner.invoke(app, [*base, "32522", *both, "--out", str(tmp_path / "b")])
    assert over.exit_code == 1
    assert over.stderr.splitlines()[-1].startswith(
        "error: prefill pool (prefill_max_num_seqs 64): num_gpu_blocks: a KV cache of")
    # The decode pool without its own limits runs the run's engine: its 1,024-sequence
    # graphs leave no room for 32,322 blocks.
    one = runner.invoke(app, [*base, "32322", "--out", str(tmp_path / "c")])
    assert one.exit_code == 1 and "0.85 GiB of CUDA graphs" in one.stderr


def test_a_run_whose_pools_all_have_their_own_limits_is_not_refused_by_its_own(
        tmp_path: Path) -> None:
    # An H100 at gpu_memory_utilization 0.205: ceil(85,061,827,297 x 0.205) =
    # 17,437,674,596 B requested. With 16 sequences and 2,048 tokens a step: 16,094,076,928
    # of weights, an activation peak of max(2,048 x 110,592 = 226,492,416, 1.5 x 2,048 x
    # 4,096 x 2 + 16 x 128,256 x 14.6 = 55,126,426) = 226,492,416, 268,435,456 non-torch,
    # and CUDA graphs of sizes 1, 2, 4, 8, 16, 24, 32 (7 piecewise, 5 full <= 16):
    # 332,859,965 + 182,452 x 32 x (6 + 4) = 391,244,605. KV: 457,425,191 B = 218 blocks
    # of 2,097,152. The run's own
    # limits (1,024 sequences, 8,192 tokens) leave no room, but no pool runs them.
    kv = 17_437_674_596 - 16_094_076_928 - 226_492_416 - 268_435_456 - 391_244_605
    assert kv // (2 << 20) == 218
    limits = {f"{pool}_{f}": n for pool in ("prefill", "decode")
              for f, n in (("max_num_seqs", 16), ("max_num_batched_tokens", 2048))}
    prep = prepare(RunConfig(disagg="1P1D", gpu_memory_utilization=0.205, max_model_len=2048,
                             num_requests=2, step_time=0.01, **limits))  # type: ignore[arg-type]
    assert prep.pools is not None
    assert [e.num_gpu_blocks for e in prep.pools.values()] == [218, 218]
    assert prep.num_gpu_blocks == 218 and prep.kv_plan is not None
    assert prep.kv_plan.kv_bytes == kv and prep.kv_plan.cudagraph_bytes == 391_244_605
    # What the run prints and config.json records are the decode pool's figures.
    res = runner.invoke(app, ["run", "--disagg", "1P1D", "--gpu-memory-utilization", "0.205",
                              "--max-model-len", "2048", "--num-requests", "2",
                              "--step-time", "0.01", "--out", str(tmp_path / "r"),
                              *(a for k, v in limits.items()
                                for a in (f"--{k.replace('_', '-')}", str(v)))])
    assert res.exit_code == 0, res.output
    assert "# GPU blocks: 218; GPU KV cache size: 3,488 tokens" in res.stdout
    resolved = json.loads((tmp_path / "r" / "config.json").read_text())["resolved"]
    assert (resolved["num_gpu_blocks"], resolved["kv_capacity_tokens"]) == (218, 218 * 16)
    # One pool keeping the run's limits runs the run's engine, which is refused.
    with pytest.raises(ValueError, match=r"gpu_memory_utilization 0\.205 leaves no room"):
        prepare(RunConfig(disagg="1P1D", gpu_memory_utilization=0.205, max_model_len=2048,
                          num_requests=2, step_time=0.01, prefill_max_num_seqs=16,
                          prefill_max_num_batched_tokens=2048))


#: What vLLM 0.32 says of cudagraph_mode FULL on an A100 (FlashAttention 2: full graphs
#: of uniform decode batches only).
A100_FULL = ("cudagraph_mode FULL runs as FULL_AND_PIECEWISE in vLLM 0.32 (the attention "
             "backend it picks on a100-80gb takes full CUDA graphs of uniform decode "
             "batches only: resolve_cudagraph_mode_and_sizes); the KV plan follows it")


@pytest.mark.parametrize(("gpus", "warnings"), [
    # The run's H100 runs FULL; the prefill pool's own A100 does not.
    ({"prefill_gpu": "a100-80gb"}, (f"prefill pool: {A100_FULL}",)),
    # The run's A100 runs no pool: no warning of it.
    ({"gpu": "a100-80gb", "prefill_gpu": "h100-sxm", "decode_gpu": "h100-sxm"}, ()),
    # The decode pool runs the run's A100 engine: the run's warning.
    ({"gpu": "a100-80gb", "prefill_gpu": "h100-sxm"}, (A100_FULL,)),
    ({"gpu": "a100-80gb", "decode_gpu": "a100-80gb"}, (A100_FULL, f"decode pool: {A100_FULL}")),
])
def test_the_full_fallback_warning_names_each_engines_gpu(
        gpus: dict[str, str], warnings: tuple[str, ...]) -> None:
    prep = prepare(RunConfig(disagg="1P1D", cudagraph_mode="FULL", num_requests=2,
                             step_time=0.01, **gpus))  # type: ignore[arg-type]
    assert prep.warnings == warnings


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
