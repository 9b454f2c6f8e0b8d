"""Versioned calibration profiles: the JSON file and the cost model read from it.

Owns: :class:`Profile` (everything one ``servesim calibrate`` run measured and fitted),
its JSON form (``{"format": "servesim-profile", "version": 1, ...}``), :func:`save_profile`
(written whole or not at all), :func:`load_profile` (one clear ValueError line per bad
file), :func:`refit` (a new fit from the stored points, no device needed),
:class:`MeasuredRange` (how far the measured points reach, and the warnings for a run
beyond it) and :class:`ProfileCostModel` (the simulator's CostModel over a profile). No
torch.

Top-level keys: format, version, model (ModelSpec fields), device ("cpu" | "cuda"),
device_name, torch_version, dtype, date (ISO 8601, UTC), num_layers_measured,
num_layers_model, approximation (None, or how a layer subset was scaled), grid (GridConfig
fields, num_planned, num_measured, elapsed_s), fit (features, coefficients in seconds per
unit, knot_tokens, status, per-region held-out errors, statistic: which of a point's runs it
was fitted to, absent in older files, which fitted the fastest), memory (bytes + note),
engine (which engine ran the steps: "name" torch or vllm, the "timer", and the engine's own
facts: for vLLM its version, start-up KV figures and per-point phase split), points (every
measured point: grid fields, BatchShape fields, seconds). A file without "engine" was
measured on the torch engine with the wall clock, the only ones there were then.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibration.fit import (
    DEFAULT_MAX_MAPE,
    FEATURES,
    PER_LAYER,
    FitResult,
    feature_vector,
    fit_points,
)
from calibration.grid import REGIONS, MeasuredPoint
from calibration.specs import DTYPE_BYTES, ModelSpec
from sim.batch import BatchShape
from sim.staging import place_file

if TYPE_CHECKING:
    from calibration.measure import Measurement

FORMAT = "servesim-profile"
VERSION = 1
_KEYS = ("model", "device", "device_name", "torch_version", "dtype", "date",
         "num_layers_measured", "grid", "fit", "memory", "points")
TORCH_WALL = {"name": "torch", "timer": "wall"}
"""The engine record of a profile file that has none."""


@dataclass(frozen=True, slots=True)
class Profile:
    """One calibration: the measured setup, the fit and every measured point.

    fit.coefficients are for the ``num_layers_measured`` layers that ran; ``layer_scale``
    (model layers / measured layers) scales the per-layer ones (fit.PER_LAYER) up to the
    whole model, an approximation labelled by ``approximation``. ``engine``: which engine
    ran the steps, its clock and facts (Measurement.engine).
    """

    model: dict[str, Any]
    device: str
    device_name: str
    torch_version: str
    dtype: str
    date: str
    num_layers_measured: int
    grid: dict[str, Any]
    fit: FitResult
    memory: dict[str, Any]
    points: tuple[MeasuredPoint, ...]
    engine: dict[str, Any] = field(default_factory=lambda: dict(TORCH_WALL))

    @property
    def num_layers_model(self) -> int:
        return int(self.model["num_layers"])

    @property
    def layer_scale(self) -> float:
        return self.num_layers_model / self.num_layers_measured

    @property
    def measured_range(self) -> MeasuredRange:
        """How far the measured points reach (beyond it the fit extrapolates)."""
        return MeasuredRange.of(self.points)

    @property
    def approximation(self) -> str | None:
        """None when every layer was measured; else what was scaled and by how much."""
        if self.num_layers_measured == self.num_layers_model:
            return None
        return (f"layer subset: measured {self.num_layers_measured} of "
                f"{self.num_layers_model} layers; per-layer terms scaled by "
                f"{self.layer_scale:.4g} (LM head not scaled)")

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "model": self.model,
                "device": self.device, "device_name": self.device_name,
                "torch_version": self.torch_version, "dtype": self.dtype, "date": self.date,
                "num_layers_measured": self.num_layers_measured,
                "num_layers_model": self.num_layers_model,
                "approximation": self.approximation, "grid": self.grid,
                "fit": self.fit.to_dict(), "memory": self.memory, "engine": self.engine,
                "points": [p.to_dict() for p in self.points]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        """Inverse of to_dict (format and version checked by load_profile); KeyError,
        TypeError or ValueError when a field is malformed."""
        layers = int(d["num_layers_measured"])
        if not 1 <= layers <= int(d["model"]["num_layers"]):
            raise ValueError(f"num_layers_measured {layers} outside 1..model.num_layers")
        return cls(dict(d["model"]), str(d["device"]), str(d["device_name"]),
                   str(d["torch_version"]), str(d["dtype"]), str(d["date"]), layers,
                   dict(d["grid"]), FitResult.from_dict(d["fit"]), dict(d["memory"]),
                   tuple(MeasuredPoint.from_dict(p) for p in d["points"]),
                   dict(d.get("engine") or TORCH_WALL))


@dataclass(frozen=True, slots=True)
class MeasuredRange:
    """How far a profile's measured points reach: the most sequences and tokens in one
    step, and the longest context one sequence attends over (tokens). Beyond them the
    fit extrapolates."""

    max_seqs: int
    max_tokens: int
    max_context: int

    @classmethod
    def of(cls, points: tuple[MeasuredPoint, ...]) -> MeasuredRange:
        """The range of ``points`` (a decode over c cached tokens attends over c + 1; a
        chunk of n tokens after c over c + n)."""
        shapes = [p.shape for p in points]
        return cls(
            max(s.num_prefill_seqs + s.num_decode_seqs for s in shapes),
            max(s.num_prefill_tokens + s.num_decode_seqs for s in shapes),
            max(max(p.point.decode_context + 1 if p.point.decode_seqs else 0,
                    p.point.chunk_context + p.point.chunk_tokens) for p in points))

    def warnings(self, max_num_seqs: int, max_num_batched_tokens: int | None,
                 max_model_len: int, longest_request: int) -> list[str]:
        """One line for each limit of a run beyond this range: its max_num_seqs, its token
        budget (None: none, static batching) and the tokens (prompt and output) of its
        longest request that max_model_len admits."""
        later = "step costs there are extrapolated"
        out = []
        if max_num_seqs > self.max_seqs:
            out.append(f"max_num_seqs {max_num_seqs} is outside the profile's measured "
                       f"batch sizes 1-{self.max_seqs}: {later}")
        if max_num_batched_tokens is not None and max_num_batched_tokens > self.max_tokens:
            out.append(f"max_num_batched_tokens {max_num_batched_tokens} is outside the "
                       f"profile's measured step sizes 1-{self.max_tokens} tokens: {later}")
        if longest_request > self.max_context:
            out.append(f"max_model_len {max_model_len} lets requests reach {longest_request:,} "
                       f"tokens, outside the profile's measured contexts 1-"
                       f"{self.max_context:,} tokens: {later}")
        return out


def profile_from_measurement(spec: ModelSpec, m: Measurement, fit: FitResult) -> Profile:
    """Assemble a Profile from a measure() result and its fit, dated now (UTC)."""
    grid = {**dataclasses.asdict(m.grid), "num_planned": m.num_planned,
            "num_measured": len(m.points), "elapsed_s": round(m.elapsed_s, 3)}
    return Profile(dataclasses.asdict(spec), m.device, m.device_name, m.torch_version,
                   m.dtype, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   m.num_layers, grid, fit, dict(m.memory), m.points, dict(m.engine))


def check_profile_place(path: str | Path, option: str = "--out") -> None:
    """Raise ValueError naming ``option`` when ``path`` holds something other than a
    servesim profile (a profile is written over; anything else servesim did not write is
    never replaced)."""
    target = Path(path)
    if not (target.exists() or target.is_symlink()):
        return
    try:
        found = json.loads(target.read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError, RecursionError):
        found = None
    if found != FORMAT:
        raise ValueError(f"{option}: {target} exists and is not a servesim profile; give "
                         "another path or remove it")


def save_profile(profile: Profile, path: str | Path, option: str = "--out") -> None:
    """Write the profile as JSON, whole or not at all: staged beside ``path`` and renamed
    over it, a killed write's staging cleared first (sim/staging.py). Raises ValueError
    naming ``option`` when ``path`` holds a file that is not a servesim profile
    (check_profile_place), or on an OS error (no space, a read-only folder, ...)."""
    check_profile_place(path, option)
    text = json.dumps(profile.to_dict(), indent=1, allow_nan=False) + "\n"
    place_file(Path(path), text, option, sync=True)


def load_profile(path: str | Path) -> Profile:
    """Read a profile file. Raises ValueError with one line naming the file and the
    problem: unreadable, not JSON, not a servesim profile, another version, missing keys,
    malformed fields."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{p}: cannot read profile: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{p}: not a servesim profile (format {found!r}, "
                         f"expected {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ValueError(f"{p}: profile version {data.get('version')!r} is not supported "
                         f"(this servesim reads version {VERSION}); recalibrate")
    missing = [k for k in _KEYS if k not in data]
    if missing:
        raise ValueError(f"{p}: profile lacks keys: {', '.join(missing)}")
    try:
        check_profile(data)
        return Profile.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{p}: malformed profile: {what}") from None


def check_profile(data: dict[str, Any]) -> None:
    """What a profile must hold to price steps: the top-level fields with their types
    (:func:`_check_fields`), a fit whose coefficients are finite, >= 0 and price every
    step above 0 s, with its held-out statistics (:func:`_check_fit`), and measured points
    with finite times. Raises ValueError (KeyError for a missing key) naming the field."""
    _check_fields(data)
    _check_fit(data["fit"])
    for i, point in enumerate(data["points"]):
        if not isinstance(point, dict):
            raise ValueError(f"points[{i}] must be an object, got {type(point).__name__}")
        for key in ("seconds", "seconds_median", "seconds_max"):
            if not (_is_number(point[key]) and 0 < point[key] < math.inf):
                raise ValueError(f"{key} must be > 0 and finite, got {point[key]!r} "
                                 f"(points[{i}])")


def _check_fields(data: dict[str, Any]) -> None:
    """The top-level fields' types; the model as a ModelSpec accepts it."""
    for key in ("device", "device_name", "torch_version", "dtype", "date"):
        if not isinstance(data[key], str):
            raise ValueError(f"{key} must be a string, got {data[key]!r}")
    if data["dtype"] not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {data['dtype']!r}")
    if not (isinstance(data["num_layers_measured"], int)
            and not isinstance(data["num_layers_measured"], bool)):
        raise ValueError(f"num_layers_measured must be an integer, got "
                         f"{data['num_layers_measured']!r}")
    objects = ("model", "grid", "fit", "memory")
    for key in (*objects, "engine") if data.get("engine") is not None else objects:
        if not isinstance(data[key], dict):
            raise ValueError(f"{key} must be an object, got {type(data[key]).__name__}")
    if not isinstance(data["points"], list) or not data["points"]:
        raise ValueError("points must be a non-empty list (the measured steps the fit used)")
    try:
        ModelSpec(**data["model"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"model: {exc}") from None


def _check_fit(fit: dict[str, Any]) -> None:
    """Coefficients: one finite number >= 0 per feature, not all 0, and a one-token step
    of either kind priced above 0 s (the simulator's clock must advance every step);
    knot_tokens, max_mape and the held-out statistics of every region present and sane."""
    coefs = fit["coefficients"]
    if not (isinstance(coefs, list) and len(coefs) == len(FEATURES)
            and all(_is_number(c) for c in coefs)):
        raise ValueError(f"fit.coefficients must be {len(FEATURES)} numbers, one per "
                         f"feature ({', '.join(FEATURES)}), got {coefs!r}")
    bad = [f"{f} {c!r}" for f, c in zip(FEATURES, coefs, strict=True)
           if not 0 <= c < math.inf]
    if bad:
        raise ValueError(f"fit.coefficients must be finite and >= 0 s per unit: {', '.join(bad)}")
    if not any(coefs):
        raise ValueError("fit.coefficients are all 0: every step would take 0 s; recalibrate")
    knot = fit["knot_tokens"]
    if knot is not None and not (isinstance(knot, int) and not isinstance(knot, bool)
                                 and knot >= 1):
        raise ValueError(f"fit.knot_tokens must be null or an integer >= 1, got {knot!r}")
    for kind, shape in _SMALLEST_STEPS.items():
        if sum(c * x for c, x in zip(coefs, feature_vector(shape, knot), strict=True)) <= 0:
            raise ValueError(f"fit.coefficients price a one-token {kind} step at 0 s "
                             "(step, tokens and seqs are all 0); recalibrate")
    limit = fit["max_mape"]
    if not (_is_number(limit) and 0 < limit < math.inf):
        raise ValueError(f"fit.max_mape must be a finite number > 0, got {limit!r}")
    _check_fit_errors(fit["errors"])


#: The cheapest steps a simulation can take: one prompt token (a chunk at context 0, no
#: token sampled) and one decode token over one token of context (sampled).
_SMALLEST_STEPS = {
    "prefill": BatchShape(num_prefill_tokens=1, num_prefill_seqs=1, prefill_attention_pairs=1),
    "decode": BatchShape(num_decode_seqs=1, decode_context_tokens=2, num_sampled_seqs=1),
}
_ERROR_COUNTS = ("num_train", "num_heldout")
_ERROR_FRACTIONS = ("train_mape", "mape", "max_error")


def _check_fit_errors(errors: Any) -> None:
    """fit.errors: for every region (calibration.grid.REGIONS) the point counts (integers
    >= 0) and the relative errors (null, or finite fractions >= 0)."""
    if not isinstance(errors, dict):
        raise ValueError(f"fit.errors must be an object, got {type(errors).__name__}")
    absent = [r for r in REGIONS if r not in errors]
    if absent:
        raise ValueError(f"fit.errors lacks the held-out statistics of {', '.join(absent)}")
    for region, e in errors.items():
        if not isinstance(e, dict) or set(e) != {*_ERROR_COUNTS, *_ERROR_FRACTIONS}:
            raise ValueError(f"fit.errors.{region} must hold "
                             f"{', '.join((*_ERROR_COUNTS, *_ERROR_FRACTIONS))}, got {e!r}")
        for key in _ERROR_COUNTS:
            if not (isinstance(e[key], int) and not isinstance(e[key], bool) and e[key] >= 0):
                raise ValueError(f"fit.errors.{region}.{key} must be an integer >= 0, "
                                 f"got {e[key]!r}")
        for key in _ERROR_FRACTIONS:
            if e[key] is not None and not (_is_number(e[key]) and 0 <= e[key] < math.inf):
                raise ValueError(f"fit.errors.{region}.{key} must be null or a finite "
                                 f"number >= 0, got {e[key]!r}")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def refit(profile: Profile, force: bool = False, max_mape: float | None = None,
          statistic: str | None = None) -> Profile:
    """The profile with a new fit of its stored points (no device needed), on
    ``statistic`` (calibration.fit.STATISTICS; None: the one its fit used).
    Raises FitRejected (a ValueError) as fit_points does, unless force."""
    limit = profile.fit.max_mape if max_mape is None else max_mape
    new = fit_points(profile.points, force=force, max_mape=limit or DEFAULT_MAX_MAPE,
                     statistic=profile.fit.statistic if statistic is None else statistic)
    return dataclasses.replace(profile, fit=new)


class ProfileCostModel:
    """CostModel over a profile: ``step_time(shape)`` in seconds for the whole model
    (per-layer coefficients scaled by profile.layer_scale). Plain float arithmetic, no
    numpy: it runs once per simulated step. Outside the measured grid it extrapolates the
    fitted lines. It prices a fast-path run step by step (it is no
    ``sim.interface.BulkDecodePricer``). Raises ValueError when the profile's fit was
    rejected."""

    __slots__ = ("_dctx", "_knot", "_lm_head", "_over", "_pairs", "_pctx", "_sampled",
                 "_seqs", "_step", "_tok", "profile")

    def __init__(self, profile: Profile) -> None:
        if profile.fit.status == "rejected":
            raise ValueError("profile: its fit was rejected (held-out error too large); "
                             "refit it with force to use it anyway")
        self.profile = profile
        scale = profile.layer_scale
        c = {name: float(coef) * (scale if name in PER_LAYER else 1.0)
             for name, coef in zip(FEATURES, profile.fit.coefficients, strict=True)}
        self._step, self._tok, self._over = c["step"], c["tokens"], c["tokens_over_knot"]
        knot = profile.fit.knot_tokens
        self._knot = float("inf") if knot is None else float(knot)
        self._pairs, self._pctx = c["prefill_attention_pairs"], c["prefill_context_tokens"]
        self._dctx, self._seqs = c["decode_context_tokens"], c["seqs"]
        self._sampled, self._lm_head = c["sampled_seqs"], c["lm_head"]

    def step_time(self, shape: BatchShape) -> float:
        n = shape.num_prefill_tokens + shape.num_decode_seqs
        t = (self._step + self._tok * n
             + self._pairs * shape.prefill_attention_pairs
             + self._pctx * shape.prefill_context_tokens
             + self._dctx * shape.decode_context_tokens
             + self._seqs * (shape.num_prefill_seqs + shape.num_decode_seqs)
             + self._sampled * shape.num_sampled_seqs)
        if n > self._knot:
            t += self._over * (n - self._knot)
        if shape.num_sampled_seqs:
            t += self._lm_head
        return t
