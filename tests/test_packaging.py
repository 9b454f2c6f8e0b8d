"""What pyproject.toml promises a user who installs servesim: the license shipped as a file
beside an SPDX expression, torch as a floor the tested version (the one the README's and
CI's install command name) satisfies, a ``png`` extra for kaleido, package-data globs that
each match a file, a ``servesim --help`` that imports none of the numeric stack (numpy
alone was a quarter of its start-up), and a console script that gives OpenBLAS one thread
unless the user chose otherwise and freezes the app's imports out of the collector."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")


def _pyproject() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _extra(name: str) -> dict[str, Requirement]:
    """The requirements of optional extra ``name``, by package name."""
    reqs = [Requirement(r) for r in _pyproject()["project"]["optional-dependencies"][name]]
    return {r.name: r for r in reqs}


def test_help_imports_no_numeric_stack() -> None:
    code = ("import sys; from sim.app.cli import main; sys.argv = ['servesim', '--help']\n"
            "try:\n    main.main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "heavy = ('numpy', 'scipy', 'pandas', 'plotly', 'simpy', 'torch')\n"
            "print(sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert "calibrate" in out  # the help was printed, every command listed
    assert out.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("3", "3")])
def test_console_script_sets_up_the_process_before_numpy_loads(given: str | None,
                                                               expected: str) -> None:
    assert _pyproject()["project"]["scripts"]["servesim"] == "sim.app.cli.launch:main"
    code = ("import gc, os, sys; from sim.app.cli import launch, main\n"
            "main.main = lambda: print(os.environ.get('OPENBLAS_NUM_THREADS'),\n"
            "                          gc.get_freeze_count() > 1000, 'numpy' in sys.modules)\n"
            "launch.main()")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=env).stdout
    assert out.split() == [expected, "True", "False"]


def test_every_package_data_glob_matches_a_file() -> None:
    globs = _pyproject()["tool"]["setuptools"]["package-data"]
    for package, patterns in globs.items():
        folder = ROOT.joinpath(*package.split("."))
        assert (folder / "__init__.py").is_file(), package
        for pattern in patterns:
            assert sorted(folder.glob(pattern)), f"{package}: {pattern} matches nothing"


def test_license_is_an_spdx_expression_shipped_as_a_file() -> None:
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"  # a string: the table form is deprecated
    files = [p for pattern in project["license-files"] for p in ROOT.glob(pattern)]
    assert [p.name for p in files] == ["LICENSE"]
    text = files[0].read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_torch_is_a_floor_the_tested_version_meets() -> None:
    torch = _extra("calibration")["torch"]
    assert all(s.operator == ">=" for s in torch.specifier), torch
    assert torch.specifier.contains("99.0")  # a newer torch (a vLLM install's) is accepted
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    install = re.compile(r"pip install (?:-q )?-e '\.\[test,calibration,ray\]' torch==(\S+)")
    tested = {m.group(1) for text in (readme, ci) for m in install.finditer(text)}
    assert len(tested) == 1, tested  # README and CI install the same tested torch
    assert torch.specifier.contains(tested.pop())


def test_png_extra_brings_kaleido_and_a_plotly_that_drives_it() -> None:
    png = _extra("png")
    assert set(png) == {"kaleido", "plotly"}
    # kaleido 1.x needs plotly 6.1 or later; 0.x is the deprecated engine.
    assert not png["kaleido"].specifier.contains("0.2.1")
    assert png["kaleido"].specifier.contains("1.5.1")
    assert not png["plotly"].specifier.contains("6.0.1")
