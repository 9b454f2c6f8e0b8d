"""The engine: one SimPy process per replica that runs what the policy plans.

Each iteration: hand arrived requests to the policy (rejecting those that can never be
served), ask the policy for a BatchPlan, ask the cost model for the step time, ``yield
env.timeout(dt)``, then apply the one shared update rule: num_computed_tokens += n; when a
request's computed tokens reach its known tokens it samples one output token (the first
sets first_token_time); after min(output_len, max_tokens) tokens, or at max_model_len, it
is done and the policy releases it. With no work the engine waits on the next arrival's
timeout event; it never polls. The engine decides nothing.

Two optional hooks serve sources that learn of arrivals only as the run goes (closed-loop
clients, a cluster router): ``on_release(req, now)`` is called for every request the engine
records (finished or rejected), and ``wake()`` is asked for an event to wait on when the
engine is idle and its source knows of no next arrival (None: no more will come, stop).
Without them the engine behaves, and costs, exactly as before.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Generator
from itertools import accumulate
from operator import sub
from typing import Any, Protocol

import simpy

from sim.batch import BatchPlan, BatchShape, SteadyDecode, shape_of
from sim.config import SchedulerConfig
from sim.cost_model import CostModel
from sim.decode_group import DecodeGroup
from sim.fastpath import MAX_RUN_STEPS, remaining_steps, safe_steps, step_times
from sim.kv.block_pool import KVCacheManager
from sim.metrics import Recorder
from sim.request import Request, RequestStatus
from sim.source import ArrivalSource

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


class SchedulerStuck(RuntimeError):
    """The policy planned nothing while requests were waiting and nothing could change."""


class Scheduler(Protocol):
    """The engine's view of a policy: policies/base.py documents the contract and adds
    the optional hooks (rejection_reason, steady_decode, advance)."""

    def add_request(self, request: Request) -> None: ...

    def schedule(self, now: float) -> BatchPlan: ...

    def on_step_end(self, done: list[Request], now: float) -> list[Request]: ...

    def has_unfinished_requests(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    def stuck_request(self) -> Request | None: ...


def _finish(req: Request) -> None:
    """Mark a request done generating: "stop" when it produced output_len tokens (the
    workload's own end), else "length" (max_tokens or max_model_len reached)."""
    req.finish_reason = "stop" if req.num_output_tokens >= req.output_len else "length"
    req.status = RequestStatus.FINISHED


class Engine:
    """One replica: a policy, a KV cache, a cost model, fed by an arrival source.

    ``process()`` is the SimPy process; ``Engine.start(env)`` registers it. Raises
    SchedulerStuck (naming the stuck request) rather than hang.
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
        self._num_sampled = 0  # output tokens produced so far (the livelock watchdog's clock)
        # The policy's optional steady-decode promise (sim/fastpath.py). Off where every
        # step must be seen one by one (an observer, an executor). A cluster's inbox
        # gives its next routing instant: runs then end before it (the router reads
        # this engine's state there as step by step).
        self.executor = executor
        self._routing_time = getattr(arrivals, "next_routing_time", None)
        steady = getattr(policy, "steady_decode", None)
        every_step = observer is not None or executor is not None
        self._steady = steady if fast_path and not every_step else None
        attach = getattr(policy, "attach_decode_group", None)
        if fast_path and not every_step and attach is not None:
            attach(DecodeGroup(kv, config.max_model_len))

    def start(self) -> simpy.Process:
        return self.env.process(self.process())

    # -- admission control (the engine's guard, before any policy sees a request) --
    def _admit(self, req: Request) -> None:
        reason = self._rejection_reason(req)
        if reason is None:
            self.policy.add_request(req)
            return
        req.status = RequestStatus.REJECTED
        req.reason = reason
        self.recorder.record_request(req)
        if self.on_release is not None:
            self.on_release(req, self.env.now)

    def _rejection_reason(self, req: Request) -> str | None:
        p, m, limit = req.num_prompt_tokens, req.max_tokens, self.config.max_model_len
        if p + m > limit:
            # vLLM's API server rule: prompt plus requested completion must fit.
            return f"num_prompt_tokens ({p}) + max_tokens ({m}) > max_model_len ({limit})"
        kv = self.kv
        need = kv.blocks_for(p + min(m, req.output_len) - 1)
        if kv.blocks_for(p) > kv.num_usable_blocks:
            return (f"prompt needs {kv.blocks_for(p)} KV blocks; the whole pool has "
                    f"{kv.num_usable_blocks}")
        if need > kv.num_usable_blocks:
            return (f"can never finish: needs {need} KV blocks at its end; the whole pool "
                    f"has {kv.num_usable_blocks}")
        # Optional policy hook: what this policy can never serve (e.g. a reservation
        # larger than the pool, or an unchunkable prompt over the token budget).
        policy_reason = getattr(self.policy, "rejection_reason", None)
        return policy_reason(req) if policy_reason is not None else None

    # -- the SimPy process --
    def process(self) -> Generator[simpy.Event, Any, None]:
        env, policy, arrivals, rec = self.env, self.policy, self.arrivals, self.recorder
        on_release, executor, step_time = self.on_release, self.executor, self.cost_model.step_time
        max_seqs = self.config.max_num_seqs
        idle_schedules = stall_steps = 0
        unrecorded_preemptions = 0  # from plans that ran nothing; counted with the next step
        stall_limit = self._stall_limit()
        last_preempted: Request | None = None
        while True:
            now = env.now
            for req in arrivals.pop_arrived(now):
                self._admit(req)
            if self._steady is not None and not unrecorded_preemptions:
                # (After a plan that preempted and ran nothing, the next step is planned
                # one by one: it records those preemptions, as the reference does.)
                run = self._steady(now)
                ahead = self._plan_run(run, now) if run is not None else None
                if ahead is not None:
                    yield env.timeout(ahead[0][-1] - now)
                    self._apply_run(run, *ahead)  # type: ignore[arg-type]
                    idle_schedules = stall_steps = 0
                    continue
            plan = policy.schedule(now)
            group = plan.group
            if not plan.scheduled and not group:
                nxt = arrivals.next_arrival_time()
                if policy.has_unfinished_requests():
                    idle_schedules += 1
                    if idle_schedules > MAX_IDLE_SCHEDULES:
                        self._raise_stuck()
                    if plan.preempted:
                        unrecorded_preemptions += len(plan.preempted)
                        continue  # blocks were freed: plan again at once
                    if nxt is None:
                        self._raise_stuck()
                if nxt is None:
                    wake = self.wake() if self.wake is not None else None
                    if wake is None:
                        return
                    yield wake
                    continue
                yield env.timeout(nxt - now)
                continue
            idle_schedules = 0
            if plan.preempted:
                last_preempted = plan.preempted[-1]
            sampled_before = self._num_sampled
            n_group = len(group) if group is not None else 0
            shape = (shape_of(plan.scheduled, n_group, group.ctx_sum)  # type: ignore[union-attr]
                     if n_group else shape_of(plan.scheduled))
            if executor is None:
                dt = step_time(plan.cost_shape or shape) + plan.extra_time_s
            else:
                dt = executor(plan, plan.cost_shape or shape) + plan.extra_time_s
            yield env.timeout(dt)
            end = env.now
            done = self._apply(plan, now, end)
            if n_group:  # the members head running: they are released first, as in running order
                done = self._apply_group(group, now, end) + done  # type: ignore[arg-type]
            stall_steps = 0 if self._num_sampled > sampled_before else stall_steps + 1
            if stall_steps > stall_limit:
                self._raise_stuck(last_preempted or plan.scheduled[0][0], stall_steps)
            if self.observer is not None:
                self.observer(plan, now, end)
            blocks_used = self.kv.num_used_blocks
            held = plan.num_slots_held  # before the policy releases anyone
            for req in policy.on_step_end(done, end):
                req.finish_time = end
                rec.record_request(req)
                if on_release is not None:
                    on_release(req, end)
            useful = len(plan.scheduled) + n_group
            rec.record_step(
                now, dt, useful, shape.num_prefill_tokens, shape.num_decode_seqs,
                blocks_used, policy.num_waiting, useful, held - useful, max_seqs - held,
                len(plan.preempted) + unrecorded_preemptions,
            )
            unrecorded_preemptions = 0

    def _apply(self, plan: BatchPlan, start: float, now: float) -> list[Request]:
        """The shared update rule; returns the requests that are done generating."""
        done: list[Request] = []
        itl = self.recorder.itl
        max_len = self.config.max_model_len
        regular = 0  # tokens whose previous token came at the end of the previous step
        for req, n in plan.scheduled:
            if req.first_scheduled_time is None:
                req.first_scheduled_time = start
            c = req.num_computed_tokens + n
            req.num_computed_tokens = c
            p = req.num_prompt_tokens
            o = req.num_output_tokens
            if c < p + o:
                continue  # partial prefill chunk: no token sampled
            o += 1
            req.num_output_tokens = o
            self._num_sampled += 1
            if o == 1:
                req.first_token_time = now
            elif req.last_token_time == start:
                regular += 1
            else:
                itl.append(now - req.last_token_time)  # type: ignore[operator]
            req.last_token_time = now
            if o >= req.output_len or o >= req.max_tokens or p + o >= max_len:
                _finish(req)
                done.append(req)
        if regular:
            self.recorder.itl_step_s.append(now - start)
            self.recorder.itl_step_count.append(regular)
        return done

    def _apply_group(self, group: DecodeGroup, start: float, end: float) -> list[Request]:
        """The update rule for a decode group's members: one token each, all regular ITL
        samples of this step; returns the members that sampled their last token."""
        n = len(group)
        self._num_sampled += n
        rec = self.recorder
        fresh = group.fresh  # joined during a stall: previous token at this step's start
        if fresh:
            rec.itl_step_s.append(end - start)
            rec.itl_step_count.append(fresh)
        # The others' previous token came at group.last_end: the end of the previous
        # step, or earlier when the policy ran steps without the group (a shared stall).
        if n > fresh:
            rec.itl_step_s.append(end - group.last_end)
            rec.itl_step_count.append(n - fresh)
        done = group.advance(1, end)
        for req in done:
            _finish(req)
        return done

    # -- the fast path: a run of steady decode steps at once (sim/fastpath.py) --
    def _plan_run(
        self, run: SteadyDecode, now: float
    ) -> tuple[list[float], list[float], list[int]] | None:
        """Step boundaries, step times and per-step new blocks of the longest safe run, or None when
        fewer than two steps are safe (the step-by-step path is as cheap then)."""
        reqs, group = run.requests, run.group
        if not reqs:
            return None
        if group is not None:
            # The run may end with the step in which members sample their last token.
            k = min(group.steps_to_first_finish() + 1, MAX_RUN_STEPS)
            if k < 2:
                return None
            k = group.safe_steps(k, self.kv.num_free_blocks)
            new_blocks: list[int] = []  # allocated by _apply_run for the final length
        else:
            k = min(remaining_steps(reqs, self.config.max_model_len), MAX_RUN_STEPS)
            if k < 2:
                return None
            k, new_blocks = safe_steps(reqs, self.kv.block_size, self.kv.num_free_blocks, k)
        if k < 2:
            return None
        times, dts = step_times(run, self.cost_model, now, k,
                                self.arrivals.next_arrival_time(),
                                self._routing_time() if self._routing_time else None)
        if len(times) < 3:
            return None
        return times, dts, new_blocks

    def _apply_run(self, run: SteadyDecode, times: list[float], dts: list[float],
                   new_blocks: list[int]) -> None:
        """What len(times) - 1 step-by-step updates would have done, at once."""
        k = len(times) - 1
        reqs, kv, rec = run.requests, self.kv, self.recorder
        start, end, bs = times[0], times[k], kv.block_size
        regular0 = 0
        group = run.group
        finished: list[Request] = []
        if group is not None:
            new_blocks = group.allocate_for_steps(k, kv.num_free_blocks)  # type: ignore[assignment]
            assert new_blocks is not None, "fast path: blocks checked by safe_steps"
            n = len(group)
            fresh = group.fresh
            if fresh:  # a shared stall before the run, and members that joined during it
                rec.itl_step_s.append(times[1] - start)
                rec.itl_step_count.append(fresh)
                if n > fresh:
                    rec.itl_step_s.append(times[1] - group.last_end)
                    rec.itl_step_count.append(n - fresh)
            elif group.last_end != start:  # a shared stall before the run (see DecodeGroup)
                rec.itl.extend([times[1] - group.last_end] * n)
            else:
                regular0 = n
            # Members whose last token comes in the run's last step (its only finishes).
            finished = group.advance(k, end)
            reqs = ()
        else:
            n = len(reqs)
        for r in reqs:
            if r.last_token_time == start:
                regular0 += 1
            else:
                rec.itl.append(times[1] - r.last_token_time)  # type: ignore[operator]
            c = r.num_computed_tokens + k
            r.num_computed_tokens = c
            r.num_output_tokens += k
            r.last_token_time = end
            if len(r.block_ids) * bs < c and kv.allocate_up_to(r, c) is None:
                raise AssertionError("fast path: blocks checked by safe_steps did not fit")
        self._num_sampled += n * k
        advance = getattr(self.policy, "advance", None)
        if advance is not None:
            advance(k)
        used = list(accumulate(new_blocks[:k], initial=kv.num_used_blocks - sum(new_blocks[:k])))
        del used[0]  # blocks held in each step of the run
        held = len(run.holders)
        rec.record_decode_run(times, dts, n, used, self.policy.num_waiting, held - n,
                              self.config.max_num_seqs - held)
        if regular0:
            rec.itl_step_s.append(times[1] - start)
            rec.itl_step_count.append(regular0)
        if k > 1:
            rec.itl_step_s.extend(map(sub, times[2:k + 1], times[1:k]))
            rec.itl_step_count.extend(array("q", [n]) * (k - 1))
        if finished:  # released after the last step's row, as the step-by-step path does
            for req in finished:
                _finish(req)
            on_release = self.on_release
            for req in self.policy.on_step_end(finished, end):
                req.finish_time = end
                rec.record_request(req)
                if on_release is not None:
                    on_release(req, end)

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
            f"{what} at t={self.env.now:.6f}s while work is waiting: {who}; "
            f"free KV blocks {self.kv.num_free_blocks}/{self.kv.num_usable_blocks}"
        )
