"""The ``servesim calibrate`` command: measure step latencies on a real engine (servesim's
torch decoder, or vLLM in its own process: calibration/vllm_measure.py), or refit a stored
profile; fit the step-cost model, print the held-out error table, write the profile.

Owns: :func:`register` (adds the command to the main Typer app) and the command itself.
Bad input, a missing torch, a failed vLLM driver, a corrupt profile or a refused fit end in
one line on stderr and exit code 1. torch is imported only when measuring with it; vLLM
never here; the fit and profile modules (numpy) only inside the command, so that every
other command's start-up and ``servesim --help`` stay free of numpy.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from calibration.hf_config import spec_from_hf_config
from calibration.specs import ModelSpec
from sim.staging import staging_file

if TYPE_CHECKING:
    from calibration.fit import FitResult
    from calibration.grid import GridConfig
    from calibration.measure import Measurement
    from calibration.profile import Profile

INSTALL_HINT = "install the calibration extra: pip install 'servesim[calibration]'"
ENGINES = ("torch", "vllm")


def register(app: typer.Typer) -> None:
    """Add the ``calibrate`` command to ``app``."""
    app.command("calibrate")(calibrate)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def error_table(fit: FitResult, title: str) -> Table:
    """Per-region errors of a fit, in percent (held-out = not used by the fit)."""
    t = Table(title=title, header_style="bold")
    for col in ("region", "train pts", "held-out pts", "train MAPE", "held-out MAPE",
                "held-out worst"):
        t.add_column(col, justify="left" if col == "region" else "right")
    pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    for region, e in fit.errors.items():
        t.add_row(region, str(e.num_train), str(e.num_heldout), pct(e.train_mape),
                  pct(e.mape), pct(e.max_error))
    return t


def _report(console: Console, profile: Profile, title: str) -> None:
    from calibration.fit import FEATURES

    console.print(error_table(profile.fit, title))
    knot = profile.fit.knot_tokens
    pairs = zip(FEATURES, profile.fit.coefficients, strict=True)
    coefs = ", ".join(f"{n}={c:.4g}" for n, c in pairs)
    console.print(f"fit ({profile.fit.status}, knot {knot} tokens, on each point's "
                  f"{'median' if profile.fit.statistic == 'median' else 'fastest'} run): "
                  f"{coefs}", highlight=False)
    if profile.approximation:
        console.print(f"approximation: {profile.approximation}", highlight=False)
    if profile.engine.get("name") == "vllm":
        console.print(engine_line(profile.engine), highlight=False)


def engine_line(e: dict[str, Any]) -> str:
    """vLLM's start-up facts and its own share of a step (all but the model forward and
    the LM head: scheduling, input preparation, sampling, output processing), per region
    (median over the points)."""
    shares: dict[str, list[float]] = {}
    for row in e.get("phases", []):
        model = row.get("model_forward", 0.0) + row.get("compute_logits", 0.0)
        shares.setdefault(row["region"], []).append(1 - model / row["seconds"])
    own = ", ".join(f"{r} {sorted(v)[len(v) // 2]:.1%}" for r, v in shares.items())
    return (f"engine: vLLM {e.get('vllm_version')} (torch {e.get('torch_version')}) on "
            f"{e.get('device')}, {e.get('dtype')}, block size {e.get('block_size')}, "
            f"{'eager' if e.get('enforce_eager') else 'compiled'}, KV cache "
            f"{e.get('kv_cache_tokens', 0):,} tokens ({e.get('num_gpu_blocks')} blocks), "
            f"start-up {e.get('startup_s', 0):.1f} s, {e.get('timer')} clock; vLLM's own "
            f"share of a step (median): {own or 'not timed'}")


def _save(profile: Profile, out: Path) -> None:
    from calibration.profile import save_profile

    try:
        save_profile(profile, out)
    except ValueError as exc:
        _fail(str(exc))


def check_out(target: Path) -> None:
    """Refuse, before any measuring, a --out that cannot take the profile: a directory
    (``--out ''`` is the current one), a missing or read-only folder, or a file there
    that is not a servesim profile. Raises ValueError naming --out; the check creates and
    removes a staging file in the folder (sim/staging.py)."""
    from calibration.profile import check_profile_place

    if target.is_dir():
        shown = "'' or '.' (the current directory)" if str(target) == "." else str(target)
        raise ValueError(f"--out: {shown} is a directory; give a profile file name such "
                         "as cpu-qwen2.5-0.5b.json")
    folder = target.parent
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise ValueError(f"--out: cannot write {target}: folder {folder} {what}")
    check_profile_place(target)
    try:
        staging_file(folder, target.name, "").unlink()
    except OSError as exc:
        raise ValueError(f"--out: cannot write {target}: folder {folder} is not writable "
                         f"({exc.strerror or exc})") from exc


def rejected_path(target: Path) -> Path:
    """Where a refused fit keeps its measurements: beside the profile it was for."""
    return target.with_name(target.stem + ".rejected.json")


def check_run_options(seed: int, threads: int | None) -> None:
    """Raises ValueError naming --seed (must be >= 0, as every command's) or --threads
    (0, torch's default, up to this machine's CPU count: more only oversubscribes it, and
    a huge count crashes torch)."""
    if seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed}")
    cpus = os.cpu_count() or 1
    if threads is not None and not 0 <= threads <= cpus:
        raise ValueError(f"--threads must be between 0 (torch's default) and {cpus} (this "
                         f"machine's CPUs), got {threads}")


def model_spec(model: str, config: Path | None) -> ModelSpec:
    """The preset ``model``, or the spec of a Hugging Face config.json (a file or a folder
    holding one). Raises ValueError naming --config and the file when it cannot be read,
    is not a JSON object or lacks what a spec needs; the preset lookup's ValueError."""
    from calibration.specs import get_model

    if config is None:
        return get_model(model)
    file = config / "config.json" if config.is_dir() else config
    try:
        return spec_from_hf_config(file)
    except (ValueError, TypeError) as exc:
        msg = str(exc).removeprefix(f"{file}: ")
        raise ValueError(f"--config {file}: {msg}") from exc


def check_engine_options(engine: str, python: str | None, block_size: int | None,
                         enforce_eager: bool | None) -> None:
    """Raises ValueError naming --engine (torch or vllm) or a vLLM-only option given with
    the torch engine (--python, --block-size, --enforce-eager), or a --block-size < 1."""
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    given = [name for name, value in (("--python", python), ("--block-size", block_size),
                                      ("--enforce-eager", enforce_eager)) if value is not None]
    if engine == "torch" and given:
        raise ValueError(f"{', '.join(given)}: only with --engine vllm")
    if block_size is not None and block_size < 1:
        raise ValueError(f"--block-size must be >= 1, got {block_size}")


def calibrate(
    model: Annotated[str, typer.Option(
        help="Model preset to measure (see `servesim list`); ignored with --config.")
    ] = "qwen2.5-0.5b",
    device: Annotated[str, typer.Option(help="Where to measure: cpu or cuda[:N].")] = "cpu",
    dtype: Annotated[str, typer.Option(help="Weights and KV dtype: bf16, fp16, fp32.")] =
        "bf16",
    num_layers: Annotated[int | None, typer.Option(
        help="Measure only this many layers; per-layer costs are scaled up to the full "
             "model (an approximation, labelled in the profile). Default: all layers.")
    ] = None,
    max_num_seqs: Annotated[int, typer.Option(
        help="Largest decode batch in the grid (match the simulated max_num_seqs).")] = 32,
    max_num_batched_tokens: Annotated[int, typer.Option(
        help="Largest tokens per step in the grid (the simulated token budget).")] = 512,
    max_context: Annotated[int, typer.Option(
        help="Longest context (tokens) in the grid.")] = 2048,
    repeats: Annotated[int, typer.Option(
        help="Timed rounds over the grid; each point keeps its fastest, median and "
             "slowest run (--fit-statistic picks what the fit takes).")] = 5,
    threads: Annotated[int | None, typer.Option(
        help="CPU threads while measuring: torch's, or vLLM's OpenMP threads (default 1: "
             "robust on a shared machine; 0 = the library's default).")] = 1,
    budget_s: Annotated[float, typer.Option(
        help="Measuring time limit in seconds; points measured so far are kept.")] = 540.0,
    out: Annotated[Path | None, typer.Option(
        help="Profile JSON to write. Default: DEVICE-MODEL.json, DEVICE-vllm-MODEL.json "
             "with --engine vllm (with --refit: overwrite the refitted profile).")] = None,
    force: Annotated[bool, typer.Option(
        help="Keep a fit whose held-out MAPE exceeds 10% in some region.")] = False,
    refit_path: Annotated[Path | None, typer.Option(
        "--refit", help="Refit this profile's stored points instead of measuring.")] = None,
    config: Annotated[Path | None, typer.Option(
        help="Hugging Face config.json to measure instead of a preset.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random weights and tokens.")] = 0,
    engine: Annotated[str, typer.Option(
        help="What runs the steps: torch (servesim's random-weight decoder) or vllm (a "
             "real vLLM V1 engine with dummy weights, in its own process: --python).")
    ] = "torch",
    python: Annotated[str | None, typer.Option(
        help="Python that has vLLM installed (--engine vllm). Default: this one.")] = None,
    timer: Annotated[str, typer.Option(
        help="Step clock: thread (the measuring thread's CPU time: other processes' time "
             "on the core not counted), wall, or auto (thread on CPU with one thread, "
             "else wall).")] = "auto",
    block_size: Annotated[int | None, typer.Option(
        help="vLLM's KV block size (--engine vllm; default: vLLM's, 128 on CPU).")] = None,
    enforce_eager: Annotated[bool | None, typer.Option(
        "--enforce-eager/--no-enforce-eager",
        help="vLLM eager mode, or its compiled mode (--engine vllm; default eager: "
             "start-up in seconds, not minutes).")] = None,
    fit_statistic: Annotated[str | None, typer.Option(
        help="Fit each point's fastest run (min) or its median. Default: median on the "
             "thread clock (other processes' time is not counted, and the median is the "
             "step one real run meets), min on the wall clock (load only adds time); "
             "with --refit, the profile's.")] = None,
) -> None:
    """Measure prefill, decode and mixed step latencies on a real engine (servesim's torch
    decoder, or vLLM), fit a step-cost model and write a versioned profile (`servesim run
    --profile FILE` uses it)."""
    console = Console()
    from calibration.fit import STATISTICS  # numpy: not at import, --help stays quick

    if fit_statistic is not None and fit_statistic not in STATISTICS:
        _fail(f"--fit-statistic must be {' or '.join(STATISTICS)}, got {fit_statistic!r}")
    if refit_path is not None:
        try:
            if out is not None:
                check_out(out)
        except ValueError as exc:
            _fail(str(exc))
        _refit(console, refit_path, out or refit_path, force, fit_statistic)
        return
    from calibration.grid import GridConfig
    from calibration.measure import resolve_timer
    from calibration.profile import check_profile_place

    try:
        check_run_options(seed, threads)
        check_engine_options(engine, python, block_size, enforce_eager)
        resolve_timer(timer, device, threads)
        spec = model_spec(model, config)
        grid = GridConfig(max_num_seqs, max_num_batched_tokens, max_context, repeats)
        name = f"{'vllm-' if engine == 'vllm' else ''}{spec.name}"
        target = out or Path(f"{device.split(':')[0]}-{name}.json")
        check_out(target)
        check_profile_place(rejected_path(target))  # where a refused fit is kept
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    start = time.perf_counter()
    run = dict(num_layers=num_layers, dtype=dtype, device=device, budget_s=budget_s,
               seed=seed, timer=timer)
    if engine == "vllm":
        m = _measure_vllm(spec, grid, run, python, config, threads, block_size,
                          enforce_eager)
    else:
        m = _measure_torch(spec, grid, run, threads)
    console.print(f"measured {len(m.points)} of {m.num_planned} grid points in "
                  f"{m.elapsed_s:.0f} s on {m.device_name} ({m.engine['timer']} clock)",
                  highlight=False)
    if len(m.points) < m.num_planned // 2:
        _fail(f"only {len(m.points)} of {m.num_planned} grid points fit in --budget-s "
              f"{budget_s:g}; raise it, or lower --num-layers or the grid limits")
    from calibration.fit import default_statistic

    statistic = fit_statistic or default_statistic(m.engine["timer"])
    _fit_and_save(console, spec, m, target, force, statistic)
    console.print(f"wrote {target} in {time.perf_counter() - start:.0f} s", highlight=False)


def _measure_torch(spec: ModelSpec, grid: GridConfig, run: dict[str, Any],
                   threads: int | None) -> Measurement:
    from calibration.measure import measure

    if importlib.util.find_spec("torch") is None:
        _fail(f"torch is not installed; {INSTALL_HINT}")
    try:
        return measure(spec, grid, threads=threads or None, **run)
    except ImportError as exc:
        _fail(f"cannot import torch ({exc}); {INSTALL_HINT}")
    except (ValueError, RuntimeError) as exc:
        _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _measure_vllm(spec: ModelSpec, grid: GridConfig, run: dict[str, Any], python: str | None,
                  config: Path | None, threads: int | None, block_size: int | None,
                  enforce_eager: bool | None) -> Measurement:
    from calibration.vllm_measure import DriverError, VllmSettings, measure_vllm

    file = config / "config.json" if config is not None and config.is_dir() else config
    settings = VllmSettings(python or sys.executable, file, threads or None, block_size,
                            True if enforce_eager is None else enforce_eager)
    try:
        return measure_vllm(spec, grid, settings, **run)
    except (ValueError, DriverError) as exc:
        _fail(str(exc))


def _fit_and_save(console: Console, spec: ModelSpec, m: Measurement, target: Path,
                  force: bool, statistic: str) -> None:
    """Fit, report, write the profile; a refused fit keeps the measurements beside it."""
    from calibration.fit import FitRejected, fit_points
    from calibration.profile import profile_from_measurement

    try:
        fit = fit_points(m.points, force=force, statistic=statistic)
    except FitRejected as exc:
        kept = rejected_path(target)
        rejected = profile_from_measurement(spec, m, exc.fit)
        _report(console, rejected, "held-out error per region (REFUSED)")
        _save(rejected, kept)
        _fail(f"{exc}; measurements kept in {kept} (refit: servesim calibrate --refit "
              f"{kept} --force --out {target})")
    except ValueError as exc:
        _fail(str(exc))
    profile = profile_from_measurement(spec, m, fit)
    _report(console, profile, "held-out error per region")
    _save(profile, target)


def _refit(console: Console, source: Path, target: Path, force: bool,
           statistic: str | None) -> None:
    from calibration.fit import FitRejected
    from calibration.profile import load_profile, refit

    try:
        old = load_profile(source)
        new = refit(old, force=force, statistic=statistic)
    except FitRejected as exc:
        console.print(error_table(exc.fit, "held-out error per region (REFUSED)"))
        _fail(f"{source}: {exc}")
    except ValueError as exc:
        _fail(str(exc))
    _report(console, new, "held-out error per region (refit)")
    _save(new, target)
    console.print(f"wrote {target}", highlight=False)
