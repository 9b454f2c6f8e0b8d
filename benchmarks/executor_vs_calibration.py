"""The same step shapes timed through both torch code paths, back to back: calibration's
(calibration.measure.measure, the profile's points) and the real run's
(calibration.executor.TorchExecutor, what ``servesim validate`` executes), with the
profile's prediction beside them.

Each round times every shape ``--repeats`` times through ``measure`` (its own decoder and
slot cache, one untimed warm-up round, interleaved rounds) and then ``--repeats`` times
through the executor (fresh
requests each run, first scheduled with their context already cached, as a prefix-cache
hit is); per shape it prints the fastest run of each path (the profile's statistic), the
executor over calibration ratio, and the torch threads each path ran with. The
machine's load average is printed before and after: figures from a loaded machine say
little.

    python benchmarks/executor_vs_calibration.py                    # shipped profile's setup
    python benchmarks/executor_vs_calibration.py --dtype fp32 --rounds 3
    python benchmarks/executor_vs_calibration.py --profile fresh.json --shapes d1x128,c64

Shapes: ``dBxC`` = B decodes over C cached tokens each; ``cN`` = one prefill chunk of N
tokens from an empty cache; ``dBxC+cN`` = both in one step. Figures, not a test: they
depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from calibration.executor import TorchExecutor
from calibration.grid import GridConfig, GridPoint
from calibration.measure import measure
from calibration.profile import ProfileCostModel, load_profile
from calibration.specs import ModelSpec
from sim.app.runs.validate import shipped_profile
from sim.batch import BatchPlan, shape_of
from sim.request import Request

DEFAULT_SHAPES = "d1x128,d2x128,d8x128,d16x128,c32,c64,d4x128+c32"


def parse_shape(text: str, index: int) -> GridPoint:
    """A GridPoint from ``dBxC``, ``cN`` or ``dBxC+cN``; ValueError naming the shape."""
    m = re.fullmatch(r"(?:d(\d+)x(\d+))?\+?(?:c(\d+))?", text)
    if not m or not text or text.startswith("+") or text.endswith("+"):
        raise ValueError(f"shape must be dBxC, cN or dBxC+cN, got {text!r}")
    b, c, n = (int(g) if g else 0 for g in m.groups())
    region = "mixed" if b and n else "decode" if b else "prefill"
    return GridPoint(region, index, b, c, n, 0, True)


def _requests(p: GridPoint, serial: int) -> list[tuple[Request, int]]:
    """Fresh requests for one executor step of shape p: decodes already holding their
    context (a cached prefix plus one output), and a chunk that ends its prompt."""
    out = []
    for i in range(p.decode_seqs):
        r = Request(f"d{serial}-{i}", 0.0, p.decode_context, 64, 64, index=i)
        r.num_computed_tokens, r.num_output_tokens = p.decode_context, 1
        out.append((r, 1))
    if p.chunk_tokens:
        out.append((Request(f"c{serial}", 0.0, p.chunk_tokens, 64, 64, index=999), p.chunk_tokens))
    return out


def executor_runs(ex: TorchExecutor, p: GridPoint, repeats: int, serial: int) -> list[float]:
    """Seconds (the executor's clock) of ``repeats`` executions of shape p."""
    out = []
    for k in range(repeats):
        scheduled = _requests(p, serial * 1000 + k)
        shape = shape_of(scheduled)
        assert shape == p.shape, (shape, p.shape)
        out.append(ex(BatchPlan(scheduled=scheduled), shape))
    return out


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, default=Path(shipped_profile()))
    ap.add_argument("--dtype", default=None, help="default: the profile's")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="executor runs per shape a round")
    args = ap.parse_args(argv)
    prof = load_profile(args.profile)
    spec, dtype = ModelSpec(**prof.model), args.dtype or prof.dtype
    points = [parse_shape(s, i) for i, s in enumerate(args.shapes.split(","))]
    cost = ProfileCostModel(prof)
    longest = max(max(p.decode_context + 1, p.chunk_tokens) for p in points)
    grid = GridConfig(max_num_seqs=max(p.decode_seqs for p in points) + 1,
                      max_num_batched_tokens=2, max_context=max(2048, longest),
                      repeats=args.repeats, warmup=1)
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{spec.name} {dtype}, load average {_load()}")
    cal: dict[int, list[float]] = {i: [] for i in range(len(points))}
    exe: dict[int, list[float]] = {i: [] for i in range(len(points))}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        m = measure(spec, grid, dtype=dtype, points=points, progress=False, timer="thread")
        for mp in m.points:
            cal[mp.point.index].append(mp.seconds)
        ex = TorchExecutor(spec, capacity=longest + 1, max_num_seqs=grid.max_num_seqs,
                           dtype=dtype, timer="thread")
        threads = torch.get_num_threads()
        try:
            for i, p in enumerate(points):
                exe[i] += executor_runs(ex, p, args.repeats, r * 100 + i)
        finally:
            ex.close()
        print(f"round {r + 1}: measure on {m.device_name}, executor on {threads} torch "
              f"threads; load average {_load()}; {time.perf_counter() - t0:.0f} s")
    print(f"{'shape':>12} {'profile ms':>11} {'calibration ms':>15} {'executor ms':>12} "
          f"{'exec/cal':>9} {'profile/exec':>13}")
    for i, (p, text) in enumerate(zip(points, args.shapes.split(","), strict=True)):
        c, e = min(cal[i]) * 1e3, min(exe[i]) * 1e3
        pred = cost.step_time(p.shape) * 1e3
        print(f"{text:>12} {pred:11.1f} {c:15.1f} {e:12.1f} {e / c - 1:+9.1%} "
              f"{pred / e - 1:+13.1%}")
    print(f"load average {_load()}")


if __name__ == "__main__":
    main()
