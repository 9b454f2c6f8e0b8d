"""chrome_trace.json of a disaggregated run (sim/app/runs/chrome_trace.py): a process per
engine named by its pool, the TTFT split's phases on each engine and a "KV link"
process with one event per transfer, every time computed by hand for a 1P1D run with a
constant step time; each engine's KV usage over its own pool's blocks when the pools'
engines differ. (The aggregated layout's tests are in tests/test_outputs.py.)"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.chrome_trace import chrome_trace
from sim.app.runs.extra_outputs import Extras
from sim.app.runs.run_files import write_run
from sim.app.runs.runner import Prepared, RunConfig, prepare, simulate_prepared
from sim.simulate import SimResult
from tests.test_outputs import check_trace_events

#: The tiny runs' figures: a 10 ms step; the link's latency (100 us) and bandwidth
#: (--kv-link-gbps 8: 1e9 B/s); llama-3.1-8b's KV bytes a token in bf16 (32 layers x
#: 8 KV heads x 128 x (K, V) x 2 B). A prompt of 1000 tokens is 131,072,000 B.
STEP = 0.01
LATENCY = 100e-6
BANDWIDTH = 1e9
KV_BYTES = 32 * 8 * 128 * 2 * 2


def tiny_disagg(tmp_path: Path, rows: str, disagg: str = "1P1D"
                ) -> tuple[Prepared, SimResult]:
    """The trace ``rows`` (arrival_time,num_prompt_tokens,output_len lines) through
    ``disagg`` (round-robin routers) with a STEP step, the link above, prompts under
    100 tokens kept local."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time,num_prompt_tokens,output_len\n" + rows)
    prep = prepare(RunConfig(trace=str(trace), step_time=STEP, disagg=disagg,
                             kv_link_gbps=8, kv_link_latency_us=LATENCY * 1e6,
                             disagg_min_prompt_tokens=100, num_gpu_blocks=200,
                             max_model_len=2048))
    return prep, simulate_prepared(prep)


#: Request 0 (1000 tokens, 3 out) alone through 1P1D; request 1 (16 tokens, 2 out) kept
#: local at 0.3 s.
ONE_REMOTE_ONE_LOCAL = "0,1000,3\n0.3,16,2\n"


def us(t_s: float) -> int:
    return round(t_s * 1e6)


def trace_of(prep: Prepared, result: SimResult) -> dict[str, Any]:
    assert prep.pools is not None
    return chrome_trace(result.request_table, result.step_table,
                        {pool: e.num_gpu_blocks for pool, e in prep.pools.items()})


def events(x: dict[tuple[int, int], list[dict[str, Any]]], pid: int, tid: int
           ) -> list[tuple[str, int, int]]:
    return [(e["name"], e["ts"], e["dur"]) for e in x[(pid, tid)]]


def test_one_request_through_1p1d_to_the_microsecond(tmp_path: Path) -> None:
    doc = trace_of(*tiny_disagg(tmp_path, ONE_REMOTE_ONE_LOCAL))
    x = check_trace_events(doc)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {1: "prefill 0", 2: "decode 0", 3: "KV link"}
    # Prefill [0, S]; the KV leaves at S and lands latency + bytes / bandwidth later.
    landed = STEP + LATENCY + 1000 * KV_BYTES / BANDWIDTH
    assert us(landed) == 141_172
    assert events(x, 1, 0) == [("prefill", 0, us(STEP))]
    assert events(x, 1, 1) == [
        ("request 0", 0, us(landed)), ("prefill queued", 0, 0), ("prefill", 0, us(STEP)),
        ("kv wait", us(STEP), 0), ("kv transfer", us(STEP), us(landed - STEP))]
    assert events(x, 3, 1) == [("request 0", us(STEP), us(landed - STEP))]
    link = x[(3, 1)][0]["args"]
    assert (link["from"], link["to"], link["num_prompt_tokens"]) == ("prefill 0", "decode 0",
                                                                     1000)
    # Decode: the step recomputing the prompt's last token samples the first token; two
    # decode steps (one steps.csv row) follow. Request 1, kept local, is queued 0 s,
    # prefilled and decoded on the decode engine.
    assert events(x, 2, 0) == [
        ("prefill", us(landed), us(STEP)), ("decode", us(landed + STEP), us(2 * STEP)),
        ("prefill", us(0.3), us(STEP)), ("decode", us(0.3 + STEP), us(STEP))]
    assert x[(2, 0)][1]["args"]["num_steps"] == 2
    assert events(x, 2, 1) == [
        ("request 0", us(landed), us(3 * STEP)),
        ("decode admission", us(landed), us(STEP)),
        ("decode", us(landed + STEP), us(2 * STEP)),
        ("request 1", us(0.3), us(2 * STEP)), ("queued", us(0.3), 0),
        ("prefill", us(0.3), us(STEP)), ("decode", us(0.3 + STEP), us(STEP))]
    assert x[(2, 1)][0]["args"]["prefill_engine"] == "prefill 0"
    assert x[(2, 1)][3]["args"]["prefill_engine"] == "local"
    assert doc["otherData"]["request_spans"] == 2
    assert doc["otherData"]["transfer_events"] == 1


def test_two_transfers_share_the_link_in_two_threads(tmp_path: Path) -> None:
    # Request 0 (1000 tokens) is prefilled in [0, S]; request 1 (500 tokens, at S/2)
    # queues until S and is prefilled in [S, 2S]. Transfer 0 is alone on the link from
    # S + latency (1e7 B moved by 2S + latency), then both share it at half the
    # bandwidth: transfer 1 lands after 2 x its bytes / bandwidth, transfer 0 has the
    # link alone for its rest.
    doc = trace_of(*tiny_disagg(tmp_path, "0,1000,2\n0.005,500,2\n"))
    x = check_trace_events(doc)
    b0, b1 = 1000 * KV_BYTES, 500 * KV_BYTES
    landed1 = 2 * STEP + LATENCY + 2 * b1 / BANDWIDTH
    landed0 = landed1 + (b0 - STEP * BANDWIDTH - b1) / BANDWIDTH
    assert (us(landed1), us(landed0)) == (151_172, 206_708)
    # overlapping transfers: one thread each
    assert events(x, 3, 1) == [("request 0", us(STEP), us(landed0 - STEP))]
    assert events(x, 3, 2) == [("request 1", us(2 * STEP), us(landed1 - 2 * STEP))]
    assert events(x, 1, 2) == [
        ("request 1", us(0.005), us(landed1 - 0.005)),
        ("prefill queued", us(0.005), us(STEP - 0.005)), ("prefill", us(STEP), us(STEP)),
        ("kv wait", us(2 * STEP), 0), ("kv transfer", us(2 * STEP), us(landed1 - 2 * STEP))]
    # request 1 lands first, so its decode span comes first; the spans do not overlap
    assert events(x, 2, 1) == [
        ("request 1", us(landed1), us(2 * STEP)),
        ("decode admission", us(landed1), us(STEP)), ("decode", us(landed1 + STEP), us(STEP)),
        ("request 0", us(landed0), us(2 * STEP)),
        ("decode admission", us(landed0), us(STEP)), ("decode", us(landed0 + STEP), us(STEP))]


def test_cli_writes_the_disaggregated_trace(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--disagg", "2P1D", "--num-requests", "30",
                                   "--step-time", "0.01", "--chrome-trace", "--out",
                                   str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "chrome_trace.json").read_text())
    x = check_trace_events(doc)
    names = [e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["prefill 0", "prefill 1", "decode 0", "KV link"]
    transfers = [e for (pid, _), ev in x.items() if pid == 4 for e in ev]
    assert len(transfers) == doc["otherData"]["transfer_events"] == 30


#: A 1000-token prompt's KV: ceil(1000 / 16) = 63 blocks, on the prefill engine (1000
#: tokens and the sampled one) and on the decode engine (1000 + 3 - 1 tokens cached).
PROMPT_BLOCKS = 63


def heterogeneous_run(tmp_path: Path) -> Path:
    """Request 0 of ONE_REMOTE_ONE_LOCAL alone through 1P1D with the prefill pool on TP 2
    (more KV blocks per engine than the run's, the decode pool's), written with its
    chrome trace; the run directory."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time,num_prompt_tokens,output_len\n0,1000,3\n")
    prep = prepare(RunConfig(trace=str(trace), step_time=STEP, disagg="1P1D",
                             prefill_tensor_parallel_size=2, max_model_len=2048))
    write_run(tmp_path / "run", prep, simulate_prepared(prep),
              extras=Extras(chrome_trace=True))
    return tmp_path / "run"


def pool_peaks(run: Path) -> dict[str, float]:
    """Each pool's peak KV usage computed by hand: PROMPT_BLOCKS (steps.csv's
    kv_blocks_used, checked) over the pool's usable blocks, its num_gpu_blocks in
    summary.json less the null block."""
    summary = json.loads((run / "summary.json").read_text())
    rows = list(csv.DictReader((run / "steps.csv").open()))
    out = {}
    for pool in ("prefill", "decode"):
        assert {int(r["kv_blocks_used"]) for r in rows if r["pool"] == pool} == {
            PROMPT_BLOCKS}
        blocks = summary["disagg"][pool]["num_gpu_blocks"]
        out[pool] = PROMPT_BLOCKS / (blocks - 1)
        assert summary["disagg"][pool]["kv_cache"]["peak_usage"] == pytest.approx(
            out[pool], rel=1e-12)
    # the pools differ: the prefill engine's usage over the run's blocks would be wrong
    assert summary["disagg"]["decode"]["num_gpu_blocks"] == summary["kv_cache"][
        "num_gpu_blocks"] < summary["disagg"]["prefill"]["num_gpu_blocks"]
    return out


def test_kv_usage_of_each_engine_is_over_its_pools_blocks(tmp_path: Path) -> None:
    run = heterogeneous_run(tmp_path)
    peaks = pool_peaks(run)
    doc = json.loads((run / "chrome_trace.json").read_text())
    check_trace_events(doc)
    usage: dict[int, list[float]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "C" and e["name"] == "kv_cache_usage_perc":
            usage.setdefault(e["pid"], []).append(e["args"]["kv_cache_usage_perc"])
    # a point a step: pid 1, prefill 0 (one step); pid 2, decode 0 (the admission step
    # and two decode steps)
    assert usage == {1: [pytest.approx(peaks["prefill"], rel=1e-12)],
                     2: [pytest.approx(peaks["decode"], rel=1e-12)] * 3}


def test_disaggregated_trace_needs_blocks_per_pool(tmp_path: Path) -> None:
    prep, result = tiny_disagg(tmp_path, ONE_REMOTE_ONE_LOCAL)
    with pytest.raises(TypeError, match="per pool"):
        chrome_trace(result.request_table, result.step_table, prep.num_gpu_blocks)
