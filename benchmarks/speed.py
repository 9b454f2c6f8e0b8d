"""Simulation speed against Vidur: wall time including start-up, peak RSS,
simulated engine steps per second and requests per second, printed as a table.

Scenarios (run from the repo root; the traces live in ../shared/traces):
  a-chunked     10,000 Azure-conv lengths re-timed Poisson 5 req/s, llama-2-7b on
                a100-80gb, chunked, budget 512, max_num_seqs 128 (Vidur sarathi: 26-29 s)
  a-continuous  the same with continuous, budget 4096 (Vidur vLLM scheduler: 25-27 s)
  b-conv        the full Azure conversation replay with defaults
  c-100k        100,000 requests of the default scenario near saturation (25 req/s)
  d-1m          1,000,000 requests of the same (slow: minutes)

    python benchmarks/speed.py [--only a-chunked,a-continuous,b-conv,c-100k,d-1m] [--repeat N]

Each scenario runs the installed servesim's `servesim run` (benchmarks/installed_engine.py:
`pip install .` for the compiled engine) in a fresh process (`/usr/bin/time`-style figures from
resource.getrusage of the child); no assertion is made: these are figures, not tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from installed_engine import describe, outside_checkout

TRACE = str(Path(__file__).resolve().parents[1].parent / "shared" / "traces"
            / "AzureLLMInferenceTrace_conv.csv")
MATCH = ["--trace", TRACE, "--arrival", "poisson", "--rate", "5", "--num-requests", "10000",
         "--model", "llama-2-7b", "--gpu", "a100-80gb", "--max-num-seqs", "128"]
SCENARIOS: dict[str, tuple[list[str], str]] = {
    "a-chunked": ([*MATCH, "--policy", "chunked", "--max-num-batched-tokens", "512"],
                  "Vidur 26-29 s, 1.4-1.6 GiB"),
    "a-continuous": ([*MATCH, "--policy", "continuous", "--max-num-batched-tokens", "4096"],
                     "Vidur 25-27 s"),
    "b-conv": (["--trace", TRACE], ""),
    "c-100k": (["--rate", "25", "--num-requests", "100000"], ""),
    "d-1m": (["--rate", "25", "--num-requests", "1000000"], ""),
}


def run_one(args: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        code = ("import resource, sys; from sim.app.cli.main import app; "
                "sys.argv = ['servesim', 'run', *sys.argv[1:]]\n"
                "try:\n    app()\nexcept SystemExit as e:\n    rc = e.code\n"
                "print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
                "file=sys.stderr)")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code, *args, "--out", tmp],
                              capture_output=True, text=True, cwd=outside_checkout(),
                              env={**os.environ, "COLUMNS": "120"})
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not (Path(tmp) / "summary.json").exists():
            raise SystemExit(f"servesim run failed: {proc.stderr.strip()[-400:]}")
        rss_kb = max(int(x.split()[1]) for x in proc.stderr.splitlines()
                     if x.startswith("MAXRSS"))
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        import pandas as pd

        steps = int(pd.read_csv(Path(tmp) / "steps.csv", usecols=["num_steps"])
                    ["num_steps"].sum())
    return {"wall_s": wall, "rss_mb": rss_kb / 1024, "steps": steps,
            "requests": summary["num_requests"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="a-chunked,a-continuous,b-conv,c-100k")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per scenario; the table gives the fastest (a shared machine "
                         "only ever slows a run down), the spread is printed after it")
    opts = ap.parse_args()
    names = opts.only.split(",")
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"--only: unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    print(describe())
    print(f"{'scenario':14} {'requests':>10} {'steps':>11} {'wall s':>8} {'steps/s':>10} "
          f"{'req/s':>9} {'RSS MB':>7}  reference")
    results = {}
    for name in names:
        args, ref = SCENARIOS[name]
        runs = [run_one(args) for _ in range(max(1, opts.repeat))]
        r = results[name] = min(runs, key=lambda x: x["wall_s"])
        spread = (f"  [{min(x['wall_s'] for x in runs):.2f}-"
                  f"{max(x['wall_s'] for x in runs):.2f} s over {len(runs)} runs]"
                  if len(runs) > 1 else "")
        print(f"{name:14} {r['requests']:>10,} {r['steps']:>11,} {r['wall_s']:>8.2f} "
              f"{r['steps'] / r['wall_s']:>10,.0f} {r['requests'] / r['wall_s']:>9,.0f} "
              f"{r['rss_mb']:>7.0f}  {ref}{spread}", flush=True)
    if "c-100k" in results and "d-1m" in results:
        ratio = results["d-1m"]["wall_s"] / results["c-100k"]["wall_s"]
        print(f"(d)/(c) wall-time ratio: {ratio:.1f}")


if __name__ == "__main__":
    main()
