"""``servesim validate --engine vllm``: the command's path when a real vLLM engine serves
the workload (sim/app/cli/validate.py dispatches here), and the real run's config check
both engines share (``checked_config``). The work is in
sim/app/runs/validate_vllm.py and sim/app/runs/vllm_comparison.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.app.cli.common import INPUT_ERRORS, console, fail, progress_bar
from sim.app.cli.options import FRONTEND_OPTIONS

if TYPE_CHECKING:
    from sim.app.runs.runner import RunConfig


def checked_config(out: Path, fit_frontend: bool | None, opts: dict[str, Any]) -> RunConfig:
    """The real run's config from the command's options (validate's defaults from the
    profile), once the options that apply only with --against are refused and --out is
    known to be writable: before measuring, so nothing is lost at the end. Raises
    ValueError naming the option or the directory."""
    from sim.app.reports.validation_page import check_validation_out
    from sim.app.runs.against import check_without_against
    from sim.app.runs.validate import validation_config

    check_without_against(fit_frontend=fit_frontend, **opts)
    frontend = {o.name for o in FRONTEND_OPTIONS}
    cfg = validation_config(**{k: v for k, v in opts.items() if k not in frontend})
    check_validation_out(out)
    return cfg


def validate_vllm(out: Path, python: str | None, device: str | None, timer: str,
                  repeats: int, fit_frontend: bool | None, also_profile: Path | None,
                  opts: dict[str, Any]) -> None:
    """Prepare, replay through vLLM, compare, write and print; one line and exit 1 on
    bad input or a failing engine."""
    from calibration.vllm_measure import DriverError
    from sim.app.reports.validation_page import write_vllm_validation
    from sim.app.runs.validate_vllm import (
        prepare_vllm_validation,
        price_also,
        run_vllm_validation,
    )
    from sim.engine import SchedulerStuck

    try:
        if repeats != 1:
            raise ValueError("repeats applies to the torch engine's real run (vLLM serves "
                             "each step once, as in service)")
        cfg = checked_config(out, fit_frontend, opts)
        prep, setup = prepare_vllm_validation(cfg, python, device, timer)
    except INPUT_ERRORS as e:
        fail(str(e))
    console.print(f"workload: {len(prep.workload):,} requests ({prep.workload.source})")
    console.print(f"prediction: {prep.cost_model_label}", highlight=False)
    console.print(f"real run: the vLLM engine in {setup.python}: {setup.spec.name} "
                  f"({setup.dtype}) on {setup.device}, {setup.threads or 'default'} threads, "
                  f"{setup.timer} clock, block size {setup.block_size}, "
                  f"{prep.num_gpu_blocks:,} blocks", highlight=False)
    try:
        with progress_bar() as bar:
            task = bar.add_task("vLLM serving", total=len(prep.workload),
                                unit="requests")
            v = run_vllm_validation(prep, setup,
                                    lambda done: bar.update(task, completed=done))
        also = price_also(prep, v, also_profile) if also_profile is not None else None
        data = write_vllm_validation(out, prep, v, also)
    except (DriverError, SchedulerStuck, *INPUT_ERRORS) as e:
        fail(str(e))
    _print(data, out)


def _print(data: dict[str, Any], out: Path) -> None:
    from sim.app.runs.validate import error_table, schedule_line, step_error_line
    from sim.app.runs.vllm_comparison import agreement_line, rejected_line

    def plain(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    if data["real"]["device_note"]:
        plain(f"warning: {data['real']['device_note']}")
    if (line := rejected_line(data)) is not None:
        plain(line)
    console.print(error_table(data, title="simulation vs the vLLM engine"))
    plain(step_error_line(data))
    plain(schedule_line(data))
    plain(agreement_line(data))
    if data["also"] is not None:
        also = data["also"]
        console.print(error_table(also, title=f"{also['profile']} vs the same vLLM run"))
        plain(step_error_line(also))
    console.print(f"wrote {out}/validation.json, validation.html, predicted/")
