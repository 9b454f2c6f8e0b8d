"""Versioned calibration profiles: the JSON file and the cost model read from it.

Owns: :class:`Profile` (everything one ``servesim calibrate`` run measured and fitted),
its JSON form (``{"format": "servesim-profile", "version": 1, ...}``), :func:`save_profile`
(written whole or not at all), :func:`load_profile` (one clear ValueError line per bad
file), :func:`refit` (a new fit from the stored points, no device needed) and
:class:`ProfileCostModel` (the simulator's CostModel over a profile). No torch.

Top-level keys: format, version, model (ModelSpec fields), device ("cpu" | "cuda"),
device_name, torch_version, dtype, date (ISO 8601, UTC), num_layers_measured,
num_layers_model, approximation (None, or how a layer subset was scaled), grid (GridConfig
fields, num_planned, num_measured, elapsed_s), fit (features, coefficients in seconds per
unit, knot_tokens, status, per-region held-out errors), memory (bytes + note), engine (which
engine ran the steps: "name" torch or vllm, the "timer", and the engine's own facts: for
vLLM its version, start-up KV figures and per-point phase split), points (every measured
point: grid fields, BatchShape fields, seconds). A file without "engine" was measured on
the torch engine with the wall clock, the only ones there were then.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from calibration.fit import DEFAULT_MAX_MAPE, FEATURES, PER_LAYER, FitResult, fit_points
from calibration.grid import MeasuredPoint
from sim.batch import BatchShape

if TYPE_CHECKING:
    from calibration.measure import Measurement
    from calibration.specs import ModelSpec

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


def profile_from_measurement(spec: ModelSpec, m: Measurement, fit: FitResult) -> Profile:
    """Assemble a Profile from a measure() result and its fit, dated now (UTC)."""
    grid = {**dataclasses.asdict(m.grid), "num_planned": m.num_planned,
            "num_measured": len(m.points), "elapsed_s": round(m.elapsed_s, 3)}
    return Profile(dataclasses.asdict(spec), m.device, m.device_name, m.torch_version,
                   m.dtype, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   m.num_layers, grid, fit, dict(m.memory), m.points, dict(m.engine))


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write the profile as JSON: to a temporary file beside ``path``, then renamed over it,
    so the file is written whole or not at all. OSError when the folder is not writable."""
    target = Path(path)
    text = json.dumps(profile.to_dict(), indent=1, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a profile is meant to be shared
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        return Profile.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{p}: malformed profile: {what}") from None


def refit(profile: Profile, force: bool = False, max_mape: float | None = None) -> Profile:
    """The profile with a new fit of its stored points (no device needed).
    Raises FitRejected (a ValueError) as fit_points does, unless force."""
    limit = profile.fit.max_mape if max_mape is None else max_mape
    new = fit_points(profile.points, force=force, max_mape=limit or DEFAULT_MAX_MAPE)
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
