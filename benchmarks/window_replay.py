"""Window-parallel replay against a serial run (docs/scale.md): how long a warm-up must be
for every window's TTFT and E2E p50/p99 to stay within 2% of a serial run's, the wall
time of the replay on local processes and on a local Ray instance, and (``--memory``) the
driver's peak RSS writing the replay's run directory as the windows complete.

The workload is synthetic: the Azure 2023 conversation trace's lengths, oversampled and
re-timed by the diurnal process (scenarios/diurnal.py) at mean ``--rate`` for ``--days``;
the serial comparison runs on its first ``--compare-days``. The engine is the issue's
scenario (Llama-2-7B on an A100-40GB, chunked prefill with a 512-token budget, at most
128 sequences), loaded enough at the daily peak for queues and KV pressure to matter.

Usage:  python benchmarks/window_replay.py [--rate 2] [--days 7] [--compare-days 1]
            [--window 1h] [--warmups 0,1m,5m,15m,30m] [--ray] [--no-walls] [--no-compare]
            [--memory]
The trace is read from ../shared/traces/ next to the repository (TRACES overrides).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sim.app.runs.durations import parse_duration
from sim.app.runs.runner import Prepared, RunConfig, prepare, simulate_prepared
from sim.app.runs.window_replay import (
    DEFAULT_WARMUP_S,
    WindowSettings,
    simulate_window,
    simulate_windows,
    split_windows,
)
from sim.simulate import SimResult

T = TypeVar("T")

#: The per-window figures compared, as (request column, percentile).
METRICS = (("ttft_s", 50), ("ttft_s", 99), ("e2e_latency_s", 50), ("e2e_latency_s", 99))

#: The largest relative error every window must stay within.
TOLERANCE = 0.02


def _trace() -> Path:
    root = Path(os.environ.get("TRACES", Path(__file__).resolve().parents[2] / "shared/traces"))
    return root / "AzureLLMInferenceTrace_conv.csv"


def _timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, its wall seconds and this process's CPU seconds (user + sys)."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = fn()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return out, t1 - t0, cpu


def week(rate: float, days: float) -> Prepared:
    """The prepared week (module docstring)."""
    cfg = RunConfig(trace=str(_trace()), arrival="diurnal", rate=rate,
                    num_requests=int(rate * days * 86_400), model="llama-2-7b",
                    gpu="a100-40gb", max_num_batched_tokens=512, max_num_seqs=128, seed=0)
    return prepare(cfg)


def per_window(result: SimResult, bounds: list[tuple[int, int]]) -> np.ndarray:
    """Each window's METRICS over its own requests, shape (windows, len(METRICS))."""
    cols = {c: result.request_table[c] for c, _ in METRICS}
    out = np.empty((len(bounds), len(METRICS)))
    for i, (a, b) in enumerate(bounds):
        for j, (c, q) in enumerate(METRICS):
            v = cols[c][a:b]
            out[i, j] = np.percentile(v[np.isfinite(v)], q)
    return out


def compare(prep: Prepared, window_s: float, warmups: list[float]) -> list[dict[str, Any]]:
    """One row per warm-up: the largest relative error of each metric over the windows,
    and how many windows are off by more than TOLERANCE on any."""
    serial, wall, cpu = _timed(lambda: simulate_prepared(prep))
    print(f"serial: {len(prep.workload):,} requests, {wall:.1f} s wall, {cpu:.1f} CPU-s")
    bounds = [(w.own_first, w.own_end)
              for w in split_windows(prep.workload.arrival_time, window_s, 0.0)]
    ref = per_window(serial, bounds)
    rows = []
    for warmup_s in warmups:
        merged = simulate_windows(prep, window_s, warmup_s, workers=2)
        err = np.abs(per_window(merged, bounds) - ref) / ref
        print(f"  warm-up {warmup_s:g} s done", flush=True)
        rows.append({"warmup_s": warmup_s, **{f"{c} p{q}": float(err[:, j].max())
                                               for j, (c, q) in enumerate(METRICS)},
                     "windows_over": int((err.max(axis=1) > TOLERANCE).sum()),
                     "windows": len(bounds)})
    print(f"{'warm-up':>8} " + " ".join(f"{c[:-2]} p{q:<2}".rjust(14) for c, q in METRICS)
          + "  windows over 2%")
    for r in rows:
        errs = " ".join(f"{100 * r[f'{c} p{q}']:13.2f}%" for c, q in METRICS)
        print(f"{r['warmup_s'] / 60:7g}m {errs}  {r['windows_over']}/{r['windows']}")
    return rows


def window_costs(prep: Prepared, window_s: float, warmup_s: float) -> None:
    """CPU seconds of each window's run, one after another in this process: their sum
    against the serial run's (the warm-ups' extra work), and the wall floor on N workers
    (the longest-first schedule's makespan), whatever the machine's load."""
    cpu = []
    for w in split_windows(prep.workload.arrival_time, window_s, warmup_s):
        task = dataclasses.replace(prep, workload=prep.workload.rows(w.warmup_first,
                                                                    w.own_end))
        _, _, c = _timed(partial(simulate_window, (task, w)))
        cpu.append(c)
    _, _, serial = _timed(lambda: simulate_prepared(prep))
    print(f"warm-up {warmup_s / 60:g} min: {len(cpu)} windows, {sum(cpu):.1f} CPU-s in all "
          f"({sum(cpu) / serial:.2f}x the serial run's {serial:.1f}), longest {max(cpu):.1f}")
    for n in (2, 4, 8, len(cpu)):
        load = [0.0] * n
        for c in sorted(cpu, reverse=True):
            load[load.index(min(load))] += c
        print(f"  {n} workers: wall floor {max(load):.1f} s ({serial / max(load):.1f}x)")


def walls(prep: Prepared, window_s: float, warmup_s: float, ray: bool) -> None:
    """Wall seconds of the serial run and of the replay on 2 local workers (and on a
    local Ray instance)."""
    _, serial, cpu = _timed(lambda: simulate_prepared(prep))
    print(f"{len(prep.workload):,} requests: serial {serial:.1f} s wall ({cpu:.1f} CPU-s)")
    runs: list[tuple[str, dict[str, Any]]] = [("local, 2 workers",
                                               {"backend": "local", "workers": 2})]
    if ray:
        runs.append(("ray, local instance", {"backend": "ray"}))
    for label, kw in runs:
        _, wall, _ = _timed(partial(simulate_windows, prep, window_s, warmup_s, **kw))
        print(f"  {label}: {wall:.1f} s wall ({serial / wall:.2f}x the serial run's speed)")


def memory(prep: Prepared, window_s: float, warmup_s: float) -> None:
    """The replay of the whole ``prep`` written into a temporary run directory as the
    windows complete (WindowSettings.write, 2 local workers, as ``servesim run
    --parallel-windows`` does): wall and this process's CPU seconds and its peak RSS (a
    high-water mark: run it alone, ``--no-compare --no-walls``)."""
    settings = WindowSettings(window_s, warmup_s, "local", 2)
    with tempfile.TemporaryDirectory() as tmp:
        _, wall, cpu = _timed(partial(settings.write, Path(tmp) / "run", prep))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{len(prep.workload):,} requests, {settings.count(prep)} windows written: "
          f"{wall:.1f} s wall, driver {cpu:.1f} CPU-s, driver peak RSS {peak_mb:.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=2.0, help="mean requests/s")
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--compare-days", type=float, default=1.0)
    ap.add_argument("--window", default="1h")
    ap.add_argument("--warmups", default="0,1m,5m,15m,30m")
    ap.add_argument("--ray", action="store_true", help="also time a local Ray instance")
    ap.add_argument("--no-walls", action="store_true", help="skip the wall-time runs")
    ap.add_argument("--no-compare", action="store_true", help="skip the error table")
    ap.add_argument("--memory", action="store_true",
                    help="first, the driver's peak RSS writing the whole replay")
    args = ap.parse_args()
    window_s = parse_duration(args.window, "--window")
    warmups = [parse_duration(w, "--warmups") for w in args.warmups.split(",")]
    full = week(args.rate, args.days)
    if args.memory:
        memory(full, window_s, DEFAULT_WARMUP_S)
    part = dataclasses.replace(full, workload=full.workload.cut(
        window_s=args.compare_days * 86_400))
    if not args.no_compare:
        compare(part, window_s, warmups)
    if not args.no_walls:
        window_costs(part, window_s, DEFAULT_WARMUP_S)
        walls(part, window_s, DEFAULT_WARMUP_S, args.ray)


if __name__ == "__main__":
    main()
