"""User policies (``--policy module:Class`` or ``path/to/file.py:Class``): the worked
example of docs/policies.md through the CLI, load errors as one line, and the engine's
watchdog against a deliberately broken policy that preempts and re-admits forever."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from policies import get_policy_class
from policies.base import QueuePolicy
from sim.app.cli.main import app
from sim.batch import BatchPlan
from sim.engine import SchedulerStuck
from tests.conftest import make_requests, run_sim

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "longest_waiting.py"
EXAMPLE_POLICY = f"{EXAMPLE}:LongestWaitingFirst"


def test_example_policy_runs_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--policy", EXAMPLE_POLICY, "--num-requests", "40",
                                   "--step-time", "0.01", "--out", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == 40
    assert json.loads((out / "config.json").read_text())["policy"] == EXAMPLE_POLICY


def test_example_policy_serves_the_longest_waiting_first() -> None:
    # A, B (prompt 16, 64 tokens) fill both slots and 8 blocks; C arrives at 2. At step 50
    # B is preempted (last token at 49). FCFS puts B back at the head: C waits behind it
    # until A finishes (step 64). Longest waiting first: C (waiting since 2) goes first,
    # at step 51, into the 3 free blocks.
    kw: dict[str, Any] = {"num_gpu_blocks": 9, "max_num_seqs": 2}
    fcfs = run_sim(make_requests([64, 64, 4], prompt=16, arrivals=[0, 0, 2]), **kw)
    lwf = run_sim(make_requests([64, 64, 4], prompt=16, arrivals=[0, 0, 2]),
                  EXAMPLE_POLICY, **kw)
    assert fcfs.requests.loc[2, "first_scheduled_time"] == 64
    assert lwf.requests.loc[2, "first_scheduled_time"] == 50


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_module_xyz:P", "cannot import module"),
    ("docs/examples/nope.py:P", "no such file"),
    (f"{EXAMPLE}:Missing", "has no 'Missing'"),
    ("fifo", "unknown policy 'fifo'"),
    ("json:dumps", "'json:dumps' is not a policy class (a class with schedule(now)"),
    ("policies.base:QueuePolicy", "is not a policy class (a class with schedule(now) and the "
     "other Scheduler methods, see policies/base.py); missing: schedule"),
    ("sim.engine:SchedulerStuck", "missing: add_request, schedule, on_step_end"),
    ("sim.config:SchedulerConfig", "'sim.config:SchedulerConfig' is not a policy class"),
    ("policies.base:Policy", "'policies.base:Policy' is a protocol or abstract class"),
    (":", "policy ':': expected module:Class"),
    ("policies.base:", "expected module:Class or path/to/file.py:Class with both parts"),
])
def test_bad_policy_is_one_line(spec: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        get_policy_class(spec)
    res = CliRunner().invoke(app, ["run", "--policy", spec, "--out", str(tmp_path / "r")])
    assert res.exit_code == 1
    assert res.output.count("\n") == 1 and message in res.output


@pytest.mark.parametrize("command", [
    ["run", "--compare", "static,json:dumps"],
    ["diagram", "--scenario", "teaching", "--policies", "static,policies.base:QueuePolicy"],
])
def test_a_non_policy_class_is_refused_by_every_command(command: list[str],
                                                         tmp_path: Path) -> None:
    res = CliRunner().invoke(app, [*command, "--out" if command[0] == "run" else "--html",
                                   str(tmp_path / "o")])
    assert res.exit_code == 1, res.output
    assert res.output.startswith("error: policy '") and res.output.count("\n") == 1
    assert "is not a policy class" in res.output


class Flapper(QueuePolicy):
    """Deliberately broken: every step it preempts whatever runs and re-admits the head of
    waiting for an 8-token chunk, so the 64-token prompt never completes."""

    name: ClassVar[str] = "flapper"

    def schedule(self, now: float) -> BatchPlan:
        preempted = list(self.running)
        for req in preempted:
            self.preempt(req)
        req = self.waiting.peek()
        assert self.allocate(req, 8)
        self.admit(req)
        return BatchPlan([(req, 8)], preempted, self.running)


def test_watchdog_names_the_request_of_a_preempt_readmit_livelock() -> None:
    # Every step computes 8 tokens and samples none; the engine gives up after
    # MAX_IDLE_SCHEDULES + 2 * max_num_seqs * ceil(max_model_len / budget) = 1002 steps.
    with pytest.raises(SchedulerStuck, match=r"request 0 .*num_preemptions 100\d"):
        run_sim(make_requests([4], prompt=64), "tests.test_user_policy:Flapper",
                max_num_seqs=1, max_model_len=128, max_num_batched_tokens=2048)
