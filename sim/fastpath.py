"""Advancing a run of identical decode steps in one go, with the results of advancing
them one by one.

A policy that can promise a steady decode (BatchPlan-equivalent steps: every running
request gets one token, nothing joins, nobody is preempted; see ``SteadyDecode``) lets
the engine skip its per-step Python work: the run ends before the first step in which a
request would finish, an arrival would be seen, or a block allocation would fail, so
every step of it is exactly what the step-by-step engine would have done. The step times
are summed in the same order, each step still gets its row in steps.csv, and the ITL
samples are kept as (step duration, number of tokens) pairs. tests/test_fastpath.py
compares both paths on random workloads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from sim.batch import BatchShape, SteadyDecode
from sim.cost_model import CostModel
from sim.request import Request

#: Longest run advanced at once: bounds the per-run lists and keeps progress reporting live.
MAX_RUN_STEPS = 4096


def remaining_steps(requests: Sequence[Request], max_model_len: int) -> int:
    """Steps every request of a steady decode survives without finishing: one less than
    the fewest tokens any of them still has to produce."""
    left = min(min(r.output_len, r.max_tokens, max_model_len - r.num_prompt_tokens)
               - r.num_output_tokens for r in requests)
    return left - 1


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
               next_arrival: float | None, end_before: float | None = None
               ) -> tuple[list[float], list[float]]:
    """The step boundaries t_0 = start, t_1, ... and the step times of up to
    ``num_steps`` steps, summed in the engine's order; stops early so that no step after
    the first starts at or after ``next_arrival`` (that step would see the arrival) and,
    with ``end_before``, so that every step ends before it (a cluster's next routing
    instant: the router then reads every replica's state as the step-by-step engines
    would have it), and so that ``start + (t_last - start) == t_last`` (the clock after
    one timeout of the run)."""
    limit = math.inf if next_arrival is None else next_arrival
    if end_before is not None and end_before < limit:
        limit = end_before
    shape = run.shape
    d, s, ctx = shape.num_decode_seqs, shape.num_sampled_seqs, shape.decode_context_tokens
    growth = run.context_growth
    batch = getattr(cost_model, "decode_run_times", None)
    prices: Iterable[float]
    if batch is not None:  # priced only up to the step that would see the arrival
        prices = batch(d, s, ctx, growth, num_steps, start, limit)
    else:  # priced one by one as the loop below takes them
        prices = (cost_model.step_time(BatchShape(0, 0, 0, 0, d, ctx + j * growth, s))
                  for j in range(num_steps))
    times = [start]
    dts: list[float] = []
    t = start
    for j, price in enumerate(prices):
        if j and t >= limit:
            break
        dt = price + 0.0  # + the plan's extra_time_s, as the engine adds it
        if end_before is not None and t + dt >= end_before:
            break
        t = t + dt
        times.append(t)
        dts.append(dt)
    # The engine waits out a run in one timeout of times[-1] - start, and SimPy's clock
    # lands on start plus that, which rounding may put an ulp off the steps' sum (the
    # reference's clock): a run ends where the clock lands exactly (else it could reach
    # an arrival it was meant to stop before, or stop an ulp short of one).
    while len(times) > 2 and start + (times[-1] - start) != times[-1]:
        times.pop()
        dts.pop()
    return times, dts
