"""The Pareto frontier of a sweep, as NVIDIA AIConfigurator draws it: output throughput
per GPU (output tokens/s / (replicas x TP)) against per-user speed (output tokens/s of one
request, 1 / mean TPOT). A deployment trades one for the other (bigger batches serve
more tokens per GPU, each user's more slowly); the frontier is the set of configs no
other config beats on both.

``pareto_frontier`` is the rule (plain numbers in, indices out); ``frontier_frame`` applies
it to the sweep's cells (sim/app/runs/sweep.py aggregate: means over seeds).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

PER_GPU = "output_tokens_per_s_per_gpu"
PER_USER = "output_tokens_per_s_per_user"


def pareto_frontier(x: Sequence[float], y: Sequence[float]) -> list[int]:
    """Indices of the points (x[i], y[i]) that no other point dominates, both axes to
    be maximized, in ascending order of index. A point dominates another when it is at
    least as high on both axes and higher on one; so every copy of a frontier point is
    on the frontier (copies do not dominate each other), and of two points equal on
    one axis only the higher on the other is. A point with a NaN coordinate is never on
    it and dominates nothing. ValueError when x and y differ in length."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError(f"x and y must be two sequences of one length, got {xs.shape} "
                         f"and {ys.shape}")
    valid = ~(np.isnan(xs) | np.isnan(ys))
    vx, vy = xs[valid], ys[valid]
    out = []
    for i in np.flatnonzero(valid):
        ge = (vx >= xs[i]) & (vy >= ys[i])
        if not np.any(ge & ((vx > xs[i]) | (vy > ys[i]))):
            out.append(int(i))
    return out


def speeds(agg: pd.DataFrame) -> pd.DataFrame:
    """``agg`` (the sweep's cells) with PER_GPU and PER_USER columns: output_tokens_per_s /
    num_gpus, and 1 / tpot_mean_s (NaN where no request had a TPOT)."""
    out = agg.copy()
    out[PER_GPU] = out["output_tokens_per_s"] / out["num_gpus"]
    tpot = out["tpot_mean_s"].astype(np.float64)
    out[PER_USER] = 1.0 / tpot.where(tpot > 0)
    return out


def frontier_frame(agg: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """The frontier's cells of a sweep: cell, the axes, PER_USER, PER_GPU, the
    throughput (req/s) and p99 TTFT (s), by per-user speed ascending. Saturated cells
    are left out (their latencies are not steady-state, so their speed is not one a
    deployment would see)."""
    cols = ["cell", *axes, PER_USER, PER_GPU, "throughput_rps", "ttft_p99_s"]
    if agg.empty:
        return pd.DataFrame(columns=cols)
    cells = speeds(agg[~agg["saturated"].astype(bool)].reset_index(drop=True))
    front = cells.iloc[pareto_frontier(cells[PER_USER].to_numpy(), cells[PER_GPU].to_numpy())]
    return front[cols].sort_values([PER_USER, "cell"]).reset_index(drop=True)
