"""Waiting queues: FCFS (a deque with push-front for preempted requests), priority
(lower value first, ties by arrival time, as vLLM's ``RequestQueue`` for the priority
policy), ``sjf`` (shortest prompt first: realizable, the prompt is known at arrival) and
``oracle-srpt`` (shortest true remaining output first) and ``lpm`` (longest cached prefix
first, SGLang's cache-aware order; needs a prefix cache). oracle-srpt reads ``output_len``
(in the finish limit, ``max_output_tokens``), which no real engine knows: it is an
unrealizable bound to compare against, not a policy."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from sim.request import Request


class WaitingQueue(Protocol):
    def push(self, req: Request) -> None: ...
    def push_front(self, req: Request) -> None: ...
    def peek(self) -> Request: ...
    def pop(self) -> Request: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Request]: ...


class FCFSQueue:
    """Arrival order; preempted requests go back to the head (vLLM ``prepend_request``)."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def push(self, req: Request) -> None:
        self._q.append(req)

    def push_front(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


#: SGLang turns ``lpm`` into FCFS while more requests than this wait (the prefix matching
#: and sorting would cost the scheduler too much; ``schedule_policy.py``).
LPM_MAX_WAITING = 128


class LPMQueue(FCFSQueue):
    """SGLang's ``lpm``: arrival order, re-sorted once per step by the cached prefix
    each request would hit, longest first (stable, so ties keep arrival order); left in
    arrival order while more than LPM_MAX_WAITING wait. Preempted requests go to the
    head until the next sort."""

    __slots__ = ()

    def order(self, cached_tokens: Callable[[Request], int]) -> None:
        if 1 < len(self._q) <= LPM_MAX_WAITING:
            self._q = deque(sorted(self._q, key=lambda r: -cached_tokens(r)))


class KeyedQueue:
    """A heap ordered by a key; push_front is a plain push (the key decides), as in
    vLLM's priority queue. Ties fall back to the request's workload index."""

    __slots__ = ("_h", "_key")

    def __init__(self, key: str) -> None:
        self._h: list[tuple[tuple[float, ...], int, Request]] = []
        self._key = key

    def _k(self, r: Request) -> tuple[float, ...]:
        if self._key == "priority":
            return (r.priority, r.arrival_time)
        if self._key == "oracle-srpt":
            # The one place a policy reads output_len (in the finish limit), under a name
            # that says so.
            return (r.max_output_tokens - r.num_output_tokens, r.arrival_time)
        return (r.num_prompt_tokens, r.arrival_time)

    def push(self, req: Request) -> None:
        heapq.heappush(self._h, (self._k(req), req.index, req))

    def push_front(self, req: Request) -> None:
        """A preempted request goes back by its key, like any other."""
        self.push(req)

    def peek(self) -> Request:
        return self._h[0][2]

    def pop(self) -> Request:
        return heapq.heappop(self._h)[2]

    def __len__(self) -> int:
        return len(self._h)

    def __iter__(self) -> Iterator[Request]:
        return (e[2] for e in sorted(self._h, key=lambda e: (e[0], e[1])))


def make_queue(order: str) -> WaitingQueue:
    """``fcfs`` | ``priority`` | ``sjf`` (shortest prompt first) | ``oracle-srpt`` |
    ``lpm`` (the policy re-sorts it each step by cached prefix)."""
    if order == "fcfs":
        return FCFSQueue()
    if order == "lpm":
        return LPMQueue()
    if order in ("priority", "sjf", "oracle-srpt"):
        return KeyedQueue(order)
    raise ValueError(
        f"queue must be one of fcfs, priority, sjf, oracle-srpt, lpm, got {order!r}")
