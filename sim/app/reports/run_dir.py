"""Loading a run directory written by ``servesim run`` (config.json, summary.json,
requests.csv, steps.csv) for the report (sim/app/reports/report.py), checked so that a corrupt or
foreign directory is one clear line, not a traceback deep in a figure, and a cut or edited
one is refused instead of drawn: the files must agree with each other as
sim/app/runs/run_files.py writes them (a requests.csv row per request summary.json counts,
steps wherever a request was scheduled, finite values, no negative time).

Also owns ``HEADLINE``, the summary entries of the headline and comparison tables
(sim/app/reports/tables.py draws them), since the check of a run's summary.json reads the
same entries."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: (label, summary path, scale, format, better) for the headline and comparison tables.
#: Usage fractions (KV cache, batch slots) have no direction: they say how capacity was
#: used, not how well requests were served (slower steps, for one, raise them).
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
    ("slots useful", "slots.useful_fraction", 1, ".1%", ""),
    ("slots held idle", "slots.idle_fraction", 1, ".1%", ""),
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


def load_run(path: Path, name: str | None = None,
             warn: Callable[[str], None] | None = None) -> RunData:
    """Read a run directory written by ``servesim run``.

    Raises FileNotFoundError naming the missing directory or file; ValueError (one line
    naming the run directory and the file) when ``path`` is not a directory, a file is
    unreadable, a JSON file is not an object, summary.json lacks a key or a CSV a
    column the report reads, or the files disagree (:func:`check_requests`,
    :func:`check_steps`). ``warn`` receives one line for what a real run can write but a
    reader should know (a run with no step: every request rejected).
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
    check_requests(path, summary, config, requests)
    note = check_steps(path, requests, steps)
    if note is not None and warn is not None:
        warn(note)
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
            if v is not None and not (_is_number(v) and 0 <= v < math.inf):
                raise ValueError(f"{where}: {key}.{stat} must be a finite number >= 0 or "
                                 f"null, got {v!r}")
    _check_headline(where, summary)
    blocks = summary["kv_cache"].get("num_gpu_blocks")
    if not _is_number(blocks) or not math.isfinite(blocks):
        raise ValueError(f"{where}: kv_cache.num_gpu_blocks must be a number, got {blocks!r}")
    bad = _non_finite(summary)
    if bad is not None:
        raise ValueError(f"{where}: {bad[0]} is {bad[1]!r}; a run writes finite figures")


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
        if v is not None and not 0 <= v < math.inf:
            raise ValueError(f"{where}: {key} must be finite and >= 0, got {v!r}")


def _non_finite(value: Any, key: str = "") -> tuple[str, float] | None:
    """The dotted key and value of the first NaN or infinity in a JSON value (JSON has
    neither; Python's json module reads and writes them as NaN and Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return key, value
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list) else ())
    for k, v in items:
        found = _non_finite(v, f"{key}.{k}" if key else str(k))
        if found is not None:
            return found
    return None


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


def load_runs(paths: Sequence[Path],
              warn: Callable[[str], None] | None = None) -> list[RunData]:
    """Load several runs, naming each by its directory name (the full path where two
    names collide); ``warn`` as in load_run."""
    names = [Path(p).name for p in paths]
    return [load_run(Path(p), n if names.count(n) == 1 else str(p), warn)
            for p, n in zip(paths, names, strict=True)]


#: Request statuses a run writes (sim.request.RequestStatus values).
STATUSES = frozenset({"waiting", "running", "preempted", "finished", "rejected"})
#: Times every finished request has (seconds); latencies no request may have negative.
FINISHED_TIMES = ("first_token_time", "finish_time", "ttft_s", "e2e_latency_s",
                  "queued_time_s")
LATENCIES = ("ttft_s", "tpot_s", "e2e_latency_s", "queued_time_s")


def check_requests(run: Path, summary: dict[str, Any], config: dict[str, Any],
                   requests: pd.DataFrame) -> None:
    """requests.csv against summary.json and config.json as run_files.py writes them: a
    row per request counted (num_requests; config's resolved.num_requests), statuses
    known and counted as num_finished / num_rejected say, every finished request's
    times finite, no latency negative or infinite. ValueError naming the first
    disagreement (a cut or edited file: re-run)."""
    where = f"run directory {run}"
    n = summary.get("num_requests")
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        raise ValueError(f"{where}: summary.json: num_requests must be an integer >= 0, "
                         f"got {n!r}")
    if len(requests) != n:
        raise ValueError(f"{where}: requests.csv has {len(requests):,} rows but summary.json "
                         f"counts {n:,} requests (cut short or edited; re-run)")
    resolved = config.get("resolved") or {}
    if resolved.get("num_requests", n) != n:
        raise ValueError(f"{where}: config.json's resolved.num_requests "
                         f"{resolved['num_requests']!r} differs from summary.json's {n}")
    status = requests["status"]
    unknown = sorted({str(v) for v in status if v not in STATUSES})
    if unknown:
        raise ValueError(f"{where}: requests.csv: status {unknown[0]!r} is none of "
                         f"{', '.join(sorted(STATUSES))}")
    for key, value in (("num_finished", "finished"), ("num_rejected", "rejected")):
        count = int((status == value).sum())
        if summary.get(key) is not None and summary[key] != count:
            raise ValueError(f"{where}: requests.csv has {count:,} {value} requests but "
                             f"summary.json's {key} is {summary[key]:,}")
    finished = (status == "finished").to_numpy()
    for c in (*FINISHED_TIMES, *LATENCIES):
        v = requests[c].to_numpy(np.float64)
        bad = (finished & ~np.isfinite(v)) if c in FINISHED_TIMES else np.zeros(len(v), bool)
        bad |= np.isinf(v) | (v < 0)
        if bad.any():
            i = int(np.argmax(bad))
            what = "finished request's" if finished[i] else "request's"
            raise ValueError(f"{where}: requests.csv line {i + 2}: {c} is {v[i]:g}; a "
                             f"{what} {c} is finite and >= 0")


def check_steps(run: Path, requests: pd.DataFrame, steps: pd.DataFrame) -> str | None:
    """steps.csv against requests.csv: every value finite and >= 0, num_steps (the run
    length of a compressed row) an integer >= 1, and rows wherever a request got a first
    token. ValueError naming the first disagreement; a warning line (returned) for a run
    without steps, which a real run writes when every request was rejected."""
    where = f"run directory {run}: steps.csv"
    if len(steps) == 0:
        served = int(np.isfinite(requests["first_token_time"].to_numpy(np.float64)).sum())
        if served:
            raise ValueError(f"{where} has no rows, but {served:,} requests got a first "
                             "token (cut short or edited; re-run)")
        return (f"{where} has no rows: no request of the {len(requests):,} was scheduled "
                "(every one rejected), so the step figures are empty")
    cols = [*STEP_COLUMNS, *(c for c in ("num_steps", "replica") if c in steps.columns)]
    values = steps[cols].to_numpy(np.float64)
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"{where} line {i + 2}: {cols[j]} is {values[i, j]:g}; a step's "
                         "values are finite and >= 0")
    if "num_steps" in steps.columns:
        k = values[:, cols.index("num_steps")]
        if ((k < 1) | (k != np.floor(k))).any():
            i = int(np.argmax((k < 1) | (k != np.floor(k))))
            raise ValueError(f"{where} line {i + 2}: num_steps is {k[i]:g}; a row stands "
                             "for a whole number >= 1 of steps")
    return None
