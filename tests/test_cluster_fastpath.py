"""Clusters on the fast path (sim/cluster.py with sim/fastpath.py): every replica's steady
runs end before the router's next routing instant, and the router routes at an arrival
time before any step ending then is applied, so fast and step-by-step clusters route
alike and give the same records, exact ties and float rounding included."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import get_policy_class, make_router
from sim.batch import BatchShape
from sim.cluster import simulate_cluster
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.request import Request
from sim.simulate import SimResult, simulate
from sim.source import RequestListArrivals
from tests.test_fastpath import ContextCost, assert_frames_close, assert_nested_close


class TwoPrices:
    """A prefill step costs ``prefill`` s, any other ``decode`` s."""

    def __init__(self, prefill: float, decode: float) -> None:
        self.prefill, self.decode = prefill, decode

    def step_time(self, s: BatchShape) -> float:
        return self.prefill if s.num_prefill_tokens else self.decode


def both(make: object, **kw: object) -> tuple[SimResult, SimResult]:
    """The step-by-step cluster and the fast one on fresh copies of the requests and a
    fresh router named ``kw["router"]``."""
    out = []
    for fast in (False, True):
        out.append(simulate_cluster(RequestListArrivals(make()), fast_path=fast,  # type: ignore[operator]
                                    **{**kw, "router": make_router(kw["router"])}))  # type: ignore[arg-type]
    return out[0], out[1]


def assert_same(ref: SimResult, fast: SimResult) -> None:
    assert_frames_close(fast.requests, ref.requests)
    assert_frames_close(fast.steps, ref.steps)
    assert_nested_close(fast.summary, ref.summary)


def test_routing_at_a_tie_reads_the_state_before_the_steps_ending_then() -> None:
    # 2 s steps. Replica 0 gets r0 (3 tokens) and r2, replica 1 gets r1 (10 tokens
    # each): r1 and r2 sample their last token in the step 18 -> 20. r3, r4 arrive at 19:
    # 1 outstanding each, r3 to replica 1 (fewer routed), r4 to replica 0. At 20, before
    # the steps ending then are applied, both have 2 outstanding; replica 1 has fewer
    # routed (2 against 3): r5 goes there, on either path.
    def make() -> list[Request]:
        spec = [(0.0, 3), (0.0, 10), (0.0, 10), (19.0, 5), (19.0, 5), (20.0, 5)]
        return [Request(f"r{i}", t, 8, o, o, 0, i) for i, (t, o) in enumerate(spec)]

    ref, fast = both(make, num_replicas=2, router="least-outstanding",
                     policy_factory=get_policy_class("continuous"),
                     config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256),
                     cost_model=ConstantCostModel(2.0), num_gpu_blocks=100, block_size=16)
    assert list(ref.requests["replica"]) == [0, 1, 0, 1, 0, 1]
    assert_same(ref, fast)


def test_a_run_ends_where_the_reference_clock_does() -> None:
    # A 0.3 s prefill, then 0.1 s decode steps: the reference's clock after 7 of them is
    # 0.3 + 0.1 + ... = 0.9999999999999999, just before r1's arrival at 1.0, so r1 starts
    # after the next one, at 1.0999999999999999. One timeout of 0.9999999999999999 - 0.3
    # from 0.3 lands on 1.0 instead: such a run is cut to an end the clock lands on.
    t = 0.3
    for _ in range(8):
        t += 0.1
    assert t != 1.1  # the float sum, not the decimal one

    def make() -> list[Request]:
        return [Request("r0", 0.0, 8, 50, 50, 0, 0), Request("r1", 1.0, 8, 5, 5, 0, 1)]

    kw = dict(policy_factory=get_policy_class("continuous"),
              config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256),
              cost_model=TwoPrices(0.3, 0.1), num_gpu_blocks=100, block_size=16)
    ref, fast = both(make, num_replicas=1, router="round-robin", **kw)
    assert ref.requests["first_scheduled_time"][1] == t
    assert_same(ref, fast)
    one = simulate(RequestListArrivals(make()), fast_path=True, **kw)  # type: ignore[arg-type]
    assert one.requests["first_scheduled_time"][1] == t


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Request], dict]:
    """Replicas behind every router, with and without prefix caches (prompts sharing
    up to two prefix segments), tight pools and the priority and lpm queues; step times
    either generic or on a grid with the arrivals (exact ties between run ends, step
    ends and routing instants)."""
    n = draw(st.integers(2, 30))
    grid = draw(st.booleans())
    gaps = [0.0, 0.0, 0.25, 0.5, 1.0, 2.0] if grid else [0.0, 0.0, 0.013, 0.05, 0.31, 1.7]
    shared = [(1, draw(st.integers(1, 60))), (2, draw(st.integers(1, 60)))]
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from(gaps))
        out = draw(st.integers(1, 90))
        segs = (*shared[:draw(st.integers(0, 2))], (100 + i, draw(st.integers(1, 80))))
        r = Request(str(i), t, sum(k for _, k in segs), out,
                    out if draw(st.booleans()) else draw(st.integers(1, 90)),
                    draw(st.integers(0, 2)), i)
        r.prompt_segments = segs
        reqs.append(r)
    cache = draw(st.sampled_from(["none", "block", "radix"]))
    routers = ["round-robin", "least-outstanding", "least-kv", "cache-aware-approx"]
    bs = draw(st.sampled_from([1, 4, 16]))
    cfg = SchedulerConfig(
        max_num_seqs=draw(st.integers(1, 9)), max_num_batched_tokens=draw(st.integers(90, 300)),
        max_model_len=draw(st.sampled_from([64, 160, 4096])),
        queue=draw(st.sampled_from(["fcfs", "priority"] + ([] if cache == "none" else ["lpm"]))),
        prefix_cache=cache)
    cost = (TwoPrices(*draw(st.sampled_from([(0.5, 0.25), (1.0, 0.5), (2.0, 1.0)])))
            if grid else ContextCost())
    kw = dict(num_replicas=draw(st.integers(1, 4)),
              router=draw(st.sampled_from(routers + ([] if cache == "none" else ["cache-aware"]))),
              policy_factory=get_policy_class(draw(st.sampled_from(["chunked", "continuous"]))),
              config=cfg, cost_model=cost, block_size=bs,
              num_gpu_blocks=draw(st.integers(12, 80)) if bs == 16 else draw(st.integers(60, 400)))
    return reqs, kw


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_cluster_fast_path_equals_step_by_step(w: tuple[list[Request], dict]) -> None:
    reqs, kw = w

    def make() -> list[Request]:
        out = []
        for r in reqs:
            f = Request(r.request_id, r.arrival_time, r.num_prompt_tokens, r.output_len,
                        r.max_tokens, r.priority, r.index)
            f.prompt_segments = r.prompt_segments
            out.append(f)
        return out

    assert_same(*both(make, **kw))


def counting(calls: list[int]) -> object:
    """A policy factory for continuous batching whose policies count their schedule()
    calls (the steps planned one by one) in ``calls``, one entry per policy built."""
    def make(config: SchedulerConfig, kv: object) -> object:
        policy = get_policy_class("continuous")(config, kv)
        i = len(calls)
        calls.append(0)
        plan = policy.schedule

        def schedule(now: float) -> object:
            calls[i] += 1
            return plan(now)

        policy.schedule = schedule  # on the instance: the class keeps its promise
        return policy
    return make


def test_round_robin_runs_are_cut_only_by_their_own_arrivals() -> None:
    # 1 s steps; round robin sends r0, r2, r4 ... to replica 0 and r1, r3 ... to replica
    # 1, one arrival every 5.5 s. A round-robin choice reads no replica's state, so
    # replica 0 plans exactly as many steps one by one as a lone engine given its own
    # requests: the arrivals routed to replica 1 do not cut its runs.
    def make() -> list[Request]:
        return [Request(f"r{i}", 5.5 * i, 8, 60, 60, 0, i) for i in range(12)]

    kw = dict(config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256),
              cost_model=ConstantCostModel(1.0), num_gpu_blocks=100, block_size=16)
    cluster: list[int] = []
    res = simulate_cluster(RequestListArrivals(make()), num_replicas=2,
                           router=make_router("round-robin"), policy_factory=counting(cluster),
                           **kw)  # type: ignore[arg-type]
    alone: list[int] = []
    one = simulate(RequestListArrivals(make()[0::2]), policy_factory=counting(alone),
                   **kw)  # type: ignore[arg-type]
    assert list(res.requests["replica"]) == [0, 1] * 6
    assert cluster[0] == alone[0]
    assert list(res.requests["finish_time"][0::2]) == list(one.requests["finish_time"])
    ref = simulate_cluster(RequestListArrivals(make()), num_replicas=2, fast_path=False,
                           router=make_router("round-robin"),
                           policy_factory=get_policy_class("continuous"), **kw)  # type: ignore[arg-type]
    assert_same(ref, res)


def test_a_router_subclass_that_redefines_choose_withdraws_the_state_free_promise() -> None:
    from policies.routers import LeastOutstandingRouter, RoundRobinRouter
    from sim.interface import StateFreeRouter, declares

    class Named(RoundRobinRouter):
        name = "named"

    class ByLoad(RoundRobinRouter):
        def choose(self, request: Request, replicas: object, now: float) -> int:
            return 0

    assert isinstance(RoundRobinRouter(), StateFreeRouter)
    assert declares(RoundRobinRouter(), "state_free") and declares(Named(), "state_free")
    assert not declares(ByLoad(), "state_free")
    assert not declares(LeastOutstandingRouter(), "state_free")
