"""Which servesim a speed benchmark (speed.py, scale_memory.py, cluster_cost.py)
measures: the installed one, as a user runs it. A regular install (``pip install .``)
runs the compiled engine core (setup.py); an editable one (``pip install -e .``) runs the
checkout's source. They start their child processes outside the checkout
(``outside_checkout``), so that its source folders do not shadow the installed package,
and print ``describe()`` above their figures. (count_instructions.py and
prefix_cache_speed.py put the checkout first on the path: they time its source.)"""

from __future__ import annotations

import subprocess
import sys
import tempfile

_PROBE = ("import sim.fastpath as f\n"
          "print(('source' if f.__file__.endswith('.py') else 'compiled') + ' engine core: '"
          " + f.__file__.rsplit('/sim/', 1)[0])")


def outside_checkout() -> str:
    """A folder to run child processes in: the system's temporary folder."""
    return tempfile.gettempdir()


def describe() -> str:
    """"compiled engine core: <site-packages>" or "source engine core: <checkout>" for
    this Python; raises SystemExit with the install commands when servesim is not
    installed."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          cwd=outside_checkout())
    if proc.returncode != 0:
        raise SystemExit("servesim is not installed for this Python: pip install . (the "
                         "compiled engine) or pip install -e . (the source)")
    return proc.stdout.strip()
