"""Published step latencies: the table of public vLLM step times the roofline's constants
are chosen and checked against (tests/data/published_step_latencies.csv), read into
records, each priced by a RooflineCostModel, and the fit of the constants on the points
not held out.

Columns: id, gpu and model (preset names), dtype, kind ("decode": a step of
num_decode_seqs decodes, each over decode_context_per_seq prior tokens; "prefill": one
chunk of num_prefill_tokens from an empty context, one sampled row), measured_ms, held_out
(1: never used to choose a constant), engine, conditions, source (URL).
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from calibration.gpus import get_gpu
from calibration.roofline import RooflineCostModel
from calibration.specs import get_model
from sim.batch import BatchShape

PUBLISHED_STEP_LATENCIES = (
    Path(__file__).resolve().parents[1] / "tests" / "data" / "published_step_latencies.csv"
)
"""The table in the source tree."""

TOLERANCE = {"decode": 0.10, "prefill": 0.15}
"""Largest |relative error| accepted per kind (the accuracy asked of the roofline: 10% of
TPOT, 15% of prefill time)."""


@dataclass(frozen=True, slots=True)
class PublishedStep:
    """One published step latency (see the module docstring for the fields)."""

    id: str
    gpu: str
    model: str
    dtype: str
    kind: str
    num_decode_seqs: int
    decode_context_per_seq: int
    num_prefill_tokens: int
    measured_s: float
    held_out: bool
    engine: str
    conditions: str
    source: str

    def shape(self) -> BatchShape:
        """The engine step the measurement is of."""
        if self.kind == "decode":
            n = self.num_decode_seqs
            return BatchShape(num_decode_seqs=n,
                              decode_context_tokens=n * (self.decode_context_per_seq + 1),
                              num_sampled_seqs=n)
        n = self.num_prefill_tokens
        return BatchShape(num_prefill_tokens=n, num_prefill_seqs=1,
                          prefill_attention_pairs=n * (n + 1) // 2, num_sampled_seqs=1)


def read_published_steps(path: Path = PUBLISHED_STEP_LATENCIES) -> list[PublishedStep]:
    """The table's rows. Raises ValueError naming the row's id for a kind other than
    decode/prefill or a measured_ms not > 0."""
    steps = []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["kind"] not in TOLERANCE or not float(row["measured_ms"]) > 0:
                raise ValueError(f"{path}: row {row['id']}: kind must be decode or prefill "
                                 "and measured_ms > 0")
            steps.append(PublishedStep(
                row["id"], row["gpu"], row["model"], row["dtype"], row["kind"],
                int(row["num_decode_seqs"]), int(row["decode_context_per_seq"]),
                int(row["num_prefill_tokens"]), float(row["measured_ms"]) / 1e3,
                row["held_out"] == "1", row["engine"], row["conditions"], row["source"]))
    return steps


def price(step: PublishedStep, **constants: float) -> float:
    """Seconds the roofline (with ``constants`` overriding its defaults) gives the step."""
    model = RooflineCostModel(get_model(step.model), get_gpu(step.gpu), step.dtype,
                              **constants)  # type: ignore[arg-type]
    return model.step_time(step.shape())


def relative_error(step: PublishedStep, **constants: float) -> float:
    """(priced - measured) / measured."""
    return (price(step, **constants) - step.measured_s) / step.measured_s


MEMORY_EFFICIENCY_GRID = (0.75, 0.8, 0.825, 0.85, 0.875, 0.9, 0.925)
STEP_OVERHEAD_GRID_S = (0.5e-3, 0.75e-3, 1e-3, 1.25e-3, 1.5e-3, 1.75e-3, 2e-3)
PER_SEQ_OVERHEAD_GRID_S = (0.0, 20e-6, 30e-6, 40e-6, 50e-6, 60e-6)
"""The grid fit_constants searches by default."""


def fit_constants(steps: Iterable[PublishedStep],
                  memory_efficiencies: Sequence[float] = MEMORY_EFFICIENCY_GRID,
                  step_overheads_s: Sequence[float] = STEP_OVERHEAD_GRID_S,
                  per_seq_overheads_s: Sequence[float] = PER_SEQ_OVERHEAD_GRID_S,
                  ) -> tuple[dict[str, float], float]:
    """The grid point of (memory_efficiency, step_overhead_s, per_seq_overhead_s) with the
    smallest largest |relative error| over the steps not held out, and that error.
    Compute efficiencies are not fitted here: they come from operator profiles
    (GPUSpec.gemm_efficiency, carried in calibration/data/gpus.json)."""
    train = [(s, get_model(s.model), get_gpu(s.gpu), s.shape()) for s in steps
             if not s.held_out]
    best: tuple[float, dict[str, float]] | None = None
    for m, o, p in itertools.product(memory_efficiencies, step_overheads_s,
                                     per_seq_overheads_s):
        constants = {"memory_efficiency": m, "step_overhead_s": o, "per_seq_overhead_s": p}
        worst = max(
            abs(RooflineCostModel(model, gpu, s.dtype, **constants)  # type: ignore[arg-type]
                .step_time(shape) / s.measured_s - 1.0)
            for s, model, gpu, shape in train)
        if best is None or worst < best[0]:
            best = (worst, constants)
    assert best is not None, "no training points"
    return best[1], best[0]
