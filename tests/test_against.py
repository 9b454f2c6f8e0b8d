"""sim/app/runs/against.py and ``servesim validate --against``: a vllm bench serve result
(tests/data/vllm_bench/serve_small.json) replayed with a constant step time, so both
sides' figures and the fitted frontend term are known by hand.

The result: requests 0, 1 and 3 succeeded (2 failed), sent at 0, 0.5 and 1.25 s, with
4, 3 and 1 output tokens, TTFT 0.05, 0.06, 0.04 s and E2E 0.12, 0.11, 0.04 s. At 0.01 s a
step each arrives to an idle engine: TTFT 0.01 s, E2E 0.04, 0.03, 0.01 s (one step a token).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from calibration.frontend import Frontend
from sim.app.cli.main import app
from sim.app.runs.against import (
    METRICS_AGAINST,
    against_config,
    measured_summary,
    predicted_summary,
    prepare_against,
    run_against,
)
from sim.app.runs.validate import _get

SMALL = Path(__file__).parent / "data" / "vllm_bench" / "serve_small.json"
OLD = SMALL.parent / "benchmark_serving_old.json"


def _rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["metric"]: r for r in rows}


def test_measured_figures_by_hand() -> None:
    """Duration from the first send (0) to the last finish (1.25 + 0.04); TPOT =
    (E2E - TTFT) / (n - 1): 0.07 / 3 and 0.05 / 2, none for one token."""
    _, bench = prepare_against(SMALL, step_time=0.01)
    m = measured_summary(bench)
    assert m["duration_s"] == pytest.approx(1.29)
    assert m["throughput"]["requests_per_s"] == pytest.approx(3 / 1.29)
    assert m["throughput"]["output_tokens_per_s"] == pytest.approx(8 / 1.29)
    assert m["ttft_s"]["p50"] == pytest.approx(0.05)
    assert m["ttft_s"]["p90"] == pytest.approx(0.05 + 0.8 * 0.01)  # rank 1.8 of 3
    assert m["tpot_s"]["p50"] == pytest.approx((0.07 / 3 + 0.025) / 2)
    assert m["e2e_latency_s"]["p99"] == pytest.approx(0.11 + 0.98 * 0.01)
    assert m["itl_s"]["p50"] == pytest.approx(0.025)  # of 0.02, 0.02, 0.025, 0.025, 0.03


def test_engine_only_figures_equal_the_runs_own_summary() -> None:
    """With no term the client-side definition is summary.json's, to the last bit."""
    prep, bench = prepare_against(SMALL, step_time=0.01)
    a = run_against(prep, bench, fit=False)
    assert a.frontend is None
    engine = predicted_summary(a, Frontend())
    for _, path in METRICS_AGAINST:
        assert _get(engine, path) == _get(a.predicted.summary, path), path
    assert engine["duration_s"] == a.predicted.summary["duration_s"] == pytest.approx(1.26)


def test_fit_and_error_tables_by_hand() -> None:
    """TTFT differences 0.04, 0.05, 0.03 -> 40 ms; decode differences 0.04 (3 gaps) and
    0.03 (2 gaps) -> 14 ms a token. With the term every TTFT is 0.05 s and the E2Es are
    0.122, 0.098, 0.05 s: the last finish at 1.30 s."""
    from sim.app.runs.against import against_dict

    prep, bench = prepare_against(SMALL, step_time=0.01)
    a = run_against(prep, bench)
    assert a.frontend is not None
    assert a.frontend.frontend.ttft_s == pytest.approx(0.04)
    assert a.frontend.frontend.token_s == pytest.approx(0.014)
    data = json.loads(json.dumps(against_dict(prep, a)))  # serialisable, no NaN
    without, with_term = _rows(data["errors"]), _rows(data["errors_with_frontend"])
    assert without["throughput (req/s)"]["error"] == pytest.approx(1.29 / 1.26 - 1)
    assert without["TTFT p50 (s)"]["error"] == pytest.approx(0.01 / 0.05 - 1)
    assert without["E2E p50 (s)"]["error"] == pytest.approx(0.03 / 0.11 - 1)
    assert with_term["throughput (req/s)"]["error"] == pytest.approx(1.29 / 1.30 - 1)
    assert with_term["TTFT p50 (s)"]["error"] == pytest.approx(0.0, abs=1e-12)
    assert with_term["TTFT p90 (s)"]["error"] == pytest.approx(0.05 / 0.058 - 1)
    assert with_term["E2E p50 (s)"]["predicted"] == pytest.approx(0.098)
    assert with_term["TPOT p50 (s)"]["predicted"] == pytest.approx(0.024)
    assert data["requests"]["request_id"] == ["0", "1", "3"]
    assert data["requests"]["predicted_e2e_latency_s"] == pytest.approx([0.122, 0.098, 0.05])
    assert data["requests"]["engine_ttft_s"] == pytest.approx([0.01] * 3)
    assert data["against"]["num_failed"] == 1 and data["target"] == "vllm-bench"


def test_config_replays_the_result_and_picks_the_cost_model() -> None:
    cfg = against_config(SMALL, step_time=0.01, seed=0)
    assert (cfg.trace, cfg.trace_format, cfg.profile) == (str(SMALL), "vllm-bench", None)
    shipped = against_config(SMALL, profile=None, model=None)
    assert shipped.profile and shipped.profile.endswith("cpu-qwen2.5-0.5b.json")
    assert shipped.max_num_seqs == 32  # validate's profile grid limits
    roofline = against_config(SMALL, model="llama-3.1-8b", gpu="a100-40gb")
    assert (roofline.profile, roofline.gpu) == (None, "a100-40gb")


# -- the command --------------------------------------------------------------------------


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, ["validate", *args])


def test_command_prints_both_tables_and_writes_outputs(tmp_path: Path) -> None:
    out = tmp_path / "v"
    (out / "measured").mkdir(parents=True)  # left by a real-run validate
    (out / "measured" / "config.json").write_text('{"servesim_version": "0.1.0"}')
    res = _invoke("--against", str(SMALL), "--step-time", "0.01", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "simulation (engine only) vs the result" in res.stdout
    assert "simulation with the frontend term vs the result" in res.stdout
    assert "40.0 ms before the first token, 14.000 ms per output token" in res.stdout
    data = json.loads((out / "validation.json").read_text())
    assert data["frontend"]["fitted"] == ["ttft_s", "token_s"]
    assert (out / "predicted" / "summary.json").is_file() and not (out / "measured").exists()
    html = (out / "validation.html").read_text()
    assert 'id="errors-with-frontend"' in html and "figure-1" in html
    config = json.loads((out / "predicted" / "config.json").read_text())
    assert config["trace_format"] == "vllm-bench"  # `servesim run` can replay it


def test_command_given_term_without_fit(tmp_path: Path) -> None:
    res = _invoke("--against", str(SMALL), "--step-time", "0.01", "--no-fit-frontend",
                  "--frontend-ttft-s", "0.04", "--frontend-token-s", "0.014",
                  "--out", str(tmp_path / "v"))
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert data["frontend"]["fitted"] == []
    assert _rows(data["errors_with_frontend"])["TTFT p50 (s)"]["error"] == pytest.approx(
        0.0, abs=1e-12)
    res = _invoke("--against", str(SMALL), "--step-time", "0.01", "--no-fit-frontend",
                  "--out", str(tmp_path / "w"))
    assert res.exit_code == 0 and "no frontend term" in res.stdout
    assert json.loads((tmp_path / "w" / "validation.json").read_text())[
        "errors_with_frontend"] is None


def _malformed(tmp_path: Path, **changes: Any) -> Path:
    doc = json.loads(SMALL.read_text())
    doc.update(changes)
    path = tmp_path / "RESULT.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(("changes", "message"), [
    ({"ttfts": [0.05, 0.06, 0.0, "x"]}, "RESULT.json: ttfts[3] is not a number"),
    ({"itls": [[0.02], [0.025, None], [], []]}, "RESULT.json: itls[1][1] is not a number"),
    ({"output_lens": [4, 3, 0, -1]}, "RESULT.json: output_lens[3] -1 must be >= 1"),
    ({"start_times": [1.0, 2.0, 3.0]}, "RESULT.json: start_times has 3 entries, input_lens 4"),
])
def test_command_malformed_result_is_one_line(tmp_path: Path, changes: dict[str, Any],
                                              message: str) -> None:
    res = _invoke("--against", str(_malformed(tmp_path, **changes)), "--step-time", "0.01",
                  "--out", str(tmp_path / "v"))
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.stderr.startswith(f"error: {message}") and res.stderr.count("\n") == 1
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--against", str(OLD)), "benchmark_serving_old.json: no start_times"),
    (("--against", "nope.json"), "result file not found: nope.json"),
    (("--against", str(SMALL), "--scenario", "teaching"), "scenario does not apply with "
                                                          "--against"),
    (("--against", str(SMALL), "--profile", "p.json", "--step-time", "0.1"),
     "step_time and profile name two cost models"),
    (("--against", str(SMALL), "--device", "cpu"), "device applies to a real run here"),
    (("--against", str(SMALL), "--frontend-token-s", "-1"), "frontend_token_s must be a "
                                                            "finite number >= 0"),
])
def test_command_bad_input(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    res = _invoke(*args, "--out", str(tmp_path / "v"))
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert message in res.stderr and res.stderr.count("\n") == 1


def test_workload_lengths_match_the_result() -> None:
    prep, bench = prepare_against(SMALL, step_time=0.01)
    assert list(prep.workload.num_prompt_tokens) == list(bench.num_prompt_tokens)
    assert np.array_equal(prep.workload.arrival_time, [0.0, 0.5, 1.25])


def test_command_notes_requests_the_simulation_rejected(tmp_path: Path) -> None:
    """max_model_len 10 rejects the 12- and 20-token prompts (vLLM 0.33's engine rejects a
    prompt of at least max_model_len tokens); the fit uses the one left."""
    res = _invoke("--against", str(SMALL), "--step-time", "0.01", "--max-model-len", "10",
                  "--out", str(tmp_path / "v"))
    assert res.exit_code == 0, res.output
    assert "note: 2 of the result's 3 requests did not finish in the simulation" in res.stdout
    data = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert data["frontend"]["num_requests"] == 1
    assert data["frontend"]["ttft_s"] == pytest.approx(0.04 - 0.01)
