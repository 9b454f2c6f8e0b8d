"""Seconds and peak resident memory to read a 2-million-row Azure LLM inference 2024 CSV.

The file is synthetic, written by this script into a temporary directory: the 2024
schema (``TIMESTAMP`` with a ``+00:00`` offset, the fraction absent when it is 0 as in the
real files, ``ContextTokens``, ``GeneratedTokens``), time-ordered arrivals at 28 req/s
(the code trace's week: 16.8 M rows), lognormal lengths. Each figure is one fresh Python
process (``os.wait4`` gives that child's peak RSS, the interpreter and libraries included):

- ``load_trace(path, num_requests=10_000)``: the read stops once the cut is met;
- ``servesim run --trace FILE --num-requests 10000``: the whole command, simulation and
  run directory included;
- ``load_trace(path)``: the whole file;
- ``load_trace(path)`` again, its columns read from the parsed-trace cache that the
  previous whole read wrote (scenarios/traces/column_cache.py); every other figure is
  taken with the cache off (``SERVESIM_TRACE_CACHE=0``);
- with ``--rows``, the whole file through the row-by-row reader (what every read took
  before pandas read the columns: the figure to compare against).

    python benchmarks/trace_read_speed.py [--rows] [--rows-count 2000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RATE_PER_S = 28.0


def write_azure_2024(path: Path, n: int, seed: int = 0) -> None:
    """A synthetic Azure 2024 trace of ``n`` rows (module docstring)."""
    rng = np.random.default_rng(seed)
    gaps_us = rng.exponential(1e6 / RATE_PER_S, n).astype(np.int64)
    offset_us = np.cumsum(gaps_us)
    whole_s = rng.random(n) < 0.01  # 1% on a whole second: no fraction written
    offset_us[whole_s] += -offset_us[whole_s] % 1_000_000
    offset_us = np.maximum.accumulate(offset_us)  # still time-ordered
    stamps = np.datetime64("2024-05-10T00:00:00", "us") + offset_us.astype("timedelta64[us]")
    text = np.datetime_as_string(stamps)
    whole = stamps.astype("datetime64[s]") == stamps
    text[whole] = np.datetime_as_string(stamps[whole].astype("datetime64[s]"))
    prompt = np.maximum(1, rng.lognormal(7.0, 1.0, n)).astype(np.int64)
    output = np.maximum(1, rng.lognormal(3.0, 1.2, n)).astype(np.int64)
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
        for start in range(0, n, 200_000):
            end = min(n, start + 200_000)
            f.writelines(f"{t.replace('T', ' ')}+00:00,{p},{o}\r\n" for t, p, o in zip(
                text[start:end].tolist(), prompt[start:end].tolist(),
                output[start:end].tolist(), strict=True))


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, last output line) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{out}")
    rss_mb = usage.ru_maxrss / 1024 if sys.platform != "darwin" else usage.ru_maxrss / 2**20
    return seconds, rss_mb, out.strip().splitlines()[-1] if out.strip() else ""


def _load(path: Path, extra: str = "", setup: str = "") -> list[str]:
    code = (f"{setup}from scenarios.traces import load_trace; "
            f"w = load_trace({str(path)!r}{extra}); print(len(w), 'requests')")
    return [sys.executable, "-c", code]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-count", type=int, default=2_000_000, help="rows in the file")
    ap.add_argument("--rows", action="store_true", help="also time the row-by-row reader")
    ap.add_argument("--write", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write is not None:
        write_azure_2024(args.write, args.rows_count)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "AzureLLMInferenceTrace_code_2024_synthetic.csv"
        start = time.perf_counter()
        # Written by a child: a parent grown by the writing would lend its resident
        # pages to every child it forks, and inflate their peak RSS.
        subprocess.run([sys.executable, __file__, "--write", str(path), "--rows-count",
                        str(args.rows_count)], check=True)
        print(f"wrote {args.rows_count:,} rows ({path.stat().st_size / 1e6:.0f} MB) in "
              f"{time.perf_counter() - start:.1f} s")
        off = {**os.environ, "SERVESIM_TRACE_CACHE": "0"}
        cached = {**os.environ, "SERVESIM_CACHE_DIR": str(Path(tmp) / "cache"),
                  "SERVESIM_TRACE_CACHE": "1"}
        cases = [
            ("load_trace, num_requests=10000", _load(path, ", num_requests=10_000"), off),
            ("servesim run --num-requests 10000",
             [sys.executable, "-m", "sim.app.cli", "run", "--trace", str(path),
              "--num-requests", "10000", "--out", str(Path(tmp) / "run")], off),
            ("load_trace, whole file", _load(path), off),
        ]
        measure(_load(path), cached)  # writes the cache entry
        cases.append(("load_trace, whole file, cached", _load(path), cached))
        if args.rows:
            no_bulk = "import scenarios.traces.bulk as b; b.read = lambda *a: None; "
            cases.append(("row-by-row reader, whole file", _load(path, setup=no_bulk), off))
        for label, argv, env in cases:
            seconds, rss_mb, last = measure(argv, env)
            print(f"{label:36s} {seconds:6.2f} s  peak RSS {rss_mb:6.0f} MB  ({last})")


if __name__ == "__main__":
    main()
