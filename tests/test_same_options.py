"""Options that mean the same in every command, and vLLM's habits read as vLLM means them:
a rate with a trace re-times it by Poisson arrivals (vllm bench serve's --request-rate) in
run as in sweep and plan; the trace sample follows one rule everywhere; vLLM bench serve's
``--goodput ttft:MS tpot:MS`` sets the SLOs in seconds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from scenarios.build import build_workload
from sim.app.cli.main import app, run_app
from sim.app.cli.option_values import join_goodput
from sim.app.runs.run_config import RunConfig, sample_trace
from sim.latency_stats import parse_goodput

runner = CliRunner()


def _trace(path: Path, n: int = 400) -> Path:
    """A servesim CSV trace: one request per second, prompt i + 1 tokens, 8 output tokens."""
    rows = [f"{i:.1f},{i + 1},8" for i in range(n)]
    path.write_text("arrival_time,num_prompt_tokens,output_len\n" + "\n".join(rows) + "\n")
    return path


def _workload(trace: Path, **kw: object) -> object:
    args = dict(trace=trace, trace_format=None, scenario=None, arrival=None, rate=None,
                burstiness=None, num_requests=None, window_s=None, time_scale=None,
                max_tokens=None, seed=3)
    return build_workload(**{**args, **kw})  # type: ignore[arg-type]


def test_rate_with_a_trace_retimes_it_by_poisson_arrivals(tmp_path: Path) -> None:
    """--rate alone re-times a trace exactly as --arrival poisson does; the lengths stay."""
    trace = _trace(tmp_path / "t.csv")
    alone = _workload(trace, rate=50.0)
    poisson = _workload(trace, rate=50.0, arrival="poisson")
    assert np.array_equal(alone.arrival_time, poisson.arrival_time)  # type: ignore[attr-defined]
    assert np.array_equal(alone.num_prompt_tokens,  # type: ignore[attr-defined]
                          np.arange(1, 401))
    assert "re-timed poisson(50)" in alone.source  # type: ignore[attr-defined]
    span = alone.arrival_time[-1] - alone.arrival_time[0]  # type: ignore[attr-defined]
    assert 399 / span == pytest.approx(50.0, rel=0.15)  # 399 gaps: sd of the mean 5%
    # Sampled, the draw is shuffled as a Poisson re-timing's is: the same workload.
    drawn = [_workload(trace, num_requests=100, trace_sample=True, **kw)
             for kw in ({"rate": 50.0}, {"rate": 50.0, "arrival": "poisson"})]
    assert np.array_equal(drawn[0].num_prompt_tokens,  # type: ignore[attr-defined]
                          drawn[1].num_prompt_tokens)  # type: ignore[attr-defined]
    assert not np.all(np.diff(drawn[0].num_prompt_tokens) > 0)  # type: ignore[attr-defined]


def test_run_takes_a_rate_with_a_trace(tmp_path: Path) -> None:
    """`run --trace X --rate R` runs, as sweep's rate axis does, and its workload line
    names the Poisson re-timing."""
    trace = _trace(tmp_path / "t.csv")
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "--trace", str(trace), "--rate", "20", "--step-time",
                            "0.01", "--out", str(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 400
    assert "re-timed poisson(20)" in " ".join(r.output.split())


def test_trace_sample_is_on_when_retimed_and_off_for_a_replay(tmp_path: Path) -> None:
    trace = str(_trace(tmp_path / "t.csv"))
    replay = RunConfig(trace=trace, num_requests=50, step_time=0.01)
    retimed = RunConfig(trace=trace, num_requests=50, rate=5.0, step_time=0.01)
    assert not sample_trace(replay) and sample_trace(retimed)
    assert not sample_trace(RunConfig(trace=trace, rate=5.0, step_time=0.01))  # no N to draw
    assert sample_trace(RunConfig(trace=trace, num_requests=50, trace_sample=True,
                                  step_time=0.01))
    first = _workload(Path(trace), num_requests=50)
    assert np.array_equal(first.num_prompt_tokens, np.arange(1, 51))  # type: ignore[attr-defined]


def test_goodput_pairs_are_vllms_milliseconds() -> None:
    assert parse_goodput("ttft:2000 tpot:50") == {"slo_ttft": 2.0, "slo_tpot": 0.05}
    assert parse_goodput("tpot:12.5") == {"slo_tpot": 0.0125}
    for bad, word in (("ttft", "ttft:MS"), ("e2el:3000", "e2el"), ("ttft:x", "number"),
                      ("ttft:1 ttft:2", "twice"), ("ttft:70000", "(0, 60000]"),
                      ("tpot:0", "(0, 1000]"), ("", "KEY:VALUE")):
        with pytest.raises(ValueError, match=None) as e:
            parse_goodput(bad)
        assert word in str(e.value), (bad, str(e.value))


def test_goodput_words_join_as_vllm_reads_them() -> None:
    assert join_goodput(["run", "--goodput", "ttft:2000", "tpot:50", "--rate", "2"]) == [
        "run", "--goodput", "ttft:2000 tpot:50", "--rate", "2"]
    assert join_goodput(["run", "--rate", "2"]) == ["run", "--rate", "2"]


def test_goodput_sets_the_slos_as_the_flags_in_seconds_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The console script reads vLLM's form (several words after one --goodput): the run
    records the same SLOs and goodput as --slo-ttft 2 --slo-tpot 0.05."""
    common = ["run", "--num-requests", "30", "--rate", "5", "--step-time", "0.02"]
    monkeypatch.setattr(sys, "argv", ["servesim", *common, "--goodput", "ttft:2000",
                                      "tpot:50", "--out", str(tmp_path / "g")])
    assert run_app() == 0
    r = runner.invoke(app, [*common, "--slo-ttft", "2", "--slo-tpot", "0.05",
                            "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    for name in ("config.json", "summary.json"):
        g = json.loads((tmp_path / "g" / name).read_text())
        s = json.loads((tmp_path / "s" / name).read_text())
        g.pop("wall_time_s", None), s.pop("wall_time_s", None)
        assert (g.get("slo_ttft"), g.get("slo_tpot")) == (s.get("slo_ttft"), s.get("slo_tpot"))
        if name == "summary.json":
            assert g["goodput_requests_per_s"] == s["goodput_requests_per_s"] > 0


def test_goodput_against_a_different_slo_flag_is_one_line(tmp_path: Path) -> None:
    r = runner.invoke(app, ["run", "--goodput", "ttft:2000", "--slo-ttft", "3",
                            "--out", str(tmp_path / "x")])
    assert r.exit_code == 1
    assert "--goodput ttft:2000 contradicts --slo-ttft 3" in r.output
    assert not (tmp_path / "x").exists()
