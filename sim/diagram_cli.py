"""The ``servesim diagram`` command (sim/cli_tools.py calls it): the config to diagram (a
run directory's config.json, or a scenario or trace, with flag overrides), one slot grid
per policy (sim/diagram.py), printed side by side with their notes, and optionally
written as HTML or PNG.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.diagram import (
    SlotGrid,
    diagram_for_config,
    figure,
    legend_text,
    render_html,
    render_text,
    side_by_side,
)

if TYPE_CHECKING:
    from sim.runner import RunConfig

TEACHING_POLICIES = "static,continuous,chunked"
TEACHING_SLOTS = 4


def base_config(run_dir: Path | None, scenario: str | None, trace: str | None,
                overrides: dict[str, Any]) -> RunConfig:
    """The RunConfig to diagram: a run directory's config.json, or a scenario / trace,
    with the non-None ``overrides`` applied (teaching defaults to 4 slots).

    Raises ValueError on conflicting sources, FileNotFoundError on a missing config.json.
    """
    import dataclasses
    import json

    from sim.runner import RunConfig

    if run_dir is not None:
        if scenario is not None or trace is not None:
            raise ValueError("give a run directory or --scenario / --trace, not both")
        path = Path(run_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: not a servesim run directory")
        saved = json.loads(path.read_text())
        names = {f.name for f in dataclasses.fields(RunConfig)}
        cfg = RunConfig(**{k: v for k, v in saved.items() if k in names})
    else:
        cfg = RunConfig(scenario=scenario, trace=trace)
        if scenario == "teaching" and overrides.get("max_num_seqs") is None:
            overrides = {**overrides, "max_num_seqs": TEACHING_SLOTS}
    return dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


def diagram_cli(
    *, run_dir: Path | None, scenario: str | None, trace: str | None, policies: str | None,
    max_steps: int, max_slots: int, first_step: int = 1, idle_letters: bool,
    html_out: Path | None, png_out: Path | None, echo: Callable[[str], None], width: int = 100,
    **overrides: Any,
) -> list[SlotGrid]:
    """Build, print (and optionally write) the slot diagrams of one or more policies.

    With the teaching scenario and no ``policies``, a default policy that is not
    registered is skipped with a note; any other bad input raises ValueError.
    """
    from sim.engine import SchedulerStuck

    for name, v in (("max_steps", max_steps), ("max_slots", max_slots),
                    ("first_step", first_step)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if png_out is not None:
        from sim.report import kaleido_missing

        reason = kaleido_missing()
        if reason:
            raise ValueError(reason)
    cfg = base_config(run_dir, scenario, trace, overrides)
    default = policies is None and scenario == "teaching"
    names = [p.strip() for p in (policies or (TEACHING_POLICIES if default else cfg.policy))
             .split(",") if p.strip()]
    grids: list[SlotGrid] = []
    for name in names:
        try:
            grids.append(diagram_for_config(replace(cfg, policy=name), max_steps=max_steps,
                                            max_slots=max_slots, first_step=first_step))
        except ValueError as e:
            if default and str(e).startswith(f"unknown policy {name!r}"):
                echo(f"note: policy {name} skipped: not registered ({e})")
                continue
            raise
        except SchedulerStuck as e:
            raise ValueError(f"policy {name}: {e}") from e
    echo(legend_text(idle_letters))
    echo("")
    for line in side_by_side([render_text(g, idle_letters=idle_letters) for g in grids],
                             width=width):
        echo(line)
    _echo_notes(grids, echo)
    if html_out is not None:
        Path(html_out).write_text(render_html(grids, idle_letters=idle_letters),
                                  encoding="utf-8")
        echo(f"wrote {html_out}")
    if png_out is not None:
        from sim.report import write_pngs

        paths = write_pngs([figure(g) for g in grids], Path(png_out))
        echo("wrote " + ", ".join(str(p) for p in paths))
    return grids


def _echo_notes(grids: list[SlotGrid], echo: Callable[[str], None]) -> None:
    """Cut notes, then the letter -> request_id legend (once when every grid shares it)."""
    for g in grids:
        note = g.cut_note()
        if note:
            echo(f"{g.title}: {note}")
    same = len({g.legend for g in grids}) == 1
    for g in grids[:1] if same else grids:
        pairs = [f"{lab}={rid}" for lab, rid in g.legend[:26]]
        more = f", ... ({len(g.legend) - 26} more)" if len(g.legend) > 26 else ""
        who = "" if same else f" ({g.title})"
        echo(f"requests{who} (letter=request_id): " + ", ".join(pairs) + more)
