"""The fast path: runs of identical decode steps advanced in one go, with the results of
advancing them one by one. ``FastPath`` (built by the engine) is the only owner of run
logic: which run is safe (``plan``) and what it does (``apply``).

A policy that promises a steady decode (steps in which every running request gets one
token, nothing joins, nobody is preempted; see ``SteadyDecode`` and
sim/interface.py's ``declares``) lets the engine skip its per-step Python work: a run
ends with the step in which the first request finishes, before the step that would see
an arrival, or before a block allocation would fail, so every step of it is exactly
what the step-by-step engine would have done. The step times are summed in the same
order, each step still gets its row in steps.csv, and the ITL samples are booked as
(step duration, number of tokens) pairs. tests/test_fastpath.py compares both paths on
random workloads. A promise with a prefill (chunked's steps that prefill one request
beside the decode group) is planned and applied by sim/chunk_run.py; such a run goes past
arrivals that none of its steps would admit, and ``apply`` hands them over to the engine
at the steps that see them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from sim.batch import BatchShape, SteadyDecode
from sim.chunk_run import ChunkPricer, apply_chunk_run, plan_chunk_run
from sim.config import SchedulerConfig
from sim.cost_model import CostModel
from sim.decode_group import DecodeGroup
from sim.interface import (
    BulkChunkPricer,
    BulkDecodePricer,
    GroupDecoder,
    RoutedArrivals,
    Scheduler,
    SteadyDecoder,
    StepCounter,
    declares,
)
from sim.kv.block_pool import KVCacheManager
from sim.metrics import Recorder
from sim.request import Request
from sim.run_times import cut_run, run_limit
from sim.source import ArrivalSource

#: Longest run advanced at once: bounds the per-run lists and keeps progress reporting live.
MAX_RUN_STEPS = 4096

#: Prices a run of decode-only steps (BulkDecodePricer.decode_run_times).
RunPricer = Callable[[int, int, int, int, int, float, float], list[float]]


@dataclass(slots=True, init=False)
class Run:
    """A planned run: the policy's promise, the step boundaries ``times`` (times[0] the
    run's start, times[-1] its end, s), each step's duration ``dts`` (s) and the new
    blocks each step allocates (for a run of a decode group: allocated by ``apply``)."""

    steady: SteadyDecode
    times: list[float]
    dts: list[float]
    new_blocks: Sequence[int]
    chunks: Sequence[int] = ()  # the prefill's tokens in each step (SteadyDecode.prefill)
    samples: bool = True  # its last step samples (else none does: a lone prefill's chunks)
    admits: bool = False  # its last step makes the prefill promise's admission

    def __init__(self, steady: SteadyDecode, times: list[float], dts: list[float],
                 new_blocks: Sequence[int], chunks: Sequence[int] = (),
                 samples: bool = True, admits: bool = False) -> None:
        # written out, as sim/batch.py's dataclasses (its module docstring says why)
        self.steady = steady
        self.times = times
        self.dts = dts
        self.new_blocks = new_blocks
        self.chunks = chunks
        self.samples = samples
        self.admits = admits


class FastPath:
    """Plans and applies one engine's steady-decode runs.

    Built only for a policy that declares ``steady_decode`` (``make_fast_path``); the
    optional seams it uses (a run-pricing cost model, a step-counting policy, a routed
    arrival source) are found once, here.
    """

    __slots__ = ("_admit", "_advance", "_cost_model", "_kv", "_max_seqs", "_next_arrival",
                 "_policy", "_pop_arrived", "_price_chunks", "_price_run", "_rec",
                 "_routing_time", "_steady")

    def __init__(self, policy: Scheduler, kv: KVCacheManager, config: SchedulerConfig,
                 cost_model: CostModel, arrivals: ArrivalSource, recorder: Recorder,
                 admit: Callable[[Request], None] | None = None) -> None:
        """``admit``: the engine's admission of an arrived request (its guard, then the
        policy's queue); given, a chunk run may go past arrivals that change none of its
        steps (ChunkedPrefill.arrivals_wait) unless a router feeds this engine, and
        ``apply`` hands them over at the steps that see them. None where a request must
        be handed over at that simulated instant (a release hook: a rejected request's
        client sends its next one then). Raises TypeError when ``policy`` has no
        ``steady_decode``."""
        if not isinstance(policy, SteadyDecoder):
            raise TypeError(f"{type(policy).__name__} promises no steady decode")
        self._steady: Callable[[float], SteadyDecode | None] = policy.steady_decode
        self._policy = policy
        self._kv = kv
        self._max_seqs = config.max_num_seqs
        self._cost_model = cost_model
        self._rec = recorder
        self._advance = policy.advance if isinstance(policy, StepCounter) else None
        self._price_run: RunPricer | None = (
            cost_model.decode_run_times if isinstance(cost_model, BulkDecodePricer) else None)
        self._price_chunks: ChunkPricer | None = (
            cost_model.chunk_run_times if isinstance(cost_model, BulkChunkPricer) else None)
        # A cluster's inbox: runs end before the router's next routing instant, where it
        # reads this engine's state as the step-by-step engine would have it, and stop
        # before the next arrival it knows is routed here.
        self._routing_time: Callable[[], float | None] | None = None
        self._next_arrival: Callable[[], float | None] = arrivals.next_arrival_time
        self._admit = admit
        self._pop_arrived = arrivals.pop_arrived
        if isinstance(arrivals, RoutedArrivals):
            self._routing_time = arrivals.next_routing_time
            self._next_arrival = arrivals.next_routed_arrival_time
            self._admit = None

    def plan(self, now: float) -> Run | None:
        """The longest safe run starting at ``now`` (s): up to the step in which the first
        request finishes and while its blocks fit, cut before an arrival (a chunk run's
        only where a step would admit it) or a routing instant. None when the policy
        makes no promise or fewer than two steps are safe (the step-by-step path is as
        cheap)."""
        steady = self._steady(now)
        if steady is None:
            return None
        if steady.prefill is not None:
            return self._plan_prefill(steady, now)
        if not steady.requests:
            return None
        group, kv = steady.group, self._kv
        new_blocks: Sequence[int] = ()  # a group counts its own
        if group is not None:
            to_finish = group.steps_to_first_finish()
            k = MAX_RUN_STEPS if to_finish is None else min(to_finish + 1, MAX_RUN_STEPS)
            if k >= 2:
                k = group.safe_steps(k, kv.num_free_blocks)
        else:
            k = min(remaining_steps(steady.requests), MAX_RUN_STEPS)
            if k >= 2:
                k, new_blocks = safe_steps(steady.requests, kv.block_size, kv.num_free_blocks, k)
        if k < 2:
            return None
        next_arrival = self._next_arrival()
        end_before = self._routing_time() if self._routing_time is not None else None
        times, dts = step_times(steady, self._cost_model, now, k, next_arrival, end_before,
                                self._price_run)
        if len(times) < 3:
            return None
        return Run(steady, times, dts, new_blocks)

    def _plan_prefill(self, steady: SteadyDecode, now: float) -> Run | None:
        """plan() for the decode group beside a prefill's chunks (sim/chunk_run.py)."""
        end_before = self._routing_time() if self._routing_time is not None else None
        planned = plan_chunk_run(steady, self._kv, self._cost_model.step_time, now,
                                 MAX_RUN_STEPS, self._next_arrival(), end_before,
                                 self._price_chunks, self._admit is not None)
        if planned is None:
            return None
        times, dts, chunks, samples, admits = planned
        return Run(steady, times, dts, (), chunks, samples, admits)

    def apply(self, run: Run) -> list[Request]:
        """What len(run.times) - 1 step-by-step updates would have done, at once: tokens,
        blocks, ITL samples and step rows. Returns the requests that sampled their last
        token in the run's last step (the engine finishes and releases them)."""
        times, steady = run.times, run.steady
        if steady.prefill is not None:
            return self._apply_prefill(run)
        k = len(times) - 1
        group = steady.group
        finished: list[Request] = []
        if group is None:
            n, new_blocks = len(steady.requests), run.new_blocks
            regular = self._advance_requests(steady.requests, times)
        else:
            n = len(group.members)
            allocated = group.allocate_for_steps(k, self._kv.num_free_blocks)
            assert allocated is not None, "fast path: blocks checked by safe_steps"
            new_blocks = allocated
            regular = self._book_group_first_step(group, times)
            finished = group.advance(k, times[k])
        if self._advance is not None:
            self._advance(k)
        self._record(run, n, new_blocks)
        self._rec.book_itl_run(times, n, regular)
        return finished

    def _apply_prefill(self, run: Run) -> list[Request]:
        """apply() for the decode group beside a prefill's chunks (sim/chunk_run.py)."""
        plan = (run.times, run.dts, list(run.chunks), run.samples, run.admits)
        waiting = None
        nxt = self._next_arrival()
        if nxt is not None and nxt <= run.times[-2]:  # it went past arrivals
            waiting = self._hand_over(run.times[:-1])
        finished = apply_chunk_run(run.steady, plan, self._kv, self._rec,
                                   self._policy.num_waiting, self._max_seqs, waiting)
        if self._advance is not None:
            self._advance(len(run.dts))
        return finished

    def _hand_over(self, starts: list[float]) -> list[int]:
        """Admit the arrivals each step starting at ``starts`` (s) sees, as the engine
        does before a step; returns the waiting queue of each step."""
        admit, pop, policy = self._admit, self._pop_arrived, self._policy
        assert admit is not None, "fast path: runs stop at arrivals"
        waiting = []
        for t in starts:
            for req in pop(t):
                admit(req)
            waiting.append(policy.num_waiting)
        return waiting

    def _advance_requests(self, requests: Sequence[Request], times: list[float]) -> int:
        """Advance each request by the run's steps (one token a step, blocks to match)
        and book the ITL of its first token; returns how many of those were regular
        (previous token at the run's start)."""
        start, first, end, k = times[0], times[1], times[-1], len(times) - 1
        kv, book = self._kv, self._rec.book_itl
        bs = kv.block_size
        regular = 0
        for r in requests:
            if r.last_token_time == start:
                regular += 1
            else:
                book(first - r.last_token_time)  # type: ignore[operator]
            c = r.num_computed_tokens + k
            r.num_computed_tokens = c
            r.num_output_tokens += k
            r.last_token_time = end
            if len(r.block_ids) * bs < c and kv.allocate_up_to(r, c) is None:
                raise AssertionError("fast path: blocks checked by safe_steps did not fit")
        return regular

    def _book_group_first_step(self, group: DecodeGroup, times: list[float]) -> int:
        """Book the ITL of the members' first token in the run when their previous one
        did not come at the run's start (a stall: see DecodeGroup); returns the number
        of regular samples left to book (all members when there was no stall)."""
        start, first, n, fresh = times[0], times[1], len(group.members), group.fresh
        rec = self._rec
        if fresh:  # a shared stall before the run, and members that joined during it
            rec.book_itl_step(first - start, fresh)
            if n > fresh:
                rec.book_itl_step(first - group.last_end, n - fresh)
            return 0
        if group.last_end != start:  # a shared stall before the run
            rec.book_itl(first - group.last_end, n)
            return 0
        return n

    def _record(self, run: Run, num_seqs: int, new_blocks: Sequence[int]) -> None:
        """The run's step rows: blocks held in each step, the rest constant."""
        k = len(run.dts)
        steps_blocks = new_blocks[:k]
        used = list(accumulate(steps_blocks,
                               initial=self._kv.num_used_blocks - sum(steps_blocks)))
        del used[0]
        held = len(run.steady.holders)
        self._rec.record_decode_run(run.times, run.dts, num_seqs, used,
                                    self._policy.num_waiting, held - num_seqs,
                                    self._max_seqs - held)


def make_fast_path(policy: Scheduler, kv: KVCacheManager, config: SchedulerConfig,
                   cost_model: CostModel, arrivals: ArrivalSource,
                   recorder: Recorder,
                   admit: Callable[[Request], None] | None = None) -> FastPath | None:
    """The engine's fast path for ``policy``: hands it a DecodeGroup when its class
    declares ``attach_decode_group``, and returns a FastPath when it declares
    ``steady_decode`` (None otherwise: every step is planned one by one)."""
    if isinstance(policy, GroupDecoder) and declares(policy, "attach_decode_group"):
        policy.attach_decode_group(DecodeGroup(kv))
    if not (isinstance(policy, SteadyDecoder) and declares(policy, "steady_decode")):
        return None
    return FastPath(policy, kv, config, cost_model, arrivals, recorder, admit)


def remaining_steps(requests: Sequence[Request]) -> int:
    """Steps every request of a steady decode survives without finishing: one less than
    the fewest tokens any of them still has to produce (to its ``max_output_tokens``)."""
    return min(r.max_output_tokens - r.num_output_tokens for r in requests) - 1


def safe_steps(requests: Sequence[Request], block_size: int, num_free_blocks: int,
               limit: int) -> tuple[int, list[int]]:
    """How many of the next ``limit`` one-token steps fit in the free pool, and the
    number of new blocks allocated in each of those steps.

    A request holding B blocks with c computed tokens needs a new block in step j
    (0-based) when c + j + 1 > B * block_size, i.e. at j = B * block_size - c and every
    block_size steps after. The run must stop before the step whose allocations would
    exceed the free blocks (there the step-by-step engine would preempt).
    """
    new_per_step = [0] * limit
    for r in requests:
        j = len(r.block_ids) * block_size - r.num_computed_tokens
        while j < limit:
            new_per_step[j] += 1
            j += block_size
    used = 0
    for j, k in enumerate(new_per_step):
        used += k
        if used > num_free_blocks:
            return j, new_per_step[:j]
    return limit, new_per_step


def step_times(run: SteadyDecode, cost_model: CostModel, start: float, num_steps: int,
               next_arrival: float | None, end_before: float | None = None,
               price_run: RunPricer | None = None) -> tuple[list[float], list[float]]:
    """The step boundaries t_0 = start, t_1, ... and the step times of up to
    ``num_steps`` steps, summed in the engine's order; stops early so that no step after
    the first starts at or after ``next_arrival`` (that step would see the arrival) and,
    with ``end_before``, so that every step ends before it (a cluster's next routing
    instant: the router then reads every replica's state as the step-by-step engines
    would have it), and so that ``start + (t_last - start) == t_last`` (the clock after
    one timeout of the run). ``price_run``: the cost model's decode_run_times, when it
    has one."""
    limit = run_limit(next_arrival, end_before)
    shape = run.shape
    d, s, ctx = shape.num_decode_seqs, shape.num_sampled_seqs, shape.decode_context_tokens
    growth = run.context_growth
    prices: Iterable[float]
    if price_run is not None:  # priced only up to the step that would see the arrival
        prices = price_run(d, s, ctx, growth, num_steps, start, limit)
    else:  # priced one by one as cut_run takes them
        prices = (cost_model.step_time(BatchShape(0, 0, 0, 0, d, ctx + j * growth, s))
                  for j in range(num_steps))
    return cut_run(prices, start, limit, end_before, min_steps=1)
