"""The engine: one SimPy process per replica that runs what the policy plans.

Each iteration: hand arrived requests to the policy (rejecting those that can never be
served), ask the policy for a BatchPlan, ask the cost model for the step time, ``yield
env.timeout(dt)``, then apply the one shared update rule: num_computed_tokens += n; when a
request's computed tokens reach its known tokens it samples one output token (the first
sets first_token_time); after min(output_len, max_tokens) tokens, or at max_model_len, it
is done and the policy releases it. With no work the engine waits on the next arrival's
timeout event; it never polls. The engine decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol

import simpy

from sim.batch import BatchPlan, shape_of
from sim.config import SchedulerConfig
from sim.cost_model import CostModel
from sim.kv_cache import KVCacheManager
from sim.metrics import Recorder
from sim.request import Request, RequestStatus
from sim.source import ArrivalSource

#: Consecutive schedule() calls that plan nothing while work is waiting before the
#: engine gives up with SchedulerStuck instead of hanging.
MAX_IDLE_SCHEDULES = 1000


#: Called after each step's update, before the policy releases finished requests, with
#: (plan, step_start_s, step_end_s). Used for slot diagrams and traces of small runs.
StepObserver = Callable[[BatchPlan, float, float], None]


class SchedulerStuck(RuntimeError):
    """The policy planned nothing while requests were waiting and nothing could change."""


class Scheduler(Protocol):
    """The engine's view of a policy (see policies/base.py for the full protocol)."""

    def add_request(self, request: Request) -> None: ...

    def schedule(self, now: float) -> BatchPlan: ...

    def on_step_end(self, done: list[Request], now: float) -> list[Request]: ...

    def has_unfinished_requests(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    def stuck_request(self) -> Request | None: ...


class Engine:
    """One replica: a policy, a KV cache, a cost model, fed by an arrival source.

    ``process()`` is the SimPy process; ``Engine.start(env)`` registers it. Raises
    SchedulerStuck (naming the stuck request) rather than hang.
    """

    def __init__(
        self, env: simpy.Environment, *, policy: Scheduler, cost_model: CostModel,
        kv: KVCacheManager, config: SchedulerConfig, arrivals: ArrivalSource,
        recorder: Recorder, observer: StepObserver | None = None,
    ) -> None:
        self.env = env
        self.policy = policy
        self.cost_model = cost_model
        self.kv = kv
        self.config = config
        self.arrivals = arrivals
        self.recorder = recorder
        self.observer = observer

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
        return None

    # -- the SimPy process --
    def process(self) -> Generator[simpy.Event, Any, None]:
        env, policy, arrivals, rec = self.env, self.policy, self.arrivals, self.recorder
        max_seqs = self.config.max_num_seqs
        idle_schedules = 0
        while True:
            now = env.now
            for req in arrivals.pop_arrived(now):
                self._admit(req)
            plan = policy.schedule(now)
            if not plan.scheduled:
                nxt = arrivals.next_arrival_time()
                if policy.has_unfinished_requests():
                    idle_schedules += 1
                    if nxt is None or idle_schedules > MAX_IDLE_SCHEDULES:
                        self._raise_stuck()
                    if plan.preempted:
                        continue
                if nxt is None:
                    return
                yield env.timeout(nxt - now)
                continue
            idle_schedules = 0
            shape = shape_of(plan.scheduled)
            dt = self.cost_model.step_time(plan.cost_shape or shape) + plan.extra_time_s
            yield env.timeout(dt)
            end = env.now
            done = self._apply(plan, now, end)
            if self.observer is not None:
                self.observer(plan, now, end)
            blocks_used = self.kv.num_used_blocks
            for req in policy.on_step_end(done, end):
                req.finish_time = end
                rec.record_request(req)
            useful = len(plan.scheduled)
            held = plan.num_slots_held
            rec.record_step(
                now, dt, useful, shape.num_prefill_tokens, shape.num_decode_seqs,
                blocks_used, policy.num_waiting, useful, held - useful, max_seqs - held,
                len(plan.preempted),
            )

    def _apply(self, plan: BatchPlan, start: float, now: float) -> list[Request]:
        """The shared update rule; returns the requests that are done generating."""
        done: list[Request] = []
        itl = self.recorder.itl
        max_len = self.config.max_model_len
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
            if o == 1:
                req.first_token_time = now
            else:
                itl.append(now - req.last_token_time)  # type: ignore[operator]
            req.last_token_time = now
            if o >= req.output_len:
                req.finish_reason = "stop"
            elif o >= req.max_tokens or p + o >= max_len:
                req.finish_reason = "length"
            else:
                continue
            req.status = RequestStatus.FINISHED
            done.append(req)
        return done

    def _raise_stuck(self) -> None:
        req = self.policy.stuck_request()
        who = (f"request {req.request_id} (num_prompt_tokens {req.num_prompt_tokens}, "
               f"status {req.status.value})" if req is not None else "unknown request")
        raise SchedulerStuck(
            f"no progress at t={self.env.now:.6f}s while work is waiting: {who}; "
            f"free KV blocks {self.kv.num_free_blocks}/{self.kv.num_usable_blocks}"
        )
