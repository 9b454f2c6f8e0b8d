"""The CostModel protocol (step time in seconds from a BatchShape) and the constant-step
model used for teaching and exact-time tests. Roofline and fitted models live in
calibration/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sim.batch import BatchShape


@runtime_checkable
class CostModel(Protocol):
    """Prices one engine step: ``step_time(shape) -> seconds`` (float > 0)."""

    def step_time(self, shape: BatchShape) -> float: ...


@dataclass(frozen=True, slots=True)
class ConstantCostModel:
    """Every step costs ``step_time_s`` seconds, whatever it holds.

    Raises ValueError when step_time_s <= 0.
    """

    step_time_s: float

    def __post_init__(self) -> None:
        if not self.step_time_s > 0:
            raise ValueError(f"step_time_s must be > 0 seconds, got {self.step_time_s}")

    def step_time(self, shape: BatchShape) -> float:
        return self.step_time_s
