"""Outputs whole or not at all, never over what servesim did not write (sim/app/runs/out_dir.py):
run directories are replaced only when empty or a previous run; several are swapped in
together; loose files are renamed into place once all are written; and the commands
check their outputs before simulating."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.out_dir import check_run_dir, write_files

runner = CliRunner()
RUN = ["run", "--num-requests", "20", "--step-time", "0.01"]


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
    (tmp_path / "a.txt").write_text("old a")

    def boom() -> str:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_files(tmp_path, {"a.txt": lambda: "new a", "b.txt": boom})
    assert (tmp_path / "a.txt").read_text() == "old a" and not (tmp_path / "b.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]
    (tmp_path / "c.txt").mkdir()
    with pytest.raises(ValueError, match=r"c\.txt is a directory"):
        write_files(tmp_path, {"a.txt": lambda: "new a", "c.txt": lambda: "c"})
    assert (tmp_path / "a.txt").read_text() == "old a"


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
    assert res.exit_code == 1 and "No space left" in res.output
    assert (out / "requests.csv").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "run"]
