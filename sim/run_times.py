"""A fast-path run's step boundaries (sim/fastpath.py decode runs, sim/chunk_run.py chunk
runs): its steps' prices summed in the engine's order, cut before the step that would
see the next arrival (a chunk run past arrivals its steps would not admit: only before
the step of its shorter last chunk) or end at or after a cluster's routing instant, and
cut again to where the engine's one timeout lands."""

from __future__ import annotations

import math
from collections.abc import Iterable


def run_limit(next_arrival: float | None, end_before: float | None) -> float:
    """The instant (s) at or after which no step after a run's first may start: the next
    arrival, or the routing instant ``end_before`` when earlier; inf for neither."""
    limit = math.inf if next_arrival is None else next_arrival
    return end_before if end_before is not None and end_before < limit else limit


def cut_run(prices: Iterable[float], start: float, limit: float, end_before: float | None,
            min_steps: int) -> tuple[list[float], list[float]]:
    """The step boundaries t_0 = start, t_1, ... and step times (s) of the steps priced by
    ``prices``, summed in the engine's order: no step after the first starts at or after
    ``limit`` (run_limit: that step would see the arrival), with ``end_before`` every step
    ends before it (a cluster's next routing instant: the router then reads every
    replica's state as the step-by-step engines would have it), and the run ends where
    ``start + (t_last - start) == t_last``, keeping at least ``min_steps`` steps.

    The engine waits out a run in one timeout of t_last - start, and SimPy's clock lands
    on start plus that, which rounding may put an ulp off the steps' sum (the reference's
    clock): a run ends where the clock lands exactly (else it could reach an arrival it
    was meant to stop before, or stop an ulp short of one)."""
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
    _end_where_the_clock_lands(times, dts, min_steps)
    return times, dts


def drop_last_step(times: list[float], dts: list[float]) -> None:
    """Cut a run made by cut_run (``times`` its boundaries from its start, ``dts`` its
    step times, at least one step) by its last step, and then by as many more as its
    end needs to stay where the clock lands (cut_run's rule), in place."""
    times.pop()
    dts.pop()
    _end_where_the_clock_lands(times, dts, 0)


def _end_where_the_clock_lands(times: list[float], dts: list[float], min_steps: int) -> None:
    """Drop a run's last steps (in place) until ``start + (t_last - start) == t_last``,
    keeping at least ``min_steps`` (cut_run's rule)."""
    start = times[0]
    while len(times) > min_steps + 1 and start + (times[-1] - start) != times[-1]:
        times.pop()
        dts.pop()
