"""Every scenario preset, run end to end by ``servesim run`` at a small size, gives the
summary.json recorded in tests/data/golden (a change to any result shows up here, named
by its key). summary.json holds simulated quantities only, no wall time, so the files are
exact records; floats are compared to 1e-12 relative, which absorbs a last-digit
difference of another numpy build and nothing a real change leaves.

After a deliberate change to results, rewrite the files and review their diff:
``SERVESIM_UPDATE_GOLDEN=1 python -m pytest -q tests/test_presets.py``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from scenarios.presets import get_scenario, list_scenarios
from sim.app.cli.main import app

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
#: Requests per run: the preset's own count where it is smaller (teaching's 6).
NUM_REQUESTS = 200
UPDATE = os.environ.get("SERVESIM_UPDATE_GOLDEN") == "1"


def leaves(obj: Any, path: str = "") -> dict[str, Any]:
    """Every scalar of a JSON value by its path (``ttft_s.p99``, ``replicas.0.num_routed``)."""
    items = (obj.items() if isinstance(obj, dict)
             else enumerate(obj) if isinstance(obj, list) else None)
    if items is None:
        return {path: obj}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(leaves(v, f"{path}.{k}" if path else str(k)))
    return out


def differences(got: Any, want: Any) -> list[str]:
    """The paths where two summaries differ: a key only in one, a different type or
    string, or floats further apart than 1e-12 relative."""
    g, w = leaves(got), leaves(want)
    out = [f"{p}: only in {'the run' if p in g else 'the golden file'}"
           for p in sorted(g.keys() ^ w.keys())]
    for p in sorted(g.keys() & w.keys()):
        a, b = g[p], w[p]
        same = (math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
                if isinstance(a, float) and isinstance(b, float) else
                type(a) is type(b) and a == b)
        if not same:
            out.append(f"{p}: {a!r} (run) != {b!r} (golden)")
    return out


def test_every_preset_has_a_golden_file() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.summary.json")) == sorted(
        f"{name}.summary.json" for name in list_scenarios())


@pytest.mark.parametrize("name", list_scenarios())
def test_preset_summary_equals_golden(name: str, tmp_path: Path) -> None:
    n = min(NUM_REQUESTS, get_scenario(name).num_requests)
    res = CliRunner().invoke(app, ["run", "--scenario", name, "--num-requests", str(n),
                                   "--seed", "0", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "run" / "summary.json").read_text())
    path = GOLDEN / f"{name}.summary.json"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert path.exists(), f"no {path.name}: SERVESIM_UPDATE_GOLDEN=1 writes it"
    assert differences(got, json.loads(path.read_text())) == []
