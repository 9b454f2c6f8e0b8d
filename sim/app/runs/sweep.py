"""``servesim sweep``: what-if grids over engine knobs and load.

Owns the grid (comma-separated values per axis, the cartesian product of the axes given
in sim/app/runs/axes.py, times the seeds) and the per-cell run (one RunConfig -> one row
of knobs and summary metrics); sim/app/reports/sweep_page.py writes the rows as
sweep.csv. Every cell replays the same seeded workload (common random numbers): for one
seed, every cell sees the same request lengths and the same arrival draws (a different
rate only rescales the gaps), so differences between cells are the knobs', not the
dice's. Cells run in worker processes (sim/app/runs/backends.py); rows come back in grid
order, so reruns with the same seeds give byte-identical rows.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from scenarios.trace_cache import PROCESS_CACHE
from sim.app.runs.axes import AGGREGATED, AXES, LOAD_AXES
from sim.app.runs.backends import map_ordered
from sim.app.runs.config_file import absolute_paths
from sim.app.runs.pools import DISAGG_FIELDS
from sim.app.runs.runner import (
    RunConfig,
    check_config,
    check_router,
    check_workload,
    prefix_cache_mode,
    prepare,
    simulate_prepared,
)
from sim.app.runs.startup_checks import Refused
from sim.engine import SchedulerStuck
from sim.latency_stats import meets_slos

METRICS = (
    "offered_rate", "num_requests", "num_finished", "num_rejected", "num_gpus",
    "throughput_rps", "output_tokens_per_s", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
    "ttft_p99_s", "tpot_mean_s", "tpot_p50_s", "tpot_p99_s", "itl_p99_s", "e2e_mean_s",
    "e2e_p50_s", "e2e_p99_s", "queued_mean_s", "queued_p99_s", "goodput_rps",
    "slo_attainment", "num_preemptions", "kv_peak_usage", "kv_mean_usage",
    "mean_batch_seqs", "prefix_hit_rate", "saturated",
)
"""sweep.csv's metric columns, after cell, seed and the axes (seconds, requests/s)."""


def parse_values(name: str, text: str,
                 parser: Callable[[str], Any] | None = None) -> tuple[Any, ...]:
    """``"16,32,64"`` -> ``(16, 32, 64)`` typed for axis ``name`` (or by ``parser``);
    ValueError naming the axis for an empty list, a bad value or a repeated one."""
    parser = parser or AXES[name]
    parts = [p.strip() for p in text.split(",")]
    if not any(parts) or "" in parts:
        raise ValueError(f"{name}: expected comma-separated values, got {text!r}")
    try:
        values = tuple(parser(p) for p in parts)
    except ValueError as e:
        raise ValueError(f"{name}: {text!r} is not a list of {parser.__name__} ({e})") from e
    if len(set(values)) != len(values):
        raise ValueError(f"{name}: repeated value in {text!r}")
    return values


@dataclass(frozen=True)
class Grid:
    """The axes given (in AXES order) and the seeds; cells = product of the axes."""

    axes: dict[str, tuple[Any, ...]]
    seeds: tuple[int, ...] = (0,)

    @classmethod
    def parse(cls, values: dict[str, str | None], seeds: str = "0") -> Grid:
        """From the CLI's strings (None = axis not swept). ValueError on bad input, or
        when both load axes (rate and concurrency) are given."""
        unknown = set(values) - set(AXES)
        if unknown:
            raise ValueError(f"unknown sweep axis: {', '.join(sorted(unknown))}")
        given = {n: v for n, v in values.items() if v is not None}
        axes = {n: parse_values(n, given[n]) for n in AXES if n in given}
        if all(a in axes for a in LOAD_AXES):
            raise ValueError("sweep rate (open loop) or concurrency (closed loop), not both")
        seed_values = parse_values("seeds", seeds, int)
        if any(s < 0 for s in seed_values):
            raise ValueError(f"seeds must be integers >= 0, got {seeds!r}")
        return cls(axes, seed_values)

    @property
    def load_axis(self) -> str | None:
        return next((a for a in LOAD_AXES if a in self.axes), None)

    def cells(self) -> list[dict[str, Any]]:
        names = list(self.axes)
        return [dict(zip(names, combo, strict=True))
                for combo in itertools.product(*(self.axes[n] for n in names))]


def grid_base(opts: dict[str, Any], grid: Grid) -> RunConfig:
    """The base RunConfig of a sweep's or plan's run options ``opts`` (the axes taken
    out). With a disagg axis, the base takes the axis's first xPyD value, so that the
    pool and link options given (DISAGG_FIELDS) are checked once and reach every
    disaggregated cell; aggregated cells drop them (cell_config). ValueError as
    RunConfig."""
    pools = [v for v in grid.axes.get("disagg", ()) if v != AGGREGATED]
    return RunConfig(**opts, **({"disagg": pools[0]} if pools else {}))


def cell_config(base: RunConfig, knobs: dict[str, Any], **fields: Any) -> RunConfig:
    """``base`` with one cell's axis values and ``fields`` (RunConfig fields, set in the
    same step); a disagg axis's "none" makes the cell an aggregated run, without the
    base's pool and link options. ValueError for knobs that make no valid config."""
    if knobs.get("disagg") == AGGREGATED:
        knobs = {**knobs, "disagg": None, **dict.fromkeys(DISAGG_FIELDS)}
    return dataclasses.replace(base, **fields, **knobs)


@dataclass(frozen=True)
class CellTask:
    """One simulation: a cell of the grid under one seed. ``error``: why its config could
    not even be built (``config`` is then the base's), for an error row."""

    cell: int
    seed: int
    knobs: dict[str, Any]
    config: RunConfig
    error: str = ""


def cell_tasks(base: RunConfig, grid: Grid, think_time: float = 0.0) -> list[CellTask]:
    """Every (cell, seed) in grid order, seeds innermost. A rate axis over a trace re-times
    it by Poisson arrivals unless the base names another process; ``think_time`` (s) goes
    to every cell (closed-loop cells only). A cell whose knobs make no valid config
    (concurrency 0) carries the error instead."""
    if "rate" in grid.axes and base.trace is not None and base.arrival is None:
        bursty = "burstiness" in grid.axes or base.burstiness is not None
        base = dataclasses.replace(base, arrival="gamma" if bursty else "poisson")
    if "concurrency" in grid.axes:
        base = dataclasses.replace(base, rate=None)
    tasks = []
    for i, knobs in enumerate(grid.cells()):
        for s in grid.seeds:
            try:
                cfg, error = cell_config(base, knobs, seed=s, think_time=think_time), ""
            except ValueError as e:
                cfg, error = base, str(e)
            tasks.append(CellTask(i, s, knobs, cfg, error))
    return tasks


def metrics_row(summary: dict[str, Any], requests: pd.DataFrame, cfg: RunConfig,
                offered_rate: float | None) -> dict[str, Any]:
    """The METRICS of one run."""
    thr = summary["throughput"]
    row: dict[str, Any] = {
        "offered_rate": offered_rate,
        "num_requests": summary["num_requests"], "num_finished": summary["num_finished"],
        "num_rejected": summary["num_rejected"],
        "num_gpus": cfg.num_gpus,
        "throughput_rps": thr["requests_per_s"], "output_tokens_per_s": thr["output_tokens_per_s"],
    }
    for key, name in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("e2e_latency_s", "e2e"),
                      ("queued_time_s", "queued"), ("itl_s", "itl")):
        st = summary[key]
        for stat in ("mean", "p50", "p90", "p99"):
            col = f"{name}_{stat}_s"
            if col in METRICS:
                row[col] = st[stat]
    row["goodput_rps"] = summary["goodput_requests_per_s"]
    row["slo_attainment"] = slo_attainment(requests, cfg.slo_ttft, cfg.slo_tpot)
    row["num_preemptions"] = summary["num_preemptions"]
    row["kv_peak_usage"] = summary["kv_cache"]["peak_usage"]
    row["kv_mean_usage"] = summary["kv_cache"]["mean_usage"]
    row["mean_batch_seqs"] = summary["batch"]["mean_num_seqs"]
    cache = summary.get("prefix_cache")  # none in a disaggregated run's summary
    row["prefix_hit_rate"] = cache["hit_rate_tokens"] if cache is not None else None
    row["saturated"] = bool(summary["saturated"])
    return row


def slo_attainment(requests: pd.DataFrame, slo_ttft_s: float | None,
                   slo_tpot_s: float | None) -> float | None:
    """Fraction of all requests (rejected ones count as misses) meeting every SLO given;
    None without SLOs."""
    if slo_ttft_s is None and slo_tpot_s is None:
        return None
    if len(requests) == 0:
        return 0.0
    ok = meets_slos(requests["ttft_s"].to_numpy(), requests["tpot_s"].to_numpy(),
                    slo_ttft_s, slo_tpot_s)
    return float(ok.mean())


def offered_rate_of(prep: Any) -> float | None:
    """Requests/s the workload offers (open loop): (n - 1) / arrival span; None for a
    closed loop or a single instant."""
    if prep.config.concurrency is not None:
        return None
    t = prep.workload.arrival_time
    span = float(t[-1] - t[0]) if len(t) else 0.0
    return (len(t) - 1) / span if span > 0 else None


def run_cell(task: CellTask) -> dict[str, Any]:
    """Simulate one cell (in a worker); its row: cell, seed, knobs, METRICS, error. A
    config that cannot run (weights that do not fit, a stuck scheduler) gives a row with
    its error and no metrics rather than stopping the sweep."""
    head: dict[str, Any] = {"cell": task.cell, "seed": task.seed, **task.knobs}
    try:
        if task.error:
            raise ValueError(task.error)
        prep = prepare(task.config)
        result = simulate_prepared(prep)
    except (ValueError, FileNotFoundError, SchedulerStuck) as e:
        return {**head, **dict.fromkeys(METRICS), "error": str(e)}
    row = metrics_row(result.summary, result.requests, task.config, offered_rate_of(prep))
    return {**head, **row, "error": ""}


def run_sweep(base: RunConfig, grid: Grid, *, workers: int | None = None,
              backend: str = "local", address: str | None = None,
              on_done: Callable[[int], None] | None = None,
              think_time: float = 0.0) -> pd.DataFrame:
    """Every cell of ``grid`` on ``base``; one row per (cell, seed), in grid order.

    Every cell is checked first (check_cells), so input errors common to every cell (a
    missing trace, an unknown model) fail at once with one ValueError instead of once
    per cell, while a cell of its own that cannot run gives an error row.
    """
    base, shipment = driver_inputs(base, backend)
    tasks = cell_tasks(base, grid, think_time)
    check_cells(base, grid, think_time=think_time)
    rows = map_ordered(run_cell, tasks, workers=workers, backend=backend, address=address,
                       on_done=on_done, shipment=shipment)
    columns = ["cell", "seed", *grid.axes, *METRICS, "error"]
    return pd.DataFrame(rows, columns=columns)


def driver_inputs(cfg: RunConfig, backend: str) -> tuple[RunConfig, dict[Any, Any]]:
    """``cfg`` with its files as absolute paths, as this process (the driver) finds them,
    so that a worker in another directory reads the same files; and, for the ray
    backend, the parsed trace for its workers (Executor's shipment; empty otherwise),
    read here once. FileNotFoundError or ValueError for a trace that cannot be read."""
    assert cfg.model is not None and cfg.gpu is not None, "RunConfig resolves them"
    cfg = dataclasses.replace(cfg, **absolute_paths(cfg.trace, cfg.profile, cfg.policy,
                                                    cfg.model, cfg.gpu))
    if backend != "ray" or cfg.trace is None:
        return cfg, {}
    return cfg, PROCESS_CACHE.ship(cfg.trace, cfg.trace_format, tokenizer=cfg.tokenizer)


def check_cells(base: RunConfig, grid: Grid,
                at_load: Callable[[RunConfig], RunConfig] | None = None,
                think_time: float = 0.0, skip_refused: bool = False) -> None:
    """Before anything runs: check_router_cells (a router that needs a cache refuses a
    prefix_cache axis holding none), then runner.check_config on the config each cell
    runs (as cell_tasks builds it, at its first seed; ``at_load`` gives a plan's cell at
    the load it starts from), each distinct load's workload built once. A cell that vLLM
    refuses at start-up (startup_checks.Refused) refuses the sweep, naming the cell,
    unless ``skip_refused`` (a plan skips such a candidate). Any other cell that cannot
    run is left to run and report its error (sweep.csv's ``error``, the plan's note);
    when no cell can, raise the first one's ValueError, prefixed with its knobs when
    there are several cells."""
    check_router_cells(base, grid)
    workloads: dict[tuple[Any, ...], str | None] = {}  # a load's workload error, if any
    first, runnable = None, False
    tasks = cell_tasks(base, dataclasses.replace(grid, seeds=grid.seeds[:1]), think_time)
    for task in tasks:
        where = ", ".join(f"{k} {v}" for k, v in task.knobs.items())
        try:
            error = _cell_error(task, at_load, None if runnable else workloads)
        except Refused as e:
            if not skip_refused:
                raise Refused(f"sweep cell {where}: {e}" if where else str(e)) from None
            error = str(e)
        runnable = runnable or error is None
        if error is not None:
            first = first or (f"{where}: {error}" if len(tasks) > 1 else error)
    if not runnable and first is not None:
        raise ValueError(first if len(tasks) == 1 else f"no cell can run; the first: {first}")


def _cell_error(task: CellTask, at_load: Callable[[RunConfig], RunConfig] | None,
                workloads: dict[tuple[Any, ...], str | None] | None) -> str | None:
    """Why ``task``'s cell cannot run (None when it can); its load's workload is built
    once into ``workloads`` (None: the workload is not checked, a cell already runs).
    Raises Refused for a cell vLLM refuses at start-up."""
    key = tuple(task.knobs.get(k) for k in ("rate", "concurrency", "burstiness"))
    try:
        if task.error:
            return task.error
        cfg = check_config(at_load(task.config) if at_load else task.config, workload=False)
        if workloads is None:
            return None
        if key not in workloads:
            try:
                check_workload(cfg)
                workloads[key] = None
            except (ValueError, FileNotFoundError) as e:
                workloads[key] = str(e)
        return workloads[key]
    except Refused:
        raise
    except (ValueError, FileNotFoundError) as e:
        return str(e)


def check_router_cells(base: RunConfig, grid: Grid) -> None:
    """``check_router`` for every prefix cache a cell of ``grid`` may have (its axis, or
    the base's), before anything runs, on the base as an aggregated run (a disaggregated
    cell that cannot take a cache is that cell's own error); ValueError naming the axis."""
    aggregated: dict[str, Any] = {"disagg": None, **dict.fromkeys(DISAGG_FIELDS)}
    base = dataclasses.replace(base, **aggregated)
    for mode in grid.axes.get("prefix_cache", (base.prefix_cache,)):
        try:
            cfg = dataclasses.replace(base, prefix_cache=mode)
            try:
                check_router(cfg, mode or "none")
            except ValueError:  # a router that needs a cache: has the default one?
                check_router(cfg, mode or prefix_cache_mode(cfg, check_workload(cfg)))
        except ValueError as e:
            raise ValueError(f"prefix_cache {mode!r}: {e}") from None


def aggregate(df: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    """Mean of every metric over seeds per cell (saturated: any seed; errors: the first)."""
    ok = df[df["error"] == ""]
    if ok.empty:
        return ok
    keys = ["cell", *axes]
    numeric = [m for m in METRICS if m != "saturated"]
    agg = ok.groupby(keys, sort=False)[numeric].mean(numeric_only=False).reset_index()
    sat = ok.groupby(keys, sort=False)["saturated"].any().reset_index(drop=True)
    agg["saturated"] = sat.to_numpy()
    agg["seeds"] = ok.groupby(keys, sort=False)["seed"].count().to_numpy()
    return agg
