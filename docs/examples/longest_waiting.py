"""A user policy: longest waiting first (docs/policies.md walks through it).

Run it with ``servesim run --policy docs/examples/longest_waiting.py:LongestWaitingFirst``.

It keeps vLLM V1's chunked-prefill mechanics (running requests first, preemption under KV
pressure) and changes one decision: which waiting request goes next. FCFS puts a preempted
request back at the head of the queue; here the next request is the one that has waited
longest since it was last served (its last token, or its arrival if it has none), so a
request preempted a moment ago queues behind one that has not run at all.

Its class defines no method but ``__init__``, so it keeps ChunkedPolicy's fast-path
promise; a subclass that overrides a method (``schedule()`` or any helper) runs step by
step until it declares the promise itself (docs/policies.md, "The fast path and your
policy").
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import ClassVar

from policies.chunked import ChunkedPolicy
from sim.config import SchedulerConfig
from sim.kv.block_pool import KVCacheManager
from sim.request import Request


class LongestWaitingQueue:
    """The waiting queue: least recently served first; ties by workload order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []

    def push(self, req: Request) -> None:
        since = req.last_token_time if req.last_token_time is not None else req.arrival_time
        heapq.heappush(self._heap, (since, req.index, req))

    push_front = push  # a preempted request gets no head start

    def peek(self) -> Request:
        return self._heap[0][2]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[2] for entry in sorted(self._heap, key=lambda e: e[:2]))


class LongestWaitingFirst(ChunkedPolicy):
    """Chunked prefill with a longest-waiting-first queue."""

    name: ClassVar[str] = "longest-waiting-first"

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        super().__init__(config, kv)
        self.waiting = LongestWaitingQueue()
