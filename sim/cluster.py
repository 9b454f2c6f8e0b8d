"""Several identical engines behind a router, in one SimPy environment.

Owns the Router (which replica gets each request, decided at the request's arrival time
from the replicas' state at that time), each replica's inbox (the ArrivalSource its engine
pulls from) and the merge of per-replica records into one run.

How arrivals flow. The router holds the run's one arrival source. It routes every request
with arrival_time <= now whenever either (a) its own timer fires at the next arrival time,
or (b) any replica's engine pulls from its inbox; (b) makes routing independent of the
order SimPy happens to process simultaneous events, so an arrival at the very instant a
step ends is seen by that step's successor, exactly as with one engine. The timer is
urgent: at an arrival time it fires before any engine applies a step ending then, so
the router decides from a well-defined state (every step that ended before applied, none
that ends then), which the engines' fast path reproduces (sim/engine.py). An idle engine
waits on a wake event (the engine's ``wake`` hook) that the router fires when it routes a
request to it. Closed-loop clients work the same way: a release schedules the user's next
request in the source, and the router is told to set its timer.

Routers (ties always go to the replica routed to least so far, then the lowest index, so a
run is deterministic):

- ``round-robin``: request i goes to replica i mod N, whatever their state.
- ``least-outstanding``: fewest requests routed and not yet finished or rejected.
- ``least-kv``: lowest KV load = (blocks in use + blocks the prompts routed but not yet
  started will need) / usable blocks, i.e. the engine's KV-usage gauge plus what the
  router knows it has queued there.
- ``cache-aware`` (needs a prefix cache): the SGLang model gateway's ``cache_aware``
  policy, reading each replica's cache itself: least-outstanding while the load is
  imbalanced (the BALANCE thresholds below), else the replica whose cache holds the
  longest prefix of the prompt when that covers more than CACHE_THRESHOLD of it, else
  least-kv.
- ``cache-aware-approx``: the SGLang router's ``cache_aware`` as it ships, with its
  approximate tree (sim/router_tree.py) of the prompts it routed instead of the caches
  themselves: the same load guard (routing by load inserts the prompt too), else the
  replica holding the longest routed prefix when that covers more than CACHE_THRESHOLD
  of the prompt, else the replica whose tree is smallest; the prompt is then recorded
  under the chosen replica. Needs no cache to run (it decides where prefixes would be).

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
from sim.engine import Engine, ReleaseHook, Scheduler
from sim.kv.block_pool import KVCacheManager
from sim.kv.factory import make_kv
from sim.kv.prefix_cache import PrefixCachingKV, cache_summary
from sim.kv.prefix_content import Segments, unique_segment_id
from sim.latency_stats import ItlSamples
from sim.metrics import Recorder, summarize
from sim.request import Request
from sim.router_tree import ApproxPrefixTree, prompt_path
from sim.simulate import SimResult, progress_slices
from sim.source import ArrivalSource, ClosedLoopArrivals

ROUTERS = ("round-robin", "least-outstanding", "least-kv", "cache-aware",
           "cache-aware-approx")
# cache-aware: the values the SGLang model gateway (SMG) documents for its cache_aware
# policy (docs/getting-started/load-balancing.md): route by load when the busiest and
# the idlest replica differ by more than 64 outstanding requests and by more than 1.5x;
# otherwise to the longest cached prefix if it covers more than 0.3 of the prompt.
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5


@dataclass(slots=True, eq=False)
class Replica:
    """One engine's router-side state: its inbox, pool, recorder and counters."""

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

    def kv_load(self) -> float:
        """(blocks in use + prompt blocks of requests not yet started) / usable blocks."""
        q = self.not_started
        while q and (q[0].first_scheduled_time is not None or q[0].is_finished):
            self.not_started_blocks -= self.kv.blocks_for(q.popleft().num_prompt_tokens)
        used = self.kv.num_used_blocks + self.not_started_blocks
        return used / max(self.kv.num_usable_blocks, 1)


class _UrgentTimeout(simpy.events.Event):
    """A timeout processed before every ordinary event of its instant (SimPy's URGENT
    priority, as its own process-start events use): the router routes at an arrival
    time before any engine applies a step ending then, so the state it reads there is
    well defined (every step ending before applied, none ending then), whatever order
    SimPy gives the engines' simultaneous events."""

    def __init__(self, env: simpy.Environment, delay: float) -> None:
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, simpy.events.URGENT, delay)


class Inbox:
    """The ArrivalSource one replica's engine pulls from: what the router sent it."""

    __slots__ = ("_replica", "_router")

    def __init__(self, router: Router, replica: Replica) -> None:
        self._router = router
        self._replica = replica

    def next_arrival_time(self) -> float | None:
        q = self._replica.inbox
        return q[0].arrival_time if q else None

    def next_routing_time(self) -> float | None:
        """The router's next routing instant (its source's next arrival): the engine's
        steady runs end before it."""
        return self._router.source.next_arrival_time()

    def pop_arrived(self, now: float) -> list[Request]:
        self._router.advance(now)
        q = self._replica.inbox
        out: list[Request] = []
        while q and q[0].arrival_time <= now:
            out.append(q.popleft())
        return out


class Router:
    """Routes each arrival of ``source`` to one of ``replicas`` by ``policy`` (ROUTERS).
    ``segments``: a request's prompt as segments, for cache-aware-approx (default: its
    ``prompt_segments``, else a segment of its own).

    Raises ValueError naming router for an unknown policy.
    """

    def __init__(self, env: simpy.Environment, source: ArrivalSource,
                 replicas: list[Replica], policy: str,
                 segments: Callable[[Request], Segments] | None = None) -> None:
        if policy not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {policy!r}")
        if policy == "cache-aware" and not all(isinstance(r.kv, PrefixCachingKV)
                                               for r in replicas):
            raise ValueError("router cache-aware needs a prefix cache (prefix_cache block "
                             "or radix)")
        self.env = env
        self.source = source
        self.replicas = replicas
        self.policy = policy
        self._count = 0
        self._timer_at: float | None = None
        self._closed = source if isinstance(source, ClosedLoopArrivals) else None
        self._segments = segments or _own_segments
        self._tree = (ApproxPrefixTree(len(replicas)) if policy == "cache-aware-approx"
                      else None)

    def exhausted(self) -> bool:
        """No request is left to route, now or later."""
        if self._closed is not None:
            return self._closed.exhausted()
        return self.source.next_arrival_time() is None

    def advance(self, now: float) -> None:
        """Route every request that has arrived by ``now``; wake idle engines it reaches."""
        if self._tree is not None:
            self._tree.evict_due(now)
        for req in self.source.pop_arrived(now):
            rep = self._choose(req)
            self._count += 1
            rep.inbox.append(req)
            rep.routed.append(req.index)
            rep.not_started.append(req)
            rep.not_started_blocks += rep.kv.blocks_for(req.num_prompt_tokens)
            self._wake(rep)
        if self.exhausted():
            for rep in self.replicas:
                self._wake(rep)  # no more work: let idle engines finish
        else:
            self.set_timer()

    def set_timer(self) -> None:
        """Make sure the router wakes at the source's next arrival time."""
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

    def _choose(self, req: Request) -> Replica:
        reps = self.replicas
        if self._tree is not None:
            return self._choose_approx(req, self._tree)
        if self.policy == "round-robin":
            return reps[self._count % len(reps)]
        if self.policy == "least-outstanding" or (
                self.policy == "cache-aware" and self._imbalanced()):
            return min(reps, key=lambda r: (r.outstanding, len(r.routed), r.index))
        if self.policy == "cache-aware":
            hits = [r.kv.peek_hit_tokens(req) for r in reps]  # type: ignore[attr-defined]
            best = min(reps, key=lambda r: (-hits[r.index], r.outstanding, len(r.routed),
                                            r.index))
            if hits[best.index] > CACHE_THRESHOLD * req.num_prompt_tokens:
                return best
        return min(reps, key=lambda r: (r.kv_load(), r.outstanding, len(r.routed), r.index))

    def _choose_approx(self, req: Request, tree: ApproxPrefixTree) -> Replica:
        """cache-aware-approx (sgl-router ``CacheAwarePolicy::select_worker``): by load
        when imbalanced, else by the tree's longest match above CACHE_THRESHOLD (its
        holder's path refreshed either way), else the smallest tree; the prompt is
        inserted under the replica chosen."""
        reps = self.replicas
        path = prompt_path(self._segments(req))
        if self._imbalanced():
            rep = min(reps, key=lambda r: (r.outstanding, len(r.routed), r.index))
        else:
            matched, holders, depth = tree.match(path)
            holder = min((reps[t] for t in holders),
                         key=lambda r: (r.outstanding, len(r.routed), r.index), default=None)
            if holder is not None:
                tree.touch(path[:depth], holder.index)
            if holder is not None and matched > CACHE_THRESHOLD * req.num_prompt_tokens:
                rep = holder
            else:
                size = tree.size_tokens
                rep = min(reps, key=lambda r: (size[r.index], r.outstanding, len(r.routed),
                                               r.index))
        tree.insert(path, rep.index)
        return rep

    def _imbalanced(self) -> bool:
        """The cache-aware router's load guard: outstanding requests of the busiest and
        the idlest replica differ by more than BALANCE_ABS_THRESHOLD and
        BALANCE_REL_THRESHOLD times."""
        loads = [r.outstanding for r in self.replicas]
        hi, lo = max(loads), min(loads)
        return hi - lo > BALANCE_ABS_THRESHOLD and hi > BALANCE_REL_THRESHOLD * lo


def simulate_cluster(
    source: ArrivalSource, *, num_replicas: int, router: str, policy_factory: Any,
    config: SchedulerConfig, cost_model: CostModel, num_gpu_blocks: int, block_size: int = 16,
    slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
    progress: Callable[[int], None] | None = None, slice_s: float = math.inf,
    on_release: ReleaseHook | None = None, fast_path: bool = True,
    prompt_segments: Callable[[Request], Segments] | None = None,
) -> SimResult:
    """Simulate ``num_replicas`` identical engines (each its own policy, KV pool or prefix
    cache, and cost model) behind ``router`` until every request has finished or been
    rejected.

    The result's requests and steps carry a ``replica`` column; its summary is the whole
    cluster's (summarize over every record) with a ``replicas`` list of per-replica
    summaries. ``fast_path``: the engines' steady runs and decode groups
    (sim/fastpath.py), each run ending before the router's next routing instant; False,
    or closed-loop clients (whose next arrival a release inside another replica's run may
    bring forward), step by step. ``prompt_segments``: each request's prompt as
    segments, for the cache-aware-approx router (see Router). Raises ValueError for
    num_replicas < 1 or an unknown router, SchedulerStuck as one engine does.
    """
    if int(num_replicas) != num_replicas or num_replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {num_replicas!r}")
    env = simpy.Environment()
    reps = [Replica(i, make_kv(config.prefix_cache, num_gpu_blocks, block_size), Recorder())
            for i in range(num_replicas)]
    rt = Router(env, source, reps, router, prompt_segments)

    def release(req: Request, now: float) -> None:
        if on_release is not None:
            on_release(req, now)
            rt.set_timer()

    procs = []
    for rep in reps:
        policy: Scheduler = policy_factory(config, rep.kv)
        engine = Engine(env, policy=policy, cost_model=cost_model, kv=rep.kv, config=config,
                        arrivals=Inbox(rt, rep), recorder=rep.recorder, on_release=release,
                        wake=functools.partial(rt.wake_event, rep),
                        fast_path=fast_path and not isinstance(source, ClosedLoopArrivals))
        procs.append(engine.start())
    rt.set_timer()
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
    req_tables, step_tables, itls, per_replica = [], [], [], []
    for rep in reps:
        req = rep.recorder.request_columns()
        steps = rep.recorder.step_columns()
        itl = rep.recorder.itl_samples()
        per_replica.append({"replica": rep.index, "num_routed": len(rep.routed),
                            **summarize(req, steps, itl, **kw),
                            "prefix_cache": cache_summary([rep.kv], block_size)})
        req_tables.append(_with_replica(req, rep.index))
        step_tables.append(_with_replica(steps, rep.index))
        itls.append(itl)
    # Each replica's table is in ascending workload index; put the whole in that order.
    order = np.argsort(np.concatenate([np.sort(np.asarray(r.routed, dtype=np.int64))
                                       for r in reps]), kind="stable")
    requests = {c: v[order] for c, v in _concat(req_tables).items()}
    steps = _concat(step_tables)
    by_start = np.lexsort((steps["replica"], steps["start_time"]))  # stable
    steps = {c: v[by_start] for c, v in steps.items()}
    itl_all = ItlSamples.concat(itls)
    summary = summarize(requests, steps, itl_all, **kw)
    summary["prefix_cache"] = cache_summary([r.kv for r in reps], block_size)
    summary["replicas"] = per_replica
    return SimResult(requests, steps, itl_all, summary)


def _own_segments(req: Request) -> Segments:
    """A request's ``prompt_segments``, or one segment of its own."""
    return req.prompt_segments or ((unique_segment_id(req.request_id), req.num_prompt_tokens),)


def _with_replica(table: dict[str, np.ndarray], replica: int) -> dict[str, np.ndarray]:
    n = len(next(iter(table.values())))
    return {**table, "replica": np.full(n, replica, dtype=np.int64)}


def _concat(tables: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {c: np.concatenate([t[c] for t in tables]) for c in tables[0]}
