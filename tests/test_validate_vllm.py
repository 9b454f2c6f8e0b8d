"""validate --engine vllm without vLLM: the replay protocol through a real child process
running the driver's fake engine (calibration/vllm_fake.py: vLLM's scheduling rule, known
linear costs), the measured figures rebuilt from steps (by hand), the agreement check (by
hand), the engine choice and every refusal (one line, exit 1). The real engine:
tests/test_calibration_vllm_real.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from calibration.fit import fit_points
from calibration.grid import GridConfig
from calibration.profile import profile_from_measurement, save_profile
from calibration.vllm_measure import measure_vllm
from sim.app.cli.main import app
from sim.app.runs.runner import prepare
from sim.app.runs.validate import shipped_profile, validation_config
from sim.app.runs.validate_vllm import (
    measured_requests,
    prepare_vllm_validation,
    resolve_engine,
    run_vllm_validation,
    shipped_vllm_profile,
)
from sim.app.runs.vllm_comparison import rule_agreement, vllm_validation_dict
from tests.test_calibration_vllm import COSTS, fake_settings, tiny_spec


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


GRID = GridConfig(max_num_seqs=8, max_num_batched_tokens=128, max_context=512, repeats=1)


@pytest.fixture(scope="module")
def fake_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profile fitted to the fake engine's steps: its fit is the fake's exact costs
    (tests/test_calibration_vllm.py checks the recovery), so it prices every step the
    fake runs exactly."""
    m = measure_vllm(tiny_spec(), GRID, fake_settings(), progress=False)
    path = tmp_path_factory.mktemp("fake") / "fake.json"
    save_profile(profile_from_measurement(tiny_spec(), m, fit_points(m.points)), path)
    return path


def fake_run(profile: Path, **fields: Any) -> dict[str, Any]:
    cfg = validation_config(str(profile), **{"scenario": "cpu-chat", "rate": 20.0,
                                             "num_requests": 30, **fields})
    prep, setup = prepare_vllm_validation(cfg, fake=COSTS)
    return vllm_validation_dict(prep, run_vllm_validation(prep, setup))


def test_fake_engine_priced_by_its_own_costs_is_matched_exactly(fake_profile: Path) -> None:
    # Same costs, same scheduling rule: every figure equal (to rounding), the same
    # schedule in every step, and the agreement check finds no parting.
    d = fake_run(fake_profile)
    assert d["target"] == "vllm-engine" and d["real"]["engine"] == "fake"
    for row in d["errors"]:
        assert row["error"] == pytest.approx(0.0, abs=1e-9), row["metric"]
    assert d["step_error"]["num_steps"] > 30 and d["step_error"]["max_abs"] < 1e-9
    assert d["same_schedule"] and d["same_admission_order"]
    a = d["agreement"]
    assert a["first_different_step"] is None and a["requests_scheduled_alike"] == 30
    assert d["measured"]["num_finished"] == 30 and d["rejected"] == []


def test_an_engine_that_costs_more_shows_as_a_negative_error(fake_profile: Path) -> None:
    # The fake's fixed step cost doubled (0.01 -> 0.02 s): every measured step is slower
    # than the profile says, so the bias is negative; the decisions still agree on the
    # engine's own step times.
    cfg = validation_config(str(fake_profile), scenario="cpu-chat", rate=20.0,
                            num_requests=30)
    prep, setup = prepare_vllm_validation(cfg, fake={**COSTS, "step": 0.02})
    d = vllm_validation_dict(prep, run_vllm_validation(prep, setup))
    steps = d["steps"]
    for p, m in zip(steps["predicted_s"], steps["measured_s"], strict=True):
        assert m == pytest.approx(p + 0.01, abs=1e-6)
    assert d["step_error"]["bias"] < 0
    assert d["agreement"]["first_different_step"] is None


def test_a_prompt_vllm_refuses_is_rejected_by_both(fake_profile: Path) -> None:
    # max_model_len 100: cpu-chat prompts of 100 tokens or more are refused by the engine
    # and rejected by the simulation (vLLM's rule: prompt >= max_model_len).
    d = fake_run(fake_profile, max_model_len=100)
    cfg = validation_config(str(fake_profile), scenario="cpu-chat", rate=20.0,
                            num_requests=30, max_model_len=100)
    long = [i for i, n in enumerate(prepare(cfg).workload.num_prompt_tokens) if n >= 100]
    assert long and sorted(r["request"] for r in d["rejected"]) == long
    assert d["simulation_rejected"] == len(long)
    assert d["measured"]["num_finished"] == 30 - len(long)


def test_measured_figures_from_steps_by_hand(fake_profile: Path) -> None:
    # Two requests arriving at 0 and 0.5 s. Steps (start, seconds): 0 (0, 1.0) request 0
    # prefills and samples its 1st token; 1 (1.0, 0.5) both: 0 decodes its 2nd, 1
    # prefills its 1st; 2 (1.5, 0.25) 0 finishes with 3, 1 its 2nd; 3 (1.75, 0.25) 1
    # finishes with 3.
    cfg = validation_config(str(fake_profile), scenario="cpu-chat", rate=20.0,
                            num_requests=2)
    prep = prepare(cfg)
    prep = dataclasses.replace(prep, workload=dataclasses.replace(
        prep.workload, arrival_time=np.array([0.0, 0.5])))
    steps = [
        {"start_s": 0.0, "seconds": 1.0, "scheduled": [[0, 40]], "outputs": [[0, 1, False]]},
        {"start_s": 1.0, "seconds": 0.5, "scheduled": [[0, 1], [1, 30]],
         "outputs": [[0, 2, False], [1, 1, False]]},
        {"start_s": 1.5, "seconds": 0.25, "scheduled": [[0, 1], [1, 1]],
         "outputs": [[0, 3, True], [1, 2, False]]},
        {"start_s": 1.75, "seconds": 0.25, "scheduled": [[1, 1]],
         "outputs": [[1, 3, True]]}]
    r = measured_requests(prep, steps)
    assert list(r["first_scheduled_time"]) == [0.0, 1.0]
    assert list(r["ttft_s"]) == [1.0, 1.0]  # 1.0 - 0; 1.5 - 0.5
    assert list(r["e2e_latency_s"]) == [1.75, 1.5]  # 1.75 - 0; 2.0 - 0.5
    assert list(r["tpot_s"]) == [0.375, 0.25]  # (1.75 - 1) / 2; (1.5 - 1) / 2
    assert sorted(r["itl"].expanded()) == [0.25, 0.25, 0.25, 0.5]
    assert list(r["num_output_tokens"]) == [3, 3] and r["done"].all()


def test_rule_agreement_by_hand() -> None:
    vllm = [((0, 8),), ((0, 1), (1, 8)), ((0, 1), (1, 1))]
    sim = [((0, 8),), ((0, 1), (1, 4)), ((0, 1), (1, 4))]
    a = rule_agreement(vllm, sim, 3)
    assert a["first_different_step"] == 1
    assert a["requests_scheduled_alike"] == 2  # request 0 alike, 1 not, 2 never scheduled
    assert rule_agreement(vllm, vllm[:2], 3)["first_different_step"] == 2


def test_engine_choice(fake_profile: Path, tmp_path: Path) -> None:
    assert resolve_engine("auto", str(fake_profile), None) == ("vllm", str(fake_profile))
    assert resolve_engine("auto", shipped_profile(), None) == ("torch", shipped_profile())
    assert resolve_engine("auto", None, "/some/python") == ("vllm", shipped_vllm_profile())
    assert resolve_engine("torch", None, None) == ("torch", shipped_profile())
    with pytest.raises(ValueError, match="engine must be one of auto, torch, vllm"):
        resolve_engine("sglang", None, None)
    with pytest.raises(ValueError, match="python: only with --engine vllm"):
        resolve_engine("torch", None, "/some/python")


@pytest.fixture
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """`validate --engine vllm` with the driver's fake engine."""
    import sim.app.runs.validate_vllm as vv

    real = vv.prepare_vllm_validation
    monkeypatch.setattr(vv, "prepare_vllm_validation",
                        lambda cfg, *a, **kw: real(cfg, *a, **{**kw, "fake": COSTS}))


def test_cli_writes_the_validation(fake_engine: None, fake_profile: Path,
                                   tmp_path: Path) -> None:
    out = tmp_path / "v"
    code, stdout, err = invoke("validate", "--engine", "vllm", "--profile", str(fake_profile),
                               "--scenario", "cpu-chat", "--rate", "20", "--num-requests",
                               "12", "--out", str(out), "--also-profile", str(fake_profile))
    assert code == 0, err
    assert "servesim scheduled as vLLM in every step" in stdout
    assert "12 of 12 requests scheduled alike" in stdout
    data = json.loads((out / "validation.json").read_text())
    assert data["also"]["profile"] == str(fake_profile)
    assert all(abs(r["error"]) < 1e-9 for r in data["also"]["errors"])
    assert (out / "validation.html").is_file() and (out / "predicted" / "summary.json").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["--engine", "bogus"], "engine must be one of auto, torch, vllm"),
    (["--engine", "vllm", "--policy", "static"], "policy must be chunked with --engine vllm"),
    (["--engine", "vllm", "--repeats", "2"], "repeats applies to the torch engine"),
    (["--engine", "vllm", "--preemption-mode", "swap"], "preemption_mode must be recompute"),
    (["--engine", "torch", "--python", "/x/python"], "python: only with --engine vllm"),
    (["--engine", "torch", "--also-profile", "p.json"], "also_profile: only with --engine"),
    (["--against", "r.json", "--engine", "vllm"], "engine, python and also_profile apply"),
])
def test_cli_refusals_are_one_line(fake_engine: None, fake_profile: Path, tmp_path: Path,
                                   args: list[str], message: str) -> None:
    profile = [] if "torch" in args else ["--profile", str(fake_profile)]
    code, _, err = invoke("validate", *profile, "--scenario", "cpu-chat", "--num-requests",
                          "4", "--out", str(tmp_path / "v"), *args)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err


def test_also_profile_of_another_model_is_refused(fake_engine: None, fake_profile: Path,
                                                  tmp_path: Path) -> None:
    code, _, err = invoke("validate", "--engine", "vllm", "--profile", str(fake_profile),
                          "--scenario", "cpu-chat", "--rate", "20", "--num-requests", "4",
                          "--out", str(tmp_path / "v"), "--also-profile", shipped_profile())
    assert code == 1 and "another model than the real run's (num_layers 24 against 2)" in err
