"""The `run` and `list` commands through typer's CliRunner: outputs, schema,
determinism, and one clear line with exit code 1 for every kind of bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.cli.options import OPTIONS
from sim.app.runs.runner import RunConfig
from sim.metrics import REQUEST_COLUMNS, STEP_COLUMNS
from tests.conftest import shared_path

runner = CliRunner()
SUMMARY_KEYS = {
    "num_requests", "num_finished", "num_rejected", "duration_s", "throughput", "ttft_s",
    "tpot_s", "itl_s", "e2e_latency_s", "queued_time_s", "goodput_requests_per_s",
    "num_preemptions", "kv_cache", "batch", "slots",
}


def write_csv(path: Path, rows: list[str]) -> Path:
    path.write_text("arrival_time,num_prompt_tokens,output_len\n" + "\n".join(rows) + "\n")
    return path


def run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["run", *args])
    return res.exit_code, res.output


def test_run_writes_the_four_files(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, text = run("--num-requests", "50", "--out", str(out), "--slo-ttft", "1",
                     "--slo-tpot", "0.05")
    assert code == 0, text
    assert "Maximum concurrency for 131,072 tokens per request" in text
    req = pd.read_csv(out / "requests.csv")
    assert list(req.columns) == list(REQUEST_COLUMNS) and len(req) == 50
    steps = pd.read_csv(out / "steps.csv")
    assert list(steps.columns) == [*STEP_COLUMNS, "num_steps"]
    assert steps["num_steps"].sum() > len(steps)  # decode runs share a row
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert summary["goodput_requests_per_s"] is not None
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"] == "llama-3.1-8b" and cfg["resolved"]["num_gpu_blocks"] > 0


def test_same_seed_identical_requests_csv(tmp_path: Path) -> None:
    for name in ("a", "b"):
        assert run("--num-requests", "80", "--seed", "7", "--out", str(tmp_path / name))[0] == 0
    a = (tmp_path / "a" / "requests.csv").read_bytes()
    assert a == (tmp_path / "b" / "requests.csv").read_bytes()
    run("--num-requests", "80", "--seed", "8", "--out", str(tmp_path / "c"))
    assert a != (tmp_path / "c" / "requests.csv").read_bytes()


def test_full_steps_writes_one_row_per_step(tmp_path: Path) -> None:
    trace = write_csv(tmp_path / "t.csv", ["0,4,30", "0,4,30"])
    for name, flag in (("rle", []), ("full", ["--full-steps"])):
        code, text = run("--trace", str(trace), "--step-time", "0.5", *flag,
                         "--out", str(tmp_path / name))
        assert code == 0, text
    rle = pd.read_csv(tmp_path / "rle" / "steps.csv")
    full = pd.read_csv(tmp_path / "full" / "steps.csv")
    # 30 steps: the prefill step, then 29 identical decode steps of both requests.
    assert len(full) == 30 and (full["num_steps"] == 1).all()
    assert list(rle["num_steps"]) == [1, 29]
    assert rle["duration_s"].sum() == pytest.approx(15.0)


def test_step_time_and_num_gpu_blocks_overrides(tmp_path: Path) -> None:
    trace = write_csv(tmp_path / "t.csv", ["0,4,3", "0,4,2"])
    code, text = run("--trace", str(trace), "--step-time", "0.5", "--num-gpu-blocks", "10",
                     "--max-model-len", "144", "--out", str(tmp_path / "o"))
    assert code == 0, text
    req = pd.read_csv(tmp_path / "o" / "requests.csv")
    assert list(req["finish_time"]) == [1.5, 1.0]  # 3 and 2 steps of 0.5 s


def test_unservable_request_is_rejected_with_reason(tmp_path: Path) -> None:
    trace = write_csv(tmp_path / "t.csv", ["0,100,3", "0,4,2"])
    code, _ = run("--trace", str(trace), "--step-time", "1", "--num-gpu-blocks", "5",
                  "--max-model-len", "64", "--out", str(tmp_path / "o"))
    assert code == 0
    req = pd.read_csv(tmp_path / "o" / "requests.csv")
    assert list(req["status"]) == ["rejected", "finished"]
    assert "max_model_len (64)" in req.loc[0, "reason"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--trace", "/no/such/trace.csv"], "not found"),
    (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
    (["--gpu-memory-utilization", "0"], "gpu_memory_utilization"),
    (["--model", "llama-3.1-70b", "--gpu", "rtx-3060"], "gpu_memory_utilization"),
    (["--model", "nope"], "known: qwen2.5-0.5b"),
    (["--gpu", "nope"], "known: a100-40gb"),
    (["--policy", "nope"], "unknown policy"),
    (["--rate", "-1"], "rate"),
    (["--burstiness", "0"], "burstiness"),
    (["--max-num-seqs", "0"], "max_num_seqs"),
    (["--step-time", "0"], "step_time"),
    # vLLM's --goodput ttft:2000 tpot:50 is in ms: typed as seconds, refused with the
    # value in seconds (2000 ms = 2 s, 50 ms = 0.05 s)
    (["--slo-ttft", "2000"], "slo_ttft 2000 s looks like milliseconds"),
    (["--slo-tpot", "50"], "give 0.05 for 50 ms"),
    (["--slo-ttft", "0"], "slo_ttft must be a number of seconds in (0, 60]"),
    (["--gpu", "l4"], "max_model_len"),
    (["--max-model-len", "0"], "max_model_len must be >= 2"),
    (["--trace", ""], "trace must name a file"),
    (["--concurrency", "5", "--arrival", "gamma", "--burstiness", "0.1"],
     "arrival shapes open-loop arrivals"),
    (["--concurrency", "5", "--time-scale", "100"], "time_scale shapes open-loop"),
    (["--replicas", "100000"], "replicas must be at most 1024"),
])
def test_bad_input_one_line_exit_1(tmp_path: Path, args: list[str], needle: str) -> None:
    out = tmp_path / "o"
    code, text = run(*args, "--out", str(out))
    assert code == 1
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], text
    assert "Traceback" not in text
    assert not out.exists()  # nothing written


@pytest.mark.parametrize(("row", "needle"), [
    ("0.5,abc,3", "line 3: num_prompt_tokens 'abc'"),
    ("0.5,0,3", "line 3: num_prompt_tokens 0"),
    ("0.5,5,-2", "line 3: output_len -2"),
    ("0.5,5,0", "line 3: output_len 0"),  # case K05: a zero-token output is an input error
])
def test_malformed_trace_rows(tmp_path: Path, row: str, needle: str) -> None:
    trace = write_csv(tmp_path / "t.csv", ["0,10,5", row])
    code, text = run("--trace", str(trace), "--out", str(tmp_path / "o"))
    assert code == 1 and needle in text and "Traceback" not in text


def test_failed_run_keeps_previous_output(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert run("--num-requests", "5", "--out", str(out))[0] == 0
    before = (out / "requests.csv").read_bytes()
    assert run("--model", "nope", "--out", str(out))[0] == 1
    assert (out / "requests.csv").read_bytes() == before


def test_list_names_presets() -> None:
    res = runner.invoke(app, ["list"])
    assert res.exit_code == 0
    for name in ("llama-3.1-8b", "qwen2.5-1.5b", "h100-sxm", "rtx-3060", "chunked", "static",
                 "teaching"):
        assert name in res.output


def test_mooncake_replay_rejects_over_long_requests(tmp_path: Path) -> None:
    trace = shared_path("traces", "mooncake_conversation_trace.jsonl")
    out = tmp_path / "m"
    code, text = run("--trace", str(trace), "--num-requests", "300", "--model", "qwen2.5-0.5b",
                     "--step-time", "0.01", "--out", str(out))
    assert code == 0, text
    req = pd.read_csv(out / "requests.csv")
    too_long = req["num_prompt_tokens"] + req["num_output_tokens"].where(
        req["status"] == "finished") > 32768
    rejected = req[req["status"] == "rejected"]
    assert len(rejected) > 0 and not too_long.any()
    assert rejected["reason"].str.contains("max_model_len").all()
    assert len(req) == 300


def test_python_m_sim_cli_has_every_command() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "sim.app.cli", "--help"], capture_output=True,
                         text=True, check=True, env={**os.environ, "COLUMNS": "100"}).stdout
    for command in ("run", "report", "sweep", "plan", "diagram", "validate", "calibrate"):
        assert f" {command} " in out, command


@pytest.mark.parametrize(("args", "needle"), [
    (["run", "--max-num-seqs", "abc"], "Invalid value for '--max-num-seqs': 'abc'"),
    (["run", "--bogus"], "No such option: --bogus"),
    (["nope"], "No such command 'nope'"),
])
def test_usage_errors_are_one_line_exit_1(args: list[str], needle: str) -> None:
    # click's own usage errors (exit 2, a boxed message) follow the house rule too.
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "sim.app.cli", *args], capture_output=True,
                         text=True)
    assert res.returncode == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and res.stdout == "", res.stderr


def test_every_run_option_is_declared_once_with_runconfigs_default() -> None:
    # sim/app/cli/options.py declares every RunConfig field, under its name and with its
    # default: what every command that runs a simulation takes.
    fields = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    assert {name: o.default for name, o in OPTIONS.items()} == fields


def _params(command: str) -> dict[str, Any]:
    """The click parameters of ``servesim COMMAND``, by name."""
    import typer

    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


def test_sweep_and_plan_share_runs_options() -> None:
    run_params, sweep, plan = _params("run"), _params("sweep"), _params("plan")
    shared = ("max_model_len", "block_size", "num_gpu_blocks", "queue", "preemption_mode",
              "kv_allocation", "swap_space", "pcie_bandwidth", "scheduler_reserve_full_isl")
    for params in (sweep, plan):
        for name in shared:
            p, r = params[name], run_params[name]
            assert (p.opts, p.default, p.help, p.type.name) == (
                r.opts, r.default, r.help, r.type.name), name
    assert "time_scale" in sweep and "time_scale" not in plan  # plan times its own probes
    # The list form: the same option, comma-separated values, the same help first.
    assert sweep["max_num_seqs"].help.startswith(run_params["max_num_seqs"].help)
    assert sweep["seeds"].opts == plan["seeds"].opts == ["--seeds", "--seed"]
    # One default per option in every command: the router, and the trace sample (decided
    # by whether the trace is re-timed, the same rule everywhere).
    assert [c["router"].default for c in (run_params, sweep, plan)] == ["round-robin"] * 3
    assert [c["trace_sample"].default for c in (run_params, sweep, plan)] == [None] * 3


def test_vllms_option_names_run_what_servesims_names_run(tmp_path: Path) -> None:
    """vLLM's -tp, --dtype bfloat16, --num-gpu-blocks-override and --scheduling-policy are
    the same settings as servesim's names: byte-identical records and config.json."""
    common = ["run", "--num-requests", "20", "--rate", "5"]
    vllm = ["-tp", "2", "--dtype", "bfloat16", "--num-gpu-blocks-override", "40000",
            "--scheduling-policy", "priority"]
    ours = ["--tensor-parallel-size", "2", "--dtype", "bf16", "--num-gpu-blocks", "40000",
            "--queue", "priority"]
    for name, args in (("vllm", vllm), ("ours", ours)):
        res = runner.invoke(app, [*common, *args, "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
    for f in ("requests.csv", "steps.csv", "summary.json", "config.json"):
        assert (tmp_path / "vllm" / f).read_bytes() == (tmp_path / "ours" / f).read_bytes(), f
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (config["dtype"], config["tensor_parallel_size"]) == ("bf16", 2)


@pytest.mark.parametrize(("given", "dtype"), [
    ("auto", "bf16"), ("float16", "fp16"), ("half", "fp16"), ("float32", "fp32"),
    ("float", "fp32"), ("fp16", "fp16")])
def test_vllms_dtype_names_are_read_as_servesims(given: str, dtype: str) -> None:
    assert RunConfig(dtype=given).dtype == dtype


def test_an_unknown_dtype_names_both_spellings() -> None:
    with pytest.raises(ValueError, match=r"dtype must be one of bf16, fp16, fp32 \(or "
                                         r"vLLM's auto, bfloat16, float16, half"):
        RunConfig(dtype="int8")


def test_vllms_chunked_prefill_switch_is_the_policy(tmp_path: Path) -> None:
    """--no-enable-chunked-prefill is --policy continuous (vLLM V1 without chunked
    prefill), also as a vLLM serve config key; contradicting --policy names both."""
    common = ["run", "--num-requests", "10", "--max-model-len", "8192"]
    for name, args in (("switch", ["--no-enable-chunked-prefill"]),
                       ("policy", ["--policy", "continuous"])):
        res = runner.invoke(app, [*common, *args, "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
    for f in ("requests.csv", "steps.csv", "summary.json", "config.json"):
        assert (tmp_path / "switch" / f).read_bytes() == (tmp_path / "policy" / f).read_bytes()
    (tmp_path / "serve.yaml").write_text("enable_chunked_prefill: false\n")
    res = runner.invoke(app, [*common, "--config", str(tmp_path / "serve.yaml"),
                              "--out", str(tmp_path / "file")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "file" / "config.json").read_text())["policy"] == "continuous"
    res = runner.invoke(app, [*common, "--enable-chunked-prefill", "--policy", "continuous",
                              "--out", str(tmp_path / "both")])
    assert res.exit_code == 1
    assert "--enable-chunked-prefill (--policy chunked) contradicts --policy continuous" in (
        res.output)


@pytest.mark.parametrize("args", [["run", "--help"], ["list", "--help"], ["calibrate", "--help"],
                                  ["sweep", "--help"], ["inspect", "--help"],
                                  ["run", "--max-num-seqs", "0"], ["run", "--no-such-flag"]])
def test_app_of_the_command_alone_parses_and_answers_alike(args: list[str]) -> None:
    from sim.app.cli.main import app_for

    one = app_for(args)
    assert [c.name for c in one.registered_commands] == [args[0]]
    whole, alone = runner.invoke(app, args), runner.invoke(one, args)
    assert (alone.exit_code, alone.output) == (whole.exit_code, whole.output)
    assert whole.output.strip()


@pytest.mark.parametrize("args", [[], ["--help"], ["--version"], ["rnu"]])
def test_whole_app_without_a_command_first(args: list[str]) -> None:
    from sim.app.cli.main import COMMANDS, app_for

    assert [c.name for c in app_for(args).registered_commands] == [c[0] for c in COMMANDS]


def test_an_app_of_commands_servesim_lacks_is_refused() -> None:
    from sim.app.cli.main import make_app

    assert [c.name for c in make_app(["plan", "run"]).registered_commands] == ["run", "plan"]
    with pytest.raises(KeyError, match="not servesim commands: rnu"):
        make_app(["run", "rnu"])


def test_a_run_imports_no_other_commands_module() -> None:
    modules = ("sim.app.cli.capacity", "sim.app.cli.validate", "sim.app.cli.tools",
               "sim.app.cli.run")
    code = ("import sys; from sim.app.cli.main import app_for; app_for(['run', '--help'])\n"
            f"print(sorted(m for m in {modules!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.split() == ["['sim.app.cli.run']"]


#: What a single-engine run on a CSV trace (chunked, no cluster, no disaggregation, stderr
#: not a terminal) never imports: each is imported where a run asks for it (another
#: policy, a router, a cluster, the pools, a prefix cache and its prompt content,
#: --compare, a preset, a JSON or servesim trace or a row pandas
#: cannot parse, a progress bar).
NOT_IMPORTED_BY_A_TRACE_RUN = (
    "policies.continuous", "policies.static", "policies.routers", "policies.router_tree",
    "scenarios.presets", "scenarios.lengths", "scenarios.prefixes", "scenarios.vllm_datasets",
    "scenarios.json_traces", "scenarios.mooncake", "scenarios.sharegpt",
    "scenarios.vllm_bench", "scenarios.traces.rows", "scenarios.traces.servesim",
    "sim.cluster", "sim.disagg", "sim.disagg.decode", "sim.disagg.link",
    "sim.disagg.link_spec", "sim.disagg.prefill", "sim.disagg.records", "sim.disagg.system",
    "sim.app.runs.compare", "sim.app.runs.disagg", "sim.app.runs.pools",
    "sim.app.runs.prompt_content", "sim.kv.prefix_slots",
    "sim.kv.block_cache", "sim.kv.free_block_queue", "sim.kv.radix_cache",
    "rich.progress", "numpy.typing",
)


def test_a_trace_run_imports_only_what_it_runs(tmp_path: Path) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.5000000,{100 + i},{10 + i}\n" for i in range(40)))

    def run_in_a_process(out: Path) -> str:
        args = ["run", "--trace", str(trace), "--arrival", "poisson", "--rate", "5",
                "--num-requests", "20", "--model", "llama-2-7b", "--gpu", "a100-80gb",
                "--policy", "chunked", "--max-num-batched-tokens", "512",
                "--max-num-seqs", "128", "--out", str(out)]
        code = (f"import sys; from sim.app.cli import launch; sys.argv = ['servesim', *{args!r}]\n"
                "try:\n    launch.main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
                f"print(sorted(m for m in {NOT_IMPORTED_BY_A_TRACE_RUN!r} if m in sys.modules))")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parents[1]).stdout

    # The first run parses the trace with pandas (which imports numpy.typing) into the
    # cache; the second reads the parse, as a run of a trace read before does.
    run_in_a_process(tmp_path / "first")
    out = run_in_a_process(tmp_path / "second")
    assert "azure trace azure.csv" in out  # the run ran, on the trace
    assert (tmp_path / "second" / "summary.json").is_file()
    assert out.strip().splitlines()[-1] == "[]"


def test_the_default_router_is_known_and_needs_no_prefix_cache() -> None:
    """RunConfig checks its default router without importing policies/routers.py."""
    from policies.routers import ROUTERS, check_prefix_cache

    assert RunConfig.router in ROUTERS
    check_prefix_cache(RunConfig.router, has_prefix_cache=False)  # raises for one that needs one
    with pytest.raises(ValueError, match="router must be one of round-robin, "):
        RunConfig(router="no-such-router")
