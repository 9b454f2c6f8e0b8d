"""The Ray backend as users run it: a relative --trace resolved and read in the driver
(workers run elsewhere), servesim's packages shipped with every task, and a cluster that
cannot be joined named with what token authentication needs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from sim.app.runs.backends import PACKAGES, join_error, ray_runtime_env
from sim.app.runs.runner import RunConfig
from sim.app.runs.sweep import Grid, run_sweep

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="ray is not installed (pip install 'servesim[ray]')")


def test_a_failed_join_names_the_token_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    line = join_error("10.0.0.1:6379", ConnectionError("Failed to connect"))
    assert line.startswith("cannot join the Ray cluster at 10.0.0.1:6379: Failed to connect")
    assert "RAY_AUTH_MODE=token here too (now unset)" in line
    assert "RAY_AUTH_TOKEN" in line and "~/.ray/auth_token" in line


@needs_ray
def test_tasks_carry_servesim_packages() -> None:
    env = ray_runtime_env()
    assert [Path(m).name for m in env["py_modules"]] == list(PACKAGES)
    assert all((Path(m) / "__init__.py").is_file() for m in env["py_modules"])
    assert "__pycache__" in env["excludes"]


@needs_ray
@pytest.mark.slow
def test_relative_trace_on_ray_matches_local(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's workers keep the directory the instance started in; the driver then runs
    in another, where the relative trace is."""
    import ray

    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.csv").write_text(
        "arrival_time,num_prompt_tokens,output_len\n"
        + "".join(f"{i * 0.1:.1f},{32 + i % 7},{4 + i % 5}\n" for i in range(60)))
    base = RunConfig(trace="traces/t.csv", step_time=0.01)
    grid = Grid.parse({"max_num_seqs": "2,8"}, "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        monkeypatch.chdir(tmp_path)
        remote = run_sweep(base, grid, backend="ray")
        local = run_sweep(base, grid, workers=1)
    finally:
        ray.shutdown()
    assert (local["error"] == "").all()
    assert list(local["num_finished"]) == [60, 60]
    pd.testing.assert_frame_equal(local, remote)
