"""Held-out check of a calibrated profile on steps the fit never saw.

Draws single steps OFF the profile's grid (other batch sizes, chunk sizes and contexts,
inside the grid's limits), predicts each with ProfileCostModel, measures it fresh on the
same random-weight model (same dtype, layers and thread count as the profile), and prints
shape, predicted, measured and error %. Target: within 10%.

    python benchmarks/calibration_holdout.py                      # the shipped CPU profile
    python benchmarks/calibration_holdout.py --profile p.json --num-shapes 12 --seed 1

Needs torch (pip install 'servesim[calibration]') and the profile's device.
"""

from __future__ import annotations

import argparse
import re
import statistics
from importlib import resources
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from calibration.fit import point_seconds
from calibration.grid import GridConfig, GridPoint, make_grid
from calibration.measure import measure
from calibration.profile import Profile, ProfileCostModel, load_profile
from calibration.specs import ModelSpec


def off_grid_points(grid: GridConfig, num: int, rng: np.random.Generator) -> list[GridPoint]:
    """``num`` steps (cycling prefill, decode, mixed) drawn uniformly inside the grid's
    limits, none equal to a grid point."""
    s, t, c = grid.max_num_seqs, grid.max_num_batched_tokens, grid.max_context
    taken = {(p.decode_seqs, p.decode_context, p.chunk_tokens, p.chunk_context)
             for p in make_grid(grid)}
    out: list[GridPoint] = []
    while len(out) < num:
        region = ("prefill", "decode", "mixed")[len(out) % 3]
        b = 0 if region == "prefill" else int(rng.integers(1, s if region == "mixed" else s + 1))
        dctx = int(rng.integers(16, c)) if b else 0
        n = 0 if region == "decode" else int(rng.integers(8, t - b + 1))
        cctx = int(rng.integers(0, c - n + 1)) if n and rng.random() < 0.6 else 0
        if (b, dctx, n, cctx) not in taken:
            taken.add((b, dctx, n, cctx))
            out.append(GridPoint(region, len(out), b, dctx, n, cctx, bool(rng.random() < 0.7)))
    return out


def _threads(profile: Profile) -> int | None:
    found = re.search(r"(\d+) torch threads?", profile.device_name)
    return int(found.group(1)) if found else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=None, help="default: shipped CPU profile")
    ap.add_argument("--num-shapes", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=2024)
    args = ap.parse_args()
    if args.profile is None:
        ref = resources.files("calibration.profiles").joinpath("cpu-qwen2.5-0.5b.json")
        with resources.as_file(ref) as path:
            profile = load_profile(path)
    else:
        profile = load_profile(args.profile)
    g = profile.grid
    grid = GridConfig(g["max_num_seqs"], g["max_num_batched_tokens"], g["max_context"],
                      args.repeats, 1)
    points = off_grid_points(grid, args.num_shapes, np.random.default_rng(args.seed))
    spec = ModelSpec(**profile.model)
    m = measure(spec, grid, num_layers=profile.num_layers_measured, dtype=profile.dtype,
                device=profile.device, threads=_threads(profile), budget_s=1e9,
                seed=args.seed, points=points)
    # Predict the measured layer subset: the profile scales to the full model, so undo it.
    cm = ProfileCostModel(profile)
    table = Table(title=f"held-out steps: {spec.name} on {m.device_name}, {profile.dtype}")
    for col in ("region", "decodes x context", "chunk @ context", "predicted ms",
                "measured ms", "error %"):
        table.add_column(col, justify="left" if col == "region" else "right")
    errors: dict[str, list[float]] = {}
    for mp in sorted(m.points, key=lambda q: (q.region, q.shape.num_tokens)):
        p = mp.point
        pred = cm.step_time(p.shape) if profile.layer_scale == 1 else profile.fit.predict(
            p.shape)
        # measured by the statistic the profile was fitted to
        seconds = point_seconds(mp, profile.fit.statistic)
        err = (pred - seconds) / seconds
        errors.setdefault(p.region, []).append(abs(err))
        table.add_row(p.region, f"{p.decode_seqs} x {p.decode_context}" if p.decode_seqs else "-",
                      f"{p.chunk_tokens} @ {p.chunk_context}" if p.chunk_tokens else "-",
                      f"{pred * 1e3:.1f}", f"{seconds * 1e3:.1f}", f"{err:+.1%}")
    console = Console()
    console.print(table)
    for region, errs in errors.items():
        console.print(f"{region}: MAPE {statistics.mean(errs):.1%}, worst {max(errs):.1%}")
    allerr = [e for v in errors.values() for e in v]
    console.print(f"all: MAPE {statistics.mean(allerr):.1%}, worst {max(allerr):.1%}; "
                  f"measured in {m.elapsed_s:.0f} s")


if __name__ == "__main__":
    main()
