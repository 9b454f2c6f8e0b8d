"""Behaviours shared by every queue policy, checked on hand-computed schedules (c = 1):
victim choice, no admission in a preempting step, metrics of a preempted request, queue
orders, and reserve versus paged KV allocation."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import get_policy_class
from sim.batch import BatchPlan
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.kv.block_pool import KVCacheManager
from sim.request import Request, RequestStatus
from sim.simulate import SimResult, simulate
from sim.source import RequestListArrivals
from tests.conftest import make_requests, run_sim

QUEUED = ["chunked", "continuous"]


def run_traced(requests: list[Request], policy: str, *, step_time: float = 1.0,
               num_gpu_blocks: int = 100_001, **config: object
               ) -> tuple[SimResult, dict[str, list[float]]]:
    """run_sim plus every request's token times, read through the step observer."""
    times: dict[str, list[float]] = defaultdict(list)

    def observe(plan: BatchPlan, start: float, end: float) -> None:
        for req, _ in plan.scheduled:
            if req.last_token_time == end:
                times[req.request_id].append(end)

    res = simulate(RequestListArrivals(requests), policy_factory=get_policy_class(policy),
                   config=SchedulerConfig(**config),  # type: ignore[arg-type]
                   cost_model=ConstantCostModel(step_time), num_gpu_blocks=num_gpu_blocks,
                   observer=observe)
    return res, times


# A and B: prompt 16, 64 output tokens, 8 usable blocks of 16: together they outgrow the
# pool when the first of them needs its 5th block (a 4 + 4 block split is full).
@pytest.mark.parametrize("policy", QUEUED)
def test_fcfs_preempts_the_tail(policy: str) -> None:
    # A arrives at 0 (prio 5), B at 1 (prio 0): running = [A, B]. A needs its 5th block
    # first; under FCFS the victim is the tail, B.
    reqs = make_requests([64, 64], prompt=16, arrivals=[0, 1], priorities=[5, 0])
    df = run_sim(reqs, policy, num_gpu_blocks=9, max_num_seqs=2).requests
    assert list(df["num_preemptions"]) == [0, 1]


@pytest.mark.parametrize("policy", QUEUED)
def test_priority_preempts_largest_priority_arrival(policy: str) -> None:
    # Same requests under priority: the victim is the largest (priority, arrival) = A, so A
    # preempts itself rather than the more urgent B, which finishes first.
    reqs = make_requests([64, 64], prompt=16, arrivals=[0, 1], priorities=[5, 0])
    res = run_sim(reqs, policy, num_gpu_blocks=9, max_num_seqs=2, queue="priority")
    df = res.requests
    assert list(df["num_preemptions"]) == [1, 0]
    assert df.loc[1, "finish_time"] < df.loc[0, "finish_time"]
    assert res.steps["num_preempted"].sum() == res.summary["num_preemptions"] == 1


def test_chunked_schedules_the_running_behind_a_request_that_preempted_itself() -> None:
    # vLLM 0.33's running loop goes on after a request preempts itself (possible only
    # under priority, where the victim need not be the tail). Blocks of 4 tokens, 7
    # usable. C (prio 0, t=0), A (prio 1, t=0.5), B (prio 0, output 5, t=1.5) are
    # admitted in steps 1, 2, 3 (running [C, A, B]), each a 4-token prompt. Blocks taken:
    # step 1 C1; 2 C2 A1; 3 A2 B1; 4 B2; 6 C3 -> 7 in use. In step 7 C decodes, then A
    # needs a third block for its 9th token: no block is free and the victim
    # max((priority, arrival)) is A itself. B still decodes in step 7 (its 8th token fits
    # its 2 blocks), so its tokens come at t = 3, 4, 5, 6, 7 and it finishes at 7; were
    # the loop to stop at A, step 7 would run C alone and B would finish at 8.
    reqs = make_requests([20, 20, 5], prompt=4, arrivals=[0.0, 0.5, 1.5],
                         priorities=[0, 1, 0])
    res = run_sim(reqs, num_gpu_blocks=8, block_size=4, queue="priority")
    df = res.requests.set_index("request_id")
    assert (df.loc["2", "first_token_time"], df.loc["2", "finish_time"]) == (3.0, 7.0)
    assert df.loc["1", "num_preemptions"] >= 1 and df.loc["2", "num_preemptions"] == 0
    step7 = res.steps[res.steps["start_time"] == 6.0].iloc[0]
    assert (step7["num_decode_tokens"], step7["num_preempted"]) == (2, 1)


@pytest.mark.parametrize("policy", QUEUED)
def test_equal_priority_victim_is_the_later_arrival(policy: str) -> None:
    # Equal priority: a request never preempts one that arrived before it.
    reqs = make_requests([64, 64], prompt=16, arrivals=[0, 1], priorities=[3, 3])
    df = run_sim(reqs, policy, num_gpu_blocks=9, max_num_seqs=2, queue="priority").requests
    assert list(df["num_preemptions"]) == [0, 1]


@pytest.mark.parametrize("policy", QUEUED)
def test_no_admission_in_a_step_that_preempted(policy: str) -> None:
    # A, B (prio 1) fill both slots; C (prio 0) arrives at 2 and waits (a full batch never
    # preempts). At step 50 A needs a block: B is preempted, a slot frees, C heads the
    # queue and 3 blocks are free for its 1 -- yet C is admitted only at step 51.
    reqs = make_requests([64, 64, 4], prompt=16, arrivals=[0, 0, 2], priorities=[1, 1, 0])
    res = run_sim(reqs, policy, num_gpu_blocks=9, max_num_seqs=2, queue="priority")
    steps = res.steps
    hit = steps.index[steps["num_preempted"] > 0]
    assert list(hit + 1) == [50]
    assert steps.loc[hit[0], "num_seqs"] == 1  # only A ran in the preempting step
    assert res.requests.loc[2, "first_scheduled_time"] == 50  # start of step 51
    assert list(res.requests["num_preemptions"]) == [0, 1, 0]


@pytest.mark.parametrize("policy", QUEUED)
def test_preempted_request_keeps_first_ttft_and_one_long_itl_gap(policy: str) -> None:
    # K10 / K11: request 7 emits its first token at step 1, is preempted at step 66 (last
    # token at step 65), re-prefills at step 193.
    reqs = make_requests([192] * 8, prompt=64)
    res, times = run_traced(reqs, policy, step_time=0.01, num_gpu_blocks=65, max_num_seqs=8,
                            max_num_batched_tokens=2048)
    r7 = res.requests.loc[7]
    t7 = times["7"]
    assert len(t7) == 192 and r7["num_output_tokens"] == 192
    assert r7["first_token_time"] == pytest.approx(0.01)
    assert r7["ttft_s"] == pytest.approx(0.01)
    gaps = [b - a for a, b in pairwise(t7)]
    long = [g for g in gaps if g > 0.0101]
    assert long == [pytest.approx((193 - 65) * 0.01)]
    assert r7["e2e_latency_s"] == pytest.approx(r7["ttft_s"] + sum(gaps))
    assert r7["e2e_latency_s"] == pytest.approx(3.19)


def test_reserve_admits_fewer_than_paged() -> None:
    # 64 usable blocks; 8 requests of prompt 16, max_tokens 256, 16 output tokens.
    # paged: 2 blocks each, all 8 run together. reserve: ceil(272 / 16) = 17 blocks each,
    # so 3 fit (51 blocks) and the others wait.
    for policy in QUEUED:
        kw: dict[str, Any] = {"num_gpu_blocks": 65, "max_num_seqs": 8}
        outs, caps = [16] * 8, [256] * 8
        paged = run_sim(make_requests(outs, prompt=16, max_tokens=caps), policy, **kw)
        res = run_sim(make_requests(outs, prompt=16, max_tokens=caps), policy,
                      kv_allocation="reserve", **kw)
        assert paged.steps["num_seqs"].max() == 8
        assert res.steps["num_seqs"].max() == 3
        assert res.steps["kv_blocks_used"].max() == 51
        assert res.summary["duration_s"] > paged.summary["duration_s"]
        assert res.summary["num_preemptions"] == 0


def test_reserve_rejects_a_reservation_larger_than_the_pool() -> None:
    # prompt 16 + max_tokens 1100 = 70 blocks > 64 usable: never admissible in reserve
    # mode (paged serves it: it stops after 4 tokens).
    reqs = make_requests([4, 4], prompt=16, max_tokens=[1100, 4])
    res = run_sim(reqs, "chunked", num_gpu_blocks=65, kv_allocation="reserve")
    df = res.requests
    assert list(df["status"]) == ["rejected", "finished"]
    assert "reserve allocation needs 70 KV blocks" in df.loc[0, "reason"]
    reqs = make_requests([4, 4], prompt=16, max_tokens=[1100, 4])
    assert (run_sim(reqs, "chunked", num_gpu_blocks=65).requests["status"] == "finished").all()


@pytest.mark.parametrize(("queue", "order"), [
    ("fcfs", [0, 1, 2, 3]),
    ("sjf", [3, 1, 2, 0]),          # shortest prompt first
    ("oracle-srpt", [2, 0, 3, 1]),  # shortest true output first
    ("priority", [1, 3, 0, 2]),
])
def test_queue_orders(queue: str, order: list[int]) -> None:
    # One slot, four requests at t = 0: the admission order is the queue's order.
    reqs = make_requests([5, 20, 2, 9], prompt=[40, 20, 30, 10], priorities=[2, 0, 3, 1])
    df = run_sim(reqs, "continuous", max_num_seqs=1, queue=queue).requests
    assert list(df.sort_values("first_scheduled_time").index) == order


@pytest.mark.parametrize(("policy", "allocation"), [
    ("chunked", "reserve"), ("continuous", "paged"), ("continuous", "reserve"),
    ("static", "paged"),
])
def test_k02_never_fitting_requests_are_rejected_under_every_policy(
    policy: str, allocation: str
) -> None:
    # K02 (chunked paged is in test_engine.py): 49 usable blocks of 16 tokens.
    reqs = make_requests([50, 50, 50, 50, 200], prompt=[1002, 6, 6, 6, 700])
    res = run_sim(reqs, policy, num_gpu_blocks=50, max_num_seqs=8,
                  max_num_batched_tokens=2048, kv_allocation=allocation)
    df = res.requests
    assert list(df["status"]) == ["rejected", "finished", "finished", "finished", "rejected"]
    assert (df["num_output_tokens"][1:4] == 50).all()


@settings(deadline=None)
@given(policy=st.sampled_from(QUEUED), prompt=st.integers(1, 400), held=st.integers(44, 64),
       full_isl=st.booleans(), allocation=st.sampled_from(["paged", "reserve"]),
       threshold=st.sampled_from([0, 48]))
def test_waiting_blocked_is_the_admission_test(
    policy: str, prompt: int, held: int, full_isl: bool, allocation: str, threshold: int
) -> None:
    # 64 usable blocks of 16; a running decode holds `held` of them (room for its next
    # token), leaving 0 to 20. Without a prefix cache the fast path's waiting_blocked
    # must answer exactly whether schedule() admits the head of waiting, and change
    # nothing itself.
    cfg = SchedulerConfig(max_num_batched_tokens=256, long_prefill_token_threshold=threshold,
                          scheduler_reserve_full_isl=full_isl, kv_allocation=allocation)
    kv = KVCacheManager(65, 16)
    pol = get_policy_class(policy)(cfg, kv)
    decoding = Request("d", 0.0, 16, 8, 8, 0, 0)
    decoding.num_output_tokens, decoding.num_computed_tokens = 1, 16
    decoding.status = RequestStatus.RUNNING
    assert kv.allocate_up_to(decoding, held * 16) is not None
    pol.running.append(decoding)
    head = Request("w", 0.0, prompt, 8, 8, 0, 1)
    pol.add_request(head)
    blocked = pol.waiting_blocked(cfg.max_num_batched_tokens - 1)
    assert kv.num_free_blocks == 64 - held and head.status is RequestStatus.WAITING
    plan = pol.schedule(0.0)
    assert blocked == (head not in dict(plan.scheduled))
