"""calibrate --engine vllm on a real vLLM V1 engine: marked ``vllm``, so outside the default
run (``pytest -m vllm`` runs it). The Python that has vLLM is $SERVESIM_VLLM_PYTHON (default:
this one); the test is skipped, saying why, where that Python cannot import vllm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calibration.grid import REGIONS, GridConfig
from calibration.hf_config import spec_from_hf_config
from calibration.specs import ModelSpec
from calibration.vllm_measure import VllmSettings, measure_vllm
from tests.test_calibration_vllm import CONFIG

PYTHON = os.environ.get("SERVESIM_VLLM_PYTHON", sys.executable)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def vllm_python() -> str:
    """PYTHON, or a skip naming it and the import error."""
    try:
        done = subprocess.run([PYTHON, "-c", "import vllm"], capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot run {PYTHON} ({exc}); set SERVESIM_VLLM_PYTHON")
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"vllm is not importable in {PYTHON} ({last}); set SERVESIM_VLLM_PYTHON")
    return PYTHON


def tiny_config(tmp_path: Path) -> tuple[Path, ModelSpec]:
    """The tiny qwen2 config.json written under tmp_path, and its spec."""
    config = tmp_path / "qwen2-tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(CONFIG))
    return config, spec_from_hf_config(config)


def test_real_engine_measures_every_point_and_reports_its_facts(vllm_python: str,
                                                                tmp_path: Path) -> None:
    config, spec = tiny_config(tmp_path)
    grid = GridConfig(max_num_seqs=4, max_num_batched_tokens=64, max_context=256, repeats=1)
    m = measure_vllm(spec, grid, VllmSettings(python=vllm_python, config=config),
                     dtype="fp32", progress=False, budget_s=600)
    e = m.engine
    assert e["name"] == "vllm" and e["vllm_version"] and e["skipped"] == []
    assert len(m.points) == m.num_planned
    assert e["timer"] == "thread" and e["torch_threads"] == 1
    assert e["enforce_eager"] is True and e["async_scheduling"] is False
    assert e["kv_cache_tokens"] == e["num_gpu_blocks"] * e["block_size"] > 0
    assert e["num_layers"] == m.num_layers == 2
    assert {row["region"] for row in e["phases"]} == set(REGIONS)
    for row in e["phases"]:  # the phases happen inside the step
        inside = row["schedule"] + row["execute_model"] + row["update_from_output"]
        assert 0 < inside <= row["seconds"] and row["model_forward"] < row["execute_model"]


def test_real_engine_replays_a_workload_as_servesim_decides(vllm_python: str,
                                                           tmp_path: Path) -> None:
    # validate --engine vllm on the tiny model: a profile measured on the engine, then 16
    # Poisson requests served by vLLM's own scheduler. On vLLM's own step times servesim
    # must schedule every step alike (the conformance suite's rules, checked live), and
    # both refuse the same prompts (max_model_len 128: vLLM refuses a prompt >= 128).
    from calibration.fit import fit_points
    from calibration.profile import profile_from_measurement, save_profile
    from sim.app.runs.validate import validation_config
    from sim.app.runs.validate_vllm import prepare_vllm_validation, run_vllm_validation
    from sim.app.runs.vllm_comparison import vllm_validation_dict

    config, spec = tiny_config(tmp_path)
    grid = GridConfig(max_num_seqs=8, max_num_batched_tokens=128, max_context=512, repeats=1)
    m = measure_vllm(spec, grid, VllmSettings(python=vllm_python, config=config),
                     dtype="fp32", progress=False, budget_s=600)
    # The check is of decisions, not step prices: a tiny model's one-round fit is kept
    # whatever its held-out error.
    fit = fit_points(m.points, force=True)
    save_profile(profile_from_measurement(spec, m, fit), tmp_path / "p.json")
    cfg = validation_config(str(tmp_path / "p.json"), scenario="cpu-chat", rate=4.0,
                            num_requests=16, max_model_len=128)
    prep, setup = prepare_vllm_validation(cfg, vllm_python)
    d = vllm_validation_dict(prep, run_vllm_validation(prep, setup))
    assert d["real"]["engine"] == "vllm" and d["real"]["vllm_version"]
    a = d["agreement"]
    assert a["first_different_step"] is None and a["requests_scheduled_alike"] == 16
    assert len(d["rejected"]) == d["simulation_rejected"] > 0
    assert d["measured"]["num_finished"] == 16 - len(d["rejected"])
