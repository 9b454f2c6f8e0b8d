"""A run as a Chrome trace (chrome_trace.json, written by ``servesim run --chrome-trace``):
the Trace Event Format that Perfetto (ui.perfetto.dev) and chrome://tracing open.

Owns the layout. Each replica is a process ("replica 0", ...). In it:

- thread "steps": one complete event ("X") per steps.csv row, run-length compressed as
  steps.csv is by default (step_compression.compress_steps: ``num_steps`` steps of one composition
  share one event), named by the batch's composition (prefill, decode, mixed), with the
  row's counts as args; the first MAX_STEP_EVENTS rows of the run, shared equally by
  the replicas.
- counters ("C"): vLLM's gauges ``num_requests_running`` (the step's batch),
  ``num_requests_waiting`` and ``kv_cache_usage_perc`` (blocks used / usable blocks, a
  fraction as vLLM's gauge is), over the whole run: one point per step, or, for a run of
  more than COUNTER_POINTS steps, one per equal time bucket holding the bucket's peak (as
  the report's timeline does), so the file stays bounded.
- threads "requests N": one "X" event per finished request from arrival to finish,
  holding nested ``queued`` (arrival to first scheduled), ``prefill`` (to first token)
  and ``decode`` (to finish) events; requests are laid into as few threads as keep
  their spans apart. The first MAX_REQUEST_SPANS requests by arrival.

A disaggregated run (``servesim run --disagg xPyD``: its step table has a ``pool``
column, its request table the TTFT split of sim/disagg/records.py) is drawn engine by
engine: each engine is a process named by its pool ("prefill 0", ..., "decode 0", ...,
prefill engines first) with its steps thread and counters as above (kv_cache_usage_perc
over its own pool's blocks: the pools may run on different GPUs or TP); a request's
phases are sim/disagg/records.py request_phases'. A request prefilled remotely has
two spans, on its prefill engine from arrival to the KV's landing (while
that engine holds its blocks) holding ``prefill queued``, ``prefill``, ``kv wait`` and
``kv transfer``, and on its decode engine from the landing to finish holding ``decode
admission`` and ``decode``; a prompt kept local has one span on its decode engine, as
an aggregated run's. A last process, "KV link", has one event per transfer, from its
start to its landing, in as few threads as keep them apart.

Times are whole microseconds from the run's start (integers, so nested events nest
exactly after Perfetto converts them to nanoseconds). ``otherData`` says what was cut.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

import numpy as np

from sim.disagg.records import (
    DECODE_ENGINE_PHASES,
    PREFILL_ENGINE_PHASES,
    has_replica,
    request_phases,
)
from sim.request import RequestStatus
from sim.step_compression import compress_steps
from sim.table import Table, column

#: Step events in the whole trace, shared equally by the replicas; later steps appear in
#: the counters only.
MAX_STEP_EVENTS = 50_000
#: Request spans in the whole trace (the earliest arrivals).
MAX_REQUEST_SPANS = 10_000
#: Counter points per gauge per replica (the report's TIMELINE_POINTS).
COUNTER_POINTS = 2000
#: Thread ids: the step thread, then the request lanes.
STEP_TID = 0


def chrome_trace(requests: Table, steps: Table, num_gpu_blocks: int | Mapping[str, int]
                 ) -> dict[str, Any]:
    """The trace of a run's request and step tables (metrics.REQUEST_COLUMNS and
    STEP_COLUMNS, with a ``replica`` column for a cluster, and ``pool`` with the TTFT
    split for a disaggregated run; seconds) as the Trace Event Format's JSON object.
    ``num_gpu_blocks`` (one engine's KV pool, in blocks) scales kv_cache_usage_perc: an
    int for every replica, or for a disaggregated run a mapping pool -> its engines'
    blocks (the pools' engines may differ: summary.json's disagg.<pool>.num_gpu_blocks).
    Raises TypeError for a disaggregated run given an int."""
    if "pool" in steps:
        if not isinstance(num_gpu_blocks, Mapping):
            raise TypeError("a disaggregated run's trace needs num_gpu_blocks per pool")
        return _disagg_trace(requests, steps, num_gpu_blocks)
    if isinstance(num_gpu_blocks, Mapping):
        raise TypeError("an aggregated run's trace needs one num_gpu_blocks, not a mapping")
    events: list[dict[str, Any]] = []
    rep_steps = _replica_column(steps)
    rep_reqs = _replica_column(requests)
    replicas = sorted(set(rep_steps.tolist()) | set(rep_reqs.tolist()))
    step_rows = 0
    step_cap = MAX_STEP_EVENTS // max(len(replicas), 1)
    for r in replicas:
        mine = {c: v[rep_steps == r] for c, v in steps.items()}
        engine, num_steps = _engine_events(mine, r + 1, f"replica {r}", num_gpu_blocks,
                                           step_cap)
        events += engine
        step_rows += num_steps
    spans, num_spans = _request_events(requests, rep_reqs)
    events += spans
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {
        "source": "servesim", "step_events": step_rows,
        "max_step_events_per_replica": step_cap,
        "request_spans": num_spans, "max_request_spans": MAX_REQUEST_SPANS,
        "counter_points_per_replica": COUNTER_POINTS}}


def _engine_events(steps: Table, pid: int, name: str, num_gpu_blocks: int, step_cap: int
                   ) -> tuple[list[dict[str, Any]], int]:
    """One engine's process (``pid``, named ``name``): its names, counters and step
    events (the first ``step_cap``); and how many step events."""
    events = [_meta("process_name", pid, None, name),
              _meta("process_sort_index", pid, None, pid - 1),
              _meta("thread_name", pid, STEP_TID, "steps")]
    events += _counters(steps, pid, num_gpu_blocks)
    step_events = _step_events(steps, pid, step_cap)
    return events + step_events, len(step_events)


def _replica_column(table: Table) -> np.ndarray:
    """The ``replica`` column, or zeros for a single engine's table."""
    n = len(column(table, next(iter(table))))
    return (column(table, "replica").astype(np.int64) if "replica" in table
            else np.zeros(n, dtype=np.int64))


def _us(t_s: np.ndarray | float) -> np.ndarray:
    """Seconds as whole microseconds (int64)."""
    return np.rint(np.asarray(t_s, dtype=np.float64) * 1e6).astype(np.int64)


def _meta(name: str, pid: int, tid: int | None, value: str | int) -> dict[str, Any]:
    """A metadata ("M") event naming (or ordering) a process or thread."""
    key = "sort_index" if name.endswith("sort_index") else "name"
    ev: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": {key: value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _step_events(steps: Table, pid: int, cap: int) -> list[dict[str, Any]]:
    """One "X" event per compressed step row, the first ``cap``."""
    rows = compress_steps(steps)
    n = min(len(rows["start_time"]), cap)
    start = _us(rows["start_time"][:n])
    end = _us(rows["start_time"][:n] + rows["duration_s"][:n])
    end[:-1] = np.minimum(end[:-1], start[1:])  # a summed duration's rounding never overlaps
    keys = ("num_steps", "num_seqs", "num_prefill_tokens", "num_decode_tokens",
            "num_waiting", "kv_blocks_used", "num_preempted")
    cols = {k: rows[k][:n].tolist() for k in keys}
    out = []
    for i in range(n):
        pre, dec = cols["num_prefill_tokens"][i], cols["num_decode_tokens"][i]
        name = "mixed" if pre and dec else "prefill" if pre else "decode"
        out.append({"ph": "X", "name": name, "cat": "step", "pid": pid, "tid": STEP_TID,
                    "ts": int(start[i]), "dur": int(end[i] - start[i]),
                    "args": {k: cols[k][i] for k in keys}})
    return out


def _counters(steps: Table, pid: int, num_gpu_blocks: int) -> list[dict[str, Any]]:
    """The three gauges at each step start, or each bucket's peak at its start."""
    t = column(steps, "start_time")
    gauges = {"num_requests_running": column(steps, "num_seqs").astype(np.float64),
              "num_requests_waiting": column(steps, "num_waiting").astype(np.float64),
              "kv_cache_usage_perc": column(steps, "kv_blocks_used")
              / max(num_gpu_blocks - 1, 1)}
    if len(t) > COUNTER_POINTS:
        t, gauges = _bucket_peaks(t, gauges)
    ts = _us(t).tolist()
    out = []
    for name, values in gauges.items():
        for when, v in zip(ts, values.tolist(), strict=True):
            out.append({"ph": "C", "name": name, "pid": pid, "ts": when,
                        "args": {name: v}})
    return out


def _bucket_peaks(t: np.ndarray, gauges: dict[str, np.ndarray]
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """COUNTER_POINTS equal time buckets over ``t``: each non-empty bucket's start and
    the largest value of each gauge in it."""
    t0, t1 = float(t[0]), float(t[-1])
    width = (t1 - t0) / COUNTER_POINTS or 1.0
    idx = np.minimum(((t - t0) / width).astype(np.int64), COUNTER_POINTS - 1)
    used = np.unique(idx)
    peaks = {}
    for name, v in gauges.items():
        p = np.full(COUNTER_POINTS, -np.inf)
        np.maximum.at(p, idx, v)
        peaks[name] = p[used]
    return t0 + used * width, peaks


def _request_events(requests: Table, replica: np.ndarray
                    ) -> tuple[list[dict[str, Any]], int]:
    """The finished requests' spans (the first MAX_REQUEST_SPANS by arrival), each in
    the lowest request thread of its replica that is free at its arrival; and how many."""
    order = _first_finished(requests)
    a, s, f, e = (_us(column(requests, c)[order]).tolist() for c in (
        "arrival_time", "first_scheduled_time", "first_token_time", "finish_time"))
    ids = column(requests, "request_id")[order].tolist()
    n_in = column(requests, "num_prompt_tokens")[order].tolist()
    n_out = column(requests, "num_output_tokens")[order].tolist()
    n_pre = column(requests, "num_preemptions")[order].tolist()
    reps = replica[order].tolist()
    lanes: dict[int, _Lanes] = {}
    events: list[dict[str, Any]] = []
    for i in range(len(order)):
        pid = reps[i] + 1
        lane_set = lanes.setdefault(pid, _Lanes())
        tid, new = lane_set.take(a[i], e[i])
        if new:
            events.append(_meta("thread_name", pid, tid, f"requests {tid - 1}"))
        common = {"ph": "X", "cat": "request", "pid": pid, "tid": tid}
        events.append({**common, "name": f"request {ids[i]}", "ts": a[i],
                       "dur": e[i] - a[i], "args": {
                           "num_prompt_tokens": n_in[i], "num_output_tokens": n_out[i],
                           "num_preemptions": n_pre[i]}})
        for name, t0, t1 in (("queued", a[i], s[i]), ("prefill", s[i], f[i]),
                             ("decode", f[i], e[i])):
            events.append({**common, "name": name, "ts": t0, "dur": t1 - t0})
    return events, len(order)


def _first_finished(requests: Table) -> np.ndarray:
    """The row indices of the first MAX_REQUEST_SPANS finished requests by arrival."""
    done = column(requests, "status") == RequestStatus.FINISHED.value
    order = np.flatnonzero(done)
    return order[np.argsort(column(requests, "arrival_time")[order],
                            kind="stable")][:MAX_REQUEST_SPANS]


# -- a disaggregated run ------------------------------------------------------------------

#: The pools, in the order their engines' processes come.
POOLS = ("prefill", "decode")

#: A span to lay into a thread: (start_us, end_us, pid, thread label, its events).
_Span = tuple[int, int, int, str, list[dict[str, Any]]]


def _disagg_trace(requests: Table, steps: Table, num_gpu_blocks: Mapping[str, int]
                  ) -> dict[str, Any]:
    """The trace of a disaggregated run (module docstring): a process per engine,
    prefill engines first, then the KV link's; each engine's kv_cache_usage_perc over
    its pool's ``num_gpu_blocks``."""
    pool = column(steps, "pool")
    rep = column(steps, "replica").astype(np.int64)
    engines = sorted({(POOLS.index(p), r) for p, r in zip(pool.tolist(), rep.tolist(),
                                                            strict=True)})
    pids = {(POOLS[k], r): i + 1 for i, (k, r) in enumerate(engines)}
    events: list[dict[str, Any]] = []
    step_rows = 0
    step_cap = MAX_STEP_EVENTS // max(len(pids), 1)
    for (name, r), pid in pids.items():
        mask = (pool == name) & (rep == r)
        engine, num_steps = _engine_events({c: v[mask] for c, v in steps.items()}, pid,
                                           f"{name} {r}", num_gpu_blocks[name], step_cap)
        events += engine
        step_rows += num_steps
    link_pid = len(pids) + 1
    events += [_meta("process_name", link_pid, None, "KV link"),
               _meta("process_sort_index", link_pid, None, link_pid - 1)]
    spans, num_requests = _handover_spans(requests, pids, link_pid)
    events += _laid_out(spans)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {
        "source": "servesim", "step_events": step_rows,
        "max_step_events_per_replica": step_cap,
        "request_spans": num_requests, "max_request_spans": MAX_REQUEST_SPANS,
        "transfer_events": sum(sp[2] == link_pid for sp in spans),
        "counter_points_per_replica": COUNTER_POINTS}}


def _handover_spans(requests: Table, pids: dict[tuple[str, int], int], link_pid: int
                    ) -> tuple[list[_Span], int]:
    """The spans of the first MAX_REQUEST_SPANS finished requests by arrival (module
    docstring; their phases are records.request_phases'), and how many requests."""
    order = _first_finished(requests)
    drawn = {c: column(requests, c)[order] for c in requests}
    pre = _engine_indices(drawn["prefill_replica"])
    dec = _engine_indices(drawn["decode_replica"])
    ids, n_in, n_out, n_pre = (drawn[c].tolist() for c in (
        "request_id", "num_prompt_tokens", "num_output_tokens", "num_preemptions"))
    k = len(PREFILL_ENGINE_PHASES)  # the KV lands at stamp k, on leaving the prefill engine
    spans: list[_Span] = []
    for i, (phases, stamps) in enumerate(request_phases(drawn)):
        t = np.maximum.accumulate(_us(np.asarray(stamps))).tolist()  # rounding never reorders
        name, p, d = f"request {ids[i]}", pre[i], dec[i]
        assert d is not None, "a finished request ended on a decode engine"
        d_pid = pids[("decode", d)]
        decode_args = {"num_prompt_tokens": n_in[i], "num_output_tokens": n_out[i],
                       "num_preemptions": n_pre[i]}
        if p is None:  # kept local: queued, prefill and decode on the decode engine
            spans.append(_span(d_pid, "request", name, phases, t,
                               {**decode_args, "prefill_engine": "local"}))
            continue
        p_pid, p_name, d_name = pids[("prefill", p)], f"prefill {p}", f"decode {d}"
        spans.append(_span(p_pid, "request", name, PREFILL_ENGINE_PHASES, t[:k + 1],
                           {"num_prompt_tokens": n_in[i], "decode_engine": d_name}))
        spans.append(_span(d_pid, "request", name, DECODE_ENGINE_PHASES, t[k:],
                           {**decode_args, "prefill_engine": p_name}))
        spans.append(_span(link_pid, "transfer", name, (), t[k - 1:k + 1], {
            "from": p_name, "to": d_name, "num_prompt_tokens": n_in[i]}))
    return spans, len(order)


def _engine_indices(values: np.ndarray) -> list[int | None]:
    """A requests table's prefill_replica or decode_replica column as engine indices,
    None where the request never reached that pool (records.has_replica)."""
    return [int(v) if k else None
            for v, k in zip(values.tolist(), has_replica(values).tolist(), strict=True)]


def _span(pid: int, cat: str, name: str, phases: tuple[str, ...], stamps_us: list[int],
          args: dict[str, Any]) -> _Span:
    """A span of category ``cat`` ("request" or "transfer", laid into the threads
    "requests N" or "transfers N") named ``name``, from the first of ``stamps_us`` to the
    last, holding one event per phase between consecutive stamps."""
    common = {"ph": "X", "cat": cat, "pid": pid}
    events = [{**common, "name": name, "ts": stamps_us[0],
               "dur": stamps_us[-1] - stamps_us[0], "args": args}]
    events += [{**common, "name": phase, "ts": t0, "dur": t1 - t0}
               for phase, t0, t1 in zip(phases, stamps_us, stamps_us[1:], strict=False)]
    return stamps_us[0], stamps_us[-1], pid, f"{cat}s", events


def _laid_out(spans: list[_Span]) -> list[dict[str, Any]]:
    """The spans' events, each span in the lowest thread of its process free at its
    start (spans taken by start time), and the names of the threads they open."""
    lanes: dict[int, _Lanes] = {}
    out: list[dict[str, Any]] = []
    for start, end, pid, label, events in sorted(spans, key=lambda sp: sp[0]):
        tid, new = lanes.setdefault(pid, _Lanes()).take(start, end)
        if new:
            out.append(_meta("thread_name", pid, tid, f"{label} {tid - 1}"))
        out += [{**ev, "tid": tid} for ev in events]
    return out


class _Lanes:
    """A replica's request threads: the lowest thread free at a span's start."""

    def __init__(self) -> None:
        self._busy: list[tuple[int, int]] = []  # (end_us, tid) of spans in progress
        self._free: list[int] = []
        self._count = 0

    def take(self, start_us: int, end_us: int) -> tuple[int, bool]:
        """The thread id for a span [start_us, end_us], and whether it is new."""
        while self._busy and self._busy[0][0] <= start_us:
            heapq.heappush(self._free, heapq.heappop(self._busy)[1])
        new = not self._free
        if new:
            self._count += 1
            tid = STEP_TID + self._count
        else:
            tid = heapq.heappop(self._free)
        heapq.heappush(self._busy, (end_us, tid))
        return tid, new
