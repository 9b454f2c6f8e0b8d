"""The diurnal arrival process: a non-homogeneous Poisson process whose rate follows the
day, for replaying days or weeks of traffic from a trace's lengths.

Owns the rate profile and its sampler. The rate at ``t`` seconds is
``rate * (1 - amplitude * cos(2 pi t / period_s))``: its mean over a period is ``rate``,
its trough ``rate * (1 - amplitude)`` at t = 0 (midnight) and its peak
``rate * (1 + amplitude)`` half a period later (noon): one harmonic, the simplest
profile with a day's trough and peak, not a shape fitted to a trace (the public Azure 2023
LLM inference traces hold one hour each). Arrivals are drawn by thinning (Lewis and Shedler 1979,
"Simulation of nonhomogeneous Poisson processes by thinning"): candidates of a Poisson
process at the peak rate, each kept with probability ``rate(t) / peak``. Randomness comes
only from the ``numpy.random.Generator`` passed in; candidates are drawn in blocks whose
sizes depend only on the counts, so one seed gives one sequence.
"""

from __future__ import annotations

import math

import numpy as np

#: Length of one day, seconds: the profile's default period.
DAY_S = 86_400.0

#: Peak-to-mean swing of the rate when none is given: the peak is 1.5x the mean rate and
#: the trough 0.5x. A round default, not a measured figure: give the swing of your own
#: traffic with --diurnal-amplitude.
DEFAULT_AMPLITUDE = 0.5


def check_amplitude(amplitude: float) -> None:
    """ValueError unless ``amplitude`` is a fraction in [0, 1] (1: the rate touches zero
    at the trough)."""
    if not 0.0 <= amplitude <= 1.0:  # also rejects NaN
        raise ValueError(f"diurnal_amplitude must be a fraction in [0, 1], got {amplitude!r}")


def realised_rate(arrival_time: np.ndarray) -> float:
    """Requests per second the arrivals (s, shape ``(n,)``, from the process's t = 0)
    deliver: ``n / last arrival``; inf when there is no span."""
    span_s = float(arrival_time[-1]) if len(arrival_time) else 0.0
    return len(arrival_time) / span_s if span_s > 0 else math.inf


def partial_day_note(arrival_time: np.ndarray, rate: float,
                     period_s: float = DAY_S) -> str | None:
    """One line for arrivals (s, shape ``(n,)``, from the process's t = 0) that span less
    than one period: their mean rate is the profile's mean over a part of the day from
    the trough at t = 0, not ``rate`` (req/s, the mean over whole periods); None when
    they span a period or more."""
    span_s = float(arrival_time[-1]) if len(arrival_time) else 0.0
    if span_s >= period_s:
        return None
    span = f"{span_s / 60:.3g} min" if span_s < 3600 else f"{span_s / 3600:.3g} h"
    return (f"arrival diurnal: the arrivals span {span}, less than one "
            f"{period_s / 3600:g} h period, so their mean rate "
            f"({realised_rate(arrival_time):.3g} req/s) differs from --rate {rate:g}, the "
            f"mean over whole periods (the rate starts at its trough at t = 0)")


def diurnal_rate(t_s: np.ndarray, rate: float, amplitude: float,
                 period_s: float = DAY_S) -> np.ndarray:
    """The instantaneous rate (requests/s) at times ``t_s`` (seconds, any shape)."""
    return rate * (1.0 - amplitude * np.cos(2.0 * math.pi * np.asarray(t_s) / period_s))


def diurnal(rate: float, amplitude: float, n: int, rng: np.random.Generator,
            period_s: float = DAY_S) -> np.ndarray:
    """Arrival times (s), shape ``(n,)``, non-decreasing from t > 0, of ``n`` requests of
    the diurnal process at mean ``rate`` requests/s (module docstring).

    Raises:
        ValueError: ``rate`` not finite and > 0, ``amplitude`` outside [0, 1],
            ``period_s`` not finite and > 0, or ``n`` negative.
    """
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be a finite number > 0 requests/s for arrival "
                         f"'diurnal', got {rate!r}")
    check_amplitude(amplitude)
    if not (period_s > 0 and math.isfinite(period_s)):
        raise ValueError(f"period_s must be a finite number > 0 seconds, got {period_s!r}")
    if int(n) != n or n < 0:
        raise ValueError(f"num_requests must be an integer >= 0, got {n!r}")
    peak = rate * (1.0 + amplitude)
    kept: list[np.ndarray] = []
    have, t0 = 0, 0.0
    # About n * peak / rate candidates keep n; blocks of that size plus a margin make one
    # block enough almost always, and a short one is followed by another.
    block = int(n * (1.0 + amplitude) * 1.05) + 64
    while have < n:
        t = t0 + np.cumsum(rng.exponential(1.0 / peak, size=block))
        accept = rng.random(block) * peak < diurnal_rate(t, rate, amplitude, period_s)
        kept.append(t[accept][: n - have])
        have += len(kept[-1])
        t0 = float(t[-1])
    return np.concatenate(kept) if kept else np.zeros(0, dtype=np.float64)
