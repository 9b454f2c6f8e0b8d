"""A disaggregated deployment in one SimPy environment: a prefill pool and a decode pool
of servesim engines (each its own policy, KV pool and cost model, as sim/cluster.py's
replicas), the KV link between them (a port per engine), and the hand-over that moves
each request across.

One request's path (docs/disaggregation.md): it arrives and the prefill router picks a
prefill engine (sim/cluster.py's Dispatcher, at its arrival time), which serves its copy
with max_tokens 1 (sim/disagg/prefill.py); when that copy finishes, its blocks stay held
in the prefill pool, the decode router picks a decode engine, and the request waits at
that engine's gate until its prompt's blocks fit there; then its KV crosses the link
(sim/disagg/link.py), the prefill blocks are freed, and it enters the decode engine with
num_computed_tokens = num_prompt_tokens - 1 (sim/disagg/decode.py cites vLLM's rule).
A prompt shorter than ``min_prompt_tokens`` goes straight to a decode engine at arrival.

The decode engines keep their fast path: a run ends before the first instant at which a
request could reach any decode engine (``_handover_bound``): the next arrival, a request
routed to a prefill engine not yet taken up, the end of a prefill step under way, or the
earliest end of a transfer under way (over every port: sim/disagg/link.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import simpy

from sim.cluster import Dispatcher, Replica, RoutedInbox
from sim.config import SchedulerConfig
from sim.cost_model import CostModel
from sim.disagg.decode import DecodeGate, DecodeInbox, Waiting, fire, wake_event
from sim.disagg.link import KVLink
from sim.disagg.link_spec import LinkSpec
from sim.disagg.prefill import AtArrival, HeldBlocksPolicy, SplitSource, StepClock
from sim.disagg.records import HandoverTimes, merge
from sim.engine import Engine
from sim.interface import Router, RouterStart, Scheduler
from sim.kv.block_pool import KVCacheManager
from sim.metrics import Recorder
from sim.request import Request, RequestStatus
from sim.simulate import SimResult, progress_slices
from sim.source import ArrivalSource, ClosedLoopArrivals


@dataclass(frozen=True, slots=True)
class Pool:
    """One pool's engines: how many, their scheduler config, cost model, router and KV
    pool size (blocks of ``block_size`` tokens). Raises ValueError for fewer than one
    replica."""

    num_replicas: int
    config: SchedulerConfig
    cost_model: CostModel
    router: Router
    num_gpu_blocks: int

    def __post_init__(self) -> None:
        if int(self.num_replicas) != self.num_replicas or self.num_replicas < 1:
            raise ValueError(f"a pool needs an integer >= 1 replicas, got "
                             f"{self.num_replicas!r}")


class _System:
    """The two pools, the link and the hand-over between them (module docstring)."""

    def __init__(self, env: simpy.Environment, source: ArrivalSource, prefill: Pool,
                 decode: Pool, link: LinkSpec, kv_bytes_per_token: float,
                 min_prompt_tokens: int, block_size: int) -> None:
        self.env = env
        self.link = KVLink(env, link, prefill.num_replicas, decode.num_replicas)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.split = SplitSource(source, min_prompt_tokens, self._keep_local)
        self.prefill, self.decode = prefill, decode
        self.prefill_reps = [Replica(i, KVCacheManager(prefill.num_gpu_blocks, block_size),
                                     Recorder()) for i in range(prefill.num_replicas)]
        self.decode_reps = [Replica(i, KVCacheManager(decode.num_gpu_blocks, block_size),
                                    Recorder()) for i in range(decode.num_replicas)]
        self.dispatcher = Dispatcher(env, self.split, self.prefill_reps,
                                     AtArrival(prefill.router))
        self.clocks = [StepClock(prefill.cost_model, lambda: env.now)
                       for _ in self.prefill_reps]
        self.held: list[list[Request]] = [[] for _ in self.prefill_reps]
        self.blocks_freed: list[simpy.Event | None] = [None for _ in self.prefill_reps]
        self.decode_policies: list[Scheduler] = []
        self.gates = [DecodeGate(rep, decode.config.max_model_len,
                                 functools.partial(self._transfer, rep.index),
                                 functools.partial(self._hand_over, rep.index),
                                 functools.partial(self._reserved, rep.index))
                      for rep in self.decode_reps]
        self.in_transfer = [0 for _ in self.decode_reps]
        self.pending: list[list[Request]] = [[] for _ in self.decode_reps]
        self.inboxes = [DecodeInbox(self._handover_bound,
                                    functools.partial(self._in_flight_to, i))
                        for i in range(decode.num_replicas)]
        self.times = HandoverTimes()
        self.num_left_prefill = 0  # prefill copies rejected, or their request delivered
        self.policies: list[HeldBlocksPolicy] = []
        if not isinstance(decode.router, Router):
            raise ValueError(f"decode router must have choose(request, replicas, now) -> "
                             f"index (sim.interface.Router), got {decode.router!r}")
        if isinstance(decode.router, RouterStart):
            decode.router.start(self.decode_reps)

    # -- engines --
    def start(self, policy_factory: Any, fast_path: bool) -> list[simpy.Process]:
        """Every engine's process: prefill engines step by step (each step's end is the
        hand-over bound's), decode engines with their fast path when ``fast_path``."""
        env, procs = self.env, []
        for rep, clock in zip(self.prefill_reps, self.clocks, strict=True):
            policy = HeldBlocksPolicy(policy_factory(self.prefill.config, rep.kv),
                                      functools.partial(self._holding, rep.index))
            self.policies.append(policy)
            procs.append(Engine(
                env, policy=policy, cost_model=clock, kv=rep.kv, config=self.prefill.config,
                arrivals=RoutedInbox(self.dispatcher, rep), recorder=rep.recorder,
                observer=clock.step_ended,
                on_release=functools.partial(self._prefilled, rep.index),
                wake=functools.partial(self._prefill_wake, rep)).start())
        for rep, inbox in zip(self.decode_reps, self.inboxes, strict=True):
            self.decode_policies.append(policy_factory(self.decode.config, rep.kv))
            procs.append(Engine(
                env, policy=self.decode_policies[-1],
                cost_model=self.decode.cost_model, kv=rep.kv, config=self.decode.config,
                arrivals=inbox, recorder=rep.recorder,
                on_release=functools.partial(self._decoded, rep.index),
                wake=functools.partial(self._decode_wake, rep),
                fast_path=fast_path).start())
        self.dispatcher.set_timer()
        return procs

    def _prefill_wake(self, rep: Replica) -> simpy.Event | None:
        """A prefill engine's wake hook: the dispatcher's, and while its policy has work
        that waits for held blocks, an event fired when they are freed."""
        event = self.dispatcher.wake_event(rep)
        if event is None and (self.held[rep.index] or self.policies[rep.index].unfinished()):
            # Not the dispatcher's event, which it fires at every routing instant once
            # the arrivals are exhausted.
            freed = self.blocks_freed[rep.index]
            if freed is None:
                freed = self.blocks_freed[rep.index] = self.env.event()
            return freed
        return event

    def _reserved(self, d: int) -> int | None:
        """The prompt blocks of the requests delivered to decode engine ``d`` and not yet
        admitted; None while a request it was not handed waits there (preempted)."""
        pending = self.pending[d]
        pending[:] = [r for r in pending if r.status is RequestStatus.WAITING]
        in_engine = len(pending) - len(self.inboxes[d].ready)
        if self.decode_policies[d].num_waiting != in_engine:
            return None
        kv = self.decode_reps[d].kv
        return sum(kv.blocks_for(r.num_prompt_tokens) for r in pending)

    def _holding(self, index: int) -> bool:
        return bool(self.held[index])

    def _decode_wake(self, rep: Replica) -> simpy.Event | None:
        """A decode engine's wake hook: None once no request can reach it any more."""
        if self._prefill_done():
            return None
        return wake_event(self.env, rep)

    # -- the hand-over --
    def _keep_local(self, req: Request, now: float) -> None:
        """A short prompt: straight to a decode engine, prefilled there."""
        i = self._choose_decode(req, now)
        self.times.local(req.index, i)
        self._deliver(i, req, now)
        self._close_if_done()

    def _prefilled(self, p: int, req: Request, now: float) -> None:
        """A prefill engine released ``req``'s copy: hold its blocks, pick a decode
        engine and queue it at that engine's gate."""
        max_tokens = self.split.max_tokens.pop(req.index)
        if req.status is RequestStatus.REJECTED:
            self.times.rejected(req.index, p)
            self._left_prefill()
            return
        held = Request(req.request_id, now, req.num_prompt_tokens, 1, 1, index=req.index)
        got = self.prefill_reps[p].kv.allocate_up_to(held, req.num_prompt_tokens)
        assert got is not None, "the blocks the policy just freed"
        self.held[p].append(held)
        d_req = Request(req.request_id, req.arrival_time, req.num_prompt_tokens,
                        req.output_len, max_tokens, req.priority, req.index)
        d_req.first_scheduled_time = req.first_scheduled_time
        d = self._choose_decode(d_req, now)
        self.times.prefilled(req, p, d, now)
        self.gates[d].queue.append(Waiting(d_req, p, held))
        self.gates[d].admit()

    def _choose_decode(self, req: Request, now: float) -> int:
        d = self.decode.router.choose(req, self.decode_reps, now)
        if not 0 <= d < len(self.decode_reps):
            raise ValueError(f"decode router {self.decode.router!r} chose replica {d!r}; "
                             f"decode replicas are 0..{len(self.decode_reps) - 1}")
        self.decode_reps[d].routed.append(req.index)
        return d

    def _transfer(self, d: int, w: Waiting) -> None:
        """Decode engine ``d``'s gate allocated ``w``'s blocks: its prompt's KV crosses
        from its prefill engine's port to ``d``'s."""
        self.in_transfer[d] += 1
        self.times.transfer_started(w.request.index, self.env.now)
        nbytes = w.request.num_prompt_tokens * self.kv_bytes_per_token
        self.link.start(nbytes, functools.partial(self._landed, d, w),
                        prefill=w.prefill_replica, decode=d)

    def _landed(self, d: int, w: Waiting, now: float) -> None:
        self.in_transfer[d] -= 1
        self.times.transfer_ended(w.request.index, now)
        w.request.num_computed_tokens = w.request.num_prompt_tokens - 1
        self.decode_reps[d].kv.free(w.request)  # the policy allocates them at admission
        self._hand_over_to(d, w, now)

    def _hand_over(self, d: int, w: Waiting) -> None:
        """A request decode engine ``d`` can never hold: to its guard, no transfer."""
        self._hand_over_to(d, w, self.env.now)

    def _hand_over_to(self, d: int, w: Waiting, now: float) -> None:
        p = w.prefill_replica
        self.held[p].remove(w.held)
        self.prefill_reps[p].kv.free(w.held)
        fire(self.prefill_reps[p])
        freed = self.blocks_freed[p]
        if freed is not None:
            self.blocks_freed[p] = None
            freed.succeed()
        self._deliver(d, w.request, now)
        self._left_prefill()

    def _deliver(self, d: int, req: Request, now: float) -> None:
        self.pending[d].append(req)
        self.inboxes[d].put(req, now)
        fire(self.decode_reps[d])

    def _prefill_done(self) -> bool:
        """No request is left to arrive, in the prefill pool, at a gate or in transfer."""
        return (self.split.next_arrival_time() is None
                and self.num_left_prefill == self.split.num_prefill)

    def _left_prefill(self) -> None:
        self.num_left_prefill += 1
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self._prefill_done():
            for rep in self.decode_reps:
                fire(rep)  # nothing more will come: let idle decode engines end

    def _decoded(self, d: int, _req: Request, _now: float) -> None:
        """A decode engine released a request: its freed blocks may admit the gate's."""
        self.gates[d].admit()

    # -- when the next request can reach a decode engine --
    def _handover_bound(self) -> float | None:
        """A lower bound on the next instant a request can reach a decode engine, or a
        router or gate read one: the next arrival, now while a request routed to a prefill
        engine waits in its inbox, the end of a prefill step under way
        (or now, for a prefill engine about to start one), the end of a transfer under
        way, and for a prefill engine whose work waits for held blocks, the earliest a
        transfer started from now on could free them (a gate may start one at any
        decode engine's release)."""
        now = self.env.now
        times = [t for t in (self.split.next_arrival_time(), self.link.earliest_delivery())
                 if t is not None]
        if any(rep.inbox for rep in self.prefill_reps):
            times.append(now)  # routed at this instant, not yet taken by its engine
        for clock, policy, held in zip(self.clocks, self.policies, self.held, strict=True):
            if clock.busy_until is not None:
                times.append(max(clock.busy_until, now))
            elif policy.unfinished():
                times.append(now + self.link.spec.latency_s if held else now)
        return min(times) if times else None

    def _in_flight_to(self, d: int) -> float | None:
        return self.link.earliest_delivery() if self.in_transfer[d] else None



def simulate_disagg(
    source: ArrivalSource, *, prefill: Pool, decode: Pool, policy_factory: Any,
    link: LinkSpec, kv_bytes_per_token: float, min_prompt_tokens: int = 0,
    block_size: int = 16, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
    progress: Callable[[int], None] | None = None, slice_s: float = math.inf,
    fast_path: bool = True,
) -> SimResult:
    """Simulate ``source``'s requests through a prefill pool and a decode pool joined by
    ``link``, the figures of each engine's port (sim/disagg/link.py), until every
    request has finished or been rejected.

    kv_bytes_per_token: KV bytes a prompt token moves over the link (one TP shard's: each
    shard sends over its own port, in parallel with the others). min_prompt_tokens: a
    shorter prompt is prefilled on a decode engine (conditional disaggregation). The
    result's requests carry prefill_replica, decode_replica and the TTFT split
    (sim/disagg/records.py), its steps ``pool`` and ``replica``; the summary has a
    ``disagg`` block. Raises ValueError for closed-loop sources, a prefix cache, a
    negative min_prompt_tokens or kv_bytes_per_token, or a router that chooses no
    replica; SchedulerStuck as one engine does.
    """
    if isinstance(source, ClosedLoopArrivals):
        raise ValueError("disaggregated runs take open-loop arrivals (no concurrency)")
    for pool in (prefill, decode):
        if pool.config.prefix_cache != "none":
            raise ValueError("disaggregated runs have no prefix cache (prefix_cache none)")
    if not min_prompt_tokens >= 0:
        raise ValueError(f"disagg_min_prompt_tokens must be >= 0, got {min_prompt_tokens!r}")
    if not (kv_bytes_per_token >= 0 and math.isfinite(kv_bytes_per_token)):
        raise ValueError(f"kv_bytes_per_token must be a finite number >= 0, got "
                         f"{kv_bytes_per_token!r}")
    env = simpy.Environment()
    system = _System(env, source, prefill, decode, link, kv_bytes_per_token,
                     min_prompt_tokens, block_size)
    done = simpy.AllOf(env, system.start(policy_factory, fast_path))
    for length in progress_slices(slice_s):
        if done.triggered:
            break
        env.run(until=done if math.isinf(length) else env.now + length)
        if progress is not None:
            progress(sum(r.recorder.num_requests for r in system.decode_reps))

    def figures(pool: Pool) -> dict[str, Any]:
        return {"max_num_seqs": pool.config.max_num_seqs,
                "num_gpu_blocks": pool.num_gpu_blocks, "block_size": block_size,
                "slo_ttft_s": slo_ttft_s, "slo_tpot_s": slo_tpot_s}

    return merge(system.prefill_reps, system.decode_reps, system.times, system.link,
                 kw=figures(decode), prefill_kw=figures(prefill),
                 min_prompt_tokens=min_prompt_tokens)
