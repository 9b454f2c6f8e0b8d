"""The pool timeline of a disaggregated run (sim/app/reports/pool_timeline.py): its rows,
bars and request paths for a tiny 1P1D run whose times are computed by hand, the bounds
(first requests, bars a row, engines), the figure's traces, and its place in the run
report (aggregated runs' reports keep their three figures; the step timeline draws each
engine's KV usage over its own pool's blocks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.app.reports import pool_timeline as pt
from sim.app.reports.report import report_figures, report_parts, timeline_figure, write_report
from sim.app.reports.run_dir import RunData, load_runs
from sim.app.runs.run_files import write_run
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from tests.test_browser import ARTIFACTS, CHROMIUM, assert_rendered, open_in_chromium
from tests.test_chrome_trace import (
    BANDWIDTH,
    KV_BYTES,
    LATENCY,
    ONE_REMOTE_ONE_LOCAL,
    STEP,
    heterogeneous_run,
    pool_peaks,
    tiny_disagg,
)

#: ONE_REMOTE_ONE_LOCAL's request 0: prefilled in [0, S], its KV landed at S + latency
#: + bytes / bandwidth, then one admission step and two decode steps.
LANDED = STEP + LATENCY + 1000 * KV_BYTES / BANDWIDTH


def run_dir(tmp_path: Path, rows: str = ONE_REMOTE_ONE_LOCAL, disagg: str = "1P1D"
            ) -> RunData:
    prep, result = tiny_disagg(tmp_path, rows, disagg)
    write_run(tmp_path / "run", prep, result)
    return load_runs([tmp_path / "run"])[0]


def phases(path: pt.RequestPath) -> list[tuple[str, float, float, int, int]]:
    return [(p.name, p.start, p.end, p.row, p.row_to) for p in path.phases]


def test_rows_bars_and_paths_of_a_tiny_run(tmp_path: Path) -> None:
    tl = pt.pool_timeline(run_dir(tmp_path))
    assert tl.rows == ("prefill 0", "decode 0")
    # the window: first arrival to last finish (request 1, local: 0.3 s + two steps)
    assert tl.window == pytest.approx((0.0, 0.3 + 2 * STEP), abs=1e-12)
    assert tl.cut is None and tl.num_finished == 2
    pre, dec = tl.bars
    assert pre.kind == ("prefill",) and pre.start.tolist() == [0.0]
    assert pre.duration.tolist() == pytest.approx([STEP])
    # decode engine: the admission step (1 prompt token recomputed), two decode steps in
    # one steps.csv row, then the local request's prefill and decode
    assert dec.kind == ("prefill", "decode", "prefill", "decode")
    assert dec.start.tolist() == pytest.approx([LANDED, LANDED + STEP, 0.3, 0.3 + STEP],
                                               abs=1e-12)
    assert dec.duration.tolist() == pytest.approx([STEP, 2 * STEP, STEP, STEP], abs=1e-12)
    assert dec.num_steps.tolist() == [1, 2, 1, 1]
    assert dec.num_prefill_tokens.tolist() == [1, 0, 16, 0]
    a, b = tl.paths
    assert (a.label, a.request_id, b.label, b.request_id) == ("A", "0", "B", "1")
    expected = [("prefill queued", 0.0, 0.0, 0, 0), ("prefill", 0.0, STEP, 0, 0),
                ("kv wait", STEP, STEP, 0, 0), ("kv transfer", STEP, LANDED, 0, 1),
                ("decode admission", LANDED, LANDED + STEP, 1, 1),
                ("decode", LANDED + STEP, LANDED + 3 * STEP, 1, 1)]
    assert phases(a) == [(n, pytest.approx(t0, abs=1e-12), pytest.approx(t1, abs=1e-12),
                          r0, r1) for n, t0, t1, r0, r1 in expected]
    assert phases(b) == [(n, pytest.approx(t0, abs=1e-12), pytest.approx(t1, abs=1e-12),
                          1, 1) for n, t0, t1 in (("queued", 0.3, 0.3),
                                                  ("prefill", 0.3, 0.3 + STEP),
                                                  ("decode", 0.3 + STEP, 0.3 + 2 * STEP))]


def test_first_requests_only(tmp_path: Path) -> None:
    tl = pt.pool_timeline(run_dir(tmp_path), max_requests=1)
    assert [p.request_id for p in tl.paths] == ["0"]
    assert tl.window == pytest.approx((0.0, LANDED + 3 * STEP), abs=1e-12)
    assert [len(b.kind) for b in tl.bars] == [1, 2]  # the local request's steps are later


def test_window_cut_at_the_bars_a_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                      ) -> None:
    monkeypatch.setattr(pt, "MAX_BARS_PER_ROW", 1)
    tl = pt.pool_timeline(run_dir(tmp_path))
    # the decode row's second bar starts at LANDED + S: the window and paths end there
    end = LANDED + STEP
    assert tl.window == pytest.approx((0.0, end), abs=1e-12)
    assert tl.cut == f"cut at {end:.3f} s (at most 1 steps a row)"
    assert [len(b.kind) for b in tl.bars] == [1, 1]
    a, b = tl.paths
    assert [p.name for p in a.phases][-2:] == ["decode admission", "decode"]
    assert a.phases[-1].start == a.phases[-1].end == pytest.approx(end, abs=1e-12)
    assert b.phases == ()  # arrives after the cut


def test_large_pools_draw_the_engines_the_requests_reach(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 2P2D, round robin: request 0 goes to prefill 0 and decode 0; request 1, kept
    # local, to decode 1.
    monkeypatch.setattr(pt, "MAX_ROWS", 3)
    run = run_dir(tmp_path, disagg="2P2D")
    assert pt.pool_timeline(run).rows == ("prefill 0", "decode 0", "decode 1")
    tl = pt.pool_timeline(run, max_requests=1)
    assert tl.rows == ("prefill 0", "decode 0")
    assert tl.cut == "only the 2 of 4 engines these requests reach"
    monkeypatch.setattr(pt, "MAX_ROWS", 4)
    assert pt.pool_timeline(run).rows == ("prefill 0", "prefill 1", "decode 0", "decode 1")


def test_figure_holds_the_bars_and_paths(tmp_path: Path) -> None:
    run = run_dir(tmp_path)
    fig = pt.pool_timeline_figure(run)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert list(bars) == ["prefill step", "decode step"]  # no mixed step: no trace
    # bars sit above each row's tick: row 0 is prefill 0, row 1 decode 0
    assert np.allclose(bars["prefill step"].base, [0.0, LANDED, 0.3], atol=1e-12)
    assert np.allclose(bars["prefill step"].y, np.array([0, 1, 1]) + pt.BAR_CENTRE)
    assert np.allclose(bars["decode step"].x, [2 * STEP, STEP], atol=1e-12)
    assert list(fig.layout.yaxis.ticktext) == ["prefill 0", "decode 0"]
    # request A's transfer: from the prefill row at S to the decode row at LANDED, in
    # its lane (the first, at LANES[0] below each row's tick)
    transfer = [t for t in fig.data if t.type == "scatter" and t.mode == "lines"
                and t.legendgroup == "A = request 0" and t.line.dash is None
                and t.line.width == 2]
    assert len(transfer) == 1
    assert transfer[0].x[:2] == pytest.approx((STEP, LANDED), abs=1e-12)
    assert transfer[0].y[:2] == pytest.approx((pt.LANES[0], 1 + pt.LANES[0]))
    assert "the first 2 of 2 finished requests" in fig.layout.title.text


def test_report_adds_the_figure_to_disaggregated_runs_only(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    disagg = run_dir(tmp_path / "d")
    prep = prepare(RunConfig(num_requests=5, step_time=STEP))
    write_run(tmp_path / "agg", prep, simulate_prepared(prep))
    agg = load_runs([tmp_path / "agg"])[0]
    assert len(report_figures([agg])) == 3
    assert len(report_figures([agg, disagg])) == 4
    parts = report_parts([agg, disagg])
    assert [p for p in parts if isinstance(p, str) and "Prefill and decode" in p] == [
        f"<h2>Prefill and decode pools: {disagg.name}</h2>"]


def test_report_draws_each_engines_kv_usage_over_its_pools_blocks(tmp_path: Path) -> None:
    run = heterogeneous_run(tmp_path)
    peaks = pool_peaks(run)
    fig = timeline_figure(load_runs([run]))
    # the KV cache usage row is the timeline's third: its traces are on y axis 3
    kv = {t.name.rsplit(" ", 2)[-2]: list(t.y) for t in fig.data if t.yaxis == "y3"}
    # a point a steps.csv row: prefill 0 (one step); decode 0 (the admission step, then
    # the two decode steps' row)
    assert kv == {"prefill": [pytest.approx(peaks["prefill"], rel=1e-12)],
                  "decode": [pytest.approx(peaks["decode"], rel=1e-12)] * 2}


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install -y "
                    "chromium; .ci/run does this)")
def test_report_of_a_disaggregated_run_renders(tmp_path: Path) -> None:
    prep = prepare(RunConfig(num_requests=60, step_time=0.01, disagg="2P2D",
                             kv_link="tcp"))
    write_run(tmp_path / "run", prep, simulate_prepared(prep))
    page = tmp_path / "report.html"
    write_report([tmp_path / "run"], page)
    probe = open_in_chromium(page, ARTIFACTS / "report-disagg.png", tmp_path)
    assert_rendered(probe, 4)
