"""The plan command's input (``servesim plan``, sim/app/cli/capacity.py): its options
turned into a PlanSpec (sim/app/runs/plan_spec.py) with the config grid (--disagg auto
expanded), every config checked as its first probe would build it; across GPU types, one
PlanSpec per type at the smallest TP its model fits. ValueError on bad input, for the
command to print in one line."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from sim.app.cli.common import INPUT_ERRORS
from sim.app.runs.axes import AUTO_DISAGG, PLAN_AXES


def plan_spec(opts: dict[str, Any], a: dict[str, Any]) -> Any:
    """The PlanSpec of the plan command's run options ``opts`` (its axes as given, the
    SLOs and router apart from the base run) and search settings ``a``, every config
    checked as its first probe would build it (sweep.check_cells); ValueError on bad
    input."""
    from sim.app.runs.load_search import SLO, with_load
    from sim.app.runs.plan_spec import PlanSpec
    from sim.app.runs.sweep import check_cells, grid_base

    if a["load"] == "concurrency" and a["target_rate"] is not None:
        raise ValueError("with --load concurrency give --target-concurrency, not --target-rate")
    if a["load"] == "rate" and a["target_concurrency"] is not None:
        raise ValueError("--target-concurrency needs --load concurrency")
    if not (math.isfinite(a["start"]) and a["start"] > 0):
        raise ValueError(f"start must be a finite load > 0, got {a['start']}")
    if a["check_requests"] is not None and a["check_requests"] < 1:
        raise ValueError(f"check_requests must be >= 1, got {a['check_requests']}")
    grid = plan_grid(opts)
    slo_ttft, slo_tpot, router = opts.pop("slo_ttft"), opts.pop("slo_tpot"), opts.pop("router")
    base = grid_base(opts, grid)
    target = a["target_rate"] if a["load"] == "rate" else a["target_concurrency"]
    spec = PlanSpec(base, SLO(slo_ttft, slo_tpot, a["slo_percentile"]), grid,
                    load_axis=a["load"], target=target, start=a["start"],
                    tolerance=a["tolerance"], max_probes=a["max_probes"], router=router,
                    check_requests=a["check_requests"], arrival=a["arrival"])
    seed = grid.seeds[0] if grid.seeds else 0
    check_cells(dataclasses.replace(base, router=router), grid,
                lambda c: with_load(c, a["load"], max(a["start"], 1.0), seed),
                skip_refused=True)
    return spec


def plan_grid(opts: dict[str, Any]) -> Any:
    """The plan's config grid (sweep.Grid), its axes and seeds taken out of ``opts``;
    --disagg auto stands for AUTO_DISAGG. ValueError on bad input."""
    from sim.app.runs.sweep import Grid

    axes = {n: opts.pop(n) for n in PLAN_AXES}
    if axes["disagg"] is not None:  # auto, alone or in a list, stands for AUTO_DISAGG
        given = [v.strip() for v in axes["disagg"].split(",")]
        values = [a for v in given for a in (AUTO_DISAGG if v.lower() == "auto" else (v,))]
        # repeated values once, compared as the axis spells them (xPyD upper case)
        axes["disagg"] = ",".join(dict.fromkeys(v.lower() if v.lower() == "none"
                                                else v.upper() for v in values))
    return Grid.parse(axes, opts.pop("seeds"))


def _base_and_grid(opts: dict[str, Any]) -> tuple[Any, Any]:
    """The plan's base RunConfig (sweep.grid_base) and config grid of ``opts`` (left as
    they are)."""
    from sim.app.runs.runner import RunConfig
    from sim.app.runs.sweep import grid_base

    o = dict(opts)
    grid = plan_grid(o)
    names = {f.name for f in dataclasses.fields(RunConfig)}
    return grid_base({k: v for k, v in o.items() if k in names}, grid), grid


def gpu_specs(opts: dict[str, Any], search: dict[str, Any],
              gpus: list[str | None]) -> tuple[dict[str, Any], dict[str, str]]:
    """(PlanSpec by GPU preset name, error by GPU preset name for a type that cannot be
    planned). A GPU type without --tensor-parallel-size gets the smallest TP its model
    fits, in every cell of the grid (gpu_ranking.grid_tensor_parallel). ValueError for an
    unknown GPU (naming --gpu), and for input no type can plan (the first type's error)."""
    from calibration.gpus import get_gpu
    from sim.app.runs.gpu_ranking import grid_tensor_parallel

    names = []
    for g in gpus:
        try:
            names.append(get_gpu(g).name if g is not None else None)
        except ValueError as e:
            raise ValueError(f"--gpu: {e}") from None
    specs, errors = {}, {}
    for g in names:
        o = dict(opts, gpu=g)
        try:
            if o.get("tensor_parallel_size") is None:
                base, grid = _base_and_grid(o)
                o["tensor_parallel_size"] = str(grid_tensor_parallel(base, grid.cells()))
            spec = plan_spec(o, search)
        except INPUT_ERRORS as e:
            errors[g or "default"] = str(e)
            continue
        specs[get_gpu(spec.base.gpu).name] = spec
    if not specs:
        gpu, error = next(iter(errors.items()))
        raise ValueError(error if len(errors) == 1 else f"{gpu}: {error}")
    return specs, errors
