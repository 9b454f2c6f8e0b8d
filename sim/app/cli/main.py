"""The ``servesim`` command line: the typer app and the list of its commands.

Every command turns bad input into one clear line on stderr and exit code 1, never a
traceback. Commands are plain functions in their own modules (``run``, ``capacity``,
``tools``, ``validate``, ``inspect``, and calibration's), listed here, once, in the order
``--help`` lists them (COMMANDS); a command line gets an app of the command it names.
``main``, the console script, is where stop signals are handled (sim/app/cli/stop.py):
the only place a handler is installed.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Annotated

import typer

from sim.app.cli.common import err_console
from sim.app.cli.option_values import join_goodput
from sim.app.cli.stop import Stopped, exit_code, install, kept_line
from sim.staging import remove_own_staging

#: The commands, in the order ``--help`` lists them: name, module, function. A module is
#: imported when an app holding its command is made (make_app).
COMMANDS = (
    ("run", "sim.app.cli.run", "run"),
    ("report", "sim.app.cli.run", "report"),
    ("list", "sim.app.cli.run", "list_known"),
    ("inspect", "sim.app.cli.inspect", "inspect_model"),
    ("sweep", "sim.app.cli.capacity", "sweep"),
    ("plan", "sim.app.cli.capacity", "plan"),
    ("diagram", "sim.app.cli.tools", "diagram"),
    ("validate", "sim.app.cli.validate", "validate"),
    # calibration/cli.py imports torch only inside the command, so this stays cheap.
    ("calibrate", "calibration.cli", "calibrate"),
)


def _print_version(value: bool) -> None:
    """--version: print servesim's version and stop."""
    if value:
        from sim.app.runs.config_file import VERSION

        print(f"servesim {VERSION}")
        raise typer.Exit()


def _root(version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print servesim's version and exit.")] = False) -> None:
    pass


def make_app(names: Collection[str] | None = None) -> typer.Typer:
    """The ``servesim`` typer app with the commands ``names`` (default: all of COMMANDS),
    importing their modules only. Raises KeyError for a name not in COMMANDS."""
    unknown = set(names or ()) - {c[0] for c in COMMANDS}
    if unknown:
        raise KeyError(f"not servesim commands: {', '.join(sorted(unknown))}")
    typer_app = typer.Typer(
        name="servesim", help="LLM-serving scheduling simulator (vLLM-faithful policies).",
        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
        # click's plain help wraps option names and help texts to the terminal's width;
        # rich's panels give the option column half of 80 columns and cut the rest
        # with "…".
        rich_markup_mode=None,
    )
    typer_app.callback()(_root)
    for name, module, function in COMMANDS:
        if names is None or name in names:
            typer_app.command(name)(getattr(importlib.import_module(module), function))
    list_whole(typer_app)
    return typer_app


def app_for(args: list[str]) -> typer.Typer:
    """The app the command line ``args`` needs: when its first argument names a command,
    an app of that command alone, else (an option first, an unknown command, no
    arguments) the whole app, whose help and suggestions name every command. A command's
    parsing, help and errors are the same in either (tests/test_cli.py); the one-command
    app spares a run the other commands' modules and typer's reading of their
    signatures (4% of a 1-request run's instructions)."""
    if args and args[0] in {c[0] for c in COMMANDS}:
        return make_app((args[0],))
    return make_app()


def __getattr__(name: str) -> typer.Typer:
    """``app``: the whole app (every command), made when first asked for (by tests, an
    embedding program); the console script makes the one a command line needs."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _whole_app()


@functools.cache
def _whole_app() -> typer.Typer:
    """make_app() made once: every ``app`` is the same object."""
    return make_app()


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
    if at is None:
        return []
    group = typer.main.get_command(app_for(args[at:]))
    assert isinstance(group, typer.core.TyperGroup)  # an app with a root callback
    sub = group.commands.get(args[at])
    if sub is None:
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
        args = join_goodput(sys.argv[1:])
        code = app_for(args)(args=args, standalone_mode=False)
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
