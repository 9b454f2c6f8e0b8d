"""Arrival processes: when requests arrive, as float64 arrays of seconds.

Owns the inter-arrival models: gamma renewal (burstiness ``k``, as vLLM's
``benchmarks/serve.py --burstiness``: shape ``k``, scale ``1 / (rate * k)``), Poisson
(= gamma with ``k = 1``, so the two draw identical numbers for one seed), constant gaps,
and periodic bursts; the diurnal process (a day-long rate profile) is scenarios/diurnal.py's.
Every process starts its clock at t = 0; renewal processes put the
first arrival after the first gap (``times = cumsum(gaps)``), bursts put the first wave at
t = 0. ``rate = inf`` puts every arrival at t = 0. Randomness comes only from the
``numpy.random.Generator`` passed in.
"""

from __future__ import annotations

import math

import numpy as np

from scenarios.diurnal import DEFAULT_AMPLITUDE, diurnal

ARRIVAL_PROCESSES = ("poisson", "gamma", "constant", "bursts", "diurnal")


def _check_n(n: int) -> None:
    if int(n) != n or n < 0:
        raise ValueError(f"num_requests must be an integer >= 0, got {n!r}")


#: Slowest arrival rate accepted, requests/s (one request in about 11.6 days). The
#: simulated clock is a float64 of seconds: at 1e9 s it still resolves 0.2 us, while a
#: rate near float64's smallest numbers makes 1 / rate overflow to inf.
MIN_RATE = 1e-6


def _check_rate(rate: float) -> None:
    if not rate >= MIN_RATE:  # also rejects NaN
        raise ValueError(f"rate must be >= {MIN_RATE:g} requests/s (inf allowed), got "
                         f"{rate!r}")


def gamma_gaps(
    rate: float, burstiness: float, n: int, rng: np.random.Generator
) -> np.ndarray:
    """``n`` i.i.d. gamma inter-arrival gaps, float64 seconds, shape ``(n,)``.

    Mean gap ``1 / rate``; coefficient of variation ``1 / sqrt(burstiness)``
    (``burstiness < 1`` is burstier than Poisson, ``> 1`` more regular). ``burstiness =
    inf`` gives gaps of exactly ``1 / rate`` (no draw, never NaN); ``rate = inf`` gives
    zero gaps. Neither special case consumes random numbers.

    Raises:
        ValueError: ``rate`` not > 0, ``burstiness`` not > 0, or ``n`` negative.
    """
    _check_rate(rate)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0 (inf allowed), got {burstiness!r}")
    _check_n(n)
    if math.isinf(rate):
        return np.zeros(n, dtype=np.float64)
    if math.isinf(burstiness):
        return np.full(n, 1.0 / rate, dtype=np.float64)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def gamma(rate: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a gamma renewal process: ``cumsum(gamma_gaps(...))``.

    The first arrival is at the first gap (> 0), not at t = 0; all at 0 when
    ``rate = inf``; ``burstiness = inf`` returns ``constant(rate, n)`` (no rounding drift).
    See ``gamma_gaps`` for the parameters and errors.
    """
    gaps = gamma_gaps(rate, burstiness, n, rng)
    if math.isinf(burstiness):
        return constant(rate, n)
    return np.cumsum(gaps)


def poisson(rate: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a Poisson process at ``rate`` req/s: ``gamma(rate, 1, n, rng)``."""
    return gamma(rate, 1.0, n, rng)


def constant(rate: float, n: int) -> np.ndarray:
    """Arrival times (s) ``1/rate, 2/rate, ...``: ``gamma`` with infinite burstiness.

    Computed as ``(i + 1) / rate`` rather than a running sum, so no rounding drift;
    all at t = 0 when ``rate = inf``.

    Raises:
        ValueError: ``rate`` not > 0 or ``n`` negative.
    """
    _check_rate(rate)
    _check_n(n)
    if math.isinf(rate):
        return np.zeros(n, dtype=np.float64)
    return np.arange(1, n + 1, dtype=np.float64) / rate


def bursts(n: int, burst_size: int, period_s: float) -> np.ndarray:
    """Arrival times (s) in waves: ``burst_size`` requests together every ``period_s``.

    Waves at ``0, period_s, 2 * period_s, ...``; the last wave may be partial. Mean rate
    ``burst_size / period_s`` req/s. ``period_s = 0`` puts everything at t = 0.

    Raises:
        ValueError: ``burst_size`` < 1, ``period_s`` negative or not finite, ``n`` negative.
    """
    _check_n(n)
    if int(burst_size) != burst_size or burst_size < 1:
        raise ValueError(f"burst_size must be an integer >= 1, got {burst_size!r}")
    if not (period_s >= 0 and math.isfinite(period_s)):
        raise ValueError(f"period_s must be finite and >= 0 seconds, got {period_s!r}")
    return (np.arange(n) // int(burst_size)).astype(np.float64) * period_s


def generate(
    process: str,
    rate: float,
    n: int,
    rng: np.random.Generator,
    *,
    burstiness: float = 1.0,
    burst_size: int = 8,
    amplitude: float = DEFAULT_AMPLITUDE,
) -> np.ndarray:
    """Arrival times (s) of ``n`` requests from the named process at mean ``rate`` req/s.

    ``process`` is one of ``ARRIVAL_PROCESSES``. ``burstiness`` is used by ``gamma`` only;
    ``bursts`` sends ``burst_size`` requests every ``burst_size / rate`` seconds;
    ``diurnal`` swings its rate by ``amplitude`` over a day (scenarios/diurnal.py).

    Raises:
        ValueError: unknown ``process`` or an invalid parameter (see each process).
    """
    if process == "poisson":
        return poisson(rate, n, rng)
    if process == "gamma":
        return gamma(rate, burstiness, n, rng)
    if process == "constant":
        return constant(rate, n)
    if process == "bursts":
        _check_rate(rate)
        return bursts(n, burst_size, 0.0 if math.isinf(rate) else burst_size / rate)
    if process == "diurnal":
        return diurnal(rate, amplitude, n, rng)
    raise ValueError(f"arrival must be one of {', '.join(ARRIVAL_PROCESSES)}; got {process!r}")
