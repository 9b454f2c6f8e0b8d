"""Several identical engines behind a router, in one SimPy environment: the mechanism.

Owns each replica's router-side state (``Replica``: inbox, pool, recorder, counters; the
``sim.interface.ReplicaView`` a router reads), the routing instants (``Dispatcher``), each
replica's inbox (the ArrivalSource its engine pulls from) and the merge of per-replica
records into one run. Which replica gets a request is the injected router's decision
(``sim.interface.Router``; the built-in ones are in policies/routers.py), taken at the
request's arrival time from the replicas' state at that time.

How arrivals flow. The dispatcher holds the run's one arrival source. It routes every
request with arrival_time <= now whenever either (a) its own timer fires at the next
arrival time, or (b) any replica's engine pulls from its inbox; (b) makes routing
independent of the order SimPy happens to process simultaneous events, so an arrival at
the very instant a step ends is seen by that step's successor, exactly as with one
engine. The timer is urgent: at an arrival time it fires before any engine applies a step
ending then, so the router decides from a well-defined state (every step that ended
before applied, none that ends then), which the engines' fast path reproduces
(sim/engine.py). An idle engine waits on a wake event (the engine's ``wake`` hook) that
the dispatcher fires when it routes a request to it. Closed-loop clients work the same
way: a release schedules the user's next request in the source, and the dispatcher is
told to set its timer.

A state-free router (``sim.interface.StateFreeRouter``: its choice reads no replica's
state) is asked ahead, in arrival order, whenever an engine looks for its next arrival,
for open-loop arrivals. Each replica then pulls its own requests at their arrival times
as one engine pulls from its source: the dispatcher keeps no timer, an idle engine waits
for its own next arrival, and a replica's runs stop only before the arrivals routed to it.

With ``--prefix-cache`` each replica has its own cache; the summary's ``prefix_cache``
sums their statistics, and each per-replica summary has its own.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from sim.config import SchedulerConfig
from sim.cost_model import CostModel
from sim.engine import Engine, ReleaseHook
from sim.interface import Router, RouterStart, Scheduler, StateFreeRouter, declares
from sim.kv.block_pool import KVCacheManager
from sim.kv.factory import make_kv
from sim.kv.prefix_cache import PrefixCachingKV, cache_summary
from sim.latency_stats import ItlSamples
from sim.metrics import Recorder, summarize
from sim.request import Request
from sim.simulate import SimResult, progress_slices
from sim.source import ArrivalSource, ClosedLoopArrivals
from sim.table import concat_tables


@dataclass(slots=True, eq=False)
class Replica:
    """One engine's router-side state: its inbox, pool, recorder and counters. Routers
    read it as a ``sim.interface.ReplicaView``."""

    index: int
    kv: KVCacheManager
    recorder: Recorder
    inbox: deque[Request] = field(default_factory=deque)
    routed: list[int] = field(default_factory=list)  # workload indices routed here
    waking: simpy.Event | None = None
    not_started: deque[Request] = field(default_factory=deque)
    not_started_blocks: int = 0

    @property
    def outstanding(self) -> int:
        """Requests routed here and not yet finished or rejected."""
        return len(self.routed) - self.recorder.num_requests

    @property
    def num_routed(self) -> int:
        """Requests routed here so far."""
        return len(self.routed)

    @property
    def has_prefix_cache(self) -> bool:
        """Whether the pool is a prefix cache."""
        return isinstance(self.kv, PrefixCachingKV)

    def kv_load(self) -> float:
        """(blocks in use + prompt blocks of requests not yet started) / usable blocks."""
        self._drop_started()
        used = self.kv.num_used_blocks + self.not_started_blocks
        return used / max(self.kv.num_usable_blocks, 1)

    def _drop_started(self) -> None:
        """Forget the requests at the head of ``not_started`` that have started."""
        q = self.not_started
        while q and (q[0].first_scheduled_time is not None or q[0].is_finished):
            self.not_started_blocks -= self.kv.blocks_for(q.popleft().num_prompt_tokens)

    def prefix_hit_tokens(self, request: Request) -> int:
        """Tokens of ``request``'s prompt the prefix cache holds now (0 without one),
        recording nothing for it."""
        kv = self.kv
        return kv.peek_hit_tokens(request) if isinstance(kv, PrefixCachingKV) else 0

    def receive(self, request: Request) -> None:
        """Take ``request`` into the inbox and the counters the router reads."""
        self.inbox.append(request)
        self.routed.append(request.index)
        # Dropped as they start even when no router reads kv_load, so a long run does
        # not hold every request it routed.
        self._drop_started()
        self.not_started.append(request)
        self.not_started_blocks += self.kv.blocks_for(request.num_prompt_tokens)


class _UrgentTimeout(simpy.events.Event):
    """A timeout processed before every ordinary event of its instant (SimPy's URGENT
    priority, as its own process-start events use): the dispatcher routes at an arrival
    time before any engine applies a step ending then, so the state the router reads
    there is well defined (every step ending before applied, none ending then), whatever
    order SimPy gives the engines' simultaneous events."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, simpy.events.URGENT, delay)


class Inbox:
    """The ArrivalSource one replica's engine pulls from: what the router sent it. A
    state-free router's (Dispatcher.routes_ahead) engines get this plain source and plan
    runs as a lone engine over its source does (a chunk run admits the arrivals it goes
    past); other routers' engines get a RoutedInbox."""

    __slots__ = ("_dispatcher", "_replica")

    def __init__(self, dispatcher: Dispatcher, replica: Replica) -> None:
        self._dispatcher = dispatcher
        self._replica = replica

    def next_arrival_time(self) -> float | None:
        """The next arrival routed here: in the inbox, else routed ahead (Dispatcher)."""
        q = self._replica.inbox
        return q[0].arrival_time if q else self._dispatcher.next_arrival_ahead(self._replica)

    def pop_arrived(self, now: float) -> list[Request]:
        self._dispatcher.advance(now, self._replica)
        q = self._replica.inbox
        out: list[Request] = []
        while q and q[0].arrival_time <= now:
            out.append(q.popleft())
        return out


class RoutedInbox(Inbox):
    """An Inbox that is a ``sim.interface.RoutedArrivals``: its engine's runs end before
    the router's next routing instant, where the router reads this replica's state."""

    __slots__ = ()

    def next_routing_time(self) -> float | None:
        """The next routing instant that reads this replica's state (the dispatcher's
        ``next_routing_time``): the engine's steady runs end before it."""
        return self._dispatcher.next_routing_time()

    def next_routed_arrival_time(self) -> float | None:
        """The next arrival routed here, in the inbox or routed ahead (Dispatcher)."""
        return self.next_arrival_time()


class Dispatcher:
    """Routes each arrival of ``source`` to the replica of ``replicas`` that ``router``
    chooses, at the routing instants (module docstring), and wakes idle engines.

    Raises ValueError when ``router`` is no ``sim.interface.Router`` or its ``start``
    refuses the replicas, and when a choice is not a replica's index.
    """

    def __init__(self, env: simpy.Environment, source: ArrivalSource,
                 replicas: list[Replica], router: Router) -> None:
        if not isinstance(router, Router):
            raise ValueError(f"router must have choose(request, replicas, now) -> index "
                             f"(sim.interface.Router), got {router!r}")
        if isinstance(router, RouterStart):
            router.start(replicas)
        self.env = env
        self.source = source
        self.replicas = replicas
        self.router = router
        self._timer_at: float | None = None
        self._closed = source if isinstance(source, ClosedLoopArrivals) else None
        # A state-free router routes open-loop arrivals ahead of time (StateFreeRouter),
        # into one queue per replica that its engine pulls from.
        self._ahead = (self._closed is None and isinstance(router, StateFreeRouter)
                       and router.state_free is True and declares(router, "state_free"))
        self._ahead_queues: list[deque[Request]] = [deque() for _ in replicas]

    @property
    def routes_ahead(self) -> bool:
        """Whether the router is asked ahead (a state-free router, open-loop arrivals)."""
        return self._ahead

    def exhausted(self) -> bool:
        """No request is left to route, now or later."""
        if self._closed is not None:
            return self._closed.exhausted()
        return (self.source.next_arrival_time() is None
                and not any(self._ahead_queues))

    def next_routing_time(self) -> float | None:
        """The next routing instant at which the router reads the replicas' state: the
        next arrival; None with a state-free router (it reads none) or when none is left."""
        return None if self._ahead else self.source.next_arrival_time()

    def next_arrival_ahead(self, rep: Replica) -> float | None:
        """With a state-free router, arrival time (s) of the next request routed to
        ``rep`` and not yet received, routing ahead until there is one; None without
        one or when none will come."""
        if not self._ahead:
            return None
        queue = self._ahead_queues[rep.index]
        while not queue:
            nxt = self.source.next_arrival_time()
            if nxt is None:
                return None
            self._route_ahead(nxt)
        return queue[0].arrival_time

    def _route_ahead(self, until: float) -> None:
        """Route every arrival up to ``until`` (s) ahead, in arrival order, each at its
        arrival time."""
        queues = self._ahead_queues
        for req in self.source.pop_arrived(until):
            queues[self._choose(req, req.arrival_time)].append(req)

    def _choose(self, req: Request, now: float) -> int:
        i = self.router.choose(req, self.replicas, now)
        if not 0 <= i < len(self.replicas):
            raise ValueError(f"router {self.router!r} chose replica {i!r} for request "
                             f"{req.request_id!r}; replicas are 0..{len(self.replicas) - 1}")
        return i

    def advance(self, now: float, puller: Replica | None = None) -> None:
        """Hand every request that has arrived by ``now`` to its replica, routing it, and
        wake idle engines it reaches; with a state-free router, only ``puller``'s (the
        replica whose engine pulls), routed ahead (module docstring)."""
        if self._ahead:
            if puller is not None:
                self._route_ahead(now)
                queue = self._ahead_queues[puller.index]
                while queue and queue[0].arrival_time <= now:
                    puller.receive(queue.popleft())
            return
        reps = self.replicas
        for req in self.source.pop_arrived(now):
            i = self._choose(req, now)
            reps[i].receive(req)
            self._wake(reps[i])
        if self.exhausted():
            for rep in reps:
                self._wake(rep)  # no more work: let idle engines finish
        else:
            self.set_timer()

    def set_timer(self) -> None:
        """Make sure the dispatcher wakes at the next arrival time (a state-free router's
        replicas pull their own arrivals: no timer)."""
        if self._ahead:
            return
        nxt = self.source.next_arrival_time()
        if nxt is None or (self._timer_at is not None and self._timer_at <= nxt):
            return
        self._timer_at = nxt
        timer = _UrgentTimeout(self.env, max(nxt - self.env.now, 0.0))
        timer.callbacks.append(self._on_timer)

    def _on_timer(self, _event: simpy.Event) -> None:
        self._timer_at = None
        self.advance(self.env.now)

    def wake_event(self, rep: Replica) -> simpy.Event | None:
        """The engine's wake hook: an event fired when ``rep`` gets a request, or None
        when none will come."""
        if self._ahead:
            # Its engine asks only once no arrival is routed here or left to route.
            return None
        if self.exhausted() and not rep.inbox:
            return None
        if rep.waking is None:
            rep.waking = self.env.event()
        return rep.waking

    @staticmethod
    def _wake(rep: Replica) -> None:
        if rep.waking is not None:
            event, rep.waking = rep.waking, None
            event.succeed()


def simulate_cluster(
    source: ArrivalSource, *, num_replicas: int, router: Router, policy_factory: Any,
    config: SchedulerConfig, cost_model: CostModel, num_gpu_blocks: int, block_size: int = 16,
    slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
    progress: Callable[[int], None] | None = None, slice_s: float = math.inf,
    on_release: ReleaseHook | None = None, fast_path: bool = True,
) -> SimResult:
    """Simulate ``num_replicas`` identical engines (each its own policy, KV pool or prefix
    cache, and cost model) behind ``router`` (a ``sim.interface.Router``, such as
    ``policies.routers.make_router(name)``) until every request has finished or been
    rejected.

    The result's requests and steps carry a ``replica`` column; its summary is the whole
    cluster's (summarize over every record) with a ``replicas`` list of per-replica
    summaries. ``fast_path``: the engines' steady runs and decode groups
    (sim/fastpath.py), each run ending before the next routing instant that reads
    replica state (Dispatcher.next_routing_time); False, or
    closed-loop clients (whose next arrival a release inside another replica's run may
    bring forward), step by step. Raises ValueError for num_replicas < 1 or a router that
    refuses the replicas or chooses none of them (Dispatcher), SchedulerStuck as one
    engine does.
    """
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {num_replicas!r}")
    env = simpy.Environment()
    reps = [Replica(i, make_kv(config.prefix_cache, num_gpu_blocks, block_size), Recorder())
            for i in range(num_replicas)]
    dispatcher = Dispatcher(env, source, reps, router)

    def release(req: Request, now: float) -> None:
        if on_release is not None:
            on_release(req, now)
            dispatcher.set_timer()

    inbox = Inbox if dispatcher.routes_ahead else RoutedInbox
    procs = []
    for rep in reps:
        policy: Scheduler = policy_factory(config, rep.kv)
        engine = Engine(env, policy=policy, cost_model=cost_model, kv=rep.kv, config=config,
                        arrivals=inbox(dispatcher, rep), recorder=rep.recorder,
                        on_release=release if on_release is not None else None,
                        wake=functools.partial(dispatcher.wake_event, rep),
                        fast_path=fast_path and not isinstance(source, ClosedLoopArrivals))
        procs.append(engine.start())
    dispatcher.set_timer()
    done = simpy.AllOf(env, procs)
    for length in progress_slices(slice_s):
        if done.triggered:
            break
        env.run(until=done if math.isinf(length) else env.now + length)
        if progress is not None:
            progress(sum(r.recorder.num_requests for r in reps))
    return _merge(reps, config.max_num_seqs, num_gpu_blocks, block_size, slo_ttft_s,
                  slo_tpot_s)


def _merge(reps: list[Replica], max_num_seqs: int, num_gpu_blocks: int, block_size: int,
           slo_ttft_s: float | None, slo_tpot_s: float | None) -> SimResult:
    """One SimResult for the cluster: rows in workload order (requests) and start-time
    order (steps), each with its replica; the summary over all, plus per-replica ones."""
    kw: dict[str, Any] = {"max_num_seqs": max_num_seqs, "num_gpu_blocks": num_gpu_blocks,
                          "block_size": block_size, "slo_ttft_s": slo_ttft_s,
                          "slo_tpot_s": slo_tpot_s}
    parts, per_replica = [], []
    for rep in reps:
        req, steps = rep.recorder.request_columns(), rep.recorder.step_columns()
        itl = rep.recorder.itl_samples()
        # Sorted once: the summaries' stable sort of it, and of the replicas' sorted
        # samples one after another (a merge), ranks them as the recorded order would.
        itl_sorted = itl.sorted()
        per_replica.append({"replica": rep.index, "num_routed": len(rep.routed),
                            **summarize(req, steps, itl_sorted, **kw),
                            "prefix_cache": cache_summary([rep.kv], block_size)})
        parts.append((req, steps, itl, itl_sorted))
    req_tables, step_tables, itls, sorted_itls = (list(x) for x in zip(*parts, strict=True))
    # Each replica's table is in ascending workload index; put the whole in that order.
    order = np.argsort(np.concatenate([np.sort(np.asarray(r.routed, dtype=np.int64))
                                       for r in reps]), kind="stable")
    requests = concat_tables(req_tables, order)
    requests["replica"] = _replica_column(req_tables).take(order)
    # Each replica's steps are in start-time order and the tables follow replica order,
    # so a stable sort on start time breaks ties by replica (and merges sorted runs).
    by_start = np.argsort(np.concatenate([t["start_time"] for t in step_tables]),
                          kind="stable")
    steps = concat_tables(step_tables, by_start)
    steps["replica"] = _replica_column(step_tables).take(by_start)
    summary = summarize(requests, steps, ItlSamples.concat(sorted_itls), **kw)
    summary["prefix_cache"] = cache_summary([r.kv for r in reps], block_size)
    summary["replicas"] = per_replica
    return SimResult(requests, steps, ItlSamples.concat(itls), summary)


def _replica_column(tables: list[dict[str, np.ndarray]]) -> np.ndarray:
    """Replica numbers (int64) of the rows of the replicas' tables one after another."""
    sizes = [len(next(iter(t.values()))) for t in tables]
    return np.repeat(np.arange(len(tables), dtype=np.int64), sizes)
