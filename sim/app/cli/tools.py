"""``servesim diagram``: the command that looks inside a run (the slot diagram). The work
is in sim/app/cli/diagram.py, sim/app/reports/diagram.py and sim/app/reports/slot_page.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sim.app.cli.common import INPUT_ERRORS, console, fail
from sim.app.cli.options import declare, with_options


@with_options(*declare(
    ("scenario", "trace", "max_num_seqs", "max_num_batched_tokens", "num_requests",
     "step_time", "seed"),
    scenario={"help": "Built-in scenario, e.g. teaching (6 requests, 4 slots)."},
    max_num_seqs={"default": None,
                  "help": "Batch slots (teaching: 4; else the run's, or vLLM's default "
                          "for the GPU as in run)."},
    max_num_batched_tokens={"default": None}, seed={"default": None}))
def diagram(
    run_dir: Annotated[Path | None, typer.Argument(
        help="Run directory to re-simulate (its config.json); or use --scenario / --trace."
    )] = None,
    policies: Annotated[str | None, typer.Option(
        help="Comma-separated policies, one grid each (teaching: static,continuous,chunked; "
             "else the run's policy or chunked).")] = None,
    max_steps: Annotated[int, typer.Option(
        help="Steps shown (the rest is cut; the terminal's width cuts the text further, "
             "not --html or --png).")] = 64,
    max_slots: Annotated[int, typer.Option(help="Slot rows shown (the rest is cut).")] = 16,
    first_step: Annotated[int | None, typer.Option(
        help="First step shown (1-based; default: where the batch is fullest, the first "
             "window of --max-steps steps whose steps hold the most slots).")] = None,
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
            # Grid rows are cut to the width; rich wraps the notes and legend at words.
            echo=lambda line: console.print(line, markup=False, highlight=False),
            **opts)
    except INPUT_ERRORS as e:
        fail(str(e))
