"""The Pareto frontier of output tokens/s per GPU against per user: exactly the points
no other beats on both (a hand-built grid with ties and duplicates), the sweep's
frontier.csv and the labelled figure in sweep.html."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.pareto import PER_GPU, PER_USER, frontier_frame, pareto_frontier

runner = CliRunner()


def test_frontier_is_exactly_the_non_dominated_points() -> None:
    # (per-user speed, per-GPU throughput), both better higher:
    pts = [
        (10, 100),  # 0 frontier: the most per GPU
        (20, 80),   # 1 frontier
        (20, 60),   # 2 dominated by 1 (same x, lower y)
        (30, 80),   # 3 frontier: dominates 1 (same y, higher x) -> 1 is dominated
        (40, 50),   # 4 frontier
        (40, 50),   # 5 duplicate of 4: neither dominates the other, both kept
        (35, 40),   # 6 dominated by 4
        (50, 10),   # 7 frontier: the fastest per user
        (5, 100),   # 8 dominated by 0 (same y, lower x)
        (math.nan, 500),  # 9 no TPOT: never on it, dominates nothing
    ]
    x, y = zip(*pts, strict=True)
    assert pareto_frontier(x, y) == [0, 3, 4, 5, 7]
    # Brute force over the definition agrees.
    def dominated(i: int) -> bool:
        return any(a >= x[i] and b >= y[i] and (a > x[i] or b > y[i])
                   for j, (a, b) in enumerate(pts) if j != i and not math.isnan(a))
    assert [i for i in range(len(pts)) if not math.isnan(x[i]) and not dominated(i)] == \
        [0, 3, 4, 5, 7]
    assert pareto_frontier([], []) == []
    assert pareto_frontier([1.0], [1.0]) == [0]
    with pytest.raises(ValueError, match="one length"):
        pareto_frontier([1.0, 2.0], [1.0])


def test_frontier_frame_of_cells_leaves_saturated_cells_out() -> None:
    agg = pd.DataFrame({
        "cell": [0, 1, 2, 3], "max_num_seqs": [8, 16, 32, 64],
        "output_tokens_per_s": [1000.0, 1800.0, 2400.0, 9000.0], "num_gpus": [1, 1, 2, 1],
        "tpot_mean_s": [0.010, 0.020, 0.025, 0.050], "throughput_rps": [1.0, 2.0, 3.0, 4.0],
        "ttft_p99_s": [0.1, 0.2, 0.3, 9.0], "saturated": [False, False, False, True]})
    front = frontier_frame(agg, ["max_num_seqs"])
    # per user 100, 50, 40 tok/s; per GPU 1000, 1800, 1200: cell 2 (2 GPUs) is dominated
    # by cell 1; cell 3 is saturated.
    assert front["cell"].tolist() == [1, 0]
    assert front[PER_USER].tolist() == pytest.approx([50.0, 100.0])
    assert front[PER_GPU].tolist() == pytest.approx([1800.0, 1000.0])


def test_sweep_writes_the_frontier_table_and_labelled_figure(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_time,num_prompt_tokens,output_len\n"
                    + "".join(f"{i * 0.05},{128 + 32 * (i % 5)},{16 + i % 13}\n"
                              for i in range(120)))
    out = tmp_path / "sweep"
    res = runner.invoke(app, ["sweep", "--trace", str(path), "--max-num-seqs", "1,4,16",
                              "--workers", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    front = pd.read_csv(out / "frontier.csv")
    cells = pd.read_csv(out / "sweep.csv")
    cells = cells[~cells["saturated"]].reset_index(drop=True)  # one seed: rows are cells
    speed = 1 / cells["tpot_mean_s"]
    per_gpu = cells["output_tokens_per_s"] / cells["num_gpus"]
    expected = pareto_frontier(speed.tolist(), per_gpu.tolist())
    assert sorted(front["cell"]) == sorted(cells["cell"].iloc[expected])
    assert len(front) >= 2  # batching trades per-user speed for throughput per GPU
    html = (out / "sweep.html").read_text()
    # Every frontier point is labelled with its varied axis (max_num_seqs, as "seqs=").
    assert "Pareto frontier" in html
    assert all(f'"seqs={v}"' in html for v in front["max_num_seqs"])
