"""Trace loading: the real shared traces, format detection, one-line errors, round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scenarios.traces import load_lengths, load_trace, save_trace
from scenarios.workload import Workload

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
CONV = TRACES / "AzureLLMInferenceTrace_conv.csv"
CODE = TRACES / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_conversation_trace.jsonl"


def shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared trace {path} not present (expected in ../shared/traces)")
    return path


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def test_azure_conv_rows_first_request_and_second_arrival() -> None:
    workload = load_trace(shared(CONV))
    assert len(workload) == 19_366
    assert workload.arrival_time[0] == 0.0
    assert (workload.num_prompt_tokens[0], workload.output_len[0]) == (374, 44)
    # 18:15:50.9951690 - 18:15:46.6805900
    assert workload.arrival_time[1] == pytest.approx(4.3145790, abs=1e-9)
    np.testing.assert_array_equal(workload.max_tokens, workload.output_len)
    assert workload.request_id[:2] == ("0", "1")
    assert workload.num_prompt_tokens.mean() == pytest.approx(1154.7, abs=0.05)
    assert workload.arrival_time[-1] == pytest.approx(3501.7, abs=0.05)


def test_azure_bulk_parse_equals_row_by_row(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    """pandas' bulk parse of the Azure columns gives the row-by-row parser's values; a
    field the bulk parser does not take (a leap second) falls back to row by row."""
    from scenarios.traces import bulk as bulk_reader

    leap = write(tmp_path, "leap.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2016-12-31 23:59:59.5,10,2\n2016-12-31 23:59:60.25,20,3\n")
    paths = [shared(CONV), leap]
    bulk = [load_trace(p) for p in paths]
    monkeypatch.setattr(bulk_reader, "read", lambda *args: None)
    rows = [load_trace(p) for p in paths]
    for a, b in zip(bulk, rows, strict=True):
        for column in ("arrival_time", "num_prompt_tokens", "output_len", "max_tokens"):
            np.testing.assert_array_equal(getattr(a, column), getattr(b, column))
    np.testing.assert_array_equal(bulk[1].arrival_time, [0.0, 0.75])


def test_azure_code_rows() -> None:
    workload = load_trace(shared(CODE))
    assert len(workload) == 8_819
    assert (workload.num_prompt_tokens[0], workload.output_len[0]) == (4808, 10)


def test_mooncake_conversation_ms_to_seconds_and_hashes() -> None:
    workload = load_trace(shared(MOONCAKE))
    assert len(workload) == 12_031
    assert (workload.num_prompt_tokens[0], workload.output_len[0]) == (6758, 500)
    assert workload.hash_ids is not None
    assert workload.hash_ids[0] == tuple(range(14))
    assert workload.arrival_time[-1] == pytest.approx(3536.999, abs=1e-9)  # 3,536,999 ms


def test_mooncake_timestamps_are_milliseconds(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl",
                 '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n'
                 '{"timestamp": 1500, "input_length": 10, "output_length": 2, "hash_ids": [0]}\n')
    workload = load_trace(path)
    np.testing.assert_array_equal(workload.arrival_time, [0.0, 1.5])
    assert workload.hash_ids == ((0, 1), (0,))


def test_azure_small_file_crlf_without_final_newline(tmp_path: Path) -> None:
    path = write(tmp_path, "az.csv",
                 "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                 "2023-11-16 23:59:59.5000000,10,2\r\n"
                 "2023-11-17 00:00:01.2500001,20,3")
    workload = load_trace(path)
    np.testing.assert_allclose(workload.arrival_time, [0.0, 1.7500001], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("trace.csv",
         "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2023-11-16 18:15:46.6805900,374,44\n" * 5
         + "2023-11-16 18:15:47.0000000,abc,44\n",
         "trace.csv line 7: ContextTokens 'abc' is not an integer"),
        ("trace.csv",
         "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,0\n",
         "trace.csv line 2: GeneratedTokens 0 must be >= 1"),
        ("trace.csv",
         "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,-3,4\n",
         "trace.csv line 2: ContextTokens -3 must be >= 1"),
        ("trace.csv",
         "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n",
         "trace.csv line 2: TIMESTAMP 'yesterday' is not a"),
        ("trace.csv",
         "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,3\n",
         "trace.csv line 2: expected 3 fields"),
        ("m.jsonl",
         '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
         '{"timestamp": 3, "input_length": 0, "output_length": 1}\n',
         "m.jsonl line 2: input_length 0 must be >= 1"),
        ("m.jsonl",
         '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 3,\n',
         "m.jsonl line 2: invalid JSON"),
        ("m.jsonl",
         '{"timestamp": 0, "input_length": "5", "output_length": 1}\n',
         "m.jsonl line 1: input_length '5' is not an integer"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5}\n',
         "m.jsonl line 1: missing field output_length"),
        ("s.csv", "arrival_time,num_prompt_tokens,output_len\n0.0,5,2\nsoon,5,2\n",
         "s.csv line 3: arrival_time 'soon' is not a number"),
        ("s.csv", "arrival_time,num_prompt_tokens,output_len\n0.0,0,2\n",
         "s.csv line 2: num_prompt_tokens 0 must be >= 1"),
        ("s.csv", "arrival_time,num_prompt_tokens\n0.0,5\n",
         "unknown trace format"),
        ("s.csv", "arrival_time,num_prompt_tokens,output_len\n", "no requests"),
        ("e.csv", "", "empty"),
        ("l.csv", "num_prefill_tokens,num_decode_tokens\n5,5\n", "l.csv holds lengths "
         "only (num_prefill_tokens, num_decode_tokens), no arrival times: give --rate"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": '
         + "[" * 100_000 + "]" * 100_000 + "}\n",
         "m.jsonl line 1: JSON nested too deeply to read"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 99999999999999999999, '
         '"output_length": 5}\n', "m.jsonl line 1: input_length 99999999999999999999 is out "
         "of range"),
        ("s.csv", "arrival_time,num_prompt_tokens,output_len\n0.0,5,2\n0.0,5,"
         "99999999999999999999\n", "s.csv line 3: output_len 99999999999999999999 is out"),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,"
         "99999999999999999999,44\n", "a.csv line 2: ContextTokens 99999999999999999999 is"),
        ("s.csv", "arrival_time,num_prompt_tokens,output_len,prompt_segments\n0,100,5,"
         "1:50 2:60\n", "s.csv: prompt_segments[0] (request_id '0') sums to 110 tokens"),
    ],
)
def test_malformed_files_give_one_clear_line(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ValueError) as excinfo:
        load_trace(path)
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_non_utf8_trace_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bin.csv"
    path.write_bytes(b"arrival_time,num_prompt_tokens,output_len\n0,5,\xff\n")
    with pytest.raises(ValueError, match=r"^bin\.csv line 2: not UTF-8 text \(byte 0xff\)"):
        load_trace(path)


@pytest.mark.parametrize(("trace", "message"), [
    (".", "trace {t} is a directory; give a trace file"),
    ("/dev/null", "trace /dev/null is not a regular file"),
    ("deep.jsonl", "deep.jsonl line 1: JSON nested too deeply to read"),
])
def test_cli_refuses_unreadable_traces_in_one_line(tmp_path: Path, trace: str,
                                                   message: str) -> None:
    from typer.testing import CliRunner

    from sim.app.cli.main import app

    if trace == "/dev/null" and not Path(trace).exists():
        pytest.skip("no /dev/null here")
    (tmp_path / "deep.jsonl").write_text('{"timestamp": 0, "input_length": 10, '
                                         '"output_length": 5, "hash_ids": '
                                         + "[" * 100_000 + "]" * 100_000 + "}\n")
    path = trace if trace == "/dev/null" else str(tmp_path / trace)
    for command in (["run", "--out", str(tmp_path / "r")], ["diagram"]):
        res = CliRunner().invoke(app, [*command, "--trace", path])
        assert res.exit_code == 1, res.output
        assert res.output.startswith(f"error: {message.format(t=path)}")
        assert res.output.count("\n") == 1, res.output


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(FileNotFoundError, match=r"nope\.csv"):
        load_trace(missing)


def test_forced_format(tmp_path: Path) -> None:
    path = write(tmp_path, "x.txt", "arrival_time,num_prompt_tokens,output_len\n0.5,5,2\n")
    assert load_trace(path, fmt="servesim").arrival_time[0] == 0.5
    with pytest.raises(ValueError, match="trace_format must be one of"):
        load_trace(path, fmt="parquet")
    with pytest.raises(ValueError, match="missing column"):
        load_trace(path, fmt="azure")


def test_servesim_optional_columns_and_unsorted_rows(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv",
                 "arrival_time,num_prompt_tokens,output_len,max_tokens,priority,request_id\n"
                 "2.0,5,2,,1,b\n1.0,6,3,2,-1,a\n")
    workload = load_trace(path)
    assert workload.request_id == ("a", "b")
    np.testing.assert_array_equal(workload.max_tokens, [2, 2])
    np.testing.assert_array_equal(workload.priority, [-1, 1])


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    original = Workload.from_arrays(
        [0.1, 0.30000000000000004, 2.5], [5, 600, 7], [1, 2, 3], max_tokens=[1, 1, 9],
        priority=[0, 2, -1], request_id=["x", "y,z", "w"], hash_ids=[[0], [0, 1], []],
    )
    path = tmp_path / "out" / "w.csv"
    save_trace(original, path)
    assert load_trace(path) == original


def test_load_lengths_from_trace_and_length_csv(tmp_path: Path) -> None:
    prompt, output = load_lengths(shared(CODE))
    assert len(prompt) == 8_819 and (prompt[0], output[0]) == (4808, 10)
    path = write(tmp_path, "l.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n")
    prompt, output = load_lengths(path)
    assert (prompt.tolist(), output.tolist()) == ([5], [6])
