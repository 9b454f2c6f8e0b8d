"""Simulation speed with prefix caching on (block, radix) against off, on the Mooncake
conversation replay, against the target of at most 2x the time of ``--prefix-cache none``.

Prints figures (no assertions), two ways, each the best of ``--repeat`` runs with the
modes interleaved (so a busy machine slows all alike):

- in process: the CPU time (and wall time) of simulating the prepared workload
  (``simulate_prepared``: the fixed prefix slots are computed in it; loading the trace
  and writing files are not), its ratio to ``none``, engine steps, the hit rate and the
  evictions;
- end to end (``--end-to-end``, on by default for the whole trace): the wall time of a
  fresh ``servesim run --trace ... --prefix-cache MODE`` process, as benchmarks/speed.py
  times its runs (start-up, loading and writing included); best and median of
  the repeats, and each round's ratio (a round runs every mode once, back to back).

docs/prefix_caching.md (Speed) gives today's figures and where the time goes.

Usage, from the repo root:

    python benchmarks/prefix_cache_speed.py [--num-requests N] [--time-scale X] [--repeat R]
        [--no-end-to-end]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.app.runs.runner import RunConfig, prepare, simulate_prepared  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
TARGET = 2.0  # the target: a cache's time at most this many times none's


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=None, help="default: all 12,031")
    ap.add_argument("--time-scale", type=float, default=None)
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="none,block,radix")
    ap.add_argument("--end-to-end", action=argparse.BooleanOptionalAction, default=None,
                    help="also time whole servesim run processes (default: on for the "
                         "whole trace)")
    args = ap.parse_args()
    if not TRACE.exists():
        sys.exit(f"{TRACE} not found: the public traces live in ../shared/traces")
    base = prepare(RunConfig(trace=str(TRACE), num_requests=args.num_requests,
                             time_scale=args.time_scale, gpu=args.gpu))
    print(f"workload: {len(base.workload):,} requests ({base.workload.source}); "
          f"{base.num_gpu_blocks:,} KV blocks; best of {args.repeat}")
    modes = args.modes.split(",")
    vs = f"vs {modes[0]}"
    print(f"{'mode':6} {'cpu s':>7} {vs:>8} {'wall s':>7} {'steps':>9} {'hit rate':>9} "
          f"{'saved tok':>12} {'evictions':>10}")
    preps = {}
    for mode in modes:
        cfg = dataclasses.replace(base.config, prefix_cache=mode)
        preps[mode] = dataclasses.replace(base, config=cfg, scheduler=dataclasses.replace(
            base.scheduler, prefix_cache=mode))
    best = {m: (float("inf"), float("inf")) for m in modes}
    results = {}
    for _ in range(args.repeat):  # modes interleaved, so a busy machine slows all alike
        for mode in modes:
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            results[mode] = simulate_prepared(preps[mode])
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            best[mode] = (min(best[mode][0], cpu), min(best[mode][1], wall))
    ref = best[modes[0]][0]
    for mode in modes:
        res, (cpu, wall) = results[mode], best[mode]
        pc = res.summary["prefix_cache"]
        hit = pc["hit_rate_tokens"]
        print(f"{mode:6} {cpu:>7.2f} {cpu / ref:>7.2f}x {wall:>7.2f} {len(res.steps):>9,} "
              f"{'-' if hit is None else f'{hit:.1%}':>9} {pc['prefill_tokens_saved']:>12,} "
              f"{pc['evictions']:>10,}")
    verdict("in process", {m: best[m][0] for m in modes})
    if args.end_to_end or (args.end_to_end is None and args.num_requests is None
                           and args.time_scale is None):
        walls = end_to_end(args, modes)
        verdict("end to end, best", {m: min(w) for m, w in walls.items()})
        verdict("end to end, median", {m: statistics.median(w) for m, w in walls.items()})


def verdict(what: str, times: dict[str, float]) -> None:
    """One line: each cache's time against ``none``'s and the 2x target."""
    if "none" not in times:
        return
    ratios = ", ".join(f"{m} {t / times['none']:.2f}x" for m, t in times.items() if m != "none")
    met = all(t <= TARGET * times["none"] for t in times.values())
    print(f"{what}: {ratios} of none; {'all within' if met else 'over'} the "
          f"{TARGET:g}x target")


def end_to_end(args: argparse.Namespace, modes: list[str]) -> dict[str, list[float]]:
    """Wall times of ``--repeat`` whole ``servesim run`` processes per mode (one of each
    mode a round), printed with each round's ratios to the first mode's, and returned."""
    from speed import run_one  # benchmarks/speed.py, beside this file

    flags = ["--trace", str(TRACE), "--gpu", args.gpu]
    if args.num_requests is not None:
        flags += ["--num-requests", str(args.num_requests)]
    if args.time_scale is not None:
        flags += ["--time-scale", str(args.time_scale)]
    # (No peak RSS here: Linux keeps a child's ru_maxrss across exec, so it would show
    # this process's size, the whole replay held in memory.)
    walls: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeat):
        for mode in modes:
            walls[mode].append(run_one([*flags, "--prefix-cache", mode])["wall_s"])
    print(f"\nend to end (servesim run, {args.repeat} rounds; each round's ratio to "
          f"{modes[0]} in brackets)")
    vs = f"vs {modes[0]}"
    print(f"{'mode':6} {'best s':>7} {vs:>8} {'median s':>9} {vs:>8}  rounds")
    first = walls[modes[0]]
    for mode in modes:
        w = walls[mode]
        med, med_first = statistics.median(w), statistics.median(first)
        rounds = ", ".join(f"{a:.2f} ({a / b:.2f}x)" for a, b in zip(w, first, strict=True))
        print(f"{mode:6} {min(w):>7.2f} {min(w) / min(first):>7.2f}x {med:>9.2f} "
              f"{med / med_first:>7.2f}x  [{rounds}]")
    return walls


if __name__ == "__main__":
    main()
