"""``servesim sweep`` and ``servesim plan``: the capacity commands. The work is in
sim/app/runs/sweep.py and sim/app/runs/plan.py (across GPU types:
sim/app/runs/gpu_ranking.py), the pages in sim/app/reports/sweep_page.py,
sim/app/reports/plan_page.py and sim/app/reports/gpu_ranking_page.py."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sim.app.cli.common import INPUT_ERRORS, ProgressDisplay, console, fail, progress_bar, warn
from sim.app.cli.option_values import config_options, given_options
from sim.app.cli.options import (
    CHUNKED_SWITCH,
    CONFIG_OPTION,
    GOODPUT_OPTION,
    OPTIONS,
    PREFIX_SWITCH,
    declare,
    seeds,
    with_options,
)
from sim.app.cli.plan_input import gpu_specs, plan_spec
from sim.app.runs.axes import AUTO_DISAGG, AXES, PLAN_AXES

#: --disagg as a sweep axis: aggregated and xPyD cells side by side.
SWEEP_DISAGG = {"help": "Prefill/decode disaggregation per cell: none (aggregated) or "
                "xPyD, comma-separated (none,1P1D,1P2D); the --kv-link and pool options "
                "apply to the xPyD cells (docs/disaggregation.md)."}

#: --disagg as a plan axis; auto: AUTO_DISAGG.
PLAN_DISAGG = {"help": "Plan prefill/decode disaggregation beside aggregated serving: "
               "none or xPyD pool ratios, comma-separated, each scaled to the target as "
               "a unit; auto: " + ",".join(AUTO_DISAGG) + " (docs/disaggregation.md)."}


@with_options(
    *declare([n for n in OPTIONS if n != "seed"], axes=AXES, disagg=SWEEP_DISAGG),
    seeds("0", "every cell replays each seed's workload."), PREFIX_SWITCH, CHUNKED_SWITCH,
    GOODPUT_OPTION, CONFIG_OPTION)
def sweep(
    ctx: typer.Context,
    workers: Annotated[int | None, typer.Option(
        help="Worker processes (default: one per CPU).")] = None,
    backend: Annotated[str, typer.Option(help="local (process pool) or ray.")] = "local",
    address: Annotated[str | None, typer.Option(
        help="Ray cluster address to join (--backend ray).")] = None,
    out: Annotated[Path, typer.Option(help="Directory for sweep.csv and sweep.html.")] =
        Path("runs/sweep"),
    **opts: Any,
) -> None:
    """Run a grid of what-if cells (every combination of the comma-separated values) on
    the same seeded workload, in parallel; write sweep.csv, sweep.json, frontier.csv (the
    Pareto frontier of output tokens/s per GPU against per user) and sweep.html."""
    from sim.app.reports.sweep_page import write_sweep
    from sim.app.runs.out_dir import check_files
    from sim.app.runs.sweep import Grid, check_cells, grid_base, run_sweep

    opts = config_options(ctx, opts, AXES)
    try:
        grid = Grid.parse({a: opts.pop(a) for a in AXES}, opts.pop("seeds"))
        think_time = opts.pop("think_time")  # closed-loop cells only: given to each cell
        base = grid_base(opts, grid)
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        check_cells(base, grid, think_time=think_time)
        check_files(out, ("sweep.csv", "sweep.json", "frontier.csv", "sweep.html"))
    except INPUT_ERRORS as e:
        fail(str(e))
    n = len(grid.cells()) * len(grid.seeds)
    console.print(f"sweep: {len(grid.cells())} cells x {len(grid.seeds)} seed(s) = {n} runs "
                  f"({backend} backend)")
    start = time.perf_counter()
    try:
        with progress_bar() as bar:
            task = bar.add_task("simulating", total=n, unit="runs")
            df = run_sweep(base, grid, workers=workers, backend=backend, address=address,
                           on_done=lambda k: bar.update(task, completed=k),
                           think_time=think_time)
        elapsed = time.perf_counter() - start
        failed = df["error"] != ""
        if failed.all():  # nothing to show: say why instead of writing empty results
            raise ValueError(f"every run failed; the first: {df['error'].iloc[0]}")
        paths = write_sweep(out, df, base, grid, elapsed)
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(sweep_table(df, list(grid.axes)))
    console.print(f"{n} runs in {elapsed:,.1f} s; wrote " + ", ".join(str(p) for p in paths))


def _percent(x: float | None) -> str:
    """A fraction as a percentage; "-" for none (None or NaN: a run without a cache)."""
    return "-" if x is None or math.isnan(x) else f"{x:.1%}"


def sweep_table(df: Any, axes: list[str], limit: int = 60) -> Table:
    """Mean over seeds per cell: throughput, p99 latencies, saturation."""
    from sim.app.runs.sweep import aggregate

    agg = aggregate(df, axes)
    hits = "prefix_cache" in axes
    t = Table(title="sweep (mean over seeds)", header_style="bold")
    for c in (*axes, "req/s", "TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p99 (ms)",
              *(["prefix hit rate"] if hits else []), "saturated"):
        t.add_column(c, justify="right")
    for row in agg.head(limit).itertuples(index=False):
        r = row._asdict()
        hit = r["prefix_hit_rate"]
        t.add_row(*(str(r[a]) for a in axes), f"{r['throughput_rps']:.3f}",
                  f"{r['ttft_p50_s'] * 1e3:,.1f}", f"{r['ttft_p99_s'] * 1e3:,.1f}",
                  f"{r['tpot_p99_s'] * 1e3:,.1f}",
                  *([_percent(hit)] if hits else []),
                  "[bold red]YES[/bold red]" if r["saturated"] else "no")
    errors = int((df["error"] != "").sum())
    if errors:
        t.caption = f"{errors} run(s) failed: see the error column of sweep.csv"
    if len(agg) > limit:
        t.caption = (t.caption or "") + f" (first {limit} of {len(agg)} cells shown)"
    return t


#: The files a plan writes.
PLAN_FILES = ("capacity.md", "capacity.html", "plan.json", "vllm_serve.yaml")

#: Run options a plan sets itself: each probe's load and arrivals (Poisson or gamma at a
#: searched rate, the trace's own arrivals time-scaled to it (plan's own --arrival), or
#: a searched number of users), the replicas of its cluster check, and the seeds (--seeds).
PLAN_SETS = ("arrival", "rate", "concurrency", "think_time", "time_scale", "replicas",
             "seed")


@with_options(
    *declare([n for n in OPTIONS if n not in PLAN_SETS], axes=PLAN_AXES,
             trace={"help": "Trace to plan for (re-timed by the probes, or its own timing "
                            "with --arrival trace): servesim CSV, Azure 2023 CSV or "
                            "Mooncake JSONL."},
             burstiness={"help": "Plan for gamma arrivals of this shape k instead of "
                                 "Poisson (CV = 1/sqrt(k))."},
             num_requests={"default": 2000, "help": "Requests per re-timed probe (the cost "
                           "and the precision of every probe); a trace-timed probe "
                           "replays the whole trace or its --window."},
             window={"help": "Plan on the trace's arrivals within this many seconds of "
                             "its first (both timings)."},
             # plan sets the arrival process itself (--arrival poisson or trace)
             diurnal_amplitude={"hidden": True}, disagg=PLAN_DISAGG),
    seeds("0,1,2", "each probe runs on every seed; the capacity interval spans them."),
    PREFIX_SWITCH, CHUNKED_SWITCH, GOODPUT_OPTION, CONFIG_OPTION)
def plan(
    ctx: typer.Context,
    slo_percentile: Annotated[float, typer.Option(
        help="Percentile the SLOs apply at.")] = 99.0,
    target_rate: Annotated[float | None, typer.Option(
        help="Total arrival rate to serve (req/s): sizes and checks the cluster.")] = None,
    target_concurrency: Annotated[int | None, typer.Option(
        help="Total closed-loop users to serve (with --load concurrency).")] = None,
    load: Annotated[str, typer.Option(
        help="Load axis to search: rate (open loop) or concurrency (closed loop)."
    )] = "rate",
    arrival: Annotated[str, typer.Option(
        help="How a rate probe reaches its rate: poisson re-times the requests (gamma "
             "with --burstiness); trace replays the trace's own arrivals in order, "
             "time-scaled to the rate, its bursts and swings kept. The report checks the "
             "answer under the other too.")] = "poisson",
    start: Annotated[float, typer.Option(help="First load probed (req/s or users).")] = 1.0,
    tolerance: Annotated[float, typer.Option(
        help="Bisect until the bracket is within this fraction.")] = 0.02,
    max_probes: Annotated[int, typer.Option(help="Most probes per search.")] = 16,
    check_requests: Annotated[int | None, typer.Option(
        help="Requests per re-timed cluster check (default num_requests x replicas).")
    ] = None,
    workers: Annotated[int | None, typer.Option(help="Worker processes.")] = None,
    backend: Annotated[str, typer.Option(help="local or ray.")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster to join.")] = None,
    out: Annotated[Path, typer.Option(help="Directory for the capacity report.")] =
        Path("runs/plan"),
    price_file: Annotated[Path | None, typer.Option(
        help="JSON prices in US dollars per GPU-hour over the shipped table "
             "(calibration/data/gpu_prices.json): its form, or {\"GPU\": USD, ...}.")] = None,
    price: Annotated[list[str] | None, typer.Option(
        help="GPU=USD_PER_HOUR, over the table and --price-file (repeatable).")] = None,
    by_window: Annotated[str | None, typer.Option(
        help="Also give the replicas each window of the trace needs (1h, 30m, 900 s): "
             "the peak, the mean, and GPU-hours following the load against the peak's."
    )] = None,
    **opts: Any,
) -> None:
    """Find the load one replica sustains within the SLOs, the best engine config of the
    grid and the replicas (GPUs) a target needs, confirmed by a cluster simulation; write
    capacity.md, capacity.html, plan.json and vllm_serve.yaml. With several --gpu types
    (a,b,c) or a price, plan each type and rank them by $/hour at the target."""
    from sim.app.reports.by_window_page import summary_lines
    from sim.app.reports.plan_page import answer_lines, write_plan
    from sim.app.runs.backends import Executor
    from sim.app.runs.by_window import load_over_day, window_seconds
    from sim.app.runs.out_dir import check_files
    from sim.app.runs.plan import run_plan
    from sim.app.runs.sweep import driver_inputs

    search = {"slo_percentile": slo_percentile, "target_rate": target_rate,
              "target_concurrency": target_concurrency, "load": load, "start": start,
              "tolerance": tolerance, "max_probes": max_probes,
              "check_requests": check_requests, "arrival": arrival}
    opts = config_options(ctx, opts, PLAN_AXES)
    _warn_unused_with_trace_timing(ctx, arrival)
    gpus: list[str | None] = ([g.strip() for g in opts["gpu"].split(",")] if opts["gpu"]
                              else [None])
    if len(gpus) > 1 or price_file is not None or price:
        if by_window is not None:
            fail("--by-window plans one GPU type: give one --gpu and no price")
        own = [f for f in ("prefill_gpu", "decode_gpu") if opts.get(f) is not None]
        if own:
            fail(f"--{own[0].replace('_', '-')} gives a pool another GPU, which a price "
                 "ranking of GPU types would price as the ranked type: give one --gpu and "
                 "no price")
        plan_gpu_types(opts, search, gpus, (price_file, price or []),
                       (workers, backend, address), out)
        return
    try:
        spec = plan_spec(opts, search)
        window_s = window_seconds(spec, by_window)
        executor = Executor(workers, backend, address, driver_inputs(spec.base, backend)[1])
        check_files(out, PLAN_FILES)
    except INPUT_ERRORS as e:
        fail(str(e))
    probes = (f" x {len(spec.grid.seeds)} seed(s), {spec.base.num_requests:,} requests per "
              "probe" if spec.arrival != "trace" else f", the trace's own timing "
              f"({spec.trace.num_requests:,} requests per probe, one seed)")
    console.print(f"plan: {len(spec.grid.cells())} config(s){probes}, "
                  f"SLO {spec.slo.describe()}")
    t0 = time.perf_counter()
    try:
        with progress_bar() as bar, executor as ex:
            res = run_plan(spec, runner := bar_runner(ex, bar), ex.parallelism)
            windows = (load_over_day(spec, res.best, window_s, runner)
                       if window_s is not None and res.best is not None else None)
        res.elapsed_s = time.perf_counter() - t0
        paths = write_plan(out, res, windows)
    except INPUT_ERRORS as e:
        fail(str(e))
    for line in answer_lines(res) + (summary_lines(windows) if windows else []):
        console.print("- " + rich_line(line), highlight=False)
    console.print(f"planned in {res.elapsed_s:,.1f} s; wrote " + ", ".join(map(str, paths)))


def _warn_unused_with_trace_timing(ctx: typer.Context, arrival: str) -> None:
    """One warning line naming the options given that a trace-timed plan does not use:
    its probes replay the whole trace (or its --window) in order, on one seed."""
    if arrival != "trace":
        return
    names = ("num_requests", "trace_sample", "check_requests")
    given = given_options(ctx, names)
    unused = ["--" + n.replace("_", "-") for n in names if n in given]
    if unused:
        warn(f"{', '.join(unused)} shape re-timed probes only: --arrival trace replays the "
             "whole trace in order (cut it with --window)")


PHASES = {"search_probe": "searching load per config and seed",
          "run_probe": "simulating probes",
          "run_loop": "open vs closed loop"}


def bar_runner(ex: Any, bar: ProgressDisplay
                ) -> Callable[[Callable[[Any], Any], list[Any]], list[Any]]:
    task = bar.add_task("planning", total=1)

    def runner(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        bar.reset(task, total=len(items),
                  description=PHASES.get(getattr(fn, "__name__", ""), "running"))
        return list(ex.map(fn, items, lambda k: bar.update(task, completed=k)))
    return runner


def rich_line(markdown_line: str) -> str:
    """**bold** -> rich bold markup (the rest escaped)."""
    from rich.markup import escape

    out = escape(markdown_line)
    while out.count("**") >= 2:
        out = out.replace("**", "[bold]", 1).replace("**", "[/bold]", 1)
    return out


def plan_gpu_types(opts: dict[str, Any], search: dict[str, Any], gpus: list[str | None],
                   prices_given: tuple[Path | None, list[str]],
                   executor_args: tuple[int | None, str, str | None], out: Path) -> None:
    """Plan every GPU type of ``gpus`` with the plan command's options, rank them and
    write the report into ``out``; one line and exit 1 on bad input."""
    from sim.app.reports.gpu_ranking_page import answer_lines, write_gpu_ranking
    from sim.app.runs.backends import Executor
    from sim.app.runs.gpu_ranking import GpuPlan, mean_output_tokens, ranked
    from sim.app.runs.out_dir import check_files
    from sim.app.runs.plan import run_plan
    from sim.app.runs.prices import price_table
    from sim.app.runs.sweep import driver_inputs

    try:
        prices = price_table(*prices_given)
        specs, errors = gpu_specs(opts, search, gpus)
        if len(gpus) > 1 and search["target_rate"] is search["target_concurrency"] is None:
            raise ValueError("--gpu with several GPU types ranks them by the cost of the fleet "
                             "at a target: give --target-rate (or --target-concurrency)")
        first = next(iter(specs.values()))
        executor = Executor(*executor_args, driver_inputs(first.base, executor_args[1])[1])
        check_files(out, PLAN_FILES)
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(f"plan: {len(specs)} GPU type(s) ({', '.join(specs)}), "
                  f"{len(first.grid.cells())} config(s) each, SLO {first.slo.describe()}")
    t0 = time.perf_counter()
    try:
        with progress_bar() as bar, executor as ex:
            runner = bar_runner(ex, bar)
            plans = []
            for gpu, spec in specs.items():
                t1 = time.perf_counter()
                res = run_plan(spec, runner, ex.parallelism)
                res.elapsed_s = time.perf_counter() - t1
                plans.append(GpuPlan(gpu, res, prices.get(gpu), mean_output_tokens(spec, res)))
        plans += [GpuPlan(g, None, prices.get(g), error=e) for g, e in errors.items()]
        ranking = ranked(plans, prices, time.perf_counter() - t0)
        paths = write_gpu_ranking(out, ranking)
    except INPUT_ERRORS as e:
        fail(str(e))
    for line in answer_lines(ranking):
        console.print("- " + rich_line(line), highlight=False)
    console.print(f"planned in {ranking.elapsed_s:,.1f} s; wrote " + ", ".join(map(str, paths)))
