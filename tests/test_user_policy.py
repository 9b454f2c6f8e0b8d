"""User policies (``--policy module:Class`` or ``path/to/file.py:Class``) and the built-in
ones by name: the worked example of docs/policies.md through the CLI, load errors as one
line, the fast-path promise that a subclass overriding schedule() does not inherit, and
the engine's watchdog against a deliberately broken policy that preempts and re-admits
forever."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from policies import POLICIES, get_policy_class
from policies.base import QueuePolicy
from policies.chunked import ChunkedPolicy
from sim.app.cli.main import app
from sim.batch import BatchPlan
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.engine import SchedulerStuck
from sim.interface import declares
from sim.kv.block_pool import KVCacheManager
from sim.request import Request
from sim.simulate import SimResult, simulate
from sim.source import RequestListArrivals
from tests.conftest import make_requests, run_sim

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "longest_waiting.py"
EXAMPLE_POLICY = f"{EXAMPLE}:LongestWaitingFirst"


def test_each_built_in_policy_is_its_class_of_that_name() -> None:
    """POLICIES names each built-in policy's class, imported when it is asked for."""
    # (sorted: a test that takes one out and puts it back moves it to the end)
    assert sorted(POLICIES) == ["chunked", "continuous", "static"]
    for name in POLICIES:
        cls = get_policy_class(name)
        assert cls.name == name and get_policy_class(name) is cls
    assert get_policy_class("chunked") is ChunkedPolicy
    with pytest.raises(ValueError, match=r"unknown policy 'fifo'; known: "
                       + re.escape(", ".join(POLICIES)) + " or module:Class"):
        get_policy_class("fifo")


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
    ("policies.registry:Policy", "'policies.registry:Policy' is a protocol or abstract class"),
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


LongestWaitingFirst = get_policy_class(EXAMPLE_POLICY)

#: What a watching policy saw at each schedule() call: the time, and each running
#: request's (num_computed_tokens, num_output_tokens).
Seen = list[tuple[float, tuple[tuple[int, int], ...]]]


class WatchingLongestWaiting(LongestWaitingFirst):  # type: ignore[misc, valid-type]
    """docs/examples/longest_waiting.py with schedule() overridden to watch every call:
    the promise of ChunkedPolicy's steady_decode is about ChunkedPolicy's schedule(), so
    this class does not inherit it."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        super().__init__(config, kv)
        self.seen: Seen = []

    def schedule(self, now: float) -> BatchPlan:
        self.seen.append((now, tuple((r.num_computed_tokens, r.num_output_tokens)
                                     for r in self.running)))
        return super().schedule(now)


class PromisingWatcher(WatchingLongestWaiting):
    """The watcher that makes the promise itself, in its own class body: its schedule()
    plans steady decodes as ChunkedPolicy's does."""

    steady_decode = ChunkedPolicy.steady_decode
    attach_decode_group = ChunkedPolicy.attach_decode_group


class ReleaseWatcher(LongestWaitingFirst):  # type: ignore[misc, valid-type]
    """Overrides on_step_end(), which a run does not call for each step either."""

    def on_step_end(self, done: list[Request], now: float) -> list[Request]:
        return super().on_step_end(done, now)


def test_a_promise_is_declared_by_the_class_that_schedules() -> None:
    kv = KVCacheManager(100, 16)
    cfg = SchedulerConfig()
    for cls, promised in ((ChunkedPolicy, True), (LongestWaitingFirst, True),
                          (WatchingLongestWaiting, False), (ReleaseWatcher, False),
                          (PromisingWatcher, True)):
        policy = cls(cfg, kv)
        assert declares(policy, "steady_decode") is promised, cls
        assert declares(policy, "attach_decode_group") is promised, cls
    assert not declares(QueuePolicy(cfg, kv), "steady_decode")  # no such hook


def watched_run(cls: type, fast_path: bool, outputs: list[int], prompt: list[int],
                arrivals: list[float]) -> tuple[SimResult, Seen]:
    policies: list[WatchingLongestWaiting] = []

    def factory(config: SchedulerConfig, kv: KVCacheManager) -> WatchingLongestWaiting:
        policies.append(cls(config, kv))
        return policies[-1]

    res = simulate(RequestListArrivals(make_requests(outputs, prompt, arrivals)),
                   policy_factory=factory, config=SchedulerConfig(max_num_seqs=4),
                   cost_model=ConstantCostModel(1.0), num_gpu_blocks=1000,
                   fast_path=fast_path)
    return res, policies[0].seen


def test_a_subclass_that_overrides_schedule_runs_step_by_step() -> None:
    # Three requests (prompt 10, 20 tokens each) at t = 0: one prefill step, 19 decode
    # steps, and the call at t = 20 that finds nothing left: 21 schedule() calls, the
    # k-th (k >= 1) at t = k seeing (10 + k - 1, k) for each request.
    args = ([20, 20, 20], [10, 10, 10], [0.0, 0.0, 0.0])
    ref, ref_seen = watched_run(WatchingLongestWaiting, False, *args)
    fast, seen = watched_run(WatchingLongestWaiting, True, *args)
    assert seen == ref_seen
    assert len(seen) == 21
    assert seen[0] == (0.0, ())
    assert seen[5] == (5.0, ((14, 5),) * 3)
    assert seen[20] == (20.0, ())
    assert fast.requests.equals(ref.requests) and fast.steps.equals(ref.steps)
    # Arrivals while others decode, prompts of different lengths: the same calls and
    # records as the reference. The request arriving at 2.5 is prefilled in the step
    # starting at 3 and samples its 33rd token at 36: a call at every t = 0, 1, ..., 36.
    args = ([20, 33, 6], [10, 50, 7], [0.0, 2.5, 4.0])
    ref, ref_seen = watched_run(WatchingLongestWaiting, False, *args)
    fast, seen = watched_run(WatchingLongestWaiting, True, *args)
    assert seen == ref_seen
    assert [t for t, _ in seen] == [float(t) for t in range(37)]
    assert seen[4] == (4.0, ((13, 4), (50, 1)))
    assert fast.requests.equals(ref.requests) and fast.steps.equals(ref.steps)


def test_example_policy_keeps_the_fast_path_with_the_references_records(
        fast_runs: list[int]) -> None:
    # The KV-pressure workload above, plus later arrivals: preemptions requeue by the
    # last token's time, and steady decodes between them run on the fast path.
    runs = fast_runs
    res = [simulate(RequestListArrivals(make_requests([64, 64, 4, 30, 12], prompt=16,
                                                      arrivals=[0, 0, 2, 20, 21])),
                    policy_factory=LongestWaitingFirst, config=SchedulerConfig(max_num_seqs=2),
                    cost_model=ConstantCostModel(1.0), num_gpu_blocks=9, fast_path=fast)
           for fast in (False, True)]
    assert runs and res[0].summary["num_preemptions"] > 0
    assert res[1].requests.equals(res[0].requests) and res[1].steps.equals(res[0].steps)


def test_a_subclass_that_declares_the_promise_takes_the_fast_path() -> None:
    # The same 21-step workload: the prefill step at t = 0, then one run of the 19
    # decode steps; the call at t = 20 finds nothing left. The records are the
    # reference's.
    args = ([20, 20, 20], [10, 10, 10], [0.0, 0.0, 0.0])
    ref, _ = watched_run(WatchingLongestWaiting, False, *args)
    fast, seen = watched_run(PromisingWatcher, True, *args)
    assert [t for t, _ in seen] == [0.0, 20.0]
    assert fast.requests.equals(ref.requests) and fast.steps.equals(ref.steps)


class EagerAdmit(ChunkedPolicy):
    """Overrides a helper of ChunkedPolicy's schedule(), not schedule() itself: admits the
    head of waiting whenever its next chunk fits (no reserve for the full prompt), so a
    steady decode can be cut short by preemptions ChunkedPolicy's promise never saw.
    Records (budget, waiting requests) at every _schedule_waiting call."""

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        super().__init__(config, kv)
        self.calls: list[tuple[int, int]] = []

    def _schedule_waiting(self, scheduled: dict[Request, int], budget: int,
                          threshold: int) -> None:
        self.calls.append((budget, len(self.waiting)))
        while (len(self.waiting) and len(self.running) < self.config.max_num_seqs
               and budget > 0):
            req = self.waiting.peek()
            n = min(req.num_new_tokens, threshold or budget, budget)
            if self.blocks_needed(req, n) > self.kv.num_free_blocks:
                break
            self.admit_allocating(req, n, None)
            scheduled[req] = n
            budget -= n


def eager_run(fast_path: bool) -> tuple[SimResult, list[tuple[int, int]]]:
    """Two 100-token decodes (prompts of 64) and, at t = 1, a 400-token prompt admitted
    chunk by chunk into a 30-block pool; the result and EagerAdmit's calls."""
    policies: list[EagerAdmit] = []

    def factory(config: SchedulerConfig, kv: KVCacheManager) -> EagerAdmit:
        policies.append(EagerAdmit(config, kv))
        return policies[-1]

    res = simulate(
        RequestListArrivals(make_requests([100, 100, 5], [64, 64, 400], [0.0, 0.0, 1.0])),
        policy_factory=factory,
        config=SchedulerConfig(max_num_seqs=4, long_prefill_token_threshold=64),
        cost_model=ConstantCostModel(1.0), num_gpu_blocks=30, fast_path=fast_path)
    return res, policies[0].calls


def test_a_subclass_that_overrides_a_helper_runs_step_by_step(fast_runs: list[int]) -> None:
    # The late prompt is preempted and re-admitted as the decodes grow. ChunkedPolicy's
    # promise does not speak for the overridden helper, so both engines call it alike
    # and record the same steps and preemptions.
    assert not declares(EagerAdmit(SchedulerConfig(), KVCacheManager(30, 16)),
                        "steady_decode")
    ref, ref_calls = eager_run(False)
    fast, calls = eager_run(True)
    assert fast_runs == []
    assert calls == ref_calls
    # The workload exercises the overridden helper under KV pressure (otherwise the
    # comparison below would say nothing about the promise).
    assert ref_calls and ref.summary["num_preemptions"] > 0
    assert fast.requests.equals(ref.requests) and fast.steps.equals(ref.steps)


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
