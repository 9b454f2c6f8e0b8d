"""``servesim plan``: the load search (bracket, then bisect), the capacity interval over
seeds, the cluster confirmation, the reports (answer first) and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.load_search import (
    SLO,
    Probe,
    ProbeTask,
    SearchTask,
    _next_load,
    run_probe,
    search,
    with_load,
)
from sim.app.runs.runner import RunConfig

runner = CliRunner()
STEP = 0.01


def fixed_trace(tmp_path: Path, n: int = 400) -> Path:
    path = tmp_path / "fixed.csv"
    path.write_text("arrival_time,num_prompt_tokens,output_len\n"
                    + "".join(f"{i},64,{8 + i % 9}\n" for i in range(n)))
    return path


def base(tmp_path: Path) -> RunConfig:
    return RunConfig(trace=str(fixed_trace(tmp_path)), num_requests=150, step_time=STEP,
                     max_num_seqs=8)


def test_next_load_brackets_then_bisects() -> None:
    ok, bad = Probe(load=4.0, seed=0, feasible=True), Probe(load=8.0, seed=0)
    assert _next_load(ok, None, False, 0.02) == 8.0  # double while feasible
    assert _next_load(None, bad, False, 0.02) == 4.0  # halve while infeasible
    assert _next_load(ok, bad, False, 0.02) == 6.0  # then bisect
    assert _next_load(ok, Probe(load=4.05, seed=0), False, 0.02) is None  # within 2%
    assert _next_load(Probe(load=4, seed=0, feasible=True), Probe(load=5, seed=0), True,
                      0.02) is None  # integers: adjacent
    assert _next_load(None, Probe(load=1, seed=0), True, 0.02) is None  # 1 user fails


def test_search_finds_the_boundary_within_tolerance(tmp_path: Path) -> None:
    slo = SLO(ttft_s=0.1, tpot_s=None)
    res = search(SearchTask(0, base(tmp_path), seed=0, slo=slo, start=4.0, tolerance=0.05))
    assert res.sustainable > 0 and res.upper is not None
    assert res.upper - res.sustainable <= 0.05 * res.sustainable
    feasible = [p for p in res.probes if p.feasible]
    assert max(p.load for p in feasible) == res.sustainable
    assert all(not p.feasible for p in res.probes if p.load >= res.upper)
    # Re-probing the answer gives the same verdict: the probe is deterministic.
    again = run_probe(ProbeTask(with_load(base(tmp_path), "rate", res.sustainable, 0), slo,
                                "rate"))
    assert again.feasible and again.ttft_attainment >= 0.99


@pytest.mark.slow
def test_cli_plan_answer_first_with_interval_and_cluster_check(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(app, [
        "plan", "--trace", str(fixed_trace(tmp_path)), "--num-requests", "150",
        "--step-time", str(STEP), "--max-num-seqs", "4,8", "--seeds", "0,1",
        "--slo-ttft", "0.1", "--slo-tpot", "0.02", "--target-rate", "100", "--start", "8",
        "--workers", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "One replica sustains" in res.output and "GPUs" in res.output
    md = (out / "capacity.md").read_text()
    sections = [md.index(h) for h in ("## Answer", "## Configs compared", "## Cluster checks",
                                      "## Sensitivity to burstiness",
                                      "## Open vs closed loop", "## Method")]
    assert sections == sorted(sections)
    # the cluster checks draw num_requests x replicas from the 400-row trace: oversampled
    assert "a trace with fewer rows is oversampled: every row once, then copies" in md
    plan = json.loads((out / "plan.json").read_text())
    best = plan["configs"][plan["best_config"]]
    med, lo, hi = best["interval"]
    assert 0 < lo <= med <= hi and best["knobs"] == {"max_num_seqs": 8}
    r = plan["replicas"]
    checks = plan["cluster_checks"][str(plan["best_config"])]
    assert any(c["replicas"] == r and c["passes"] for c in checks)
    assert not any(c["replicas"] < r and c["passes"] for c in checks)
    assert r * med >= 100 * 0.8  # the cluster is about target / per-replica capacity
    loops = plan["open_vs_closed"]
    assert [x["kind"] for x in loops] == ["closed", "open"]
    assert loops[1]["throughput_rps"] == pytest.approx(loops[0]["throughput_rps"], rel=0.15)
    html = (out / "capacity.html").read_text()
    assert html.index("Answer") < html.index("Configs compared")
    assert html.count("<script type='text/javascript'>") == 1


def test_cli_plan_concurrency_axis(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(app, [
        "plan", "--trace", str(fixed_trace(tmp_path)), "--num-requests", "150",
        "--step-time", str(STEP), "--max-num-seqs", "8", "--seeds", "0",
        "--slo-ttft", "0.1", "--load", "concurrency", "--target-concurrency", "30",
        "--workers", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    plan = json.loads((out / "plan.json").read_text())
    assert plan["load_axis"] == "concurrency" and plan["replicas"] >= 2
    assert "users" in (out / "capacity.md").read_text()


@pytest.mark.parametrize(("args", "word"), [
    ([], "SLO"),
    (["--slo-ttft", "1", "--target-concurrency", "4"], "--load concurrency"),
    (["--slo-ttft", "1", "--slo-percentile", "120"], "slo_percentile"),
    (["--slo-ttft", "2", "--slo-tpot", "50"], "slo_tpot 50 s looks like milliseconds"),
    (["--slo-ttft", "1", "--rate", "3"], "No such option"),
    (["--slo-ttft", "1", "--router", "cache-aware"], "prefix cache"),
    (["--slo-ttft", "1", "--router", "cache-aware", "--prefix-cache", "none,block"],
     "prefix cache"),
    # Checked for every config before the first probe: one line, no report written.
    (["--slo-ttft", "1", "--model", "nope"], "unknown model 'nope'"),
    (["--slo-ttft", "1", "--max-num-seqs", "0"], "max_num_seqs must be >= 1"),
    (["--slo-ttft", "1", "--policy", "nope,fifo"], "no cell can run; the first: policy nope"),
    (["--slo-ttft", "1", "--tensor-parallel-size", "3"], "must be divisible by tensor parallel"),
    (["--slo-ttft", "1", "--burstiness", "-2"], "burstiness must be > 0"),
    (["--slo-ttft", "1", "--trace", "nope.csv"], "not found"),
    (["--slo-ttft", "1", "--start", "inf"], "start must be a finite load > 0"),
    (["--slo-ttft", "1", "--target-rate", "10", "--check-requests", "-1"],
     "check_requests must be >= 1"),
])
def test_cli_plan_bad_input(tmp_path: Path, args: list[str], word: str) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(app, ["plan", "--num-requests", "10", "--out", str(out), *args])
    assert res.exit_code != 0 and word in res.output, res.output
    assert not out.exists()


@pytest.mark.slow
def test_cli_plan_compares_prefix_caches(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(app, ["plan", "--scenario", "system-prompts", "--num-requests", "60",
                              "--step-time", "0.02", "--slo-ttft", "0.5", "--seeds", "0",
                              "--max-probes", "6", "--prefix-cache", "none,block",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    plan = json.loads((out / "plan.json").read_text())
    assert [c["knobs"] for c in plan["configs"]] == [{"prefix_cache": "none"},
                                                      {"prefix_cache": "block"}]
    assert "prefix_cache=block" in (out / "capacity.md").read_text()


def test_cli_plan_leaves_a_cluster_too_large_to_simulate_unconfirmed(tmp_path: Path) -> None:
    # 32 req/s a replica (a 0.01 s step) puts 1e6 req/s at 31,250 replicas: more than
    # one run simulates (1024), so the target is reported unconfirmed, unchecked.
    res = runner.invoke(app, ["plan", "--num-requests", "200", "--seeds", "0",
                              "--max-probes", "6", "--workers", "1", "--slo-ttft", "1",
                              "--step-time", "0.01", "--target-rate", "1e6",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "capacity.md").read_text()
    assert "not confirmed** - the estimate of 31250 replicas is beyond the 1024" in md


def test_cli_plan_keeps_going_past_a_config_that_cannot_run(tmp_path: Path) -> None:
    # Llama-3.1-70B's weights (141 GB in bf16) do not fit one H100: TP 1 cannot run and
    # is noted; TP 4 is planned.
    res = runner.invoke(app, ["plan", "--model", "llama-3.1-70b", "--tensor-parallel-size",
                              "1,4", "--num-requests", "100", "--seeds", "0", "--max-probes",
                              "3", "--workers", "1", "--slo-ttft", "5", "--step-time", "0.05",
                              "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    tp1, tp4 = plan["configs"]
    assert plan["best_config"] == 1 and tp4["knobs"] == {"tensor_parallel_size": 4}
    assert "leaves no room for the KV cache" in tp1["error"] and tp4["error"] == ""


def test_cli_plan_takes_max_model_len_for_a_long_context_model_on_a_small_card(
        tmp_path: Path) -> None:
    # Llama-3.1-8B's 131,072-token context does not fit an L4's KV pool (about 45k tokens
    # at 0.9 utilization); the plan refuses it, and plans with --max-model-len 8192.
    args = ["plan", "--gpu", "l4", "--slo-ttft", "1", "--num-requests", "50", "--step-time",
            "0.01", "--seed", "4", "--max-probes", "3", "--workers", "1"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert res.exit_code == 1 and "decreasing `max_model_len`" in res.output, res.output
    res = runner.invoke(app, [*args, "--max-model-len", "8192", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    plan = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert plan["base"]["max_model_len"] == 8192 and plan["seeds"] == [4]
    assert plan["configs"][0]["error"] == "" and plan["configs"][0]["interval"][0] > 0


@pytest.mark.parametrize(("command", "hidden"), [
    ("plan", ("--diurnal-amplitude", "--replicas")),
    ("sweep", ()),
])
def test_help_leaves_out_what_the_command_refuses_or_sets(command: str,
                                                          hidden: tuple[str, ...]) -> None:
    res = runner.invoke(app, [command, "--help"], terminal_width=200)
    assert res.exit_code == 0 and "--max-num-seqs" in res.output
    assert [h for h in hidden if h in res.output] == []
    # both compare disaggregated pools with aggregated serving
    assert all(o in res.output for o in ("--disagg", "--kv-link", "--decode-max-num-seqs"))
