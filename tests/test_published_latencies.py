"""The roofline presets against published vLLM step latencies (tests/data/
published_step_latencies.csv): every point, held-out ones included, within 10% for decode
steps (TPOT-like) and 15% for prefill steps; the table's coverage; the fit uses only the
points not held out and lands on the shipped defaults."""

from __future__ import annotations

from dataclasses import replace

import pytest

from calibration.published import (
    TOLERANCE,
    PublishedStep,
    fit_constants,
    read_published_steps,
    relative_error,
)
from calibration.roofline import (
    DEFAULT_MEMORY_EFFICIENCY,
    DEFAULT_PER_SEQ_OVERHEAD_S,
    DEFAULT_STEP_OVERHEAD_S,
)

STEPS = read_published_steps()


def test_the_table_covers_enough_points_gpus_and_kinds() -> None:
    assert len(STEPS) >= 8
    assert len({s.gpu for s in STEPS}) >= 3
    assert {s.kind for s in STEPS} == {"decode", "prefill"}
    held_out = [s for s in STEPS if s.held_out]
    assert held_out and len(held_out) < len(STEPS)
    assert all(s.source.startswith("https://") and s.engine and s.conditions for s in STEPS)
    assert len({s.id for s in STEPS}) == len(STEPS)


@pytest.mark.parametrize("step", STEPS, ids=[s.id for s in STEPS])
def test_every_point_within_tolerance(step: PublishedStep) -> None:
    assert abs(relative_error(step)) <= TOLERANCE[step.kind]


def test_fit_uses_only_points_not_held_out_and_gives_the_defaults() -> None:
    constants, worst = fit_constants(STEPS)
    assert constants == {"memory_efficiency": DEFAULT_MEMORY_EFFICIENCY,
                         "step_overhead_s": DEFAULT_STEP_OVERHEAD_S,
                         "per_seq_overhead_s": DEFAULT_PER_SEQ_OVERHEAD_S}
    assert worst < 0.05
    # Moving a held-out point cannot move the fit.
    moved = [replace(s, measured_s=s.measured_s * 3) if s.held_out else s for s in STEPS]
    assert fit_constants(moved) == (constants, worst)
