"""The ``servesim`` command line: the one typer app and the list of its commands.

Every command turns bad input into one clear line on stderr and exit code 1, never a
traceback. Commands are plain functions in their own modules (``run``, ``capacity``,
``tools``, ``validate``, ``inspect``, and calibration's), registered here, once, in the order
``--help`` lists them.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from calibration.cli import register as register_calibrate
from sim.app.cli.capacity import plan, sweep
from sim.app.cli.common import err_console
from sim.app.cli.inspect import inspect_model
from sim.app.cli.run import list_known, report, run
from sim.app.cli.tools import diagram
from sim.app.cli.validate import validate

app = typer.Typer(
    name="servesim", help="LLM-serving scheduling simulator (vLLM-faithful policies).",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
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


def main() -> None:
    """The ``servesim`` console script: the app, with a usage error (a value of the wrong
    type, an unknown option or command: click's exit code 2 and a boxed message) as one
    line and exit 1, like every other bad input. typer keeps click's exception classes
    private, so they are recognised by name."""
    try:
        code = app(standalone_mode=False)
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
    sys.exit(code if isinstance(code, int) else 0)
