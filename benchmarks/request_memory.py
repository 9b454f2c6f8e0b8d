"""Bytes of Python and numpy memory one simulated request holds at a run's peak: the
source of sim/app/runs/resources.py's BYTES_PER_REQUEST.

For each workload below, a run of N and of 2N requests is prepared, simulated and written
(into a temporary directory) under tracemalloc, which counts every Python object and every
numpy buffer (numpy reports its allocations to tracemalloc); the peak's growth from N to 2N,
divided by N, is the memory each further request costs. It leaves out the interpreter and
its libraries (a constant, already mapped when the run is checked) and the allocator's slack
above what is traced (resident memory grows somewhat faster: compare /usr/bin/time -v).

    python benchmarks/request_memory.py [--n 8000]   (2N must fit the trace's 19,366)

Workloads: the default scenario (what ``servesim run --num-requests N`` simulates), the same
near saturation (25 req/s: long queues), and the Azure conversation trace's lengths re-timed
Poisson at 5 req/s (longer prompts). Prints one line per workload and the largest figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import tempfile
import tracemalloc
from pathlib import Path

from sim.app.runs.run_files import write_run
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared

TRACE = str(Path(__file__).resolve().parents[1].parent / "shared" / "traces"
            / "AzureLLMInferenceTrace_conv.csv")
WORKLOADS = {
    "default scenario": RunConfig(),
    "default, 25 req/s": RunConfig(rate=25.0),
    "Azure conv, poisson 5 req/s": RunConfig(trace=TRACE, arrival="poisson", rate=5.0),
}


def peak_bytes(cfg: RunConfig, n: int) -> int:
    """tracemalloc's peak over preparing, simulating and writing ``n`` requests of cfg."""
    gc.collect()
    tracemalloc.start()
    try:
        prep = prepare(dataclasses.replace(cfg, num_requests=n))
        result = simulate_prepared(prep)
        with tempfile.TemporaryDirectory() as tmp:
            write_run(Path(tmp) / "run", prep, result)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=8_000, help="requests of the smaller run")
    n = parser.parse_args().n
    worst = 0.0
    for name, cfg in WORKLOADS.items():
        small, large = peak_bytes(cfg, n), peak_bytes(cfg, 2 * n)
        per = (large - small) / n
        worst = max(worst, per)
        print(f"{name}: peak {small / 2**20:,.1f} MiB at {n:,}, {large / 2**20:,.1f} MiB at "
              f"{2 * n:,}: {per:,.0f} bytes per request")
    print(f"largest: {worst:,.0f} bytes per request")


if __name__ == "__main__":
    main()
