"""The ``servesim`` console script: the process set-up that must precede the app's
imports, then sim/app/cli/main.py's ``main``.

- OpenBLAS gets one thread unless the user set ``OPENBLAS_NUM_THREADS``. numpy starts
  OpenBLAS's thread pool as it loads, and the pool's threads spin for a while after
  starting and after every BLAS call: on a 2-core machine that billed about 0.1 CPU-s to
  every run, which does no linear algebra bigger than a few hundred numbers (the roofline,
  the saturation line fit, calibration's least squares). Worker processes (sweep's pool,
  Ray's tasks) inherit the setting, so N workers do not start N pools of N threads.
- The objects the app's imports made (modules, classes, functions: about 25,000) are
  moved out of the garbage collector's generations with ``gc.freeze()``: they live until
  exit, and the collections a run triggers would otherwise walk them again (a
  10,000-request run: 0.04-0.05 s of collection before, 0.02-0.03 s after).

Only the console script and ``python -m sim.app.cli`` run this; importing sim.app.cli.main
(the tests, a notebook) changes neither setting.
"""

from __future__ import annotations

import gc
import os


def main() -> None:
    """Set up the process (module docstring), then run the ``servesim`` app; exits with
    its exit code (sim/app/cli/main.py ``main``)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from sim.app.cli.main import main as app_main

    gc.freeze()
    app_main()
