"""CPU seconds and peak resident memory of long runs with streamed records: the bounded
memory figures of docs/performance.md.

The scenario (issue 25's): Azure conversation lengths (../shared/traces/
AzureLLMInferenceTrace_conv.csv) drawn with replacement (scenarios.Empirical), Poisson
arrivals at 5 req/s, Llama-2-7B on an A100-80GB, chunked prefill, budget 512 tokens,
max_num_seqs 128. Each size runs in a fresh process of the installed servesim
(benchmarks/installed_engine.py: ``pip install .`` for the compiled engine) that builds
the workload with the Python API and writes the run directory as ``servesim run`` does
(run_files.run_streamed); the child reports its own getrusage (user + system CPU
seconds, ru_maxrss). ``--held`` also runs each size with every record held in memory
(simulate_prepared + write_run, as before streaming) and says whether requests.csv,
steps.csv and summary.json are byte-identical.

    python benchmarks/scale_memory.py [--sizes 100000,1000000,10000000] [--held]

The 10M run takes 15-20 CPU-minutes and about 10 GB of disk for its spill files.
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from installed_engine import describe, outside_checkout

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"
COMPARED = ("requests.csv", "steps.csv", "summary.json")


def child(n: int, out: Path, held: bool) -> None:
    """Build the n-request workload, run it into ``out``, print CPU-s and peak RSS."""
    from scenarios.arrivals import generate
    from scenarios.lengths import Empirical
    from scenarios.workload import Workload
    from sim.app.runs.run_files import run_streamed, write_run
    from sim.app.runs.runner import RunConfig, prepare_on, simulate_prepared

    length_rng, arrival_rng = (np.random.default_rng(s)
                               for s in np.random.SeedSequence(0).spawn(2))
    # No names kept for the drawn columns: the workload holds its own, as `servesim run`'s.
    w = Workload.from_arrays(generate("poisson", 5.0, n, arrival_rng),
                             *Empirical.from_file(TRACE).sample(n, length_rng),
                             source=f"{n:,} Azure conv lengths, poisson(5)")
    cfg = RunConfig(model="llama-2-7b", gpu="a100-80gb", policy="chunked",
                    max_num_batched_tokens=512, max_num_seqs=128)
    prep = prepare_on(cfg, w)
    if held:
        write_run(out, prep, simulate_prepared(prep))
    else:
        run_streamed(out, prep)
    u = resource.getrusage(resource.RUSAGE_SELF)
    print(f"RESULT {u.ru_utime + u.ru_stime:.1f} {u.ru_maxrss / 1024:.0f}")


def measure(n: int, out: Path, held: bool) -> tuple[float, float]:
    """(CPU seconds, peak RSS MiB) of one child run."""
    args = [sys.executable, __file__, "--child", str(n), "--out", str(out)]
    proc = subprocess.run([*args, *(["--held"] if held else [])], capture_output=True,
                          text=True, cwd=outside_checkout())
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"run of {n:,} failed: {proc.stderr.strip()[-600:]}")
    cpu, rss = lines[-1].split()[1:]
    return float(cpu), float(rss)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--held", action="store_true",
                    help="also run with records held in memory and compare the files")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child is not None:
        child(opts.child, opts.out, opts.held)
        return
    if not TRACE.is_file():
        raise SystemExit(f"{TRACE} not found: the shared traces must be beside the repo")
    print(describe())
    print(f"{'requests':>12} {'mode':>9} {'CPU-s':>8} {'peak RSS MiB':>13}  files")
    for n in (int(x) for x in opts.sizes.split(",")):
        with tempfile.TemporaryDirectory(dir=ROOT.parent) as tmp:
            modes = ("streamed", "held") if opts.held else ("streamed",)
            for mode in modes:
                cpu, rss = measure(n, Path(tmp) / mode, mode == "held")
                same = "" if mode != "held" else ", ".join(
                    f"{f} " + ("identical" if digest(Path(tmp, "held", f))
                               == digest(Path(tmp, "streamed", f)) else "DIFFERENT")
                    for f in COMPARED)
                print(f"{n:>12,} {mode:>9} {cpu:>8.1f} {rss:>13,.0f}  {same}", flush=True)


if __name__ == "__main__":
    main()
