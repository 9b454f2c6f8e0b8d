"""Oversampling a re-timed trace past its rows, as vLLM's benchmark datasets do
(vllm/benchmarks/datasets.py maybe_oversample_requests): every row once, then copies
drawn with replacement, numbered on from the rows; a trace replayed with its own
timestamps is not oversampled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from scenarios.build import build_workload
from scenarios.traces import save_trace
from scenarios.workload import Workload
from sim.app.cli.main import app


def _rows() -> Workload:
    return Workload.from_arrays([0.0, 1.0, 2.0], [10, 20, 30], [1, 2, 3])


def test_every_row_then_copies_numbered_on() -> None:
    w = _rows().oversampled(8, np.random.default_rng(0))
    assert list(w.request_id) == [str(i) for i in range(8)]
    prompts = w.num_prompt_tokens.tolist()
    assert sorted(prompts[:3]) == [10, 20, 30] and set(prompts[3:]) <= {10, 20, 30}
    # a copy keeps its row's output length with its prompt
    assert all(o * 10 == p for p, o in zip(prompts, w.output_len.tolist(), strict=True))
    again = _rows().oversampled(8, np.random.default_rng(0))
    assert again == w
    rows = _rows()
    assert rows.oversampled(3, np.random.default_rng(0)) is rows  # enough: unchanged
    assert rows.oversampled(2, np.random.default_rng(0)) is rows  # and never cut


def test_a_copy_id_taken_by_a_row_is_refused() -> None:
    w = Workload.from_arrays([0.0, 1.0], [5, 5], [1, 1], request_id=["3", "a"])
    with pytest.raises(ValueError, match=r"numbers the copies 2\.\.4"):
        w.oversampled(5, np.random.default_rng(0))


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    save_trace(Workload.from_arrays(np.arange(5.0), [10, 20, 30, 40, 50], [5] * 5), path)
    return path


def _build(trace: Path, rate: float | None, sample: bool) -> Workload:
    return build_workload(trace=trace, trace_format=None, scenario=None, arrival=None,
                          rate=rate, burstiness=None, num_requests=12, window_s=None,
                          time_scale=None, max_tokens=None, seed=3, trace_sample=sample)


@pytest.mark.parametrize("sample", [True, False])
def test_a_retimed_trace_is_oversampled(tmp_path: Path, sample: bool) -> None:
    w = _build(_trace(tmp_path), 2.0, sample)
    assert len(w) == 12 and "5 rows oversampled to 12" in w.source
    assert set(w.num_prompt_tokens.tolist()) <= {10, 20, 30, 40, 50}
    assert sorted(w.num_prompt_tokens[:5].tolist()) == [10, 20, 30, 40, 50]


def test_a_replayed_trace_ends_where_it_ends(tmp_path: Path) -> None:
    w = _build(_trace(tmp_path), None, False)
    assert len(w) == 5 and "oversampled" not in w.source


def test_run_says_it_oversampled(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", "--trace", str(_trace(tmp_path)), "--rate", "2",
                                   "--num-requests", "12", "--step-time", "0.01",
                                   "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert "workload: 12 requests" in res.output
    assert "5 rows oversampled to 12" in res.output.replace("\n", "")


def test_the_default_rate_is_the_traces_own_before_oversampling(tmp_path: Path) -> None:
    # 5 rows over 4 s: (5 - 1) / 4 = 1 req/s; the 7 copies keep that span, so measuring
    # after oversampling would give (12 - 1) / 4 = 2.75.
    w = build_workload(trace=_trace(tmp_path), trace_format=None, scenario=None,
                       arrival="poisson", rate=None, burstiness=None, num_requests=12,
                       window_s=None, time_scale=None, max_tokens=None, seed=3)
    assert len(w) == 12 and w.source.endswith("re-timed poisson(1)")
