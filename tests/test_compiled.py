"""The compiled engine (setup.py builds the engine core with mypyc for a regular
install) against its source: the whole suite runs on it. The extensions are built in
place in a copy of the project, and the suite runs there in a fresh pytest with the
copy first on every process's path (the CLI's child processes included). Tests that spy
on a compiled class's methods skip there (conftest.skip_spies_when_compiled); every
other assertion, the fast path against the step-by-step reference and vLLM's recorded
schedules among them, must hold on the compiled engine too.

Skipped where mypyc (the test extra's mypy) or a C compiler is missing, and inside the
run it starts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import ENGINE_COMPILED

ROOT = Path(__file__).resolve().parents[1]
INNER = "SERVESIM_COMPILED_SUITE"  # set in the run this test starts

#: Not copied: version control, virtual environments, build and cache folders, and the
#: top level's run outputs (runs/ and out/; sim/app/runs is source).
_SKIPPED = shutil.ignore_patterns(".git", ".venv", ".ci-venv", "build", "__pycache__",
                                  "*.egg-info", "*.so", ".hypothesis", ".pytest_cache",
                                  ".ruff_cache", ".mypy_cache")


def _ignored(folder: str, names: list[str]) -> set[str]:
    skipped = set(_SKIPPED(folder, names))
    if Path(folder) == ROOT:
        skipped |= {"runs", "out"} & set(names)
    return skipped


def _compiled_modules() -> list[str]:
    """setup.py's COMPILED list, read from its text (importing setup.py would run
    setup())."""
    text = (ROOT / "setup.py").read_text()
    block = text[text.index("COMPILED = ["):]
    return re.findall(r'"([\w/]+\.py)"', block[:block.index("]")])


def test_this_run_is_compiled_when_it_should_be() -> None:
    """The run test_the_suite_passes_on_the_compiled_engine starts imports the compiled
    modules, not their source."""
    if not os.environ.get(INNER):
        pytest.skip("only in the compiled engine's run of the suite")
    assert ENGINE_COMPILED


@pytest.mark.slow
def test_the_suite_passes_on_the_compiled_engine(tmp_path: Path) -> None:
    if os.environ.get(INNER):
        pytest.skip("this is the compiled engine's run")
    pytest.importorskip("mypyc.build", reason="mypyc is not installed (the test extra)")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) to build the compiled engine")
    copy = tmp_path / "servesim"
    shutil.copytree(ROOT, copy, ignore=_ignored, symlinks=True)
    shared = ROOT.parent / "shared"
    if shared.exists():  # the traces and recorded vLLM schedules the suite reads
        (tmp_path / "shared").symlink_to(shared)
    env = {k: v for k, v in os.environ.items() if k != "SERVESIM_COMPILE"}
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    modules = _compiled_modules()
    built = [m for m in modules
             if list((copy / m).parent.glob(Path(m).stem + ".*.so"))
             or list((copy / m).parent.glob(Path(m).stem + ".*.pyd"))]
    assert built == modules, (
        f"compiled {len(built)} of {len(modules)} modules:\n{build.stderr[-3000:]}")
    env.update({INNER: "1", "PYTHONPATH": str(copy)})
    suite = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                           cwd=copy, env=env, capture_output=True, text=True, timeout=1800)
    assert suite.returncode == 0, suite.stdout[-6000:] + suite.stderr[-2000:]
