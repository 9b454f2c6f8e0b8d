"""``servesim run --compare``: cell syntax, one run directory per cell over the same
workload, and the side-by-side table."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.compare import parse_cells


def test_parse_cells() -> None:
    # A user policy keeps its own colon: modifiers are read from the right.
    cells = parse_cells("static, chunked:reserve:swap,policies.chunked:ChunkedPolicy:priority")
    assert [c.policy for c in cells] == ["static", "chunked", "policies.chunked:ChunkedPolicy"]
    assert cells[1].overrides == {"kv_allocation": "reserve", "preemption_mode": "swap"}
    assert cells[2].overrides == {"queue": "priority"}
    assert [c.dir_name for c in cells] == [
        "static", "chunked-reserve-swap", "policies.chunked-ChunkedPolicy-priority"]


@pytest.mark.parametrize(("spec", "message"), [
    ("chunked,,static", "empty cell"),
    ("chunked:paged:reserve", "sets kv_allocation twice"),
    ("reserve", "names no policy"),
    ("chunked,chunked", "same run directory"),
    ("fifo", "unknown policy"),
    ("chunked:nope", "unknown modifier 'nope'; modifiers: paged"),
    ("chunked:reserve:nope", "unknown modifier 'nope'"),
])
def test_bad_cells(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_cells(spec)


def test_compare_writes_one_run_per_cell(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    res = CliRunner().invoke(app, [
        "run", "--num-requests", "60", "--step-time", "0.01", "--max-tokens", "512",
        "--num-gpu-blocks", "400", "--max-model-len", "6384", "--max-num-seqs", "16",
        "--out", str(out),
        "--compare", "static,continuous,chunked,chunked:reserve,chunked:swap",
    ])
    assert res.exit_code == 0, res.output
    dirs = ["static", "continuous", "chunked", "chunked-reserve", "chunked-swap"]
    assert sorted(p.name for p in out.iterdir()) == sorted(dirs)
    requests = {d: pd.read_csv(out / d / "requests.csv") for d in dirs}
    for d in dirs:  # the same workload in every cell
        assert requests[d]["num_prompt_tokens"].equals(requests["static"]["num_prompt_tokens"])
        assert (requests[d]["status"] == "finished").all()
    cfg = json.loads((out / "chunked-reserve" / "config.json").read_text())
    assert (cfg["policy"], cfg["kv_allocation"]) == ("chunked", "reserve")
    thr = {d: json.loads((out / d / "summary.json").read_text())["throughput"]["requests_per_s"]
           for d in dirs}
    assert thr["static"] < thr["continuous"] <= thr["chunked"]
    assert thr["chunked-reserve"] < thr["chunked"]
    for d in ("static", "chunked:reserve", "req/s", "reject"):
        assert d in res.output


def test_compare_bad_cell_is_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["run", "--num-requests", "5", "--compare", "chunked,,x",
                                   "--out", str(tmp_path / "c")])
    assert res.exit_code == 1
    assert "empty cell" in res.output


def test_saturated_cells_are_named_in_the_caption() -> None:
    from rich.console import Console

    from sim.app.runs.compare import compare_table
    from sim.app.runs.runner import RunConfig, prepare, simulate_prepared

    summary = simulate_prepared(prepare(RunConfig(num_requests=40, step_time=0.01))).summary
    cells = parse_cells("chunked,continuous")

    def render(saturated: list[bool]) -> str:
        rows = [(c, {**summary, "saturated": s}) for c, s in zip(cells, saturated, strict=True)]
        console = Console(width=120, record=True)
        console.print(compare_table(rows))
        return " ".join(console.export_text().split())

    text = render([True, False])
    assert "percentiles are not steady-state): chunked" in text
    assert "continuous" not in text[text.index("steady-state"):]
    assert "saturated" not in render([False, False])


def test_latency_pairs_drop_decimals_from_a_thousand() -> None:
    from sim.app.runs.compare import _pair

    assert _pair({"p50": 19.46, "p99": 62.44}, 1, 1) == "19.5/62.4"
    assert _pair({"p50": 570.6, "p99": 1275.1}, 1, 1) == "571/1,275"
    assert _pair({"p50": 0.0881, "p99": 1.478}, 1000, 0) == "88/1,478"
    assert _pair({"p50": None, "p99": 2300.3}, 1, 1) == "-/2,300"


def test_a_compare_directory_holds_one_compare_and_never_a_users_file(tmp_path: Path) -> None:
    """A second compare into the same --out replaces the first's cells and report (the
    directory never shows two workloads' cells side by side); a file servesim did not
    write there is refused before anything runs, and nothing is removed."""
    out = tmp_path / "cmp"
    first = ["run", "--num-requests", "10", "--step-time", "0.01", "--out", str(out)]
    res = CliRunner().invoke(app, [*first, "--compare", "static,continuous,chunked",
                                   "--report"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == [
        "chunked", "continuous", "report.html", "static"]
    res = CliRunner().invoke(app, [*first, "--seed", "1", "--compare", "chunked:reserve"])
    assert res.exit_code == 0, res.output
    assert [p.name for p in out.iterdir()] == ["chunked-reserve"]
    (out / "notes.txt").write_text("mine\n")
    res = CliRunner().invoke(app, [*first, "--compare", "chunked"])
    assert res.exit_code == 1
    assert "holds notes.txt, which is not a servesim run directory or report" in res.output
    assert sorted(p.name for p in out.iterdir()) == ["chunked-reserve", "notes.txt"]
