"""servesim's engine core compiled with mypyc: the same Python source, built as C
extensions where a C compiler is present (about twice as fast a simulation, with
byte-identical outputs: docs/performance.md, Compiled engine). Everything else about the
package is in pyproject.toml; this file only adds the extensions.

Not compiled, so the source is what runs:
- an editable install (``pip install -e``: edits take effect without a rebuild);
- ``SERVESIM_COMPILE=0`` in the environment;
- a machine where the build fails (no C compiler, no Python headers): a warning, then the
  pure-Python package, which gives the same results.

COMPILED lists the modules; tests/test_compiled.py builds them in a copy of the project
and runs the whole test suite there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

#: The simulation's hot path (the engine core, the cluster's dispatcher, the queue
#: policies, the roofline), module files relative to this folder. Every class in them is
#: a native class: no attributes outside those declared, no monkeypatching, and a
#: subclass written in Python only where the class allows it (mypyc_attr).
COMPILED = [
    "sim/engine.py",
    "sim/fastpath.py",
    "sim/chunk_run.py",
    "sim/decode_group.py",
    "sim/run_times.py",
    "sim/request.py",
    "sim/batch.py",
    "sim/metrics.py",
    "sim/cluster.py",
    "sim/source.py",
    "sim/kv/block_pool.py",
    "sim/kv/prefix_cache.py",
    "sim/kv/block_cache.py",
    "sim/kv/prefix_index.py",
    "sim/kv/free_block_queue.py",
    "sim/kv/second_copies.py",
    "policies/base.py",
    "policies/chunked.py",
    "policies/queues.py",
    "calibration/roofline.py",
]


def _wanted() -> bool:
    """False for an editable install and with SERVESIM_COMPILE=0."""
    if os.environ.get("SERVESIM_COMPILE", "1") == "0":
        return False
    return not any(cmd in sys.argv for cmd in ("editable_wheel", "develop"))


class OptionalBuildExt(build_ext):
    """build_ext that leaves a pure-Python install when any extension fails to build
    (all or none: the modules share mypyc's runtime library), and compiles floating
    point as Python computes it (no fused multiply-add: bit-identical step times on
    every CPU)."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":
            for ext in self.extensions:
                if "-ffp-contract=off" not in ext.extra_compile_args:  # a list they may share
                    ext.extra_compile_args.append("-ffp-contract=off")
        try:
            super().build_extensions()
        except Exception as e:
            for path in self.get_outputs():
                if os.path.exists(path):
                    os.remove(path)
            print(f"warning: servesim's compiled engine was not built ({e}); "
                  "installing the pure-Python engine, which gives the same results",
                  file=sys.stderr)


class FreshBuildPy(build_py):
    """build_py that first deletes the extensions an earlier build left in the build
    folder (``pip install .`` builds in the checkout's build/): build_ext, which runs
    after it, makes again the ones this build compiles, while a module taken off
    COMPILED, or every one with SERVESIM_COMPILE=0, would otherwise ship its stale
    extension, linked to an older shared runtime (two copies of one class: TypeError)."""

    def run(self) -> None:
        lib = Path(self.build_lib)
        stale = [*lib.glob("*__mypyc*")]
        for package in ("sim", "policies", "scenarios", "calibration"):
            stale += [*(lib / package).rglob("*.so"), *(lib / package).rglob("*.pyd")]
        for path in stale:
            path.unlink()
        super().run()


def _extensions() -> list:
    if not _wanted():
        return []
    try:
        from mypyc.build import mypycify

        return mypycify(COMPILED, opt_level="3")
    except (Exception, SystemExit) as e:  # mypyc missing, or exiting on a type error
        print(f"warning: mypyc could not compile servesim's engine ({e}); installing "
              "the pure-Python engine", file=sys.stderr)
        return []


setup(ext_modules=_extensions(),
      cmdclass={"build_ext": OptionalBuildExt, "build_py": FreshBuildPy})
