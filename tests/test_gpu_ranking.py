"""``servesim plan --gpu a,b,c``: each GPU type planned, ranked by $/hour at the target
from the shipped prices (or a price file, or --price), the table per type; the price
table's reading and its bad input."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from calibration.specs import load_data
from sim.app.cli.main import app
from sim.app.runs.gpu_ranking import (
    GpuPlan,
    grid_tensor_parallel,
    ranked,
    smallest_tensor_parallel,
)
from sim.app.runs.prices import GpuPrice, parse_price_flags, price_table, read_price_file
from sim.app.runs.runner import RunConfig
from sim.app.runs.sweep import Grid

runner = CliRunner()


def fixed_trace(tmp_path: Path, n: int = 300) -> Path:
    path = tmp_path / "fixed.csv"
    path.write_text("arrival_time,num_prompt_tokens,output_len\n"
                    + "".join(f"{i},64,{8 + i % 9}\n" for i in range(n)))
    return path


def plan_args(tmp_path: Path, out: str) -> list[str]:
    # A constant 10 ms step: every GPU type sustains the same rate, so every type needs
    # the same replicas and the ranking is the prices' order (replicas x price).
    return ["plan", "--trace", str(fixed_trace(tmp_path)), "--num-requests", "100",
            "--step-time", "0.01", "--max-num-seqs", "8", "--seeds", "0", "--slo-ttft",
            "0.1", "--target-rate", "100", "--start", "8", "--max-probes", "6",
            "--workers", "1", "--gpu", "h100-sxm,a100-80gb,l40s", "--out",
            str(tmp_path / out)]


def test_cli_plan_ranks_gpu_types_by_dollars_per_hour(tmp_path: Path) -> None:
    shipped = {r["gpu"]: r["usd_per_gpu_hour"] for r in load_data("gpu_prices.json")["prices"]}
    res = runner.invoke(app, plan_args(tmp_path, "a"))
    assert res.exit_code == 0, res.output
    plan = json.loads((tmp_path / "a" / "plan.json").read_text())
    rows = plan["gpu_types"]
    # Shipped prices: l40s 1.09 < a100-80gb 1.59 < h100-sxm 3.49 $/GPU-hour.
    assert [r["GPU"] for r in rows] == ["l40s", "a100-80gb", "h100-sxm"]
    for r in rows:
        assert r["TP"] == 1 and r["GPUs"] == r["replicas"] == 2 and r["binding SLO"] == "TTFT"
        assert r["$/hour"] == pytest.approx(2 * shipped[r["GPU"]])
        # 12 output tokens a request (8 + i % 9 over 300 rows is 11.9 on average, 100 drawn).
        tokens = plan["output_tokens_per_request"][r["GPU"]]
        assert 10 < tokens < 14
        assert r["$/M output tokens"] == pytest.approx(r["$/hour"] / (100 * tokens * 3600 / 1e6))
    md = (tmp_path / "a" / "capacity.md").read_text()
    assert "**Cheapest at 100 req/s: l40s**, 2 replica(s) x TP 1 = 2 GPU(s)" in md
    assert "| 1 | l40s | 2 | 1 | 2 | 1.09 | 2.18 |" in md and "## Deploy (l40s)" in md
    assert "RunPod Secure Cloud" in md and "2026-09-25" in md
    assert "GPU types compared" in (tmp_path / "a" / "capacity.html").read_text()
    assert "max_num_seqs: 8" in (tmp_path / "a" / "vllm_serve.yaml").read_text()
    # A price file where the H100 is cheapest turns the ranking over; --price wins over it.
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"h100-sxm": 0.5, "l40s": 2.0}))
    res = runner.invoke(app, [*plan_args(tmp_path, "b"), "--price-file", str(prices),
                              "--price", "a100-80gb=1.0"])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "b" / "plan.json").read_text())["gpu_types"]
    assert [(r["GPU"], r["$/hour"]) for r in rows] == [
        ("h100-sxm", 1.0), ("a100-80gb", 2.0), ("l40s", 4.0)]


@pytest.mark.parametrize(("args", "word"), [
    (["--gpu", "h100-sxm,nope"], "--gpu: unknown GPU 'nope'"),
    (["--gpu", "h100-sxm,l40s", "--price", "l40s=0"], "--price: l40s: a price must be a "
                                                       "number > 0"),
    (["--gpu", "h100-sxm,l40s", "--price", "l40s"], "--price: expected GPU=USD_PER_HOUR"),
    (["--price", "tpu=3"], "--price: unknown GPU 'tpu'"),
    (["--gpu", "h100-sxm,l40s", "--price-file", "missing.json"], "--price-file missing.json"),
    (["--gpu", "h100-sxm,l40s"], "several GPU types ranks them by the cost of the fleet at "
                                 "a target: give --target-rate"),
])
def test_cli_plan_gpu_types_bad_input(tmp_path: Path, args: list[str], word: str) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(app, ["plan", "--num-requests", "10", "--slo-ttft", "1",
                              "--out", str(out), *args])
    assert res.exit_code == 1 and word in res.output, res.output
    assert "Traceback" not in res.output and not out.exists()


def test_price_file_forms_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"prices": [{"gpu": "A100-80GB-SXM", "usd_per_gpu_hour": 2,
                                         "provider": "X", "date": "2026-01-01"}]}))
    assert read_price_file(f) == {"a100-80gb": GpuPrice("a100-80gb", 2.0, "X", "", "2026-01-01",
                                                        "--price-file p.json")}
    table = price_table(f, ["l40s=0.25"])
    assert table["a100-80gb"].usd_per_gpu_hour == 2.0 and table["l40s"].source == "--price"
    assert table["h100-sxm"].usd_per_gpu_hour == 3.49  # the shipped row, untouched
    for text, word in (("[1, 2]", "expected a JSON object"), ("{", "not valid JSON"),
                       ('{"h100-sxm": -1}', "a price must be a number > 0"),
                       ('{"prices": [{"gpu": "l40s"}]}', "needs 'gpu' and 'usd_per_gpu_hour'")):
        f.write_text(text)
        with pytest.raises(ValueError, match="--price-file") as e:
            read_price_file(f)
        assert word in str(e.value)
    assert parse_price_flags(["l40s=1", "l40s=2"])["l40s"].usd_per_gpu_hour == 2.0
    f.write_bytes(b'{"l40s": 1.0, "note": "\xff"}')  # Latin-1, not UTF-8
    with pytest.raises(ValueError, match=r"--price-file .*p\.json: not UTF-8 text"):
        read_price_file(f)
    f.write_text("[" * 100_000)  # deeper than the parser recurses
    with pytest.raises(ValueError, match=r"--price-file .*: not valid JSON"):
        read_price_file(f)


def test_rank_puts_answers_first_then_priced_types_by_dollars_per_hour() -> None:
    def plan(gpu: str, replicas: int | None, tp: int, usd: float | None) -> GpuPlan:
        res = SimpleNamespace(replicas=replicas, best=SimpleNamespace(tp=tp, gpus_per_replica=tp))
        return GpuPlan(gpu, res, GpuPrice(gpu, usd) if usd else None)  # type: ignore[arg-type]
    plans = [plan("h100-sxm", 2, 1, 3.0),  # 6 $/hour
             plan("l40s", 3, 2, 1.0),  # 6 $/hour, 6 GPUs: after the 2-GPU tie
             plan("a100-80gb", 4, 1, 1.0),  # 4 $/hour
             plan("l4", 1, 1, None),  # no price: after every priced type
             plan("h200-sxm", None, 1, 0.1)]  # no answer: last
    ranking = ranked(plans, {})
    assert [p.gpu for p in ranking.plans] == ["a100-80gb", "h100-sxm", "l40s", "l4",
                                              "h200-sxm"]
    assert [p.usd_per_hour for p in ranking.plans] == [4.0, 6.0, 6.0, None, None]
    assert ranking.chosen is ranking.plans[0]


def test_the_tp_is_where_every_cell_of_the_grid_starts() -> None:
    # Llama-3.1-70B on H100: TP 4 at vLLM's 0.9 of each GPU's memory; at 0.5, 141 GB of
    # weights over four GPUs leave no room for the KV cache in 40 GB each, so TP 8.
    base = RunConfig(model="llama-3.1-70b", gpu="h100-sxm")
    cells = Grid.parse({"gpu_memory_utilization": "0.9,0.5"}).cells()
    assert grid_tensor_parallel(base, cells[:1]) == 4
    assert grid_tensor_parallel(base, cells) == 8
    assert grid_tensor_parallel(base, []) == 4  # no axes: the base alone


def test_smallest_tensor_parallel_is_where_the_weights_fit() -> None:
    # Llama-3.1-8B (16 GB of bf16 weights) fits one GPU; Llama-3.1-70B (141 GB) does not
    # fit one or two 80 GB H100s with room for the KV cache, and fits four.
    assert smallest_tensor_parallel(RunConfig(model="llama-3.1-8b", gpu="l40s")) == 1
    assert smallest_tensor_parallel(RunConfig(model="llama-3.1-70b", gpu="h100-sxm")) == 4


@pytest.mark.parametrize("spec", ["lab.json", "lab.toml", "lab.yaml", "LAB.YML"])
def test_a_price_for_a_gpu_spec_file_is_refused(spec: str) -> None:
    # A spec file (any format --gpu reads) is no product with a public price.
    with pytest.raises(ValueError, match=r"--price: a GPU spec file .* has no public price"):
        parse_price_flags([f"{spec}=2.5"])
