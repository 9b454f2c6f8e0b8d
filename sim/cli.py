"""``servesim`` command line: the composition root's front door.

Every command turns bad input into one clear line on stderr and exit code 1, never a
traceback. Heavy or optional imports (plotly, torch) stay inside the commands that use them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from sim.cli_tables import headline_table, replica_table, scale_out_line, summary_table

app = typer.Typer(
    name="servesim", help="LLM-serving scheduling simulator (vLLM-faithful policies).",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
# Off a terminal (pipes, CI logs) rich would assume 80 columns and cut numbers short.
console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

# Bad input and file-system refusals (a missing file, a directory where a file goes, no
# permission), and a workload too large for memory: one line, exit 1.
INPUT_ERRORS = (ValueError, OSError, MemoryError)


def fail(message: str) -> NoReturn:
    """Print one line to stderr and exit with code 1."""
    message = message or "out of memory, or an error with no message"
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


@app.command()
def run(
    model: Annotated[str, typer.Option(help="Model preset (see `servesim list`).")] =
        "llama-3.1-8b",
    gpu: Annotated[str, typer.Option(help="GPU preset (see `servesim list`).")] = "h100-sxm",
    dtype: Annotated[str, typer.Option(help="Weights and KV dtype: bf16, fp16, fp32.")] = "bf16",
    policy: Annotated[str, typer.Option(
        help="Scheduling policy: chunked, continuous, static, or module:Class "
             "(module may be a path/to/file.py).")] = "chunked",
    max_num_seqs: Annotated[int, typer.Option(help="Most requests per batch.")] = 256,
    max_num_batched_tokens: Annotated[int, typer.Option(
        help="Token budget per step.")] = 8192,
    gpu_memory_utilization: Annotated[float, typer.Option(
        help="Fraction of GPU memory the engine may use, in (0, 1].")] = 0.9,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    max_model_len: Annotated[int | None, typer.Option(
        help="Most tokens per request (default: the model's context length).")] = None,
    num_gpu_blocks: Annotated[int | None, typer.Option(
        help="Override the KV block count (vLLM's num_gpu_blocks_override).")] = None,
    long_prefill_token_threshold: Annotated[int, typer.Option(
        help="Cap of one request's prefill chunk per step (0 = off).")] = 0,
    scheduler_reserve_full_isl: Annotated[bool, typer.Option(
        help="Admit only if all of a request's tokens fit in the free pool.")] = True,
    max_tokens: Annotated[int | None, typer.Option(
        help="Client cap on output tokens for every request.")] = None,
    step_time: Annotated[float | None, typer.Option(
        help="Constant step time in seconds instead of a cost model.")] = None,
    profile: Annotated[str | None, typer.Option(
        help="Calibrated profile JSON to use as the cost model.")] = None,
    trace: Annotated[str | None, typer.Option(
        help="Trace file: servesim CSV, Azure 2023 CSV or Mooncake JSONL.")] = None,
    trace_format: Annotated[str | None, typer.Option(
        help="Force the trace format: servesim, azure, mooncake.")] = None,
    scenario: Annotated[str | None, typer.Option(
        help="Built-in scenario (see `servesim list`).")] = None,
    arrival: Annotated[str | None, typer.Option(
        help="Arrival process: poisson, gamma, constant, bursts (re-times a trace).")] = None,
    rate: Annotated[float | None, typer.Option(help="Arrival rate in requests/s.")] = None,
    burstiness: Annotated[float | None, typer.Option(
        help="Gamma shape k (CV = 1/sqrt(k); inf = constant gaps).")] = None,
    num_requests: Annotated[int | None, typer.Option(help="Requests to simulate.")] = None,
    window: Annotated[float | None, typer.Option(
        help="Keep trace arrivals within this many seconds of the first.")] = None,
    time_scale: Annotated[float | None, typer.Option(
        help="Speed a trace up (>1) or slow it down (<1).")] = None,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 0,
    slo_ttft: Annotated[float | None, typer.Option(help="TTFT SLO in seconds.")] = None,
    slo_tpot: Annotated[float | None, typer.Option(help="TPOT SLO in seconds.")] = None,
    queue: Annotated[str, typer.Option(
        help="Waiting-queue order: fcfs, priority, sjf (shortest prompt), oracle-srpt "
             "(true remaining output: an unrealizable bound), lpm (longest cached prefix "
             "first, SGLang; needs --prefix-cache).")] = "fcfs",
    preemption_mode: Annotated[str, typer.Option(
        help="Preemption under KV pressure: recompute or swap (to CPU).")] = "recompute",
    kv_allocation: Annotated[str, typer.Option(
        help="KV blocks: paged (on demand) or reserve (prompt + max_tokens at admission)."
    )] = "paged",
    swap_space: Annotated[float, typer.Option(
        help="CPU swap space for --preemption-mode swap, GiB (vLLM's default).")] = 4.0,
    pcie_bandwidth: Annotated[float, typer.Option(
        help="Host <-> GPU copy rate pricing swaps, GB/s (PCIe 4.0 x16 effective).")] = 25.0,
    tensor_parallel_size: Annotated[int, typer.Option(
        help="GPUs per replica: weights, FLOPs and KV heads split N ways, two all-reduces "
             "per layer over the GPU's interconnect.")] = 1,
    replicas: Annotated[int, typer.Option(
        help="Identical engines behind a router, simulated together.")] = 1,
    router: Annotated[str, typer.Option(
        help="How requests are spread over replicas: round-robin, least-outstanding, "
             "least-kv, cache-aware (longest cached prefix, load-guarded; needs "
             "--prefix-cache), cache-aware-approx (the SGLang router's: longest prefix "
             "it routed, load-guarded, else the smallest tree).")] = "round-robin",
    concurrency: Annotated[int | None, typer.Option(
        help="Closed loop: N users, each sending its next request when its previous one "
             "ends (instead of open-loop arrivals).")] = None,
    think_time: Annotated[float, typer.Option(
        help="Closed loop: seconds a user waits before sending its next request.")] = 0.0,
    trace_sample: Annotated[bool, typer.Option(
        help="Draw --num-requests at random from the whole trace (seeded) instead of "
             "taking the first ones; shuffled when re-timed.")] = False,
    prefix_cache: Annotated[str, typer.Option(
        help="Prefix caching: none, block (vLLM's block-hash cache) or radix (SGLang's "
             "radix tree); prompts share blocks by Mooncake hash_ids or a scenario's "
             "prompt segments (docs/prefix_caching.md).")] = "none",
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
) -> None:
    """Simulate one engine on a workload and write requests.csv, steps.csv, summary.json
    and config.json to --out."""
    from sim.compare import cell_config, parse_cells
    from sim.engine import SchedulerStuck
    from sim.out_dir import check_files, check_run_dir, is_run_dir
    from sim.runner import RunConfig, check_router, prepare, write_run

    try:
        cfg = RunConfig(
            model=model, gpu=gpu, dtype=dtype, policy=policy, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
            max_model_len=max_model_len, num_gpu_blocks=num_gpu_blocks,
            long_prefill_token_threshold=long_prefill_token_threshold,
            scheduler_reserve_full_isl=scheduler_reserve_full_isl, max_tokens=max_tokens,
            step_time=step_time, profile=profile, trace=trace, trace_format=trace_format,
            scenario=scenario, arrival=arrival, rate=rate, burstiness=burstiness,
            num_requests=num_requests, window=window, time_scale=time_scale, seed=seed,
            slo_ttft=slo_ttft, slo_tpot=slo_tpot, queue=queue,
            preemption_mode=preemption_mode, kv_allocation=kv_allocation,
            swap_space=swap_space, pcie_bandwidth=pcie_bandwidth,
            tensor_parallel_size=tensor_parallel_size, replicas=replicas, router=router,
            concurrency=concurrency, think_time=think_time, trace_sample=trace_sample,
            prefix_cache=prefix_cache,
        )
        cells = parse_cells(compare) if compare is not None else None
        out = out or Path("runs/compare" if cells is not None else "runs/latest")
        for c in cells or []:  # every cell checked before any output
            cell_config(cfg, c)
            check_run_dir(out / c.dir_name)
        if cells is not None and is_run_dir(out):
            raise ValueError(f"out: {out} is a run directory; --compare writes a run "
                             "directory per cell under --out: give another")
        if cells is not None and report:
            check_files(out, ("report.html",))
        if cells is None:
            check_router(cfg)
            check_run_dir(out)
        prep = prepare(cfg)
    except INPUT_ERRORS as e:
        fail(str(e))
    bs = cfg.block_size
    console.print(f"workload: {len(prep.workload):,} requests ({prep.workload.source})")
    console.print(f"cost model: {prep.cost_model_label}")
    console.print(f"# GPU blocks: {prep.num_gpu_blocks:,}; GPU KV cache size: "
                  f"{prep.num_gpu_blocks * bs:,} tokens")
    console.print(f"Maximum concurrency for {prep.scheduler.max_model_len:,} tokens per "
                  f"request: {prep.num_gpu_blocks * bs / prep.scheduler.max_model_len:.2f}x")
    if cfg.replicas > 1 or cfg.tensor_parallel_size > 1 or cfg.concurrency is not None:
        console.print(scale_out_line(cfg))
    if cells is not None:
        _compare(prep, cells, out)
        if report:  # one report over every cell
            _write_report([out / c.dir_name for c in cells], out / "report.html")
        return
    try:
        result = _run_with_progress(prep)
        write_run(out, prep, result, full_steps=full_steps)
    except SchedulerStuck as e:
        fail(str(e))
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(headline_table(result.summary))
    console.print(summary_table(result.summary))
    if cfg.replicas > 1:
        console.print(replica_table(result.summary))
    console.print(f"wrote {out}/requests.csv, steps.csv, summary.json, config.json")
    if report:
        _write_report([out], out / "report.html")


def _compare(prep: Any, cells: list[Any], out: Path) -> None:
    from sim.compare import compare_table, run_compare
    from sim.engine import SchedulerStuck

    try:
        results = run_compare(prep, cells, out, _run_with_progress)
    except (SchedulerStuck, *INPUT_ERRORS) as e:
        fail(str(e))
    console.print(compare_table(results, title=f"compare ({prep.cost_model_label})"))
    console.print(f"wrote {len(cells)} run directories under {out}/: "
                  + ", ".join(c.dir_name for c in cells))


def progress_bar() -> Any:
    """The commands' progress bar (a rich Progress on stderr, off when stderr is not a
    terminal, gone when done)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress("[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=err_console,
                    transient=True, disable=not sys.stderr.isatty())


def _run_with_progress(prep: Any) -> Any:
    from sim.runner import simulate_prepared

    with progress_bar() as bar:
        task = bar.add_task("simulating", total=len(prep.workload))
        return simulate_prepared(prep, progress=lambda done: bar.update(task, completed=done))


def _write_report(run_dirs: list[Path], out: Path) -> None:
    from sim.report import write_report

    try:
        size = write_report(run_dirs, out)
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(f"wrote {out} ({size / 1e6:.1f} MB)")


@app.command()
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
    from sim.report import kaleido_missing, report_figures, write_pngs
    from sim.run_dir import load_runs

    if png is not None and (reason := kaleido_missing()):
        fail(reason)
    _write_report(run_dirs, out)
    if png is not None:

        try:
            paths = write_pngs(report_figures(load_runs(run_dirs)), png)
        except INPUT_ERRORS as e:
            fail(str(e))
        console.print("wrote " + ", ".join(str(p) for p in paths))


@app.command("list")
def list_known() -> None:
    """Print the known models, GPUs, policies and scenarios."""
    from calibration.specs import get_gpu, get_model, list_gpus, list_models
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


# `diagram` and `validate` (sim/cli_tools.py), `sweep` and `plan` (sim/cli_capacity.py)
# register themselves on `app`.
import sim.cli_capacity  # noqa: E402
import sim.cli_tools  # noqa: E402, F401


def _register_calibrate() -> None:
    # calibration/cli.py imports torch only inside the command, so this stays cheap.
    from calibration.cli import register

    register(app)


_register_calibrate()


def main() -> None:
    """The ``servesim`` console script: the app, with a usage error (a value of the wrong
    type, an unknown option or command: click's exit code 2 and a boxed message) as one
    line and exit 1, like every other bad input. typer keeps click's exception classes
    private, so they are recognised by name."""
    try:
        code = app(standalone_mode=False)
    except Exception as e:  # re-raised below unless it is a usage error
        names = {c.__name__ for c in type(e).__mro__}
        if "NoArgsIsHelpError" in names:  # `servesim` alone: the help, as before
            ctx = getattr(e, "ctx", None)
            print(ctx.get_help() if ctx is not None else e)
            sys.exit(0)
        if "UsageError" not in names and "Abort" not in names:
            raise
        ctx = getattr(e, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        text = e.format_message() if hasattr(e, "format_message") else "aborted"
        fail_line = f"error: {where}{text}".replace("\n", " ")
        err_console.print(fail_line, markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    # `python -m sim.cli`: the commands of sim/cli_capacity.py and sim/cli_tools.py
    # register on the app of the module `sim.cli`, not on this __main__ copy's.
    from sim.cli import main as _main

    _main()
