"""calibration.profile and calibration.cli: JSON round trip, clear load errors, the cost
model, refit through the CLI, and the shipped CPU profile."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from calibration.cli import register
from calibration.fit import PER_LAYER, fit_points
from calibration.profile import Profile, ProfileCostModel, load_profile, save_profile
from calibration.specs import get_model
from sim.batch import BatchShape
from tests.test_calibration_fit import FEATURES, feature_vector, make_points

SHIPPED = "cpu-qwen2.5-0.5b.json"


def make_profile(num_layers_measured: int = 24, noise: dict[str, float] | None = None,
                 force: bool = False) -> Profile:
    points = make_points(noise=noise)
    fit = fit_points(points, force=force)
    return Profile(
        model=dataclasses.asdict(get_model("qwen2.5-0.5b")), device="cpu",
        device_name="test cpu", torch_version="0", dtype="bf16",
        date="2025-01-01T00:00:00+00:00", num_layers_measured=num_layers_measured,
        grid={"max_num_seqs": 32, "max_num_batched_tokens": 512}, fit=fit,
        memory={"weight_bytes": 1, "kv_cache_bytes": 2, "peak_bytes": None, "note": "n"},
        points=tuple(points))


def make_app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def main() -> None:
        """Throwaway app: register() adds calibrate as a subcommand."""

    register(app)
    return app


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(make_app(), list(args))
    return result.exit_code, result.stdout, result.stderr


def test_profile_round_trips_through_json(tmp_path: Path) -> None:
    prof = make_profile()
    path = tmp_path / "p.json"
    save_profile(prof, path)
    loaded = load_profile(path)
    assert loaded.to_dict() == prof.to_dict()
    assert loaded.approximation is None
    data = json.loads(path.read_text())
    assert data["format"] == "servesim-profile" and data["version"] == 1
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    cm = ProfileCostModel(loaded)
    for p in loaded.points:
        assert cm.step_time(p.shape) == pytest.approx(loaded.fit.predict(p.shape), rel=1e-12)


def test_layer_subset_scales_per_layer_terms_only() -> None:
    prof = make_profile(num_layers_measured=6)
    assert prof.layer_scale == 4 and "6 of 24" in (prof.approximation or "")
    shape = BatchShape(100, 1, 50, 5000, 8, 800, 9)
    parts = [c * x for c, x in zip(prof.fit.coefficients, feature_vector(shape, 32), strict=True)]
    want = sum(4 * v if f in PER_LAYER else v for f, v in zip(FEATURES, parts, strict=True))
    assert ProfileCostModel(prof).step_time(shape) == pytest.approx(want, rel=1e-12)


BAD_FILES = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a servesim profile"),
    ('{"format": "vidur"}', "not a servesim profile"),
    ('{"format": "servesim-profile", "version": 2}', "version 2 is not supported"),
    ('{"format": "servesim-profile", "version": 1, "model": {}}', "lacks keys: device"),
]


@pytest.mark.parametrize(("text", "problem"), BAD_FILES)
def test_bad_profiles_give_one_clear_line(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_profile(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and problem in msg and "\n" not in msg
    code, out, err = invoke("calibrate", "--refit", str(path))
    assert code == 1 and "Traceback" not in out + err
    assert err.strip().splitlines() == [f"error: {msg}"]


def test_malformed_and_missing_profiles(tmp_path: Path) -> None:
    data = make_profile().to_dict()
    data["points"][0]["seconds"] = -1.0
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="malformed profile: seconds must be > 0"):
        load_profile(path)
    with pytest.raises(ValueError, match="cannot read profile"):
        load_profile(tmp_path / "absent.json")


def test_cli_refit_writes_profile_and_prints_table(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.json", tmp_path / "dst.json"
    save_profile(make_profile(), src)
    code, out, err = invoke("calibrate", "--refit", str(src), "--out", str(dst))
    assert code == 0, err
    assert "held-out" in out and "decode" in out
    assert load_profile(dst).fit.coefficients == load_profile(src).fit.coefficients


def test_cli_refit_on_the_median_runs(tmp_path: Path) -> None:
    # Median runs 1.1 x the fastest: a median refit prices every step 1.1 x the min fit,
    # and keeps its statistic on a later plain refit.
    prof = make_profile()
    points = tuple(dataclasses.replace(p, seconds_median=1.1 * p.seconds) for p in prof.points)
    src, med, again = tmp_path / "src.json", tmp_path / "med.json", tmp_path / "again.json"
    save_profile(dataclasses.replace(prof, points=points), src)
    code, _, err = invoke("calibrate", "--refit", str(src), "--fit-statistic", "median",
                          "--out", str(med))
    assert code == 0, err
    fitted = load_profile(med).fit
    assert fitted.statistic == "median"
    shape = BatchShape(64, 1, 2016, 0, 4, 400, 5)
    assert fitted.predict(shape) == pytest.approx(1.1 * prof.fit.predict(shape), rel=1e-6)
    assert invoke("calibrate", "--refit", str(med), "--out", str(again))[0] == 0
    assert load_profile(again).fit.statistic == "median"
    code, _, err = invoke("calibrate", "--refit", str(src), "--fit-statistic", "mean")
    assert code == 1 and "--fit-statistic must be min or median" in err


def test_cli_refuses_bad_fit_unless_forced(tmp_path: Path) -> None:
    src = tmp_path / "noisy.json"
    save_profile(make_profile(noise={"mixed": 0.5}, force=True), src)
    code, _, err = invoke("calibrate", "--refit", str(src), "--out", str(tmp_path / "x.json"))
    assert code == 1 and "fit refused" in err and "'mixed'" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists()
    code, _, _ = invoke("calibrate", "--refit", str(src), "--force")
    assert code == 0 and load_profile(src).fit.status == "forced"


def test_cli_unknown_model_is_one_line() -> None:
    code, _out, err = invoke("calibrate", "--model", "no-such-model")
    assert code == 1 and "unknown model" in err and len(err.strip().splitlines()) == 1


def test_rejected_fit_cannot_be_used_as_cost_model() -> None:
    prof = make_profile()
    bad = dataclasses.replace(prof, fit=dataclasses.replace(prof.fit, status="rejected"))
    with pytest.raises(ValueError, match="rejected"):
        ProfileCostModel(bad)


def test_shipped_cpu_profile_loads_and_is_monotone() -> None:
    ref = resources.files("calibration.profiles").joinpath(SHIPPED)
    with resources.as_file(ref) as path:
        assert path.stat().st_size < 1_000_000
        prof = load_profile(path)
    assert prof.fit.status == "accepted" and prof.model["name"] == "qwen2.5-0.5b"
    assert all(e.mape is not None and e.mape <= 0.10 for e in prof.fit.errors.values())
    cm = ProfileCostModel(prof)
    decode = [cm.step_time(BatchShape(0, 0, 0, 0, b, b * 513, b)) for b in (1, 4, 16, 32)]
    context = [cm.step_time(BatchShape(0, 0, 0, 0, 8, 8 * c, 8)) for c in (64, 512, 2048)]
    prefill = [cm.step_time(BatchShape(n, 1, 0, n * (n + 1) // 2, 0, 0, 1))
               for n in (16, 64, 256, 512)]
    for series in (decode, context, prefill):
        assert all(t > 0 for t in series)
        assert series == sorted(series)


def test_cost_model_and_cli_load_without_torch_or_scipy() -> None:
    code = ("import sys, calibration.profile, calibration.cli; "
            "bad = [m for m in ('torch', 'scipy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_cli_without_torch_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    code, _, err = invoke("calibrate", "--model", "qwen2.5-0.5b")
    assert code == 1
    assert err.strip().splitlines() == [
        "error: torch is not installed; install the calibration extra: "
        "pip install 'servesim[calibration]'"]


TINY_GRID = ("--num-layers", "1", "--max-num-seqs", "2", "--max-num-batched-tokens", "16",
             "--max-context", "32", "--repeats", "1", "--budget-s", "60")


@pytest.mark.parametrize(("args", "message"), [
    (["--out", ""], "error: --out: '' or '.' (the current directory) is a directory"),
    (["--out", "{t}"], "error: --out: {t} is a directory; give a profile file name"),
    (["--out", "{t}/nodir/p.json"], "error: --out: cannot write {t}/nodir/p.json: folder "
                                    "{t}/nodir does not exist"),
    (["--out", "{t}/afile/p.json"], "folder {t}/afile is not a directory"),
    (["--config", "/dev/null"], "error: --config /dev/null: not a JSON file"),
    (["--config", "{t}/nope.json"], "error: --config {t}/nope.json: cannot read it"),
    (["--config", "{t}/list.json"], "error: --config {t}/list.json: expected a Hugging Face "
                                    "config.json (a JSON object), got list"),
    (["--seed", "-1"], "error: seed must be an integer >= 0, got -1"),
    (["--threads", "100000"], "error: --threads must be between 0 (torch's default) and "),
    (["--threads", "-1"], "error: --threads must be between 0"),
])
def test_cli_checks_inputs_before_measuring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            args: list[str], message: str) -> None:
    def measure(*_a: object, **_k: object) -> None:
        raise AssertionError("measured before checking the options")

    monkeypatch.setattr("calibration.measure.measure", measure)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "list.json").write_text("[]")
    args = [a.format(t=tmp_path) for a in args]
    code, out, err = invoke("calibrate", *TINY_GRID, *args)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and message.format(t=tmp_path) in err, err


def test_cli_refuses_an_unwritable_out_folder(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    def writable(folder: Path) -> bool:
        try:
            with tempfile.TemporaryFile(dir=folder):
                return True
        except OSError:
            return False

    monkeypatch.setattr("calibration.measure.measure", lambda *a, **k: 1 / 0)
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    if writable(folder):  # root: try a read-only file system instead
        folder = Path("/sys")
        if not folder.is_dir() or writable(folder):
            pytest.skip("no unwritable folder here")
    code, _, err = invoke("calibrate", *TINY_GRID, "--out", str(folder / "p.json"))
    assert code == 1
    assert err.startswith(f"error: --out: cannot write {folder}/p.json: folder {folder} is "
                          "not writable")


def test_cli_refit_checks_out_first(tmp_path: Path) -> None:
    src = tmp_path / "p.json"
    save_profile(make_profile(), src)
    code, _, err = invoke("calibrate", "--refit", str(src), "--out", str(tmp_path))
    assert code == 1 and err.startswith(f"error: --out: {tmp_path} is a directory")
