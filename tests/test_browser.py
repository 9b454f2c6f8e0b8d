"""The report and the slot diagram open in headless Chromium: every figure renders (its
SVG and traces are in the DOM after load) and no JavaScript error or plotly.js warning is
raised. A probe script, injected into a copy of each page, records errors and plot counts
into the DOM that ``--dump-dom`` prints; the same run saves a screenshot under
test-artifacts/. Skipped where no Chromium is installed (.ci/run installs Debian's)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.reports.report import write_report
from sim.app.runs.run_files import write_run
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM = next((p for p in (shutil.which(n) for n in (
    "chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH (apt-get install -y chromium; .ci/run does this)")]

# Runs first in <head>: records uncaught errors and console.error/warn/trace (plotly.js
# warns through console.trace), then after load lists each plot's SVG layers, its drawn
# traces and the traces with data it should have drawn.
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
['error', 'warn', 'trace'].forEach(function (k) {
  var f = console[k];
  console[k] = function () {
    window.__errors.push(k + ': ' + Array.prototype.join.call(arguments, ' '));
    f.apply(console, arguments);
  };
});
window.addEventListener('load', function () { setTimeout(function () {
  var plots = [];
  document.querySelectorAll('.js-plotly-plot').forEach(function (p) {
    plots.push({id: p.id, svg: p.querySelectorAll('.main-svg').length,
                traces: p.querySelectorAll('g.trace').length,
                expected: (p._fullData || []).filter(function (t) {
                  return t.visible !== false && t.x && t.x.length > 0; }).length});
  });
  var pre = document.createElement('pre');
  pre.id = 'servesim-probe';
  pre.textContent = JSON.stringify({errors: window.__errors, plots: plots,
                                    figures: document.querySelectorAll('.figure').length});
  document.body.appendChild(pre);
}, 300); });
</script>"""
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=15000", "--enable-logging=stderr",
         "--v=0")


def open_in_chromium(page: Path, screenshot: Path, tmp_path: Path,
                     size: str = "1400,3000") -> dict:
    probed = tmp_path / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("<head>", "<head>" + PROBE, 1))
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    profile = tmp_path / f"profile-{page.stem}"
    res = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--window-size={size}",
         f"--screenshot={screenshot}", "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=90, check=False)
    m = re.search(r'<pre id="servesim-probe">([^<]*)</pre>', res.stdout)
    assert m, f"no probe output (exit {res.returncode}): {res.stderr[-2000:]}"
    out = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    out["console"] = [line for line in res.stderr.splitlines()
                      if "CONSOLE" in line and ("Uncaught" in line or "WARN" in line)]
    assert screenshot.stat().st_size > 10_000
    return out


def assert_rendered(probe: dict, num_figures: int) -> None:
    assert probe["errors"] == [] and probe["console"] == [], probe
    assert probe["figures"] == num_figures == len(probe["plots"]), probe
    for plot in probe["plots"]:
        assert plot["svg"] >= 1 and plot["traces"] == plot["expected"] > 0, plot


def test_report_of_two_runs_renders(tmp_path: Path) -> None:
    dirs = []
    for policy in ("chunked", "static"):
        prep = prepare(RunConfig(policy=policy, num_requests=300, step_time=0.01,
                                 max_num_seqs=32))
        write_run(tmp_path / policy, prep, simulate_prepared(prep))
        dirs.append(tmp_path / policy)
    page = tmp_path / "report.html"
    write_report(dirs, page)
    probe = open_in_chromium(page, ARTIFACTS / "report.png", tmp_path)
    assert_rendered(probe, 3)


def test_teaching_diagram_renders(tmp_path: Path) -> None:
    page = tmp_path / "diagram.html"
    res = CliRunner().invoke(app, ["diagram", "--scenario", "teaching", "--html", str(page)])
    assert res.exit_code == 0, res.output
    probe = open_in_chromium(page, ARTIFACTS / "diagram.png", tmp_path, "1200,1500")
    assert_rendered(probe, page.read_text().count('class="figure"'))


def test_validation_page_renders(tmp_path: Path) -> None:
    """validation.html of a tiny real run (sim/app/reports/validation_page.py): three figures."""
    pytest.importorskip("torch")
    from sim.app.reports.validation_page import validation_page
    from sim.app.runs.validate import run_validation, validation_dict
    from tests.test_validate import TINY_REAL

    prep = prepare(RunConfig(scenario="teaching", step_time=0.01, max_num_seqs=4,
                             max_num_batched_tokens=8, block_size=4))
    page = tmp_path / "validation.html"
    page.write_text(validation_page(validation_dict(prep, run_validation(prep, TINY_REAL))))
    probe = open_in_chromium(page, ARTIFACTS / "validation.png", tmp_path, "1400,2600")
    assert_rendered(probe, 3)
