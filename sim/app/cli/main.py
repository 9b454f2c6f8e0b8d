"""The ``servesim`` command line: the one typer app and the list of its commands.

Every command turns bad input into one clear line on stderr and exit code 1, never a
traceback. Commands are plain functions in their own modules (``run``, ``capacity``,
``tools``, ``validate``, ``inspect``, and calibration's), registered here, once, in the order
``--help`` lists them. ``main``, the console script, is where stop signals are handled
(sim/app/cli/stop.py): the only place a handler is installed.
"""

from __future__ import annotations

import inspect
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from calibration.cli import register as register_calibrate
from sim.app.cli.capacity import plan, sweep
from sim.app.cli.common import err_console
from sim.app.cli.inspect import inspect_model
from sim.app.cli.option_values import join_goodput
from sim.app.cli.run import list_known, report, run
from sim.app.cli.stop import Stopped, exit_code, install, kept_line
from sim.app.cli.tools import diagram
from sim.app.cli.validate import validate
from sim.staging import remove_own_staging

app = typer.Typer(
    name="servesim", help="LLM-serving scheduling simulator (vLLM-faithful policies).",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    # click's plain help wraps option names and help texts to the terminal's width;
    # rich's panels give the option column half of 80 columns and cut the rest with "…".
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    """--version: print servesim's version and stop."""
    if value:
        from sim.app.runs.config_file import VERSION

        print(f"servesim {VERSION}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print servesim's version and exit.")] = False) -> None:
    pass


app.command()(run)
app.command()(report)
app.command("list")(list_known)
app.command("inspect")(inspect_model)
app.command()(sweep)
app.command()(plan)
app.command()(diagram)
app.command()(validate)
# calibration/cli.py imports torch only inside the command, so this stays cheap.
register_calibrate(app)


def summary(help_text: str) -> str:
    """The first paragraph of a command's help (its docstring) as one line."""
    return " ".join(inspect.cleandoc(help_text).split("\n\n")[0].split())


def list_whole(typer_app: typer.Typer) -> None:
    """Give each command of ``typer_app`` without a short help the first paragraph of
    its docstring as one: click lists a short help whole, wrapped, where it would cut
    the docstring to one line and "..."."""
    for info in typer_app.registered_commands:
        if info.short_help is None and info.callback is not None:
            info.short_help = summary(info.callback.__doc__ or "")


list_whole(app)


#: The options naming what a command writes (--out of run, report, sweep, plan, validate
#: and calibrate; diagram's --html and --png; report's --png).
OUTPUT_OPTIONS = ("out", "html", "png")


def main() -> None:
    """The ``servesim`` console script: ``run_app``, stopped cleanly by a stop signal
    (stop.py): the command's cleanup runs, one line says what was kept, and the exit
    code is 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)."""
    since = time.time()
    install()
    try:
        code = run_app()
    except Stopped as stop:
        paths = outputs(sys.argv[1:])
        for path in paths:  # staging the signal caught before its cleanup was armed
            remove_own_staging(path)
        line = kept_line(stop, paths, since)
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)
        sys.exit(exit_code(stop))
    sys.exit(code)


def outputs(args: list[str]) -> list[Path]:
    """The paths the command line ``args`` writes (its OUTPUT_OPTIONS, given or by default;
    run's --out by the default run.py gives it: runs/compare with --compare, else
    runs/latest), parsed
    again without running anything. The command is the first argument that is not an
    option: the app's own options (--version, --help) take no value."""
    at = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)  # an app of several commands
    sub = group.commands.get(args[at]) if at is not None else None
    if at is None or sub is None:
        return []
    with sub.make_context(args[at], args[at + 1:], resilient_parsing=True) as ctx:
        params = ctx.params
    if args[at] == "run" and params.get("out") is None:  # the default run.py picks
        params["out"] = "runs/compare" if params.get("compare") is not None else "runs/latest"
    return [Path(params[n]) for n in OUTPUT_OPTIONS if params.get(n) is not None]


def run_app() -> int:
    """The app, with a usage error (a value of the wrong type, an unknown option or
    command: click's exit code 2 and a boxed message) as one line and exit 1, like every
    other bad input. typer keeps click's exception classes private, so they are
    recognised by name. Returns the exit code."""
    try:
        code = app(args=join_goodput(sys.argv[1:]), standalone_mode=False)
    except Exception as e:  # re-raised below unless it is a usage error
        names = {c.__name__ for c in type(e).__mro__}
        if "NoArgsIsHelpError" in names:  # `servesim` alone: the help, exit 0
            ctx = getattr(e, "ctx", None)
            print(ctx.get_help() if ctx is not None else e)
            sys.exit(0)
        if "UsageError" not in names and "Abort" not in names:
            raise
        ctx = getattr(e, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        text = e.format_message() if hasattr(e, "format_message") else "aborted"
        fail_line = f"error: {where}{text}".replace("\n", " ")
        err_console.print(fail_line, markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    return code if isinstance(code, int) else 0
