"""Loading a run directory written by ``servesim run`` (config.json, summary.json,
requests.csv, steps.csv) for the report (sim/app/reports/report.py), checked so that a corrupt or
foreign directory is one clear line, not a traceback deep in a figure.

Also owns ``HEADLINE``, the summary entries of the headline and comparison tables
(sim/app/reports/tables.py draws them), since the check of a run's summary.json reads the
same entries."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

#: (label, summary path, scale, format, better) for the headline and comparison tables.
HEADLINE = (
    ("requests finished", "num_finished", 1, ",d", "higher"),
    ("requests rejected", "num_rejected", 1, ",d", "lower"),
    ("duration (s)", "duration_s", 1, ",.2f", ""),
    ("throughput (req/s)", "throughput.requests_per_s", 1, ",.3f", "higher"),
    ("output tokens/s", "throughput.output_tokens_per_s", 1, ",.1f", "higher"),
    ("total tokens/s", "throughput.total_tokens_per_s", 1, ",.1f", "higher"),
    ("goodput (req/s)", "goodput_requests_per_s", 1, ",.3f", "higher"),
    ("TTFT p50 (ms)", "ttft_s.p50", 1000, ",.1f", "lower"),
    ("TTFT p99 (ms)", "ttft_s.p99", 1000, ",.1f", "lower"),
    ("TPOT p50 (ms)", "tpot_s.p50", 1000, ",.2f", "lower"),
    ("TPOT p99 (ms)", "tpot_s.p99", 1000, ",.2f", "lower"),
    ("E2E p50 (s)", "e2e_latency_s.p50", 1, ",.3f", "lower"),
    ("E2E p99 (s)", "e2e_latency_s.p99", 1, ",.3f", "lower"),
    ("queueing p99 (s)", "queued_time_s.p99", 1, ",.3f", "lower"),
    ("preemptions", "num_preemptions", 1, ",d", "lower"),
    ("prefix cache hit rate (tokens)", "prefix_cache.hit_rate_tokens", 1, ".1%", "higher"),
    ("prefill tokens saved", "prefix_cache.prefill_tokens_saved", 1, ",d", "higher"),
    ("prefix cache evictions (blocks)", "prefix_cache.evictions", 1, ",d", ""),
    ("KV cache peak usage", "kv_cache.peak_usage", 1, ".1%", ""),
    ("KV cache mean usage", "kv_cache.mean_usage", 1, ".1%", ""),
    ("mean batch (seqs)", "batch.mean_num_seqs", 1, ",.1f", ""),
    ("slots useful", "slots.useful_fraction", 1, ".1%", "higher"),
    ("slots held idle", "slots.idle_fraction", 1, ".1%", "lower"),
    ("slots empty", "slots.empty_fraction", 1, ".1%", ""),
)


RUN_FILES = ("config.json", "summary.json", "requests.csv", "steps.csv")


@dataclass
class RunData:
    """One run directory, loaded."""

    name: str
    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame


#: What the report reads from a run directory (load_run checks them): the latency
#: metrics of summary.json, each with these statistics, and the CSV columns (all numeric
#: but ``status``; steps.csv's optional ``num_steps`` and ``replica`` are read when there).
LATENCY_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2e_latency_s", "queued_time_s")
LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99", "max")
REQUEST_COLUMNS = ("first_token_time", "finish_time", "ttft_s", "tpot_s", "e2e_latency_s",
                   "queued_time_s", "status")
STEP_COLUMNS = ("start_time", "duration_s", "num_seqs", "num_prefill_tokens",
                "num_decode_tokens", "kv_blocks_used", "num_waiting", "num_preempted")


def load_run(path: Path, name: str | None = None) -> RunData:
    """Read a run directory written by ``servesim run``.

    Raises FileNotFoundError naming the missing directory or file; ValueError (one line
    naming the run directory and the file) when ``path`` is not a directory, a file is
    unreadable, a JSON file is not an object, or summary.json lacks a key or a CSV a
    column the report reads.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run directory {path} not found")
    if not path.is_dir():
        raise ValueError(f"run directory {path} is not a directory")
    for f in RUN_FILES:
        if not (path / f).is_file():
            raise FileNotFoundError(f"{path / f} not found: not a servesim run directory")
    config = read_json(path, "config.json")
    resolved = config.get("resolved")
    if resolved is not None and not isinstance(resolved, dict):
        raise ValueError(f"run directory {path}: config.json: 'resolved' must be an object, "
                         f"got {type(resolved).__name__}")
    summary = read_json(path, "summary.json")
    _check_summary(path, summary)
    requests = _read_csv(path, "requests.csv", REQUEST_COLUMNS)
    steps = _read_csv(path, "steps.csv", STEP_COLUMNS, optional=("num_steps",))
    return RunData(name or path.name, path, config, summary, requests, steps)


def read_json(run: Path, file: str) -> dict[str, Any]:
    """``run/file`` parsed; ValueError naming both unless it is a JSON object."""
    try:
        data = json.loads((run / file).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"run directory {run}: {file} is not valid JSON "
                         f"({type(e).__name__}: {str(e)[:200]})") from e
    if not isinstance(data, dict):
        raise ValueError(f"run directory {run}: {file} must hold a JSON object, "
                         f"got {type(data).__name__}")
    return data


def _check_summary(run: Path, summary: dict[str, Any]) -> None:
    """The latency statistics (numbers or null) and kv_cache.num_gpu_blocks (a number)
    the report reads; ValueError naming the first missing or wrong one."""
    where = f"run directory {run}: summary.json"
    reads = f"the report reads {', '.join(LATENCY_KEYS)} and kv_cache"
    for key in (*LATENCY_KEYS, "kv_cache"):
        if key not in summary:
            raise ValueError(f"{where} has no {key!r} ({reads})")
        if not isinstance(summary[key], dict):
            raise ValueError(f"{where}: {key!r} must be an object, got "
                             f"{type(summary[key]).__name__}")
    for key in LATENCY_KEYS:
        for stat in LATENCY_STATS:
            if stat not in summary[key]:
                raise ValueError(f"{where}: {key!r} has no {stat!r} (the report reads "
                                 f"{', '.join(LATENCY_STATS)})")
            v = summary[key][stat]
            if v is not None and not _is_number(v):
                raise ValueError(f"{where}: {key}.{stat} must be a number or null, got {v!r}")
    _check_headline(where, summary)
    blocks = summary["kv_cache"].get("num_gpu_blocks")
    if not _is_number(blocks) or not math.isfinite(blocks):
        raise ValueError(f"{where}: kv_cache.num_gpu_blocks must be a number, got {blocks!r}")


def _check_headline(where: str, summary: dict[str, Any]) -> None:
    """The headline table's optional entries (``HEADLINE``): null, absent, or
    a number (an integer for counts) under objects."""
    for _, key, _, fmt, _ in HEADLINE:
        v: Any = summary
        for part in key.split("."):
            if v is not None and not isinstance(v, dict):
                raise ValueError(f"{where}: {key} must sit in an object, got {v!r} above it")
            v = None if v is None else v.get(part)
        if v is not None and not (_is_number(v) and (fmt[-1] != "d" or isinstance(v, int))):
            kind = "an integer" if fmt[-1] == "d" else "a number"
            raise ValueError(f"{where}: {key} must be {kind} or null, got {v!r}")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _read_csv(run: Path, file: str, columns: Sequence[str],
              optional: Sequence[str] = ()) -> pd.DataFrame:
    """``run/file`` read; ValueError when it is unreadable, lacks one of ``columns``, or
    one of them (or of the ``optional`` ones present), ``status`` aside, holds a value
    that is not a number (a header without rows has no types to check)."""
    where = f"run directory {run}: {file}"
    try:
        df = pd.read_csv(run / file)
    except pd.errors.EmptyDataError as e:
        raise ValueError(f"{where} is empty (expected a CSV header and rows)") from e
    except (UnicodeDecodeError, pd.errors.ParserError) as e:
        raise ValueError(f"{where} is not a readable CSV ({str(e).strip()[:200]})") from e
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{where} lacks column(s) {', '.join(missing)}, which the report "
                         "reads")
    for c in (*columns, *(o for o in optional if o in df.columns)) if len(df) else ():
        if c != "status" and not pd.api.types.is_numeric_dtype(df[c]):
            raise ValueError(f"{where}: column {c} must be numeric, got dtype {df[c].dtype}")
    return df


def load_runs(paths: Sequence[Path]) -> list[RunData]:
    """Load several runs, naming each by its directory name (the full path where two
    names collide)."""
    names = [Path(p).name for p in paths]
    return [load_run(Path(p), n if names.count(n) == 1 else str(p))
            for p, n in zip(paths, names, strict=True)]
