"""Prefill/decode disaggregation in ``servesim plan`` and ``servesim sweep``: the disagg
axis (none or xPyD), a disaggregated config scaled in whole xPyD units, each kind's best
confirmed so that the report compares an aggregated and a disaggregated fleet, and the
GPUs counted as (x + y) x TP a unit."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.cli.plan_input import plan_grid
from sim.app.reports.deploy_section import deploy_markdown
from sim.app.reports.fleet_text import fleet_text
from sim.app.reports.plan_page import answer_lines
from sim.app.runs.axes import AUTO_DISAGG, PLAN_AXES, disagg_value
from sim.app.runs.deploy_config import deployment
from sim.app.runs.load_search import SLO, Probe, ProbeTask, SearchResult
from sim.app.runs.plan import PlanResult, choose
from sim.app.runs.plan_spec import ConfigResult, PlanSpec, candidates
from sim.app.runs.runner import RunConfig
from sim.app.runs.sweep import Grid, cell_config, grid_base
from tests.test_plan import fixed_trace

runner = CliRunner()


def test_disagg_axis_takes_none_or_xpyd() -> None:
    assert [disagg_value(t) for t in ("none", "NONE", "1p2d", "3P1D")] == [
        "none", "none", "1P2D", "3P1D"]
    for bad in ("auto", "1P", "0P1D", "2X2D"):
        with pytest.raises(ValueError, match="xPyD"):
            disagg_value(bad)


def test_pool_options_reach_the_disaggregated_cells_only() -> None:
    grid = Grid.parse({"disagg": "none,1P2D"})
    base = grid_base({"kv_link": "tcp", "decode_max_num_seqs": 64}, grid)
    agg, dis = (cell_config(base, k) for k in grid.cells())
    assert (agg.disagg, agg.kv_link, agg.decode_max_num_seqs) == (None, None, None)
    assert (dis.disagg, dis.kv_link, dis.decode_max_num_seqs) == ("1P2D", "tcp", 64)
    # a link without any xPyD cell is the run's own error, naming the field
    with pytest.raises(ValueError, match="kv_link applies to disaggregated runs only"):
        grid_base({"kv_link": "tcp"}, Grid.parse({"disagg": "none"}))


def test_a_disaggregated_replica_is_one_xpyd_unit() -> None:
    c = ConfigResult(0, {}, RunConfig(disagg="1P2D", tensor_parallel_size=2))
    assert c.pools == (1, 2) and c.gpus_per_replica == 6  # (1 + 2) engines x TP 2
    assert c.scaled(3).disagg == "3P6D" and c.scaled(3).num_gpus == 18
    assert fleet_text(c, 3) == "3 x 1P2D = 3P6D x TP 2 = 18 GPUs"
    agg = ConfigResult(1, {}, RunConfig(tensor_parallel_size=2))
    assert (agg.pools, agg.gpus_per_replica, agg.scaled(3).replicas) == (None, 2, 3)
    assert fleet_text(agg, 3) == "3 replicas x TP 2 = 6 GPUs"


#: The fake world of test_choose_...: one aggregated replica serves 10 req/s; a prefill
#: engine 40 req/s and a decode engine 20 req/s, so xPyD serves min(40 x, 20 y).
AGG_RPS, PREFILL_RPS, DECODE_RPS = 10.0, 40.0, 20.0


def capacity(cfg: RunConfig) -> float:
    if cfg.disagg is None:
        return AGG_RPS * cfg.replicas
    x, y = (int(n) for n in cfg.disagg.rstrip("D").split("P"))
    return min(PREFILL_RPS * x, DECODE_RPS * y)


def test_choose_confirms_each_kind_and_picks_the_fewest_gpus() -> None:
    grid = Grid.parse({"disagg": "none,1P1D,1P2D"})
    spec = PlanSpec(RunConfig(), SLO(1.0, None), grid, target=80.0)
    configs = candidates(spec)
    for c in configs:  # each unit's capacity, as its load search would find it
        cap = capacity(c.config)
        c.searches.append(SearchResult(c.index, 0, (), cap, cap, None))
    seen: list[str] = []

    def fake_runner(fn: object, tasks: list[ProbeTask]) -> list[Probe]:
        out = []
        for t in tasks:
            seen.append(t.config.disagg or f"{t.config.replicas} replicas")
            out.append(Probe(t.config.rate or 0.0, t.config.seed,
                             feasible=capacity(t.config) >= (t.config.rate or 0.0)))
        return out

    best, checks, replicas = choose(spec, configs, fake_runner)
    # By hand at 80 req/s: aggregated 8 replicas = 8 GPUs; 1P1D units serve 20, so 4 units
    # = 8 GPUs; 1P2D units serve 40, so 2 units = 2P4D = 6 GPUs: the fewest.
    assert best is configs[2] and replicas == 2
    # The three best estimates are each confirmed, best first: 1P2D at 2 units (1 fails),
    # aggregated at 8 replicas (7 fail), 1P1D at 4 units (3 fail).
    assert seen == ["2P4D", "1P2D", "8 replicas", "7 replicas", "4P4D", "3P3D"]
    assert set(checks) == {0, 1, 2}
    res = PlanResult(spec, configs, best, checks, replicas, 40.0, [], [])
    lines = answer_lines(res)
    assert ("**Aggregated or disaggregated: disaggregated saves 2 GPUs**: aggregated 8 "
            "replicas x TP 1 = 8 GPUs (disagg=none); disaggregated 2 x 1P2D = 2P4D x TP 1 "
            "= 6 GPUs (disagg=1P2D)") in lines
    assert any(line.startswith("**Target 80 req/s: 2 x 1P2D = 2P4D x TP 1 = 6 GPUs**")
               for line in lines)


def test_plan_refuses_disagg_with_closed_loop_users() -> None:
    with pytest.raises(ValueError, match="--disagg takes open-loop arrivals"):
        PlanSpec(RunConfig(), SLO(1.0, None), Grid.parse({"disagg": "none,1P1D"}),
                 load_axis="concurrency")


def sweep_csv(tmp_path: Path, num_requests: int, *args: str) -> pd.DataFrame:
    """sweep.csv of a sweep of ``args`` over the fixed trace at 5 req/s, 10 ms a step."""
    out = tmp_path / "sweep"
    res = runner.invoke(app, [
        "sweep", "--trace", str(fixed_trace(tmp_path)), "--num-requests", str(num_requests),
        "--step-time", "0.01", "--rate", "5", *args, "--workers", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return pd.read_csv(out / "sweep.csv")


def test_cli_sweep_compares_pools_and_counts_their_gpus(tmp_path: Path) -> None:
    df = sweep_csv(tmp_path, 60, "--disagg", "none,1P1D,1p2d", "--kv-link", "tcp")
    assert list(df["disagg"]) == ["none", "1P1D", "1P2D"]
    assert list(df["num_gpus"]) == [1, 2, 3]
    assert df["error"].isna().all() and (df["num_finished"] == 60).all()


def test_cli_sweep_names_the_field_of_a_bad_pool_value(tmp_path: Path) -> None:
    res = runner.invoke(app, ["sweep", "--disagg", "none,2X1D", "--out",
                              str(tmp_path / "s")])
    assert res.exit_code == 1 and "disagg" in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_cli_plan_answers_aggregated_or_disaggregated(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(app, [
        "plan", "--trace", str(fixed_trace(tmp_path)), "--num-requests", "100",
        "--step-time", "0.01", "--max-num-seqs", "8", "--seeds", "0",
        "--slo-ttft", "0.2", "--slo-tpot", "0.02", "--target-rate", "30",
        "--disagg", "none,1P1D", "--kv-link", "tcp", "--workers", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    plan = json.loads((out / "plan.json").read_text())
    assert [c["knobs"]["disagg"] for c in plan["configs"]] == ["none", "1P1D"]
    md = (out / "capacity.md").read_text()
    assert "Aggregated or disaggregated" in md
    # both kinds were confirmed by a cluster check at the target
    assert set(plan["cluster_checks"]) == {"0", "1"}


def test_a_disaggregated_deployment_starts_every_engine_of_both_pools() -> None:
    c = ConfigResult(0, {}, RunConfig(disagg="1P1D", prefill_tensor_parallel_size=2,
                                      decode_max_num_seqs=64))
    assert fleet_text(c, 2) == "2 x 1P1D = 2P2D (prefill TP 2, decode TP 1) = 6 GPUs"
    d = deployment(c.scaled(2), 2, "round-robin")  # 2 units: 2P2D
    assert d.replicas == 4 and d.disagg == "2P2D"
    assert "vllm_serve.yaml: 2P2D, 4 engines, prefill TP 2, decode TP 1 on h100-sxm" in d.yaml()
    # By hand, on one 8-GPU node: the prefill engines (TP 2) on GPUs 0-1 and 2-3, then
    # the decode engines (TP 1) on GPUs 4 and 5, each with its pool's own flags.
    serve = "vllm serve --config vllm_serve.yaml"
    assert d.commands() == [
        f"CUDA_VISIBLE_DEVICES=0,1 {serve} --tensor-parallel-size 2 --port 8000  # node 1",
        f"CUDA_VISIBLE_DEVICES=2,3 {serve} --tensor-parallel-size 2 --port 8001  # node 1",
        f"CUDA_VISIBLE_DEVICES=4 {serve} --max-num-seqs 64 --port 8002  # node 1",
        f"CUDA_VISIBLE_DEVICES=5 {serve} --max-num-seqs 64 --port 8003  # node 1"]
    note = d.notes[-1]
    assert note.startswith("disaggregated serving, 2P2D: the first 2 command(s) are the "
                           "prefill instances, the other 2 the decode instances")
    assert "NixlConnector" in note and d.serve["enable_prefix_caching"] is False


def test_each_pool_on_its_own_gpu_type_and_own_batch_limits() -> None:
    # 1P1D with the prefill pool on A100s, both pools at TP 2: one node per GPU type. By
    # vLLM's API-server defaults (sim/app/runs/defaults.py) an A100 engine runs 256
    # sequences and 2,048 tokens a step, the H100 YAML 1,024 and 8,192, so the A100
    # engine's command sets its own; both set TP 2 over the YAML's TP 1.
    c = ConfigResult(0, {}, RunConfig(model="llama-3.1-8b", disagg="1P1D",
                                      prefill_gpu="a100-80gb",
                                      prefill_tensor_parallel_size=2,
                                      decode_tensor_parallel_size=2))
    d = deployment(c.scaled(1), 1, "round-robin")
    assert (d.serve["max_num_seqs"], d.serve["max_num_batched_tokens"]) == (1024, 8192)
    serve = "vllm serve --config vllm_serve.yaml --tensor-parallel-size 2"
    assert d.commands() == [
        f"CUDA_VISIBLE_DEVICES=0,1 {serve} --max-num-seqs 256 --max-num-batched-tokens 2048 "
        "--port 8000  # node 1 (a100-80gb)",
        f"CUDA_VISIBLE_DEVICES=0,1 {serve} --port 8000  # node 2"]
    assert "1P1D, 2 engines, prefill TP 2 on a100-80gb, decode TP 2" in d.yaml()


def test_engines_that_do_not_fit_a_node_take_the_next() -> None:
    # 3P1D at prefill TP 4: 4 + 4 GPUs fill node 1, the third prefill engine and the
    # decode engine (TP 1) go to node 2.
    c = ConfigResult(0, {}, RunConfig(model="llama-3.1-8b", disagg="3P1D",
                                      prefill_tensor_parallel_size=4))
    lines = deployment(c.scaled(1), 1, "round-robin").commands()
    assert [(line.split()[0], line.split("# ")[1]) for line in lines] == [
        ("CUDA_VISIBLE_DEVICES=0,1,2,3", "node 1"), ("CUDA_VISIBLE_DEVICES=4,5,6,7", "node 1"),
        ("CUDA_VISIBLE_DEVICES=0,1,2,3", "node 2"), ("CUDA_VISIBLE_DEVICES=4", "node 2")]


def test_a_plan_compares_each_pools_tensor_parallelism() -> None:
    grid = Grid.parse({"disagg": "none,1P1D", "decode_tensor_parallel_size": "1,2"})
    spec = PlanSpec(grid_base({"model": "llama-3.1-8b"}, grid), SLO(1.0, None), grid,
                    target=10.0)
    configs = candidates(spec)
    # the aggregated cell of TP 2 is the aggregated cell of TP 1 (pool options apply to
    # xPyD cells only): skipped, not searched twice
    assert [c.error.startswith("skipped: the same engine config") for c in configs] == [
        False, True, False, False]
    # 1P1D units: 1 prefill GPU + 1 or 2 decode GPUs
    assert [c.gpus_per_replica for c in configs] == [1, 1, 2, 3]
    assert configs[3].scaled(2).num_gpus == 6  # 2P2D: 2 x 1 + 2 x 2


def test_auto_stands_for_its_ratios_inside_a_list_too() -> None:
    opts = {**dict.fromkeys(PLAN_AXES), "disagg": "auto,4P1D,1p1d,None", "seeds": "0"}
    assert plan_grid(opts).axes["disagg"] == (*AUTO_DISAGG, "4P1D")


def test_a_config_equal_to_a_cell_that_could_not_be_built_is_searched() -> None:
    # gpu_memory_utilization 1.5 makes no config (its cell holds the base's); 0.9 is the
    # base's value, so it equals that placeholder, and must still be searched.
    grid = Grid.parse({"gpu_memory_utilization": "1.5,0.9"})
    configs = candidates(PlanSpec(RunConfig(), SLO(1.0, None), grid, target=5.0))
    assert configs[0].error.startswith("gpu_memory_utilization must be in (0, 1]")
    assert configs[1].error == ""


def test_a_pool_on_another_gpu_is_refused_by_a_price_ranking(tmp_path: Path) -> None:
    res = runner.invoke(app, ["plan", "--gpu", "h100-sxm,a100-80gb", "--disagg", "1P1D",
                              "--prefill-gpu", "h200-sxm", "--target-rate", "5",
                              "--slo-ttft", "2", "--out", str(tmp_path / "p")])
    assert res.exit_code == 1 and "--prefill-gpu" in res.output, res.output
    assert res.output.count("\n") == 1 and not (tmp_path / "p").exists()


def test_a_cache_that_a_pool_cannot_take_fails_that_cell_only(tmp_path: Path) -> None:
    df = sweep_csv(tmp_path, 40, "--disagg", "none,1P1D", "--prefix-cache", "none,block")
    failed = df[df["error"].notna()]
    assert list(zip(failed["disagg"], failed["prefix_cache"], strict=True)) == [
        ("1P1D", "block")]
    assert "conflicts with disagg" in failed["error"].iloc[0]


def test_a_disaggregated_deploy_section_names_the_proxy_not_a_load_balancer() -> None:
    c = ConfigResult(0, {}, RunConfig(disagg="1P2D"))
    md = "\n".join(deploy_markdown(deployment(c.scaled(1), 1, "round-robin")))
    assert md.startswith("1P2D: 3 engines (TP 1) on h100-sxm, behind vLLM's "
                         "disaggregated-serving proxy")
    assert "One command per engine:" in md and "load balancer" not in md
