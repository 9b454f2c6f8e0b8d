"""The JSON trace family (scenarios/json_traces.py, mooncake.py, sharegpt.py): detection
that names what it saw, Mooncake's two passes, ShareGPT tokenized by a local tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scenarios import mooncake
from scenarios.json_traces import detect_json
from scenarios.traces import load_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


#: What vllm bench serve --save-result writes without --save-detailed (keys of serve.py).
RESULT = {"date": "20260101-000000", "endpoint_type": "vllm", "backend": "vllm",
          "label": None, "model_id": "m", "tokenizer_id": "m", "num_prompts": 2,
          "request_rate": "inf", "burstiness": 1.0, "max_concurrency": None,
          "duration": 1.5, "completed": 2, "failed": 0, "total_input_tokens": 10,
          "total_output_tokens": 4, "request_throughput": 1.3}


def test_detection_names_each_json_format(tmp_path: Path) -> None:
    cases = {
        "r.json": json.dumps(RESULT), "p.json": json.dumps(RESULT, indent=4),
        "m.jsonl": '{"timestamp": 0, "input_length": 5, "output_length": 1}\n',
        "s.json": '[{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}]',
    }
    want = {"r.json": "vllm-bench", "p.json": "vllm-bench", "m.jsonl": "mooncake",
            "s.json": "sharegpt"}
    for name, text in cases.items():
        path = write(tmp_path, name, text)
        assert detect_json(path, lines_of(path)) == want[name], name
    with pytest.raises(ValueError, match=r"x.json line 1: a JSON object with keys a, b; "):
        path = write(tmp_path, "x.json", '{"a": 1, "b": 2}')
        detect_json(path, lines_of(path))
    with pytest.raises(ValueError, match=r'l.json: a JSON list without "conversations"'):
        path = write(tmp_path, "l.json", '[{"benchmark": {}}]')
        detect_json(path, lines_of(path))


def test_save_result_without_detail_names_the_missing_field(tmp_path: Path) -> None:
    path = write(tmp_path, "r.json", json.dumps(RESULT) + "\n")
    with pytest.raises(ValueError) as err:
        load_trace(path)
    assert str(err.value).startswith("r.json: no input_lens")
    assert "--save-detailed" in str(err.value)


def test_appended_results_are_named(tmp_path: Path) -> None:
    path = write(tmp_path, "a.json", json.dumps(RESULT) + "\n" + json.dumps(RESULT) + "\n")
    with pytest.raises(ValueError, match=r"a.json: 2 results, one a line \(vllm bench serve "
                                         r"--append-result\)"):
        load_trace(path)


@pytest.mark.parametrize("name", ["mooncake_conversation_trace.jsonl",
                                  "mooncake_synthetic_trace.jsonl"])
def test_mooncake_fast_pass_equals_checked_pass(name: str) -> None:
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"shared trace {path} not present (expected in ../shared/traces)")
    if mooncake._fast_decoder() is None:
        pytest.skip("msgspec not installed (the optional extra fast)")
    lines = lines_of(path)
    fast = mooncake._fast_rows(lines)
    assert fast is not None
    checked = mooncake._checked_columns(path, lines)
    for a, b in zip(fast[:3], checked[:3], strict=True):
        np.testing.assert_array_equal(a, b)
    assert fast[3] == checked[3]


@pytest.mark.parametrize(("text", "message"), [
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
     '{"timestamp": 3, "input_length": 0, "output_length": 1}\n',
     "m.jsonl line 2: input_length 0 must be >= 1"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
     '{"timestamp": 1, "input_length": 5, "output_length": 1}, {"timestamp": 2}\n',
     "m.jsonl line 2: invalid JSON (Extra data)"),
    ('{"timestamp": 0, "input_length": 5.0, "output_length": 1}\n',
     "m.jsonl line 1: input_length 5.0 is not an integer"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": null}\n',
     "m.jsonl line 1: hash_ids must be a list of integers"),
    ('{"timestamp": 0, "input_length": 5}\n', "m.jsonl line 1: missing field output_length"),
])
def test_mooncake_bad_line_named_by_either_pass(tmp_path: Path, text: str,
                                                message: str) -> None:
    path = write(tmp_path, "m.jsonl", text)
    with pytest.raises(ValueError) as err:
        mooncake.load_workload(path, lines_of(path))
    assert str(err.value) == message


def test_mooncake_huge_hash_id_read_as_before(tmp_path: Path) -> None:
    # beyond uint64: msgspec refuses, the checked pass keeps it (a hash id, not a count)
    path = write(tmp_path, "m.jsonl", '{"timestamp": 1500, "input_length": 5, '
                 '"output_length": 2, "hash_ids": [123456789012345678901234567890]}\n'
                 '{"timestamp": 2000, "input_length": 7, "output_length": 3}\n')
    w = mooncake.load_workload(path, lines_of(path))
    np.testing.assert_array_equal(w.arrival_time, [1.5, 2.0])
    assert w.hash_ids == ((123456789012345678901234567890,), ())
