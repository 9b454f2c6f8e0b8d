"""The saturation verdict (sim/saturation.py) against queueing theory and the runs a user
meets. With max_num_seqs c, a constant step time and outputs of k tokens, every request is
served in exactly D = k x STEP seconds: Poisson arrivals make an M/D/c queue of capacity
c / D. Below capacity it is never flagged, whatever the seed; above it, it is; a burst
above capacity whose backlog drains before arrivals end is flagged too, as are an
overload a growing batch still absorbs and the Azure conversation trace runs that
overload an engine mid-run. The terminal line says what the rule saw."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from policies.chunked import ChunkedPolicy
from scenarios.arrivals import poisson
from sim.app.cli.main import app
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.saturation import saturation_summary
from sim.simulate import SimResult, simulate
from sim.source import ColumnArrivals

STEP = 0.01
TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
CONV = TRACES / "AzureLLMInferenceTrace_conv.csv"
CODE = TRACES / "AzureLLMInferenceTrace_code.csv"
runner = CliRunner()


def mdc(load: float, n: int, output_len: int, seqs: int, seed: int) -> SimResult:
    """An M/D/c run at ``load`` times its capacity seqs / (output_len STEP)."""
    rate = load * seqs / (output_len * STEP)
    times = poisson(rate, n, np.random.default_rng(seed))
    outs = [output_len] * n
    return simulate(ColumnArrivals(times, [8] * n, outs, outs), policy_factory=ChunkedPolicy,
                    config=SchedulerConfig(max_num_seqs=seqs),
                    cost_model=ConstantCostModel(STEP), num_gpu_blocks=4096)


def run(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    """summary.json and the terminal output of ``servesim run ARGS``."""
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", *args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads((out / "summary.json").read_text()), " ".join(res.output.split())


def shared(path: Path) -> str:
    if not path.exists():
        pytest.skip(f"shared trace {path} not present (expected in ../shared/traces)")
    return str(path)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_md1_at_90_percent_load_is_steady_for_every_seed(seed: int) -> None:
    # Its queue's excursions rise slowly (drift -0.1 per service): under the noise floor.
    summary = mdc(0.9, 3_000, 2, 1, seed).summary
    assert summary["saturated"] is False and summary["latency_steady_state"] is True
    sat = summary["saturation"]
    assert sat["backlog_growth"] <= sat["noise_floor"]
    assert sat["reason"] is not None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_server_near_capacity_is_steady(seed: int) -> None:
    # A plan probe's situation: a steady Poisson rate at 85% of what 8 slots serve.
    assert mdc(0.85, 3_000, 8, 8, seed).summary["saturated"] is False


def test_md1_overload_grows_until_arrivals_end() -> None:
    service, n = 2 * STEP, 3_000
    res = mdc(1.3, n, 2, 1, 0)
    assert res.summary["saturated"] is True and res.summary["latency_steady_state"] is False
    sat = res.summary["saturation"]
    t_last = float(res.requests["arrival_time"].max())
    # Arrivals at 1.3 / D against service at 1 / D: the backlog grows at 0.3 / D and holds
    # n (1 - 1 / 1.3) when arrivals end; served back to back, the last starts near n D.
    assert sat["queue_growth_per_s"] == pytest.approx(0.3 / service, rel=0.2)
    assert sat["backlog_at_end_of_arrivals"] == pytest.approx(n * 0.3 / 1.3, rel=0.1)
    assert sat["growth_window_s"][1] == pytest.approx(t_last, abs=1.0)
    assert sat["drained_s"] == pytest.approx(n * service, rel=0.02)
    first, last = sat["queued_time_trend_s"]
    assert last > first
    assert sat["reason"] is None


def bursty_trace(tmp_path: Path) -> Path:
    """One server (D = 0.04 s): 500 requests every 0.08 s (load 0.5), a burst of 1,000
    every 0.02 s from 40 s (load 2), then 1,000 every 0.1 s from 60 s (load 0.4)."""
    times = ([0.08 * i for i in range(500)] + [40 + 0.02 * k for k in range(1000)]
             + [60 + 0.1 * m for m in range(1000)])
    path = tmp_path / "bursty.csv"
    path.write_text("arrival_time,num_prompt_tokens,output_len\n"
                    + "".join(f"{t:.2f},8,4\n" for t in times))
    return path


def test_a_burst_that_drains_before_arrivals_end_is_saturated(tmp_path: Path) -> None:
    summary, text = run(tmp_path, "--trace", str(bursty_trace(tmp_path)),
                        "--max-num-seqs", "1", "--step-time", str(STEP))
    assert summary["saturated"] is True and summary["latency_steady_state"] is False
    sat = summary["saturation"]
    # Burst request k arrives at 40 + 0.02 k and starts at 40 + 0.04 k: by the last
    # (k = 999, 59.98 s) 500 have started, 500 wait, and request k waited 0.02 k s.
    assert sat["backlog_growth"] == 500
    assert sat["growth_window_s"] == pytest.approx([40.0, 59.98], abs=0.05)
    assert sat["queued_time_trend_s"] == pytest.approx([3.35, 16.67], abs=0.05)
    # The tail's request m starts at 80 + 0.04 m while any wait: m = 332 starts at
    # 93.28 s, before m = 333 arrives (93.3 s), and the queue is empty.
    assert sat["drained_s"] == pytest.approx(93.28, abs=0.01)
    assert sat["backlog_at_end_of_arrivals"] == 0
    assert sat["arrival_window_s"] == pytest.approx([0.0, 159.9])
    assert ("SATURATED: backlog grew by 500 requests from 40.0 s to 60.0 s, drained by "
            "93.3 s") in text


def test_a_closed_loop_never_saturates(tmp_path: Path) -> None:
    # 50 users on 4 slots: 46 always wait, but the queue never grows past the users.
    trace = tmp_path / "fixed.csv"
    trace.write_text("arrival_time,num_prompt_tokens,output_len\n"
                     + "".join(f"{i},8,4\n" for i in range(400)))
    summary, text = run(tmp_path, "--trace", str(trace), "--concurrency", "50",
                        "--max-num-seqs", "4", "--step-time", str(STEP))
    assert summary["saturated"] is False
    # Its 50 first requests arrive as one group (a variance of 50^2, not 50) and wait
    # before any is admitted: a floor of 3 x 50.
    assert summary["saturation"]["noise_floor"] == pytest.approx(150.0)
    assert "no (steady state: largest backlog 50 at 0.0 s, within chance" in text


def test_a_batch_waiting_for_its_admission_is_not_a_backlog() -> None:
    # Static batching admits everyone waiting at once: ten batches of 20 arriving over
    # 7.6 s, each taken whole 9.9 s after its first; the queue empties at every admission.
    arrival = np.repeat(np.arange(10) * 10.0, 20) + np.tile(np.arange(20) * 0.4, 10)
    scheduled = np.floor(arrival / 10) * 10 + 9.9
    out = saturation_summary({"arrival_time": arrival, "first_scheduled_time": scheduled,
                              "finish_time": scheduled + 5.0})
    assert out["saturated"] is False
    assert out["saturation"]["largest_admission"] == 20
    assert out["saturation"]["reason"] == "one admission's worth (20 at once)"


def test_an_overload_a_growing_batch_still_absorbs_is_saturated(tmp_path: Path) -> None:
    # 300 requests at 30 req/s, half again what one H100 serves of the default scenario:
    # in 10 s the batch grows and slows (TPOT p99 142 ms) before any queue builds.
    summary, text = run(tmp_path, "--rate", "30", "--num-requests", "300")
    assert summary["saturated"] is True
    sat = summary["saturation"]
    assert sat["reason"] is not None and sat["in_system"]["growing"] is True
    assert sat["in_system"]["growth"] > sat["in_system"]["noise_floor"]
    assert "requests in the system grew by" in text and "still growing when arrivals ended" in text


def test_a100_conversation_trace_at_1_4x_is_saturated(tmp_path: Path) -> None:
    # The full trace peaks at 3,260 waiting at 1,783 s and drains after arrivals end
    # (TTFT p50 291 s); its first 1,500 requests already show the backlog growing.
    summary, text = run(tmp_path, "--trace", shared(CONV), "--gpu", "a100-40gb",
                        "--max-model-len", "32768", "--gpu-memory-utilization", "0.8",
                        "--time-scale", "1.4", "--num-requests", "1500")
    assert summary["saturated"] is True
    sat = summary["saturation"]
    # The backlog grows inside the arrival window and is still there when arrivals end.
    t0, t1 = sat["arrival_window_s"]
    assert t0 <= sat["growth_window_s"][0] < sat["growth_window_s"][1] <= t1
    assert sat["backlog_growth"] > sat["noise_floor"]
    assert sat["backlog_at_end_of_arrivals"] > 100
    assert "still waiting when arrivals ended" in text


def test_h100_conversation_trace_at_4_5x_is_saturated(tmp_path: Path) -> None:
    summary, _ = run(tmp_path, "--trace", shared(CONV), "--time-scale", "4.5",
                     "--num-requests", "1500")
    assert summary["saturated"] is True
    sat = summary["saturation"]
    t0, t1 = sat["arrival_window_s"]
    assert t0 <= sat["growth_window_s"][0] < sat["growth_window_s"][1] <= t1
    assert sat["backlog_growth"] > sat["noise_floor"] and sat["backlog_at_end_of_arrivals"] > 0


def test_a_few_seconds_of_clustered_trace_arrivals_are_a_burst_not_saturation(
        tmp_path: Path) -> None:
    # The code trace's 56 requests in 2 s at 575 s queue for up to 3 s, then drain.
    summary, text = run(tmp_path, "--trace", shared(CODE), "--num-requests", "2000",
                        "--policy", "continuous")
    assert summary["saturated"] is False
    sat = summary["saturation"]
    assert sat["backlog_growth"] == 56 and sat["share_of_arrivals"] == pytest.approx(0.028)
    assert "a burst: 2.8% of arrivals, under 5%" in text


@pytest.mark.parametrize("policy", ["chunked", "continuous"])
def test_heavy_tailed_outputs_at_three_quarters_load_are_steady(tmp_path: Path,
                                                                policy: str) -> None:
    """The conversation trace's heavy-tailed outputs re-timed at 15 req/s (capacity about
    19.5 req/s: 77% load) swing the requests in the system widely (26 to 156 and back) but
    never pile up: the waiting queue stays under 10 and the count when arrivals end is
    below its first-half peak."""
    summary, _ = run(tmp_path, "--trace", shared(CONV), "--num-requests", "2000", "--rate",
                     "15", "--policy", policy)
    b = summary["saturation"]["in_system"]
    assert summary["saturated"] is False
    assert b["at_end_of_arrivals"] <= b["first_half_peak"]


def test_a_run_that_served_nothing_is_not_judged(tmp_path: Path) -> None:
    # Default prompts are lognormal, median 1,020 tokens, sigma 0.498: one of at most 64
    # tokens lies 5.6 sd below the median (probability about 1e-8), so all 8 are rejected.
    summary, text = run(tmp_path, "--num-requests", "8", "--max-model-len", "64",
                        "--max-num-batched-tokens", "64")
    assert summary["num_finished"] == 0 and summary["saturated"] is False
    assert summary["saturation"]["measured"] is False
    assert "every one was rejected" in text
