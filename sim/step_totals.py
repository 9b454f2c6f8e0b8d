"""What summary.json reads from a run's step table, reduced to a few totals
(``StepTotals``), and the ``kv_cache``, ``batch`` and ``slots`` entries made from them.
A whole table (sim/metrics.py's summarize) and a streamed one (sim/record_spool.py) give
the same totals, bit for bit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.table import Table, column


@dataclass(frozen=True, slots=True)
class StepTotals:
    """What summary.json reads from the step table: the step count, the sums of its
    count columns, the peak KV usage (blocks in use / usable blocks) and the two float
    sums of the duration-weighted mean usage (``usage_s``: sum of usage x duration_s;
    ``duration_s``: sum of duration_s, s), each as numpy sums the whole column."""

    num_steps: int
    num_seqs: int
    slots_useful: int
    slots_idle: int
    slots_empty: int
    peak_usage: float
    usage_s: float
    duration_s: float

    @classmethod
    def of(cls, steps: Table, num_gpu_blocks: int) -> StepTotals:
        """The totals of a whole step table (STEP_COLUMNS)."""
        dur = column(steps, "duration_s")
        usage = column(steps, "kv_blocks_used") / max(num_gpu_blocks - 1, 1)
        def total(name: str) -> int:
            return int(column(steps, name).sum())
        return cls(len(dur), total("num_seqs"), total("slots_useful"), total("slots_idle"),
                   total("slots_empty"), float(usage.max()) if len(usage) else 0.0,
                   float((usage * dur).sum()), float(dur.sum()))

    def summary(self, num_gpu_blocks: int, block_size: int,
                max_num_seqs: int) -> dict[str, Any]:
        """summary.json's ``kv_cache``, ``batch`` and ``slots``. The batch mean is the
        integer sum over the count (what numpy's float64 sum of an int column gives
        below 2**53); slot fractions are over steps x max_num_seqs."""
        slot_total = self.num_steps * max_num_seqs
        return {
            "kv_cache": {
                "num_gpu_blocks": int(num_gpu_blocks),
                "block_size": int(block_size),
                "peak_usage": self.peak_usage,
                "mean_usage": (self.usage_s / self.duration_s if self.duration_s > 0
                               else 0.0),
            },
            "batch": {"mean_num_seqs": float(self.num_seqs) / self.num_steps
                      if self.num_steps else 0.0},
            "slots": {f"{k}_fraction": (float(getattr(self, f"slots_{k}")) / slot_total
                                        if slot_total else 0.0)
                      for k in ("useful", "idle", "empty")},
        }
