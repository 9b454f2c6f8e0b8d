"""calibration/profile.py's checks on read (check_profile): a profile that cannot price a
step (all-zero, negative, infinite or NaN coefficients; a one-token step at 0 s), lacks
its held-out statistics, or holds fields of the wrong type is refused with one line naming
the file; the shipped profiles and one written by ``calibrate --refit`` pass. Each bad
profile is the shipped one with one field changed by hand."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from calibration.fit import FEATURES
from calibration.profile import load_profile
from sim.app.cli.main import app

SHIPPED = ("cpu-qwen2.5-0.5b.json", "cpu-vllm-qwen2.5-0.5b-8l.json")


def shipped(name: str = SHIPPED[0]) -> dict[str, Any]:
    ref = resources.files("calibration.profiles").joinpath(name)
    return json.loads(ref.read_text(encoding="utf-8"))


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return path


def refused(tmp_path: Path, data: dict[str, Any]) -> str:
    """load_profile's one-line message for ``data``, less the ``PATH: malformed profile: ``
    it starts with."""
    path = write(tmp_path, data)
    with pytest.raises(ValueError) as info:
        load_profile(path)
    msg = str(info.value)
    prefix = f"{path}: malformed profile: "
    assert msg.startswith(prefix) and "\n" not in msg, msg
    return msg[len(prefix):]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_pass(name: str) -> None:
    ref = resources.files("calibration.profiles").joinpath(name)
    with resources.as_file(ref) as path:
        assert load_profile(path).fit.status == "accepted"


@pytest.mark.parametrize("name", SHIPPED)
def test_a_refit_profile_passes(tmp_path: Path, name: str) -> None:
    """What calibrate writes (a new fit of the shipped points) reads back, the same fit."""
    src, dst = write(tmp_path, shipped(name)), tmp_path / "refit.json"
    res = CliRunner().invoke(app, ["calibrate", "--refit", str(src), "--out", str(dst)])
    assert res.exit_code == 0, res.output
    assert load_profile(dst).fit.coefficients == pytest.approx(
        shipped(name)["fit"]["coefficients"], rel=1e-9, abs=1e-15)


def test_all_zero_coefficients_are_refused(tmp_path: Path) -> None:
    data = shipped()
    data["fit"]["coefficients"] = [0.0] * len(FEATURES)
    assert refused(tmp_path, data) == ("fit.coefficients are all 0: every step would take "
                                       "0 s; recalibrate")


def test_run_with_an_all_zero_profile_exits_with_one_line(tmp_path: Path) -> None:
    """A zero profile would make every step take 0 s and every TTFT 0: no run starts."""
    data = shipped()
    data["fit"]["coefficients"] = [0.0] * len(FEATURES)
    path = write(tmp_path, data)
    res = CliRunner().invoke(app, ["run", "--profile", str(path), "--num-requests", "5",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 1 and not (tmp_path / "run").exists()
    assert res.stderr.splitlines() == [f"error: {path}: malformed profile: fit.coefficients "
                                       "are all 0: every step would take 0 s; recalibrate"]


def test_a_step_that_costs_nothing_is_refused(tmp_path: Path) -> None:
    """Only the LM head priced: a prompt chunk that samples no token would take 0 s."""
    data = shipped()
    data["fit"]["coefficients"] = [1e-3 if f == "lm_head" else 0.0 for f in FEATURES]
    assert refused(tmp_path, data) == ("fit.coefficients price a one-token prefill step at "
                                       "0 s (step, tokens and seqs are all 0); recalibrate")


@pytest.mark.parametrize(("value", "shown"), [
    (-1e-3, "-0.001"), (float("inf"), "inf"), (float("nan"), "nan")])
def test_a_negative_or_non_finite_coefficient_is_refused(tmp_path: Path, value: float,
                                                         shown: str) -> None:
    data = shipped()
    data["fit"]["coefficients"][1] = value  # "tokens"
    assert refused(tmp_path, data) == ("fit.coefficients must be finite and >= 0 s per "
                                       f"unit: tokens {shown}")


def test_coefficients_of_the_wrong_shape_are_refused(tmp_path: Path) -> None:
    data = shipped()
    data["fit"]["coefficients"] = [0.1, "0.2"] + [0.0] * (len(FEATURES) - 2)
    assert refused(tmp_path, data).startswith(f"fit.coefficients must be {len(FEATURES)} "
                                              "numbers, one per feature (step, tokens, ")


def test_missing_fit_statistics_are_refused(tmp_path: Path) -> None:
    data = shipped()
    del data["fit"]["errors"]["decode"]
    assert refused(tmp_path, data) == "fit.errors lacks the held-out statistics of decode"
    data = shipped()
    data["fit"]["errors"]["mixed"]["mape"] = -0.5
    assert refused(tmp_path, data) == ("fit.errors.mixed.mape must be null or a finite number "
                                       ">= 0, got -0.5")
    data = shipped()
    data["fit"]["errors"]["prefill"]["num_heldout"] = 1.5
    assert refused(tmp_path, data) == ("fit.errors.prefill.num_heldout must be an integer "
                                       ">= 0, got 1.5")
    data = shipped()
    del data["fit"]["errors"]
    assert refused(tmp_path, data) == "missing key 'errors'"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("device", 3, "device must be a string, got 3"),
    ("dtype", "fp12", "dtype must be one of "),
    ("num_layers_measured", 2.5, "num_layers_measured must be an integer, got 2.5"),
    ("num_layers_measured", True, "num_layers_measured must be an integer, got True"),
    ("grid", [], "grid must be an object, got list"),
    ("points", [], "points must be a non-empty list (the measured steps the fit used)"),
])
def test_fields_of_the_wrong_type_are_refused(tmp_path: Path, field: str, value: Any,
                                              message: str) -> None:
    data = shipped()
    data[field] = value
    assert refused(tmp_path, data).startswith(message)


def test_an_impossible_model_is_refused(tmp_path: Path) -> None:
    data = shipped()
    data["model"]["num_kv_heads"] = 3  # 14 attention heads
    assert refused(tmp_path, data) == ("model: ModelSpec.num_kv_heads (3) must divide "
                                       "num_attention_heads (14)")


def test_a_point_with_an_infinite_time_is_refused(tmp_path: Path) -> None:
    data = shipped()
    data["points"][4]["seconds_max"] = float("inf")
    assert refused(tmp_path, data) == "seconds_max must be > 0 and finite, got inf (points[4])"
