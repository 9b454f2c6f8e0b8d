"""``servesim diagram`` and ``servesim validate``: the commands that look inside a run (the
slot diagram) or check it against a real one. The work is in sim/app/cli/diagram.py,
sim/app/reports/diagram.py and sim/app/runs/validate.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sim.app.cli.common import INPUT_ERRORS, console, fail, progress_bar


def diagram(
    run_dir: Annotated[Path | None, typer.Argument(
        help="Run directory to re-simulate (its config.json); or use --scenario / --trace."
    )] = None,
    scenario: Annotated[str | None, typer.Option(
        help="Built-in scenario, e.g. teaching (6 requests, 4 slots).")] = None,
    trace: Annotated[str | None, typer.Option(help="Trace file to replay.")] = None,
    policies: Annotated[str | None, typer.Option(
        help="Comma-separated policies, one grid each (teaching: static,continuous,chunked; "
             "else the run's policy or chunked).")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(
        help="Batch slots (teaching: 4; else the run's or 256).")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(
        help="Token budget per step.")] = None,
    num_requests: Annotated[int | None, typer.Option(help="Requests to simulate.")] = None,
    step_time: Annotated[float | None, typer.Option(
        help="Constant step time in seconds instead of a cost model.")] = None,
    seed: Annotated[int | None, typer.Option(help="Workload seed.")] = None,
    max_steps: Annotated[int, typer.Option(help="Steps shown (the rest is cut).")] = 64,
    max_slots: Annotated[int, typer.Option(help="Slot rows shown (the rest is cut).")] = 16,
    first_step: Annotated[int, typer.Option(help="First step shown (1-based).")] = 1,
    idle_letters: Annotated[bool, typer.Option(
        "--idle-letters", help="Show idle cells as the holder's lowercase letter, not '.'.")
    ] = False,
    html: Annotated[Path | None, typer.Option(
        "--html", help="Also write the diagram as a self-contained HTML file.")] = None,
    png: Annotated[Path | None, typer.Option(
        help="Also export the grids as PNG (needs kaleido): PATH-1.png, ... for several.")] = None,
) -> None:
    """Slot diagram: one row per batch slot, one column per step; which request holds
    each slot, whether it computed (useful), held it idle, or the slot was empty."""
    from sim.app.cli.diagram import diagram_cli

    try:
        diagram_cli(
            run_dir=run_dir, scenario=scenario, trace=trace, policies=policies,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            num_requests=num_requests, step_time=step_time, seed=seed, max_steps=max_steps,
            max_slots=max_slots, first_step=first_step, idle_letters=idle_letters,
            html_out=html, png_out=png,
            width=console.width,
            echo=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
        )
    except INPUT_ERRORS as e:
        fail(str(e))


def validate(
    profile: Annotated[str | None, typer.Option(
        help="Calibrated profile that prices the simulation (default: the shipped CPU "
             "profile); the real run uses its model, dtype and torch threads.")] = None,
    device: Annotated[str | None, typer.Option(
        help="Where the real run executes: cpu or cuda[:N] (default: the profile's).")
    ] = None,
    timer: Annotated[str, typer.Option(
        help="Step clock of the real run: thread (CPU time of the one torch thread: other "
             "processes' time on the core not counted), wall, or auto (thread on CPU with "
             "one thread, else wall).")] = "auto",
    repeats: Annotated[int, typer.Option(
        help="Execute each real step this many times from the same state and keep the "
             "fastest (the profile's own statistic; filters other processes' interference "
             "on a shared machine). 1 = a plain real run.")] = 1,
    policy: Annotated[str, typer.Option(help="Scheduling policy.")] = "chunked",
    scenario: Annotated[str | None, typer.Option(
        help="Built-in scenario (e.g. cpu-chat; see `servesim list`).")] = None,
    trace: Annotated[str | None, typer.Option(help="Trace file to replay.")] = None,
    trace_format: Annotated[str | None, typer.Option(
        help="Force the trace format: servesim, azure, mooncake.")] = None,
    arrival: Annotated[str | None, typer.Option(
        help="Arrival process: poisson, gamma, constant, bursts.")] = None,
    rate: Annotated[float | None, typer.Option(help="Arrival rate in requests/s.")] = None,
    burstiness: Annotated[float | None, typer.Option(help="Gamma shape k.")] = None,
    num_requests: Annotated[int | None, typer.Option(help="Requests to run.")] = None,
    window: Annotated[float | None, typer.Option(
        help="Keep trace arrivals within this many seconds of the first.")] = None,
    time_scale: Annotated[float | None, typer.Option(
        help="Speed a trace up (>1) or slow it down (<1).")] = None,
    max_tokens: Annotated[int | None, typer.Option(
        help="Client cap on output tokens for every request.")] = None,
    trace_sample: Annotated[bool, typer.Option(
        help="Draw --num-requests at random from the whole trace.")] = False,
    seed: Annotated[int, typer.Option(help="Workload (and prompt token) seed.")] = 0,
    max_num_seqs: Annotated[int | None, typer.Option(
        help="Most requests per batch (default: the profile grid's).")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(
        help="Token budget per step (default: the profile grid's).")] = None,
    max_model_len: Annotated[int | None, typer.Option(
        help="Most tokens per request (default: the profile grid's max context).")] = None,
    num_gpu_blocks: Annotated[int | None, typer.Option(
        help="Override the KV block count (exercises preemption).")] = None,
    long_prefill_token_threshold: Annotated[int, typer.Option(
        help="Cap of one request's prefill chunk per step (0 = off).")] = 0,
    queue: Annotated[str, typer.Option(help="Waiting-queue order.")] = "fcfs",
    preemption_mode: Annotated[str, typer.Option(
        help="Preemption under KV pressure: recompute or swap.")] = "recompute",
    out: Annotated[Path, typer.Option(help="Directory to write.")] = Path("runs/validate"),
) -> None:
    """Run a scenario twice on one workload and config: priced by the profile (the
    simulation) and executed for real on the device; write validation.json,
    validation.html and both run directories to --out, and print the error table."""
    from sim.app.reports.validation_page import check_validation_out, write_validation
    from sim.app.runs.validate import (
        error_table,
        prepare_validation,
        run_validation,
        schedule_line,
        step_error_line,
        validation_config,
    )
    from sim.engine import SchedulerStuck

    try:
        cfg = validation_config(
            profile, policy=policy, scenario=scenario, trace=trace, trace_format=trace_format,
            arrival=arrival, rate=rate, burstiness=burstiness, num_requests=num_requests,
            window=window, time_scale=time_scale, max_tokens=max_tokens,
            trace_sample=trace_sample, seed=seed, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            num_gpu_blocks=num_gpu_blocks,
            long_prefill_token_threshold=long_prefill_token_threshold, queue=queue,
            preemption_mode=preemption_mode)
        check_validation_out(out)  # before measuring: nothing is lost at the end
        prep, real = prepare_validation(cfg, device, timer, repeats)
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(f"workload: {len(prep.workload):,} requests ({prep.workload.source})")
    console.print(f"prediction: {prep.cost_model_label}")
    console.print(f"real run: {real.spec.name} ({real.dtype}) on {real.device}, "
                  f"{real.threads or 'default'} torch threads, each step the fastest of "
                  f"{real.repeats}")
    try:
        v = _validate_with_progress(prep, real, run_validation)
        data = write_validation(out, prep, v)
    except ImportError:
        fail("validate needs torch: install the calibration extra: "
             "pip install 'servesim[calibration]'")
    except (SchedulerStuck, *INPUT_ERRORS) as e:
        fail(str(e))
    console.print(error_table(data))
    console.print(step_error_line(data), highlight=False)
    console.print(schedule_line(data), highlight=False)
    console.print(f"wrote {out}/validation.json, validation.html, predicted/, measured/")


def _validate_with_progress(prep: Any, real: Any, run: Any) -> Any:
    with progress_bar() as bar:
        task = bar.add_task("real run", total=len(prep.workload))
        return run(prep, real, progress=lambda done: bar.update(task, completed=done))
