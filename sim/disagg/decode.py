"""The decode pool's side of the hand-over: each decode engine's inbox (``DecodeInbox``)
and its queue of prefilled requests waiting for blocks (``DecodeGate``).

The rule, as vLLM's KV connector runs it (vllm-project/vllm
vllm/v1/core/sched/scheduler.py at commit 00024d3, with the NixlConnector): the decode
instance's scheduler takes the request into its waiting queue; at its turn it allocates
blocks for the whole prompt (``allocate_slots`` for the connector's external tokens)
and, when they do not fit, leaves it waiting (FCFS: nothing behind it is looked at);
once allocated, the worker reads the prompt's KV from the prefill instance into them
(WAITING_FOR_REMOTE_KVS), and the prefill instance, which delayed freeing the request's
blocks when it finished (``request_finished`` returning delay_free_blocks), frees them
when that read is done. When the read has landed the request is waiting again with
num_computed_tokens = num_prompt_tokens - 1 (``_update_waiting_for_remote_kv``: a fully
computed prompt recomputes its last token), so its first decode step computes that one
token and samples the first output token the client sees.

The gate stands for the part of that waiting queue behind the engine's own waiting
requests: it allocates only for what the free blocks hold after the prompts of the
requests waiting ahead in the engine (delivered, not yet admitted), and not at all while
a request it did not deliver waits there (one preempted: it goes first). It takes its
turn when a prefilled request arrives at it and when its engine releases a request: at
instants the engine's fast path reaches exactly (a run ends at its first release), never
inside a run.
Two simplifications: vLLM also looks at its waiting queue only while fewer than
max_num_seqs requests run, which the gate does not check; and once the KV has landed
the request enters the engine's waiting queue with its computed tokens but gives its
blocks back, the policy allocating them again when it admits the request (at the next
step, the gate having kept them free), so that no waiting request holds blocks a
preempted one ahead of it needs (vLLM keeps them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from sim.cluster import Replica
from sim.request import Request


class DecodeInbox:
    """The ArrivalSource (and sim.interface.RoutedArrivals) one decode engine pulls from:
    prefilled requests whose KV has landed, and short prompts kept local, each ready at
    the time it was put in. ``bound()`` gives a lower bound on when the next request can
    reach any decode engine (the fast path's runs end before it); ``in_flight()`` one on
    when a transfer to this engine ends (None: none is under way)."""

    __slots__ = ("_bound", "_in_flight", "ready")

    def __init__(self, bound: Callable[[], float | None],
                 in_flight: Callable[[], float | None]) -> None:
        self.ready: deque[tuple[float, Request]] = deque()
        self._bound = bound
        self._in_flight = in_flight

    def put(self, req: Request, now: float) -> None:
        self.ready.append((now, req))

    def next_arrival_time(self) -> float | None:
        """The head's ready time; with none, a lower bound on the end of a transfer to
        this engine (an engine whose waiting requests wait for those blocks polls then,
        rather than be taken for stuck)."""
        return self.ready[0][0] if self.ready else self._in_flight()

    def next_routing_time(self) -> float | None:
        return self._bound()

    def next_routed_arrival_time(self) -> float | None:
        return self.ready[0][0] if self.ready else None

    def pop_arrived(self, now: float) -> list[Request]:
        q = self.ready
        out: list[Request] = []
        while q and q[0][0] <= now:
            out.append(q.popleft()[1])
        return out


@dataclass(slots=True, eq=False)
class Waiting:
    """A prefilled request at a decode engine's gate: the decode engine's request, the
    prefill engine's index and the blocks it holds there (a stand-in request)."""

    request: Request
    prefill_replica: int
    held: Request


class DecodeGate:
    """One decode engine's queue of prefilled requests waiting for blocks (module
    docstring), FCFS. ``admit`` allocates the head's prompt blocks in the engine's pool
    while they fit beside ``reserved()`` (module docstring) and hands each to
    ``transfer``; a request the pool can never hold goes
    to ``hand_over`` at once (the engine's guard rejects it, as vLLM's would)."""

    __slots__ = ("_hand_over", "_max_model_len", "_reserved", "_transfer", "queue",
                 "replica")

    def __init__(self, replica: Replica, max_model_len: int,
                 transfer: Callable[[Waiting], None], hand_over: Callable[[Waiting], None],
                 reserved: Callable[[], int | None]) -> None:
        self.replica = replica
        self.queue: deque[Waiting] = deque()
        self._max_model_len = max_model_len
        self._transfer = transfer
        self._hand_over = hand_over
        # Blocks the requests waiting ahead in the engine will take; None while one the
        # gate cannot size (a preempted request) waits there.
        self._reserved = reserved

    def admit(self) -> None:
        kv, q = self.replica.kv, self.queue
        while q:
            w = q[0]
            req = w.request
            if self._never_fits(req):
                q.popleft()
                self._hand_over(w)
                continue
            reserved = self._reserved()
            if reserved is None or (kv.blocks_for(req.num_prompt_tokens) + reserved
                                    > kv.num_free_blocks):
                return
            got = kv.allocate_up_to(req, req.num_prompt_tokens)
            assert got is not None, "checked above"
            q.popleft()
            self._transfer(w)

    def _never_fits(self, req: Request) -> bool:
        """Whether the engine's guard would reject ``req`` (sim/engine.py): a prompt or
        its last token beyond the whole pool."""
        kv, p = self.replica.kv, req.num_prompt_tokens
        limit = min(req.output_len, req.max_tokens, self._max_model_len - p)
        return max(kv.blocks_for(p), kv.blocks_for(p + limit - 1)) > kv.num_usable_blocks


def fire(replica: Replica) -> None:
    """Fire ``replica``'s wake event, if its engine waits on one."""
    if replica.waking is not None:
        event, replica.waking = replica.waking, None
        event.succeed()


def wake_event(env: simpy.Environment, replica: Replica) -> simpy.Event:
    """The event ``replica``'s idle engine waits on (made once, fired by ``fire``)."""
    if replica.waking is None:
        replica.waking = env.event()
    return replica.waking
