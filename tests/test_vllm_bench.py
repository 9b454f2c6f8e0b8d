"""scenarios/vllm_bench.py and its trace format: vLLM benchmark results (tests/data/vllm_bench,
written by hand in the format of vllm/benchmarks/serve.py) read as figures and as a
workload, told apart from Mooncake, and every malformed field named with its index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scenarios.traces import detect_format, load_lengths, load_trace
from scenarios.vllm_bench import parse_result, read_result, to_workload

DATA = Path(__file__).parent / "data" / "vllm_bench"
SMALL = DATA / "serve_small.json"
OLD = DATA / "benchmark_serving_old.json"


def small_doc() -> dict[str, Any]:
    return json.loads(SMALL.read_text())


def test_reads_the_successful_requests_as_written() -> None:
    r = read_result(SMALL)
    assert list(r.index) == [0, 1, 3] and r.num_failed == 1 and len(r) == 3
    assert list(r.num_prompt_tokens) == [12, 20, 5] and list(r.output_len) == [4, 3, 1]
    assert list(r.ttft_s) == [0.05, 0.06, 0.04] and list(r.latency_s) == [0.12, 0.11, 0.04]
    assert list(r.itl_s) == [0.02, 0.02, 0.03, 0.025, 0.025] and list(r.num_itl) == [3, 2, 0]
    assert r.start_time is not None and list(r.start_time) == [1000.0, 1000.5, 1001.25]
    assert r.meta["backend"] == "openai" and r.meta["model_id"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert "input_lens" not in r.meta  # per-request lists are not metadata


def test_workload_replays_start_times_and_lengths() -> None:
    w = to_workload(read_result(SMALL))
    assert list(w.arrival_time) == [0.0, 0.5, 1.25]
    assert list(w.num_prompt_tokens) == [12, 20, 5] and list(w.output_len) == [4, 3, 1]
    assert list(w.max_tokens) == [4, 3, 1] and w.request_id == ("0", "1", "3")
    assert w.source == "vllm-bench result serve_small.json, 1 failed request left out"


def test_workload_is_sorted_by_start_time_and_keeps_file_indices() -> None:
    doc = small_doc()
    doc["start_times"] = [5.0, 3.0, 9.0, 4.0]  # sent out of file order (a semaphore)
    w = to_workload(parse_result("r.json", json.dumps(doc)))
    assert w.request_id == ("1", "3", "0") and list(w.arrival_time) == [0.0, 1.0, 2.0]


def test_older_result_without_start_times_is_a_target_not_a_workload() -> None:
    r = read_result(OLD)
    assert r.start_time is None
    # no latencies either: ttft + sum(itl), as vLLM's timeline plot computes it
    assert list(r.latency_s) == [0.1 + 0.05, 0.2 + 0.1]
    with pytest.raises(ValueError, match=r"^benchmark_serving_old.json: no start_times"):
        to_workload(r)


def test_format_detected_from_content(tmp_path: Path) -> None:
    one_line = tmp_path / "one.json"
    one_line.write_text(json.dumps(small_doc()))  # as vLLM writes it
    assert detect_format(SMALL) == detect_format(one_line) == "vllm-bench"
    assert detect_format(OLD) == "vllm-bench"
    moon = tmp_path / "moon.jsonl"
    moon.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n'
                    '{"timestamp": 10, "input_length": 6, "output_length": 3, "hash_ids": [1]}\n')
    assert detect_format(moon) == "mooncake"
    summary_only = tmp_path / "summary.json"  # saved without --save-detailed
    summary_only.write_text(json.dumps({"backend": "vllm", "request_throughput": 2.0}))
    with pytest.raises(ValueError, match=r"no input_lens .*--save-detailed"):
        load_trace(summary_only)


def test_load_trace_and_lengths_read_a_result() -> None:
    assert load_trace(SMALL) == load_trace(SMALL, "vllm-bench") == to_workload(read_result(SMALL))
    prompt, out = load_lengths(SMALL)
    assert list(prompt) == [12, 20, 5] and list(out) == [4, 3, 1]
    with pytest.raises(ValueError, match="line 1: missing field timestamp"):
        load_trace(OLD, "mooncake")  # a forced format reads the file as that format


def _with(**changes: Any) -> str:
    doc = small_doc()
    for key, value in changes.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(("text", "message"), [
    (_with(ttfts=[0.05, 0.06, 0.0, "x"]), "r.json: ttfts[3] is not a number"),
    (_with(ttfts=[0.05, True, 0.0, 0.04]), "r.json: ttfts[1] is not a number"),
    (_with(ttfts=[0.05, -0.06, 0.0, 0.04]), "r.json: ttfts[1] -0.06 must be finite and >= 0"),
    (_with(ttfts=[0.05, 0.06, 0.0]), "r.json: ttfts has 3 entries, input_lens 4"),
    (_with(ttfts=None), "r.json: no ttfts"),
    (_with(itls=[[0.02], [0.025, "a"], [], []]), "r.json: itls[1][1] is not a number"),
    (_with(itls=[[0.02], 0.5, [], []]), "r.json: itls[1] is not a list"),
    (_with(itls={"0": []}), "r.json: itls is not a list"),
    (_with(input_lens=[12, 20.5, 8, 5]), "r.json: input_lens[1] is not an integer"),
    (_with(output_lens=[4, 0, 0, 1]), "r.json: output_lens[1] 0 must be >= 1"),
    (_with(latencies=[0.12, 0.05, 0.0, 0.04]), "r.json: latencies[1] 0.05 is less than "
                                               "ttfts[1] 0.06"),
    (_with(start_times=[1.0, None, 2.0, 3.0]), "r.json: start_times[1] is not a number"),
    (_with(errors=["", 7, "", ""]), "r.json: errors[1] is not a string"),
    (_with(errors=["a", "b", "c", "d"]), "r.json: no successful request"),
    ('{"input_lens": [1', "r.json: invalid JSON"),
    ("[1, 2]", "r.json: expected a vllm bench serve result (a JSON object), got a JSON list"),
])
def test_malformed_result_names_field_and_index(text: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_result("r.json", text)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_failed_request_entries_are_not_checked() -> None:
    """vLLM writes 0.0 and [] for a failed request; anything there is left out unread."""
    r = parse_result("r.json", _with(ttfts=[0.05, 0.06, "n/a", 0.04], output_lens=[4, 3, 0, 1]))
    assert list(r.index) == [0, 1, 3]
    assert np.array_equal(r.ttft_s, [0.05, 0.06, 0.04])


def test_a_result_recorded_against_a_real_vllm_serve_reads_and_agrees_with_vllm() -> None:
    # benchmarks/data/vllm_serve_cpu_qwen2.5-0.5b-8l.json: vllm bench serve against vLLM
    # 0.32's OpenAI server on a CPU (benchmarks/vllm_serve_cpu.py): 40 requests, prompts
    # 96-128 tokens, outputs 24-32, one streamed chunk a token. The reader keeps every
    # request, each with n - 1 chunk gaps, and the medians vLLM printed are the medians
    # of the per-request lists it wrote.
    path = Path(__file__).parents[1] / "benchmarks" / "data" / \
        "vllm_serve_cpu_qwen2.5-0.5b-8l.json"
    r = read_result(path)
    raw = json.loads(path.read_text())
    assert len(r) == 40 and r.num_failed == 0
    assert r.num_prompt_tokens.min() >= 96 and r.num_prompt_tokens.max() <= 128
    assert int(r.output_len.sum()) == 1137 and len(r.itl_s) == 1137 - 40
    assert np.median(r.ttft_s) * 1e3 == pytest.approx(raw["median_ttft_ms"], rel=1e-9)
    assert np.median(r.latency_s) * 1e3 == pytest.approx(raw["median_e2el_ms"], rel=1e-9)
