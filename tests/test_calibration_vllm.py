"""calibrate --engine vllm without vLLM: the driver's step planning (by hand), its protocol
through a real child process running the fake engine (calibration/vllm_fake.py: vLLM's
scheduling rule, known linear costs), the fit of what it yields, and every way the child
can fail (one line, exit 1). The real engine: tests/test_calibration_vllm_real.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from calibration.fit import FEATURES, fit_points
from calibration.grid import REGIONS, GridConfig, GridPoint, make_grid
from calibration.hf_config import spec_from_hf_config
from calibration.profile import Profile, load_profile, profile_from_measurement
from calibration.specs import ModelSpec
from calibration.vllm_driver import PlanError, plan_fill
from calibration.vllm_measure import (
    DriverError,
    VllmSettings,
    measure_vllm,
    points_from_steps,
    read_lines,
)
from tests.test_calibration_profile import invoke

COSTS = {"step": 0.01, "tokens": 1e-3, "prefill_attention_pairs": 1e-8,
         "prefill_context_tokens": 2e-6, "decode_context_tokens": 1e-6, "seqs": 1e-4,
         "sampled_seqs": 2e-3, "lm_head": 3e-3}
"""The fake engine's known costs (seconds per unit of each calibration.fit feature)."""
GRID = GridConfig(max_num_seqs=8, max_num_batched_tokens=64, max_context=256, repeats=2)
CONFIG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
          "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
          "num_key_value_heads": 1, "intermediate_size": 256, "vocab_size": 1000,
          "max_position_embeddings": 1024, "tie_word_embeddings": True}


def tiny_spec() -> ModelSpec:
    return ModelSpec(name="qwen2-tiny", hf_id="test/tiny", num_layers=2, hidden_size=128,
                     num_attention_heads=2, num_kv_heads=1, head_dim=64,
                     intermediate_size=256, vocab_size=1000, max_position_embeddings=1024,
                     tie_word_embeddings=True, attention_bias=True)


def fake_settings(**overrides: Any) -> VllmSettings:
    return dataclasses.replace(VllmSettings(fake=COSTS), **overrides)


# -- planning ---------------------------------------------------------------------------
def test_plan_fill_by_hand() -> None:
    # 32 requests to context 32 in 512-token steps: 16 of 31 tokens fill step 0 with 16
    # tokens of the 17th; step 1 holds their 16 decodes, that request's other 16 tokens
    # and 15 more of 32. All 32 then have 32 tokens computed.
    assert plan_fill(32, 512, [0] * 32, 16) == ([31] * 16 + [32] * 16, [512, 512])
    # 3 to context 10 in 8-token steps: prompts 7 (+3 decodes), 8 (+2), 10; step budgets
    # 8 | 1 + 7 | 6 + 2 decodes | 4 + 2 decodes
    assert plan_fill(10, 8, [0, 0, 0], 16) == ([7, 8, 10], [8, 8, 8, 6])
    # 96 tokens of the prompt cached: vLLM computes only the last 4
    assert plan_fill(100, 64, [96], 16) == ([100], [4])
    # a full hit still computes the last block's tokens (vLLM keeps one token to compute)
    assert plan_fill(96, 64, [96], 16) == ([96], [16])
    assert plan_fill(5, 64, [], 16) == ([], [])
    with pytest.raises(PlanError, match="cannot fill 8 decodes"):
        plan_fill(5, 8, [0] * 8, 16)


def test_driver_steers_the_fake_engine_to_every_grid_point() -> None:
    m = measure_vllm(tiny_spec(), GRID, fake_settings(), timer="thread", progress=False)
    planned = make_grid(GRID)
    assert m.num_planned == len(planned) == len(m.points)
    assert m.engine["name"] == "fake" and m.engine["skipped"] == []
    for got, want in zip(m.points, planned, strict=True):
        assert got.point == want and got.repeats == GRID.repeats
        assert got.seconds == pytest.approx(_cost(got.point), rel=1e-12)


def _cost(p: GridPoint) -> float:
    s = p.shape
    x = {"step": 1, "tokens": s.num_tokens, "seqs": s.num_seqs,
         "sampled_seqs": s.num_sampled_seqs, "lm_head": 1 if s.num_sampled_seqs else 0,
         "prefill_attention_pairs": s.prefill_attention_pairs,
         "prefill_context_tokens": s.prefill_context_tokens,
         "decode_context_tokens": s.decode_context_tokens}
    return sum(c * x[k] for k, c in COSTS.items())


def test_fit_of_the_fake_engine_recovers_its_costs() -> None:
    grid = GridConfig(max_num_seqs=8, max_num_batched_tokens=128, max_context=512, repeats=1)
    m = measure_vllm(tiny_spec(), grid, fake_settings(), progress=False)
    fit = fit_points(m.points)
    assert fit.status == "accepted"
    assert all(e.mape is not None and e.mape < 1e-9 for e in fit.errors.values())
    want = {**COSTS, "tokens_over_knot": 0.0}
    for name, got in zip(FEATURES, fit.coefficients, strict=True):
        assert got == pytest.approx(want[name], rel=1e-6, abs=1e-12), name
    prof = profile_from_measurement(tiny_spec(), m, fit)
    assert prof.engine["name"] == "fake" and prof.engine["timer"] == "thread"
    assert {row["region"] for row in prof.engine["phases"]} == set(REGIONS)


def test_budget_stops_the_driver_and_keeps_what_it_measured() -> None:
    m = measure_vllm(tiny_spec(), GRID, fake_settings(), budget_s=1e-9, progress=False)
    assert m.points == () and m.engine["stopped_by_budget"] is True


# -- the CLI ----------------------------------------------------------------------------
@pytest.fixture
def fake_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """`calibrate --engine vllm` with the driver's fake engine; the config file."""
    import calibration.vllm_measure as vm

    real = vm.measure_vllm
    monkeypatch.setattr(vm, "measure_vllm", lambda spec, grid, settings, **kw: real(
        spec, grid, dataclasses.replace(settings, fake=COSTS), **{**kw, "progress": False}))
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(CONFIG))
    return config


SMALL = ("--max-num-seqs", "8", "--max-num-batched-tokens", "64", "--max-context", "256",
         "--repeats", "1")


def test_cli_vllm_engine_writes_a_profile_naming_it(fake_cli: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    code, stdout, err = invoke("calibrate", "--engine", "vllm", "--config", str(fake_cli),
                               *SMALL, "--out", str(out))
    assert code == 0, err
    assert "held-out" in stdout and "(thread clock)" in stdout
    prof = load_profile(out)
    assert prof.engine["name"] == "fake" and prof.model["name"] == "tiny"
    assert prof.fit.status == "accepted" and len(prof.points) == prof.grid["num_planned"]


def test_cli_default_out_names_the_engine(fake_cli: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("calibrate", "--engine", "vllm", "--config", str(fake_cli), *SMALL)
    assert code == 0, err
    assert (tmp_path / "cpu-vllm-tiny.json").exists()


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(("body", "message"), [
    ("echo hello", "line 1 of its output is not a protocol record: 'hello' (is --python a "
                   "Python interpreter?)"),
    ("cat >/dev/null; echo 'oops' >&2; exit 3", "exited with code 3: oops"),
    ("""cat >/dev/null; echo '{"kind": "error", "message": "no GPU"}'; exit 1""", "no GPU"),
    ("""cat >/dev/null; echo '{"kind": "start"}'""", "its output lacks the start or end record"),
])
def test_a_failing_child_is_one_line(tmp_path: Path, body: str, message: str) -> None:
    python = _script(tmp_path, body)
    code, out, err = invoke("calibrate", "--engine", "vllm", "--python", python, *SMALL,
                            "--out", str(tmp_path / "p.json"))
    assert code == 1 and "Traceback" not in out + err
    assert err.strip().splitlines() == [f"error: vLLM driver ({python}): {message}"]
    assert not (tmp_path / "p.json").exists()


def test_missing_python_is_one_line(tmp_path: Path) -> None:
    code, _, err = invoke("calibrate", "--engine", "vllm", "--python", str(tmp_path / "nope"),
                          *SMALL, "--out", str(tmp_path / "p.json"))
    assert code == 1
    assert err.strip().splitlines() == [
        f"error: cannot run --python {tmp_path / 'nope'}: No such file or directory"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                    reason="vLLM is installed in this Python")
def test_python_without_vllm_is_one_line(tmp_path: Path) -> None:
    code, _, err = invoke("calibrate", "--engine", "vllm", *SMALL,
                          "--out", str(tmp_path / "p.json"))
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: vLLM driver ({sys.executable}): cannot import vllm in this Python (No "
        "module named 'vllm')"), lines


@pytest.mark.parametrize(("args", "message"), [
    (["--python", "x"], "error: --python: only with --engine vllm"),
    (["--block-size", "16"], "error: --block-size: only with --engine vllm"),
    (["--no-enforce-eager"], "error: --enforce-eager: only with --engine vllm"),
    (["--engine", "sglang"], "error: --engine must be one of torch, vllm, got 'sglang'"),
    (["--timer", "cpu"], "error: timer must be one of auto, thread, wall, got 'cpu'"),
    (["--timer", "thread", "--threads", "0"], "error: timer 'thread' needs device cpu and "
                                              "threads 1"),
    (["--engine", "vllm", "--model", "mistral-7b", "--dtype", "int4"],
     "error: dtype must be one of ['bf16', 'fp16', 'fp32'], got 'int4'"),
])
def test_cli_checks_engine_options(tmp_path: Path, args: list[str], message: str) -> None:
    code, _, err = invoke("calibrate", *SMALL, *args, "--out", str(tmp_path / "p.json"))
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith(message), err


# -- reading the protocol ---------------------------------------------------------------
def _step(p: GridPoint, seconds: float, **changes: Any) -> dict[str, Any]:
    shape = dataclasses.asdict(p.shape)
    return {"kind": "step", "region": p.region, "index": p.index, "repeat": 1,
            "warmup": False, "decode_context": p.decode_context, "shape": shape,
            "seconds": seconds, "phases": {}, **changes}


def test_points_keep_the_fastest_repeat_and_its_shape() -> None:
    p = GridPoint("decode", 3, decode_seqs=4, decode_context=100)
    later = dataclasses.replace(p, decode_context=101)
    steps = [_step(p, 0.5, warmup=True, repeat=0), _step(p, 0.3),
             _step(later, 0.2, repeat=2), _step(p, 0.4, repeat=3)]
    (got,) = points_from_steps(steps, [p, GridPoint("decode", 4, 1, 5)])
    assert got.point == later and got.seconds == 0.2
    assert (got.seconds_median, got.seconds_max, got.repeats) == (0.3, 0.4, 3)


def test_protocol_errors_name_what_is_wrong() -> None:
    p = GridPoint("prefill", 0, chunk_tokens=16)
    bad = _step(p, 0.1)
    bad["shape"]["num_prefill_tokens"] = 15
    with pytest.raises(DriverError, match="not the point's"):
        points_from_steps([bad], [p])
    with pytest.raises(DriverError, match="not in the grid"):
        points_from_steps([_step(p, 0.1, index=7)], [p])
    with pytest.raises(DriverError, match=r"a step of 0\.0 s"):
        points_from_steps([_step(p, 0.0)], [p])
    with pytest.raises(DriverError, match="line 2 of its output"):
        list(read_lines(['{"kind": "start"}\n', '{"kind": "weird"}\n']))


def test_profiles_without_an_engine_record_were_torch_on_the_wall_clock(
        tmp_path: Path) -> None:
    from tests.test_calibration_profile import make_profile

    data = make_profile().to_dict()
    del data["engine"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert load_profile(path).engine == {"name": "torch", "timer": "wall"}
    assert isinstance(load_profile(path), Profile)


def test_preset_config_round_trips_through_hf_config(tmp_path: Path) -> None:
    from calibration.specs import get_model
    from calibration.vllm_measure import hf_config

    spec = get_model("qwen2.5-0.5b")
    config = hf_config(spec)
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    (tmp_path / "qwen2.5-0.5b").mkdir()
    (tmp_path / "qwen2.5-0.5b" / "config.json").write_text(json.dumps(config))
    back = spec_from_hf_config(tmp_path / "qwen2.5-0.5b")
    same = ("name", "hf_id", "source")
    assert dataclasses.replace(back, **{k: getattr(spec, k) for k in same}) == spec
    with pytest.raises(ValueError, match=r"give its config\.json with --config"):
        hf_config(dataclasses.replace(spec, name="gpt-oss"))


class _Flaky:
    """A Run stand-in whose engine parts from the plan ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures, self.forgotten = failures, 0

    def point(self, p: dict[str, Any], r: int) -> dict[str, Any]:
        from calibration.vllm_driver import Mismatch

        if self.failures:
            self.failures -= 1
            raise Mismatch("fill step 0: vLLM scheduled 40 tokens, the plan 64")
        return {"kind": "step", "index": p["index"]}

    def forget(self, p: dict[str, Any]) -> None:
        self.forgotten += 1


def test_a_point_the_engine_parts_from_is_tried_once_more_then_skipped() -> None:
    from calibration.vllm_driver import _attempt

    p = {"region": "decode", "index": 5, "decode_seqs": 2}
    once = _Flaky(1)
    assert _attempt(once, p, 3) == {"kind": "step", "index": 5}
    assert once.forgotten == 1
    assert _attempt(_Flaky(2), p, 3) == {
        "kind": "skip", "index": 5, "region": "decode", "repeat": 3,
        "reason": "fill step 0: vLLM scheduled 40 tokens, the plan 64"}


def test_shipped_vllm_profile_is_vllms_own_and_monotone() -> None:
    from importlib import resources

    from calibration.profile import ProfileCostModel
    from sim.batch import BatchShape

    ref = resources.files("calibration.profiles").joinpath("cpu-vllm-qwen2.5-0.5b-8l.json")
    with resources.as_file(ref) as path:
        prof = load_profile(path)
    e = prof.engine
    assert (e["name"], e["vllm_version"], e["timer"], e["skipped"]) == (
        "vllm", "0.32.0", "thread", [])
    assert e["kv_cache_tokens"] == e["num_gpu_blocks"] * e["block_size"]
    assert prof.num_layers_measured == prof.num_layers_model == 8
    assert prof.fit.status == "accepted"
    assert all(x.mape is not None and x.mape <= 0.10 for x in prof.fit.errors.values())
    cm = ProfileCostModel(prof)
    decode = [cm.step_time(BatchShape(0, 0, 0, 0, b, b * 513, b)) for b in (1, 4, 16, 32)]
    prefill = [cm.step_time(BatchShape(n, 1, 0, n * (n + 1) // 2, 0, 0, 1))
               for n in (16, 64, 256, 512)]
    for series in (decode, prefill):
        assert all(t > 0 for t in series) and series == sorted(series)
