"""The CSV trace formats read by column name: Azure 2024, BurstGPT, Vidur, splitwise-sim and
length-only files; hand-checked lengths and arrivals, one-line errors, the early stop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from scenarios.traces import bulk, detect_format, load_lengths, load_trace
from sim.app.cli.main import app
from tests.conftest import shared_path

BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "6,GPT-4,1000,0,1000,API log\n"
            "9,ChatGPT,30,200,230,API log\n"
            "12.5,GPT-4,50,60,110,Conversation log\n")
AZURE_2024 = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2024-05-10 00:00:00.372121+00:00,100,10\n"
              "2024-05-10 00:00:01+00:00,200,20\n"
              "2024-05-10 02:00:02.5+02:00,300,30\n")
#: The first rows of microsoft/vidur data/processed_traces/splitwise_conv.csv.
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.314579,396,109\n"
#: Mutinifni/splitwise-sim traces/test_trace.csv, whole.
SPLITWISE = ("request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,"
             "token_size\n0,2,0,1,1,4096,32\n1,2,0,3,1,2048,8\n2,2,0,4,1,2048,16\n")
LENGTHS = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n74,918,992,0.08\n"
SARATHI = "traces", "sarathi_sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
ARXIV = "traces", "vidur_arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def columns(workload: object) -> tuple[list[float], list[int], list[int]]:
    return (workload.arrival_time.tolist(), workload.num_prompt_tokens.tolist(),  # type: ignore[attr-defined]
            workload.output_len.tolist())  # type: ignore[attr-defined]


def both_readers(path: Path, fmt: str | None = None, **kwargs: object) -> object:
    """The workload the bulk reader gives, checked equal to the row-by-row reader's."""
    fast = load_trace(path, fmt, **kwargs)  # type: ignore[arg-type]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(bulk, "read", lambda *args: None)
        assert load_trace(path, fmt, **kwargs) == fast  # type: ignore[arg-type]
    return fast


def test_azure_2024_offsets_and_absent_fractions(tmp_path: Path) -> None:
    w = both_readers(write(tmp_path, "az24.csv", AZURE_2024))
    # 00:00:00.372121, 00:00:01, and 02:00:02.5+02:00 = 00:00:02.5 UTC
    assert columns(w) == ([0.0, 0.627879, 2.127879], [100, 200, 300], [10, 20, 30])
    assert detect_format(tmp_path / "az24.csv") == "azure"


def test_burstgpt_drops_failures_and_filters(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", BURSTGPT)
    w = both_readers(path)
    assert columns(w) == ([5.0, 9.0, 12.5], [472, 30, 50], [18, 200, 60])
    assert w.request_id == ("0", "2", "3")  # type: ignore[attr-defined]
    assert "1 failed requests (Response tokens 0) dropped" in w.source  # type: ignore[attr-defined]
    chat = both_readers(path, "burstgpt:model=ChatGPT")
    assert columns(chat)[0] == [5.0, 9.0]
    conv = both_readers(path, "burstgpt: model = GPT-4, log_type=Conversation log")
    assert columns(conv) == ([12.5], [50], [60])
    with pytest.raises(ValueError, match=r"^b\.csv: no requests left \(1 failed, 3 not "
                       r"matching Model = GPT-4, Log Type = API log\)$"):
        load_trace(path, "burstgpt:model=GPT-4,log_type=API log")


def test_vidur_and_splitwise_arrivals_in_seconds(tmp_path: Path) -> None:
    vidur = both_readers(write(tmp_path, "v.csv", VIDUR))
    assert columns(vidur) == ([0.0, 4.314579], [374, 396], [44, 109])
    split = both_readers(write(tmp_path, "s.csv", SPLITWISE))
    assert columns(split) == ([1.0, 3.0, 4.0], [4096, 2048, 2048], [32, 8, 16])
    assert [detect_format(tmp_path / n) for n in ("v.csv", "s.csv")] == ["vidur", "splitwise"]


def test_length_only_files_read_when_retimed(tmp_path: Path) -> None:
    path = write(tmp_path, "l.csv", LENGTHS)
    assert columns(both_readers(path, retimed=True)) == ([0.0], [74], [918])
    w = load_trace(shared_path(*SARATHI), retimed=True, num_requests=3)
    assert columns(w) == ([0.0] * 3, [74, 290, 1402], [918, 905, 711])
    prompt, out = load_lengths(shared_path(*ARXIV))
    assert len(prompt) == 28_257 and prompt.mean() == pytest.approx(2588.1, abs=0.05)
    assert out.mean() == pytest.approx(291.4, abs=0.05)


@pytest.mark.parametrize("trace", [SARATHI, ARXIV])
def test_cli_retimes_a_length_only_trace(tmp_path: Path, trace: tuple[str, str]) -> None:
    path = str(shared_path(*trace))
    run = ["run", "--trace", path, "--num-requests", "20", "--out", str(tmp_path / "r")]
    res = CliRunner().invoke(app, [*run, "--arrival", "poisson", "--rate", "5"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, [*run, "--arrival", "poisson"])
    assert res.exit_code == 1
    assert res.output == (f"error: {trace[1]} holds lengths only (num_prefill_tokens, "
                          "num_decode_tokens), no arrival times: give --rate (requests/s) to "
                          "time its requests (--arrival picks the process, default poisson)\n")


@pytest.mark.parametrize(("text", "fmt"), [(AZURE_2024, None), (BURSTGPT, "burstgpt:model=GPT-4"),
                                           (VIDUR, None), (SPLITWISE, None)])
def test_cli_runs_each_format(tmp_path: Path, text: str, fmt: str | None) -> None:
    path = write(tmp_path, "t.csv", text)
    args = ["run", "--trace", str(path), "--out", str(tmp_path / "r")]
    res = CliRunner().invoke(app, args + (["--trace-format", fmt] if fmt else []))
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(("text", "fmt", "message"), [
    (AZURE_2024.replace("02:00:02.5+02:00", "02:00:02.5+25:00"), None,
     "t.csv line 4: TIMESTAMP '2024-05-10 02:00:02.5+25:00' is not a"),
    (BURSTGPT.replace("9,ChatGPT,30,200", "9,ChatGPT,30,-2"), None,
     "t.csv line 4: Response tokens -2 must be >= 0"),
    (BURSTGPT.replace("12.5,GPT-4,50", "12.5,GPT-4,x"), None,
     "t.csv line 5: Request tokens 'x' is not an integer"),
    (VIDUR.replace("4.314579", "soon"), None, "t.csv line 3: arrived_at 'soon' is not a number"),
    (SPLITWISE.replace("1,1,4096,32", "1,1,0,32"), None,
     "t.csv line 2: prompt_size 0 must be >= 1"),
    (SPLITWISE.replace("2,0,3,1,2048,8", "2,0,3,1,2048"), None, "t.csv line 3: expected 7 fields"),
    (LENGTHS.replace("918", "abc"), "lengths", "t.csv line 2: num_decode_tokens 'abc' is not"),
    (VIDUR, "azure", "t.csv line 1: missing column(s) TIMESTAMP, ContextTokens, GeneratedTokens"),
    (BURSTGPT, "burstgpt:colour=red", "burstgpt: filter 'colour=red' is not model=VALUE or "
     "log_type=VALUE"),
    (VIDUR, "vidur:model=x", "trace_format vidur takes no filters"),
    ("TIMESTAMP,ContextTokens,Output\n1,2,3\n", None, "t.csv: unknown trace format: line 1 has "
     "columns TIMESTAMP, ContextTokens, Output; it looks like azure but lacks GeneratedTokens"),
])
def test_bad_files_give_one_line(tmp_path: Path, text: str, fmt: str | None,
                                 message: str) -> None:
    path = write(tmp_path, "t.csv", text)
    with pytest.raises(ValueError) as info:
        load_trace(path, fmt, retimed=True)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_reading_stops_at_the_cut_in_a_time_ordered_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows past the cut are not read (a bad one there goes unseen); a file that goes back
    in time before the cut is met is read whole, so the cut is the whole file's."""
    monkeypatch.setattr(bulk, "CHUNK_ROWS", 2)
    rows = [f"{t},{p},1\n" for t, p in ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5))]
    head = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
    path = write(tmp_path, "v.csv", head + "".join(rows) + "9,bad,1\n")
    assert columns(load_trace(path, num_requests=2)) == ([0.0, 1.0], [1, 2], [1, 1])
    assert columns(load_trace(path, window_s=2.5))[0] == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="line 7: num_prefill_tokens 'bad'"):
        load_trace(path)
    back = write(tmp_path, "b.csv", head + "".join([rows[1], rows[0], *rows[2:]]))
    assert columns(load_trace(back, num_requests=2)) == ([0.0, 1.0], [1, 2], [1, 1])
    np.testing.assert_array_equal(load_trace(back).arrival_time, [0, 1, 2, 3, 4])
