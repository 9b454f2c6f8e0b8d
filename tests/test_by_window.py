"""``servesim plan --by-window``: a trace cut into windows, each window's rate confirmed
as a plan with that --target-rate confirms it; the peak, the mean and the GPU-hours of
following the load against the peak's; the duration's parsing and bad input."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.reports.by_window_page import record, summary_lines
from sim.app.runs.by_window import LoadOverDay, Window, window_spans
from sim.app.runs.durations import parse_duration

runner = CliRunner()
RATES = (40, 150, 90)
"""req/s of the synthetic trace's three 10-second windows."""


def day_trace(tmp_path: Path) -> Path:
    """Evenly spaced arrivals at RATES[k] req/s in window [10 k, 10 (k + 1)) s."""
    rows, k = [], 0
    for w, rate in enumerate(RATES):
        for i in range(rate * 10):
            rows.append(f"{10 * w + i / rate:.6f},64,{8 + k % 9}\n")
            k += 1
    path = tmp_path / "day.csv"
    path.write_text("arrival_time,num_prompt_tokens,output_len\n" + "".join(rows))
    return path


def plan(tmp_path: Path, out: str, *args: str) -> dict[str, object]:
    # A constant 10 ms step and 8 sequences: one replica sustains about 60 req/s.
    res = runner.invoke(app, ["plan", "--trace", str(day_trace(tmp_path)), "--num-requests",
                              "60", "--step-time", "0.01", "--max-num-seqs", "8", "--seeds",
                              "0", "--slo-ttft", "0.1", "--start", "8", "--max-probes", "5",
                              "--workers", "1", *args, "--out", str(tmp_path / out)])
    assert res.exit_code == 0, res.output
    data: dict[str, object] = json.loads((tmp_path / out / "plan.json").read_text())
    return data


def test_each_window_needs_what_a_plan_at_its_rate_needs(tmp_path: Path) -> None:
    by_window = plan(tmp_path, "day", "--by-window", "10s")["by_window"]
    assert isinstance(by_window, dict)
    windows = by_window["windows"]
    assert [w["num_requests"] for w in windows] == [r * 10 for r in RATES]
    # the last window runs to the last arrival, 20 + 899 / 90 s: its 900 requests over
    # 9.989 s, not over a whole 10 s
    last_s = 899 / 90
    assert [w["length_s"] for w in windows] == pytest.approx([10, 10, last_s])
    assert [w["rate_rps"] for w in windows] == pytest.approx([40, 150, 900 / last_s])
    single = [plan(tmp_path, f"at{r}", "--target-rate", str(r))["replicas"] for r in RATES]
    assert [w["replicas"] for w in windows] == single == [1, 3, 2]
    # GPU-hours: 1 + 3 replica-windows of 10 s and 2 replicas for the last, against 3
    # replicas over the whole span.
    span_s = 20 + last_s
    following = 10 + 30 + 2 * last_s
    assert by_window["peak_replicas"] == 3
    assert by_window["mean_replicas"] == pytest.approx(following / span_s)
    assert by_window["gpu_hours_following_load"] == pytest.approx(following / 3600)
    assert by_window["gpu_hours_at_peak"] == pytest.approx(3 * span_s / 3600)
    md = (tmp_path / "day" / "capacity.md").read_text()
    assert "## Load over the day" in md and "3 windows of 10 s" in md
    assert "Peak 3 replicas, mean 2.00" in md and "(33% fewer)" in md


def test_a_partial_last_window_counts_over_its_own_span() -> None:
    # 4 req/s for 10 s, then 2 req/s for 3 s: W = 5 s gives 13 / 5 = 2.6 -> 3 windows,
    # the last from 10 s to the last arrival (12.5 s) holding its 6 requests.
    t = np.concatenate([np.arange(40) / 4, 10 + np.arange(6) / 2])
    assert window_spans(t, 5.0) == [(0.0, 5.0, 20), (5.0, 5.0, 20), (10.0, 2.5, 6)]
    # a tail under W / 2 joins the window before it: 12.5 / 4 = 3.1 -> 3 windows
    assert window_spans(t, 4.0) == [(0.0, 4.0, 16), (4.0, 4.0, 16), (8.0, 4.5, 14)]
    assert window_spans(t, 12.5) == [(0.0, 12.5, 46)]  # the whole span: one window
    with pytest.raises(ValueError, match=r"--by-window 13 s is longer than the trace's"):
        window_spans(t, 13.0)


def test_a_window_longer_than_the_trace_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(app, ["plan", "--trace", str(day_trace(tmp_path)), "--num-requests",
                              "10", "--slo-ttft", "1", "--by-window", "1h", "--out", str(out)])
    assert res.exit_code == 1 and "longer than the trace's span" in res.output, res.output
    assert "Traceback" not in res.output and not out.exists()


def test_durations() -> None:
    assert [parse_duration(t, "--by-window", True)
            for t in ("1h", "30m", "900", "2.5s", "1d")] == [
        3600, 1800, 900, 2.5, 86400]
    for bad in ("0", "-1h", "1y", "h", ""):
        with pytest.raises(ValueError, match="--by-window"):
            parse_duration(bad, "--by-window", positive=True)


@pytest.mark.parametrize(("args", "word"), [
    (["--by-window", "1h"], "--by-window cuts a trace into windows"),
    (["--by-window", "10s", "--trace", "TRACE", "--arrival", "trace"], "--arrival poisson"),
    (["--by-window", "0", "--trace", "TRACE"], "--by-window must be a duration > 0"),
    (["--by-window", "1h", "--gpu", "h100-sxm,l40s"], "--by-window plans one GPU type"),
])
def test_by_window_bad_input(tmp_path: Path, args: list[str], word: str) -> None:
    args = [str(day_trace(tmp_path)) if a == "TRACE" else a for a in args]
    out = tmp_path / "plan"
    res = runner.invoke(app, ["plan", "--num-requests", "10", "--slo-ttft", "1",
                              "--out", str(out), *args])
    assert res.exit_code == 1 and word in res.output, res.output
    assert "Traceback" not in res.output and not out.exists()


def test_no_figures_unless_every_window_was_confirmed() -> None:
    windows = [Window(0.0, 10.0, 400, 40.0, 1), Window(10.0, 10.0, 1500, 150.0, None)]
    rec = record(LoadOverDay(10.0, 2, windows, 2))
    assert [rec[k] for k in ("peak_replicas", "mean_replicas", "gpu_hours_following_load",
                             "gpu_hours_at_peak")] == [None] * 4
    assert [w["replicas"] for w in rec["windows"]] == [1, None]
    both = record(LoadOverDay(10.0, 2, [windows[0], dataclasses.replace(windows[1],
                                                                        replicas=3)], 2))
    # 1 then 3 replicas of TP 2 for 10 s each: 80 GPU-seconds, 120 at the peak
    assert (both["peak_replicas"], both["mean_replicas"]) == (3, 2.0)
    assert both["gpu_hours_following_load"] == pytest.approx(80 / 3600)
    assert both["gpu_hours_at_peak"] == pytest.approx(120 / 3600)


def test_a_disaggregated_fleet_is_counted_in_units_and_their_gpus() -> None:
    windows = [Window(0.0, 10.0, 400, 40.0, 1), Window(10.0, 10.0, 1500, 150.0, 3)]
    d = LoadOverDay(10.0, 1, windows, 3, "1P2D unit")  # 3 GPUs a 1P2D unit at TP 1
    # 1 then 3 units of 3 GPUs for 10 s each: 120 GPU-seconds, 180 at the peak
    assert d.gpu_hours_following_load == pytest.approx(120 / 3600)
    assert d.gpu_hours_at_peak == pytest.approx(180 / 3600)
    assert "**Peak 3 1P2D units, mean 2.00**" in summary_lines(d)[1]
