"""A run directory's files: requests.csv, steps.csv (run-length compressed unless asked
otherwise), summary.json and config.json, the resolved config that reproduces the run
(sim/app/runs/config_file.py reads it back), written whole or not at all: from a
finished run's tables (write_run), or streamed into the staged directory while the run
goes, so that memory does not grow with the requests (run_streamed; run_spooled for
a run that streams its own records, a window replay)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sim.app.runs.config_file import VERSION, trace_record
from sim.app.runs.extra_outputs import Extras, write_extras
from sim.app.runs.out_dir import commit_dirs, stage_dir
from sim.app.runs.run_config import config_record
from sim.app.runs.runner import Prepared, engine_args
from sim.record_spool import RecordSpool
from sim.simulate import SimResult, simulate_streamed
from sim.step_compression import compress_steps
from sim.table import write_csv


def resolved_config(prep: Prepared) -> dict[str, Any]:
    """config.json: the flags as resolved, the trace file's size and sha256, and what was
    derived from them (sim/app/runs/config_file.py reads it back)."""
    cfg = prep.config
    assert cfg.block_size is not None, "RunConfig resolves the block size"
    out: dict[str, Any] = {"servesim_version": VERSION, **config_record(cfg),
                           **trace_record(cfg.trace)}
    out["resolved"] = {
        "max_model_len": prep.scheduler.max_model_len,
        "num_gpu_blocks": prep.num_gpu_blocks,
        "kv_capacity_tokens": prep.num_gpu_blocks * cfg.block_size,
        "num_gpus": cfg.num_gpus,
        "cost_model": prep.cost_model_label,
        "workload": prep.workload.source,
        "num_requests": len(prep.workload),
        "prefix_cache": prep.scheduler.prefix_cache,
        "kv_plan": dataclasses.asdict(prep.kv_plan) if prep.kv_plan else None,
        "model_spec": dataclasses.asdict(prep.model) if prep.model else None,
    }
    if prep.pools is not None:  # a disaggregated run: each pool's engine
        out["resolved"]["pools"] = {name: e.record() for name, e in prep.pools.items()}
    return out


def write_run(out_dir: Path, prep: Prepared, result: SimResult,
              full_steps: bool = False, extras: Extras | None = None) -> None:
    """Write requests.csv, steps.csv, summary.json and config.json into ``out_dir``,
    whole or not at all (sim/app/runs/out_dir.py: staged in a temporary sibling that replaces
    ``out_dir`` once every file is complete). steps.csv is run-length compressed
    (step_compression.compress_steps) unless ``full_steps``; its ``num_steps`` column says how many
    steps each row stands for. Raises ValueError when ``out_dir`` may not be replaced
    (out_dir.check_run_dir: a file, the current directory, or a directory that is not a
    previous run). ``extras``: the optional files also written
    (sim/app/runs/extra_outputs.py)."""
    commit_dirs([(stage_run(out_dir, prep, result, full_steps, extras), Path(out_dir))])


def stage_run(out_dir: Path, prep: Prepared, result: SimResult,
              full_steps: bool = False, extras: Extras | None = None) -> Path:
    """write_run's files in a temporary sibling of ``out_dir``, returned for
    out_dir.commit_dirs (which swaps it in), so that several runs can be swapped in
    together once all are written."""

    def write(tmp: Path) -> None:
        write_csv(tmp / "requests.csv", result.request_table)
        st = result.step_table
        steps = ({**st, "num_steps": np.ones(len(st["start_time"]), dtype=np.int64)}
                 if full_steps else compress_steps(st))
        write_csv(tmp / "steps.csv", steps)
        (tmp / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(resolved_config(prep), indent=2) + "\n")
        if extras is not None:
            write_extras(tmp, prep, result, extras)

    return stage_dir(out_dir, write)


def streams_records(prep: Prepared, extras: Extras | None = None) -> bool:
    """Whether ``servesim run`` streams its records (run_streamed) rather than holding
    them: one engine (a cluster or a disaggregated run merges its engines' records in
    memory) and no optional file that needs the whole tables (--bench-result,
    --chrome-trace, --parquet)."""
    return (prep.config.replicas == 1 and prep.config.disagg is None
            and (extras is None or not extras.file_names()))


def run_streamed(out_dir: Path, prep: Prepared, progress: Callable[[int], None] | None = None,
                 full_steps: bool = False) -> dict[str, Any]:
    """Simulate ``prep`` with requests.csv and steps.csv written into the staged
    ``out_dir`` as the run goes (sim/record_spool.py), then summary.json and config.json,
    and swap it in; the same files, byte for byte, as simulate_prepared + write_run.
    Returns summary.json's dict. On any error (SchedulerStuck, an interrupt) the staging
    is removed and nothing is written. Raises ValueError as write_run. One engine only
    (streams_records)."""
    summary: dict[str, Any] = {}

    def write(tmp: Path) -> None:
        arrivals, common = engine_args(prep, progress)
        spool = RecordSpool(tmp, prep.num_gpu_blocks, full_steps)
        try:
            one = simulate_streamed(arrivals, spool, **common)
        finally:
            spool.close()
        summary.update(one, replicas=[{"replica": 0, "num_routed": len(prep.workload), **one}])
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(resolved_config(prep), indent=2) + "\n")

    commit_dirs([(stage_dir(out_dir, write), Path(out_dir))])
    return summary


def run_spooled(out_dir: Path, prep: Prepared, records: Callable[[Path], dict[str, Any]]
                ) -> dict[str, Any]:
    """run_streamed for a run that streams its own records: ``records(tmp)`` writes
    requests.csv and steps.csv into the staged ``out_dir`` and returns summary.json's dict
    (sim/app/runs/window_replay.py spool_windows); then summary.json and config.json are
    written and the directory swapped in. Returns the summary. On any error the staging
    is removed and nothing is written; ValueError as write_run."""
    summary: dict[str, Any] = {}

    def write(tmp: Path) -> None:
        summary.update(records(tmp))
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(resolved_config(prep), indent=2) + "\n")

    commit_dirs([(stage_dir(out_dir, write), Path(out_dir))])
    return summary
