"""Outputs whole or not at all, never over what servesim did not write (sim/app/runs/out_dir.py):
run directories are replaced only when empty or a previous run; several are swapped in
together; loose files are renamed into place once all are written; and the commands
check their outputs before simulating."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.config_file import VERSION
from sim.app.runs.out_dir import GENERATOR_META, check_run_dir, write_files

runner = CliRunner()
RUN = ["run", "--num-requests", "20", "--step-time", "0.01"]
SHIPPED_PROFILE = (Path(__file__).resolve().parents[1] / "calibration" / "profiles"
                   / "cpu-qwen2.5-0.5b.json")


def test_a_directory_holding_other_files_is_never_replaced(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("precious")
    res = runner.invoke(app, [*RUN, "--out", str(mine)])
    assert res.exit_code == 1
    assert "is not a servesim run directory (it holds notes.txt, sub)" in res.output
    assert (mine / "notes.txt").read_text() == "precious" and (mine / "sub").is_dir()


def test_a_previous_run_is_replaced_and_an_empty_directory_filled(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    for seed in ("0", "1"):
        res = runner.invoke(app, [*RUN, "--seed", seed, "--out", str(out)])
        assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "requests.csv", "steps.csv", "summary.json"]
    assert '"seed": 1' in (out / "config.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporaries left


def test_a_run_directory_behind_a_link_is_written_where_the_link_points(
        tmp_path: Path) -> None:
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    for _ in range(2):
        assert runner.invoke(app, [*RUN, "--out", str(link)]).exit_code == 0
    assert link.is_symlink() and (real / "summary.json").exists()


def test_the_current_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    for out in (".", str(tmp_path)):
        with pytest.raises(ValueError, match="is the current directory or holds it"):
            check_run_dir(Path(out))


def test_compare_cells_are_swapped_in_together(tmp_path: Path) -> None:
    # A later cell that fails (its policy never schedules) leaves the earlier cells'
    # previous run directories as they were.
    policy = tmp_path / "stuck.py"
    policy.write_text(
        "from policies.chunked import ChunkedPolicy\n"
        "from sim.batch import BatchPlan\n"
        "class Stuck(ChunkedPolicy):\n"
        "    def schedule(self, now):\n"
        "        return BatchPlan()\n")
    out = tmp_path / "cmp"
    assert runner.invoke(app, [*RUN, "--out", str(out), "--compare", "chunked"]).exit_code == 0
    before = (out / "chunked" / "requests.csv").read_bytes()
    res = runner.invoke(app, [*RUN, "--seed", "3", "--out", str(out),
                              "--compare", f"chunked,{policy}:Stuck"])
    assert res.exit_code == 1 and "no progress" in res.output
    assert (out / "chunked" / "requests.csv").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["chunked"]


def test_compare_report_covers_every_cell(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    res = runner.invoke(app, [*RUN, "--out", str(out), "--compare", "chunked,continuous",
                              "--report"])
    assert res.exit_code == 0, res.output
    text = (out / "report.html").read_text()
    assert "<th>chunked</th><th>continuous</th>" in text


def test_loose_files_are_written_all_or_none(tmp_path: Path) -> None:
    old_page = f"<html><head>{GENERATOR_META}</head>old a</html>"
    (tmp_path / "a.html").write_text(old_page)

    def boom() -> str:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_files(tmp_path, {"a.html": lambda: "new a", "b.txt": boom})
    assert (tmp_path / "a.html").read_text() == old_page and not (tmp_path / "b.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["a.html"]
    (tmp_path / "c.txt").mkdir()
    with pytest.raises(ValueError, match=r"c\.txt is a directory"):
        write_files(tmp_path, {"a.html": lambda: "new a", "c.txt": lambda: "c"})
    assert (tmp_path / "a.html").read_text() == old_page


@pytest.mark.parametrize("stop_at", [0, 1])
def test_a_stop_while_renaming_finishes_the_set_and_a_stop_before_leaves_the_old(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_at: int) -> None:
    """A stop (Ctrl-C) before any staged file is renamed in leaves the previous files;
    one after the first rename finishes the others, so the set is never half old."""
    for name in ("a.html", "b.html"):
        (tmp_path / name).write_text(f"<html><head>{GENERATOR_META}</head>old</html>")
    real, calls = os.replace, []

    def replace(src: str | Path, dst: str | Path) -> None:
        calls.append(dst)
        if len(calls) == stop_at + 1:
            if stop_at:
                real(src, dst)  # the rename done, the signal before the loop goes on
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        write_files(tmp_path, {"a.html": lambda: "new", "b.html": lambda: "new"})
    monkeypatch.setattr(os, "replace", real)
    texts = {(tmp_path / n).read_text() for n in ("a.html", "b.html")}
    assert texts == ({"new"} if stop_at else {f"<html><head>{GENERATOR_META}</head>old</html>"})
    assert sorted(os.listdir(tmp_path)) == ["a.html", "b.html"]


@pytest.mark.parametrize(("command", "blocked"), [
    (["sweep", "--num-requests", "10", "--step-time", "0.01"], "sweep.html"),
    (["plan", "--num-requests", "20", "--step-time", "0.01", "--seeds", "0",
      "--max-probes", "2", "--workers", "1", "--slo-ttft", "1"], "capacity.html"),
])
def test_sweep_and_plan_check_their_files_before_running(
        tmp_path: Path, command: list[str], blocked: str) -> None:
    (tmp_path / blocked).mkdir()
    res = runner.invoke(app, [*command, "--out", str(tmp_path)])
    assert res.exit_code == 1
    assert f"{blocked} is a directory" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [blocked]


def test_an_out_below_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    for command in (RUN, ["sweep", "--num-requests", "10", "--step-time", "0.01"]):
        res = runner.invoke(app, [*command, "--out", str(tmp_path / "afile" / "sub")])
        assert res.exit_code == 1
        assert f"cannot make {tmp_path / 'afile' / 'sub'}: {tmp_path / 'afile'} is a file" in (
            res.output.replace("\n", ""))


def test_a_sweep_whose_every_run_fails_says_why_and_writes_nothing(tmp_path: Path) -> None:
    policy = tmp_path / "stuck.py"
    policy.write_text("from policies.chunked import ChunkedPolicy\n"
                      "from sim.batch import BatchPlan\n"
                      "class Stuck(ChunkedPolicy):\n"
                      "    def schedule(self, now):\n"
                      "        return BatchPlan()\n")
    out = tmp_path / "sw"
    res = runner.invoke(app, ["sweep", "--num-requests", "10", "--step-time", "0.01",
                              "--policy", f"{policy}:Stuck", "--workers", "1",
                              "--out", str(out)])
    assert res.exit_code == 1
    assert "every run failed; the first: no progress" in res.output.replace("\n", "")
    assert not out.exists()


def test_only_servesims_own_config_marks_a_run_directory(tmp_path: Path) -> None:
    hf = tmp_path / "hf"  # a Hugging Face model folder: a config.json of its own
    hf.mkdir()
    (hf / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    res = runner.invoke(app, [*RUN, "--out", str(hf)])
    assert res.exit_code == 1 and "a config.json servesim did not write" in res.output
    assert (hf / "config.json").read_text() == '{"architectures": ["LlamaForCausalLM"]}'
    run = tmp_path / "run"  # a previous run with a Finder file and a stale temporary
    assert runner.invoke(app, [*RUN, "--out", str(run)]).exit_code == 0
    (run / ".DS_Store").write_text("")
    (run / ".report.html.tmp").write_text("")
    assert runner.invoke(app, [*RUN, "--out", str(run)]).exit_code == 0


def test_a_symlink_loop_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    res = runner.invoke(app, [*RUN, "--out", str(tmp_path / "loop")])
    assert res.exit_code == 1 and "loop" in res.output and "Traceback" not in res.output


def test_compare_and_run_keep_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Their defaults differ (runs/latest, runs/compare), so a compare never fills the
    # run directory a plain run replaces; given the same --out, compare refuses.
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, RUN).exit_code == 0
    assert runner.invoke(app, [*RUN, "--compare", "chunked,continuous"]).exit_code == 0
    assert runner.invoke(app, RUN).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["compare", "latest"]
    assert sorted(p.name for p in (tmp_path / "runs" / "compare").iterdir()) == [
        "chunked", "continuous"]
    res = runner.invoke(app, [*RUN, "--compare", "chunked", "--out", "runs/latest"])
    assert res.exit_code == 1 and "is a run directory; --compare writes" in res.output


def test_a_failed_swap_puts_the_previous_run_back(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    assert runner.invoke(app, [*RUN, "--out", str(out)]).exit_code == 0
    before = (out / "requests.csv").read_bytes()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / ".x.tmp").mkdir()  # a user's hidden folder is not servesim's
    res = runner.invoke(app, [*RUN, "--out", str(tmp_path / "mine")])
    assert res.exit_code == 1 and "not a servesim run directory" in res.output
    real_replace = os.replace
    calls = []

    def flaky(src: object, dst: object) -> None:  # the new run fails to move in
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", flaky)
    res = runner.invoke(app, [*RUN, "--seed", "5", "--out", str(out)])
    assert res.exit_code == 1
    assert f"--out: cannot write {out}: no space left on device; free space or give another " \
        "--out" in res.output.replace("\n", "")
    assert (out / "requests.csv").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "run"]


# -- a user's files are never replaced, by any command -------------------------------------

MINE = "my own notes, not servesim's"


def _one_line_refusal(output: str, option: str, path: Path) -> bool:
    text = output.replace("\n", "")
    return (f"error: {option}: {path} exists and carries no servesim mark (another "
            "program's, or written by a servesim that did not mark its files); give another "
            "path or remove it") in text


def test_report_never_replaces_a_users_file_and_replaces_its_own(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert runner.invoke(app, [*RUN, "--out", str(run)]).exit_code == 0
    mine = tmp_path / "r.html"
    mine.write_text(MINE)
    res = runner.invoke(app, ["report", str(run), "--out", str(mine)])
    assert res.exit_code == 1 and _one_line_refusal(res.output, "--out", mine)
    assert mine.read_text() == MINE
    own = tmp_path / "report.html"
    for _ in range(2):  # the second replaces the page the first wrote
        res = runner.invoke(app, ["report", str(run), "--out", str(own)])
        assert res.exit_code == 0, res.output
    assert f"<meta charset=\"utf-8\">{GENERATOR_META}<title>" in own.read_text()[:200]


def test_compare_report_never_replaces_a_users_report(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "report.html").write_text(MINE)
    res = runner.invoke(app, [*RUN, "--out", str(out), "--compare", "chunked", "--report"])
    assert res.exit_code == 1 and _one_line_refusal(res.output, "--out", out / "report.html")
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]  # refused before running
    assert (out / "report.html").read_text() == MINE


def test_diagram_never_replaces_a_users_html(tmp_path: Path) -> None:
    mine = tmp_path / "d.html"
    mine.write_text(MINE)
    res = runner.invoke(app, ["diagram", "--scenario", "teaching", "--html", str(mine)])
    assert res.exit_code == 1 and _one_line_refusal(res.output, "--html", mine)
    assert mine.read_text() == MINE
    own = tmp_path / "own.html"
    for _ in range(2):
        res = runner.invoke(app, ["diagram", "--scenario", "teaching", "--html", str(own)])
        assert res.exit_code == 0, res.output


SWEEP = ["sweep", "--num-requests", "10", "--step-time", "0.01", "--workers", "1"]
PLAN = ["plan", "--num-requests", "20", "--step-time", "0.01", "--seeds", "0",
        "--max-probes", "2", "--workers", "1", "--slo-ttft", "1"]


@pytest.mark.parametrize(("command", "names"), [
    (SWEEP, ("sweep.csv", "sweep.json", "frontier.csv", "sweep.html")),
    (PLAN, ("capacity.md", "plan.json", "capacity.html", "vllm_serve.yaml")),
])
def test_sweep_and_plan_never_replace_a_users_file(tmp_path: Path, command: list[str],
                                                    names: tuple[str, ...]) -> None:
    for name in names:
        out = tmp_path / name.replace(".", "-")
        out.mkdir()
        (out / name).write_text(MINE)
        res = runner.invoke(app, [*command, "--out", str(out)])
        assert res.exit_code == 1 and _one_line_refusal(res.output, "--out", out / name)
        assert sorted(p.name for p in out.iterdir()) == [name]
        assert (out / name).read_text() == MINE


@pytest.mark.parametrize("command", [SWEEP, PLAN])
def test_sweep_and_plan_replace_their_own_files(tmp_path: Path, command: list[str]) -> None:
    out = tmp_path / "out"
    for _ in range(2):
        res = runner.invoke(app, [*command, "--out", str(out)])
        assert res.exit_code == 0, res.output
    page = "sweep.html" if command is SWEEP else "capacity.html"
    assert GENERATOR_META in (out / page).read_text()[:300]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_calibrate_never_replaces_a_file_that_is_not_a_profile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "p.json"
    shutil.copy(SHIPPED_PROFILE, src)
    mine = tmp_path / "p.txt"
    mine.write_text(MINE)
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--force", "--out", str(mine)])
    assert res.exit_code == 1 and mine.read_text() == MINE
    assert (f"error: --out: {mine} exists and is not a servesim profile; give another path or "
            "remove it") in res.output.replace("\n", "")
    monkeypatch.setattr("calibration.measure.measure", lambda *a, **k: 1 / 0)
    res = runner.invoke(app, ["calibrate", "--num-layers", "1", "--out", str(mine)])
    assert res.exit_code == 1 and "is not a servesim profile" in res.output
    assert mine.read_text() == MINE
    before = src.read_bytes()  # a refit in place writes over the profile it read
    res = runner.invoke(app, ["calibrate", "--refit", str(src), "--force"])
    assert res.exit_code == 0, res.output
    assert src.read_bytes() != before and sorted(os.listdir(tmp_path)) == ["p.json", "p.txt"]


def test_pngs_are_marked_and_a_users_png_is_never_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zlib

    from sim.app.reports import report

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (len(body).to_bytes(4, "big") + kind + body
                + zlib.crc32(kind + body).to_bytes(4, "big"))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", bytes.fromhex("00000001000000010800000000"))
           + chunk(b"IDAT", zlib.compress(b"\x00\x00")) + chunk(b"IEND", b""))

    class Figure:  # what plotly's figure offers write_pngs (kaleido renders it)
        layout = type("Layout", (), {"height": 100})()

        def to_image(self, **_: object) -> bytes:
            return png

    monkeypatch.setattr(report, "kaleido_missing", lambda: None)
    out = tmp_path / "fig.png"
    paths = report.write_pngs([Figure(), Figure()], out)
    assert paths == [tmp_path / "fig-1.png", tmp_path / "fig-2.png"]
    mark = b"Software\x00servesim " + VERSION.encode()
    assert paths[0].read_bytes() == png[:33] + chunk(b"tEXt", mark) + png[33:]
    assert report.write_pngs([Figure(), Figure()], out) == paths  # its own: replaced
    paths[1].write_bytes(png)  # a PNG servesim did not write
    with pytest.raises(ValueError, match=r"fig-2\.png exists and carries no servesim mark"):
        report.write_pngs([Figure(), Figure()], out)
    assert paths[1].read_bytes() == png


def test_plan_never_replaces_a_hand_written_serve_yaml(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert runner.invoke(app, [*PLAN, "--out", str(out)]).exit_code == 0
    yaml = out / "vllm_serve.yaml"
    assert yaml.read_text().startswith(f"# generator: servesim {VERSION}\n")
    mine = "model: my/model\nmax_num_seqs: 64\n"  # the user's own, beside servesim's set
    yaml.write_text(mine)
    res = runner.invoke(app, [*PLAN, "--out", str(out)])
    assert res.exit_code == 1 and _one_line_refusal(res.output, "--out", yaml)
    assert yaml.read_text() == mine
