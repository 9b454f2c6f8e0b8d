"""The engine: one SimPy process per replica that runs what the policy plans. It owns the
loop, the admission guard, the update rule and the no-progress watchdogs; the engine
decides nothing.

Each iteration, as named steps: admit the arrived requests (rejecting those that can
never be served); advance a steady-decode run when the policy promises one
(sim/fastpath.py; a chunk run that went past arrivals admits them, through the same
guard, at the steps that saw them), else schedule one step (the policy's BatchPlan),
price it (the cost model, or an executor's measured time), wait it out (``yield
env.timeout(dt)``), update and record. The update rule: num_computed_tokens += n; when a
request's computed tokens reach its known tokens it samples one output token (the first
sets first_token_time); at its finish limit (``sim.request.finish_limit``, stored in the
request's ``max_output_tokens`` at admission) it is done and the policy releases it.
With no work the engine waits on the next arrival's timeout event; it never polls.

The engine keeps its own clock (``now``) and skips a wait (the clock moves on at once,
by the same sum ``now + dt`` SimPy makes, so no result changes) when no other process
can see it: no ``on_release``, ``wake``, observer or executor, and no other event due by
the wait's end (``env.peek()``). SimPy's clock catches up at the next wait it is handed
(a progress slice's end). A SimPy timeout costs about 8,000 instructions, a sixth of an
engine iteration.

Two optional hooks serve sources that learn of arrivals only as the run goes (closed-loop
clients, a cluster router): ``on_release(req, now)`` is called for every request the engine
records (finished or rejected), and ``wake()`` is asked for an event to wait on when the
engine is idle and its source knows of no next arrival (None: no more will come, stop).
A single open-loop engine has neither and pays nothing for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any

import simpy
from mypy_extensions import mypyc_attr

from sim.batch import BatchPlan, BatchShape, shape_of
from sim.config import SchedulerConfig
from sim.cost_model import CostModel
from sim.decode_group import DecodeGroup
from sim.fastpath import make_fast_path
from sim.interface import Refuser, Scheduler
from sim.kv.block_pool import KVCacheManager
from sim.metrics import Recorder, StepRow
from sim.request import Request, RequestStatus, finish_limit
from sim.source import ArrivalSource

__all__ = ["MAX_IDLE_SCHEDULES", "Engine", "ReleaseHook", "SchedulerStuck",
           "StepExecutor", "StepObserver", "WakeHook"]

#: Consecutive schedule() calls that plan nothing while work is waiting before the
#: engine gives up with SchedulerStuck instead of hanging. Steps that run but sample no
#: token (a preempt / re-admit livelock) get this much slack on top of the longest
#: token-less stretch a legal schedule can need (see Engine._stall_limit).
MAX_IDLE_SCHEDULES = 1000


#: Called after each step's update, before the policy releases finished requests, with
#: (plan, step_start_s, step_end_s). Used for slot diagrams and traces of small runs.
StepObserver = Callable[[BatchPlan, float, float], None]

#: Called with (request, now) for every request the engine records: released after its
#: last token, or rejected at admission. Closed-loop clients send their next request here.
ReleaseHook = Callable[[Request, float], None]

#: Asked, when the engine is idle and its source knows of no next arrival, for an event
#: that fires when a request may have arrived (a router's push); None = none will come.
WakeHook = Callable[[], "simpy.Event | None"]


#: Runs a step for real and returns its measured duration in seconds, given the plan
#: (read before the engine applies it: num_computed_tokens is the prior context) and its
#: cost shape. With an executor the engine's clock follows measured time instead of the
#: cost model's prediction, and every step is executed one by one (no fast path).
StepExecutor = Callable[[BatchPlan, BatchShape], float]


@mypyc_attr(native_class=False)  # compiled, a native class cannot derive from RuntimeError
class SchedulerStuck(RuntimeError):
    """The policy planned nothing while requests were waiting and nothing could change."""


def _finish(req: Request) -> None:
    """Mark a request done generating: "stop" when it produced output_len tokens (the
    workload's own end), else "length" (max_tokens or max_model_len reached)."""
    req.finish_reason = "stop" if req.num_output_tokens >= req.output_len else "length"
    req.status = RequestStatus.FINISHED


class Engine:
    """One replica: a policy, a KV cache, a cost model, fed by an arrival source.

    ``process()`` is the SimPy process; ``Engine.start(env)`` registers it. The policy's
    optional seams (sim/interface.py) are found once, here. Raises SchedulerStuck
    (naming the stuck request) rather than hang.
    """

    def __init__(
        self, env: simpy.Environment, *, policy: Scheduler, cost_model: CostModel,
        kv: KVCacheManager, config: SchedulerConfig, arrivals: ArrivalSource,
        recorder: Recorder, observer: StepObserver | None = None,
        on_release: ReleaseHook | None = None, wake: WakeHook | None = None,
        fast_path: bool = True, executor: StepExecutor | None = None,
    ) -> None:
        self.env = env
        self.policy = policy
        self.cost_model = cost_model
        self.kv = kv
        self.config = config
        self.arrivals = arrivals
        self.recorder = recorder
        self.observer = observer
        self.on_release = on_release
        self.wake = wake
        self.executor = executor
        self._refuse = policy.rejection_reason if isinstance(policy, Refuser) else None
        # The fast path is off where every step must be seen one by one.
        every_step = observer is not None or executor is not None
        self._fast = (make_fast_path(policy, kv, config, cost_model, arrivals, recorder,
                                     self._admit if on_release is None else None)
                      if fast_path and not every_step else None)
        self._step_time = cost_model.step_time
        self._max_len = config.max_model_len
        self._idle_schedules = 0  # consecutive plans that ran nothing with work waiting
        self._stall_steps = 0  # consecutive steps that sampled no token
        self._stall_max = self._stall_limit()
        self._last_preempted: Request | None = None
        self._unrecorded_preemptions = 0  # from plans that ran nothing: in the next row
        # the engine's clock (module docstring): ahead of env.now while waits are skipped
        self.now: float = env.now
        self._own_clock = (on_release is None and wake is None and observer is None
                           and executor is None)

    def start(self) -> simpy.Process:
        return self.env.process(self.process())

    # -- the SimPy process --
    def process(self) -> Generator[simpy.Event, Any, None]:
        """Admit arrivals; advance a steady-decode run, or schedule, price, wait out,
        update and record one step; idle until the next arrival when nothing runs. Ends
        when no request is left and none will come."""
        env, policy, arrivals, fast = self.env, self.policy, self.arrivals, self._fast
        self.now = env.now  # started later than made, it starts from SimPy's clock
        due = self._due()
        while True:
            now = self.now
            for req in arrivals.pop_arrived(now):
                self._admit(req)
            # (After a plan that preempted and ran nothing, the next step is planned one
            # by one: its row records those preemptions, as the reference's does.)
            if fast is not None and not self._unrecorded_preemptions:
                run = fast.plan(now)
                if run is not None:  # advanced, updated and recorded at once
                    dt = run.times[-1] - now
                    if due <= now + dt:
                        yield self._timeout(dt)
                        due = self._due()
                    self.now = now + dt
                    finished = fast.apply(run)
                    self._idle_schedules = 0
                    self._count_stall(run.samples, len(run.dts))
                    if finished:
                        self._end_run(finished, run.times[-1])
                    continue
            plan = policy.schedule(now)
            if not plan.scheduled and (plan.group is None or not plan.group.members):
                if self._plans_nothing(plan):
                    continue  # it preempted, so blocks were freed: plan again at once
                nxt = arrivals.next_arrival_time()
                if nxt is not None:  # idle until the next arrival
                    dt = nxt - now
                    if due <= now + dt:
                        yield self._timeout(dt)
                        due = self._due()
                    self.now = now + dt
                    continue
                event = self.wake() if self.wake is not None else None
                if event is None:
                    return  # no request will come
                yield event
                self.now = env.now
                continue
            shape, dt = self._price(plan)
            if due <= now + dt:
                yield self._timeout(dt)
                due = self._due()
            self.now = now + dt
            self._update(plan, shape, now, dt)

    def _due(self) -> float:
        """When another event is due (s; inf: none; -inf: waits are never skipped). Only
        this process's waits let other code run, so it changes only across them."""
        return self.env.peek() if self._own_clock else -math.inf

    def _timeout(self, dt: float) -> simpy.Event:
        """SimPy's timeout at the end of a wait of ``dt`` s from the engine's clock: of
        ``dt`` itself while SimPy's clock is the engine's, else of what brings SimPy's
        up to it (module docstring)."""
        env = self.env
        if env.now == self.now:
            return env.timeout(dt)
        return env.timeout(max(self.now + dt - env.now, 0.0))

    # -- admit: the engine's guard, before any policy sees a request --
    def _admit(self, req: Request) -> None:
        reason = self._rejection_reason(req)
        if reason is None:
            self.policy.add_request(req)
            return
        req.status = RequestStatus.REJECTED
        req.reason = reason
        self.recorder.record_request(req)
        if self.on_release is not None:
            self.on_release(req, self.now)

    def _rejection_reason(self, req: Request) -> str | None:
        """Why ``req`` can never be served, or None. vLLM 0.33's engine refuses only a
        prompt that leaves no room for an output token (``num_prompt_tokens >=
        max_model_len``); any other request is served and stops at max_model_len with
        finish reason "length" (finish_limit), as its OpenAI server clamps max_tokens.
        Sets the request's ``max_output_tokens`` (its finish limit)."""
        p, limit = req.num_prompt_tokens, self._max_len
        if p >= limit:
            return (f"num_prompt_tokens ({p}) >= max_model_len ({limit}): no room for an "
                    f"output token")
        if p + req.max_tokens > limit:
            req.max_tokens = limit - p
        kv = self.kv
        if kv.blocks_for(p) > kv.num_usable_blocks:
            return (f"prompt needs {kv.blocks_for(p)} KV blocks; the whole pool has "
                    f"{kv.num_usable_blocks}")
        req.max_output_tokens = finish_limit(req, limit)
        need = kv.blocks_for(p + req.max_output_tokens - 1)  # at its last token
        if need > kv.num_usable_blocks:
            return (f"can never finish: needs {need} KV blocks at its end; the whole pool "
                    f"has {kv.num_usable_blocks}")
        # What this policy can never serve (a reservation larger than the pool, an
        # unchunkable prompt over the token budget).
        return self._refuse(req) if self._refuse is not None else None

    # -- idle: a plan that runs nothing --
    def _plans_nothing(self, plan: BatchPlan) -> bool:
        """Count a plan that runs nothing while work is unfinished (the no-progress
        watchdog). True when it preempted: its preemptions go into the next step's row."""
        if not self.policy.has_unfinished_requests():
            return False
        self._idle_schedules += 1
        if self._idle_schedules > MAX_IDLE_SCHEDULES:
            self._raise_stuck()
        if plan.preempted:
            self._unrecorded_preemptions += len(plan.preempted)
            return True
        if self.arrivals.next_arrival_time() is None:
            self._raise_stuck()
        return False

    # -- price: what the step computes, and how long it takes --
    def _price(self, plan: BatchPlan) -> tuple[BatchShape, float]:
        """The step's shape (read before the update) and its duration (s): the cost
        model's price of the shape it charges, or the executor's measured time, plus
        the plan's extra time."""
        group = plan.group
        shape = (shape_of(plan.scheduled, len(group.members), group.ctx_sum)
                 if group is not None and group.members else shape_of(plan.scheduled))
        if self.executor is None:
            return shape, self._step_time(plan.cost_shape or shape) + plan.extra_time_s
        return shape, self.executor(plan, plan.cost_shape or shape) + plan.extra_time_s

    # -- update and record: after the step's timeout --
    def _update(self, plan: BatchPlan, shape: BatchShape, start: float, dt: float) -> None:
        """The update rule for every request the step ran (a decode group's members head
        running: they are released first, as in running order), the livelock watchdog,
        the observer, the releases and the step's row (preemptions of plans that ran
        nothing before it count in it)."""
        end = self.now
        done, sampled = self._apply(plan, start, end)
        group = plan.group
        if group is not None and group.members:
            done = self._apply_group(group, start, end) + done
            sampled = True
        # The watchdog: too many steps in a row without a sampled token is a preempt /
        # re-admit livelock.
        self._idle_schedules = 0
        if plan.preempted:
            self._last_preempted = plan.preempted[-1]
        self._count_stall(sampled, 1, plan.scheduled[0][0] if plan.scheduled else None)
        if self.observer is not None:
            self.observer(plan, start, end)
        blocks_used = self.kv.num_used_blocks  # before the policy releases anyone
        held = plan.num_slots_held
        self._release(done, end)
        useful = shape.num_prefill_seqs + shape.num_decode_seqs  # every request it ran
        self.recorder.record_step(StepRow(
            start, dt, useful, shape.num_prefill_tokens, shape.num_decode_seqs, blocks_used,
            self.policy.num_waiting, useful, held - useful, self.config.max_num_seqs - held,
            len(plan.preempted) + self._unrecorded_preemptions))
        self._unrecorded_preemptions = 0

    def _apply(self, plan: BatchPlan, start: float, now: float) -> tuple[list[Request], bool]:
        """The update rule for the scheduled requests; returns those done generating and
        whether any sampled a token."""
        done: list[Request] = []
        book_itl = self.recorder.book_itl
        sampled = False
        regular = 0  # previous token at the end of the previous step
        for req, n in plan.scheduled:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
            c = req.num_computed_tokens + n
            req.num_computed_tokens = c
            o = req.num_output_tokens
            if c < req.num_prompt_tokens + o:
                continue  # partial prefill chunk: no token sampled
            o += 1
            req.num_output_tokens = o
            sampled = True
            if o == 1:
                req.first_token_time = now
            elif req.last_token_time == start:
                regular += 1
            else:
                book_itl(now - req.last_token_time)  # type: ignore[operator]
            req.last_token_time = now
            if o >= req.max_output_tokens:
                _finish(req)
                done.append(req)
        if regular:
            self.recorder.book_itl_step(now - start, regular)
        return done, sampled

    def _apply_group(self, group: DecodeGroup, start: float, end: float) -> list[Request]:
        """The update rule for a decode group's members: one token each, all regular ITL
        samples of this step; returns the members that sampled their last token."""
        n = len(group.members)
        rec = self.recorder
        fresh = group.fresh  # joined during a stall: previous token at this step's start
        if fresh:
            rec.book_itl_step(end - start, fresh)
        # The others' previous token came at group.last_end: the end of the previous
        # step, or earlier when the policy ran steps without the group (a shared stall).
        if n > fresh:
            rec.book_itl_step(end - group.last_end, n - fresh)
        done = group.advance(1, end)
        for req in done:
            _finish(req)
        return done

    def _release(self, done: list[Request], end: float) -> None:
        """Hand the requests done generating to the policy; record those it releases."""
        rec, on_release = self.recorder, self.on_release
        for req in self.policy.on_step_end(done, end):
            req.finish_time = end
            rec.record_request(req)
            if on_release is not None:
                on_release(req, end)

    def _end_run(self, finished: list[Request], end: float) -> None:
        """After a fast-path run: the requests that sampled their last token in its last
        step finish and are released."""
        for req in finished:
            _finish(req)
        self._release(finished, end)

    # -- the watchdogs --
    def _count_stall(self, sampled: bool, num_steps: int, req: Request | None = None) -> None:
        """The livelock watchdog after ``num_steps`` steps (or a run) whose last sampled
        a token, or none did: too many in a row without one raise SchedulerStuck, naming
        the last preempted request, else ``req``."""
        if sampled:
            self._stall_steps = 0
            return
        self._stall_steps += num_steps
        if self._stall_steps > self._stall_max:
            self._raise_stuck(self._last_preempted or req, self._stall_steps)

    def _stall_limit(self) -> int:
        """Steps without a sampled token before a livelock is declared: a legal schedule
        moves the head of running by at least min(budget, threshold) tokens a step, so it
        samples within max_model_len / that steps, even when every slot is prefilling."""
        cfg = self.config
        chunk = min(cfg.max_num_batched_tokens,
                    cfg.long_prefill_token_threshold or cfg.max_num_batched_tokens)
        per_request = -(-cfg.max_model_len // chunk)
        return MAX_IDLE_SCHEDULES + 2 * cfg.max_num_seqs * per_request

    def _raise_stuck(self, req: Request | None = None, stall_steps: int = 0) -> None:
        if req is None:
            req = self.policy.stuck_request()
        who = (f"request {req.request_id} (num_prompt_tokens {req.num_prompt_tokens}, "
               f"status {req.status.value}, num_preemptions {req.num_preemptions})"
               if req is not None else "unknown request")
        what = (f"{stall_steps} steps ran without sampling a token (a preempt / re-admit "
                f"livelock?)" if stall_steps else "no progress")
        raise SchedulerStuck(
            f"{what} at t={self.now:.6f}s while work is waiting: {who}; "
            f"free KV blocks {self.kv.num_free_blocks}/{self.kv.num_usable_blocks}"
        )
