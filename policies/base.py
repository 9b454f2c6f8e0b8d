"""The Policy protocol and the shared pieces every policy uses: the waiting queue, the
running list, preemption by recompute, and victim choice.

A policy is built as ``PolicyClass(config: SchedulerConfig, kv: KVCacheManager)`` and the
engine calls: ``add_request`` at arrival, ``schedule(now) -> BatchPlan`` before each step,
``on_step_end(done, now) -> released`` after it (the policy frees the blocks of requests it
releases; the engine stamps their finish time). Policies may read a request's
``max_tokens`` but never its ``output_len`` (a workload fact no engine knows).
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from policies.queues import make_queue
from sim.batch import BatchPlan
from sim.config import SchedulerConfig
from sim.kv_cache import KVCacheManager
from sim.request import Request, RequestStatus


@runtime_checkable
class Policy(Protocol):
    """What the engine calls. See the module docstring for the contract."""

    name: ClassVar[str]

    def add_request(self, request: Request) -> None: ...

    def schedule(self, now: float) -> BatchPlan: ...

    def on_step_end(self, done: list[Request], now: float) -> list[Request]: ...

    def has_unfinished_requests(self) -> bool: ...

    @property
    def num_waiting(self) -> int: ...

    def stuck_request(self) -> Request | None: ...


class QueuePolicy:
    """Base for policies with a waiting queue and a running list (vLLM's shape)."""

    name: ClassVar[str] = "base"

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting = make_queue(config.queue)
        self.running: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.waiting.push(request)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def stuck_request(self) -> Request | None:
        return self.waiting.peek() if len(self.waiting) else None

    def on_step_end(self, done: list[Request], now: float) -> list[Request]:
        """Release finished requests at once: free their blocks and slots."""
        if done:
            for req in done:
                self.kv.free(req)
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return done

    # -- shared helpers --
    def pick_victim(self) -> Request:
        """The running request to preempt: the tail (most recently admitted) under FCFS
        and SJF; the largest (priority, arrival_time) under priority, first such in
        running order (vLLM 0.33 ``Scheduler.schedule``). vLLM's arrival times are never
        equal; simulated ones can be, so ties fall to the later arrival (workload index)."""
        if self.config.queue == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time, r.index))
        return self.running[-1]

    def preempt(self, req: Request) -> None:
        """Preempt by recompute: free the blocks, forget computed tokens (generated tokens
        are kept and recomputed), put the request at the head of waiting."""
        self.running.remove(req)
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.push_front(req)

    def admit(self, req: Request) -> None:
        """Move the head of waiting into running."""
        self.waiting.pop()
        req.status = RequestStatus.RUNNING
        self.running.append(req)
