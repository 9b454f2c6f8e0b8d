"""Length models: how many prompt tokens each request has and how many it generates.

Owns the samplers. A *distribution* (``Fixed``, ``Uniform``, ``LogNormal``) draws one
column; a *length model* (``Independent``, ``Empirical``, ``InOrder``) draws
``(num_prompt_tokens, output_len)`` pairs. Every sampler is a frozen dataclass (so presets
can hold them), takes the ``numpy.random.Generator`` explicitly, and returns int64 arrays of
shape ``(n,)`` with every value >= 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from scenarios.workload import Workload

if TYPE_CHECKING:
    import numpy.typing as npt


class LengthDistribution(Protocol):
    """One column of token counts."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` int64 token counts >= 1, shape ``(n,)``."""
        ...

    def describe(self) -> str:
        """Short human description, e.g. ``lognormal(median=129, sigma=0.99, 7..1000)``."""
        ...


class LengthModel(Protocol):
    """Joint (num_prompt_tokens, output_len) pairs."""

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``(num_prompt_tokens, output_len)``, each int64 >= 1 of shape ``(n,)``."""
        ...

    def describe(self) -> str:
        """Short human description."""
        ...


def _check_n(n: int) -> None:
    if int(n) != n or n < 0:
        raise ValueError(f"num_requests must be an integer >= 0, got {n!r}")


@dataclass(frozen=True, slots=True)
class Fixed:
    """Every request gets ``value`` tokens (>= 1). Draws no random numbers."""

    value: int

    def __post_init__(self) -> None:
        if int(self.value) != self.value or self.value < 1:
            raise ValueError(f"value must be an integer >= 1, got {self.value!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        return np.full(n, int(self.value), dtype=np.int64)

    def describe(self) -> str:
        return f"fixed({self.value})"


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers uniform on ``[low, high]`` (both inclusive), ``1 <= low <= high``."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if int(self.low) != self.low or self.low < 1:
            raise ValueError(f"low must be an integer >= 1, got {self.low!r}")
        if int(self.high) != self.high or self.high < self.low:
            raise ValueError(f"high must be an integer >= low ({self.low}), got {self.high!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        return rng.integers(int(self.low), int(self.high), size=n, endpoint=True,
                            dtype=np.int64)

    def describe(self) -> str:
        return f"uniform({self.low}..{self.high})"


@dataclass(frozen=True, slots=True)
class LogNormal:
    """``round(median * exp(sigma * Z))``, Z standard normal, clipped to [min_len, max_len].

    ``median`` in tokens (> 0), ``sigma`` the log-space standard deviation (>= 0). Clipping
    (not resampling) puts the clipped mass on the bounds; ``max_len`` None = no upper bound.
    """

    median: float
    sigma: float
    min_len: int = 1
    max_len: int | None = None

    def __post_init__(self) -> None:
        if not (self.median > 0 and math.isfinite(self.median)):
            raise ValueError(f"median must be finite and > 0 tokens, got {self.median!r}")
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"sigma must be finite and >= 0, got {self.sigma!r}")
        if int(self.min_len) != self.min_len or self.min_len < 1:
            raise ValueError(f"min_len must be an integer >= 1, got {self.min_len!r}")
        if self.max_len is not None and (
            int(self.max_len) != self.max_len or self.max_len < self.min_len
        ):
            raise ValueError(
                f"max_len must be an integer >= min_len ({self.min_len}), got {self.max_len!r}"
            )

    @classmethod
    def from_mean_median(
        cls, mean: float, median: float, min_len: int = 1, max_len: int | None = None
    ) -> LogNormal:
        """Fit from a mean and a median: ``sigma = sqrt(2 ln(mean / median))``.

        For a log-normal, median = exp(mu) and mean = exp(mu + sigma^2 / 2).

        Raises:
            ValueError: ``mean < median`` (a log-normal's mean is never below its median).
        """
        if not (median > 0 and mean >= median and math.isfinite(mean)):
            raise ValueError(
                f"mean must be finite and >= median ({median!r}) for a log-normal, got {mean!r}"
            )
        return cls(median, math.sqrt(2.0 * math.log(mean / median)), min_len, max_len)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        values = np.rint(self.median * np.exp(self.sigma * rng.standard_normal(n)))
        upper = np.inf if self.max_len is None else self.max_len
        return np.clip(values, self.min_len, upper).astype(np.int64)

    def describe(self) -> str:
        bounds = f"{self.min_len}..{'' if self.max_len is None else self.max_len}"
        return f"lognormal(median={self.median:g}, sigma={self.sigma:.3f}, {bounds})"


@dataclass(frozen=True, slots=True)
class Independent:
    """Prompt and output lengths drawn independently (prompt column first, then output)."""

    prompt: LengthDistribution
    output: LengthDistribution

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return self.prompt.sample(n, rng), self.output.sample(n, rng)

    def describe(self) -> str:
        return f"prompt {self.prompt.describe()} x output {self.output.describe()}"


def _pair_arrays(prompt: npt.ArrayLike, output: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p = np.array(prompt, dtype=np.int64)
    o = np.array(output, dtype=np.int64)
    if p.ndim != 1 or p.shape != o.shape or p.size == 0:
        raise ValueError(
            f"num_prompt_tokens and output_len must be equal-length non-empty 1-D arrays, "
            f"got shapes {p.shape} and {o.shape}"
        )
    for name, column in (("num_prompt_tokens", p), ("output_len", o)):
        bad = np.flatnonzero(column < 1)
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}] = {column[bad[0]]} must be >= 1")
    p.setflags(write=False)
    o.setflags(write=False)
    return p, o


@dataclass(frozen=True, slots=True, eq=False)
class Empirical:
    """(prompt, output) pairs resampled jointly, uniformly with replacement, from data.

    Keeps the correlation between prompt and output length that independent marginals lose.
    Build with ``Empirical.from_file`` (length-only CSV or any trace) or ``from_workload``.
    """

    num_prompt_tokens: np.ndarray
    output_len: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        p, o = _pair_arrays(self.num_prompt_tokens, self.output_len)
        object.__setattr__(self, "num_prompt_tokens", p)
        object.__setattr__(self, "output_len", o)

    @classmethod
    def from_file(cls, path: Path | str) -> Empirical:
        """Pairs from a length-only CSV (``num_prefill_tokens``, ``num_decode_tokens``) or
        any trace ``traces.load_trace`` reads. Errors as ``traces.load_lengths``."""
        from scenarios.traces import load_lengths

        prompt, output = load_lengths(path)
        return cls(prompt, output, source=Path(path).name)

    @classmethod
    def from_workload(cls, workload: Workload) -> Empirical:
        """Pairs from a loaded Workload (e.g. a trace)."""
        return cls(workload.num_prompt_tokens, workload.output_len, source=workload.source)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_n(n)
        index = rng.integers(0, len(self.num_prompt_tokens), size=n)
        return self.num_prompt_tokens[index].copy(), self.output_len[index].copy()

    def describe(self) -> str:
        return f"empirical({self.source or f'{len(self.num_prompt_tokens)} pairs'})"


@dataclass(frozen=True, slots=True, eq=False)
class InOrder:
    """The given (prompt, output) pairs in order, repeated cyclically when ``n`` exceeds
    them. Draws no random numbers (scripted scenarios such as ``teaching``)."""

    num_prompt_tokens: np.ndarray
    output_len: np.ndarray

    def __post_init__(self) -> None:
        p, o = _pair_arrays(self.num_prompt_tokens, self.output_len)
        object.__setattr__(self, "num_prompt_tokens", p)
        object.__setattr__(self, "output_len", o)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        _check_n(n)
        return np.resize(self.num_prompt_tokens, n), np.resize(self.output_len, n)

    def describe(self) -> str:
        return f"in-order({len(self.output_len)} pairs)"
