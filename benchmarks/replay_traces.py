"""Wall time, peak RSS and simulation rates of full trace replays with `servesim run`.

Prints figures (no assertions): the walking skeleton's target is the Azure conversation
replay (19,366 requests) in under 60 s on a 2-core machine. Usage, from the repo root:

    python benchmarks/replay_traces.py [--traces conv,code,mooncake] [extra run flags...]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

TRACES = {
    "conv": "AzureLLMInferenceTrace_conv.csv",
    "code": "AzureLLMInferenceTrace_code.csv",
    "mooncake": "mooncake_conversation_trace.jsonl",
}
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def replay(trace: Path, extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "sim.app.cli", "run", "--trace", str(trace), "--out", tmp,
               *extra]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        steps = len(pd.read_csv(Path(tmp) / "steps.csv", usecols=["num_seqs"]))
    return {"wall_s": wall, "peak_rss_mb": rss, "requests": summary["num_requests"],
            "steps": steps, "steps_per_s": steps / wall,
            "requests_per_s": summary["num_requests"] / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="conv,code,mooncake")
    args, extra = ap.parse_known_args()
    if not SHARED.exists():
        sys.exit(f"{SHARED} not found: the public traces live in ../shared/traces")
    print(f"{'trace':10} {'requests':>9} {'steps':>9} {'wall s':>8} {'steps/s':>9} "
          f"{'req/s':>8} {'peak RSS MB':>12}")
    for name in args.traces.split(","):
        r = replay(SHARED / TRACES[name], extra)
        print(f"{name:10} {r['requests']:>9,} {r['steps']:>9,} {r['wall_s']:>8.2f} "
              f"{r['steps_per_s']:>9,.0f} {r['requests_per_s']:>8,.0f} {r['peak_rss_mb']:>12.0f}")


if __name__ == "__main__":
    main()
