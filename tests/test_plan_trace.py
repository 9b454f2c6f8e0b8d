"""``servesim plan --arrival trace``: probes that time-scale a trace's own arrivals
(sim/app/runs/load_search.py with_load, TraceTiming), the plan under that timing, and
the report giving the answer under both timings (sim/app/reports/trace_timing.py), on a
hand-built trace with a mid-trace burst that Poisson re-timing smooths away."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.load_search import trace_timing, with_load
from sim.app.runs.runner import RunConfig, prepare

runner = CliRunner()

#: A steady 1 req/s for 100 s, plus 40 requests in [50, 60) s: the busiest tenth of the
#: 99 s span, [49.5, 59.4) s, holds 10 steady and 38 burst requests.
STEADY = np.arange(100.0)
BURST = 50.0 + 0.25 * np.arange(40)
TIMES = np.sort(np.concatenate([STEADY, BURST]))
PEAK_RATIO = 48 * 10 / 140  # busiest tenth's requests x 10 / all
MEAN_RATE = 139 / 99  # (n - 1) / span

#: One replica: step time 0.01 s, 8 sequences, 64-token prompts and 20-token outputs.
PLAN = ["--step-time", "0.01", "--max-num-seqs", "8", "--slo-ttft", "1",
        "--num-requests", "100", "--workers", "1"]


def write_trace(path: Path, times: np.ndarray = TIMES) -> Path:
    path.write_text("arrival_time,num_prompt_tokens,output_len\n"
                    + "".join(f"{t},64,20\n" for t in times))
    return path


def test_trace_timing_is_the_traces_own_rate_gaps_and_peak(tmp_path: Path) -> None:
    t = trace_timing(RunConfig(trace=str(write_trace(tmp_path / "b.csv")), num_requests=5))
    assert t is not None and t.num_requests == 140 and t.span_s == 99.0
    gaps = np.diff(TIMES)
    assert t.mean_rate_rps == pytest.approx(MEAN_RATE)
    assert t.gap_cv == pytest.approx(gaps.std() / gaps.mean())
    assert t.peak_ratio == pytest.approx(PEAK_RATIO)
    # A window keeps the first 20 s: 20 requests 1 s apart, a steady rate.
    w = trace_timing(RunConfig(trace=str(write_trace(tmp_path / "b.csv")), window=20.0))
    assert w is not None and (w.num_requests, w.mean_rate_rps, w.gap_cv, w.peak_ratio) == (
        20, 1.0, 0.0, 1.0)
    # Arrivals all at one instant cannot be time-scaled.
    assert trace_timing(RunConfig(trace=str(write_trace(tmp_path / "z.csv",
                                                        np.zeros(5))))) is None


def test_a_trace_timed_probe_replays_the_whole_trace_sped_up_to_the_rate(
        tmp_path: Path) -> None:
    cfg = RunConfig(trace=str(write_trace(tmp_path / "b.csv")), num_requests=5,
                    step_time=0.01)
    at = with_load(cfg, "rate", 7.0, 2, trace_rate_rps=MEAN_RATE)
    assert (at.time_scale, at.rate, at.arrival, at.num_requests, at.trace_sample,
            at.seed) == (7.0 / MEAN_RATE, None, None, None, False, 2)
    arrivals = np.asarray(prepare(at).workload.arrival_time)
    np.testing.assert_allclose(arrivals, TIMES / (7.0 / MEAN_RATE))  # in order, scaled
    assert (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) == pytest.approx(7.0)


@pytest.mark.slow
def test_poisson_plan_shows_what_the_traces_own_timing_needs(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(app, ["plan", "--trace", str(write_trace(tmp_path / "b.csv")),
                              *PLAN, "--target-rate", "60", "--seeds", "0",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    plan = json.loads((out / "plan.json").read_text())
    # By hand: a replica turns over 8 slots every 20 steps of 0.01 s, 40 req/s at most,
    # so 60 req/s needs 2.
    assert plan["arrival"] == "poisson" and plan["replicas"] == 2
    assert plan["trace_timing"]["peak_ratio"] == pytest.approx(PEAK_RATIO)
    other = plan["other_timing"]
    # The burst sped up to 60 req/s arrives at 206 req/s for 10 s of trace time: 2 and 3
    # replicas (80, 120 req/s) fall behind by more than the 1 s SLO; 4 absorb it.
    assert other["arrival"] == "trace" and other["replicas"] == 4
    assert [(c["replicas"], c["passes"]) for c in other["checks"]] == [
        (2, False), (3, False), (4, True)]
    text = " ".join(res.output.split())
    assert "The trace's own timing says 4 replicas (4 GPUs), not 2" in text
    assert f"busiest tenth arrives at {PEAK_RATIO:.2f}x its mean rate" in text
    assert "--arrival trace" in text
    md = (out / "capacity.md").read_text()
    assert "## The trace's own timing against Poisson re-timing" in md
    assert "(Poisson: 1)" in md


@pytest.mark.slow
def test_trace_timed_plan_on_one_seed_shows_what_poisson_says(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(app, ["plan", "--trace", str(write_trace(tmp_path / "b.csv")),
                              *PLAN, "--target-rate", "60", "--seeds", "0,1",
                              "--arrival", "trace", "--out", str(out)])
    assert res.exit_code == 0, res.output
    plan = json.loads((out / "plan.json").read_text())
    assert plan["arrival"] == "trace" and plan["replicas"] == 4
    (search,) = plan["configs"][0]["searches"]  # nothing random: the first seed only
    assert search["seed"] == 0
    assert [p["load"] for p in search["probes"][:3]] == [1.0, 2.0, 4.0]
    other = plan["other_timing"]
    assert other["arrival"] == "poisson" and other["replicas"] == 2
    assert all(len(c["probes"]) == 2 for c in other["checks"])  # re-timed: every seed
    text = " ".join(res.output.split())
    assert "Poisson re-timing says 2 replicas (2 GPUs), not 4" in text
    assert "the whole trace (140 requests) per probe, in order" in text


@pytest.mark.parametrize(("args", "word"), [
    (["--arrival", "trace"], "--arrival trace time-scales a trace's own arrivals: give "
                             "--trace"),
    (["--arrival", "gamma", "--trace", "T"], "arrival must be one of poisson, trace"),
    (["--arrival", "trace", "--trace", "T", "--load", "concurrency",
      "--target-concurrency", "4"], "--arrival trace times open-loop arrivals"),
    (["--arrival", "trace", "--trace", "Z"], "has fewer than two at different times"),
])
def test_cli_plan_arrival_bad_input(tmp_path: Path, args: list[str], word: str) -> None:
    files = {"T": str(write_trace(tmp_path / "b.csv")),
             "Z": str(write_trace(tmp_path / "z.csv", np.zeros(5)))}
    out = tmp_path / "plan"
    res = runner.invoke(app, ["plan", "--slo-ttft", "1", "--num-requests", "10",
                              "--out", str(out), *[files.get(a, a) for a in args]])
    assert res.exit_code == 1 and word in " ".join(res.output.split()), res.output
    assert not out.exists()


def test_options_a_trace_timed_plan_does_not_use_are_named(tmp_path: Path) -> None:
    """--num-requests and --check-requests shape re-timed probes; a plan on the trace's
    own timing replays all 140 requests, and says it ignores them."""
    res = runner.invoke(app, ["plan", "--trace", str(write_trace(tmp_path / "b.csv")),
                              *PLAN, "--target-rate", "3", "--arrival", "trace",
                              "--check-requests", "50", "--out", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert warned == ["warning: --num-requests, --check-requests shape re-timed probes "
                      "only: --arrival trace replays the whole trace in order (cut it with "
                      "--window)"]
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["trace_timing"][
        "num_requests"] == 140
