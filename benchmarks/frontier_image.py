"""docs/img/sweep-frontier.png: the Pareto frontier figure of sweep.html (output tokens/s
per GPU against per user, the frontier's configs labelled), photographed by headless
Chromium from a sweep of Llama-3.1-8B on H100s over the Azure conversation trace:

    python benchmarks/frontier_image.py [--traces ../shared/traces]

The page photographed holds only the frontier section of the sweep's sweep.html
(sim/app/reports/sweep_page.py frontier_section), so the image is the figure the
report draws. Needs chromium on PATH (apt-get install -y chromium).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.reports.sweep_page import frontier_section, page
from sim.app.runs.sweep import aggregate

REPO = Path(__file__).resolve().parents[1]
AXES = ["max_num_seqs", "tensor_parallel_size", "rate"]
SWEEP = ["--max-num-seqs", "8,32,128", "--tensor-parallel-size", "1,2", "--rate", "4,16",
         "--num-requests", "500", "--seeds", "0", "--workers", "2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    args = parser.parse_args()
    chromium = next((p for p in map(shutil.which, ("chromium", "chromium-browser",
                                                    "google-chrome")) if p), None)
    if chromium is None:
        raise SystemExit("error: no chromium on PATH (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trace = args.traces / "AzureLLMInferenceTrace_conv.csv"
        res = CliRunner().invoke(app, ["sweep", "--trace", str(trace), *SWEEP,
                                       "--out", str(work / "sweep")])
        if res.exit_code != 0:
            raise SystemExit(res.output)
        df = pd.read_csv(work / "sweep" / "sweep.csv")
        # An all-empty error column reads as float NaN; the frontier wants text.
        df["error"] = df["error"].astype(object).fillna("")
        body = frontier_section(aggregate(df, AXES), AXES)
        (work / "frontier.html").write_text(page("servesim sweep: the Pareto frontier", body))
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", "--virtual-time-budget=15000",
                        f"--user-data-dir={work / 'profile'}", "--window-size=1200,900",
                        f"--screenshot={work / 'frontier.png'}",
                        f"file://{work / 'frontier.html'}"], check=True,
                       capture_output=True)
        out = REPO / "docs" / "img" / "sweep-frontier.png"
        shutil.copy(work / "frontier.png", out)
        print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
