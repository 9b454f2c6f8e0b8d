"""Fitting a step-cost model to measured step times.

Owns: the features (:data:`FEATURES`, :func:`feature_vector`: physical work counts computed
from a BatchShape alone), the deterministic held-out split (:func:`heldout_mask`), the
non-negative least-squares fit on relative error (:func:`fit_points`, scipy ``lsq_linear``),
the fit record (:class:`FitResult`, :class:`RegionError`) and the refusal of a fit whose
held-out error is too large (:class:`FitRejected`). No torch.

Model (seconds per step)::

    t = sum_i coef_i * feature_i(shape),  coef_i >= 0

The ``tokens_over_knot`` feature, max(0, num_tokens - knot), makes the token term a
roofline: below the knot a step streams the weights whatever its size (memory-bound, the
``step`` constant plus a small per-token slope); above it every token adds matmul work
(compute-bound, a steeper slope). The knot is picked from :data:`KNOTS` by training error.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration.grid import REGIONS, MeasuredPoint
from sim.batch import BatchShape

FEATURES = ("step", "tokens", "tokens_over_knot", "prefill_attention_pairs",
            "prefill_context_tokens", "decode_context_tokens", "seqs", "sampled_seqs",
            "lm_head")
FEATURE_MEANINGS = {
    "step": "1 per step: launch / framework overhead and weight streaming of a small step",
    "tokens": "num_tokens: tokens through the linear layers (QKV, O, MLP), norms, rotary",
    "tokens_over_knot": "max(0, num_tokens - knot): extra per-token matmul cost once "
                        "compute-bound (the roofline's second slope)",
    "prefill_attention_pairs": "causal (query, key) pairs of prefill chunks: attention FLOPs",
    "prefill_context_tokens": "prior-context tokens of prefill chunks: KV-cache reads",
    "decode_context_tokens": "keys read by decodes (sum of context + 1): KV-cache reads",
    "seqs": "num_seqs: per-sequence attention calls and bookkeeping",
    "sampled_seqs": "LM-head rows (vocab x hidden matmul per sampled sequence)",
    "lm_head": "1 when any sequence samples: the LM-head weights are read once per step",
}
PER_LAYER = frozenset(FEATURES) - {"sampled_seqs", "lm_head"}
"""Features whose cost is paid once per layer, so scale with the layer count when a
subset of layers was measured (the LM head runs once per step)."""

KNOTS: tuple[int | None, ...] = (None, 8, 16, 32, 64, 128, 256)
"""Candidate roofline knots in tokens (None: no second slope)."""

HELDOUT_FRACTION = 0.25
DEFAULT_MAX_MAPE = 0.10

STATISTICS = ("min", "median")
"""Which of a point's timed runs a fit takes: "min" (MeasuredPoint.seconds, the fastest:
the steadiest estimate of a step under wall-clock timing on a shared machine, where load
only adds time) or "median" (MeasuredPoint.seconds_median: the step a single run of the
engine typically takes, which is what a replay meets; with thread-CPU timing load does not
inflate it)."""


def check_statistic(statistic: str, field: str = "statistic") -> None:
    """ValueError naming ``field`` when ``statistic`` is not one of STATISTICS."""
    if statistic not in STATISTICS:
        raise ValueError(f"{field} must be {'|'.join(STATISTICS)}, got {statistic!r}")


def default_statistic(timer: str) -> str:
    """The statistic a fit takes when not told: "median" for steps timed on the thread
    clock (other processes' time is not counted, and one real run meets each step at its
    typical speed), "min" on the wall clock (load only adds time)."""
    return "median" if timer == "thread" else "min"


def chosen_run(seconds: Sequence[float], statistic: str) -> int:
    """Index of the run of ``seconds`` (one step timed several times) that ``statistic``
    takes: the fastest for "min", the middle one by time for "median" (the lower of the
    two middle ones for an even count). ValueError for no runs or another statistic."""
    if not seconds:
        raise ValueError("seconds: no runs to choose from")
    check_statistic(statistic)
    order = sorted(range(len(seconds)), key=seconds.__getitem__)
    return order[0] if statistic == "min" else order[(len(order) - 1) // 2]


def point_seconds(point: MeasuredPoint, statistic: str) -> float:
    """The time a fit on ``statistic`` (STATISTICS) takes for ``point``, s."""
    return point.seconds_median if statistic == "median" else point.seconds


def feature_vector(shape: BatchShape, knot_tokens: int | None) -> list[float]:
    """The FEATURES of one step, in order (counts; units in FEATURE_MEANINGS)."""
    n = shape.num_tokens
    over = 0 if knot_tokens is None else max(0, n - knot_tokens)
    return [1.0, float(n), float(over), float(shape.prefill_attention_pairs),
            float(shape.prefill_context_tokens), float(shape.decode_context_tokens),
            float(shape.num_seqs), float(shape.num_sampled_seqs),
            1.0 if shape.num_sampled_seqs else 0.0]


def heldout_mask(points: Sequence[MeasuredPoint]) -> list[bool]:
    """True for held-out points: in each region, the ceil(25%) whose (region, grid index)
    has the smallest CRC-32; deterministic, spread over the grid, independent of the order
    or subset measured. A region of one point holds nothing out."""
    mask = [False] * len(points)
    for region in REGIONS:
        idx = [i for i, p in enumerate(points) if p.region == region]
        if len(idx) < 2:
            continue
        idx.sort(key=lambda i: zlib.crc32(f"{region}:{points[i].point.index}".encode()))
        for i in idx[: math.ceil(len(idx) * HELDOUT_FRACTION)]:
            mask[i] = True
    return mask


@dataclass(frozen=True, slots=True)
class RegionError:
    """Relative errors |predicted - measured| / measured of one region (fractions, not %).
    mape / max_error: over held-out points (None when the region has none)."""

    num_train: int
    num_heldout: int
    train_mape: float | None
    mape: float | None
    max_error: float | None


@dataclass(frozen=True, slots=True)
class FitResult:
    """A fitted step-cost model: coefficients (seconds per unit of each feature, for the
    layers measured), the knot, held-out errors per region, and status "accepted",
    "forced" (kept above max_mape on request) or "rejected"; ``statistic`` which of each
    point's runs it was fitted to (STATISTICS; profiles from before it was recorded: min)."""

    features: tuple[str, ...]
    coefficients: tuple[float, ...]
    knot_tokens: int | None
    errors: dict[str, RegionError]
    status: str
    max_mape: float = DEFAULT_MAX_MAPE
    statistic: str = "min"

    def predict(self, shape: BatchShape) -> float:
        """Seconds for one step of the measured model (no layer scaling)."""
        x = feature_vector(shape, self.knot_tokens)
        return sum(c * v for c, v in zip(self.coefficients, x, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(self.features), "coefficients": list(self.coefficients),
                "knot_tokens": self.knot_tokens, "status": self.status,
                "max_mape": self.max_mape, "heldout_fraction": HELDOUT_FRACTION,
                "statistic": self.statistic,
                "errors": {r: {"num_train": e.num_train, "num_heldout": e.num_heldout,
                               "train_mape": e.train_mape, "mape": e.mape,
                               "max_error": e.max_error} for r, e in self.errors.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FitResult:
        """Inverse of to_dict; KeyError / ValueError when malformed or features differ."""
        if tuple(d["features"]) != FEATURES:
            raise ValueError(f"fit.features {d['features']} differ from this version's "
                             f"{list(FEATURES)}")
        coefs = tuple(float(c) for c in d["coefficients"])
        if len(coefs) != len(FEATURES) or any(not c >= 0 for c in coefs):
            raise ValueError(f"fit.coefficients must be {len(FEATURES)} numbers >= 0")
        if d["status"] not in ("accepted", "forced", "rejected"):
            raise ValueError(f"fit.status must be accepted|forced|rejected, got {d['status']!r}")
        statistic = d.get("statistic", "min")
        check_statistic(statistic, "fit.statistic")
        knot = d["knot_tokens"]
        errors = {r: RegionError(**e) for r, e in d["errors"].items()}
        return cls(FEATURES, coefs, None if knot is None else int(knot), errors, d["status"],
                   float(d["max_mape"]), statistic)


class FitRejected(ValueError):
    """The fit's held-out error exceeds max_mape in some region (or a region has no
    held-out point). ``fit`` holds the rejected result, ``region`` the worst region."""

    def __init__(self, fit: FitResult, region: str, message: str) -> None:
        super().__init__(message)
        self.fit = fit
        self.region = region


def _solve(points: Sequence[MeasuredPoint], knot: int | None,
           statistic: str) -> tuple[np.ndarray, float]:
    """Non-negative coefficients minimising the relative squared error; and its RMS."""
    from scipy.optimize import lsq_linear  # only fitting needs scipy, not the cost model

    x = np.array([feature_vector(p.shape, knot) for p in points])
    y = np.array([point_seconds(p, statistic) for p in points])
    a = x / y[:, None]  # rows weighted by 1/y: the residual is the relative error
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0  # an all-zero column keeps coefficient 0
    res = lsq_linear(a / scale, np.ones(len(y)), bounds=(0.0, np.inf), method="bvls",
                     tol=1e-14)
    coefs = np.maximum(res.x / scale, 0.0)
    rel = a @ coefs - 1.0
    return coefs, float(np.sqrt(np.mean(rel**2)))


def _rel_errors(fit: np.ndarray, knot: int | None, points: Sequence[MeasuredPoint],
                statistic: str) -> list[float]:
    out = []
    for p in points:
        y = point_seconds(p, statistic)
        out.append(abs(float(np.dot(fit, feature_vector(p.shape, knot))) - y) / y)
    return out


def fit_points(points: Sequence[MeasuredPoint], *, force: bool = False,
               max_mape: float = DEFAULT_MAX_MAPE,
               knots: Sequence[int | None] = KNOTS, statistic: str = "min") -> FitResult:
    """Fit FEATURES to the training points (those not held out) and score the held-out
    ones per region, both on each point's ``statistic`` (STATISTICS). The knot with the
    lowest training RMS relative error wins.

    Raises ValueError naming ``points`` when fewer training points than features,
    ``max_mape`` when not > 0, or ``statistic`` when not in STATISTICS; FitRejected when a
    region's held-out MAPE exceeds max_mape or it has no held-out points, unless force
    (status "forced" then).
    """
    if not max_mape > 0:
        raise ValueError(f"max_mape must be > 0, got {max_mape}")
    check_statistic(statistic)
    mask = heldout_mask(points)
    train = [p for p, h in zip(points, mask, strict=True) if not h]
    if len(train) < len(FEATURES):
        raise ValueError(f"points: {len(train)} training points, need >= {len(FEATURES)}")
    solutions = [(*_solve(train, k, statistic), k) for k in knots]
    coefs, _, knot = min(solutions, key=lambda s: s[1])
    errors: dict[str, RegionError] = {}
    for region in REGIONS:
        tr = [p for p, h in zip(points, mask, strict=True) if p.region == region and not h]
        ho = [p for p, h in zip(points, mask, strict=True) if p.region == region and h]
        tr_e = _rel_errors(coefs, knot, tr, statistic)
        ho_e = _rel_errors(coefs, knot, ho, statistic)
        errors[region] = RegionError(len(tr), len(ho), float(np.mean(tr_e)) if tr_e else None,
                                     float(np.mean(ho_e)) if ho_e else None,
                                     max(ho_e) if ho_e else None)
    mape = {r: math.inf if e.mape is None else e.mape for r, e in errors.items()}
    worst = max(REGIONS, key=mape.__getitem__)
    bad = mape[worst] > max_mape
    status = "accepted" if not bad else ("forced" if force else "rejected")
    result = FitResult(FEATURES, tuple(float(c) for c in coefs), knot, errors, status,
                       max_mape, statistic)
    if status == "rejected":
        raise FitRejected(result, worst, _rejection(errors, worst, max_mape))
    return result


def _rejection(errors: dict[str, RegionError], worst: str, max_mape: float) -> str:
    summary = ", ".join(f"{r} {'-' if e.mape is None else f'{e.mape:.1%}'}"
                        for r, e in errors.items())
    what = ("has no held-out points (measure more: raise the budget)"
            if errors[worst].mape is None
            else f"held-out MAPE {errors[worst].mape:.1%} > {max_mape:.0%}")
    return f"fit refused: region {worst!r} {what} [{summary}]; force it with --force"
