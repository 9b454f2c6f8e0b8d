"""The diurnal arrival process (scenarios/diurnal.py): its rate profile against the
integral of the rate, determinism for a seed, and the option's checks."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from scenarios.arrivals import generate
from scenarios.build import build_workload
from scenarios.diurnal import DAY_S, diurnal, diurnal_rate, partial_day_note
from sim.app.cli.main import app


def _expected(rate: float, a: float, t0: float, t1: float) -> float:
    """Arrivals expected in [t0, t1): the integral of rate * (1 - a cos(2 pi t / day))."""
    w = 2 * math.pi / DAY_S
    return rate * ((t1 - t0) - a / w * (math.sin(w * t1) - math.sin(w * t0)))


def test_quarter_days_hold_the_integral_of_the_rate() -> None:
    rate, a = 1.0, 0.5
    t = diurnal(rate, a, 2 * 86_400 + 5_000, np.random.default_rng(0))
    assert np.all(np.diff(t) >= 0) and t[0] > 0
    quarter = DAY_S / 4
    for q in range(8):  # two days: 14,725 arrivals expected at night, 28,475 by day
        n = int(((t >= q * quarter) & (t < (q + 1) * quarter)).sum())
        mean = _expected(rate, a, q * quarter, (q + 1) * quarter)
        assert abs(n - mean) < 4 * math.sqrt(mean), (q, n, mean)  # Poisson: sd sqrt(mean)
    assert diurnal_rate(np.array([0.0, DAY_S / 2]), 2.0, 0.25).tolist() == [1.5, 2.5]


def test_amplitude_zero_is_a_poisson_process_at_the_rate() -> None:
    gaps = np.diff(diurnal(4.0, 0.0, 20_000, np.random.default_rng(1)))
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)  # 5 SE: 1 / sqrt(20,000) = 0.7%
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)


def test_one_seed_one_sequence() -> None:
    a = generate("diurnal", 0.5, 1000, np.random.default_rng(7), amplitude=0.8)
    b = generate("diurnal", 0.5, 1000, np.random.default_rng(7), amplitude=0.8)
    assert np.array_equal(a, b) and len(a) == 1000
    assert len(diurnal(1.0, 0.5, 0, np.random.default_rng(0))) == 0


def test_scenario_retimed_by_the_diurnal_process() -> None:
    w = build_workload(trace=None, trace_format=None, scenario=None, arrival="diurnal",
                       rate=2.0, burstiness=None, num_requests=500, window_s=None,
                       time_scale=None, max_tokens=None, seed=0, diurnal_amplitude=0.9)
    assert len(w) == 500 and "diurnal(rate=2, amplitude=0.9, period 24 h)" in w.source
    with pytest.raises(ValueError, match="diurnal_amplitude must be a fraction in"):
        diurnal(1.0, 1.5, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="finite number > 0"):
        diurnal(math.inf, 0.5, 10, np.random.default_rng(0))


@pytest.mark.parametrize(("args", "needle"), [
    (["--arrival", "diurnal", "--rate", "1", "--diurnal-amplitude", "2"],
     "diurnal_amplitude must be a fraction in [0, 1]"),
    (["--rate", "1", "--diurnal-amplitude", "0.3"], "applies to --arrival diurnal only"),
])
def test_bad_amplitude_fails_in_one_line(tmp_path: Path, args: list[str],
                                         needle: str) -> None:
    res = CliRunner().invoke(app, ["run", "--num-requests", "20", "--step-time", "0.01",
                                   *args, "--out", str(tmp_path / "r")])
    assert res.exit_code == 1 and needle in res.output, res.output


def test_run_records_the_amplitude(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", "--num-requests", "50", "--step-time", "0.01",
                                   "--arrival", "diurnal", "--rate", "1",
                                   "--diurnal-amplitude", "0.3", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "config.json").read_text()
    assert '"diurnal_amplitude": 0.3' in text and "amplitude=0.3" in text


def test_a_run_shorter_than_a_day_says_its_realised_rate(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", "--num-requests", "300", "--step-time", "0.01",
                                   "--arrival", "diurnal", "--rate", "5",
                                   "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    # 300 arrivals near the trough: about 5 * 0.5 = 2.5 req/s, not 5
    realised = float(res.stdout.replace("\n", "").split("realised ")[1].split(" req/s")[0])
    assert 2.0 < realised < 3.0
    warning = [line for line in res.stderr.splitlines() if "arrival diurnal" in line]
    assert len(warning) == 1 and "less than one 24 h period" in warning[0]
    assert "differs from --rate 5" in warning[0]
    assert partial_day_note(np.array([1.0, DAY_S]), 1.0) is None  # a whole day: silent
