"""The device probe: one fixed reference step timed again and again during a real run, so
that a drift in the device's speed (a shared VM's neighbours taking memory bandwidth,
which no clock can subtract) can be told apart from the profile's error.

Owns the probe's settings check (:func:`check_probe`), the reference step's shape as a
cost model prices it (:func:`probe_shape`), the free cache slot a probe borrows and gives
back as found (:func:`borrowed_slot`), what calibration measured for that shape
(:func:`calibrated_seconds`), a run's probes (:class:`Probes`) and their summary
(:meth:`Probes.summary`: the device's drift since calibration, and the step bias once
that drift is taken out; :func:`probe_line` says it in one line). The timing itself is
calibration.executor.TorchExecutor.probe, which owns the caches and the clock the real
steps use; torch is not imported here.

Errors and drifts are ``then / now - 1``, as everywhere in validation (negative: the
device ran slower than when the profile was made).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from sim.batch import BatchShape

if TYPE_CHECKING:
    from calibration.grid import MeasuredPoint
    from calibration.torch_model import KVCache

#: Cached tokens the reference decode attends over (before its own token).
PROBE_CONTEXT = 128
#: Seconds of executed step time between probes in ``servesim validate`` (0: none).
PROBE_EVERY_S = 10.0


def check_probe(probe_every_s: float, probe_context: int = PROBE_CONTEXT) -> None:
    """Raise ValueError naming probe_every_s unless it is >= 0 (0: no probes), or naming
    probe_context when it is negative."""
    if not probe_every_s >= 0:
        raise ValueError(f"probe_every_s must be >= 0, got {probe_every_s}")
    if probe_context < 0:
        raise ValueError(f"probe_context must be >= 0, got {probe_context}")


def probe_shape(context: int) -> BatchShape:
    """The reference step as sim.batch counts it: one decode, sampled, over ``context``
    cached tokens (a decode's context tokens are its cached ones plus itself)."""
    return BatchShape(0, 0, 0, 0, 1, context + 1, 1)


@contextmanager
def borrowed_slot(cache: KVCache, slot: int, context: int) -> Iterator[int]:
    """``slot`` (owned by no request) holding ``context`` cached tokens for one decode,
    then given back as found: its length, and the keys and values at position
    ``context`` that the decode writes (a request later given the slot with a prefix-cache
    hit reads them as it would have without the probe)."""
    kv = (*cache.k, *cache.v)
    saved = [t[slot, :, context].clone() for t in kv]
    length, cache.lengths[slot] = cache.lengths[slot], context
    try:
        yield slot
    finally:
        cache.lengths[slot] = length
        for t, x in zip(kv, saved, strict=True):
            t[slot, :, context] = x


class Timed(Protocol):
    """What a probe's timing gives (calibration.executor.StepTiming)."""

    @property
    def seconds(self) -> float: ...


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def calibrated_seconds(points: Sequence[MeasuredPoint], shape: BatchShape,
                       statistic: str) -> float | None:
    """What calibration measured for ``shape`` (a profile's ``points``, the run that its fit
    ``statistic`` takes: the fastest for "min", else the median), or None when the grid
    never timed that shape. The probe's shape is one of the default grid's decode points."""
    for mp in points:
        if mp.shape == shape:
            return mp.seconds if statistic == "min" else mp.seconds_median
    return None


@dataclass(frozen=True, slots=True)
class Probes:
    """A run's probes: the reference decode's ``context_tokens``, the profile's price of
    it (``predicted_s``, its fit), what calibration measured for it (``calibrated_s``;
    None when its grid lacks the shape), and per probe the number of steps executed before
    it (``before_step``, ascending) and its measured seconds (``measured_s``)."""

    context_tokens: int
    predicted_s: float
    calibrated_s: float | None
    before_step: tuple[int, ...]
    measured_s: tuple[float, ...]

    @classmethod
    def taken(cls, probes: Sequence[tuple[int, Timed]], context_tokens: int,
              predicted_s: float, calibrated_s: float | None = None) -> Probes | None:
        """An executor's ``probes`` ((steps executed before, timing) pairs) of a decode
        over ``context_tokens``, priced ``predicted_s`` by the profile and measured
        ``calibrated_s`` when it was calibrated; None when empty."""
        if not probes:
            return None
        return cls(context_tokens, predicted_s, calibrated_s, tuple(i for i, _ in probes),
                   tuple(t.seconds for _, t in probes))

    @property
    def reference_s(self) -> float:
        """The device's speed on the probe when the profile was made: calibration's own
        measurement of it, else the fit's price (which adds the fit's error there)."""
        return self.calibrated_s if self.calibrated_s is not None else self.predicted_s

    def summary(self, every_s: float, step_predicted_s: Sequence[float],
                step_measured_s: Sequence[float]) -> dict[str, Any] | None:
        """validation.json's ``device_probe`` (None without probes): the probes; the
        device's drift, reference_s / measured - 1 at the probes' median (``drift_p50``)
        and at the slowest probe (``drift_min``); the fit's own error on the probe at the
        median (``error_p50``, predicted / measured - 1); and ``step_bias_vs_probe``: the
        mean of predicted * f / measured - 1 over the steps, f = the probes' median over
        reference_s: the step bias once the device's typical speed during the run is taken
        out (slowdowns shorter than the probe interval stay in it; None without steps).
        A median, not a per-step interpolation: one probe that lands in a second-long
        slowdown would otherwise stand for every step until the next probe."""
        if not self.measured_s:
            return None
        m = np.asarray(self.measured_s, dtype=np.float64)
        med, ref = float(np.median(m)), self.reference_s
        p = np.asarray(step_predicted_s, dtype=np.float64)
        bias = None
        if p.size:
            with np.errstate(divide="ignore", invalid="ignore"):
                adjusted = p * (med / ref) / np.asarray(step_measured_s) - 1
            bias = _finite(float(adjusted.mean()))
        return {"context_tokens": self.context_tokens, "every_s": every_s,
                "predicted_s": self.predicted_s, "calibrated_s": self.calibrated_s,
                "before_step": list(self.before_step), "measured_s": [float(x) for x in m],
                "drift_p50": _finite(ref / med - 1.0),
                "drift_min": _finite(ref / float(m.max()) - 1.0),
                "error_p50": _finite(self.predicted_s / med - 1.0),
                "step_bias_vs_probe": bias}


def probe_line(summary: dict[str, Any] | None) -> str:
    """A :meth:`Probes.summary` in one line ("device probe: none" for None)."""
    if not summary:
        return "device probe: none"
    d, m = summary, summary["measured_s"]
    n = len(m)
    then = ("calibration measured" if d.get("calibrated_s") is not None
            else "the profile prices it")
    ref = d["calibrated_s"] if d.get("calibrated_s") is not None else d["predicted_s"]
    return (f"device probe (1 decode over {d['context_tokens']} tokens, {n} "
            f"probe{'s' if n != 1 else ''}, every {d['every_s']:g} s of steps): {then} "
            f"{ref * 1e3:.1f} ms, now p50 {np.median(m) * 1e3:.1f} ms "
            f"({min(m) * 1e3:.1f}-{max(m) * 1e3:.1f}): device drift {_pct(d['drift_p50'])} "
            f"at p50, {_pct(d['drift_min'])} at the slowest probe; step bias with the "
            f"drift taken out {_pct(d['step_bias_vs_probe'])}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"
