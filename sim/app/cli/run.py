"""The ``run``, ``report`` and ``list`` commands: one simulation (or a ``--compare`` of
several) into a run directory with its terminal tables, the HTML report of run
directories, and the known presets. Heavy or optional imports (plotly) stay inside the
commands that use them."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sim.app.cli.common import (
    INPUT_ERRORS,
    ProgressDisplay,
    console,
    fail,
    progress_bar,
    warn,
)
from sim.app.cli.option_values import config_options
from sim.app.cli.options import (
    CHUNKED_SWITCH,
    CONFIG_OPTION,
    GOODPUT_OPTION,
    OPTIONS,
    PREFIX_SWITCH,
    declare,
    with_options,
)
from sim.app.cli.tables import headline_table, replica_table, scale_out_line, summary_table


@with_options(*declare(OPTIONS), PREFIX_SWITCH, CHUNKED_SWITCH, GOODPUT_OPTION,
              CONFIG_OPTION)
def run(
    ctx: typer.Context,
    compare: Annotated[str | None, typer.Option(
        help="Run the same workload through several cells, POLICY[:MODIFIER]... separated "
             "by commas (e.g. static,continuous,chunked or chunked:paged,chunked:reserve); "
             "one run directory per cell under --out.")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Run directory to write [default: runs/latest; with --compare, the directory "
             "for the cells' run directories, runs/compare].")] = None,
    full_steps: Annotated[bool, typer.Option(
        "--full-steps", help="One steps.csv row per step (default: identical consecutive "
        "steps share a row, with num_steps).")] = False,
    report: Annotated[bool, typer.Option(
        "--report", help="Also write report.html (see `servesim report`) into --out.")] = False,
    bench_result: Annotated[bool, typer.Option(
        "--bench-result", help="Also write bench_result.json: the result in the keys and "
        "units of `vllm bench serve --save-result` (docs/outputs.md).")] = False,
    chrome_trace: Annotated[bool, typer.Option(
        "--chrome-trace", help="Also write chrome_trace.json: steps, queue and running "
        "counts, KV cache usage and request spans, for Perfetto or chrome://tracing (with "
        "--disagg: a process per engine, the TTFT split's phases and the KV link's "
        "transfers).")
    ] = False,
    parquet: Annotated[bool, typer.Option(
        "--parquet", help="Also write requests.parquet and steps.parquet (every step a "
        "row; needs pyarrow).")] = False,
    parallel_windows: Annotated[str | None, typer.Option(
        help="Replay the arrivals in windows of this length (e.g. 1h), each simulated "
             "on a worker after a warm-up, their records merged (docs/scale.md).")] = None,
    warmup: Annotated[str | None, typer.Option(
        help="--parallel-windows: the arrivals before each window replayed first, their "
             "records dropped (e.g. 10m; default 5m).")] = None,
    backend: Annotated[str | None, typer.Option(
        help="--parallel-windows: where windows run, local (processes) or ray "
             "[default: local].")] = None,
    workers: Annotated[int | None, typer.Option(
        help="--parallel-windows: local worker processes [default: one per CPU].")] = None,
    **opts: Any,
) -> None:
    """Simulate one engine on a workload and write requests.csv, steps.csv, summary.json
    and config.json to --out. One engine's records are streamed to --out as the run goes,
    so memory does not grow with the requests; --replicas above 1, --bench-result,
    --chrome-trace and --parquet hold every record in memory (docs/performance.md)."""
    from sim.app.runs.extra_outputs import Extras
    from sim.app.runs.runner import RunConfig, prepare

    opts = config_options(ctx, opts)
    extras = Extras(bench_result, chrome_trace, parquet)
    try:
        windows = _windows(parallel_windows, warmup, backend, workers, compare)
        cells, base = _cells(compare, opts)
        _check_extras(extras, cells)
        cfg = RunConfig(**base)
        out = out or Path("runs/compare" if cells is not None else "runs/latest")
        _check_out(cfg, cells, out, report)
        prep = prepare(cfg)
        if windows is not None:
            prep = windows.labelled(prep)
    except INPUT_ERRORS as e:
        fail(str(e))
    _print_engine(prep)
    if cells is not None:
        _compare(cfg, prep, cells, out)
        if report:  # one report over every cell
            _write_report([out / c.dir_name for c in cells], out / "report.html")
        return
    _single(prep, out, full_steps, extras, windows)
    if report:
        _write_report([out], out / "report.html")


def _cells(compare: str | None, opts: dict[str, Any]
           ) -> tuple[list[Any] | None, dict[str, Any]]:
    """--compare's cells and the options of the config they share
    (sim/app/runs/compare.py base_options); None and ``opts`` without --compare, which
    then never imports compare's module."""
    if compare is None:
        return None, opts
    from sim.app.runs.compare import base_options, parse_cells

    cells = parse_cells(compare)
    return cells, base_options(opts, cells)


def _windows(parallel_windows: str | None, warmup: str | None, backend: str | None,
             workers: int | None, compare: str | None) -> Any:
    """The --parallel-windows settings (sim/app/runs/window_replay.py), None without it;
    ValueError for a bad one, a window option without it, or it with --compare."""
    if parallel_windows is None:
        given = [f for f, v in (("--warmup", warmup), ("--backend", backend),
                                ("--workers", workers)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} applies only with --parallel-windows")
        return None
    if compare is not None:
        raise ValueError("--parallel-windows replays one run: give it without --compare")
    from sim.app.runs.window_replay import WindowSettings

    return WindowSettings.parse(parallel_windows, warmup, backend, workers)


def _check_out(cfg: Any, cells: list[Any] | None, out: Path, report: bool) -> None:
    """Refuse (ValueError) what would fail only after simulating: a compare cell's config
    (vLLM's start-up checks on its own engine) or run directory, a run directory where
    compare writes cells, a report that may not be written, the router of a single run,
    a directory that is not a previous run. Prints compare's note on a budget that a
    static cell does not take."""
    from sim.app.runs.out_dir import check_files, check_run_dir, is_run_dir
    from sim.app.runs.runner import check_router

    if cells is not None:
        from sim.app.runs.compare import budget_note, check_cell

        for c in cells:  # every cell checked before any output
            check_cell(cfg, c)
            check_run_dir(out / c.dir_name)
        if (note := budget_note(cfg, cells)) is not None:
            warn(note)
    if cells is not None and is_run_dir(out):
        raise ValueError(f"--out: {out} is a run directory; --compare writes a run "
                         "directory per cell under --out: give another")
    if cells is not None and report:
        check_files(out, ("report.html",))
    if cells is None:
        check_router(cfg)
        check_run_dir(out)


def _check_extras(extras: Any, cells: list[Any] | None) -> None:
    """Refuse (ValueError) optional files that cannot be written: any with --compare,
    Parquet without pyarrow."""
    from sim.app.runs.extra_outputs import parquet_missing

    if cells is not None and extras.file_names():
        raise ValueError("--bench-result, --chrome-trace and --parquet write one run's "
                         "files: give them without --compare")
    if extras.parquet and (reason := parquet_missing()):
        raise ValueError(reason)


def _print_engine(prep: Any) -> None:
    """The workload, the cost model (and its warnings) and the KV capacity, before the
    run."""
    cfg, bs = prep.config, prep.config.block_size
    console.print(f"workload: {len(prep.workload):,} requests ({prep.workload.source})")
    console.print(f"cost model: {prep.cost_model_label}")
    for line in (*prep.workload.notes, *prep.warnings):
        warn(line)
    console.print(f"# GPU blocks: {prep.num_gpu_blocks:,}; GPU KV cache size: "
                  f"{prep.num_gpu_blocks * bs:,} tokens")
    console.print(f"Maximum concurrency for {prep.scheduler.max_model_len:,} tokens per "
                  f"request: {prep.num_gpu_blocks * bs / prep.scheduler.max_model_len:.2f}x")
    if cfg.replicas > 1 or cfg.tensor_parallel_size > 1 or cfg.concurrency is not None:
        console.print(scale_out_line(cfg))


def _single(prep: Any, out: Path, full_steps: bool, extras: Any,
            windows: Any = None) -> None:
    """Simulate the one run (in ``windows``, a WindowSettings, when given), write its
    directory (with ``extras``' files) and print its tables."""
    from sim.app.runs.run_files import run_streamed, streams_records, write_run
    from sim.engine import SchedulerStuck

    try:
        if (windows is None and prep.config.disagg is None
                and streams_records(prep, extras)):  # records never all held
            with progress_bar() as bar:
                task = bar.add_task("simulating", total=len(prep.workload), unit="requests")
                summary = run_streamed(out, prep, lambda done: bar.update(task, completed=done),
                                       full_steps)
        elif (windows is not None and prep.config.disagg is None
              and not extras.file_names()):  # written as the windows complete
            summary = _windows_with_progress(prep, windows,
                                             partial(windows.write, out, prep, full_steps))
        else:
            result = (_run_with_progress(prep) if windows is None
                      else _windows_with_progress(prep, windows,
                                                  partial(windows.simulate, prep)))
            write_run(out, prep, result, full_steps=full_steps, extras=extras)
            summary = result.summary
    except SchedulerStuck as e:
        fail(str(e))
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(headline_table(summary))
    console.print(summary_table(summary))
    if prep.config.replicas > 1:
        console.print(replica_table(summary))
    if "disagg" in summary:
        from sim.app.cli.disagg import disagg_table

        console.print(disagg_table(summary))
    console.print(f"wrote {out}/" + ", ".join(
        ("requests.csv", "steps.csv", "summary.json", "config.json", *extras.file_names())))


def _compare(cfg: Any, prep: Any, cells: list[Any], out: Path) -> None:
    """Simulate every cell of ``cfg`` (as given) on ``prep``'s workload; print the table."""
    from sim.app.runs.compare import compare_table, run_compare
    from sim.engine import SchedulerStuck

    try:
        with progress_bar() as bar:  # one task: every cell's requests, one ETA
            task = bar.add_task("simulating", total=len(cells) * len(prep.workload),
                                unit="requests")
            results = run_compare(cfg, prep.workload, cells, out, _cells_on(bar, task))
    except (SchedulerStuck, *INPUT_ERRORS) as e:
        fail(str(e))
    console.print(compare_table(results, title=f"compare ({prep.cost_model_label})"))
    console.print(f"wrote {len(cells)} run directories under {out}/: "
                  + ", ".join(c.dir_name for c in cells))


def _run_with_progress(prep: Any) -> Any:
    """simulate_prepared with its requests done on the progress bar."""
    from sim.app.runs.runner import simulate_prepared

    with progress_bar() as bar:
        task = bar.add_task("simulating", total=len(prep.workload), unit="requests")
        return simulate_prepared(prep, progress=lambda done: bar.update(task, completed=done))


def _windows_with_progress(prep: Any, windows: Any,
                           replay: Callable[[Callable[[int], None]], Any]) -> Any:
    """``replay(on_done)`` (``windows``' simulate or write, window_replay.WindowSettings)
    with its windows done on the progress bar."""
    with progress_bar() as bar:
        task = bar.add_task("simulating windows", total=windows.count(prep), unit="windows")
        return replay(lambda done: bar.update(task, completed=done))


def _cells_on(bar: ProgressDisplay, task: Any) -> Callable[[Any], Any]:
    """simulate_prepared for compare's cells, one after another, counting the requests
    done in every cell so far on ``bar``'s ``task``."""
    from sim.app.runs.runner import simulate_prepared

    before = 0  # requests of the cells already simulated

    def simulate_cell(prep: Any) -> Any:
        nonlocal before
        base = before
        result = simulate_prepared(
            prep, progress=lambda done: bar.update(task, completed=base + done))
        before += len(prep.workload)
        return result
    return simulate_cell


def _write_report(run_dirs: list[Path], out: Path) -> None:
    from sim.app.reports.report import write_report

    try:
        size = write_report(run_dirs, out, warn)
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(f"wrote {out} ({size / 1e6:.1f} MB)")


def report(
    run_dirs: Annotated[list[Path], typer.Argument(
        help="Run directories written by `servesim run`; several are overlaid.")],
    out: Annotated[Path, typer.Option(help="HTML file to write.")] = Path("report.html"),
    png: Annotated[Path | None, typer.Option(
        help="Also export the figures as PNG (needs kaleido): PATH-1.png, PATH-2.png, ...")
    ] = None,
) -> None:
    """One self-contained HTML report (works offline) of one or more runs: configuration,
    summary and comparison tables, latency CDFs, the step timeline and throughput."""
    from sim.app.reports.report import kaleido_missing, report_figures, write_pngs
    from sim.app.reports.run_dir import load_runs

    if png is not None and (reason := kaleido_missing()):
        fail(reason)
    _write_report(run_dirs, out)
    if png is not None:

        try:
            paths = write_pngs(report_figures(load_runs(run_dirs)), png)
        except INPUT_ERRORS as e:
            fail(str(e))
        console.print("wrote " + ", ".join(str(p) for p in paths))


def list_known() -> None:
    """Print the known models, GPUs, policies and scenarios."""
    from calibration.gpus import get_gpu, list_gpus
    from calibration.specs import get_model, list_models
    from policies.registry import POLICIES
    from scenarios.presets import list_scenarios

    t = Table(title="models", header_style="bold")
    for c in ("name", "params (B)", "layers", "KV bytes/token (bf16)", "context"):
        t.add_column(c)
    for name in list_models():
        m = get_model(name)
        t.add_row(name, f"{m.num_params() / 1e9:.2f}", str(m.num_layers),
                  f"{m.kv_bytes_per_token(2):,}", f"{m.max_position_embeddings:,}")
    console.print(t)
    g = Table(title="GPUs", header_style="bold")
    for c in ("name", "memory (GiB)", "bandwidth (GB/s)", "bf16 dense TFLOPS"):
        g.add_column(c)
    for name in list_gpus():
        s = get_gpu(name)
        g.add_row(name, f"{s.memory_bytes / 2**30:.1f}",
                  f"{s.memory_bandwidth_bytes_per_s / 1e9:,.0f}", f"{s.bf16_flops / 1e12:,.1f}")
    console.print(g)
    console.print("policies: " + ", ".join(POLICIES) + " (or module:Class)")
    console.print("scenarios: " + ", ".join(list_scenarios()))
