"""Exact schedules with a constant step time c = 1 (hand-computed; cases from
../shared/cases/README.md and the issue's worked examples)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import simpy

from sim.batch import BatchShape
from tests.conftest import make_requests, run_sim

TEACHING = [8, 2, 3, 4, 4, 6]


def fractions(summary: dict) -> tuple[float, float, float]:
    s = summary["slots"]
    return s["useful_fraction"], s["idle_fraction"], s["empty_fraction"]


def test_static_one_long_seven_short() -> None:
    # One request of 500 tokens and seven of 50 in one batch of 8: the batch lasts 500
    # steps; useful slot-steps = 500 + 7 * 50 = 850 of 4000 -> idle 3150 / 4000.
    res = run_sim(make_requests([500] + [50] * 7), "static", max_num_seqs=8)
    assert res.summary["duration_s"] == 500
    assert fractions(res.summary)[1] == pytest.approx(0.7875)
    assert (res.requests["finish_time"] == 500).all()  # results returned at batch end


def test_static_interleaved_batches() -> None:
    # 64 requests, every batch of 16 holds 4 each of 32/64/128/512: each batch lasts 512
    # steps, useful = 4 * (32 + 64 + 128 + 512) = 2944 of 16 * 512 = 8192 -> 184/512.
    outs = [32, 64, 128, 512] * 16
    res = run_sim(make_requests(outs), "static", max_num_seqs=16)
    assert res.summary["duration_s"] == 4 * 512
    assert fractions(res.summary)[1] == pytest.approx(1 - 184 / 512)
    assert fractions(res.summary)[2] == 0


def test_teaching_static() -> None:
    res = run_sim(make_requests(TEACHING), "static", max_num_seqs=4)
    assert res.summary["duration_s"] == 14
    assert fractions(res.summary) == pytest.approx((27 / 56, 17 / 56, 12 / 56))
    # Batch 1 ends at 8, batch 2 (8 + 6) at 14; first token = end of each prefill step.
    assert list(res.requests["finish_time"]) == [8, 8, 8, 8, 14, 14]
    assert list(res.requests["first_token_time"]) == [1, 1, 1, 1, 9, 9]


def test_teaching_chunked() -> None:
    res = run_sim(make_requests(TEACHING), "chunked", max_num_seqs=4)
    assert res.summary["duration_s"] == 9
    assert fractions(res.summary) == pytest.approx((27 / 36, 0, 9 / 36))
    df = res.requests
    # The 5th starts where the 2nd finished (step 3), the 6th where the 3rd did (step 4).
    assert list(df["first_scheduled_time"]) == [0, 0, 0, 0, 2, 3]
    assert list(df["finish_time"]) == [8, 2, 3, 4, 6, 9]


def test_k09_static_vs_continuous_twelve_requests() -> None:
    outs = [40, 3, 25, 5, 60, 4, 18, 6, 33, 2, 50, 8]
    st = run_sim(make_requests(outs), "static", max_num_seqs=4)
    assert sorted(set(st.requests["finish_time"])) == [40, 100, 150]
    u, i, e = fractions(st.summary)
    assert u == pytest.approx(254 / 600)
    assert i + e == pytest.approx(1 - 254 / 600)
    ch = run_sim(make_requests(outs), "chunked", max_num_seqs=4)
    assert ch.summary["duration_s"] == 83
    assert list(ch.requests["finish_time"]) == [40, 3, 25, 5, 63, 9, 27, 31, 60, 33, 83, 48]
    assert (ch.requests["finish_time"] <= st.requests["finish_time"]).all()


class PrefillDecodeCost:
    """K04's cost model: 0.1 s for a step holding a prefill, 0.02 s for a decode step."""

    def step_time(self, shape: BatchShape) -> float:
        return 0.1 if shape.num_prefill_tokens else 0.02


def test_k04_one_slot_infinite_rate() -> None:
    res = run_sim(make_requests([101] * 5), max_num_seqs=1, cost_model=PrefillDecodeCost())
    df = res.requests
    assert df["ttft_s"].to_numpy() == pytest.approx([0.1, 2.2, 4.3, 6.4, 8.5])
    assert df["e2e_latency_s"].to_numpy() == pytest.approx([2.1, 4.2, 6.3, 8.4, 10.5])
    assert df["tpot_s"].to_numpy() == pytest.approx([0.02] * 5)
    assert df["queued_time_s"].to_numpy() == pytest.approx([0, 2.1, 4.2, 6.3, 8.4])
    s = res.summary
    assert s["ttft_s"]["mean"] == pytest.approx(4.3)
    assert s["duration_s"] == pytest.approx(10.5)
    assert s["throughput"]["requests_per_s"] == pytest.approx(5 / 10.5)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(505 / 10.5)


def test_k05_one_token_outputs_have_no_tpot() -> None:
    res = run_sim(make_requests([1, 2, 101]), step_time=0.01)
    df = res.requests
    assert df.loc[0, "ttft_s"] == df.loc[0, "e2e_latency_s"]
    assert math.isnan(df.loc[0, "tpot_s"])
    assert df.loc[1, "tpot_s"] == pytest.approx(df.loc[1, "e2e_latency_s"] - df.loc[1, "ttft_s"])
    assert df.loc[2, "tpot_s"] == pytest.approx(
        (df.loc[2, "e2e_latency_s"] - df.loc[2, "ttft_s"]) / 100)
    assert df["tpot_s"].notna().sum() == 2
    assert len(res.itl_s) == 0 + 1 + 100


def test_k03_context_length_boundary() -> None:
    # vLLM 0.33's engine: a prompt of max_model_len tokens or more is refused; any other
    # request runs and stops when prompt + output reaches max_model_len ("length"), even
    # when its max_tokens asked for more. 4080 + 16 = 4096 fits exactly; 4090 stops at
    # 6 output tokens, 4095 at 1; 4096 leaves no room for a token.
    reqs = make_requests([16] * 5, prompt=[4078, 4080, 4090, 4095, 4096])
    res = run_sim(reqs, max_model_len=4096)
    df = res.requests
    assert list(df["status"]) == ["finished"] * 4 + ["rejected"]
    assert list(df["num_output_tokens"][:4]) == [16, 16, 6, 1]
    assert list(df["finish_reason"][:4]) == ["stop", "stop", "length", "length"]
    assert df.loc[4, "reason"] == (
        "num_prompt_tokens (4096) >= max_model_len (4096): no room for an output token")
    assert res.summary["num_rejected"] == 1


def test_k02_request_larger_than_pool() -> None:
    # 50 blocks = 49 usable + the null block (784 tokens).
    reqs = make_requests([50, 50, 50, 50, 200], prompt=[1002, 6, 6, 6, 700])
    res = run_sim(reqs, num_gpu_blocks=50, max_num_seqs=8, max_num_batched_tokens=2048)
    df = res.requests
    assert list(df["status"]) == ["rejected", "finished", "finished", "finished", "rejected"]
    assert "63 KV blocks" in df.loc[0, "reason"]
    assert "57 KV blocks" in df.loc[4, "reason"]


def test_k10_k11_preemption_by_recompute() -> None:
    reqs = make_requests([192] * 8, prompt=64)
    res = run_sim(reqs, step_time=0.01, num_gpu_blocks=65, max_num_seqs=8,
                  max_num_batched_tokens=2048)
    df = res.requests
    assert list(df["num_preemptions"]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert df["finish_time"].to_numpy() / 0.01 == pytest.approx(
        [192] * 4 + [255, 287, 303, 319])
    assert (df["num_output_tokens"] == 192).all()
    assert res.summary["num_preemptions"] == 4
    assert res.steps["num_preempted"].sum() == 4
    # K11: request 7 keeps its first TTFT; its stall is one long ITL gap.
    r7 = df.loc[7]
    assert r7["ttft_s"] == pytest.approx(0.01)
    assert r7["e2e_latency_s"] == pytest.approx(3.19)


def test_k11_itl_samples_of_preempted_request() -> None:
    res = run_sim(make_requests([192] * 8, prompt=64), step_time=0.01, num_gpu_blocks=65,
                  max_num_seqs=8)
    itl = res.itl_s
    assert len(itl) == 8 * 191  # TTFT is never an ITL sample
    # Requests 7, 6, 5, 4 emitted their last token one step before their preemption
    # (66, 82, 98, 130) and their next one at the end of step 193 (re-prefill included).
    stalls = np.sort(itl[itl > 0.0105]) / 0.01
    assert stalls == pytest.approx([193 - 129, 193 - 97, 193 - 81, 193 - 65])
    assert (itl[itl <= 0.0105] == pytest.approx(0.01))


def test_arrival_at_step_end_is_seen_by_next_step() -> None:
    reqs = make_requests([3, 3], arrivals=[0.0, 1.0])
    res = run_sim(reqs)
    assert list(res.requests["first_scheduled_time"]) == [0.0, 1.0]
    assert list(res.requests["first_token_time"]) == [1.0, 2.0]


def test_idle_engine_waits_for_next_arrival() -> None:
    reqs = make_requests([2, 2], arrivals=[0.0, 10.0])
    res = run_sim(reqs)
    assert list(res.requests["finish_time"]) == [2.0, 12.0]
    assert len(res.steps) == 4  # no polling steps while idle


def test_same_seed_same_records() -> None:
    outs = list(np.random.default_rng(3).integers(1, 50, size=40))
    a = run_sim(make_requests(outs, arrivals=list(np.arange(40) * 0.37)), max_num_seqs=5)
    b = run_sim(make_requests(outs, arrivals=list(np.arange(40) * 0.37)), max_num_seqs=5)
    assert a.requests.equals(b.requests)


def test_progress_slices_stay_few_when_the_run_outlasts_its_arrivals() -> None:
    from itertools import accumulate, islice

    from sim.simulate import progress_slices

    first = list(islice(progress_slices(1e-8), 102))
    assert first[:100] == [1e-8] * 100 and first[100:] == pytest.approx([1.1e-8, 1.21e-8])
    # 100 slices cover the arrival span (1e-6 s); reaching 100 s takes m more with
    # 1e-6 + 1.1e-7 (1.1^m - 1) >= 100: m = ceil(log(100 / 1.1e-7) / log(1.1)) = 217,
    # not 1e10.
    n = next(i for i, t in enumerate(accumulate(progress_slices(1e-8))) if t >= 100.0)
    assert n + 1 == 100 + 217


def test_packed_arrivals_are_reported_in_few_slices_with_the_same_records() -> None:
    # 30 arrivals within 30 us, then seconds of work: the progress callback runs a few
    # hundred times (it ran once per 0.3 us slice before), and slicing changes nothing.
    from policies.registry import get_policy_class
    from sim.app.runs.run_arrivals import arrival_source
    from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
    from sim.simulate import simulate

    prep = prepare(RunConfig(num_requests=30, rate=1e6))
    calls: list[int] = []
    sliced = simulate_prepared(prep, progress=calls.append)
    source, _ = arrival_source(prep.workload, prep.config, prep.scheduler.prefix_cache)
    whole = simulate(source, policy_factory=get_policy_class(prep.config.policy),
                     config=prep.scheduler, cost_model=prep.cost_model,
                     num_gpu_blocks=prep.num_gpu_blocks)  # one slice
    assert 100 < len(calls) < 400 and calls[-1] == 30
    assert sliced.summary["ttft_s"] == whole.summary["ttft_s"]
    np.testing.assert_array_equal(sliced.request_table["finish_time"],
                                  whole.request_table["finish_time"])


class _CountingEnv(simpy.Environment):
    """A SimPy environment that counts the events it processes."""

    def __init__(self) -> None:
        super().__init__()
        self.num_events = 0

    def step(self) -> None:
        self.num_events += 1
        super().step()


def _run_engine(own_clock: bool, monitor_every_s: float | None = None
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[tuple], int]:
    """A 300-request chunked run on the roofline (times that are not round numbers, so
    any change in how the clock adds up would show), its waits skipped where it may
    (``own_clock``) or all handed to SimPy; with a monitor process beside it that reads
    the engine's records every ``monitor_every_s`` s. Returns the request and step
    tables, the monitor's readings and the number of SimPy events processed."""
    from policies.registry import get_policy_class
    from sim.app.runs.run_arrivals import arrival_source
    from sim.app.runs.runner import RunConfig, prepare
    from sim.engine import Engine
    from sim.kv.factory import make_kv
    from sim.metrics import Recorder

    prep = prepare(RunConfig(num_requests=300, rate=20.0, seed=4))
    source, _ = arrival_source(prep.workload, prep.config, prep.scheduler.prefix_cache)
    env = _CountingEnv()
    kv = make_kv(prep.scheduler.prefix_cache, prep.num_gpu_blocks, 16)
    rec = Recorder()
    engine = Engine(env, policy=get_policy_class(prep.config.policy)(prep.scheduler, kv),
                    cost_model=prep.cost_model, kv=kv, config=prep.scheduler,
                    arrivals=source, recorder=rec)
    engine._own_clock = own_clock
    proc = engine.start()
    readings: list[tuple] = []

    def monitor() -> Iterator[simpy.Event]:
        while proc.is_alive:
            yield env.timeout(monitor_every_s)
            readings.append((env.now, rec.num_requests, rec.num_steps, kv.num_used_blocks))

    if monitor_every_s is not None:
        env.process(monitor())
    env.run(until=proc)
    return rec.request_columns(), rec.step_columns(), readings, env.num_events


def test_skipped_waits_give_the_records_of_waits_handed_to_simpy() -> None:
    requests, steps, _, events = _run_engine(own_clock=True)
    ref_requests, ref_steps, _, ref_events = _run_engine(own_clock=False)
    for table, ref in ((requests, ref_requests), (steps, ref_steps)):
        assert table.keys() == ref.keys()
        for c in table:
            np.testing.assert_array_equal(table[c], ref[c])
    assert len(steps["start_time"]) > 1000
    # Every iteration's wait went through SimPy in the reference; almost none did here
    # (the process's start and end).
    assert ref_events > 500 and events <= 3


def test_another_process_sees_the_engine_as_if_every_wait_were_handed_to_simpy() -> None:
    # A process reading the engine's progress every 0.5 s is an event due before most
    # waits' ends: the engine hands those waits to SimPy, so each reading is the same.
    requests, _, readings, events = _run_engine(own_clock=True, monitor_every_s=0.5)
    ref_requests, _, ref_readings, ref_events = _run_engine(own_clock=False,
                                                           monitor_every_s=0.5)
    assert len(readings) > 20 and readings == ref_readings
    np.testing.assert_array_equal(requests["finish_time"], ref_requests["finish_time"])
    assert events < ref_events


def test_an_engine_started_after_it_was_made_starts_from_simpys_clock() -> None:
    # Made at t=0, started at t=5: its request (arrived at 3, 3 tokens, one step each at
    # c = 1) runs from 5 to 8, not from its arrival; with a release hook (every wait
    # handed to SimPy) SimPy's clock ends there too.
    from policies.chunked import ChunkedPolicy
    from sim.config import SchedulerConfig
    from sim.cost_model import ConstantCostModel
    from sim.engine import Engine
    from sim.kv.block_pool import KVCacheManager
    from sim.metrics import Recorder
    from sim.source import RequestListArrivals

    env = simpy.Environment()
    kv, rec, cfg = KVCacheManager(1000, 16), Recorder(), SchedulerConfig()
    engine = Engine(env, policy=ChunkedPolicy(cfg, kv), cost_model=ConstantCostModel(1.0),
                    kv=kv, config=cfg, recorder=rec,
                    arrivals=RequestListArrivals(make_requests([3], arrivals=[3.0])),
                    on_release=lambda req, now: released.append(now))
    released: list[float] = []
    env.run(until=5.0)
    env.run(until=engine.start())
    requests = rec.request_columns()
    assert requests["first_scheduled_time"].tolist() == [5.0]
    assert requests["finish_time"].tolist() == released == [8.0]
    assert env.now == 8.0
