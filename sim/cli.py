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

app = typer.Typer(
    name="servesim", help="LLM-serving scheduling simulator (vLLM-faithful policies).",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
# Off a terminal (pipes, CI logs) rich would assume 80 columns and cut numbers short.
console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

INPUT_ERRORS = (ValueError, FileNotFoundError, IsADirectoryError, PermissionError)


def fail(message: str) -> NoReturn:
    """Print one line to stderr and exit with code 1."""
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _fmt(x: Any, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if x is None else f"{x * scale:,.{digits}f}"


def summary_table(summary: dict[str, Any], title: str = "summary") -> Table:
    """A rich table of the headline metrics of one summary.json."""
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    for c in ("mean", "p50", "p90", "p99", "max"):
        t.add_column(c, justify="right")
    for key, label in (("ttft_s", "TTFT (ms)"), ("tpot_s", "TPOT (ms)"), ("itl_s", "ITL (ms)"),
                       ("e2e_latency_s", "E2E latency (s)"), ("queued_time_s", "queued (s)")):
        st = summary[key]
        scale = 1000.0 if "ms" in label else 1.0
        t.add_row(label, *(_fmt(st[c], scale, 1 if scale > 1 else 3)
                           for c in ("mean", "p50", "p90", "p99", "max")))
    return t


def headline_table(summary: dict[str, Any]) -> Table:
    t = Table(show_header=False, box=None)
    thr, kv, sl = summary["throughput"], summary["kv_cache"], summary["slots"]
    good = summary["goodput_requests_per_s"]
    rows = [
        ("requests", f"{summary['num_finished']:,} finished, {summary['num_rejected']:,} "
                     f"rejected of {summary['num_requests']:,}"),
        ("duration", f"{summary['duration_s']:,.2f} s"),
        ("throughput", f"{thr['requests_per_s']:,.3f} req/s, "
                       f"{thr['output_tokens_per_s']:,.1f} output tok/s, "
                       f"{thr['total_tokens_per_s']:,.1f} total tok/s"),
        ("goodput", "-" if good is None else f"{good:,.3f} req/s"),
        ("preemptions", f"{summary['num_preemptions']:,}"),
        ("KV cache usage", f"peak {kv['peak_usage']:.1%}, mean {kv['mean_usage']:.1%}"),
        ("batch slots", f"useful {sl['useful_fraction']:.1%}, idle {sl['idle_fraction']:.1%}, "
                        f"empty {sl['empty_fraction']:.1%}; mean batch "
                        f"{summary['batch']['mean_num_seqs']:.1f} seqs"),
    ]
    for k, v in rows:
        t.add_row(f"[bold]{k}[/bold]", v)
    return t


@app.command()
def run(
    model: Annotated[str, typer.Option(help="Model preset (see `servesim list`).")] =
        "llama-3.1-8b",
    gpu: Annotated[str, typer.Option(help="GPU preset (see `servesim list`).")] = "h100-sxm",
    dtype: Annotated[str, typer.Option(help="Weights and KV dtype: bf16, fp16, fp32.")] = "bf16",
    policy: Annotated[str, typer.Option(
        help="Scheduling policy: chunked, static, or module:Class.")] = "chunked",
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
    out: Annotated[Path, typer.Option(help="Run directory to write.")] = Path("runs/latest"),
) -> None:
    """Simulate one engine on a workload and write requests.csv, steps.csv, summary.json
    and config.json to --out."""
    from sim.engine import SchedulerStuck
    from sim.runner import RunConfig, prepare, write_run

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
            slo_ttft=slo_ttft, slo_tpot=slo_tpot,
        )
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
    try:
        result = _run_with_progress(prep)
        write_run(out, prep, result)
    except SchedulerStuck as e:
        fail(str(e))
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(headline_table(result.summary))
    console.print(summary_table(result.summary))
    console.print(f"wrote {out}/requests.csv, steps.csv, summary.json, config.json")


def _run_with_progress(prep: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from sim.runner import simulate_prepared

    total = len(prep.workload)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=err_console,
                  transient=True, disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("simulating", total=total)
        return simulate_prepared(prep, progress=lambda done: bar.update(task, completed=done))


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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
