"""Saturation: did the queue grow without bound over the arrival window?

A run whose offered load exceeds what the engine serves has no steady state: its backlog
grows for as long as requests keep arriving, so its latency percentiles measure the length
of the window, not the system. Such a run is flagged ``saturated`` in summary.json and its
percentiles are marked as not steady-state (``latency_steady_state: false``).

The rule, on the request records alone (no step rows needed, so it also holds across the
idle gaps of an engine and for a whole cluster):

- N(t) = requests in the system at t: arrived and not yet finished (a rejected request
  leaves at its arrival).
- Over the second half of the arrival window [t_mid, t_last] (the first half lets the
  system fill up to its working level), fit a least-squares line to N(t) sampled at
  GRID_POINTS evenly spaced times.
- saturated when the slope exceeds GROWTH_FRACTION of the offered rate (n - 1) /
  (t_last - t_first), i.e. throughput below 95% of the offered rate, and the fitted growth
  over that half clears a noise floor: at least MIN_GROWTH requests, more than
  NOISE_MULTIPLE standard deviations of N(t) about the line, and more than POISSON_Z
  standard deviations of the difference of two independent Poisson counts of mean L
  (L = mean N(t) over the half: the stationary count of an uncongested batch server,
  M/G/inf, is Poisson). A stable system's ups and downs, which in short runs of long
  requests can look like growth, stay under the floor; a queue that grows without bound
  clears it as soon as the window is long compared with the request latencies (the rule
  cannot tell a mild overload in a short run from chance: more requests, a longer window).
  A gross overload needs no statistics: when fewer than SERVED_FLOOR of the requests that
  arrived over the half left it, growth of MIN_GROWTH requests is enough. (A run whose
  window is shorter than its requests' latencies, still filling up when arrivals stop, is
  then flagged too: it never reached a steady state either.)

A closed loop (a fixed number of users) can never saturate by this rule: N(t) is bounded
by the number of users. That is the point of the rule, not a gap in it: a closed loop
hides queueing instead of growing a queue.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from sim.table import Table, column

GROWTH_FRACTION = 0.05
"""Backlog growth, as a fraction of the offered rate, above which a run is saturated."""

MIN_GROWTH = 10
"""Fewest requests the backlog must grow by over the second half to count."""

NOISE_MULTIPLE = 2.0
"""Growth must exceed this many standard deviations of N(t) about the fitted line."""

POISSON_Z = 3.0
"""Growth must exceed POISSON_Z * sqrt(2 L), L = mean requests in the system."""

SERVED_FLOOR = 0.5
"""Served / arrived over the second half below which any growth >= MIN_GROWTH counts."""

GRID_POINTS = 200
"""Samples of N(t) the line is fitted to."""

RULE = (f"saturated when the number of requests in the system grows, over the second half "
        f"of the arrival window, faster than {GROWTH_FRACTION:.0%} of the offered rate "
        f"(least-squares slope) and by more than a noise floor: max({MIN_GROWTH} requests, "
        f"{NOISE_MULTIPLE:g} x the sd of its fluctuation about that line, "
        f"{POISSON_Z:g} x sqrt(2 x its mean)), or by at least {MIN_GROWTH} requests while "
        f"fewer than {SERVED_FLOOR:.0%} of the requests arriving in that half left it")


def _not_measured(reason: str) -> dict[str, Any]:
    return {"saturated": False, "latency_steady_state": True,
            "saturation": {"rule": RULE, "measured": False, "reason": reason}}


def saturation_summary(requests: Table) -> dict[str, Any]:
    """The summary.json keys ``saturated``, ``latency_steady_state`` and ``saturation``
    (the rule, the fitted growth and the numbers it was compared with) of a run's request
    rows (columns arrival_time, finish_time in seconds; a column table as in
    sim/table.py)."""
    arr = column(requests, "arrival_time").astype(np.float64)
    if arr.size < 2:
        return _not_measured("fewer than two requests")
    t0, t1 = float(arr.min()), float(arr.max())
    if not t1 > t0:
        return _not_measured("every request arrived at the same instant")
    if not t1 - t0 > 1e-9 * max(1.0, abs(t1)):  # no line can be fitted over it
        return _not_measured("the arrivals span no measurable time")
    fin = column(requests, "finish_time").astype(np.float64)
    dep = np.sort(np.where(np.isfinite(fin), fin, arr))
    arr = np.sort(arr)
    mid = 0.5 * (t0 + t1)
    grid = np.linspace(mid, t1, GRID_POINTS)
    in_system = (np.searchsorted(arr, grid, side="right")
                 - np.searchsorted(dep, grid, side="right")).astype(np.float64)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        # Arrivals over astronomically long spans (--rate 1e-300) make the fit poorly
        # conditioned; its warnings would only clutter the run's one-line output.
        warnings.simplefilter("ignore", np.exceptions.RankWarning)
        slope, intercept = (float(x) for x in np.polyfit(grid, in_system, 1))
    noise = float(np.std(in_system - (slope * grid + intercept)))
    offered = (arr.size - 1) / (t1 - t0)
    growth = slope * (t1 - mid)
    arrived = int(np.searchsorted(arr, t1, "right") - np.searchsorted(arr, mid, "right"))
    served = int(np.searchsorted(dep, t1, "right") - np.searchsorted(dep, mid, "right"))
    level = float(in_system.mean())
    floor = max(float(MIN_GROWTH), NOISE_MULTIPLE * noise, POISSON_Z * math.sqrt(2 * level))
    served_fraction = served / arrived if arrived else None
    gross = served_fraction is not None and served_fraction < SERVED_FLOOR
    saturated = bool(slope > GROWTH_FRACTION * offered and growth >= MIN_GROWTH
                     and (growth > floor or gross))
    return {
        "saturated": saturated,
        "latency_steady_state": not saturated,
        "saturation": {
            "rule": RULE,
            "measured": True,
            "window_s": [mid, t1],
            "queue_growth_per_s": slope,
            "offered_rate_per_s": offered,
            "threshold_per_s": GROWTH_FRACTION * offered,
            "growth_over_window": growth,
            "fluctuation_sd": noise,
            "mean_in_system": level,
            "noise_floor": floor,
            "served_fraction": served_fraction,
        },
    }
