"""Saturation: did arrivals outrun the engine long enough to build a backlog?

A run whose offered load exceeds what the engine serves, over the whole run or over a
stretch of it, has no steady state there: its backlog grows for as long as the overload
lasts, and the latencies of the requests that arrive meanwhile measure the length of the
overload, not the system. Such a run is flagged ``saturated`` in summary.json and its
percentiles are marked as not steady-state (``latency_steady_state: false``).

The rule works on the request records alone (arrival, first-scheduled and finish times:
no step rows needed, so it also holds across the idle gaps of an engine and for a whole
cluster). Either of two tests flags a run.

A. The waiting queue grew, over any window of the run. Q(t) = the backlog: requests
arrived and not yet scheduled for the first time (vLLM's waiting queue; a rejected
request leaves it at its arrival). A backlog episode runs from the arrival that finds the
queue empty to the instant it empties again; its growth R is its peak (it starts from an
empty queue, so no window inside it grows more), reached at time e; its growth window is
[s, e], s its first arrival. Every episode is examined, so a backlog that built up mid-run
and drained before arrivals ended counts as much as one still growing at the end. An
episode saturates the run when all four hold:
  1. R >= MIN_GROWTH requests;
  2. R > NOISE_Z x sqrt(sum c_i^2 + S): the rise of a queue whose server keeps up,
     arrivals A minus admissions S = A - R over the window, has mean <= 0 and variance
     at most sum c_i^2 + S, c_i the sizes of the groups of simultaneous arrivals (A for
     distinct times, as from a Poisson source; a closed loop's N users sending at once
     are one group of N) and S that of Poisson admissions (a busy server admits more
     regularly). A stable queue's largest excursion rises slowly (a random walk with
     drift -d reaches height h over about h / d steps), so its R / sqrt(A + S) stays
     near 1 or 2 at any load below capacity; an overload of lambda - mu over T seconds
     grows R = (lambda - mu) T against sqrt((lambda + mu) T) and clears the floor once
     the window is long enough (a mild overload in a short run cannot be told from
     chance: more requests, a longer window);
  3. R exceeds the most requests the engine admitted at one instant during the episode
     (from s until the queue drained): a server that admits in batches (static batching)
     holds its next batch waiting without being overloaded;
  4. at least MIN_SHARE of the run's requests arrived in the window: a shorter burst,
     such as a trace's few seconds of clustered arrivals, touches fewer than 1 request
     in 20, so the percentiles up to p95 still describe the steady state (the burst is
     reported, and the tail above p95 carries it).

B. The requests in the system were still piling up when arrivals ended. A continuous
batching engine first absorbs an overload into a growing batch (each step slows, no one
waits) and queues only once max_num_seqs or the KV cache stops the batch; a short run
can end before that. N(t) = requests arrived and not finished (a rejected one leaves at
its arrival); below capacity it settles at lambda W (Little's law) within about W of a
change of rate. Over the second half of the arrival window (the first lets the system
fill to its working level), a least-squares line is fitted to N(t) at GRID_POINTS times;
B holds when its slope exceeds GROWTH_FRACTION of the offered rate (n - 1) / (t_last -
t_first), i.e. less than 95% of what arrives is served, and its growth over the half
clears a noise floor: at least MIN_GROWTH requests, more than NOISE_MULTIPLE standard
deviations of N(t) about the line, and more than NOISE_Z x sqrt(2 L) (L the mean of N:
the stationary count of an uncongested batch server, M/G/inf, is Poisson, and this is the
spread of the difference of two such counts). A gross overload needs no statistics: when
fewer than SERVED_FLOOR of the requests that arrived over the half left it, growth of
MIN_GROWTH requests is enough (a run shorter than its requests' latencies, still filling
when arrivals stop, is flagged too: it never reached a steady state either). Either way
N at the end of arrivals must top its peak over the first half: a pile-up ends higher
than it has ever been, while the slow, wide swings of a stable engine serving
heavy-tailed outputs (N from 26 to 156 and back to 91 at 77% load) can fit a rising
line over one half without ever passing the earlier peak.

summary.json's ``saturation`` reports test A's episode (the largest that saturated the
run, or else the largest seen): its window, growth and growth rate, the counts and floors
it was compared with, its share of the arrivals, when the queue drained, the mean time in
queue of the first and the last third of the window's arrivals (a growing FIFO backlog
makes later arrivals wait longer), why it did not count; test B's numbers under
``in_system``; and the backlog when arrivals ended.

A closed loop (a fixed number of users) can never saturate by this rule: the system holds
at most its users, and their first requests arrive as one group. That is the point of the
rule, not a gap in it: a closed loop hides queueing instead of growing a queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.table import Table, column

MIN_GROWTH = 10
"""Fewest requests a backlog must grow by to count."""

NOISE_Z = 3.0
"""Growth must exceed NOISE_Z x sqrt(sum c_i^2 + S), the sd bound of a stable queue's rise."""

MIN_SHARE = 0.05
"""Fewest of the run's requests, as a fraction, that must arrive in the growth window."""

GROWTH_FRACTION = 0.05
"""Test B: growth of N(t), as a fraction of the offered rate, above which a run piles up."""

NOISE_MULTIPLE = 2.0
"""Test B: growth must exceed this many standard deviations of N(t) about its line."""

SERVED_FLOOR = 0.5
"""Test B: served / arrived over the second half below which any growth >= MIN_GROWTH counts."""

GRID_POINTS = 200
"""Test B: samples of N(t) the line is fitted to."""

RULE = (f"saturated when the waiting queue (arrived, not yet scheduled) grows, within one "
        f"backlog episode (from empty to its peak), by at least {MIN_GROWTH} requests, by "
        f"more than {NOISE_Z:g} x sqrt(sum of squared sizes of the groups of simultaneous "
        f"arrivals + admissions) over that window, by more than the most requests "
        f"admitted at one instant in the episode, with at least {MIN_SHARE:.0%} of the "
        f"run's requests arriving in the window; or when the number of requests in the "
        f"system grows, over the second half of the arrival window, faster than "
        f"{GROWTH_FRACTION:.0%} of the offered rate (least-squares slope) and by more than "
        f"max({MIN_GROWTH} requests, {NOISE_MULTIPLE:g} x the sd of its fluctuation about "
        f"that line, {NOISE_Z:g} x sqrt(2 x its mean)), or by at least {MIN_GROWTH} "
        f"requests while fewer than {SERVED_FLOOR:.0%} of the requests arriving in that "
        f"half left it, ending above its peak over the first half")


@dataclass(frozen=True, slots=True)
class _Queue:
    """The waiting queue over a run, seen at its arrivals: ``arrival`` (s, sorted),
    ``backlog`` (requests waiting just after each arrival) and ``emptied_s`` (the
    departures that left it empty, s, sorted). At one instant arrivals count before
    departures, so a queue only peaks at an arrival."""

    arrival: np.ndarray
    backlog: np.ndarray
    emptied_s: np.ndarray


@dataclass(frozen=True, slots=True)
class _Windows:
    """Growth windows of backlog episodes, one entry per episode: first arrival and
    peak (indices into the sorted arrivals), when the queue emptied again (s; inf if
    never), the growth R and the rule's noise floor (requests)."""

    start: np.ndarray
    peak: np.ndarray
    drained_s: np.ndarray
    growth: np.ndarray
    noise_floor: np.ndarray

    def take(self, which: np.ndarray) -> _Windows:
        return _Windows(self.start[which], self.peak[which], self.drained_s[which],
                        self.growth[which], self.noise_floor[which])


def _not_measured(reason: str) -> dict[str, Any]:
    return {"saturated": False, "latency_steady_state": True,
            "saturation": {"rule": RULE, "measured": False, "reason": reason}}


def _queue(arrival: np.ndarray, leave: np.ndarray) -> _Queue:
    """The queue of requests arriving at sorted ``arrival`` and leaving it (scheduled,
    or rejected at arrival) at ``leave`` (s, one per request, any order)."""
    count = np.arange(1, arrival.size + 1)
    leave = np.sort(leave)
    # Events in time order, arrivals first at a tie: before each arrival have departed
    # the requests leaving strictly earlier; up to each departure have arrived those
    # arriving at or before it. Two binary searches instead of merging the 2n events
    # keep the peak at a few n-long arrays (10 million requests: hundreds of MB less).
    departed = np.searchsorted(leave, arrival, side="left")
    arrived = np.searchsorted(arrival, leave, side="right")
    return _Queue(arrival, count - departed, leave[arrived == count])


def _episodes(q: _Queue) -> tuple[np.ndarray, np.ndarray]:
    """Every backlog episode of ``q``: the index of the arrival that found the queue
    empty, and the episode's peak backlog (requests)."""
    start = np.flatnonzero(q.backlog == 1)
    return start, np.maximum.reduceat(q.backlog, start)


def _windows(q: _Queue, start: np.ndarray, height: np.ndarray,
             which: np.ndarray) -> _Windows:
    """The growth windows of the episodes ``which`` (indices into ``start``, sorted)."""
    opens = np.zeros(q.backlog.size, bool)
    opens[start] = True
    label = np.cumsum(opens) - 1  # the first arrival opens an episode: label >= 0
    chosen = np.zeros(start.size, bool)
    chosen[which] = True
    tops = np.flatnonzero(chosen[label] & (q.backlog == height[label]))
    tops = tops[np.concatenate([[True], label[tops][1:] != label[tops][:-1]])]  # first max
    first = start[which]
    at = np.searchsorted(q.emptied_s, q.arrival[first], "left")
    drained = np.where(at < q.emptied_s.size, q.emptied_s[np.minimum(at, q.emptied_s.size - 1)],
                       np.inf)
    growth = height[which]
    # Simultaneous arrivals form groups; a window holds whole groups (it starts on an
    # empty queue and peaks after the last of a group), so sum c_i^2 is a prefix sum of
    # each arrival's group size.
    _, sizes = _groups(q.arrival)
    squares = np.concatenate([[0], np.cumsum(np.repeat(sizes, sizes))])
    admissions = tops - first + 1 - growth  # the queue started empty: A - S = R
    noise = squares[tops + 1] - squares[first] + admissions
    floor = np.maximum(float(MIN_GROWTH), NOISE_Z * np.sqrt(noise.astype(np.float64)))
    return _Windows(first, tops, drained, growth, floor)


def _groups(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct instants of sorted ``times`` and how many times fall on each."""
    first = np.flatnonzero(np.concatenate([[times.size > 0], times[1:] != times[:-1]]))
    return times[first], np.diff(np.append(first, times.size))


def _largest_admission(admitted: tuple[np.ndarray, np.ndarray], s: np.ndarray,
                       until: np.ndarray) -> np.ndarray:
    """Most requests admitted at one instant within each [s, until] (s), from the
    instants and counts of first scheduling ``admitted``; 0 where none was. A few
    episodes at most reach this test."""
    instants, counts = admitted
    lo, hi = np.searchsorted(instants, s, "left"), np.searchsorted(instants, until, "right")
    pairs = zip(lo.tolist(), hi.tolist(), strict=True)
    return np.array([counts[a:b].max(initial=0) for a, b in pairs], dtype=np.int64)


def _judge(q: _Queue, admitted: tuple[np.ndarray, np.ndarray]) -> tuple[bool, _Windows]:
    """Whether the run saturated (rules 1-4 of the module docstring) and the episode it
    is judged by: the largest that saturated it, or else the largest of the run."""
    start, height = _episodes(q)
    large = np.flatnonzero(height >= MIN_GROWTH)
    # The distinct indices in order, without np.union1d (it imports numpy.ma: 0.05 s).
    which = np.array(sorted({*large.tolist(), int(np.argmax(height))}), dtype=np.int64)
    w = _windows(q, start, height, which)
    arrivals = w.peak - w.start + 1
    cand = np.flatnonzero((w.growth >= MIN_GROWTH) & (w.growth > w.noise_floor)
                          & (arrivals >= MIN_SHARE * q.arrival.size))
    lump = _largest_admission(admitted, q.arrival[w.start[cand]], w.drained_s[cand])
    ok = cand[w.growth[cand] > lump]
    pick = ok[np.argmax(w.growth[ok])] if ok.size else np.argmax(w.growth)
    return bool(ok.size), w.take(np.array([pick]))


def _queued_trend(wait: np.ndarray, first: int, last: int) -> list[float]:
    """Mean time in queue (s) of the first and the last third of the arrivals
    ``first``..``last`` (indices into ``wait``, in arrival order)."""
    third = max((last - first + 1) // 3, 1)
    return [float(wait[first:first + third].mean()), float(wait[last + 1 - third:last + 1].mean())]


def _why_steady(growth: int, floor: float, largest_admission: int, share: float) -> str:
    """The first of rules 1-4 that an episode of these numbers fails, in words."""
    if growth < MIN_GROWTH:
        return f"under {MIN_GROWTH} requests"
    if growth <= floor:
        return f"within chance (noise floor {floor:,.0f})"
    if share < MIN_SHARE:
        return f"a burst: {share:.1%} of arrivals, under {MIN_SHARE:.0%}"
    return f"one admission's worth ({largest_admission:,} at once)"


def _window_numbers(q: _Queue, w: _Windows, wait: np.ndarray,
                    admitted: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    """summary.json's account of the one episode in ``w`` (``wait``: time in queue, s,
    in arrival order)."""
    first, top, growth = int(w.start[0]), int(w.peak[0]), int(w.growth[0])
    s, e, drained = float(q.arrival[first]), float(q.arrival[top]), float(w.drained_s[0])
    lump = int(_largest_admission(admitted, q.arrival[w.start], w.drained_s)[0])
    share = (top - first + 1) / q.arrival.size
    return {
        "growth_window_s": [s, e],
        "backlog_growth": growth,
        "queue_growth_per_s": growth / (e - s) if e > s else None,
        "arrivals_in_window": top - first + 1,
        "admissions_in_window": top - first + 1 - growth,
        "noise_floor": float(w.noise_floor[0]),
        "largest_admission": lump,
        "share_of_arrivals": share,
        "queued_time_trend_s": _queued_trend(wait, first, top),
        "drained_s": drained if math.isfinite(drained) else None,
        "reason": _why_steady(growth, float(w.noise_floor[0]), lump, share),
    }


def _line_fit(x: np.ndarray, y: np.ndarray, centre: float, half_width: float
              ) -> tuple[float, float]:
    """The least-squares line ``y ~ slope * x + intercept`` (what ``np.polyfit(x, y, 1)``
    fits), in closed form on ``u = (x - centre) / half_width``: the normal equations of
    a line on a scaled, centred abscissa stay well conditioned over any span (``--rate
    1e-300``), and the sums are numpy's pairwise ones, not LAPACK's, so no BLAS thread
    pool starts and every machine gets the same digits. ``x`` and ``y``: float64 arrays
    of one length >= 2, ``x`` not constant; ``half_width`` > 0 (s)."""
    u = (x - centre) / half_width
    du = u - u.mean()
    dy = y - y.mean()
    slope_u = float(np.sum(du * dy)) / float(np.sum(du * du))
    slope = slope_u / half_width
    return slope, float(y.mean()) - slope_u * float(u.mean()) - slope * centre


def _in_system(arrival: np.ndarray, departure: np.ndarray) -> tuple[bool, dict[str, Any]]:
    """Test B of the module docstring on sorted ``arrival`` and ``departure`` times (s;
    a rejected request departs at its arrival): whether it holds, and its numbers."""
    t0, t1 = float(arrival[0]), float(arrival[-1])
    mid = 0.5 * (t0 + t1)
    grid = np.linspace(mid, t1, GRID_POINTS)
    in_system = (np.searchsorted(arrival, grid, side="right")
                 - np.searchsorted(departure, grid, side="right")).astype(np.float64)
    slope, intercept = _line_fit(grid, in_system, mid, t1 - mid)
    noise = float(np.std(in_system - (slope * grid + intercept)))
    offered = (arrival.size - 1) / (t1 - t0)
    growth = slope * (t1 - mid)
    arrived = int(np.searchsorted(arrival, t1, "right") - np.searchsorted(arrival, mid, "right"))
    served = int(np.searchsorted(departure, t1, "right")
                 - np.searchsorted(departure, mid, "right"))
    level = float(in_system.mean())
    floor = max(float(MIN_GROWTH), NOISE_MULTIPLE * noise, NOISE_Z * math.sqrt(2 * level))
    served_fraction = served / arrived if arrived else None
    gross = served_fraction is not None and served_fraction < SERVED_FLOOR
    first = np.linspace(t0, mid, GRID_POINTS)
    first_peak = int(np.max(np.searchsorted(arrival, first, side="right")
                            - np.searchsorted(departure, first, side="right")))
    at_end = int(in_system[-1])
    growing = bool(slope > GROWTH_FRACTION * offered and growth >= MIN_GROWTH
                   and (growth > floor or gross) and at_end > first_peak)
    return growing, {"window_s": [mid, t1], "growth_per_s": slope,
                     "threshold_per_s": GROWTH_FRACTION * offered, "growth": growth,
                     "fluctuation_sd": noise, "mean": level, "noise_floor": floor,
                     "served_fraction": served_fraction, "first_half_peak": first_peak,
                     "at_end_of_arrivals": at_end, "growing": growing}


def saturation_summary(requests: Table) -> dict[str, Any]:
    """The summary.json keys ``saturated``, ``latency_steady_state`` and ``saturation``
    (the rule, test A's backlog episode and test B's numbers, ``in_system``, each with
    everything it compared; ``reason``: why A's episode did not count, null when it did)
    of a run's request rows (columns arrival_time, first_scheduled_time and finish_time
    in seconds, NaN for a time that never came; a column table as in sim/table.py)."""
    arrival = np.asarray(column(requests, "arrival_time"), dtype=np.float64)
    if arrival.size < 2:
        return _not_measured("fewer than two requests")
    t0, t1 = float(arrival.min()), float(arrival.max())
    if not t1 > t0:
        return _not_measured("every request arrived at the same instant")
    if not t1 - t0 > 1e-9 * max(1.0, abs(t1)):  # no line can be fitted over it
        return _not_measured("the arrivals span no measurable time")
    # Rows in workload order are in arrival order already: no reordered copies then.
    order = (None if bool(np.all(arrival[1:] >= arrival[:-1]))
             else np.argsort(arrival, kind="stable"))

    def by_arrival(values: np.ndarray) -> np.ndarray:
        x = np.asarray(values, dtype=np.float64)
        return x if order is None else x[order]

    arrival = by_arrival(arrival)
    scheduled = by_arrival(column(requests, "first_scheduled_time"))
    if not np.isfinite(scheduled).any():  # no queue formed: nothing was ever admitted
        return _not_measured("no request was served: every one was rejected")
    finish = by_arrival(column(requests, "finish_time"))
    leave = np.where(np.isfinite(scheduled), scheduled, arrival)
    q = _queue(arrival, leave)
    admitted = _groups(np.sort(scheduled[np.isfinite(scheduled)]))
    backlog, w = _judge(q, admitted)
    growing, in_system = _in_system(arrival, np.sort(np.where(np.isfinite(finish), finish,
                                                              arrival)))
    window = _window_numbers(q, w, leave - arrival, admitted)
    if backlog:
        window["reason"] = None
    saturated = backlog or growing
    return {
        "saturated": saturated,
        "latency_steady_state": not saturated,
        "saturation": {
            "rule": RULE,
            "measured": True,
            "arrival_window_s": [t0, t1],
            "offered_rate_per_s": (arrival.size - 1) / (t1 - t0),
            **window,
            "backlog_at_end_of_arrivals": int(np.count_nonzero(leave > t1)),
            "in_system": in_system,
        },
    }
