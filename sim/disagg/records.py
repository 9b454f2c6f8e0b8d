"""A disaggregated run's records: each request's hand-over times (``HandoverTimes``), the
merge of both pools' records into one SimResult (``merge``) with the TTFT split
columns and summary.json's ``disagg`` block, and each request's path read back from
them (``request_phases``: the phases and their boundaries that the chrome trace and the
report's pool timeline draw).

TTFT split (seconds, per request prefilled remotely; NaN for one kept local or rejected):
prefill_queued_time_s (arrival -> first prefill step), prefill_time_s (-> the prefill
copy's token), kv_wait_time_s (-> the decode engine's blocks allocated: the request
waits at its gate, its prefill blocks held), kv_transfer_time_s (-> the KV landed) and
decode_admission_time_s (-> the first token: the decode engine's waiting queue and the
step that recomputes the prompt's last token). Their sum is ttft_s.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.cluster import Replica
from sim.disagg.link import KVLink
from sim.latency_stats import ItlSamples
from sim.metrics import summarize
from sim.request import Request, RequestStatus
from sim.simulate import SimResult
from sim.step_totals import StepTotals
from sim.table import Table, column

#: The TTFT split columns requests.csv gains in a disaggregated run, in order.
SPLIT_COLUMNS = ("prefill_queued_time_s", "prefill_time_s", "kv_wait_time_s",
                 "kv_transfer_time_s", "decode_admission_time_s")
#: A remotely prefilled request's phases on its prefill engine (which holds its blocks
#: until the KV lands): the first four parts of the TTFT split, the KV transfer last.
PREFILL_ENGINE_PHASES = ("prefill queued", "prefill", "kv wait", "kv transfer")
#: Then on its decode engine: the split's last part, then first token to finish.
DECODE_ENGINE_PHASES = ("decode admission", "decode")
#: The phases of a prompt kept local (as an aggregated run's request): arrival to first
#: scheduled, to first token, to finish, all on its decode engine.
LOCAL_PHASES = ("queued", "prefill", "decode")


@dataclass(slots=True)
class HandoverTimes:
    """Per workload index: the prefill replica, the decode replica and the times (s) of
    the hand-over: first prefill step, prefill copy finished, transfer started, ended."""

    rows: dict[int, list[Any]] = field(default_factory=dict)

    def local(self, index: int, decode_replica: int) -> None:
        self.rows[index] = [None, decode_replica, math.nan, math.nan, math.nan, math.nan]

    def rejected(self, index: int, prefill_replica: int) -> None:
        self.rows[index] = [prefill_replica, None, math.nan, math.nan, math.nan, math.nan]

    def prefilled(self, req: Request, prefill_replica: int, decode_replica: int,
                  now: float) -> None:
        first = req.first_scheduled_time
        self.rows[req.index] = [prefill_replica, decode_replica,
                                math.nan if first is None else first, now, math.nan, math.nan]

    def transfer_started(self, index: int, now: float) -> None:
        self.rows[index][4] = now

    def transfer_ended(self, index: int, now: float) -> None:
        self.rows[index][5] = now


def merge(prefill: Sequence[Replica], decode: Sequence[Replica], times: HandoverTimes,
          link: KVLink, *, kw: dict[str, Any], prefill_kw: dict[str, Any],
          min_prompt_tokens: int) -> SimResult:
    """One SimResult: a row per request in workload order (its decode engine's record,
    or its prefill copy's when the prefill engine rejected it) with the replicas and the
    TTFT split; both pools' steps by start time with ``pool`` and ``replica``; the
    decode engines' ITL samples; the summary (over both pools' steps, decode pool's
    figures in ``kw``: its ``kv_cache`` names the decode pool's num_gpu_blocks, its
    usage figures take each step over its own pool's blocks) with its ``disagg``
    block."""
    tables, indices = [], []
    for rep in decode:
        tables.append(rep.recorder.request_columns())
        indices.append(np.sort(np.asarray(rep.routed, dtype=np.int64)))
    for rep in prefill:
        t = rep.recorder.request_columns()
        rejected = t["status"] == RequestStatus.REJECTED.value
        tables.append({c: v[rejected] for c, v in t.items()})
        indices.append(np.sort(np.asarray(rep.routed, dtype=np.int64))[rejected])
    index = np.concatenate(indices)
    order = np.argsort(index, kind="stable")
    requests = {c: np.concatenate([t[c] for t in tables])[order] for c in tables[0]}
    requests.update(_split_columns(index[order], requests, times))
    steps = _steps(prefill, decode)
    itl = ItlSamples.concat([r.recorder.itl_samples() for r in decode])
    totals = _step_totals(steps, prefill_kw["num_gpu_blocks"], kw["num_gpu_blocks"])
    summary = summarize(requests, totals, itl, **kw)
    summary["slots"] = _slots(steps, prefill_kw["max_num_seqs"], kw["max_num_seqs"])
    summary["disagg"] = _disagg_block(requests, steps, itl, prefill, decode, link,
                                      summary["duration_s"], kw, prefill_kw,
                                      min_prompt_tokens)
    return SimResult(requests, steps, itl, summary)


def _step_totals(steps: dict[str, np.ndarray], prefill_num_gpu_blocks: int,
                 decode_num_gpu_blocks: int) -> StepTotals:
    """The StepTotals of both pools' steps, each step's KV usage over its own pool's
    usable blocks (num_gpu_blocks - 1, the null block aside, as StepTotals.of counts
    them): the peak and the duration-weighted mean are over the pools' usage, which
    kv_blocks_used / one pool's blocks would misstate when the pools differ."""
    usable = np.where(steps["pool"] == "prefill", max(prefill_num_gpu_blocks - 1, 1),
                      max(decode_num_gpu_blocks - 1, 1))
    usage = steps["kv_blocks_used"] / usable
    dur = steps["duration_s"]
    return dataclasses.replace(StepTotals.of(steps, decode_num_gpu_blocks),
                               peak_usage=float(usage.max()) if len(usage) else 0.0,
                               usage_s=float((usage * dur).sum()))


def _slots(steps: dict[str, np.ndarray], prefill_max_num_seqs: int,
           decode_max_num_seqs: int) -> dict[str, float]:
    """summary.json's ``slots`` over both pools' steps: slot-steps over each step's own
    pool's max_num_seqs (the pools may differ), so the three fractions sum to 1."""
    prefill = int((steps["pool"] == "prefill").sum())
    total = (prefill * prefill_max_num_seqs
             + (len(steps["pool"]) - prefill) * decode_max_num_seqs)
    return {f"{k}_fraction": float(steps[f"slots_{k}"].sum()) / total if total else 0.0
            for k in ("useful", "idle", "empty")}


def _split_columns(index: np.ndarray, requests: dict[str, np.ndarray],
                   times: HandoverTimes) -> dict[str, np.ndarray]:
    """The replicas (object columns, None where the request never reached that pool)
    and the TTFT split (module docstring)."""
    rows = [times.rows[int(i)] for i in index]
    n = len(rows)
    cols: dict[str, np.ndarray] = {}
    for c, k in (("prefill_replica", 0), ("decode_replica", 1)):
        a = np.empty(n, dtype=object)
        a[:] = [r[k] for r in rows]
        cols[c] = a
    t = np.array([r[2:] for r in rows], dtype=np.float64).reshape(n, 4)
    first_sched, prefilled, started, landed = t.T
    done = requests["status"] == RequestStatus.FINISHED.value
    first_token = np.where(done, requests["first_token_time"], np.nan)
    stamps = (requests["arrival_time"], first_sched, prefilled, started, landed, first_token)
    for c, (a, b) in zip(SPLIT_COLUMNS, itertools.pairwise(stamps), strict=True):
        cols[c] = np.where(done, b - a, np.nan)
    return cols


def _steps(prefill: Sequence[Replica], decode: Sequence[Replica]) -> dict[str, np.ndarray]:
    """Both pools' step rows with ``pool`` ("prefill" / "decode") and ``replica``, by
    start time (ties: prefill first, then replica)."""
    tables = []
    for name, reps in (("prefill", prefill), ("decode", decode)):
        for rep in reps:
            t = rep.recorder.step_columns()
            n = len(t["start_time"])
            pool = np.empty(n, dtype=object)
            pool[:] = name
            tables.append({**t, "pool": pool,
                           "replica": np.full(n, rep.index, dtype=np.int64)})
    steps = {c: np.concatenate([t[c] for t in tables]) for c in tables[0]}
    order = np.lexsort((steps["replica"], steps["pool"] == "decode", steps["start_time"]))
    return {c: v[order] for c, v in steps.items()}


def _disagg_block(requests: dict[str, np.ndarray], steps: dict[str, np.ndarray],
                  itl: ItlSamples, prefill: Sequence[Replica], decode: Sequence[Replica],
                  link: KVLink, duration_s: float, kw: dict[str, Any],
                  prefill_kw: dict[str, Any], min_prompt_tokens: int) -> dict[str, Any]:
    """summary.json's ``disagg``: each pool's utilization (busy GPU-seconds over
    replicas x duration), batch, slots and KV usage; the link's (``_link_block``); the
    mean TTFT split."""
    block: dict[str, Any] = {"min_prompt_tokens": min_prompt_tokens,
                             "num_local": int(sum(r is None for r in requests["prefill_replica"]))}
    for name, reps, pool_kw in (("prefill", prefill, prefill_kw), ("decode", decode, kw)):
        mask = steps["pool"] == name
        pool_steps = {c: v[mask] for c, v in steps.items()}
        s = summarize(requests, pool_steps, itl, **pool_kw)
        busy = float(pool_steps["duration_s"].sum())
        block[name] = {"num_replicas": len(reps), "num_steps": int(mask.sum()),
                       "utilization": busy / (duration_s * len(reps)) if duration_s > 0 else 0.0,
                       "kv_cache": s["kv_cache"], "batch": s["batch"], "slots": s["slots"]}
    block["link"] = _link_block(link, duration_s)
    block["ttft_split_s"] = {c: _mean(requests[c]) for c in SPLIT_COLUMNS}
    return block


def _link_block(link: KVLink, duration_s: float) -> dict[str, Any]:
    """summary.json's ``disagg.link``: the port's figures (bandwidth None for an instant
    link), ``bytes_moved`` and ``num_transfers`` in all, ``port_utilization`` (each
    port's bytes over what it could carry in the run, bandwidth x duration: a list by
    prefill engine, one by decode engine) and ``utilization``, their mean over all the
    ports (each byte leaves one port and enters one, so it is 2 x bytes_moved over the
    ports' capacity)."""
    spec = link.spec
    capacity = spec.bandwidth_bytes_per_s * duration_s  # bytes a port could carry
    ports = {"prefill": [b / capacity if capacity > 0 else 0.0 for b in link.bytes_sent],
             "decode": [b / capacity if capacity > 0 else 0.0 for b in link.bytes_received]}
    every = ports["prefill"] + ports["decode"]
    return {
        "name": spec.name,
        "bandwidth_bytes_per_s": (None if math.isinf(spec.bandwidth_bytes_per_s)
                                  else spec.bandwidth_bytes_per_s),
        "latency_s": spec.latency_s, "bytes_moved": link.bytes_moved,
        "num_transfers": link.num_transfers,
        "utilization": sum(every) / len(every), "port_utilization": ports}


def has_replica(replica: np.ndarray) -> np.ndarray:
    """Whether each request reached an engine of the pool (bool) of ``replica``, its
    prefill_replica or decode_replica column: set, not None (in memory) nor NaN (read
    back from requests.csv)."""
    return np.array([v is not None and v == v for v in replica.tolist()], dtype=bool)


def request_phases(requests: Table) -> list[tuple[tuple[str, ...], list[float]]]:
    """Each request's path as (its phases, their boundaries in s from the run's start:
    one more than the phases, NaN where the request did not finish). Prefilled
    remotely: PREFILL_ENGINE_PHASES then DECODE_ENGINE_PHASES, from arrival_time
    through arrival_time plus each cumulative TTFT split column (SPLIT_COLUMNS, in
    order) to finish_time. Kept local: LOCAL_PHASES over arrival_time,
    first_scheduled_time, first_token_time and finish_time. ``requests``: requests.csv's
    columns, in memory or read back."""
    def col(name: str) -> np.ndarray:
        return np.asarray(column(requests, name), dtype=np.float64)

    remote = has_replica(column(requests, "prefill_replica"))
    a = col("arrival_time")
    split = np.column_stack([np.where(remote, col(c), 0.0) for c in SPLIT_COLUMNS])
    remote_stamps = np.column_stack([a, a[:, None] + np.cumsum(split, axis=1),
                                     col("finish_time")]).tolist()
    local_stamps = np.column_stack([col(c) for c in (
        "arrival_time", "first_scheduled_time", "first_token_time",
        "finish_time")]).tolist()
    phases = PREFILL_ENGINE_PHASES + DECODE_ENGINE_PHASES
    return [(phases, r) if k else (LOCAL_PHASES, loc)
            for k, r, loc in zip(remote.tolist(), remote_stamps, local_stamps, strict=True)]


def _mean(values: np.ndarray) -> float | None:
    v = values[~np.isnan(values)]
    return float(v.mean()) if len(v) else None
