"""Window-parallel replay (``servesim run --parallel-windows``): a long workload split
into windows of its arrival span, each simulated as a run of its own on a worker (a
local process or a Ray task: sim/app/runs/backends.py), and the windows' records merged
into the one result a serial run writes.

Owns the split, the window's run and the merge:

- **Windows.** Window k holds the requests arriving in ``[t0 + k W, t0 + (k + 1) W)``,
  ``t0`` the first arrival; a window with no arrivals joins the one before it.
- **Warm-up.** A window's run first replays the requests arriving in the ``warmup_s``
  before its start (they rebuild the queue and the KV cache a serial run would have
  there); their records are dropped, as the window before keeps its own.
- **Merge.** Requests in workload order (each window's own, in order). Steps: each window
  keeps the steps starting inside its own span (the first window those before it too,
  the last those after it: the drain); so the merged steps are time-ordered and none is
  counted twice. ITL: each window's pooled gaps, the warm-up requests' included (ITL is
  pooled per run, not kept per request), so a warm-up's gaps count twice: a bias of the
  order of warm-up / window length on ``itl_s``. summary.json comes from the merged
  records through metrics.summarize, as a serial run's does; ``prefix_cache`` sums the
  windows' counters (warm-up lookups included).
- **Streaming.** ``servesim run`` writes the merge as the windows complete
  (spool_windows): each part, in window order, into the RecordSpool a serial run streams
  into (sim/record_spool.py), so the driver holds only the parts that finish ahead of an
  earlier window; the same bytes as merge_parts written whole (but for the last bit of
  ``itl_s``'s mean past spilled_stats.ITL_IN_MEMORY entries, as for a serial run).
  simulate_windows holds every part (the tables the optional files and benchmarks need).

The result depends on the windows and the warm-up, never on the backend or the number of
workers: every window is a deterministic run, and the map returns them in order.
Closed-loop runs (``concurrency``) and clusters (``replicas`` > 1) are refused: a closed
loop's arrivals depend on earlier completions, and a cluster's routing on every replica.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.app.runs.backends import BACKENDS, for_each_ordered
from sim.app.runs.durations import parse_duration
from sim.app.runs.run_files import run_spooled
from sim.app.runs.runner import Prepared, engine_args, simulate_prepared
from sim.kv.prefix_cache import PrefixCacheStats, prefix_cache_summary
from sim.latency_stats import ItlSamples
from sim.metrics import summarize
from sim.record_spool import RecordSpool
from sim.simulate import SimResult, simulate_streamed
from sim.table import concat_tables

#: Warm-up when none is given, seconds: longer than the requests' lifetimes at the loads
#: measured (E2E p99 about 13 s), 8% more requests replayed with 1 h windows, and every
#: window's TTFT and E2E p50/p99 within 0.7% of a serial run's there
#: (benchmarks/window_replay.py, docs/scale.md).
DEFAULT_WARMUP_S = 300.0


@dataclass(frozen=True)
class WindowSettings:
    """``--parallel-windows``: window and warm-up lengths (s), the backend and its local
    workers (None: one per CPU)."""

    window_s: float
    warmup_s: float = DEFAULT_WARMUP_S
    backend: str = "local"
    workers: int | None = None

    @classmethod
    def parse(cls, window: str, warmup: str | None, backend: str | None,
              workers: int | None) -> WindowSettings:
        """The settings of the CLI's strings; ValueError naming the option for a bad
        duration (parse_duration), a window not > 0, an unknown backend or workers < 1."""
        window_s = parse_duration(window, "--parallel-windows")
        if not window_s > 0:
            raise ValueError(f"--parallel-windows must be a duration > 0, got {window!r}")
        warmup_s = DEFAULT_WARMUP_S if warmup is None else parse_duration(warmup, "--warmup")
        if (backend or "local") not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got "
                             f"{backend!r}")
        if workers is not None and workers < 1:
            raise ValueError(f"--workers must be an integer >= 1, got {workers}")
        return cls(window_s, warmup_s, backend or "local", workers)

    def count(self, prep: Prepared) -> int:
        """How many windows ``prep``'s workload splits into."""
        return len(split_windows(prep.workload.arrival_time, self.window_s, self.warmup_s))

    def simulate(self, prep: Prepared,
                 on_done: Callable[[int], None] | None = None) -> SimResult:
        """simulate_windows of ``prep`` with these settings."""
        return simulate_windows(prep, self.window_s, self.warmup_s, backend=self.backend,
                                workers=self.workers, on_done=on_done)

    def write(self, out_dir: Path, prep: Prepared, full_steps: bool = False,
              on_done: Callable[[int], None] | None = None) -> dict[str, Any]:
        """simulate's run written into the run directory ``out_dir`` as the windows
        complete (spool_windows, run_files.run_spooled: whole or not at all); returns
        summary.json's dict. Raises ValueError as run_files.write_run."""
        return run_spooled(out_dir, prep, lambda tmp: spool_windows(
            tmp, prep, self.window_s, self.warmup_s, full_steps=full_steps,
            backend=self.backend, workers=self.workers, on_done=on_done))

    def labelled(self, prep: Prepared) -> Prepared:
        """``prep`` with its workload's source saying how it is replayed (config.json's
        ``resolved.workload`` records it); ValueError for a run check_windowed refuses."""
        check_windowed(prep)
        w = prep.workload
        source = (f"{w.source}, replayed in {self.count(prep)} windows of "
                  f"{self.window_s:g} s, warm-up {self.warmup_s:g} s")
        return dataclasses.replace(prep, workload=dataclasses.replace(w, source=source))


@dataclass(frozen=True)
class Window:
    """One window: its own rows ``[own_first, own_end)`` of the workload, the warm-up rows
    ``[warmup_first, own_first)`` before them, and the span ``[keep_from_s,
    keep_until_s)`` (s) whose steps it keeps (-inf / inf at the ends)."""

    index: int
    warmup_first: int
    own_first: int
    own_end: int
    keep_from_s: float
    keep_until_s: float


def split_windows(arrival_time: np.ndarray, window_s: float,
                  warmup_s: float) -> list[Window]:
    """The windows of a workload's arrivals (float64 s, non-decreasing), module
    docstring. Raises ValueError for ``window_s`` not finite and > 0, ``warmup_s`` not
    finite and >= 0."""
    if not (window_s > 0 and math.isfinite(window_s)):
        raise ValueError(f"--parallel-windows must be a duration > 0, got {window_s!r} s")
    if not (warmup_s >= 0 and math.isfinite(warmup_s)):
        raise ValueError(f"--warmup must be a duration >= 0, got {warmup_s!r} s")
    t = np.asarray(arrival_time, dtype=np.float64)
    if not len(t):
        return []
    count = int((t[-1] - t[0]) // window_s) + 1
    starts = t[0] + window_s * np.arange(count, dtype=np.float64)
    first = np.searchsorted(t, starts, side="left")
    kept = np.flatnonzero(np.diff(np.append(first, len(t))) > 0)  # windows with arrivals
    begins, rows = starts[kept], first[kept]
    ends = np.append(rows[1:], len(t))
    warm = np.searchsorted(t, begins - warmup_s, side="left")
    return [Window(i, int(warm[i]), int(rows[i]), int(ends[i]),
                   -math.inf if i == 0 else float(begins[i]),
                   math.inf if i == len(kept) - 1 else float(begins[i + 1]))
            for i in range(len(kept))]


@dataclass(frozen=True)
class WindowPart:
    """What a window's run keeps: its own requests' rows, the steps in its span, its
    pooled ITL samples and its summary's prefix_cache."""

    request_table: dict[str, np.ndarray]
    step_table: dict[str, np.ndarray]
    itl: ItlSamples
    prefix_cache: dict[str, Any]


def _window_task(prep: Prepared, window: Window) -> tuple[Prepared, Window]:
    """The prepared run of ``window``: ``prep`` on its warm-up and own rows."""
    rows = prep.workload.rows(window.warmup_first, window.own_end)
    return dataclasses.replace(prep, workload=rows), window


def simulate_window(task: tuple[Prepared, Window]) -> WindowPart:
    """Simulate one window (a worker's task) and keep its part (module docstring)."""
    prep, window = task
    result = simulate_prepared(prep)
    warm = window.own_first - window.warmup_first
    assert len(result.request_table["request_id"]) == len(prep.workload)
    requests = {c: v[warm:] for c, v in result.request_table.items()}
    start = result.step_table["start_time"]
    keep = (start >= window.keep_from_s) & (start < window.keep_until_s)
    steps = {c: v[keep] for c, v in result.step_table.items()}
    return WindowPart(requests, steps, result.itl, result.summary["prefix_cache"])


def check_windowed(prep: Prepared) -> None:
    """ValueError for a run windows cannot replay: a closed loop, a cluster or
    disaggregated pools (module docstring)."""
    cfg = prep.config
    if cfg.concurrency is not None:
        raise ValueError("--parallel-windows replays open-loop arrivals; closed-loop users "
                         "(--concurrency) send as earlier requests end: run it serially")
    if cfg.replicas > 1 or cfg.disagg is not None:
        raise ValueError("--parallel-windows simulates one engine per window; give "
                         "--replicas 1 and no --disagg, or run the cluster serially")


def replay_windows(prep: Prepared, window_s: float, warmup_s: float,
                   on_part: Callable[[WindowPart], None], *, backend: str = "local",
                   workers: int | None = None,
                   on_done: Callable[[int], None] | None = None) -> int:
    """Simulate ``prep``'s windows on ``backend`` and hand each window's part to
    ``on_part`` in window order, as soon as it and every earlier one are done (only
    parts that finish ahead of an earlier one are held: backends.Executor.for_each).
    Returns the number of windows (0: no arrivals, nothing simulated). Errors as
    simulate_windows'."""
    check_windowed(prep)
    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    windows = split_windows(prep.workload.arrival_time, window_s, warmup_s)
    if windows:
        for_each_ordered(simulate_window, [_window_task(prep, w) for w in windows], on_part,
                         workers=workers, backend=backend, on_done=on_done)
    return len(windows)


def simulate_windows(prep: Prepared, window_s: float, warmup_s: float, *,
                     backend: str = "local", workers: int | None = None,
                     on_done: Callable[[int], None] | None = None) -> SimResult:
    """``prep``'s run replayed in windows of ``window_s`` seconds with ``warmup_s`` of
    warm-up each, on ``backend`` (local processes or Ray, ``workers`` of them locally);
    the merged result, as simulate_prepared returns a serial run's (every window's
    records held: spool_windows writes them out instead). ``on_done(n)`` after each
    window. Raises ValueError for a run check_windowed refuses or a bad duration or
    backend; whatever a window's run raises (SchedulerStuck)."""
    parts: list[WindowPart] = []
    if not replay_windows(prep, window_s, warmup_s, parts.append, backend=backend,
                          workers=workers, on_done=on_done):  # no arrivals: nothing to split
        return simulate_prepared(prep)
    return merge_parts(prep, parts)


def spool_windows(run_dir: Path, prep: Prepared, window_s: float, warmup_s: float, *,
                  full_steps: bool = False, backend: str = "local",
                  workers: int | None = None,
                  on_done: Callable[[int], None] | None = None) -> dict[str, Any]:
    """simulate_windows with the merged records written into ``run_dir`` (a staged run
    directory: run_files.run_spooled) as the windows complete: requests.csv and
    steps.csv through a RecordSpool (sim/record_spool.py), fed each part in window
    order, so the driver holds a few windows' records, not the run's. Returns
    summary.json's dict; the files and the summary are byte for byte those of
    merge_parts written by run_files.write_run (``full_steps`` as there). Errors as
    simulate_windows'."""
    cfg = prep.config
    assert cfg.block_size is not None, "RunConfig resolves the block size"
    spool = RecordSpool(run_dir, prep.num_gpu_blocks, full_steps)
    caches: list[dict[str, Any]] = []
    first_row = 0  # the next part's first workload row

    def write(part: WindowPart) -> None:
        nonlocal first_row
        rows = len(part.request_table["request_id"])
        spool.write_requests(np.arange(first_row, first_row + rows), part.request_table)
        first_row += rows
        spool.write_steps(part.step_table)
        # as one run's pooled samples, in merge_parts' order (ItlSamples.concat)
        spool.write_itl(part.itl.values_s, part.itl.counts, np.zeros(0))
        caches.append(part.prefix_cache)

    try:
        if not replay_windows(prep, window_s, warmup_s, write, backend=backend,
                              workers=workers, on_done=on_done):  # no arrivals
            arrivals, common = engine_args(prep)
            return _one_engine(prep, simulate_streamed(arrivals, spool, **common))
        summary = spool.finish(max_num_seqs=prep.scheduler.max_num_seqs,
                               block_size=cfg.block_size, slo_ttft_s=cfg.slo_ttft,
                               slo_tpot_s=cfg.slo_tpot)
    finally:
        spool.close()
    summary["prefix_cache"] = _prefix_cache(caches, cfg.block_size)
    return _one_engine(prep, summary)


def merge_parts(prep: Prepared, parts: list[WindowPart]) -> SimResult:
    """The windows' parts as one run's SimResult: records concatenated in window order,
    summary.json from them by metrics.summarize (module docstring)."""
    cfg, sched = prep.config, prep.scheduler
    assert cfg.block_size is not None, "RunConfig resolves the block size"
    requests = concat_tables([p.request_table for p in parts])
    steps = concat_tables([p.step_table for p in parts])
    itl = ItlSamples.concat([p.itl for p in parts])
    summary = summarize(requests, steps, itl, max_num_seqs=sched.max_num_seqs,
                        num_gpu_blocks=prep.num_gpu_blocks, block_size=cfg.block_size,
                        slo_ttft_s=cfg.slo_ttft, slo_tpot_s=cfg.slo_tpot)
    summary["prefix_cache"] = _prefix_cache([p.prefix_cache for p in parts], cfg.block_size)
    return SimResult(requests, steps, itl, _one_engine(prep, summary))


def _one_engine(prep: Prepared, summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with its ``replicas`` entry: the one engine, every request routed to
    it (as a serial run's)."""
    summary["replicas"] = [{"replica": 0, "num_routed": len(prep.workload), **summary}]
    return summary



#: summary.json's prefix_cache counters and the PrefixCacheStats fields behind them.
_CACHE_COUNTERS = {"num_admissions": "num_admissions",
                   "num_admissions_with_hit": "num_admissions_with_hit",
                   "queried_tokens": "queried_tokens", "hit_tokens": "hit_tokens",
                   "preempted_queried_tokens": "readmission_queried_tokens",
                   "preempted_hit_tokens": "readmission_hit_tokens",
                   "evictions": "evicted_blocks"}


def _prefix_cache(parts: list[dict[str, Any]], block_size: int) -> dict[str, Any]:
    """The windows' prefix_cache summaries with their counters summed."""
    stats = PrefixCacheStats(**{f: sum(int(p[k]) for p in parts)
                                for k, f in _CACHE_COUNTERS.items()})
    return prefix_cache_summary(parts[0]["mode"], stats, block_size)
