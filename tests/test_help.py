"""``--help`` at 80 columns: every command's options and help texts wrapped, never cut;
the command list gives each command's first paragraph whole."""

from __future__ import annotations

import inspect
import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from sim.app.cli.main import app

WIDTH = 80
GROUP = get_command(app)
COMMANDS = sorted(GROUP.commands)  # type: ignore[attr-defined]


def _help(*args: str) -> str:
    res = CliRunner().invoke(app, [*args, "--help"], terminal_width=WIDTH,
                             env={"COLUMNS": str(WIDTH)})
    assert res.exit_code == 0, res.output
    return res.output


def _flat(text: str) -> str:
    """The help as one line of words: a word the wrapper broke after a hyphen joined."""
    return " ".join(re.sub(r"-\n\s+", "-", text).split())


def test_every_command_is_covered() -> None:
    assert {"run", "report", "list", "inspect", "sweep", "plan", "diagram", "validate",
            "calibrate"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_at_80_columns_shows_every_flag_and_help_text_whole(command: str) -> None:
    text = _help(command)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    flat = _flat(text)
    cmd = GROUP.commands[command]  # type: ignore[attr-defined]
    assert _flat(cmd.help) in flat
    for param in cmd.params:
        if getattr(param, "hidden", False):  # refused or set by the command: not listed
            assert not any(flag in text for flag in param.opts), param.opts
            continue
        for flag in (*param.opts, *param.secondary_opts):
            if flag.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), flag
        if getattr(param, "help", None):
            assert _flat(param.help) in flat, param.help


def test_command_list_gives_each_first_paragraph_whole() -> None:
    text = _help()
    listed = text[text.index("Commands:"):]
    assert "…" not in text and not any(line.endswith("...") for line in listed.splitlines())
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    flat = _flat(text)
    for command in COMMANDS:
        help_text = inspect.cleandoc(GROUP.commands[command].help)  # type: ignore[attr-defined]
        first = help_text.split("\n\n")[0]
        assert f"{command} {_flat(first)}" in flat, command
