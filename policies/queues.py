"""Waiting queues: FCFS (a deque with push-front for preempted requests), priority
(lower value first, ties by arrival time, as vLLM's ``RequestQueue`` for the priority
policy), ``sjf`` (shortest prompt first: realizable, the prompt is known at arrival) and
``oracle-srpt`` (shortest true remaining output first). oracle-srpt reads ``output_len``,
which no real engine knows: it is an unrealizable bound to compare against, not a policy."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
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
            # The one place a policy reads output_len, under a name that says so.
            return (min(r.output_len, r.max_tokens) - r.num_output_tokens, r.arrival_time)
        return (r.num_prompt_tokens, r.arrival_time)

    def push(self, req: Request) -> None:
        heapq.heappush(self._h, (self._k(req), req.index, req))

    push_front = push

    def peek(self) -> Request:
        return self._h[0][2]

    def pop(self) -> Request:
        return heapq.heappop(self._h)[2]

    def __len__(self) -> int:
        return len(self._h)

    def __iter__(self) -> Iterator[Request]:
        return (e[2] for e in sorted(self._h, key=lambda e: (e[0], e[1])))


def make_queue(order: str) -> WaitingQueue:
    """``fcfs`` | ``priority`` | ``sjf`` (shortest prompt first) | ``oracle-srpt``."""
    if order == "fcfs":
        return FCFSQueue()
    if order in ("priority", "sjf", "oracle-srpt"):
        return KeyedQueue(order)
    raise ValueError(f"queue must be one of fcfs, priority, sjf, oracle-srpt, got {order!r}")
