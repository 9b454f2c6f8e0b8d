"""The ``servesim diagram`` command (sim/app/cli/tools.py calls it): the config to diagram (a
run directory's config.json, or a scenario or trace, with flag overrides), one slot grid
per policy (sim/app/reports/diagram.py), printed side by side with their notes, and optionally
written as HTML or PNG.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.app.cli.common import progress_bar
from sim.app.reports.diagram import (
    SlotGrid,
    fit_width,
    legend_text,
    record_grid,
    render_text,
    side_by_side,
)
from sim.app.reports.slot_page import figure, render_html
from sim.app.runs.out_dir import check_files, write_files

if TYPE_CHECKING:
    from sim.app.runs.runner import RunConfig

TEACHING_POLICIES = "static,continuous,chunked"
TEACHING_SLOTS = 4


def base_config(run_dir: Path | None, scenario: str | None, trace: str | None,
                overrides: dict[str, Any]) -> RunConfig:
    """The RunConfig to diagram: a run directory's config.json, or a scenario / trace,
    with the non-None ``overrides`` applied (teaching defaults to 4 slots).

    Raises ValueError on conflicting sources or a bad config.json (saved_config),
    FileNotFoundError on a missing one.
    """
    import dataclasses

    from sim.app.runs.runner import RunConfig

    if run_dir is not None:
        if scenario is not None or trace is not None:
            raise ValueError("give a run directory or --scenario / --trace, not both")
        cfg = saved_config(Path(run_dir))
    else:
        cfg = RunConfig(scenario=scenario, trace=trace)
        if scenario == "teaching" and overrides.get("max_num_seqs") is None:
            overrides = {**overrides, "max_num_seqs": TEACHING_SLOTS}
    return dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


#: JSON types a RunConfig field annotation admits (bool is not an int here), and words.
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "None": (type(None),),
}
_JSON_WORDS = {"int": "an integer", "float": "a number", "str": "a string",
               "bool": "true or false", "None": "null"}


def saved_config(run_dir: Path) -> RunConfig:
    """The RunConfig saved in ``run_dir/config.json`` (keys it does not know ignored).

    Raises FileNotFoundError when there is none; ValueError naming the file when
    ``run_dir`` is not a directory, the file is not a JSON object, a value has the wrong
    type for its field, or RunConfig refuses a value.
    """
    import dataclasses

    from sim.app.reports.run_dir import read_json
    from sim.app.runs.runner import RunConfig

    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} is not a directory")
    path = run_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not a servesim run directory")
    saved = read_json(run_dir, "config.json")
    fields = {f.name: str(f.type) for f in dataclasses.fields(RunConfig)}
    kept = {k: v for k, v in saved.items() if k in fields}
    for key, value in kept.items():
        kinds = [_JSON_TYPES.get(t.strip()) for t in fields[key].split("|")]
        if None not in kinds and not any(
                isinstance(value, k) and (bool in k or not isinstance(value, bool))
                for k in kinds if k is not None):
            allowed = " or ".join(_JSON_WORDS[t.strip()] for t in fields[key].split("|"))
            raise ValueError(f"{path}: {key} must be {allowed}, got {value!r}")
    try:
        return RunConfig(**kept)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def policy_names(policies: str | None, default: str) -> list[str]:
    """``--policies`` split at commas (``default`` when not given).

    Raises ValueError naming --policies when an entry is empty."""
    if policies is None:
        return [p.strip() for p in default.split(",") if p.strip()]
    names = [p.strip() for p in policies.split(",")]
    if not all(names):
        raise ValueError("--policies: expected comma-separated policy names without empty "
                         f"entries, got {policies!r}")
    return names


def diagram_cli(
    *, run_dir: Path | None, scenario: str | None, trace: str | None, policies: str | None,
    max_steps: int, max_slots: int, first_step: int | None = None, idle_letters: bool,
    html_out: Path | None, png_out: Path | None, echo: Callable[[str], None], width: int = 100,
    **overrides: Any,
) -> list[SlotGrid]:
    """Build, print (and optionally write) the slot diagrams of one or more policies.

    Each grid's window starts at ``first_step``, else where its run's batch is fullest
    (sim/app/reports/diagram.py); its text is cut to ``width`` characters (the
    terminal's), its HTML and PNG keep ``max_steps`` steps. With the teaching scenario and
    no ``policies``, a default policy that is not registered is skipped with a note; any
    other bad input raises ValueError, a ``first_step`` past a run's last step included
    (after simulating it: the run's length is known then).
    """
    for name, v in (("--max-steps", max_steps), ("--max-slots", max_slots),
                    ("--first-step", first_step)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if png_out is not None:
        from sim.app.reports.report import kaleido_missing

        reason = kaleido_missing()
        if reason:
            raise ValueError(reason)
    if html_out is not None:  # before any work (sim/app/runs/out_dir.py)
        check_files(Path(html_out).parent, [Path(html_out).name], "--html")
    cfg = base_config(run_dir, scenario, trace, overrides)
    default = policies is None and scenario == "teaching"
    names = policy_names(policies, TEACHING_POLICIES if default else cfg.policy)
    if png_out is not None:
        _check_pngs(Path(png_out), len(names))
    grids = _grids(cfg, names, default, echo, max_steps=max_steps, max_slots=max_slots,
                   first_step=first_step)
    echo(legend_text(idle_letters))
    echo("")
    shown = [fit_width(g, width) for g in grids]
    for line in side_by_side([render_text(g, idle_letters=idle_letters) for g in shown],
                             width=width):
        echo(line)
    _echo_notes(shown, echo)
    if html_out is not None:
        page = render_html(grids, idle_letters=idle_letters)
        write_files(Path(html_out).parent, {Path(html_out).name: lambda: page}, "--html")
        echo(f"wrote {html_out}")
    if png_out is not None:
        from sim.app.reports.report import write_pngs

        paths = write_pngs([figure(g) for g in grids], Path(png_out))
        echo("wrote " + ", ".join(str(p) for p in paths))
    return grids


def _grids(cfg: RunConfig, names: list[str], default: bool, echo: Callable[[str], None],
           *, max_steps: int, max_slots: int, first_step: int | None) -> list[SlotGrid]:
    """One grid per policy of ``names``, each run simulated with its requests done on the
    progress bar; a ``default`` (teaching) policy that is not registered is skipped with
    a note. Raises ValueError for a bad policy, a stuck scheduler or a ``first_step``
    past a run's last step."""
    from sim.app.runs.run_config import with_policy
    from sim.app.runs.runner import prepare
    from sim.engine import SchedulerStuck

    grids: list[SlotGrid] = []
    with progress_bar() as bar:
        task = bar.add_task("simulating", total=None, unit="requests")
        for name in names:
            try:
                prep = prepare(with_policy(cfg, name))
                bar.reset(task, total=len(prep.workload), description=f"simulating {name}")
                grid = record_grid(prep, max_steps=max_steps, max_slots=max_slots,
                                   first_step=first_step,
                                   progress=lambda done: bar.update(task, completed=done))
            except ValueError as e:
                if default and str(e).startswith(f"unknown policy {name!r}"):
                    echo(f"note: policy {name} skipped: not registered ({e})")
                    continue
                raise
            except SchedulerStuck as e:
                raise ValueError(f"policy {name}: {e}") from e
            if first_step is not None and first_step > grid.num_steps:
                raise ValueError(f"--first-step: {first_step:,} is past the end of the run: "
                                 f"{name} takes steps 1-{grid.num_steps:,}")
            grids.append(grid)
    return grids


def _check_pngs(out: Path, count: int) -> None:
    """Raise ValueError naming --png when a PNG of ``count`` grids (or of one, when the
    teaching default skips a policy) may not be written (sim/app/runs/out_dir.py)."""
    from sim.app.reports.report import png_paths

    paths = {*png_paths(out, count), out}
    check_files(out.parent, sorted(p.name for p in paths), "--png")


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
