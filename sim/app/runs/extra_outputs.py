"""A run directory's optional files, each written only when its ``servesim run`` option
asks for it (so a run's default files stay as they are): bench_result.json
(``--bench-result``: vLLM bench serve's keys, sim/app/runs/bench_result.py),
chrome_trace.json (``--chrome-trace``: sim/app/runs/chrome_trace.py) and
requests.parquet / steps.parquet (``--parquet``: the CSVs' columns with their dtypes,
every step one row, through pyarrow, the optional extra ``parquet``)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from sim.app.runs.runner import Prepared
from sim.simulate import SimResult
from sim.table import Table


@dataclass(frozen=True, slots=True)
class Extras:
    """Which optional files a run writes."""

    bench_result: bool = False
    chrome_trace: bool = False
    parquet: bool = False

    def file_names(self) -> tuple[str, ...]:
        """The files these options add to the run directory."""
        return ((("bench_result.json",) if self.bench_result else ())
                + (("chrome_trace.json",) if self.chrome_trace else ())
                + (("requests.parquet", "steps.parquet") if self.parquet else ()))


def parquet_missing() -> str | None:
    """One line saying how to get Parquet output when pyarrow is not installed, else
    None."""
    if importlib.util.find_spec("pyarrow") is None:
        return ("--parquet needs pyarrow: pip install 'servesim[parquet]' "
                "(or pip install pyarrow)")
    return None


def write_extras(run_dir: Path, prep: Prepared, result: SimResult, extras: Extras) -> None:
    """Write the files ``extras`` asks for into ``run_dir`` (a staged run directory)."""
    if extras.bench_result:
        from sim.app.runs.bench_result import bench_header, bench_result

        doc = bench_result(result.request_table, result.itl, result.summary,
                           bench_header(prep.config, len(prep.workload)))
        (run_dir / "bench_result.json").write_text(json.dumps(doc, indent=2) + "\n")
    if extras.chrome_trace:
        from sim.app.runs.chrome_trace import chrome_trace

        blocks = (prep.num_gpu_blocks if prep.pools is None
                  else {pool: e.num_gpu_blocks for pool, e in prep.pools.items()})
        doc = chrome_trace(result.request_table, result.step_table, blocks)
        with open(run_dir / "chrome_trace.json", "w") as f:
            json.dump(doc, f, separators=(",", ":"))
    if extras.parquet:
        write_parquet(run_dir / "requests.parquet", result.request_table)
        write_parquet(run_dir / "steps.parquet", result.step_table)


def write_parquet(path: Path, table: Table) -> None:
    """``table`` (a column table) as a Parquet file; raises ValueError (parquet_missing's
    line) without pyarrow."""
    if (reason := parquet_missing()) is not None:
        raise ValueError(reason)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({name: pa.array(values) for name, values in table.items()}),
                   path)
