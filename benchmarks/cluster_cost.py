"""What a cluster costs over its engines: CPU seconds of one engine on the Azure
conversation trace against N replicas on the same requests at N times the rate, with the
engine steps each simulated and the CPU ratio (cluster / one engine).

The target (issue "a week of traffic", acceptance): 8 replicas at 8x the rate under 1.5x
the CPU of one engine over about the same total steps. Only the simulation is timed
(time.process_time around simulate_prepared, which includes merging the replicas'
records and summaries); building the workload and writing outputs are not. The runs
are interleaved (one engine, then each cluster, --repeat times) and each figure is its
best, so a machine that slows down for a while slows every configuration alike. No
assertion is made: these are figures, not tests. The installed servesim is measured
(benchmarks/installed_engine.py).

    python benchmarks/cluster_cost.py [--replicas 8] [--routers round-robin,least-outstanding]
        [--num-requests N] [--repeat R]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from pathlib import Path

from installed_engine import describe

from sim.app.runs.runner import Prepared, RunConfig, prepare, simulate_prepared

ROOT = Path(__file__).resolve().parents[1]

TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
TARGET = 1.5  # the target: a cluster's CPU at most this many times one engine's


def cpu_seconds(prep: Prepared) -> tuple[float, int]:
    """CPU seconds of one simulation of ``prep``, and its engine steps."""
    gc.collect()
    t0 = time.process_time()
    result = simulate_prepared(prep)
    return time.process_time() - t0, len(result.step_table["start_time"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--routers", default="round-robin,least-outstanding")
    ap.add_argument("--num-requests", type=int, default=None, help="default: the whole trace")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if not TRACE.exists():
        sys.exit(f"{TRACE} not found: the public traces live in ../shared/traces")
    one = prepare(RunConfig(trace=str(TRACE), num_requests=args.num_requests))
    n = args.replicas
    print(describe())
    print(f"workload: {len(one.workload):,} requests; best of {args.repeat}")
    runs = {"1 engine": one}
    for router in args.routers.split(","):
        cfg = dataclasses.replace(one.config, replicas=n, router=router, time_scale=float(n))
        runs[f"{n} replicas {router} x{n} rate"] = prepare(cfg)
    best = {label: (float("inf"), 0) for label in runs}
    for _ in range(args.repeat):
        for label, prep in runs.items():
            cpu, steps = cpu_seconds(prep)
            best[label] = (min(best[label][0], cpu), steps)
    base_cpu = best["1 engine"][0]
    print(f"{'run':<38} {'CPU s':>7} {'steps':>9} {'steps/CPU s':>11} {'CPU ratio':>9}")
    for label, (cpu, steps) in best.items():
        print(f"{label:<38} {cpu:7.2f} {steps:9,} {steps / cpu:11,.0f} {cpu / base_cpu:9.2f}")
    print(f"target: a cluster under {TARGET}x one engine's CPU over about the same steps")


if __name__ == "__main__":
    main()
