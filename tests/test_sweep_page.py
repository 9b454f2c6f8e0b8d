"""The sweep page's figures and table (sim/app/reports/sweep_page.py): one colour scale per
metric shared by every heatmap, values equal to three significant figures in one colour,
log scales for latencies, and one unit per quantity (TTFT and TPOT in ms) with the unit
in every header."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sim.app.reports.sweep_page import (
    cells_table,
    colour_range,
    colour_values,
    heatmaps,
    latency_curves,
    sig_text,
)

METRICS = [("throughput_rps", "throughput (req/s)", 1.0), ("ttft_p99_s", "p99 TTFT (ms)", 1e3)]


def make_agg(throughput: list[float], ttft_s: list[float]) -> pd.DataFrame:
    """Eight cells: max_num_seqs 8/16 x rate 2/4 x gpu_memory_utilization 0.8/0.9 (the
    facet), with the given throughput and p99 TTFT in that order."""
    rows = [{"max_num_seqs": m, "rate": r, "gpu_memory_utilization": g}
            for g in (0.8, 0.9) for r in (2.0, 4.0) for m in (8, 16)]
    agg = pd.DataFrame(rows)
    agg["cell"] = range(len(agg))
    agg["throughput_rps"] = throughput
    agg["ttft_p99_s"] = ttft_s
    agg["tpot_p99_s"] = 0.01
    agg["saturated"] = [False] * 7 + [True]
    agg["seeds"] = 1
    return agg


def traces(agg: pd.DataFrame, log_colour: tuple[str, ...] = ()) -> list[list[dict]]:
    """Per facet figure, its heatmap traces as plotly dicts (one per metric)."""
    logs = {"log_colour": log_colour} if log_colour else {}
    figs = heatmaps(agg, "max_num_seqs", "rate", ["gpu_memory_utilization"], METRICS, **logs)
    return [[t.to_plotly_json() for t in fig.data] for _, fig in figs]


def test_every_heatmap_of_a_metric_shares_one_colour_scale() -> None:
    # facet 0.8 spans 1-4 req/s, facet 0.9 spans 5-8: one scale 1-8 for both
    agg = make_agg([1, 2, 3, 4, 5, 6, 7, 8], [0.1] * 8)
    figs = traces(agg)
    assert len(figs) == 2
    for facet in figs:
        assert (facet[0]["zmin"], facet[0]["zmax"]) == (1.0, 8.0)
    assert figs[0][0]["z"].tolist() == [[1, 2], [3, 4]]
    assert figs[1][0]["z"].tolist() == [[5, 6], [7, 8]]


def test_values_equal_to_three_figures_get_one_colour_mid_scale() -> None:
    agg = make_agg([4.01336, 4.01339] * 4, [0.1] * 8)
    z = traces(agg)[0][0]
    assert np.unique(z["z"]).tolist() == [4.01]  # one colour
    # the range is widened about 4.01 to 10% of it: 4.01 sits mid-scale, not at an end
    assert z["zmin"] == pytest.approx(4.01 - 0.2005)
    assert z["zmax"] == pytest.approx(4.01 + 0.2005)
    assert z["text"][0] == ["4.01", "4.01"]
    assert z["customdata"][0].tolist() == [4.01336, 4.01339]  # exact on hover


def test_latency_heatmaps_colour_on_a_log_scale() -> None:
    # one saturated cell at 50 s beside 50-80 ms: on a log scale the fast cells still
    # spread over a fifth of the colour map (log10(80/50) / log10(50000/50) = 0.068 / 3)
    agg = make_agg([1.0] * 8, [0.05, 0.06, 0.07, 0.08, 0.05, 0.06, 0.07, 50.0])
    figs = traces(agg, log_colour=("ttft_p99_s",))
    ttft = figs[1][1]
    assert ttft["zmin"] == pytest.approx(math.log10(50))
    assert ttft["zmax"] == pytest.approx(math.log10(50_000))
    assert ttft["z"][1][1] == pytest.approx(math.log10(50_000))
    assert ttft["text"][1] == ["70.0", "50,000 SAT"]
    assert figs[0][1]["zmin"] == ttft["zmin"]  # shared across facets on the log scale too
    titles = [a["text"] for a in heatmaps(agg, "max_num_seqs", "rate", [], METRICS,
                                          log_colour=("ttft_p99_s",))[0][1].layout.annotations]
    assert titles == ["throughput (req/s)", "p99 TTFT (ms, log colour)"]


def test_colour_range_of_zero_and_missing_values() -> None:
    assert colour_range(np.array([0.0, 0.0]), log=False) == (-0.5, 0.5)
    assert colour_range(np.array([np.nan]), log=False) == (0.0, 1.0)
    assert colour_values(np.array([[123.456, np.nan]]), log=True)[0, 0] == pytest.approx(
        math.log10(123.0))


def test_latency_curves_use_log_axes_in_ms() -> None:
    agg = make_agg([1, 2, 3, 4, 5, 6, 7, 8], [0.05, 0.06, 0.07, 0.08, 0.05, 0.06, 0.07, 50.0])
    fig = latency_curves(agg, "rate", ["max_num_seqs", "gpu_memory_utilization"])
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type == "log"
    assert fig.layout.yaxis.title.text == "p99 TTFT (ms)"
    assert fig.layout.yaxis2.title.text == "p99 TPOT (ms)"
    assert max(max(t.y) for t in fig.data[::2]) == pytest.approx(50_000.0)


def test_cells_table_names_its_units_and_shows_latency_in_ms() -> None:
    agg = make_agg([1, 2, 3, 4, 5, 6, 7, 8], [0.0125] * 8)
    agg["kv_peak_usage"] = 0.5
    table = cells_table(agg, ["max_num_seqs", "rate", "gpu_memory_utilization"])
    assert list(table.columns) == [
        "cell", "max_num_seqs", "rate", "gpu_memory_utilization", "seeds",
        "throughput (req/s)", "TTFT p99 (ms)", "TPOT p99 (ms)", "KV cache peak usage (%)",
        "saturated"]
    assert table["TTFT p99 (ms)"].tolist() == [12.5] * 8
    assert table["KV cache peak usage (%)"].tolist() == [50.0] * 8


@pytest.mark.parametrize(("value", "text"), [
    (52_912.3, "52,900"), (8.9234, "8.92"), (0.012345, "0.0123"), (999.7, "1,000"),
    (-3.14159, "-3.14"), (0.0, "0"), (float("nan"), "-")])
def test_sig_text_keeps_three_figures_without_exponents(value: float, text: str) -> None:
    assert sig_text(value) == text
