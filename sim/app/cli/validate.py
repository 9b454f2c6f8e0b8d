"""``servesim validate``: check the simulation against a real run: executed here by
servesim's torch decoder (calibration/executor.py), served by a real vLLM engine
(``--engine vllm``: sim/app/runs/validate_vllm.py), or a server's own benchmark result
(``--against``: sim/app/runs/against.py). The comparison and its files are in
sim/app/runs/validate.py and sim/app/reports/validation_page.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from sim.app.cli.common import INPUT_ERRORS, console, fail, progress_bar
from sim.app.cli.option_values import config_options
from sim.app.cli.options import (
    CONFIG_OPTION,
    FRONTEND_OPTIONS,
    declare,
    with_options,
)

FRONTEND_NAMES = tuple(o.name for o in FRONTEND_OPTIONS)
_AGAINST_COST = "With --against only (prices the simulation instead of a profile): "
#: --probe-every-s's default (calibration.device_probe.PROBE_EVERY_S, not imported here:
#: `servesim --help` loads no numeric stack).
_PROBE_EVERY_S = 10.0


@with_options(*declare(
    ("profile", "model", "gpu", "dtype", "quantization", "kv_cache_dtype", "step_time",
     "tensor_parallel_size", "policy", "scenario", "trace", "trace_format", "arrival", "rate",
     "burstiness", "num_requests", "window", "time_scale", "max_tokens", "trace_sample",
     "seed", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_gpu_blocks",
     "long_prefill_token_threshold", "queue", "preemption_mode"),
    profile={"help": "Calibrated profile that prices the simulation (default: the shipped "
                     "vLLM-engine CPU profile with --engine vllm, else the shipped torch "
                     "one); the real run uses its model, dtype and threads."},
    model={"default": None, "help": _AGAINST_COST + "the roofline of this model preset."},
    gpu={"default": None, "help": _AGAINST_COST + "the roofline on this GPU preset."},
    dtype={"default": None, "help": _AGAINST_COST + "the roofline's weights and KV dtype."},
    quantization={"help": "With --against: the deployment's weight quantization (vLLM's "
                          "--quantization: fp8, compressed-tensors, awq, gptq)."},
    kv_cache_dtype={"default": None, "help": "With --against: the deployment's KV-cache "
                                             "dtype (vLLM's --kv-cache-dtype: auto, fp8)."},
    step_time={"help": _AGAINST_COST + "a constant step time in seconds."},
    scenario={"help": "Built-in scenario (e.g. cpu-chat; see `servesim list`)."},
    seed={"help": "Workload (and prompt token) seed."},
    max_num_seqs={"default": None,
                  "help": "Most requests per batch (default: the profile grid's)."},
    max_num_batched_tokens={"default": None,
                            "help": "Token budget per step (default: the profile grid's)."},
    max_model_len={"help": "Most tokens per request (default: the profile grid's max "
                           "context)."}),
    *(dataclasses.replace(o, help=f"With --against: {o.help}") for o in FRONTEND_OPTIONS),
    CONFIG_OPTION)
def validate(
    ctx: typer.Context,
    engine: Annotated[str, typer.Option(
        help="What runs for real: vllm (a vLLM V1 engine in its own process, --python, its "
             "own scheduler deciding), torch (servesim's decoder executing the simulated "
             "schedule), or auto (the profile's engine; without --profile, vllm where this "
             "Python or --python has it, else torch).")] = "auto",
    python: Annotated[str | None, typer.Option(
        help="Python that has vLLM installed (--engine vllm). Default: this one.")] = None,
    also_profile: Annotated[Path | None, typer.Option(
        help="--engine vllm: also price the same workload with this profile of the same "
             "model and dtype, and print its error against the same real run.")] = None,
    device: Annotated[str | None, typer.Option(
        help="Where the real run executes: cpu or cuda[:N] (default: the profile's).")
    ] = None,
    timer: Annotated[str, typer.Option(
        help="Step clock of the real run: thread (CPU time of the one torch thread: other "
             "processes' time on the core not counted), wall, or auto (thread on CPU with "
             "one thread, else wall).")] = "auto",
    repeats: Annotated[int, typer.Option(
        help="Execute each real step this many times from the same state and keep the "
             "run the profile's fit statistic picks (the fastest, or the median). 1 = a "
             "plain real run.")] = 1,
    probe_every_s: Annotated[float, typer.Option(
        help="Seconds of executed step time between device probes: one decode over 128 "
             "cached tokens, timed outside the steps, reported against the profile's price "
             "to show the device's drift during the run; 0 = none.")] = _PROBE_EVERY_S,
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
    opts = config_options(ctx, opts)
    if against is not None:
        if engine != "auto" or python is not None or also_profile is not None:
            fail("engine, python and also_profile apply to a real run here, not with --against")
        _validate_against(against, out, fit_frontend, device, timer, repeats, probe_every_s,
                          opts)
        return
    try:
        from sim.app.runs.validate_vllm import resolve_engine

        engine, opts["profile"] = resolve_engine(engine, opts.get("profile"), python)
        if engine == "torch" and also_profile is not None:
            raise ValueError("also_profile: only with --engine vllm")
    except INPUT_ERRORS as e:
        fail(str(e))
    if engine == "vllm":
        from sim.app.cli.validate_vllm import validate_vllm

        if probe_every_s != _PROBE_EVERY_S:
            fail("probe_every_s applies to the torch engine's real run (vLLM's engine runs "
                 "its own steps, with no probe between them)")
        validate_vllm(out, python, device, timer, repeats, fit_frontend, also_profile, opts)
        return
    from sim.app.cli.validate_vllm import checked_config
    from sim.app.reports.validation_page import write_validation
    from sim.app.runs.validate import prepare_validation, run_validation
    from sim.engine import SchedulerStuck

    try:
        prep, real = prepare_validation(checked_config(out, fit_frontend, opts), device,
                                        timer, repeats, probe_every_s)
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(f"workload: {len(prep.workload):,} requests ({prep.workload.source})")
    console.print(f"prediction: {prep.cost_model_label}")
    console.print(f"real run: {real.spec.name} ({real.dtype}) on {real.device}, "
                  f"{real.threads or 'default'} torch threads, each step the "
                  f"{'fastest' if real.statistic == 'min' else 'median'} of {real.repeats}")
    try:
        v = _validate_with_progress(prep, real, run_validation)
        data = write_validation(out, prep, v)
    except ImportError:
        fail("validate needs torch: install the calibration extra: "
             "pip install 'servesim[calibration]'")
    except (SchedulerStuck, *INPUT_ERRORS) as e:
        fail(str(e))
    _print_torch(data, out)


def _print_torch(data: dict[str, Any], out: Path) -> None:
    """The torch engine's run: a device warning, the error table and its lines."""
    from calibration.device_probe import probe_line
    from sim.app.runs.validate import error_table, schedule_line, step_error_line

    if data["real"]["device_note"]:
        console.print(f"warning: {data['real']['device_note']}", markup=False, highlight=False)
    console.print(error_table(data))
    console.print(step_error_line(data), highlight=False)
    console.print(probe_line(data["device_probe"]), highlight=False)
    console.print(schedule_line(data), highlight=False)
    console.print(f"wrote {out}/validation.json, validation.html, predicted/, measured/")


def _validate_with_progress(prep: Any, real: Any, run: Any) -> Any:
    with progress_bar() as bar:
        task = bar.add_task("real run", total=len(prep.workload), unit="requests")
        return run(prep, real, progress=lambda done: bar.update(task, completed=done))


def _validate_against(result: Path, out: Path, fit: bool | None, device: str | None,
                      timer: str, repeats: int, probe_every_s: float,
                      opts: dict[str, Any]) -> None:
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
                                     ("repeats", repeats, 1),
                                     ("probe_every_s", probe_every_s, _PROBE_EVERY_S)):
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
