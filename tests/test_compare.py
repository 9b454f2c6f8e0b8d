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


def test_latency_pairs_keep_three_significant_figures() -> None:
    from sim.app.runs.compare import _pair, sig3

    assert _pair({"p50": 0.01234, "p99": 0.2049}, 1) == "0.0123/0.205"
    assert _pair({"p50": 19.46, "p99": 62.44}, 1) == "19.5/62.4"
    assert _pair({"p50": 570.6, "p99": 1275.1}, 1) == "571/1,275"
    assert _pair({"p50": 0.0881, "p99": 1.478}, 1000) == "88.1/1,478"
    assert _pair({"p50": None, "p99": 2300.3}, 1) == "-/2,300"
    # Rounding up adds a digit before the point, and the decimals follow it.
    assert [sig3(v) for v in (9.996, 0.99951, 999.4, 999.6, 0.0, 4.9e-5)] == [
        "10.0", "1.00", "999", "1,000", "0", "0.0000490"]


#: A compare of five cells whose long names squeezed every column at 80 characters.
CELLS = "static,continuous,chunked,chunked:reserve,continuous:swap"


def _compare_text(width: int, saturated: bool = False) -> str:
    from rich.console import Console

    from sim.app.runs.compare import compare_table

    summary = {
        "throughput": {"requests_per_s": 10.77, "output_tokens_per_s": 2588.0},
        "ttft_s": {"p50": 0.04871, "p99": 0.2716}, "tpot_s": {"p50": 0.01843, "p99": 0.03178},
        "e2e_latency_s": {"p50": 2.817, "p99": 13.43},
        "slots": {"useful_fraction": 0.03, "idle_fraction": 0.0, "empty_fraction": 0.97},
        "num_preemptions": 204, "num_swaps": 0, "num_rejected": 0, "saturated": saturated,
    }
    console = Console(width=width, record=True)
    console.print(compare_table([(c, summary) for c in parse_cells(CELLS)]))
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100, 120])
def test_compare_table_fits_its_width_with_every_figure_whole(width: int) -> None:
    text = _compare_text(width, saturated=True)
    assert "…" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    # Pairs and names may break after their '/' and ':' but nothing else is cut.
    joined = "".join(text.split())
    for value in ("10.77", "2,588", "0.0487/", "0.272", "18.4/", "31.8", "2.82/", "13.4",
                  "3/0/97", "204(0)"):
        assert value in joined, value
    words = set(text.split())
    assert {"chunked:reserve", "continuous:swap"} <= words or {
        "chunked:", "reserve", "continuous:", "swap"} <= words


def test_compare_table_cell_names_wrap_at_80_and_stay_whole_at_120() -> None:
    wide = _compare_text(120).splitlines()
    assert any("chunked:reserve" in line and "0.0487/0.272" in line for line in wide)
    narrow = _compare_text(80).splitlines()
    at = next(i for i, line in enumerate(narrow) if line.startswith("chunked:"))
    assert narrow[at].split()[:3] == ["chunked:", "10.77", "2,588"]
    assert narrow[at + 1].split()[0] == "reserve"


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
