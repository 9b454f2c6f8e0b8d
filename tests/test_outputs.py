"""The run directory's optional files: bench_result.json in vLLM bench serve's keys and
units (checked against a result vLLM 0.32 wrote, and against figures computed by hand),
chrome_trace.json checked against the Trace Event Format as Perfetto's JSON importer
reads it, and the Parquet tables."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs import chrome_trace as ct
from sim.app.runs.bench_result import max_concurrent_requests
from sim.metrics import REQUEST_COLUMNS, STEP_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
#: `vllm bench serve --save-result --save-detailed --percentile-metrics
#: ttft,tpot,itl,e2el --metric-percentiles 50,90,99` of vLLM 0.32 (benchmarks/data/README).
RECORDED = ROOT / "benchmarks" / "data" / "vllm_serve_cpu_qwen2.5-0.5b-8l.json"
runner = CliRunner()


def run_two(tmp_path: Path, *flags: str) -> Path:
    """Two requests priced 0.5 s a step: request 0 (arrives at 0, 3 output tokens) is
    prefilled in [0, 0.5]; request 1 (arrives at 0.25, 2 tokens) is prefilled with
    request 0's second token in [0.5, 1]; both finish at 1.5. So TTFT 0.5 and 0.75 s,
    TPOT 0.5 s each, ITL 0.5 s (3 gaps), E2E 1.5 and 1.25 s."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time,num_prompt_tokens,output_len\n0,4,3\n0.25,4,2\n")
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--trace", str(trace), "--step-time", "0.5",
                              "--num-gpu-blocks", "10", "--max-model-len", "144",
                              "--out", str(out), *flags])
    assert res.exit_code == 0, res.output
    return out


def test_bench_result_has_vllm_keys(tmp_path: Path) -> None:
    if not RECORDED.exists():
        pytest.skip(f"{RECORDED.name} not in benchmarks/data")
    recorded = set(json.loads(RECORDED.read_text()))
    ours = set(json.loads((run_two(tmp_path, "--bench-result")
                           / "bench_result.json").read_text()))
    server_metadata = {k for k in recorded if k.startswith("server")}  # --metadata
    per_request = {"input_lens", "output_lens", "ttfts", "itls", "start_times",
                   "generated_texts", "errors", "latencies", "queue_times"}
    no_fact = {"max_output_tokens_per_s", "rtfx"}  # token times, audio
    p95 = {f"p95_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")}  # summary.json's too
    assert ours == (recorded - server_metadata - per_request - no_fact) | p95


def test_bench_result_figures_and_units(tmp_path: Path) -> None:
    out = run_two(tmp_path, "--bench-result")
    b = json.loads((out / "bench_result.json").read_text())
    assert (b["completed"], b["failed"], b["num_prompts"]) == (2, 0, 2)
    assert (b["total_input_tokens"], b["total_output_tokens"]) == (8, 5)
    assert b["duration"] == 1.5  # s, first arrival to last finish
    assert b["request_throughput"] == pytest.approx(2 / 1.5)
    assert b["output_throughput"] == pytest.approx(5 / 1.5)
    assert b["total_token_throughput"] == pytest.approx(13 / 1.5)
    assert b["request_goodput"] is None and b["request_rate"] == "inf"
    assert b["max_concurrent_requests"] == 2
    # ms; TTFT {500, 750}: std 125 (population), p99 = 500 + 0.99 * 250.
    assert (b["mean_ttft_ms"], b["median_ttft_ms"], b["std_ttft_ms"]) == (625, 625, 125)
    assert b["p99_ttft_ms"] == pytest.approx(747.5)
    assert (b["mean_tpot_ms"], b["std_tpot_ms"], b["p99_tpot_ms"]) == (500, 0, 500)
    assert (b["mean_itl_ms"], b["median_itl_ms"], b["p99_itl_ms"]) == (500, 500, 500)
    assert b["mean_e2el_ms"] == 1375 and b["p90_e2el_ms"] == pytest.approx(1475)
    summary = json.loads((out / "summary.json").read_text())
    assert b["p95_ttft_ms"] == pytest.approx(summary["ttft_s"]["p95"] * 1000)


def test_bench_result_itl_matches_numpy_on_a_real_run(tmp_path: Path) -> None:
    """ITL statistics from the pooled (value, count) pairs equal numpy's on the
    expanded samples, as vLLM computes them."""
    from sim.app.runs.bench_result import _itl_ms
    from sim.latency_stats import ItlSamples

    v = np.array([0.03, 0.01, 0.02, 0.5])
    c = np.array([3, 5, 1, 1])
    x = np.repeat(v, c)
    got = _itl_ms(ItlSamples(v, c))
    assert got["mean"] == pytest.approx(np.mean(x) * 1000)
    assert got["std"] == pytest.approx(np.std(x) * 1000)
    assert got["median"] == pytest.approx(np.median(x) * 1000)
    assert got["p99"] == pytest.approx(np.percentile(x, 99) * 1000)


def test_max_concurrent_requests_by_whole_seconds() -> None:
    # buckets 0..1, 0..1 and 2..2 (vLLM counts each second a request touches)
    assert max_concurrent_requests(np.array([0.0, 0.5, 2.2]),
                                   np.array([1.2, 1.9, 2.5])) == 2
    assert max_concurrent_requests(np.zeros(0), np.zeros(0)) == 0


def check_trace_events(doc: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """The Trace Event Format as Perfetto's JSON importer reads it: an object with a
    traceEvents list; "M" events name a process or thread; "X" events have integer
    pid/tid and numeric ts, dur >= 0 (microseconds); "C" events have numeric args; the
    "X" events of one thread nest (a later event starts at or after an earlier one's
    end, or lies within it). Returns the X events per (pid, tid)."""
    assert isinstance(doc["traceEvents"], list)
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for ev in doc["traceEvents"]:
        assert ev["ph"] in ("M", "X", "C") and isinstance(ev["name"], str)
        assert isinstance(ev["pid"], int)
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name", "process_sort_index")
            assert set(ev["args"]) <= {"name", "sort_index"} and ev["args"]
            assert ev["name"] != "thread_name" or isinstance(ev["tid"], int)
        elif ev["ph"] == "X":
            assert isinstance(ev["tid"], int) and isinstance(ev["ts"], int)
            assert isinstance(ev["dur"], int) and ev["dur"] >= 0 and ev["ts"] >= 0
            by_thread[(ev["pid"], ev["tid"])].append(ev)
        else:
            assert isinstance(ev["ts"], int) and ev["args"]
            assert all(isinstance(v, int | float) for v in ev["args"].values())
    for events in by_thread.values():
        open_ends: list[int] = []
        for ev in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= ev["ts"]:
                open_ends.pop()
            end = ev["ts"] + ev["dur"]
            assert not open_ends or end <= open_ends[-1], f"{ev} overlaps its parent"
            open_ends.append(end)
    json.dumps(doc, allow_nan=False)  # strict JSON: no NaN or Infinity
    return by_thread


def test_chrome_trace_of_two_requests(tmp_path: Path) -> None:
    doc = json.loads((run_two(tmp_path, "--chrome-trace") / "chrome_trace.json").read_text())
    x = check_trace_events(doc)
    steps = [(e["name"], e["ts"], e["dur"]) for e in x[(1, ct.STEP_TID)]]
    assert steps == [("prefill", 0, 500_000), ("mixed", 500_000, 500_000),
                     ("decode", 1_000_000, 500_000)]
    # overlapping requests get two threads; each span holds queued, prefill, decode
    assert [(e["name"], e["ts"], e["dur"]) for e in x[(1, 2)]] == [
        ("request 1", 250_000, 1_250_000), ("queued", 250_000, 250_000),
        ("prefill", 500_000, 500_000), ("decode", 1_000_000, 500_000)]
    assert x[(1, 1)][0]["name"] == "request 0" and x[(1, 1)][0]["dur"] == 1_500_000
    running = [e["args"]["num_requests_running"] for e in doc["traceEvents"]
               if e["name"] == "num_requests_running"]
    assert running == [1, 2, 2]
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"
             and e["name"] == "process_name"}
    assert names == {"replica 0"}


def test_chrome_trace_of_replicas_is_one_process_each(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--num-requests", "60", "--replicas", "2",
                              "--out", str(out), "--chrome-trace"])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "chrome_trace.json").read_text())
    x = check_trace_events(doc)
    assert {pid for pid, _ in x} == {1, 2}
    spans = [e for ev in x.values() for e in ev if e["name"].startswith("request ")]
    assert len(spans) == 60 and doc["otherData"]["request_spans"] == 60


def synthetic_tables(num_steps: int, num_requests: int) -> tuple[dict[str, Any], ...]:
    """A step table of ``num_steps`` 10 ms steps whose queue peaks once (7 waiting at
    step 1234), and ``num_requests`` finished requests arriving 1 ms apart."""
    t = np.arange(num_steps) * 0.01
    steps: dict[str, Any] = {c: np.zeros(num_steps, dtype=np.int64) for c in STEP_COLUMNS}
    steps.update(start_time=t, duration_s=np.full(num_steps, 0.01),
                 num_seqs=np.ones(num_steps, dtype=np.int64) + np.arange(num_steps) % 2)
    steps["num_waiting"][1234] = 7
    a = np.arange(num_requests) * 0.001
    req: dict[str, Any] = {c: np.zeros(num_requests) for c in REQUEST_COLUMNS}
    req.update(arrival_time=a, first_scheduled_time=a, first_token_time=a + 0.01,
               finish_time=a + 0.05, status=np.full(num_requests, "finished", dtype=object),
               request_id=np.arange(num_requests).astype(str).astype(object))
    return req, steps


def test_chrome_trace_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ct, "MAX_REQUEST_SPANS", 300)
    monkeypatch.setattr(ct, "MAX_STEP_EVENTS", 500)
    req, steps = synthetic_tables(num_steps=9000, num_requests=1000)
    doc = ct.chrome_trace(req, steps, num_gpu_blocks=101)
    x = check_trace_events(doc)
    assert len(x[(1, ct.STEP_TID)]) == 500
    waiting = [e["args"]["num_requests_waiting"] for e in doc["traceEvents"]
               if e["name"] == "num_requests_waiting"]
    assert len(waiting) == ct.COUNTER_POINTS and max(waiting) == 7  # the peak is kept
    spans = [e for ev in x.values() for e in ev if e["name"].startswith("request ")]
    assert len(spans) == 300 and spans[0]["name"] == "request 0"
    # 50 ms spans 1 ms apart: 50 threads carry them
    assert len([k for k in x if k[1] != ct.STEP_TID]) == 50


def test_default_run_writes_no_optional_file(tmp_path: Path) -> None:
    out = run_two(tmp_path)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "requests.csv", "steps.csv", "summary.json"]


def test_optional_files_refused_with_compare(tmp_path: Path) -> None:
    res = runner.invoke(app, ["run", "--compare", "static,chunked", "--num-requests", "5",
                              "--out", str(tmp_path / "c"), "--bench-result"])
    assert res.exit_code == 1 and "without --compare" in res.output


def test_parquet_holds_every_step(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed "
                             "(pip install 'servesim[parquet]')")
    out = run_two(tmp_path, "--parquet")
    req = pq.read_table(out / "requests.parquet").to_pydict()
    assert list(req) == list(REQUEST_COLUMNS)
    assert req["ttft_s"] == [0.5, 0.75] and req["reason"] == [None, None]
    steps = pq.read_table(out / "steps.parquet").to_pydict()
    assert list(steps) == list(STEP_COLUMNS) and steps["num_seqs"] == [1, 2, 2]


def test_parquet_without_pyarrow_is_one_line(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.app.runs import extra_outputs

    real = extra_outputs.importlib.util.find_spec
    monkeypatch.setattr(extra_outputs.importlib.util, "find_spec",
                        lambda name, *a: None if name == "pyarrow" else real(name, *a))
    res = runner.invoke(app, ["run", "--num-requests", "5", "--out", str(tmp_path / "r"),
                              "--parquet"])
    assert res.exit_code == 1 and "pip install 'servesim[parquet]'" in res.output
    assert not (tmp_path / "r").exists()  # refused before simulating
