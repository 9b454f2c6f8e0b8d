"""Fidelity check: a Poisson scenario at about half of saturation, simulated with a
calibrated profile and executed for real (``servesim validate``), with the targets of
docs/fidelity.md: throughput error at most 5%, E2E p50 and p99 errors at most 10%.

First a prediction-only sweep over the arrival rate finds saturation (the plateau of
throughput: the most requests/s any rate reached); then the real validation runs at
``--fraction`` (0.5) of it and prints the error table and PASS / FAIL per target. Last, a
device check re-times a few of the profile's own grid shapes (calibration.measure: 5
interleaved rounds) and prints the profile's error on them by the fastest run (the shipped
torch profile's statistic) and by the median run: how the device compares, right now, with
the day it was calibrated (on a shared machine the typical run is slower than the fastest).

    python benchmarks/fidelity.py                          # shipped CPU profile, 200 requests
    python benchmarks/fidelity.py --policy static --num-requests 100 --out runs/fid-static

Needs torch (pip install 'servesim[calibration]') and the profile's device; on the 2-core
CPU the real run takes 4-6 minutes. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from calibration.grid import GridConfig, GridPoint
from calibration.measure import measure
from calibration.profile import ProfileCostModel, load_profile
from calibration.specs import ModelSpec
from sim.app.reports.validation_page import write_validation
from sim.app.runs.runner import prepare, simulate_prepared
from sim.app.runs.validate import (
    error_table,
    prepare_validation,
    profile_threads,
    run_validation,
    schedule_line,
    shipped_profile,
    step_error_line,
    validation_config,
)

SWEEP_RATES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
TARGETS = (("throughput (req/s)", 0.05), ("E2E p50 (s)", 0.10), ("E2E p99 (s)", 0.10))


def find_saturation(args: argparse.Namespace, console: Console) -> float:
    """The plateau of predicted throughput over SWEEP_RATES (requests/s)."""
    t = Table(title="prediction sweep (saturation = highest throughput)", header_style="bold")
    for c in ("rate (req/s)", "throughput (req/s)", "E2E p50 (s)", "E2E p99 (s)"):
        t.add_column(c, justify="right")
    best = 0.0
    for rate in SWEEP_RATES:
        cfg = validation_config(args.profile, scenario=args.scenario, rate=rate,
                                num_requests=args.num_requests, policy=args.policy,
                                seed=args.seed)
        s = simulate_prepared(prepare(cfg)).summary
        thr = s["throughput"]["requests_per_s"]
        best = max(best, thr)
        t.add_row(f"{rate:g}", f"{thr:.3f}", f"{s['e2e_latency_s']['p50']:.2f}",
                  f"{s['e2e_latency_s']['p99']:.2f}")
    console.print(t)
    return best


#: (decodes, decode context, chunk tokens): shapes the validation scenario runs.
CHECK_SHAPES = ((1, 128, 0), (2, 128, 0), (4, 128, 0), (8, 128, 0), (16, 128, 0),
                (4, 128, 64), (0, 0, 128))


def device_check(profile_path: str | None, console: Console) -> None:
    """Re-time CHECK_SHAPES as the calibration does and print the profile's error on them
    by the fastest and by the median of 5 interleaved runs (wall clock)."""
    prof = load_profile(profile_path or shipped_profile())
    g = prof.grid
    grid = GridConfig(g["max_num_seqs"], g["max_num_batched_tokens"], g["max_context"], 5, 1)
    points = [GridPoint("mixed" if b and n else "decode" if b else "prefill", i, b, c, n)
              for i, (b, c, n) in enumerate(CHECK_SHAPES)]
    m = measure(ModelSpec(**prof.model), grid, dtype=prof.dtype, device=prof.device,
                threads=profile_threads(prof.device_name), budget_s=1e9, progress=False,
                points=points)
    cm = ProfileCostModel(prof)
    t = Table(title="device check: the profile on its own kind of steps, now",
              header_style="bold")
    for c in ("decodes x context", "chunk", "predicted ms", "fastest ms", "error",
              "median ms", "error (median)"):
        t.add_column(c, justify="right")
    for mp in m.points:
        p, pred = mp.point, cm.step_time(mp.point.shape)
        t.add_row(f"{p.decode_seqs} x {p.decode_context}" if p.decode_seqs else "-",
                  str(p.chunk_tokens or "-"), f"{pred * 1e3:.1f}", f"{mp.seconds * 1e3:.1f}",
                  f"{pred / mp.seconds - 1:+.1%}", f"{mp.seconds_median * 1e3:.1f}",
                  f"{pred / mp.seconds_median - 1:+.1%}")
    console.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=None, help="default: the shipped CPU profile")
    ap.add_argument("--scenario", default="cpu-chat")
    ap.add_argument("--policy", default="chunked")
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--fraction", type=float, default=0.5, help="of the saturation rate")
    ap.add_argument("--rate", type=float, default=None, help="skip the sweep: this rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1,
                    help="execute each real step N times, keep the run the profile's fit statistic "
                         "picks (see validate)")
    ap.add_argument("--out", type=Path, default=Path("runs/fidelity"))
    ap.add_argument("--no-device-check", action="store_true",
                    help="skip re-timing the profile's shapes after the run")
    args = ap.parse_args()
    console = Console(width=120)
    if args.rate is None:
        sat = find_saturation(args, console)
        rate = round(args.fraction * sat, 3)
        console.print(f"saturation {sat:.3f} req/s; validating at {args.fraction:g} x = "
                      f"{rate:g} req/s")
    else:
        rate = args.rate
    cfg = validation_config(args.profile, scenario=args.scenario, rate=rate,
                            num_requests=args.num_requests, policy=args.policy,
                            seed=args.seed)
    prep, real = prepare_validation(cfg, repeats=args.repeats)
    t0 = time.perf_counter()
    data = write_validation(args.out, prep, run_validation(prep, real))
    console.print(f"real run: {time.perf_counter() - t0:.0f} s wall; wrote {args.out}/")
    console.print(error_table(data))
    console.print(step_error_line(data), highlight=False)
    console.print(schedule_line(data), highlight=False)
    errors = {r["metric"]: r["error"] for r in data["errors"]}
    for metric, limit in TARGETS:
        e = errors[metric]
        ok = e is not None and abs(e) <= limit
        console.print(f"{'PASS' if ok else 'FAIL'}  {metric}: error "
                      f"{'-' if e is None else f'{e:+.1%}'} (target within {limit:.0%})",
                      highlight=False)

    if not args.no_device_check:
        device_check(args.profile, console)


if __name__ == "__main__":
    main()
