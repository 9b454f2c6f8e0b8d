"""``servesim diagram`` and ``servesim validate``: the commands that look inside a run (the
slot diagram) or check it against a real one (executed here, or a server's own benchmark
result with ``--against``). The work is in sim/app/cli/diagram.py,
sim/app/reports/diagram.py, sim/app/runs/validate.py and sim/app/runs/against.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from sim.app.cli.common import INPUT_ERRORS, console, fail, progress_bar
from sim.app.cli.options import FRONTEND_OPTIONS, declare, with_options


@with_options(*declare(
    ("scenario", "trace", "max_num_seqs", "max_num_batched_tokens", "num_requests",
     "step_time", "seed"),
    scenario={"help": "Built-in scenario, e.g. teaching (6 requests, 4 slots)."},
    max_num_seqs={"default": None,
                  "help": "Batch slots (teaching: 4; else the run's or 256)."},
    max_num_batched_tokens={"default": None}, seed={"default": None}))
def diagram(
    run_dir: Annotated[Path | None, typer.Argument(
        help="Run directory to re-simulate (its config.json); or use --scenario / --trace."
    )] = None,
    policies: Annotated[str | None, typer.Option(
        help="Comma-separated policies, one grid each (teaching: static,continuous,chunked; "
             "else the run's policy or chunked).")] = None,
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
    **opts: Any,
) -> None:
    """Slot diagram: one row per batch slot, one column per step; which request holds
    each slot, whether it computed (useful), held it idle, or the slot was empty."""
    from sim.app.cli.diagram import diagram_cli

    try:
        diagram_cli(
            run_dir=run_dir, policies=policies, max_steps=max_steps, max_slots=max_slots,
            first_step=first_step, idle_letters=idle_letters, html_out=html, png_out=png,
            width=console.width,
            echo=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
            **opts)
    except INPUT_ERRORS as e:
        fail(str(e))


FRONTEND_NAMES = tuple(o.name for o in FRONTEND_OPTIONS)
_AGAINST_COST = "With --against only (prices the simulation instead of a profile): "


@with_options(*declare(
    ("profile", "model", "gpu", "dtype", "step_time", "tensor_parallel_size", "policy",
     "scenario", "trace", "trace_format", "arrival", "rate",
     "burstiness", "num_requests", "window", "time_scale", "max_tokens", "trace_sample",
     "seed", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_gpu_blocks",
     "long_prefill_token_threshold", "queue", "preemption_mode"),
    profile={"help": "Calibrated profile that prices the simulation (default: the shipped "
                     "CPU profile); the real run uses its model, dtype and torch threads."},
    model={"default": None, "help": _AGAINST_COST + "the roofline of this model preset."},
    gpu={"default": None, "help": _AGAINST_COST + "the roofline on this GPU preset."},
    dtype={"default": None, "help": _AGAINST_COST + "the roofline's weights and KV dtype."},
    step_time={"help": _AGAINST_COST + "a constant step time in seconds."},
    scenario={"help": "Built-in scenario (e.g. cpu-chat; see `servesim list`)."},
    seed={"help": "Workload (and prompt token) seed."},
    max_num_seqs={"default": None,
                  "help": "Most requests per batch (default: the profile grid's)."},
    max_num_batched_tokens={"default": None,
                            "help": "Token budget per step (default: the profile grid's)."},
    max_model_len={"help": "Most tokens per request (default: the profile grid's max "
                           "context)."}),
    *(dataclasses.replace(o, help=f"With --against: {o.help}") for o in FRONTEND_OPTIONS))
def validate(
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
    out: Annotated[Path, typer.Option(help="Directory to write.")] = Path("runs/validate"),
    against: Annotated[Path | None, typer.Option(
        help="A vllm bench serve result (--save-result --save-detailed): simulate its "
             "requests as they were sent and compare with its client-side figures, "
             "instead of a real run here.")] = None,
    fit_frontend: Annotated[bool | None, typer.Option(
        "--fit-frontend/--no-fit-frontend",
        help="With --against: fit the frontend terms not given by least squares on the "
             "per-request TTFT and ITL differences (default: fit).")] = None,
    **opts: Any,
) -> None:
    """Run a scenario twice on one workload and config: priced by the profile (the
    simulation) and executed for real on the device; write validation.json,
    validation.html and both run directories to --out, and print the error table.
    With --against, the second run is a vllm bench serve result instead."""
    if against is not None:
        _validate_against(against, out, fit_frontend, device, timer, repeats, opts)
        return
    from sim.app.reports.validation_page import check_validation_out, write_validation
    from sim.app.runs.against import check_without_against
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
        check_without_against(fit_frontend=fit_frontend, **opts)
        opts = {k: v for k, v in opts.items() if k not in FRONTEND_NAMES}
        cfg = validation_config(**opts)
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


def _validate_against(result: Path, out: Path, fit: bool | None, device: str | None,
                      timer: str, repeats: int, opts: dict[str, Any]) -> None:
    """validate --against: simulate the result's requests, print the error table without
    and with the frontend term, write validation.json, validation.html and predicted/."""
    from calibration.frontend import Frontend
    from sim.app.reports.validation_page import check_validation_out, write_against
    from sim.app.runs.against import (
        frontend_line,
        prepare_against,
        run_against,
        target_line,
        unfinished_line,
    )
    from sim.app.runs.validate import error_table
    from sim.engine import SchedulerStuck

    ttft_s, token_s = (opts.pop(name) for name in FRONTEND_NAMES)
    try:
        for name, value, default in (("device", device, None), ("timer", timer, "auto"),
                                     ("repeats", repeats, 1)):
            if value != default:
                raise ValueError(f"{name} applies to a real run here, not with --against")
        Frontend(ttft_s or 0.0, token_s or 0.0)  # a bad value fails before simulating
        check_validation_out(out)
        prep, bench = prepare_against(result, **opts)
        console.print(f"workload: {len(prep.workload):,} requests ({prep.workload.source})")
        console.print(f"prediction: {prep.cost_model_label}")
        a = run_against(prep, bench, ttft_s, token_s, fit is not False)
        data = write_against(out, prep, a)
    except (SchedulerStuck, *INPUT_ERRORS) as e:
        fail(str(e))
    console.print(target_line(data), markup=False, highlight=False, soft_wrap=True)
    if (note := unfinished_line(data)) is not None:
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    console.print(error_table(data, title="simulation (engine only) vs the result"))
    console.print(frontend_line(data), markup=False, highlight=False, soft_wrap=True)
    if data["errors_with_frontend"] is not None:
        console.print(error_table(data, "errors_with_frontend",
                                  "simulation with the frontend term vs the result"))
    console.print(f"wrote {out}/validation.json, validation.html, predicted/")
