"""HTML reports: self-contained (plotly.js inlined once, nothing fetched), bounded in
size, one comparison table for several runs, and the data reduction that keeps a long run
small (CDF points, time-bucketed step timeline)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.reports.report import (
    CDF_POINTS,
    TIMELINE_POINTS,
    cdf_points,
    kaleido_missing,
    throughput,
    timeline,
    write_report,
)
from sim.app.reports.run_dir import load_run
from sim.app.runs.run_files import write_run
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared

runner = CliRunner()
MAX_BYTES = 10 * 1024 * 1024


def make_run(path: Path, policy: str) -> Path:
    prep = prepare(RunConfig(policy=policy, num_requests=200, step_time=0.01,
                             max_num_seqs=32, num_gpu_blocks=600, max_model_len=8192))
    write_run(path, prep, simulate_prepared(prep))
    return path


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("runs")
    return [make_run(base / "chunked", "chunked"), make_run(base / "static", "static")]


def plotly_js_copies(text: str) -> int:
    from plotly.offline import get_plotlyjs

    return text.count(get_plotlyjs()[:2000])


def test_report_is_self_contained(two_runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    size = write_report(two_runs[:1], out)
    text = out.read_text()
    assert size == out.stat().st_size < MAX_BYTES
    assert plotly_js_copies(text) == 1
    assert not re.search(r"<script[^>]*\bsrc=", text)
    assert not re.search(r"""<link[^>]*href=["']?https?:""", text)
    assert 'id="summary"' in text and 'id="comparison"' not in text
    assert [f"figure-{i}" in text for i in (1, 2, 3, 4)] == [True, True, True, False]


def test_two_runs_overlaid_with_a_comparison_table(two_runs: list[Path],
                                                   tmp_path: Path) -> None:
    out = tmp_path / "cmp.html"
    res = runner.invoke(app, ["report", *map(str, two_runs), "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert plotly_js_copies(text) == 1
    table = text[text.index('id="comparison"'):]
    table = table[:table.index("</table>")]
    assert "<th>chunked</th><th>static</th>" in table
    assert "TTFT p99 (ms) (lower is better)" in table
    assert " *</td>" in table  # the better run is starred
    # the changed setting is highlighted in the configuration table
    assert '<tr class="diff"><td>policy</td><td>chunked</td><td>static</td></tr>' in text
    assert out.stat().st_size < MAX_BYTES


def test_run_report_flag_writes_report_next_to_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = runner.invoke(app, ["run", "--scenario", "teaching", "--max-num-seqs", "4",
                              "--out", str(out), "--report"])
    assert res.exit_code == 0, res.output
    assert (out / "report.html").stat().st_size < MAX_BYTES
    assert f"wrote {out / 'report.html'}" in res.output.replace("\n", "")


def test_report_of_a_missing_run_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    for arg in (tmp_path / "nope", tmp_path / "half"):
        res = runner.invoke(app, ["report", str(arg), "--out", str(tmp_path / "x.html")])
        assert res.exit_code == 1
        assert res.output.startswith("error: ") and res.output.count("\n") == 1, res.output
    with pytest.raises(FileNotFoundError, match=r"summary\.json not found"):
        load_run(tmp_path / "half")


def _corrupt(run: Path, file: str, text: str) -> None:
    """Overwrite one file of ``run`` (a copy of a good run directory)."""
    (run / file).write_text(text)


@pytest.mark.parametrize(("file", "text", "message"), [
    ("requests.csv", "a,b,c\n1,2,3\n", "requests.csv lacks column(s) first_token_time"),
    ("steps.csv", "a,b\n1,2\n", "steps.csv lacks column(s) start_time"),
    ("requests.csv", "", "requests.csv is empty"),
    ("summary.json", "{}", "summary.json has no 'ttft_s'"),
    ("summary.json", "[]", "summary.json must hold a JSON object, got list"),
    ("summary.json", "{", "summary.json is not valid JSON"),
    ("config.json", "[]", "config.json must hold a JSON object, got list"),
    ("config.json", '{"resolved": [1]}', "'resolved' must be an object"),
    ("config.json", "[" * 100_000 + "]" * 100_000, "config.json is not valid JSON"),
])
def test_corrupt_run_directory_is_one_line(two_runs: list[Path], tmp_path: Path, file: str,
                                           text: str, message: str) -> None:
    import shutil

    run = Path(shutil.copytree(two_runs[0], tmp_path / "bad"))
    _corrupt(run, file, text)
    with pytest.raises(ValueError, match=f"run directory {re.escape(str(run))}: "):
        load_run(run)
    res = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "x.html")])
    assert res.exit_code == 1
    assert res.output.count("\n") == 1 and message in res.output, res.output


def test_summary_values_and_csv_types_are_checked(two_runs: list[Path],
                                                   tmp_path: Path) -> None:
    import json
    import shutil

    run = Path(shutil.copytree(two_runs[0], tmp_path / "bad"))
    summary = json.loads((run / "summary.json").read_text())
    for key, value, message in (
        ("ttft_s", {"mean": 1}, "'ttft_s' has no 'p50'"),
        ("kv_cache", {"num_gpu_blocks": "x"}, "kv_cache.num_gpu_blocks must be a number"),
        ("num_finished", 2.5, "num_finished must be an integer or null"),
        ("throughput", 3, "throughput.requests_per_s must sit in an object"),
    ):
        _corrupt(run, "summary.json", json.dumps({**summary, key: value}))
        with pytest.raises(ValueError, match=re.escape(message)):
            load_run(run)
    _corrupt(run, "summary.json", json.dumps(summary))
    requests = pd.read_csv(run / "requests.csv")
    requests["ttft_s"] = requests["ttft_s"].astype(object)
    requests.loc[0, "ttft_s"] = "soon"
    requests.to_csv(run / "requests.csv", index=False)
    with pytest.raises(ValueError, match=r"requests\.csv: column ttft_s must be numeric"):
        load_run(run)


def test_report_of_a_file_says_it_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    res = runner.invoke(app, ["report", str(tmp_path / "afile"),
                              "--out", str(tmp_path / "x.html")])
    assert res.exit_code == 1
    assert res.output == f"error: run directory {tmp_path / 'afile'} is not a directory\n"


def test_png_without_kaleido_is_one_line(two_runs: list[Path], tmp_path: Path) -> None:
    if kaleido_missing() is None:
        pytest.skip("kaleido is installed here")
    res = runner.invoke(app, ["report", str(two_runs[0]), "--out", str(tmp_path / "r.html"),
                              "--png", str(tmp_path / "r.png")])
    assert res.exit_code == 1
    assert res.output == ("error: PNG export needs kaleido, which is not installed "
                          "(pip install kaleido)\n")
    assert not (tmp_path / "r.html").exists()  # checked before any work
    res = runner.invoke(app, ["diagram", "--scenario", "teaching", "--png", "d.png"])
    assert res.exit_code == 1 and res.output.startswith("error: PNG export needs kaleido")


def test_cdf_points_are_exact_ranks_and_bounded() -> None:
    v = np.random.default_rng(0).exponential(size=50_000)
    x, y = cdf_points(np.append(v, np.nan))
    assert len(x) <= CDF_POINTS
    assert x[0] == v.min() and x[-1] == v.max() and y[-1] == 1.0
    assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)
    xs, ys = cdf_points(np.array([3.0, 1.0, 2.0]))
    assert xs.tolist() == [1.0, 2.0, 3.0] and ys.tolist() == pytest.approx([1 / 3, 2 / 3, 1])


def synthetic_steps(n: int) -> pd.DataFrame:
    d = np.full(n, 0.01)
    d[::2] = 0.03  # even steps last 3x longer
    seqs = np.where(np.arange(n) % 2 == 0, 10, 2)
    return pd.DataFrame({
        "start_time": np.concatenate([[0.0], np.cumsum(d)[:-1]]), "duration_s": d,
        "num_seqs": seqs, "num_prefill_tokens": seqs * 100, "num_decode_tokens": seqs,
        "kv_blocks_used": seqs * 10, "num_waiting": np.zeros(n, dtype=int),
        "slots_useful": seqs, "slots_idle": 0, "slots_empty": 0,
        "num_preempted": (np.arange(n) % 100 == 0).astype(int),
    })


def test_timeline_buckets_long_runs_by_time() -> None:
    steps = synthetic_steps(100_000)
    tl = timeline(steps, num_usable_blocks=1000)
    assert len(tl) == TIMELINE_POINTS
    # 50 step pairs a bucket: duration-weighted batch size (10*3 + 2*1)/4, per-step mean
    # of decode tokens (10 + 2)/2, preemptions summed.
    assert tl["num_seqs"].to_numpy() == pytest.approx(8.0)
    assert tl["num_decode_tokens"].to_numpy() == pytest.approx(6.0)
    assert tl["kv_usage"].to_numpy() == pytest.approx(0.08)
    assert tl["num_preempted"].sum() == steps["num_preempted"].sum()
    short = timeline(steps.head(50), num_usable_blocks=1000)
    assert len(short) == 50 and short["time"].tolist() == steps["start_time"][:50].tolist()


def test_throughput_counts_every_token() -> None:
    steps = synthetic_steps(1000)
    reqs = pd.DataFrame({"first_token_time": [0.5, 1.0], "finish_time": [1.0, 2.0],
                         "status": ["finished", "finished"]})
    th = throughput(steps, reqs, num_buckets=50)
    width = th["time"].iloc[1] - th["time"].iloc[0]
    total = (steps["num_prefill_tokens"] + steps["num_decode_tokens"]).sum()
    assert th["total_tokens_per_s"].sum() * width == pytest.approx(total)
    assert th["output_tokens_per_s"].sum() * width == pytest.approx(
        steps["num_decode_tokens"].sum() + 2)
    assert th["requests_per_s"].sum() * width == pytest.approx(2)


def test_headline_table_says_which_runs_saturated(two_runs: list[Path]) -> None:
    from sim.app.reports.tables import headline_table

    runs = [load_run(p) for p in two_runs]
    runs[1].summary = {**runs[1].summary, "saturated": True}
    runs[0].summary = {k: v for k, v in runs[0].summary.items() if k != "saturated"}
    html = headline_table(runs, "comparison")
    first = html[html.index("<tr><td>"):]
    first = first[:first.index("</tr>")]
    assert first == ("<tr><td>saturated (latency not steady-state)</td><td>no</td>"
                     "<td>YES</td>")


def test_latency_cdfs_are_on_log_axes_in_the_tables_units(two_runs: list[Path]) -> None:
    from sim.app.reports.report import cdf_figure

    runs = [load_run(p) for p in two_runs]
    fig = cdf_figure(runs)
    axes = [fig.layout[f"xaxis{i}" if i > 1 else "xaxis"] for i in (1, 2, 3, 4)]
    assert [a.type for a in axes] == ["log"] * 4
    assert [a.title.text for a in axes] == ["TTFT (ms)", "TPOT (ms)", "E2E latency (s)",
                                            "queueing time (s)"]
    # TTFT and TPOT in ms as in the latency table; the largest point is the run's max
    ttft = fig.data[0]
    assert ttft.name == "chunked" and max(ttft.x) == pytest.approx(
        runs[0].summary["ttft_s"]["max"] * 1000)
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:3] == ["TTFT (ms, log axis)", "TPOT (ms, log axis)",
                          "E2E latency (s, log axis)"]


def test_timeline_counts_start_at_zero_in_whole_numbers(two_runs: list[Path]) -> None:
    from sim.app.reports.report import timeline_figure

    run = load_run(two_runs[0])
    run.steps = run.steps.assign(num_preempted=0)
    fig = timeline_figure([run])
    layout = fig.layout
    # no preemption: the axis is 0 to 1 (autorange would draw -1 to 1), integer ticks
    assert tuple(layout.yaxis5.range) == pytest.approx((0.0, 1.05))
    assert (layout.yaxis5.tickformat, layout.yaxis5.dtick) == (",d", 1)
    for axis in (layout.yaxis, layout.yaxis2, layout.yaxis3, layout.yaxis4):
        assert axis.range[0] == 0
    assert {t.line.shape for t in fig.data} == {"hv"}  # a step's value holds until the next
    assert "(% of blocks)" in layout.annotations[2].text


def test_bucketed_waiting_queue_is_the_peak_of_each_bucket() -> None:
    steps = synthetic_steps(100_000)
    steps["num_waiting"] = (np.arange(100_000) % 100 == 7).astype(int)  # 1 every 100 steps
    tl = timeline(steps, num_usable_blocks=1000)
    # each bucket holds 50 steps; every other bucket holds one step with a waiting request
    assert tl["num_waiting"].to_numpy()[:4].tolist() == [1.0, 0.0, 1.0, 0.0]


def test_usage_fractions_are_not_starred(two_runs: list[Path]) -> None:
    from sim.app.reports.tables import headline_table

    runs = [load_run(p) for p in two_runs]
    runs[0].summary = {**runs[0].summary, "slots": {
        "useful_fraction": 0.5, "idle_fraction": 0.1, "empty_fraction": 0.4}}
    runs[1].summary = {**runs[1].summary, "slots": {
        "useful_fraction": 0.9, "idle_fraction": 0.0, "empty_fraction": 0.1}}
    rows = {row.split("</td>")[0]: row for row in
            headline_table(runs, "comparison").split("<tr><td>")[1:]}
    for label in ("slots useful", "slots held idle", "KV cache peak usage"):
        assert label in rows and "*" not in rows[label]
    assert "TTFT p99 (ms) (lower is better)" in rows


def test_throughput_axes_start_at_zero(two_runs: list[Path]) -> None:
    from sim.app.reports.report import throughput_figure

    fig = throughput_figure([load_run(two_runs[0])])
    assert (fig.layout.yaxis.rangemode, fig.layout.yaxis2.rangemode) == ("tozero", "tozero")
    assert (fig.layout.yaxis.title.text, fig.layout.yaxis2.title.text) == ("tokens/s",
                                                                           "requests/s")


def test_configuration_table_leaves_nested_objects_to_config_json(two_runs: list[Path]) -> None:
    from sim.app.reports.tables import config_table

    run = load_run(two_runs[0])
    assert isinstance(run.config["resolved"]["model_spec"], dict)
    html = config_table([run])
    assert "<td>resolved.num_gpu_blocks</td>" in html
    assert "model_spec" not in html and "kv_plan" not in html
