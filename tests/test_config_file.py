"""vLLM's defaults (sim/app/runs/defaults.py), config files (sim/app/runs/config_file.py)
and the commands' --config, --[no-]enable-prefix-caching and --version: a vLLM serve YAML
is read, flags override a file, a run reproduced from its config.json in another directory
is byte-identical, and a changed trace is reported."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibration.gpus import get_gpu
from sim.app.cli.main import app
from sim.app.runs.config_file import file_digest, read_config
from sim.app.runs.defaults import (
    BatchDefaults,
    api_server_batch_defaults,
    batch_limits,
    default_prefix_cache,
)
from sim.app.runs.runner import RunConfig, prepare

runner = CliRunner()
OPTIONS = ("model", "dtype", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
           "gpu_memory_utilization", "block_size", "prefix_cache", "tensor_parallel_size",
           "num_gpu_blocks", "seed", "trace")


def invoke(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


@contextmanager
def cwd(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def write_trace(path: Path, n: int = 30) -> Path:
    rows = [f"{i * 0.05:.2f},{200 + 37 * i},{5 + i % 7}" for i in range(n)]
    path.write_text("arrival_time,num_prompt_tokens,output_len\n" + "\n".join(rows) + "\n")
    return path


# vLLM 0.32 EngineArgs.get_batch_defaults, OPENAI_API_SERVER column.
@pytest.mark.parametrize(("gpu", "seqs", "tokens"), [
    ("h100-sxm", 1024, 8192),   # >= 70 GiB, not an A100
    ("h200-sxm", 1024, 8192),
    ("a100-80gb", 256, 2048),   # >= 70 GiB but an A100 (vLLM PR #17885)
    ("a100-40gb", 256, 2048),
    ("rtx-4090", 256, 2048),    # the RTX 4090 run: 256 and 2048
    ("l40s", 256, 2048),
])
def test_api_server_batch_defaults_per_gpu(gpu: str, seqs: int, tokens: int) -> None:
    d = api_server_batch_defaults(get_gpu(gpu))
    assert (d.max_num_seqs, d.max_num_batched_tokens) == (seqs, tokens)


def test_160_gib_gpus_get_the_largest_defaults_and_unchunked_policies_max_model_len() -> None:
    big = dataclasses.replace(get_gpu("h100-sxm"), name="b200", memory_bytes=180 << 30)
    d = api_server_batch_defaults(big)
    assert (d.max_num_seqs, d.max_num_batched_tokens) == (1024, 16384)
    gpu = get_gpu("a100-80gb")
    assert batch_limits(gpu, "chunked", 131072).max_num_batched_tokens == 2048
    # chunked prefill off: vLLM raises the default budget to max_model_len
    assert batch_limits(gpu, "continuous", 131072).max_num_batched_tokens == 131072
    assert batch_limits(gpu, "continuous", 1024).max_num_batched_tokens == 2048
    given = batch_limits(gpu, "continuous", 131072, 7, 512)
    assert (given.max_num_seqs, given.max_num_batched_tokens) == (7, 512)


def test_vllm_lowers_a_default_max_num_seqs_to_the_budget_and_caps_a_default_budget() -> None:
    # vLLM 0.32 arg_utils.py _set_default_max_num_seqs_and_batched_tokens_args: a budget
    # given alone below the default 256 sequences (a100-80gb) lowers max_num_seqs to it;
    # a max_num_seqs given stays (startup_checks refuses it above the budget).
    gpu = get_gpu("a100-80gb")
    assert batch_limits(gpu, "chunked", 131072, None, 100) == BatchDefaults(100, 100)
    assert batch_limits(gpu, "chunked", 131072, 300, 100) == BatchDefaults(300, 100)
    # the default budget 2,048 capped at max_num_seqs x max_model_len = 4 x 64 = 256
    assert batch_limits(gpu, "chunked", 64, 4) == BatchDefaults(4, 256)


def test_default_prefix_cache_is_on_only_where_it_can_hit() -> None:
    assert default_prefix_cache("chunked", "paged", True) == "block"
    assert default_prefix_cache("continuous", "paged", True) == "block"
    assert default_prefix_cache("chunked", "paged", False) == "none"
    assert default_prefix_cache("static", "paged", True) == "none"
    assert default_prefix_cache("chunked", "reserve", True) == "none"


def test_prepare_resolves_vllms_defaults() -> None:
    prep = prepare(RunConfig(scenario="system-prompts", num_requests=20))
    assert prep.scheduler.prefix_cache == "block" and prep.config.prefix_cache is None
    assert (prep.config.max_num_seqs, prep.config.max_num_batched_tokens) == (1024, 8192)
    plain = prepare(RunConfig(num_requests=20, gpu="a100-80gb"))  # no prompt content
    assert plain.scheduler.prefix_cache == "none"
    assert (plain.scheduler.max_num_seqs, plain.scheduler.max_num_batched_tokens) == (256, 2048)
    explicit = prepare(RunConfig(scenario="system-prompts", num_requests=20,
                                 prefix_cache="none"))
    assert explicit.scheduler.prefix_cache == "none"


def test_a_vllm_serve_yaml_is_read_with_vllms_names(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    f = tmp_path / "serve.yaml"
    f.write_text("model: meta-llama/Llama-3.1-8B-Instruct\nport: 8000\nhost: 0.0.0.0\n"
                 "max-num-seqs: 128\nmax_num_batched_tokens: 4096\nmax-model-len: 32k\n"
                 "gpu-memory-utilization: 0.85\nblock-size: 32\nenable-prefix-caching: false\n"
                 "tensor-parallel-size: 2\ndtype: bfloat16\nserved-model-name: chat\n")
    cf = read_config(f, OPTIONS)
    assert cf.values == {
        "model": "llama-3.1-8b", "max_num_seqs": 128, "max_num_batched_tokens": 4096,
        "max_model_len": 32000, "gpu_memory_utilization": 0.85, "block_size": 32,
        "prefix_cache": "none", "tensor_parallel_size": 2, "dtype": "bf16"}
    assert cf.ignored == ("port", "host", "served-model-name")
    assert cf.notes == ("model meta-llama/Llama-3.1-8B-Instruct read as the preset "
                        "llama-3.1-8b",)


def test_toml_and_json_files_and_bad_ones(tmp_path: Path) -> None:
    t = tmp_path / "run.toml"
    t.write_text('max_num_seqs = 64\nprefix-cache = "radix"\nmax_model_len = "8K"\n')
    assert read_config(t, OPTIONS).values == {"max_num_seqs": 64, "prefix_cache": "radix",
                                              "max_model_len": 8 * 1024}  # vLLM's "8K"
    bad = tmp_path / "bad.toml"
    bad.write_text("max_num_seqs = \n")
    with pytest.raises(ValueError, match="not valid TOML"):
        read_config(bad, OPTIONS)
    top = tmp_path / "list.json"
    top.write_text("[1, 2]")
    with pytest.raises(ValueError, match="a mapping"):
        read_config(top, OPTIONS)
    with pytest.raises(ValueError, match=r"\.yaml, \.yml, \.toml or \.json"):
        read_config(tmp_path / "x.ini", OPTIONS)


def test_run_config_file_under_the_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('max_num_seqs = 8\nnum_requests = 12\nstep_time = 0.01\nport = 1\n')
    code, text = invoke("run", "--config", str(f), "--num-requests", "10",
                        "--out", str(tmp_path / "r"))
    assert code == 0, text
    assert "warning: config" in text and "ignored, not options of this command: port" in text
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (cfg["max_num_seqs"], cfg["num_requests"], cfg["step_time"]) == (8, 10, 0.01)
    bad = tmp_path / "bad.toml"
    bad.write_text('max_num_seqs = "many"\nswap_space = "lots"\n')
    code, text = invoke("run", "--config", str(bad), "--out", str(tmp_path / "b"))
    assert code == 1 and "max_num_seqs: expected an integer" in text and "'many'" in text
    bad.write_text('swap_space = "lots"\n')
    code, text = invoke("run", "--config", str(bad), "--out", str(tmp_path / "b"))
    assert code == 1 and "config: swap_space must be float, got 'lots'" in text


def test_a_run_reproduces_from_its_config_json_in_another_directory(tmp_path: Path) -> None:
    first, other = tmp_path / "first", tmp_path / "other"
    first.mkdir()
    other.mkdir()
    write_trace(first / "t.csv")
    with cwd(first):  # a relative trace path: config.json records it absolute
        code, text = invoke("run", "--trace", "t.csv", "--out", "runs/x")
    assert code == 0, text
    cfg = json.loads((first / "runs/x/config.json").read_text())
    assert cfg["trace"] == str(first / "t.csv")
    assert (cfg["trace_bytes"], cfg["trace_sha256"]) == file_digest(first / "t.csv")
    with cwd(other):
        code, text = invoke("run", "--config", str(first / "runs/x/config.json"),
                            "--out", "again")
    assert code == 0, text
    assert "warning" not in text
    for name in ("requests.csv", "steps.csv", "summary.json", "config.json"):
        assert (other / "again" / name).read_bytes() == (first / "runs/x" / name).read_bytes()


def test_a_changed_trace_is_reported_before_running(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv")
    assert invoke("run", "--trace", str(trace), "--out", str(tmp_path / "a"))[0] == 0
    write_trace(trace, n=31)
    code, text = invoke("run", "--config", str(tmp_path / "a/config.json"),
                        "--out", str(tmp_path / "b"))
    assert code == 0, text
    lines = [ln for ln in text.splitlines() if "changed since" in ln]
    assert len(lines) == 1 and str(trace) in lines[0]
    assert text.index("changed since") < text.index("workload:")  # before running


def test_vllms_prefix_caching_switch(tmp_path: Path) -> None:
    code, text = invoke("run", "--scenario", "system-prompts", "--num-requests", "30",
                        "--step-time", "0.01", "--no-enable-prefix-caching",
                        "--out", str(tmp_path / "off"))
    assert code == 0, text
    summary = json.loads((tmp_path / "off/summary.json").read_text())
    assert summary["prefix_cache"]["mode"] == "none"
    code, text = invoke("run", "--scenario", "system-prompts", "--num-requests", "30",
                        "--step-time", "0.01", "--out", str(tmp_path / "on"))
    assert code == 0, text
    summary = json.loads((tmp_path / "on/summary.json").read_text())
    assert summary["prefix_cache"]["mode"] == "block"
    assert summary["prefix_cache"]["hit_rate_tokens"] > 0
    code, text = invoke("run", "--prefix-cache", "radix", "--no-enable-prefix-caching",
                        "--out", str(tmp_path / "x"))
    assert code == 1 and "--no-enable-prefix-caching contradicts --prefix-cache radix" in text


def test_sweep_reads_a_file_list_as_an_axis(tmp_path: Path) -> None:
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"max_num_seqs": [4, 8], "num_requests": 10, "step_time": 0.01,
                             "seed": 3}))
    code, text = invoke("sweep", "--config", str(f), "--workers", "1",
                        "--out", str(tmp_path / "sw"))
    assert code == 0, text
    info = json.loads((tmp_path / "sw/sweep.json").read_text())
    assert info["axes"]["max_num_seqs"] == [4, 8] and info["seeds"] == [3]


def test_version() -> None:
    code, text = invoke("--version")
    assert code == 0 and text.strip() == "servesim 0.1.0"
