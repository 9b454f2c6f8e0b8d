"""Workload validation and transformations, presets, and build_workload's rules."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scenarios.build import build_workload
from scenarios.presets import get_scenario, list_scenarios
from scenarios.traces import load_trace
from scenarios.workload import Workload

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
CONV = TRACES / "AzureLLMInferenceTrace_conv.csv"


def make_workload(n: int = 5) -> Workload:
    return Workload.from_arrays(
        np.arange(n, dtype=np.float64) * 0.5 + 1.0, np.arange(1, n + 1) * 10, np.arange(1, n + 1)
    )


def build(**overrides: Any) -> Workload:
    args: dict[str, Any] = dict(
        trace=None, trace_format=None, scenario=None, arrival=None, rate=None,
        burstiness=None, num_requests=None, window_s=None, time_scale=None,
        max_tokens=None, seed=0,
    )
    args.update(overrides)
    return build_workload(**args)


# --- Workload -------------------------------------------------------------------------


def test_defaults_and_read_only_columns() -> None:
    workload = make_workload(3)
    assert len(workload) == 3
    assert workload.request_id == ("0", "1", "2")
    np.testing.assert_array_equal(workload.max_tokens, workload.output_len)
    np.testing.assert_array_equal(workload.priority, [0, 0, 0])
    assert workload.num_prompt_tokens.dtype == np.int64
    with pytest.raises(ValueError):
        workload.arrival_time[0] = 5.0


def test_from_arrays_sorts_stably_and_keeps_row_ids() -> None:
    workload = Workload.from_arrays([2.0, 1.0, 1.0], [5, 6, 7], [1, 2, 3])
    np.testing.assert_array_equal(workload.arrival_time, [1.0, 1.0, 2.0])
    assert workload.request_id == ("1", "2", "0")
    np.testing.assert_array_equal(workload.num_prompt_tokens, [6, 7, 5])


@pytest.mark.parametrize("field", ["num_prompt_tokens", "output_len", "max_tokens"])
@pytest.mark.parametrize("bad", [0, -2])
def test_nonpositive_token_counts_name_field_and_request(field: str, bad: int) -> None:
    columns: dict[str, Any] = {"num_prompt_tokens": [5, 5, 5], "output_len": [2, 2, 2],
                               "max_tokens": [2, 2, 2]}
    columns[field] = [5, bad, 5]
    with pytest.raises(ValueError, match=rf"{field}\[1\] \(request_id '1'\) = {bad} must be >= 1"):
        Workload.from_arrays([0.0, 1.0, 2.0], columns["num_prompt_tokens"],
                             columns["output_len"], max_tokens=columns["max_tokens"])


def test_other_validation_errors() -> None:
    with pytest.raises(ValueError, match="output_len has 1 entries"):
        Workload.from_arrays([0.0, 1.0], [5, 5], [2])
    with pytest.raises(ValueError, match="arrival_time"):
        Workload.from_arrays([0.0, math.nan], [5, 5], [2, 2])
    with pytest.raises(ValueError, match="non-decreasing"):
        Workload(np.array([1.0, 0.0]), np.array([1, 1]), np.array([1, 1]), np.array([1, 1]),
                 np.array([0, 0]), ("a", "b"))
    with pytest.raises(ValueError, match="unique"):
        Workload.from_arrays([0.0, 1.0], [5, 5], [2, 2], request_id=["a", "a"])
    with pytest.raises(ValueError, match="not an integer"):
        Workload.from_arrays([0.0], [5.5], [2])


def test_with_max_tokens() -> None:
    workload = make_workload()
    assert workload.with_max_tokens(None) is workload
    capped = workload.with_max_tokens(3)
    np.testing.assert_array_equal(capped.max_tokens, [3] * 5)
    np.testing.assert_array_equal(capped.output_len, workload.output_len)
    with pytest.raises(ValueError, match="max_tokens"):
        workload.with_max_tokens(0)


def test_retimed_keeps_lengths_in_order() -> None:
    workload = make_workload(3)
    retimed = workload.retimed(np.array([0.0, 0.0, 9.0]))
    np.testing.assert_array_equal(retimed.arrival_time, [0.0, 0.0, 9.0])
    np.testing.assert_array_equal(retimed.num_prompt_tokens, workload.num_prompt_tokens)
    assert retimed.request_id == workload.request_id
    with pytest.raises(ValueError, match="shape"):
        workload.retimed(np.array([0.0]))


def test_time_scaled_is_a_speedup() -> None:
    workload = make_workload(3)  # arrivals 1.0, 1.5, 2.0
    np.testing.assert_allclose(workload.time_scaled(2.0).arrival_time, [0.5, 0.75, 1.0])
    np.testing.assert_allclose(workload.time_scaled(0.5).arrival_time, [2.0, 3.0, 4.0])
    assert np.all(workload.time_scaled(math.inf).arrival_time == 0.0)
    with pytest.raises(ValueError, match="time_scale"):
        workload.time_scaled(0.0)


def test_time_scale_that_overflows_the_clock_is_refused_without_a_warning() -> None:
    # 2.0 / 1e-320 overflows float64 (max about 1.8e308): refused by name, and numpy's
    # overflow warning is not printed beside the error line.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="time_scale"):
            make_workload(3).time_scaled(1e-320)


def test_cut_by_count_and_window() -> None:
    workload = make_workload(5)  # arrivals 1.0, 1.5, 2.0, 2.5, 3.0
    assert len(workload.cut(num_requests=2)) == 2
    assert len(workload.cut(window_s=1.0)) == 2  # [1.0, 2.0): half-open
    assert len(workload.cut(num_requests=4, window_s=10.0)) == 4
    assert workload.cut(num_requests=100) is workload
    assert workload.cut(num_requests=3).request_id == ("0", "1", "2")
    with pytest.raises(ValueError, match="num_requests"):
        workload.cut(num_requests=0)
    with pytest.raises(ValueError, match="window_s"):
        workload.cut(window_s=0.0)


# --- presets --------------------------------------------------------------------------


def test_presets_listed_and_unknown_lists_known() -> None:
    names = list_scenarios()
    assert "default" in names and "teaching" in names
    with pytest.raises(ValueError, match="default") as excinfo:
        get_scenario("nope")
    assert "teaching" in str(excinfo.value)


def test_teaching_scenario() -> None:
    workload = build(scenario="teaching")
    assert len(workload) == 6
    np.testing.assert_array_equal(workload.arrival_time, [0.0] * 6)
    np.testing.assert_array_equal(workload.output_len, [8, 2, 3, 4, 4, 6])
    np.testing.assert_array_equal(workload.num_prompt_tokens, [4] * 6)


def test_default_scenario_statistics() -> None:
    spec = get_scenario("default")
    assert (spec.arrival, spec.rate, spec.num_requests) == ("poisson", 5.0, 1000)
    workload = build(num_requests=20_000)
    assert np.median(workload.num_prompt_tokens) == pytest.approx(1020, rel=0.03)
    assert workload.num_prompt_tokens.mean() == pytest.approx(1154.7, rel=0.03)
    assert np.median(workload.output_len) == pytest.approx(129, rel=0.03)
    # the clip at 1000 tokens pulls the mean from the fitted 211.1 to about 200.6
    assert workload.output_len.mean() == pytest.approx(200.6, rel=0.03)
    assert workload.output_len.max() <= 1000
    gaps = np.diff(workload.arrival_time, prepend=0.0)
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)


# --- build_workload -------------------------------------------------------------------


def test_same_seed_same_workload_different_seed_differs() -> None:
    assert build(seed=7) == build(seed=7)
    assert build(seed=7) != build(seed=8)


@pytest.mark.parametrize(
    "overrides",
    [dict(arrival="gamma", burstiness=0.25), dict(arrival="constant"), dict(rate=50.0),
     dict(arrival="bursts", rate=2.0), dict(burstiness=4.0)],
)
def test_arrival_process_does_not_change_lengths(overrides: dict[str, Any]) -> None:
    base = build(seed=3, num_requests=200)
    other = build(seed=3, num_requests=200, **overrides)
    np.testing.assert_array_equal(other.num_prompt_tokens, base.num_prompt_tokens)
    np.testing.assert_array_equal(other.output_len, base.output_len)
    assert not np.array_equal(other.arrival_time, base.arrival_time)


def test_scenario_overrides_and_cap() -> None:
    workload = build(arrival="constant", rate=4.0, num_requests=8, window_s=1.0,
                     max_tokens=16)
    # constant 4 req/s: 0.25, 0.5, 0.75, 1.0 ...; window [0.25, 1.25) keeps 4
    np.testing.assert_allclose(workload.arrival_time, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_array_equal(workload.max_tokens, [16] * 4)
    # A speed-up on top of a rate would multiply it (4 req/s x2 = 8): refused.
    with pytest.raises(ValueError, match="time_scale 2 speeds up the arrivals as given"):
        build(arrival="constant", rate=4.0, num_requests=8, time_scale=2.0)


def test_build_errors() -> None:
    with pytest.raises(ValueError, match="burstiness"):
        build(arrival="poisson", burstiness=2.0)
    with pytest.raises(ValueError, match="burstiness"):
        build(burstiness=0.0)
    with pytest.raises(ValueError, match="scenario must be one of"):
        build(scenario="nope")
    with pytest.raises(ValueError, match="trace_format"):
        build(trace_format="azure")
    with pytest.raises(ValueError, match="seed"):
        build(seed=-1)
    with pytest.raises(ValueError, match="num_requests"):
        build(num_requests=0)
    with pytest.raises(FileNotFoundError, match=r"missing\.csv"):
        build(trace=Path("missing.csv"))


def shared_conv() -> Path:
    if not CONV.exists():
        pytest.skip(f"shared trace {CONV} not present (expected in ../shared/traces)")
    return CONV


def test_trace_replays_its_own_arrivals_cut_first() -> None:
    workload = build(trace=shared_conv(), num_requests=100)
    assert len(workload) == 100
    assert workload.arrival_time[1] == pytest.approx(4.314579)
    assert (workload.num_prompt_tokens[0], workload.output_len[0]) == (374, 44)
    # A rate alone re-times the trace by Poisson arrivals (vllm bench serve's
    # --request-rate), keeping its lengths in order.
    retimed = build(trace=shared_conv(), num_requests=100, rate=3.0)
    assert "re-timed poisson(3)" in retimed.source
    assert (retimed.num_prompt_tokens[0], retimed.output_len[0]) == (374, 44)
    with pytest.raises(ValueError, match="not both"):
        build(trace=shared_conv(), scenario="default")


def test_trace_retimed_keeps_first_n_lengths_in_order() -> None:
    trace = build(trace=shared_conv(), num_requests=500)
    retimed = build(trace=shared_conv(), num_requests=500, arrival="gamma", rate=20.0,
                    burstiness=0.5, seed=1)
    np.testing.assert_array_equal(retimed.num_prompt_tokens, trace.num_prompt_tokens)
    np.testing.assert_array_equal(retimed.output_len, trace.output_len)
    assert np.diff(retimed.arrival_time, prepend=0.0).mean() == pytest.approx(0.05, rel=0.15)


def test_trace_window_then_time_scale() -> None:
    full = load_trace(shared_conv())
    windowed = build(trace=shared_conv(), window_s=60.0, time_scale=2.0)
    assert len(windowed) == int(np.sum(full.arrival_time < 60.0))
    assert windowed.arrival_time[-1] < 30.0
    np.testing.assert_allclose(windowed.arrival_time, full.arrival_time[: len(windowed)] / 2)
