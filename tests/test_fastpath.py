"""The fast path (steady decode runs advanced at once) against the step-by-step reference
on random workloads: identical request records (times within 1e-9 relative), identical
steps, ITL samples and summaries, for every built-in policy and allocation mode."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import get_policy_class
from sim.batch import BatchShape
from sim.config import SchedulerConfig
from sim.request import Request
from sim.simulate import SimResult, simulate
from sim.source import RequestListArrivals
from tests.conftest import make_requests, skip_spies_when_compiled


class ContextCost:
    """Step time that depends on every shape field, so any difference in what a step
    holds shows up in the clock."""

    def step_time(self, s: BatchShape) -> float:
        return (0.0071 + 1.3e-4 * s.num_prefill_tokens + 2.9e-6 * s.prefill_attention_pairs
                + 3.1e-5 * s.num_decode_seqs + 7.7e-7 * s.decode_context_tokens)


def run(reqs_args: dict, cfg: SchedulerConfig, policy: str, blocks: int, bs: int,
        fast: bool) -> SimResult:
    return simulate(RequestListArrivals(make_requests(**reqs_args)),
                    policy_factory=get_policy_class(policy), config=cfg,
                    cost_model=ContextCost(), num_gpu_blocks=blocks, block_size=bs,
                    fast_path=fast)


def assert_frames_close(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12, err_msg=c)
        else:
            assert list(x) == list(y), c


def assert_nested_close(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            assert_nested_close(a[k], b[k])
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_nested_close(x, y)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), (a, b)
    else:
        assert a == b


def assert_same(args: dict, cfg: SchedulerConfig, policy: str, blocks: int, bs: int) -> None:
    """The fast path and the step-by-step reference give the same records."""
    ref = run(args, cfg, policy, blocks, bs, fast=False)
    fast = run(args, cfg, policy, blocks, bs, fast=True)
    assert_frames_close(fast.requests, ref.requests)
    assert_frames_close(fast.steps, ref.steps)
    np.testing.assert_allclose(np.sort(fast.itl_s), np.sort(ref.itl_s), rtol=1e-9)
    assert_nested_close(fast.summary, ref.summary)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[dict, SchedulerConfig, str, int, int]:
    n = draw(st.integers(1, 24))
    outs = draw(st.lists(st.integers(1, 70), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 90), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.013, 0.05, 0.31, 1.7]),
                         min_size=n, max_size=n))
    caps = [o if draw(st.booleans()) else draw(st.integers(1, 80)) for o in outs]
    policy = draw(st.sampled_from(["chunked", "continuous", "static"]))
    bs = draw(st.sampled_from([1, 4, 16]))
    blocks = draw(st.integers(12, 80)) if bs == 16 else draw(st.integers(60, 400))
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 9)),
        max_num_batched_tokens=draw(st.integers(90, 300)),
        max_model_len=draw(st.sampled_from([64, 160, 4096])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 16])),
        queue=draw(st.sampled_from(["fcfs", "priority"])),
        kv_allocation=draw(st.sampled_from(["paged", "paged", "reserve"])),
    )
    args = {"output_lens": outs, "prompt": prompts, "arrivals": list(np.cumsum(gaps)),
            "max_tokens": caps, "priorities": draw(st.lists(st.integers(0, 2), min_size=n,
                                                            max_size=n))}
    return args, cfg, policy, blocks, bs


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_fast_path_equals_step_by_step(w: tuple[dict, SchedulerConfig, str, int, int]) -> None:
    assert_same(*w)


def test_fast_path_takes_long_decode_runs(fast_runs: list[int]) -> None:
    # Two requests decoding 200 tokens each with ample blocks: after the prefill step the
    # engine advances the decode phase in one run of 199 steps, the last of them the one
    # in which both sample their 200th token.
    runs = fast_runs
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=4096)
    args = {"output_lens": [200, 200], "prompt": 20}
    ref = run(args, cfg, "chunked", 1000, 16, fast=False)
    assert runs == []
    fast = run(args, cfg, "chunked", 1000, 16, fast=True)
    assert runs == [199]
    assert len(fast.steps) == len(ref.steps) == 200
    assert fast.requests["finish_time"].tolist() == ref.requests["finish_time"].tolist()


@st.composite
def tight_chunked(draw: st.DrawFn) -> tuple[dict, SchedulerConfig, str, int, int]:
    """FCFS chunked and continuous under KV pressure: decode groups form, cross block
    boundaries, meet full pools (and dissolve), lose members to finishes, stall in
    prefill-only steps, and see preemption."""
    n = draw(st.integers(2, 30))
    outs = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.02, 0.4]), min_size=n, max_size=n))
    bs = draw(st.sampled_from([2, 4, 16]))
    blocks = draw(st.integers(8, 40)) if bs == 16 else draw(st.integers(40, 160))
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(2, 12)),
        max_num_batched_tokens=draw(st.integers(64, 256)),
        max_model_len=draw(st.sampled_from([100, 4096])),
        scheduler_reserve_full_isl=draw(st.booleans()),
        preemption_mode=draw(st.sampled_from(["recompute", "recompute", "swap"])),
        kv_bytes_per_block=4096, swap_space_bytes=draw(st.sampled_from([0, 4096 * 20])),
    )
    args = {"output_lens": outs, "prompt": prompts, "arrivals": list(np.cumsum(gaps))}
    return args, cfg, draw(st.sampled_from(["chunked", "continuous"])), blocks, bs


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tight_chunked())
def test_decode_groups_equal_step_by_step(w: tuple[dict, SchedulerConfig, str, int, int]) -> None:
    assert_same(*w)


@pytest.mark.parametrize(("scenario", "cache", "policy", "blocks"), [
    ("system-prompts", "block", "chunked", 900),
    ("system-prompts", "radix", "continuous", 900),
    ("multi-turn", "block", "continuous", 1500),
    ("multi-turn", "radix", "chunked", 1500),
])
def test_fast_path_with_prefix_caching(scenario: str, cache: str, policy: str,
                                       blocks: int) -> None:
    """Decode groups and steady runs under a prefix cache, in a pool tight enough to
    evict: the same records as the step-by-step reference."""
    from sim.app.runs.runner import RunConfig, prepare, simulate_prepared

    prep = prepare(RunConfig(scenario=scenario, num_requests=150, rate=40.0, policy=policy,
                             prefix_cache=cache, num_gpu_blocks=blocks,
                             max_model_len=(blocks - 1) * 16, max_num_seqs=24))
    ref = simulate_prepared(prep, fast_path=False)
    fast = simulate_prepared(prep, fast_path=True)
    assert ref.summary["prefix_cache"]["evictions"] > 0
    assert_frames_close(fast.requests, ref.requests)
    assert_frames_close(fast.steps, ref.steps)
    assert_nested_close(fast.summary, ref.summary)


@pytest.mark.parametrize("cache", ["block", "radix"])
def test_prompt_block_filled_by_the_last_chunk_is_cached_at_the_first_decode(
        cache: str) -> None:
    """A 32-token prompt in chunks of 8 fills its second block without taking a new one;
    the step-by-step path indexes that block at the request's first decode (when it
    takes its third block), so a request arriving at 0.2 s with the same 32 tokens hits
    both blocks (32 tokens). The decode group's allocations must index it too."""
    from sim.cost_model import ConstantCostModel
    from sim.request import Request

    def requests() -> list[Request]:
        a = Request("0", 0.0, 32, 60, 60, 0, 0)
        a.prompt_segments = ((7, 32),)
        b = Request("1", 0.2, 40, 5, 5, 0, 1)
        b.prompt_segments = ((7, 32), (99, 8))
        return [a, b]

    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8, prefix_cache=cache)
    hits = []
    for fast in (False, True):
        r = simulate(RequestListArrivals(requests()), policy_factory=get_policy_class("chunked"),
                     config=cfg, cost_model=ConstantCostModel(0.01), num_gpu_blocks=100,
                     block_size=16, fast_path=fast)
        hits.append(r.summary["prefix_cache"]["hit_tokens"])
    assert hits == [32, 32]


def assert_workload_same(rows: list[tuple], cfg: SchedulerConfig, cost: object,
                         blocks: int, bs: int) -> None:
    """``chunked`` over (arrival, prompt, output_len, max_tokens, priority, prompt
    segments) rows, both ways: the fast path gives the reference's records."""
    from sim.request import Request

    def requests() -> list[Request]:
        out = []
        for i, (t, p, o, m, prio, segs) in enumerate(rows):
            r = Request(str(i), t, p, o, m, prio, i)
            r.prompt_segments = segs
            out.append(r)
        return out

    ref, fast = (simulate(RequestListArrivals(requests()),
                          policy_factory=get_policy_class("chunked"), config=cfg,
                          cost_model=cost, num_gpu_blocks=blocks, block_size=bs,
                          fast_path=f) for f in (False, True))
    assert_frames_close(fast.requests, ref.requests)
    assert_frames_close(fast.steps, ref.steps)
    assert_nested_close(fast.summary, ref.summary)


# A random workload (30 requests, one slot, seven blocks, a block cache) on which the fast
# path once skipped lpm's per-step re-sorting of waiting while every slot was taken.
_LPM_WORKLOAD = [
    (0.0, 46, 89, 29, 2, ((7, 40), (1000, 6))),
    (0.0, 54, 49, 49, 0, None),
    (0.0, 12, 66, 66, 0, ((7, 12),)),
    (0.0, 6, 6, 6, 2, ((7, 6),)),
    (0.0, 16, 46, 46, 1, ((7, 16),)),
    (0.1, 45, 64, 50, 0, ((7, 40), (9053879215770065218, 5))),
    (0.6, 36, 87, 87, 2, None),
    (0.603, 13, 86, 20, 0, ((7, 13),)),
    (1.103, 11, 33, 33, 2, None),
    (1.103, 45, 36, 36, 2, ((7, 40), (2372738160954370969, 5))),
    (1.106, 8, 73, 73, 1, None),
    (1.606, 17, 87, 30, 1, None),
    (1.606, 50, 43, 43, 0, ((7, 40), (1012, 10))),
    (2.106, 45, 66, 66, 2, ((7, 40), (5690283034469394251, 5))),
    (2.106, 10, 18, 75, 1, None),
    (2.126, 28, 69, 69, 1, None),
    (2.126, 21, 65, 65, 0, ((7, 21),)),
    (2.226, 3, 72, 72, 2, ((7, 3),)),
    (2.229, 58, 22, 22, 1, ((7, 40), (1018, 18))),
    (2.729, 49, 20, 20, 2, None),
    (2.729, 45, 31, 31, 1, ((7, 40), (1020, 5))),
    (3.229, 4, 37, 64, 1, ((7, 4),)),
    (3.329, 40, 50, 50, 2, ((7, 40),)),
    (3.329, 48, 22, 22, 1, ((7, 40), (1023, 8))),
    (3.829, 16, 51, 61, 0, None),
    (3.829, 45, 77, 77, 2, ((7, 40), (3070451717918157851, 5))),
    (3.829, 36, 9, 9, 0, ((7, 36),)),
    (3.849, 40, 64, 64, 1, None),
    (3.849, 26, 68, 68, 0, None),
    (3.852, 23, 29, 29, 0, ((7, 23),)),
]


def test_lpm_with_every_slot_taken_matches_step_by_step() -> None:
    """lpm re-sorts waiting by cached prefix every step with a stable sort, so the order
    depends on every earlier sort: no step may be skipped while anything waits."""
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=128, max_model_len=4096,
                          queue="lpm", prefix_cache="block")
    assert_workload_same(_LPM_WORKLOAD, cfg, ContextCost(), 7, 16)


# A random workload (30 requests, block size 2, a block cache, a Mixtral roofline) on
# which the fast path once released requests finishing in the same step out of running
# order, which reorders the block cache's free queue.
_RELEASE_WORKLOAD = [
    (0.1, 56, 24, 24, 0, ((7, 28), (1000, 28))),
    (0.1, 4, 74, 53, 2, None),
    (0.2, 2, 60, 38, 1, None),
    (0.2, 33, 62, 17, 2, None),
    (0.22, 33, 74, 21, 1, ((7, 28), (8819363018449984009, 5))),
    (0.24, 22, 60, 38, 1, None),
    (0.24, 11, 25, 25, 2, ((7, 11),)),
    (0.26, 12, 23, 30, 1, ((7, 12),)),
    (0.76, 39, 20, 20, 1, ((7, 28), (1008, 11))),
    (0.78, 3, 80, 80, 2, ((7, 3),)),
    (0.783, 1, 56, 83, 0, None),
    (0.883, 33, 73, 73, 1, ((7, 28), (1265306293143682410, 5))),
    (1.383, 47, 64, 64, 0, ((7, 28), (1012, 19))),
    (1.383, 26, 10, 10, 2, None),
    (1.383, 17, 33, 71, 0, ((7, 17),)),
    (1.386, 48, 65, 55, 1, ((7, 28), (1015, 20))),
    (1.386, 2, 81, 81, 2, ((7, 2),)),
    (1.886, 1, 79, 72, 2, None),
    (1.886, 34, 7, 7, 2, None),
    (1.886, 41, 2, 32, 2, ((7, 28), (1019, 13))),
    (1.986, 1, 73, 23, 0, ((7, 1),)),
    (1.986, 33, 67, 67, 2, ((7, 28), (8819363018449984009, 5))),
    (1.986, 38, 87, 87, 1, ((7, 28), (1022, 10))),
    (2.486, 33, 50, 50, 2, ((7, 28), (2571135860063603309, 5))),
    (2.489, 15, 49, 49, 2, None),
    (2.509, 34, 82, 82, 1, None),
    (2.509, 33, 28, 28, 2, ((7, 28), (8885470678953877708, 5))),
    (2.512, 45, 37, 15, 1, ((7, 28), (1027, 17))),
    (2.512, 33, 33, 33, 2, ((7, 28), (6332705199151157198, 5))),
    (2.512, 13, 37, 37, 0, ((7, 13),)),
]


def test_same_step_finishes_release_in_running_order() -> None:
    from calibration.gpus import get_gpu
    from calibration.roofline import RooflineCostModel
    from calibration.specs import get_model

    cfg = SchedulerConfig(max_num_seqs=12, max_num_batched_tokens=40, max_model_len=100,
                          long_prefill_token_threshold=16, scheduler_reserve_full_isl=False,
                          prefix_cache="block")
    cost = RooflineCostModel(get_model("mixtral-8x7b"), get_gpu("h200-sxm"))
    assert_workload_same(_RELEASE_WORKLOAD, cfg, cost, 77, 2)


def test_priority_victims_in_the_decode_group_match_step_by_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the priority queue the victim is the largest (priority, arrival): here two
    low-priority decoders at the head of running, decode group members, give way to the
    chunks of later urgent prompts. A member preempted mid-planning is unscheduled as a
    scheduled request would be, and a plan that preempted and ran nothing is followed
    by a step planned one by one, which records those preemptions (a steady run did
    not: this test fails without that rule in Engine.process). The same records as the
    step-by-step reference."""
    from policies.base import QueuePolicy

    skip_spies_when_compiled("QueuePolicy.preempt")
    member_victims: list[str] = []
    preempt = QueuePolicy.preempt

    def spy(self: QueuePolicy, req: Request) -> None:
        if self.decode_group is not None and req in self.decode_group:
            member_victims.append(req.request_id)
        preempt(self, req)

    monkeypatch.setattr(QueuePolicy, "preempt", spy)
    args = dict(output_lens=[40, 40, 6], prompt=[4, 4, 24], arrivals=[0.0, 0.0, 0.05],
                priorities=[9, 9, 0])
    assert_same(args, SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=10,
                                      queue="priority"), "chunked", 14, 4)
    assert member_victims, "no decode group member was preempted"
    args = dict(output_lens=[40, 40, 6, 6], prompt=[4, 4, 24, 20],
                arrivals=[0.0, 0.0, 0.15, 0.3], priorities=[9, 9, 0, 1])
    for policy in ("chunked", "continuous"):
        assert_same(args, SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32,
                                          queue="priority"), policy, 16, 4)



def test_the_seams_the_fast_path_uses_are_found() -> None:
    """The roofline prices a run in one call, static counts the steps a run advanced,
    and the built-in policies make their promises in the class that schedules."""
    from calibration.gpus import get_gpu
    from calibration.roofline import RooflineCostModel
    from calibration.specs import get_model
    from policies.static import StaticPolicy
    from sim.cost_model import ConstantCostModel
    from sim.interface import BulkDecodePricer, SteadyDecoder, StepCounter, declares
    from sim.kv.block_pool import KVCacheManager

    assert isinstance(RooflineCostModel(get_model("llama-3.1-8b"), get_gpu("h100-sxm")),
                      BulkDecodePricer)
    assert not isinstance(ConstantCostModel(0.01), BulkDecodePricer)
    kv, cfg = KVCacheManager(100, 16), SchedulerConfig()
    assert isinstance(StaticPolicy(cfg, kv), StepCounter)
    for name in ("chunked", "continuous", "static"):
        policy = get_policy_class(name)(cfg, kv)
        assert isinstance(policy, SteadyDecoder) and declares(policy, "steady_decode")
