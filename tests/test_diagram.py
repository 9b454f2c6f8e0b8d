"""Slot diagrams: the teaching grids of static, continuous and chunked exactly, the slot
rule (lowest free row, kept until released), the cut of a large run, and the CLI."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from policies.registry import POLICIES
from sim.app.cli.main import app
from sim.app.reports.diagram import SlotRecorder, diagram_for_config, label_for, render_text
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from sim.batch import BatchPlan
from tests.conftest import make_requests

runner = CliRunner()
TEACHING = RunConfig(scenario="teaching", max_num_seqs=4)

STATIC = """\
static: 4 slots x 14 steps
step    1       5         10
slot 1 |A A A A A A A A E E E E . .|
slot 2 |B B . . . . . . F F F F F F|
slot 3 |C C C . . . . .            |
slot 4 |D D D D . . . .            |
useful 27/56 (48%)
idle 17/56 (30%)
empty 12/56 (21%)"""

# The decodes of running requests stall in the prefill-only steps 3 and 5.
CONTINUOUS = """\
continuous: 4 slots x 10 steps
step    1       5         10
slot 1 |A A . A . A A A A A|
slot 2 |B B E E . E E      |
slot 3 |C C . C F F F F F F|
slot 4 |D D . D . D        |
useful 27/40 (68%)
idle 6/40 (15%)
empty 7/40 (18%)"""

CHUNKED = """\
chunked: 4 slots x 9 steps
step    1       5
slot 1 |A A A A A A A A  |
slot 2 |B B E E E E      |
slot 3 |C C C F F F F F F|
slot 4 |D D D D          |
useful 27/36 (75%)
idle 0/36 (0%)
empty 9/36 (25%)"""


def needs(policy: str) -> None:
    if policy not in POLICIES:
        pytest.skip(f"policy {policy!r} is not registered in policies/registry.py yet")


@pytest.mark.parametrize(("policy", "expected", "counts"), [
    ("static", STATIC, (27, 17, 56)),
    ("continuous", CONTINUOUS, (27, 6, 40)),
    ("chunked", CHUNKED, (27, 0, 36)),
])
def test_teaching_grids(policy: str, expected: str, counts: tuple[int, int, int]) -> None:
    needs(policy)
    grid = diagram_for_config(dataclasses.replace(TEACHING, policy=policy))
    assert "\n".join(render_text(grid)) == expected
    assert (grid.shown.useful, grid.shown.idle, grid.shown.total) == counts
    assert grid.run == grid.shown
    assert grid.cut_note() is None
    assert grid.legend == tuple((label_for(i), str(i)) for i in range(6))


def test_idle_letters_show_the_holder() -> None:
    grid = diagram_for_config(dataclasses.replace(TEACHING, policy="static"))
    assert render_text(grid, idle_letters=True)[3] == "slot 2 |B B b b b b b b F F F F F F|"


def test_slot_rule_lowest_free_row_kept_until_release() -> None:
    a, b, c = make_requests([5, 5, 5])
    rec = SlotRecorder(max_num_seqs=3)
    rec(BatchPlan([(a, 4), (b, 4)], holders=[a, b]), 0.0, 1.0)
    rec(BatchPlan([(b, 1)], holders=[b]), 1.0, 2.0)  # a released (e.g. preempted)
    rec(BatchPlan([(b, 1), (c, 4), (a, 4)], holders=[b, c, a]), 2.0, 3.0)
    rec(BatchPlan([(c, 1)], holders=[b, c, a]), 3.0, 4.0)  # b and a hold idle
    grid = rec.grid("t")
    rows = [[None if cell is None else (cell.label, cell.num_tokens) for cell in row]
            for row in grid.cells]
    assert rows == [
        [("A", 4), None, ("C", 4), ("C", 1)],  # c takes row 1, freed by a
        [("B", 4), ("B", 1), ("B", 1), ("B", 0)],
        [None, None, ("A", 4), ("A", 0)],  # a comes back to the next free row
    ]
    assert (grid.shown.useful, grid.shown.idle, grid.shown.total) == (7, 2, 12)


def test_large_run_is_cut_and_whole_run_counts_match_steps_csv() -> None:
    cfg = RunConfig(num_requests=300, step_time=0.01, max_num_seqs=32, num_gpu_blocks=400,
                    max_model_len=6384, seed=3)
    prep = prepare(cfg)
    rec = SlotRecorder(prep.scheduler.max_num_seqs, max_steps=20, max_slots=8, first_step=1)
    steps = simulate_prepared(prep, observer=rec).steps
    grid = rec.grid("chunked")
    assert (grid.shown_steps, grid.shown_slots) == (20, 8)
    assert grid.num_steps == len(steps) > 20
    assert grid.run.useful == steps["slots_useful"].sum()
    assert grid.run.idle == steps["slots_idle"].sum()
    assert grid.run.empty == steps["slots_empty"].sum()
    note = grid.cut_note()
    assert note is not None
    assert note.startswith(f"cut: showing steps 1-20 of {len(steps):,} and slots 1-8 of 32; "
                           "whole run: useful ")
    lines = render_text(grid)
    assert len(lines) == 2 + 8 + 3
    assert lines[-1].startswith(f"empty {grid.shown.empty}/160 ")


def test_first_step_moves_the_window() -> None:
    cfg = dataclasses.replace(TEACHING, policy="static")
    grid = diagram_for_config(cfg, first_step=9, max_steps=3)
    # Letters follow admission within the window shown: request 4 is A here.
    assert render_text(grid)[1:4] == ["step    9 10", "slot 1 |A A A|", "slot 2 |B B B|"]
    assert grid.legend == (("A", "4"), ("B", "5"))
    assert grid.cut_note() is not None and "steps 9-11 of 14" in grid.cut_note()


def test_cli_teaching_prints_the_three_grids_and_writes_html(tmp_path: Path) -> None:
    out = tmp_path / "d.html"
    res = runner.invoke(app, ["diagram", "--scenario", "teaching", "--html", str(out)])
    assert res.exit_code == 0, res.output
    fractions = ["useful 27/56", "idle 17/56", "empty 12/56", "useful 27/36", "idle 0/36",
                 "empty 9/36"]
    if "continuous" in POLICIES:
        fractions += ["useful 27/40", "idle 6/40", "empty 7/40"]
    for f in fractions:
        assert f in res.output
    assert "'.' = slot held but idle" in res.output
    text = out.read_text()
    assert text.count("<script") == 4  # plotly.js once, then one per figure
    assert "static: useful 27\\u002f56" in text  # plotly's JSON escapes the slash


def test_cli_diagram_of_a_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    res = runner.invoke(app, ["run", "--scenario", "teaching", "--max-num-seqs", "4",
                              "--policy", "static", "--out", str(run_dir)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["diagram", str(run_dir), "--max-steps", "8"])
    assert res.exit_code == 0, res.output
    assert "static: cut: showing steps 1-8 of 14 and slots 1-4 of 4" in res.output
    assert "useful 17/32" in res.output


@pytest.mark.parametrize("args", [
    ["--scenario", "teaching", "--policies", "nope"],
    ["no/such/run"],
    ["--scenario", "teaching", "--max-steps", "0"],
])
def test_cli_diagram_bad_input_is_one_line(args: list[str]) -> None:
    res = runner.invoke(app, ["diagram", *args])
    assert res.exit_code == 1
    assert res.output.startswith("error: ") and res.output.count("\n") == 1, res.output


@pytest.mark.parametrize(("policies", "shown"), [("", "''"), ("static,,chunked",
                                                                "'static,,chunked'")])
def test_cli_diagram_refuses_empty_policy_entries(policies: str, shown: str) -> None:
    res = runner.invoke(app, ["diagram", "--scenario", "teaching", "--policies", policies])
    assert res.exit_code == 1
    assert res.output == ("error: --policies: expected comma-separated policy names without "
                          f"empty entries, got {shown}\n")


@pytest.mark.parametrize(("html", "message"), [
    ("afile/x.html", "--html: {t}/afile exists and is not a directory"),
    ("afile/sub/x.html", "--html: cannot make {t}/afile/sub: {t}/afile is a file"),
    (".", "--html: {t} is a directory; servesim writes a file there"),
])
def test_cli_diagram_checks_html_before_simulating(tmp_path: Path, html: str,
                                                   message: str) -> None:
    (tmp_path / "afile").write_text("x")
    target = tmp_path / html if html != "." else tmp_path
    res = runner.invoke(app, ["diagram", "--scenario", "teaching", "--html", str(target)])
    assert res.exit_code == 1
    assert res.output.startswith("error: ") and res.output.count("\n") == 1, res.output
    assert message.format(t=tmp_path) in res.output


@pytest.mark.parametrize(("text", "message"), [
    ("[]", "config.json must hold a JSON object, got list"),
    ("{", "config.json is not valid JSON"),
    ('{"max_num_seqs": "abc"}', "config.json: max_num_seqs must be an integer or null, got 'abc'"),
    ('{"max_model_len": true}', "max_model_len must be an integer or null, got True"),
    ('{"gpu_memory_utilization": 3}', "config.json: gpu_memory_utilization must be in (0, 1]"),
])
def test_cli_diagram_of_a_corrupt_run_directory(tmp_path: Path, text: str,
                                                message: str) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text(text)
    res = runner.invoke(app, ["diagram", str(tmp_path / "r")])
    assert res.exit_code == 1
    # The file is named: as a path, or as the run directory and the file (run_dir.read_json).
    assert (res.output.startswith(f"error: {tmp_path / 'r' / 'config.json'}")
            or res.output.startswith(f"error: run directory {tmp_path / 'r'}: config.json"))
    assert res.output.count("\n") == 1 and message in res.output, res.output
    (tmp_path / "afile").write_text("x")
    res = runner.invoke(app, ["diagram", str(tmp_path / "afile")])
    assert res.output == f"error: run directory {tmp_path / 'afile'} is not a directory\n"


def test_cli_teaching_skips_an_unregistered_default_policy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(POLICIES, "continuous", raising=False)
    res = runner.invoke(app, ["diagram", "--scenario", "teaching"])
    assert res.exit_code == 0, res.output
    assert "note: policy continuous skipped: not registered" in res.output
    assert "useful 27/56" in res.output and "useful 27/36" in res.output


def test_default_window_is_the_first_where_the_batch_is_fullest() -> None:
    # Slots held per step 1, 2, 3, 3, 1: of the 2-step windows (3, 5, 6, 4) the third.
    a, b, c, d = make_requests([5, 5, 5, 5])
    rec = SlotRecorder(max_num_seqs=3, max_steps=2)
    for holders in ([a], [a, b], [b, c, d], [b, c, d], [b]):
        rec(BatchPlan([(r, 1) for r in holders], holders=holders), 0.0, 1.0)
    grid = rec.grid("t")
    assert grid.first_step == 3
    # c takes a's freed row 1; letters follow the window: c is A, b is B, d is C.
    assert render_text(grid)[2:5] == ["slot 1 |A A|", "slot 2 |B B|", "slot 3 |C C|"]
    assert grid.legend == (("A", c.request_id), ("B", b.request_id), ("C", d.request_id))


def test_fit_width_cuts_the_text_to_the_terminal() -> None:
    from sim.app.reports.diagram import fit_width, text_width

    grid = diagram_for_config(dataclasses.replace(TEACHING, policy="static"))
    assert fit_width(grid, 80) is grid
    fitted = fit_width(grid, 30)  # "slot 4 " and "|" leave 22 characters: 11 steps
    assert (fitted.shown_steps, text_width(fitted)) == (11, 30)
    assert max(len(line) for line in render_text(fitted)[1:]) == 30
    assert render_text(fitted)[1:3] == ["step    1       5         10",
                                        "slot 1 |A A A A A A A A E E E|"]
    assert fitted.cut_note() is not None and "steps 1-11 of 14" in fitted.cut_note()


#: A run of 5,180 steps (7 slots held at most) whose busiest steps are far from step 1.
BUSY_OPTIONS = {"num_requests": 100, "step_time": 0.01, "max_num_seqs": 32,
                "num_gpu_blocks": 400, "max_model_len": 6384, "seed": 3, "rate": 50.0}
BUSY = RunConfig(**BUSY_OPTIONS)  # type: ignore[arg-type]


def test_cli_diagram_starts_busy_fits_80_columns_and_reports_progress() -> None:
    from sim.app.cli.diagram import diagram_cli
    from sim.app.reports.diagram import record_grid

    steps = simulate_prepared(prepare(BUSY)).steps
    held = (steps["slots_useful"] + steps["slots_idle"]).rolling(64).sum()
    busiest = int(held.idxmax()) - 64 + 2  # the first 64-step window of the most held
    assert busiest > 1000
    lines: list[str] = []
    grids = diagram_cli(run_dir=None, scenario=None, trace=None, policies=None, max_steps=64,
                        max_slots=16, idle_letters=False, html_out=None, png_out=None,
                        echo=lines.append, width=80, **BUSY_OPTIONS)
    assert (grids[0].first_step, grids[0].shown_steps) == (busiest, 64)  # HTML: 64 steps
    rows = [line for line in lines if line.startswith(("step", "slot"))]
    assert len(rows) == 17 and max(len(line) for line in rows) <= 80
    assert rows[0].startswith(f"step     {busiest}")
    shown = (80 - len("slot 16 ") - 1) // 2  # one-letter cells, one space apart
    assert f"showing steps {busiest:,}-{busiest + shown - 1:,} of {len(steps):,}" in "\n".join(
        lines)
    done: list[int] = []
    record_grid(prepare(BUSY), progress=done.append)
    assert done[-1] == 100


def test_cli_diagram_refuses_a_first_step_past_the_run() -> None:
    args = ["diagram", "--scenario", "teaching", "--policies", "static"]
    res = runner.invoke(app, [*args, "--first-step", "15"])
    assert res.exit_code == 1
    assert res.output == ("error: --first-step: 15 is past the end of the run: static takes "
                          "steps 1-14\n")
    res = runner.invoke(app, [*args, "--first-step", "14"])
    assert res.exit_code == 0 and "slot 1 |.|" in res.output, res.output
