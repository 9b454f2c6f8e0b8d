"""A run's result in the key names and units of ``vllm bench serve --save-result``
(bench_result.json, written by ``servesim run --bench-result``), so a simulated run and a
measured one can be compared by the same scripts and dashboards.

Owns the mapping from servesim's records to vLLM's result keys, as vLLM 0.32 writes them
(vllm/benchmarks/serve.py: ``calculate_metrics`` computes the figures, ``benchmark``
builds the result, ``process_one_metric`` adds the statistics of each metric; the header
keys come from ``main_async``). Units are vLLM's: latencies in milliseconds
(``mean_ttft_ms`` ...), ``duration`` in seconds, throughputs per second. The metric
definitions are servesim's own, which already follow vLLM's (sim/metrics.py): ttft from
arrival to first token, tpot per request over its output tokens after the first (one-token
outputs left out), itl the pooled gaps between successive tokens, e2el from arrival to
finish; the statistics use completed requests only, std is numpy's population std.

Percentiles: vLLM writes ``p{P}_{metric}_ms`` for the metrics of ``--percentile-metrics``
(default ``ttft,tpot,itl`` for a generative model) and the percentiles of
``--metric-percentiles`` (default ``99``). This file holds every one servesim's summary
holds: the metrics ttft, tpot, itl, e2el and the percentiles 50, 90, 95, 99 (a superset
of vLLM's default keys: what ``--percentile-metrics ttft,tpot,itl,e2el
--metric-percentiles 50,90,95,99`` writes).

Left out, because a simulator has no such fact: the ``--save-detailed`` per-request lists
(``input_lens``, ``ttfts``, ``itls``, ``generated_texts``, ``errors`` ...; requests.csv
holds each request), ``latencies`` and ``queue_times`` (likewise), ``max_output_tokens_per_s``
(servesim does not record each token's time), ``rtfx`` (audio) and ``tokenizer_id``'s
value (null).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import numpy as np

from sim.latency_stats import ItlSamples, stats, weighted_mean, weighted_stats
from sim.request import RequestStatus
from sim.table import Table, column

#: The metrics with statistics: vLLM's name -> the request column (seconds) it is
#: computed from; ``itl`` comes from the pooled samples instead.
METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": None, "e2el": "e2e_latency_s"}
#: The percentiles written for each metric (those summary.json holds).
BENCH_PERCENTILES = (50, 90, 95, 99)
#: Backend name written in ``backend`` and ``endpoint_type``: the result is a simulation.
BACKEND = "servesim"


def bench_result(requests: Table, itl: ItlSamples, summary: dict[str, Any],
                 header: dict[str, Any]) -> dict[str, Any]:
    """The result dictionary: ``header`` (bench_header), then the run's figures under
    vLLM's keys and units. ``requests`` holds metrics.REQUEST_COLUMNS; ``itl`` the pooled
    ITL samples (s); ``summary`` is summary.json's dictionary (duration, throughputs,
    goodput: the same figures under vLLM's names)."""
    done = column(requests, "status") == RequestStatus.FINISHED.value
    n_in = int(column(requests, "num_prompt_tokens")[done].sum())
    n_out = int(column(requests, "num_output_tokens")[done].sum())
    tput = summary["throughput"]
    out: dict[str, Any] = {
        **header,
        "duration": summary["duration_s"],
        "completed": int(done.sum()),
        "failed": len(done) - int(done.sum()),
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": tput["requests_per_s"],
        "request_goodput": summary["goodput_requests_per_s"],
        "output_throughput": tput["output_tokens_per_s"],
        "total_token_throughput": tput["total_tokens_per_s"],
        "max_concurrent_requests": max_concurrent_requests(
            column(requests, "arrival_time")[done], column(requests, "finish_time")[done]),
    }
    for name, col in METRICS.items():
        s = (_itl_ms(itl) if col is None
             else _values_ms(column(requests, col)[done]))
        out.update({f"{k}_{name}_ms": v for k, v in s.items()})
    return out


def bench_header(config: Any, num_requests: int) -> dict[str, Any]:
    """vLLM's header keys for a run of ``config`` (a RunConfig) over ``num_requests``
    requests: ``date`` (when written, vLLM's %Y%m%d-%H%M%S), the backend, the model,
    the request rate (``"inf"`` when the workload's own timing is used, as vLLM writes an
    unpaced run), burstiness (1.0 unless given: a Poisson process) and the closed loop's
    concurrency as ``max_concurrency``."""
    rate = config.rate
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": BACKEND,
        "backend": BACKEND,
        "label": None,
        "model_id": config.model,
        "tokenizer_id": None,
        "num_prompts": num_requests,
        "request_rate": rate if rate is not None and math.isfinite(rate) else "inf",
        "burstiness": config.burstiness if config.burstiness is not None else 1.0,
        "max_concurrency": config.concurrency,
    }


def _values_ms(values_s: np.ndarray) -> dict[str, float]:
    """mean, median, std and the BENCH_PERCENTILES of the finite ``values_s`` (s), in
    ms, keyed as vLLM's ``process_one_metric`` (``mean``, ``median``, ``std``, ``p99``);
    0.0 for each when there is none (vLLM's ``np.mean(x or 0)``)."""
    v = np.asarray(values_s, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return _zeros()
    s = stats(v)
    out = {"mean": float(v.mean()) * 1000, "median": float(np.median(v)) * 1000,
           "std": float(v.std()) * 1000}
    out.update({f"p{p}": float(s[f"p{p}"] or 0.0) * 1000 for p in BENCH_PERCENTILES})
    return out


def _itl_ms(itl: ItlSamples) -> dict[str, float]:
    """_values_ms of the pooled ITL multiset, computed on its (value, count) pairs
    without expanding them (a long run holds billions of tokens)."""
    keep = np.isfinite(itl.values_s) & (itl.counts > 0)
    v, c = itl.values_s[keep], itl.counts[keep]
    n = int(c.sum())
    if n == 0:
        return _zeros()
    s = weighted_stats(ItlSamples(v, c))
    mean = weighted_mean(v, c, n)
    std = math.sqrt(weighted_mean((v - mean) ** 2, c, n))
    out = {"mean": mean * 1000, "median": float(s["p50"] or 0.0) * 1000, "std": std * 1000}
    out.update({f"p{p}": float(s[f"p{p}"] or 0.0) * 1000 for p in BENCH_PERCENTILES})
    return out


def _zeros() -> dict[str, float]:
    return {k: 0.0 for k in ("mean", "median", "std",
                             *(f"p{p}" for p in BENCH_PERCENTILES))}


def max_concurrent_requests(start_s: np.ndarray, end_s: np.ndarray) -> int:
    """vLLM's ``max_concurrent_requests``: the most requests in flight in any whole
    second after the first start, a request counting in every second bucket from
    int(start - first start) to int(end - first start), both included; 0 for none."""
    if len(start_s) == 0:
        return 0
    t0 = float(start_s.min())
    first = (start_s - t0).astype(np.int64)
    last = (end_s - t0).astype(np.int64)
    delta = np.zeros(int(last.max()) + 2, dtype=np.int64)
    np.add.at(delta, first, 1)
    np.add.at(delta, last + 1, -1)
    return int(np.cumsum(delta).max())
