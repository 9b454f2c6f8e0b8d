"""Metric definitions (vLLM benchmark conventions) on hand-built records: cases K06, K07."""

from __future__ import annotations

import numpy as np
import pytest

from sim import latency_stats
from sim.latency_stats import ItlSamples, stats, weighted_mean, weighted_stats
from sim.metrics import Recorder, StepRow, summarize
from sim.request import Request, RequestStatus


def finished(i: int, arrival: float, ttft: float, n_out: int, e2e: float) -> Request:
    r = Request(str(i), arrival, 10, n_out, n_out, index=i)
    r.status = RequestStatus.FINISHED
    r.first_scheduled_time = arrival
    r.first_token_time = arrival + ttft
    r.finish_time = arrival + e2e
    r.num_output_tokens = n_out
    return r


def recorded(reqs: list[Request]) -> Recorder:
    rec = Recorder()
    for r in reqs:
        rec.record_request(r)
    rec.record_step(StepRow(0.0, 1.0, 1, 10, 0, 1, 0, 1, 0, 0, 0))
    return rec


def test_k06_tpot_is_per_request_itl_is_per_token() -> None:
    a = finished(0, 0.0, 0.100, 2, 0.200)
    b = finished(1, 0.0, 0.100, 101, 1.100)
    rec = recorded([a, b])
    rec.book_itl(0.100)  # A's single gap
    rec.book_itl(0.010, 100)  # B's 100 gaps
    requests = rec.request_columns()
    s = summarize(requests, rec.step_columns(), rec.itl_samples(), max_num_seqs=1,
                  num_gpu_blocks=10, block_size=16)
    assert s["tpot_s"]["mean"] == pytest.approx(0.055)
    assert s["itl_s"]["mean"] == pytest.approx(0.01089, abs=1e-5)
    assert s["itl_s"]["p50"] == pytest.approx(0.010)
    # TTFT + sum of a request's ITLs = its E2E
    assert pytest.approx(requests["e2e_latency_s"][1]) == 0.100 + 100 * 0.010


def test_k07_goodput_counts_requests_meeting_every_slo() -> None:
    reqs = [
        finished(0, 0.0, 0.100, 11, 0.100 + 10 * 0.040),   # meets both
        finished(1, 0.0, 0.200, 11, 0.200 + 10 * 0.050),   # TTFT exactly 200 ms, TPOT 50 ms
        finished(2, 0.0, 0.150, 1, 0.150),                 # one-token output: no TPOT
        finished(3, 0.0, 0.050, 5, 0.050 + 4 * 0.010),
        finished(4, 0.0, 0.120, 3, 0.120 + 2 * 0.020),
        finished(5, 0.0, 0.180, 2, 0.180 + 0.045),
        finished(6, 0.0, 0.300, 2, 0.300 + 0.010),         # misses TTFT
        finished(7, 0.0, 0.201, 2, 0.201 + 0.010),         # misses TTFT
        finished(8, 0.0, 0.100, 3, 5.000),                 # misses TPOT; last finish at 5.0 s
    ]
    failed = Request("9", 0.0, 10, 5, 5, index=9)
    failed.status = RequestStatus.REJECTED
    failed.reason = "test"
    rec = recorded([*reqs, failed])
    s = summarize(rec.request_columns(), rec.step_columns(), np.zeros(0), max_num_seqs=1,
                  num_gpu_blocks=10, block_size=16, slo_ttft_s=0.2, slo_tpot_s=0.05)
    assert s["duration_s"] == pytest.approx(5.0)
    assert s["goodput_requests_per_s"] == pytest.approx(1.2)
    assert s["throughput"]["requests_per_s"] == pytest.approx(1.8)
    assert s["num_rejected"] == 1 and s["num_finished"] == 9


def test_stats_empty_and_percentiles() -> None:
    assert stats(np.array([]))["p99"] is None
    st = stats(np.arange(1, 101, dtype=float))
    assert st["p50"] == pytest.approx(50.5) and st["max"] == 100
    assert st["p99"] == pytest.approx(99.01)


def test_weighted_itl_mean_is_an_exact_sum_in_any_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ITL mean sums the (value x count) products exactly before dividing: by hand,
    1e16 + 1 + 1 is 10000000000000002 (a float64 sum left to right loses both ones), and
    a permutation of the samples, their sorted ItlSamples, or products made 7 at a time
    give the same bits."""
    v = np.array([1e16, 1.0, 1.0])
    c = np.array([1, 1, 1], dtype=np.int64)
    assert (1e16 + 1.0) + 1.0 == 1e16
    assert weighted_mean(v, c, 3) == 10000000000000002 / 3
    rng = np.random.default_rng(7)
    v = rng.exponential(0.02, 5_000)
    c = rng.integers(1, 50, 5_000)
    samples = ItlSamples(v, c)
    perm = rng.permutation(5_000)
    ref = weighted_stats(samples)
    assert weighted_stats(ItlSamples(v[perm], c[perm])) == ref
    assert weighted_stats(samples.sorted()) == ref
    monkeypatch.setattr(latency_stats, "_MEAN_CHUNK", 7)
    assert weighted_stats(samples) == ref
    assert weighted_mean(np.array([1e16, 1.0, 1.0]), np.ones(3, np.int64), 3) \
        == 10000000000000002 / 3
    assert list(samples.sorted().values_s) == sorted(v)
