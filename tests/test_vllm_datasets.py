"""vLLM's synthetic datasets as scenarios (scenarios/vllm_datasets.py): names, parameters,
lengths and arrivals checked by hand against vLLM's rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from scenarios.build import build_workload
from scenarios.prefixes import SYSTEM_PROMPT_ID
from scenarios.presets import get_scenario, list_scenarios
from scenarios.vllm_datasets import RandomLengths, split_name
from sim.app.cli.main import app


def build(scenario: str, num_requests: int | None = None, rate: float | None = None):
    return build_workload(trace=None, trace_format=None, scenario=scenario, arrival=None,
                          rate=rate, burstiness=None, num_requests=num_requests,
                          window_s=None, time_scale=None, max_tokens=None, seed=0)


def test_names_listed_with_vllm_defaults() -> None:
    assert {"random", "prefix_repetition"} <= set(list_scenarios())
    assert split_name("random") == ("random", {"input_len": 1024, "output_len": 128,
                                               "range_ratio": 0.0, "prefix_len": 0})
    assert split_name("prefix_repetition") == ("prefix_repetition", {
        "prefix_len": 256, "suffix_len": 256, "num_prefixes": 10, "output_len": 128})
    spec = get_scenario("random")
    assert (spec.num_requests, spec.rate) == (1000, float("inf"))  # --num-prompts, rate inf


def test_vllm_spellings_of_a_key_are_one_key() -> None:
    for key in ("input_len", "random_input_len", "random-input-len", "--random-input-len"):
        assert split_name(f"random:{key}=7")[1]["input_len"] == 7  # type: ignore[index]


@pytest.mark.parametrize(("name", "message"), [
    ("random:input=5", "scenario random: 'input=5' is not key=value with a key of input_len"),
    ("random:input_len", "is not key=value"),
    ("random:input_len=1.5", "scenario random: input_len '1.5' is not an integer"),
    ("random:range_ratio=x", "range_ratio 'x' is not a number"),
    ("random:input_len=4,input_len=5", "input_len given twice"),
    ("random:range_ratio=1", "range_ratio must be in [0, 1), got 1.0"),
    ("random:input_len=0", "input_len must be an integer >= 1, got 0"),
    ("prefix_repetition:suffix_len=0", "suffix_len must be an integer >= 1, got 0"),
])
def test_bad_parameters_one_line(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        get_scenario(name)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_random_bounds_as_vllm_computes_them() -> None:
    # floor(100 * 0.5) = 50, ceil(100 * 1.5) = 150; output floor(10 * 0.5) = 5, ceil 15
    assert RandomLengths(100, 10, 0.5).bounds() == ((50, 150), (5, 15))
    # floor(7.5) = 7, ceil(12.5) = 13; output floor(2.25) = 2, ceil(3.75) = 4
    assert RandomLengths(10, 3, 0.25).bounds() == ((7, 13), (2, 4))
    # 30 * (1 - 0.9) is 2.9999999999999996 in float64 (floor 2, as vLLM's same formula),
    # ceil(57.0) = 57; output floor(0.3) = 0 -> 1 (never 0 tokens), ceil(5.7) = 6
    assert RandomLengths(30, 3, 0.9).bounds() == ((2, 57), (1, 6))
    with pytest.raises(ValueError, match="allows 0-token prompts"):
        RandomLengths(1, 1, 0.5)
    assert RandomLengths(1, 1, 0.5, prefix_len=2).bounds()[0] == (0, 2)


def test_random_lengths_and_arrivals() -> None:
    w = build("random:input_len=100,output_len=10,range_ratio=0.5,prefix_len=7", 2000)
    assert len(w) == 2000
    np.testing.assert_array_equal(w.arrival_time, np.zeros(2000))  # rate inf
    sampled = w.num_prompt_tokens - 7
    assert (sampled.min(), sampled.max()) == (50, 150)
    assert (w.output_len.min(), w.output_len.max()) == (5, 15)
    assert w.prompt_segments is not None
    assert {s[0] for s in w.prompt_segments} == {(SYSTEM_PROMPT_ID, 7)}
    assert all(sum(n for _, n in s) == p for s, p in zip(w.prompt_segments,
                                                          w.num_prompt_tokens, strict=True))
    fixed = build("random:input_len=64,output_len=8", 5, rate=2.0)
    assert fixed.prompt_segments is None  # no prefix: nothing shared
    assert set(fixed.num_prompt_tokens) == {64} and set(fixed.output_len) == {8}
    assert fixed.arrival_time[0] > 0 and np.all(np.diff(fixed.arrival_time) > 0)  # Poisson


def test_prefix_repetition_rounds_down_and_repeats_each_prefix_equally() -> None:
    w = build("prefix_repetition:prefix_len=4,suffix_len=2,num_prefixes=3,output_len=5", 10)
    assert len(w) == 9  # 3 * (10 // 3), as vLLM
    assert set(w.num_prompt_tokens) == {6} and set(w.output_len) == {5}
    assert w.prompt_segments is not None
    firsts = [s[0] for s in w.prompt_segments]
    assert sorted(firsts) == [(SYSTEM_PROMPT_ID + k, 4) for k in range(3) for _ in range(3)]
    assert firsts != sorted(firsts)  # shuffled, as vLLM
    with pytest.raises(ValueError, match=r"num_requests \(2\) must be >= num_prefixes \(3\)"):
        build("prefix_repetition:num_prefixes=3", 2)


def test_cli_runs_prefix_repetition_with_prefix_hits(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, [
        "run", "--scenario", "prefix_repetition:prefix_len=64,suffix_len=16,num_prefixes=2,"
        "output_len=4", "--num-requests", "8", "--rate", "1", "--step-time", "0.01",
        "--prefix-cache", "block", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_requests"] == 8
    # 2 prefixes of 64 tokens = 4 blocks of 16, each computed once, hit by 3 more prompts
    assert summary["prefix_cache"]["queried_tokens"] == 8 * (64 + 16)
    assert summary["prefix_cache"]["hit_tokens"] == 2 * 3 * 64
