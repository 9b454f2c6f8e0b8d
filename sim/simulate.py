"""One run of one engine: ``simulate`` composes engine, policy, KV cache and cost model
over an arrival source and collects the records into a ``SimResult``; the progress
slices a run is simulated in (sim/app/runs/runner.py adds presets, files and the CLI's
resolved config on top)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from sim.config import SchedulerConfig
from sim.cost_model import CostModel
from sim.engine import Engine, ReleaseHook, StepExecutor, StepObserver
from sim.interface import Scheduler
from sim.kv.block_pool import KVCacheManager
from sim.kv.factory import make_kv
from sim.kv.prefix_cache import cache_summary
from sim.latency_stats import ItlSamples
from sim.metrics import Recorder, summarize
from sim.record_spool import RecordSpool
from sim.source import ArrivalSource
from sim.table import to_frame

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class SimResult:
    """request_table: one row per request (metrics.REQUEST_COLUMNS); step_table: one row
    per step (metrics.STEP_COLUMNS); both column tables (sim/table.py). itl: pooled ITL
    samples (s) with their counts; summary: summary.json dict. ``requests`` and ``steps``
    are the same tables as pandas DataFrames, made on first access (so a run that never
    asks for them never imports pandas)."""

    request_table: dict[str, np.ndarray]
    step_table: dict[str, np.ndarray]
    itl: ItlSamples
    summary: dict[str, Any]
    _frames: dict[str, pd.DataFrame] = field(default_factory=dict, init=False, repr=False,
                                             compare=False)

    @property
    def requests(self) -> pd.DataFrame:
        """request_table as a DataFrame (built once, then the same object)."""
        if "requests" not in self._frames:
            self._frames["requests"] = to_frame(self.request_table)
        return self._frames["requests"]

    @property
    def steps(self) -> pd.DataFrame:
        """step_table as a DataFrame (built once, then the same object)."""
        if "steps" not in self._frames:
            self._frames["steps"] = to_frame(self.step_table)
        return self._frames["steps"]

    @property
    def itl_s(self) -> np.ndarray:
        """Every ITL sample (s), one by one."""
        return self.itl.expanded()


def simulate(
    arrivals: ArrivalSource, *, policy_factory: Any, config: SchedulerConfig,
    cost_model: CostModel, num_gpu_blocks: int, block_size: int = 16,
    slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
    progress: Callable[[int], None] | None = None, slice_s: float = math.inf,
    observer: StepObserver | None = None, on_release: ReleaseHook | None = None,
    fast_path: bool = True, executor: StepExecutor | None = None,
) -> SimResult:
    """Simulate until every request has finished or been rejected.

    policy_factory: called as ``policy_factory(config, kv)`` (a policy class works).
    progress: called with the number of requests done after each ``slice_s`` seconds of
      simulated time (never per step, so it costs nothing on the hot path).
    on_release: the engine's release hook (closed-loop clients: ``source.release``).
    fast_path: let the engine advance steady decode runs at once (sim/fastpath.py);
      False runs the step-by-step reference (same results, slower).
    executor: run each step for real and advance the clock by its measured duration
      (sim.engine.StepExecutor); the cost model is then unused.
    Raises SchedulerStuck if the policy stops making progress with work waiting.
    """
    rec = Recorder()
    kv = _run(arrivals, rec, policy_factory=policy_factory, config=config,
              cost_model=cost_model, num_gpu_blocks=num_gpu_blocks, block_size=block_size,
              progress=progress, slice_s=slice_s, observer=observer, on_release=on_release,
              fast_path=fast_path, executor=executor)
    requests = rec.request_columns()
    steps = rec.step_columns()
    itl = rec.itl_samples()
    summary = summarize(requests, steps, itl, max_num_seqs=config.max_num_seqs,
                        num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                        slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
    summary["prefix_cache"] = cache_summary([kv], block_size)
    return SimResult(requests, steps, itl, summary)


def simulate_streamed(
    arrivals: ArrivalSource, spool: RecordSpool, *, policy_factory: Any,
    config: SchedulerConfig, cost_model: CostModel, num_gpu_blocks: int,
    block_size: int = 16, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
    progress: Callable[[int], None] | None = None, slice_s: float = math.inf,
    on_release: ReleaseHook | None = None, fast_path: bool = True,
) -> dict[str, Any]:
    """``simulate`` with its records streamed to ``spool`` (sim/record_spool.py: the CSVs
    written as the run goes) instead of held: returns only summary.json's dict, the
    same as simulate's. Arguments and errors as simulate's."""
    rec = Recorder(sink=spool)
    kv = _run(arrivals, rec, policy_factory=policy_factory, config=config,
              cost_model=cost_model, num_gpu_blocks=num_gpu_blocks, block_size=block_size,
              progress=progress, slice_s=slice_s, on_release=on_release,
              fast_path=fast_path)
    rec.flush()
    summary = spool.finish(max_num_seqs=config.max_num_seqs, block_size=block_size,
                           slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
    summary["prefix_cache"] = cache_summary([kv], block_size)
    return summary


def _run(
    arrivals: ArrivalSource, rec: Recorder, *, policy_factory: Any, config: SchedulerConfig,
    cost_model: CostModel, num_gpu_blocks: int, block_size: int,
    progress: Callable[[int], None] | None, slice_s: float,
    observer: StepObserver | None = None, on_release: ReleaseHook | None,
    fast_path: bool, executor: StepExecutor | None = None,
) -> KVCacheManager:
    """The engine run into ``rec``, in progress slices; returns its KV cache."""
    env = simpy.Environment()
    kv = make_kv(config.prefix_cache, num_gpu_blocks, block_size)
    policy: Scheduler = policy_factory(config, kv)
    proc = Engine(env, policy=policy, cost_model=cost_model, kv=kv, config=config,
                  arrivals=arrivals, recorder=rec, observer=observer,
                  on_release=on_release, fast_path=fast_path,
                  executor=executor).start()
    for length in progress_slices(slice_s):
        if not proc.is_alive:
            break
        env.run(until=proc if math.isinf(length) else env.now + length)
        if progress is not None:
            progress(rec.num_requests)
    return kv


def progress_slices(slice_s: float, steady: int = 100, growth: float = 1.1) -> Iterator[float]:
    """Lengths (s) of the slices a run is simulated in between progress reports:
    ``slice_s`` (the arrival span / 100) for the first ``steady``, then ``growth`` times
    the last, so a run that lasts far longer than its arrival span (arrivals packed
    into microseconds, then minutes of work) still takes a few hundred slices, not
    billions; inf for one slice. Slicing changes no result."""
    length = slice_s
    for _ in range(steady):
        yield length
    while True:
        length *= growth
        yield length
