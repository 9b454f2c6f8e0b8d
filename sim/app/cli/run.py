"""The ``run``, ``report`` and ``list`` commands: one simulation (or a ``--compare`` of
several) into a run directory with its terminal tables, the HTML report of run
directories, and the known presets. Heavy or optional imports (plotly) stay inside the
commands that use them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sim.app.cli.common import INPUT_ERRORS, console, fail, progress_bar
from sim.app.cli.tables import headline_table, replica_table, scale_out_line, summary_table


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
    from sim.app.runs.compare import cell_config, parse_cells
    from sim.app.runs.out_dir import check_files, check_run_dir, is_run_dir
    from sim.app.runs.runner import RunConfig, check_router, prepare, write_run
    from sim.engine import SchedulerStuck

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
    from sim.app.runs.compare import compare_table, run_compare
    from sim.engine import SchedulerStuck

    try:
        results = run_compare(prep, cells, out, _run_with_progress)
    except (SchedulerStuck, *INPUT_ERRORS) as e:
        fail(str(e))
    console.print(compare_table(results, title=f"compare ({prep.cost_model_label})"))
    console.print(f"wrote {len(cells)} run directories under {out}/: "
                  + ", ".join(c.dir_name for c in cells))


def _run_with_progress(prep: Any) -> Any:
    from sim.app.runs.runner import simulate_prepared

    with progress_bar() as bar:
        task = bar.add_task("simulating", total=len(prep.workload))
        return simulate_prepared(prep, progress=lambda done: bar.update(task, completed=done))


def _write_report(run_dirs: list[Path], out: Path) -> None:
    from sim.app.reports.report import write_report

    try:
        size = write_report(run_dirs, out)
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
