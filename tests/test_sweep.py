"""``servesim sweep``: the grid, common random numbers, parallel cells in grid order,
byte-identical reruns, sweep.csv / sweep.html, failed cells, and the Ray backend."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.backends import Executor, map_ordered
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from sim.app.runs.sweep import METRICS, Grid, cell_tasks, run_sweep
from tests.conftest import shared_path

runner = CliRunner()
BASE = RunConfig(num_requests=60, step_time=0.02, max_num_seqs=8)


def test_grid_is_the_product_in_axis_order() -> None:
    grid = Grid.parse({"rate": "2,4", "max_num_seqs": "8,16,32"}, "0,1")
    assert list(grid.axes) == ["max_num_seqs", "rate"]  # AXES order, not argument order
    assert len(grid.cells()) == 6 and grid.load_axis == "rate"
    tasks = cell_tasks(BASE, grid)
    assert [(t.cell, t.seed) for t in tasks[:3]] == [(0, 0), (0, 1), (1, 0)]
    assert tasks[2].config.max_num_seqs == 8 and tasks[2].config.rate == 4.0


@pytest.mark.parametrize(("values", "seeds", "word"), [
    ({"max_num_seqs": "8,x"}, "0", "max_num_seqs"),
    ({"max_num_seqs": "8,8"}, "0", "repeated"),
    ({"rate": "1", "concurrency": "2"}, "0", "not both"),
    ({"gpu_memory_utilization": ""}, "0", "gpu_memory_utilization"),
    ({}, "-1", "seeds"),
])
def test_grid_errors(values: dict, seeds: str, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        Grid.parse(values, seeds)


def test_common_random_numbers_across_rates() -> None:
    trace = str(shared_path("traces", "AzureLLMInferenceTrace_conv.csv"))
    base = dataclasses.replace(BASE, trace=trace, num_requests=200)
    a, b = (prepare(t.config).workload for t in
            cell_tasks(base, Grid.parse({"rate": "2,8"}, "3")))
    assert np.array_equal(a.num_prompt_tokens, b.num_prompt_tokens)
    assert np.allclose(a.arrival_time, 4 * b.arrival_time)  # same draws, gaps rescaled


def test_failed_cell_gives_an_error_row_not_a_failed_sweep() -> None:
    base = RunConfig(num_requests=20, model="llama-3.1-70b", tensor_parallel_size=4)
    df = run_sweep(base, Grid.parse({"gpu_memory_utilization": "0.9,0.3"}), workers=1)
    assert list(df["error"] == "") == [True, False]
    assert "gpu_memory_utilization" in df["error"][1] and pd.isna(df["throughput_rps"][1])


def test_cli_sweep_runs_past_a_cell_that_cannot_run_and_retimes_traces(
        tmp_path: Path) -> None:
    # Checked before running: one cell that cannot run is an error row, not a refusal;
    # a rate axis over a trace re-times it by Poisson arrivals (no --arrival needed).
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,num_prompt_tokens,output_len\n"
                     + "".join(f"{i * 0.5},{100 + i},{5 + i % 3}\n" for i in range(20)))
    res = runner.invoke(app, ["sweep", "--trace", str(trace), "--rate", "2,4",
                              "--gpu-memory-utilization", "0.01,0.9", "--step-time", "0.01",
                              "--workers", "1", "--out", str(tmp_path / "sw")])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "sw" / "sweep.csv", keep_default_na=False)
    assert list(df["error"] == "") == [False, False, True, True]  # the first cells fail
    assert df["error"].iloc[0].startswith("gpu_memory_utilization 0.01 leaves no room")
    # A burstiness axis beside the rate axis re-times the trace by gamma arrivals.
    res = runner.invoke(app, ["sweep", "--trace", str(trace), "--rate", "2,4",
                              "--burstiness", "0.5,2", "--step-time", "0.01", "--workers",
                              "1", "--out", str(tmp_path / "gamma")])
    assert res.exit_code == 0, res.output
    assert (pd.read_csv(tmp_path / "gamma" / "sweep.csv")["error"].isna()).all()


@pytest.mark.parametrize("command", ["sweep", "plan"])
def test_a_workload_error_common_to_every_cell_is_one_line(command: str,
                                                          tmp_path: Path) -> None:
    # Every cell shares the missing trace: refused before any run, whatever the cells.
    res = runner.invoke(app, [command, "--trace", str(tmp_path / "nope.jsonl"), "--policy",
                              "chunked,continuous", "--num-requests", "20", "--step-time",
                              "0.01", "--slo-ttft", "1", "--out", str(tmp_path / "o")])
    assert res.exit_code == 1
    # plan reads the trace's timing (for its other view) before it checks the cells.
    said = ("no cell can run; the first: policy chunked: trace file not found"
            if command == "sweep" else "error: trace file not found")
    assert said in " ".join(res.output.split())
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_cli_sweep_writes_csv_and_offline_html_and_reruns_identically(tmp_path: Path) -> None:
    args = ["sweep", "--num-requests", "60", "--step-time", "0.02", "--max-num-seqs", "4,16",
            "--rate", "5,40", "--seeds", "0,1", "--workers", "2", "--slo-ttft", "0.5"]
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    assert "4 cells x 2 seed(s) = 8 runs" in first.output
    df = pd.read_csv(tmp_path / "a" / "sweep.csv", keep_default_na=False)
    assert list(df.columns) == ["cell", "seed", "max_num_seqs", "rate", *METRICS, "error"]
    assert len(df) == 8 and list(df["seed"]) == [0, 1] * 4
    # 4 slots at 40 req/s of 0.02 s steps cannot keep up: flagged in the csv and table.
    sat = df.set_index(["max_num_seqs", "rate"])["saturated"]
    assert sat[(4, 40.0)].tolist() == [True, True] and not sat[(16, 5.0)].any()
    html = (tmp_path / "a" / "sweep.html").read_text()
    assert html.count("<script type='text/javascript'>") == 1  # plotly.js inline, once
    assert "<script src=" not in html and "Heatmaps" in html and "SAT" in html
    second = runner.invoke(app, [*args, "--workers", "1", "--out", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    assert (tmp_path / "a" / "sweep.csv").read_bytes() == \
        (tmp_path / "b" / "sweep.csv").read_bytes()


def test_cli_sweep_closed_loop_axis(tmp_path: Path) -> None:
    res = runner.invoke(app, ["sweep", "--num-requests", "40", "--step-time", "0.02",
                              "--concurrency", "1,4", "--think-time", "0.1", "--workers", "1",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "sweep.csv")
    assert list(df["concurrency"]) == [1, 4] and df["offered_rate"].isna().all()
    assert df["throughput_rps"][1] > df["throughput_rps"][0]


def test_cli_sweep_bad_input(tmp_path: Path) -> None:
    for args, word in ((["--max-num-seqs", "a"], "max_num_seqs"),
                       (["--trace", str(tmp_path / "none.csv")], "none.csv"),
                       (["--backend", "slurm"], "backend")):
        res = runner.invoke(app, ["sweep", "--num-requests", "5", "--out", str(tmp_path),
                                  *args])
        assert res.exit_code == 1 and word in res.output, res.output


def test_executor_keeps_item_order() -> None:
    assert map_ordered(abs, [-3, 1, -2, 5], workers=2) == [3, 1, 2, 5]
    with Executor(1) as ex:
        assert ex.map(abs, [-1, -2]) == [1, 2]
    with pytest.raises(ValueError, match="address"):
        Executor(2, "local", address="ray://x")


@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason="ray is not installed (pip install 'servesim[ray]')")
@pytest.mark.slow
def test_ray_backend_matches_local() -> None:
    import ray

    grid = Grid.parse({"max_num_seqs": "4,16", "rate": "5,40"}, "0,1")
    local = run_sweep(BASE, grid, workers=2)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_sweep(BASE, grid, backend="ray")
    finally:
        ray.shutdown()
    pd.testing.assert_frame_equal(local, remote)


def test_cli_sweep_prefix_cache_axis(tmp_path: Path) -> None:
    res = runner.invoke(app, ["sweep", "--scenario", "system-prompts", "--num-requests", "80",
                              "--step-time", "0.02", "--prefix-cache", "none,block,radix",
                              "--workers", "1", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "prefix hit rate" in res.output
    df = pd.read_csv(tmp_path / "sweep.csv")
    assert list(df["prefix_cache"]) == ["none", "block", "radix"]
    assert pd.isna(df["prefix_hit_rate"][0])
    for i, mode in ((1, "block"), (2, "radix")):  # the run's own summary, cell by cell
        run = simulate_prepared(prepare(RunConfig(scenario="system-prompts", num_requests=80,
                                                  step_time=0.02, prefix_cache=mode)))
        hit = run.summary["prefix_cache"]["hit_rate_tokens"]
        assert hit > 0 and df["prefix_hit_rate"][i] == pytest.approx(hit, rel=1e-12)


def test_a_cell_whose_knobs_make_no_config_is_an_error_row(tmp_path: Path) -> None:
    res = runner.invoke(app, ["sweep", "--concurrency", "0,2", "--num-requests", "10",
                              "--step-time", "0.01", "--workers", "1",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "sweep.csv", keep_default_na=False)
    assert list(df["concurrency"]) == [0, 2]
    assert df["error"].iloc[0] == "concurrency must be an integer >= 1, got 0"
    assert df["error"].iloc[1] == "" and float(df["throughput_rps"].iloc[1]) > 0


def test_cli_sweep_takes_runs_engine_and_workload_options(tmp_path: Path) -> None:
    # Ten requests 1 s apart, 16-token prompts but one of 100, 4 output tokens each.
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,num_prompt_tokens,output_len\n" + "".join(
        f"{i},{100 if i == 3 else 16},4\n" for i in range(10)))
    res = runner.invoke(app, [
        "sweep", "--trace", str(trace), "--step-time", "0.01", "--max-num-seqs", "4,8",
        "--max-model-len", "64", "--time-scale", "2", "--block-size", "32",
        "--num-gpu-blocks", "500", "--kv-allocation", "reserve", "--queue", "sjf",
        "--preemption-mode", "swap", "--swap-space", "8", "--seed", "3", "--workers", "1",
        "--out", str(tmp_path / "sw")])
    assert res.exit_code == 0, res.output
    base = json.loads((tmp_path / "sw" / "sweep.json").read_text())["base"]
    assert {k: base[k] for k in ("max_model_len", "time_scale", "block_size", "num_gpu_blocks",
                                 "kv_allocation", "queue", "preemption_mode", "swap_space")} == {
        "max_model_len": 64, "time_scale": 2.0, "block_size": 32, "num_gpu_blocks": 500,
        "kv_allocation": "reserve", "queue": "sjf", "preemption_mode": "swap",
        "swap_space": 8.0}
    df = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert list(df["seed"]) == [3, 3]  # --seed is --seeds
    assert list(df["num_rejected"]) == [1, 1]  # a 100-token prompt >= max_model_len 64
    assert list(df["offered_rate"]) == [2.0, 2.0]  # 9 gaps of 1 s, twice as fast
    # One request at a time holds one 32-token block (16 + 4 reserved) of the 499 usable
    # (block 0 is vLLM's null block).
    assert df["kv_peak_usage"].tolist() == pytest.approx([1 / 499, 1 / 499])



def test_workers_import_servesim_whatever_folders_the_command_runs_in(tmp_path: Path) -> None:
    # A user's own scenarios/ package in the folder a sweep runs in. servesim is put on a
    # plain path (PYTHONPATH, no site: an editable install's finder would hide the
    # shadowing), as a regular install is; the forkserver starts in that folder with it
    # first on its path, and its preloads used to import the user's package for every
    # worker (BrokenProcessPool).
    import subprocess
    import sys

    site = str(Path(np.__file__).resolve().parents[1])
    root = str(Path(__file__).resolve().parents[1])
    work = tmp_path / "work"
    (work / "scenarios").mkdir(parents=True)
    (work / "scenarios" / "__init__.py").write_text("# a user's own package\n")
    script = tmp_path / "sweep.py"
    script.write_text("from sim.app.cli.launch import main\n"
                      "if __name__ == '__main__':\n    main()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, site])}
    proc = subprocess.run(
        [sys.executable, "-S", str(script), "sweep", "--num-requests", "20",
         "--max-num-seqs", "4,8", "--step-time", "0.01", "--workers", "2", "--out", "sw"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(pd.read_csv(work / "sw" / "sweep.csv")) == 2
