"""The cost model's device and constants as a run records them: a profile's device sizes
the KV cache (sim/app/runs/device.py), a run beyond what a profile measured is warned
about (calibration/profile.py MeasuredRange), and the roofline's constants are options
recorded in config.json and the report (calibration/roofline.py).

The shipped torch profile measured on a CPU with a KV cache of 830,472,192 B: Qwen2.5-0.5B
in bf16 holds 2 (K, V) x 24 layers x 2 KV heads x 64 x 2 B = 12,288 B a token, so 67,584
tokens, 4,224 blocks of 16 ((32 + 1) sequences x 2,048 tokens, the grid's cache). The
shipped vLLM profile's engine started with 1,058 blocks of 128 (engine.num_gpu_blocks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import Result
from typer.testing import CliRunner

from sim.app.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "calibration/profiles/cpu-qwen2.5-0.5b.json")
VLLM_CPU_PROFILE = str(ROOT / "calibration/profiles/cpu-vllm-qwen2.5-0.5b-8l.json")
FEW = ("--num-requests", "4", "--rate", "5")
#: Limits inside the shipped torch profile's measured range (32 sequences, 512 tokens,
#: contexts to 2,048 tokens).
INSIDE = ("--max-num-seqs", "32", "--max-num-batched-tokens", "512", "--max-model-len", "2048")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def run(tmp_path: Path, *args: str, name: str = "r") -> tuple[Result, dict[str, Any]]:
    res = invoke("run", *FEW, *args, "--out", str(tmp_path / name))
    assert res.exit_code == 0, res.output
    return res, json.loads((tmp_path / name / "config.json").read_text())


def refused(res: Result, *words: str) -> None:
    """One error line on stderr naming ``words``, exit code 1."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), res.output
    for w in words:
        assert w in lines[0], lines[0]


def warnings(res: Result) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]


# -- the profile's device ------------------------------------------------------------------

def test_a_cpu_profile_sizes_the_kv_cache_from_its_own_cache(tmp_path: Path) -> None:
    _, cfg = run(tmp_path, "--profile", PROFILE)
    r = cfg["resolved"]
    assert cfg["gpu"] == "cpu"
    # The profile's measured cache over Qwen2.5-0.5B's KV bytes per token in bf16:
    # 24 layers x (K, V) x 2 KV heads x 64 dims x 2 B = 12,288; 16-token blocks.
    cache = json.loads(Path(PROFILE).read_text())["memory"]["kv_cache_bytes"]
    blocks = cache // (16 * 24 * 2 * 2 * 64 * 2)
    assert (r["kv_plan"]["kv_bytes"], r["num_gpu_blocks"], r["kv_capacity_tokens"]) == (
        cache, blocks, blocks * 16) == (830_472_192, 4_224, 67_584)
    # vLLM's API server on its CPU engine: 128 sequences, 2,048 tokens (not an H100's).
    assert (cfg["max_num_seqs"], cfg["max_num_batched_tokens"]) == (128, 2048)


def test_a_vllm_cpu_profile_gets_the_pool_vllm_started_with(tmp_path: Path) -> None:
    """The profile's dtype (fp32) is the run's without --dtype: the pool vLLM started
    with, not twice as many bf16 blocks."""
    _, cfg = run(tmp_path, "--profile", VLLM_CPU_PROFILE)
    engine = json.loads(Path(VLLM_CPU_PROFILE).read_text())["engine"]
    assert cfg["dtype"] == "fp32"
    assert (cfg["block_size"], cfg["resolved"]["num_gpu_blocks"]) == (
        engine["block_size"], engine["num_gpu_blocks"]) == (128, 1058)


def test_a_dtype_that_is_not_the_profiles_is_refused(tmp_path: Path) -> None:
    refused(invoke("run", *FEW, "--profile", VLLM_CPU_PROFILE, "--dtype", "bfloat16",
                   "--out", str(tmp_path / "x")),
            "--dtype bf16 conflicts with --profile", "measured in fp32")
    assert not (tmp_path / "x").exists()
    _, cfg = run(tmp_path, "--profile", VLLM_CPU_PROFILE, "--dtype", "float32")
    assert cfg["dtype"] == "fp32"
    for flag, value in (("--quantization", "fp8"), ("--kv-cache-dtype", "fp8")):
        refused(invoke("run", *FEW, "--profile", PROFILE, flag, value,
                       "--out", str(tmp_path / "x")), f"{flag} {value} conflicts with --profile")


def test_the_cpu_cache_is_resized_by_hand_within_a_socket(tmp_path: Path) -> None:
    _, cfg = run(tmp_path, "--profile", PROFILE, "--kv-cache-memory", str(2 << 30))
    assert cfg["resolved"]["num_gpu_blocks"] == (2 << 30) // (16 * 12_288)  # 10,922
    refused(invoke("run", *FEW, "--profile", PROFILE, "--num-gpu-blocks", "10000000000",
                   "--out", str(tmp_path / "x")), "num_gpu_blocks", "CPU socket")


def test_gpu_memory_utilization_is_refused_on_a_profiles_cpu(tmp_path: Path) -> None:
    refused(invoke("run", *FEW, "--profile", PROFILE, "--gpu-memory-utilization", "0.5",
                   "--out", str(tmp_path / "x")), "gpu_memory_utilization 0.5 applies to a GPU")


def test_a_gpu_that_is_not_the_profiles_device_is_refused(tmp_path: Path) -> None:
    out = ("--out", str(tmp_path / "x"))
    refused(invoke("run", *FEW, "--profile", PROFILE, "--gpu", "h100-sxm", *out),
            "--gpu h100-sxm conflicts with --profile", "AMD EPYC")
    refused(invoke("run", *FEW, "--gpu", "cpu", *out), "--gpu cpu", "no --profile")
    assert not (tmp_path / "x").exists()


def cuda_profile(tmp_path: Path, device_name: str) -> str:
    """The shipped profile as if measured on the CUDA device ``device_name``."""
    data = json.loads(Path(PROFILE).read_text())
    data.update(device="cuda", device_name=device_name)
    path = tmp_path / "cuda.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_cuda_profile_runs_on_the_gpu_its_device_name_names(tmp_path: Path) -> None:
    _, cfg = run(tmp_path, "--profile", cuda_profile(tmp_path, "NVIDIA L4"))
    assert cfg["gpu"] == "l4"
    assert (cfg["max_num_seqs"], cfg["max_num_batched_tokens"]) == (256, 2048)  # an L4's
    refused(invoke("run", *FEW, "--profile", cuda_profile(tmp_path, "NVIDIA L4"), "--gpu",
                   "a100-40gb", "--out", str(tmp_path / "x")), "--gpu a100-40gb conflicts")
    # torch names the SXM H100 by its memory and the PCIe board "H100 PCIe".
    _, cfg = run(tmp_path, "--profile", cuda_profile(tmp_path, "NVIDIA H100 80GB HBM3"),
                 name="sxm")
    assert cfg["gpu"] == "h100-sxm"
    refused(invoke("run", *FEW, "--profile", cuda_profile(tmp_path, "NVIDIA H100 80GB HBM3"),
                   "--gpu", "h100-pcie", "--out", str(tmp_path / "x")),
            "--gpu h100-pcie conflicts", "give --gpu h100-sxm")
    # Two presets of one chip that the name does not tell apart: the user says which.
    refused(invoke("run", *FEW, "--profile", cuda_profile(tmp_path, "NVIDIA A100"),
                   "--out", str(tmp_path / "x")), "give --gpu one of a100-40gb, a100-80gb")


def test_device_names_as_torch_writes_them() -> None:
    from sim.app.runs.device import device_gpus

    assert device_gpus("NVIDIA GeForce RTX 4090") == ("rtx-4090",)
    assert device_gpus("NVIDIA L40S") == ("l40s",)  # not l4
    assert device_gpus("NVIDIA A100-SXM4-80GB") == ("a100-80gb",)  # the size tells
    assert device_gpus("NVIDIA A100-SXM4-40GB") == ("a100-40gb",)
    assert device_gpus("NVIDIA H100 PCIe") == ("h100-pcie",)
    assert device_gpus("NVIDIA H200 141GB HBM3e") == ("h200-sxm",)  # 140 GiB preset
    assert device_gpus("AMD Instinct MI300X") == ("mi300x",)
    assert device_gpus("NVIDIA A10G") == ()


# -- the profile's measured range ----------------------------------------------------------

def test_limits_beyond_the_measured_range_are_warned_about(tmp_path: Path) -> None:
    res, _ = run(tmp_path, "--profile", PROFILE, "--max-model-len", "4096")
    assert warnings(res)[:2] == [
        "warning: max_num_seqs 128 is outside the profile's measured batch sizes 1-32: "
        "step costs there are extrapolated",
        "warning: max_num_batched_tokens 2048 is outside the profile's measured step sizes "
        "1-512 tokens: step costs there are extrapolated"]
    requests = (tmp_path / "r" / "requests.csv").read_text().splitlines()[1:]
    tokens = max(int(r.split(",")[9]) + int(r.split(",")[10]) for r in requests)
    assert (tokens > 2048) == (len(warnings(res)) == 3)
    res, _ = run(tmp_path, "--profile", PROFILE, *INSIDE, name="inside")
    assert warnings(res) == []


def test_a_long_request_is_warned_about_with_its_tokens(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,num_prompt_tokens,output_len\n0,3000,4\n")
    res, _ = run(tmp_path, "--profile", PROFILE, "--trace", str(trace), "--max-num-seqs", "32",
                 "--max-num-batched-tokens", "512", "--max-model-len", "4096")
    assert warnings(res) == [
        "warning: max_model_len 4096 lets requests reach 3,004 tokens, outside the "
        "profile's measured contexts 1-2,048 tokens: step costs there are extrapolated"]


def test_the_measured_range_of_the_shipped_profiles() -> None:
    from calibration.profile import load_profile

    ranges = [load_profile(p).measured_range for p in (PROFILE, VLLM_CPU_PROFILE)]
    assert [(r.max_seqs, r.max_tokens, r.max_context) for r in ranges] == [
        (32, 512, 2048), (32, 512, 1024)]


# -- the roofline's constants --------------------------------------------------------------

ROOFLINE = ("roofline_compute_efficiency", "roofline_memory_efficiency",
            "roofline_step_overhead_s", "roofline_per_seq_overhead_s")


def test_the_roofline_constants_that_priced_a_run_are_recorded(tmp_path: Path) -> None:
    _, cfg = run(tmp_path, "--num-requests", "2")
    assert [cfg[k] for k in ROOFLINE] == [0.77, 0.9, 0.00125, 4e-05]  # H100's GEMMs
    _, cfg = run(tmp_path, "--gpu", "a100-40gb", "--roofline-memory-efficiency", "0.8",
                 name="a100")
    assert [cfg[k] for k in ROOFLINE] == [0.70, 0.8, 0.00125, 4e-05]
    for args in (("--profile", PROFILE), ("--step-time", "0.01")):
        _, cfg = run(tmp_path, *args, name="other")
        assert not set(ROOFLINE) & set(cfg), args  # they priced nothing
    again = invoke("run", "--config", str(tmp_path / "a100" / "config.json"), "--out",
                   str(tmp_path / "again"))
    assert again.exit_code == 0, again.output
    assert (tmp_path / "again" / "steps.csv").read_bytes() == (
        tmp_path / "a100" / "steps.csv").read_bytes()


def step_durations(tmp_path: Path, name: str, *args: str) -> list[float]:
    """Every step's duration of one 100-token prompt generating 5 tokens (a prefill, then
    4 decodes, each of one sequence)."""
    trace = tmp_path / "one.csv"
    trace.write_text("arrival_time,num_prompt_tokens,output_len\n0,100,5\n")
    res = invoke("run", "--trace", str(trace), "--full-steps", *args, "--out",
                 str(tmp_path / name))
    assert res.exit_code == 0, res.output
    rows = (tmp_path / name / "steps.csv").read_text().splitlines()[1:]
    return [float(r.split(",")[1]) for r in rows]


def test_the_overheads_add_to_every_step(tmp_path: Path) -> None:
    base = step_durations(tmp_path, "a")
    more = step_durations(tmp_path, "b", "--roofline-step-overhead-s", "0.01",
                          "--roofline-per-seq-overhead-s", "0")
    assert len(base) == len(more) == 5
    for b, m in zip(base, more, strict=True):  # one sequence a step
        assert abs((m - b) - (0.01 - 0.00125 - 40e-6)) < 1e-12


def test_memory_efficiency_divides_a_memory_bound_decode(tmp_path: Path) -> None:
    # A one-sequence decode reads weights and KV: every operator is memory-bound, so its
    # time beyond the overheads is bytes / (bandwidth x efficiency).
    overheads = 0.00125 + 40e-6
    base = step_durations(tmp_path, "a")[1:]
    half = step_durations(tmp_path, "b", "--roofline-memory-efficiency", "0.45")[1:]
    for b, h in zip(base, half, strict=True):
        assert abs((h - overheads) / (b - overheads) - 2.0) < 1e-9


def test_bad_roofline_constants_are_refused(tmp_path: Path) -> None:
    out = ("--out", str(tmp_path / "x"))
    refused(invoke("run", *FEW, "--roofline-compute-efficiency", "1.5", *out),
            "roofline_compute_efficiency must be a fraction in (0, 1], got 1.5")
    refused(invoke("run", *FEW, "--roofline-memory-efficiency", "0", *out),
            "roofline_memory_efficiency must be a fraction in (0, 1]")
    refused(invoke("run", *FEW, "--roofline-step-overhead-s", "-0.001", *out),
            "roofline_step_overhead_s must be a number of seconds in [0, ")
    refused(invoke("run", *FEW, "--roofline-per-seq-overhead-s", "nan", *out),
            "roofline_per_seq_overhead_s")
    refused(invoke("run", *FEW, "--profile", PROFILE, "--roofline-memory-efficiency", "0.8",
                   *out), "--roofline-memory-efficiency", "--profile")
    assert not (tmp_path / "x").exists()


def test_the_report_shows_the_constants(tmp_path: Path) -> None:
    from sim.app.reports.run_dir import load_runs
    from sim.app.reports.tables import config_table

    run(tmp_path, "--num-requests", "2", name="roofline")
    run(tmp_path, "--profile", PROFILE, *INSIDE, name="profile")
    html = config_table(load_runs([tmp_path / "roofline", tmp_path / "profile"]))
    # The profile's run took none ("-"): they did not price it.
    assert "<td>roofline_step_overhead_s</td><td>0.00125</td><td>-</td>" in html
    assert "<td>gpu</td><td>h100-sxm</td><td>cpu</td>" in html
