"""Large traces: request ids held as row numbers (their memory, their strings as written),
and the early stop of servesim's CSV and Mooncake JSON Lines at a time-ordered cut."""

from __future__ import annotations

import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from scenarios import mooncake
from scenarios.traces import load_trace, save_trace, servesim
from scenarios.workload import Workload


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_default_ids_cost_no_strings() -> None:
    """200,000 requests without ids of their own: the five int64/float64 columns and the
    row numbers are 1.6 MB each (9.6 MB in all); held as strings the ids alone took about
    35 MB (a str of 50-56 bytes, a tuple slot and a set slot each, per copy)."""
    n = 200_000
    t = np.arange(n, dtype=np.float64)
    ones = np.ones(n, dtype=np.int64)
    tracemalloc.start()
    try:
        w = Workload.from_arrays(t, ones, ones)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20e6, f"peak {peak / 1e6:.1f} MB"
    assert (w.request_id[0], w.request_id[n - 1], len(w.request_id)) == ("0", "199999", n)


def test_ids_read_as_strings_in_input_row_order(tmp_path: Path) -> None:
    """Sorting, sampling and cutting keep each row's own id; a saved trace writes them as
    the same strings, and a Workload survives pickling (Ray ships it)."""
    w = Workload.from_arrays([2.0, 0.0, 1.0, 3.0], [1, 2, 3, 4], [1, 1, 1, 1])
    assert w.request_id == ("1", "2", "0", "3") and list(w.request_id) == ["1", "2", "0", "3"]
    assert w.request_id[1:3] == ("2", "0") and w.request_id[-1] == "3"
    assert w.cut(num_requests=2).request_id == ("1", "2")
    assert w.sampled(4, np.random.default_rng(0)) is w
    assert pickle.loads(pickle.dumps(w)) == w
    save_trace(w, tmp_path / "w.csv")
    ids = [line.split(",")[5] for line in (tmp_path / "w.csv").read_text().splitlines()[1:]]
    assert ids == ["1", "2", "0", "3"]
    with pytest.raises(ValueError, match="request_id values must be unique"):
        Workload.from_arrays([0.0, 1.0], [1, 1], [1, 1], request_id=["a", "a"])


def test_csv_rows_left_out_keep_their_numbers(tmp_path: Path) -> None:
    """BurstGPT's failed request (data row 1) is dropped: the rows kept are 0 and 2."""
    path = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,"
                 "Total tokens,Log Type\n5,ChatGPT,4,1,5,API log\n6,ChatGPT,4,0,4,API log\n"
                 "7,ChatGPT,4,2,6,API log\n")
    assert load_trace(path).request_id == ("0", "2")


SERVESIM_HEAD = "arrival_time,num_prompt_tokens,output_len\n"


def test_servesim_csv_stops_at_the_cut(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows past the cut are not read (a bad one there goes unseen), by count or window;
    a file that goes back in time is read whole."""
    monkeypatch.setattr(servesim, "_BATCH", 2, raising=False)
    rows = "".join(f"{t},{t + 1},1\n" for t in range(5))
    path = write(tmp_path, "s.csv", SERVESIM_HEAD + rows + "9,bad,1\n")
    assert load_trace(path, num_requests=2).num_prompt_tokens.tolist() == [1, 2]
    assert load_trace(path, window_s=2.5).arrival_time.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match=r"s\.csv line 7: num_prompt_tokens 'bad'"):
        load_trace(path)
    back = write(tmp_path, "b.csv", SERVESIM_HEAD + "1,2,1\n0,1,1\n2,3,1\n3,4,1\n")
    w = load_trace(back, num_requests=2)
    assert w.arrival_time.tolist() == [0.0, 1.0] and w.request_id == ("1", "0")


def mooncake_line(ms: int, prompt: int) -> str:
    return f'{{"timestamp": {ms}, "input_length": {prompt}, "output_length": 1}}\n'


def test_mooncake_stops_at_the_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the CSVs: lines past the cut are not parsed; a bad line before it is named by
    its own line number; ids and hash_ids are those of a whole read."""
    monkeypatch.setattr(mooncake, "BATCH_LINES", 2, raising=False)
    lines = [mooncake_line(1000 * t, t + 1) for t in range(5)]
    lines[1] = lines[1].replace("}", ', "hash_ids": [7, 8]}')
    path = write(tmp_path, "m.jsonl", "".join(lines) + '{"timestamp": 9000, "input_length": x}\n')
    w = load_trace(path, num_requests=3)
    assert w.num_prompt_tokens.tolist() == [1, 2, 3] and w.hash_ids == ((), (7, 8), ())
    assert load_trace(path, window_s=2.5).arrival_time.tolist() == [0.0, 1.0, 2.0]
    whole = write(tmp_path, "w.jsonl", "".join(lines))
    assert load_trace(whole, num_requests=4) == load_trace(whole).cut(num_requests=4)
    with pytest.raises(ValueError, match=r"m\.jsonl line 6: invalid JSON"):
        load_trace(path)
    bad = write(tmp_path, "n.jsonl", "".join(lines[:2]) + mooncake_line(2000, 0))
    with pytest.raises(ValueError, match=r"n\.jsonl line 3: input_length 0 must be >= 1"):
        load_trace(bad, num_requests=5)
