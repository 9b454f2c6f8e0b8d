"""Prefill/decode disaggregation (sim/disagg/): hand-computed timelines with a constant
step time (one request through 1P1D; two transfers sharing the link; a decode pool
without room holding the request and its prefill blocks; KV usage over each pool's
blocks; a short prompt kept local), the differential test against an aggregated
engine, and the decode pools' fast path against the step-by-step reference."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import simpy

from policies.chunked import ChunkedPolicy
from policies.routers import make_router
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.disagg.link import KVLink
from sim.disagg.link_spec import INSTANT_LINK, LinkSpec
from sim.disagg.system import Pool, simulate_disagg
from sim.request import Request
from sim.simulate import SimResult
from sim.source import RequestListArrivals
from tests.conftest import make_requests, run_sim

#: A step time, latency and bandwidth that are powers of two: every sum is exact.
STEP = 2.0 ** -6
LATENCY = 2.0 ** -10
BANDWIDTH = 2.0 ** 20  # bytes/s
LINK = LinkSpec("test", BANDWIDTH, LATENCY)


def disagg(requests: list[Request], *, prefill_blocks: int = 1000, decode_blocks: int = 1000,
           link: LinkSpec = LINK, kv_bytes_per_token: float = 1024.0,
           min_prompt_tokens: int = 0, num_prefill: int = 1, num_decode: int = 1,
           router: str = "round-robin", fast_path: bool = True,
           **config: object) -> SimResult:
    """``requests`` through ``num_prefill``P``num_decode``D, chunked policy, STEP a step."""
    cfg = SchedulerConfig(**config)  # type: ignore[arg-type]
    cost = ConstantCostModel(STEP)
    return simulate_disagg(
        RequestListArrivals(requests),
        prefill=Pool(num_prefill, cfg, cost, make_router(router), prefill_blocks),
        decode=Pool(num_decode, cfg, cost, make_router(router), decode_blocks),
        policy_factory=ChunkedPolicy, link=link, kv_bytes_per_token=kv_bytes_per_token,
        min_prompt_tokens=min_prompt_tokens, fast_path=fast_path)


def col(result: SimResult, name: str) -> list[float]:
    return [float(x) for x in result.request_table[name]]


def test_one_request_prefill_transfer_decode_to_the_microsecond() -> None:
    # Prefill [0, S] samples the copy's token; 1000 tokens x 1024 B = 1,024,000 B cross
    # in LATENCY + 1,024,000 / 2**20 s; the decode step recomputing the last prompt token
    # samples the first token; four decode steps follow.
    r = disagg(make_requests([5], prompt=1000))
    transfer = LATENCY + 1000 * 1024 / BANDWIDTH
    ttft = STEP + transfer + STEP
    assert col(r, "ttft_s") == [ttft]
    assert col(r, "finish_time") == [ttft + 4 * STEP]
    assert col(r, "num_output_tokens") == [5]
    assert col(r, "prefill_queued_time_s") == [0.0]
    assert col(r, "prefill_time_s") == [STEP]
    assert col(r, "kv_wait_time_s") == [0.0]
    assert col(r, "kv_transfer_time_s") == [transfer]
    assert col(r, "decode_admission_time_s") == [STEP]
    d = r.summary["disagg"]
    assert d["link"]["bytes_moved"] == 1000 * 1024
    assert d["link"]["num_transfers"] == 1
    assert d["link"]["utilization"] == pytest.approx((1000 * 1024 / BANDWIDTH)
                                                     / (ttft + 4 * STEP))
    assert d["prefill"]["num_steps"] == 1 and d["decode"]["num_steps"] == 5
    assert d["num_local"] == 0
    assert list(r.step_table["pool"]) == ["prefill"] + ["decode"] * 5
    assert list(r.step_table["num_prefill_tokens"]) == [1000, 1, 0, 0, 0, 0]


def test_two_simultaneous_transfers_share_the_link() -> None:
    # Both prefills end at S; both transfers wait LATENCY, then share the bandwidth: each
    # ends at S + LATENCY + 2B / bandwidth, not B / bandwidth apart.
    r = disagg(make_requests([2, 2], prompt=512))
    b = 512 * 1024
    landed = STEP + LATENCY + 2 * b / BANDWIDTH
    assert col(r, "kv_transfer_time_s") == [landed - STEP] * 2
    assert col(r, "ttft_s") == [landed + STEP] * 2
    # Unequal sizes: the small one ends at 2 x its bytes / bandwidth; the large one then
    # has the link alone for the rest of its bytes.
    r = disagg(make_requests([2, 2], prompt=[256, 768]))
    small, large = 256 * 1024, 768 * 1024
    first = STEP + LATENCY + 2 * small / BANDWIDTH
    second = first + (large - small) / BANDWIDTH
    assert col(r, "kv_transfer_time_s") == pytest.approx([first - STEP, second - STEP],
                                                         abs=1e-12)


def test_decode_pool_without_room_holds_the_request_and_its_prefill_blocks() -> None:
    # Decode pool: 5 usable blocks of 16 tokens; each request (64-token prompt, 3 tokens)
    # needs 4 at the gate and 5 at its end. Prefill pool: 8 usable blocks. Link: 64
    # tokens x 1 B at 64 B/s = 1 s. R0 and R1 prefill together in [0, S] and hold 8
    # prefill blocks; R0's transfer takes the decode blocks, R1 waits at the gate with
    # its prefill blocks held, so R2 (arriving at 0.5) cannot start its prefill until
    # R0's transfer has been read (1 + S) and frees R0's 4 prefill blocks.
    reqs = make_requests([3, 3, 3], prompt=64, arrivals=[0.0, 0.0, 0.5])
    r = disagg(reqs, prefill_blocks=9, decode_blocks=6, kv_bytes_per_token=1.0,
               link=LinkSpec("slow", 64.0, 0.0))
    s = STEP
    r0_done = (1 + s) + 3 * s  # lands at 1 + S; recompute step, then two decode steps
    r1_landed = r0_done + 1
    r2_prefill = 1 + s
    r2_landed = (r1_landed + 3 * s) + 1  # R1 finishes, frees 5 blocks; R2's transfer
    assert col(r, "prefill_queued_time_s") == [0.0, 0.0, r2_prefill - 0.5]
    assert col(r, "kv_wait_time_s") == [0.0, r0_done - s, (r1_landed + 3 * s) - (r2_prefill + s)]
    assert col(r, "finish_time") == [r0_done, r1_landed + 3 * s, r2_landed + 3 * s]
    assert col(r, "ttft_s") == [1 + 2 * s, r1_landed + s, r2_landed + s - 0.5]
    prefill_steps = r.step_table["pool"] == "prefill"
    assert list(r.step_table["start_time"][prefill_steps]) == [0.0, r2_prefill]
    # R2's prefill step ran with R1's held blocks (4) besides its own (4).
    assert list(r.step_table["kv_blocks_used"][prefill_steps]) == [8, 8]


def test_kv_usage_takes_each_step_over_its_own_pools_blocks() -> None:
    # Prefill pool 64 usable blocks, decode pool 256; the 1000-token prompt holds 63
    # blocks in the one prefill step and in each of the five decode steps (1004 tokens
    # fit 63 blocks of 16), all STEP long. Peak 63/64 (the prefill step), mean over the
    # six steps (63/64 + 5 x 63/256) / 6; over the decode pool's blocks alone both
    # would be 63/256.
    r = disagg(make_requests([5], prompt=1000), prefill_blocks=65, decode_blocks=257)
    assert list(r.step_table["kv_blocks_used"]) == [63] * 6
    kv = r.summary["kv_cache"]
    assert kv["num_gpu_blocks"] == 257
    assert kv["peak_usage"] == 63 / 64
    assert kv["mean_usage"] == pytest.approx((63 / 64 + 5 * 63 / 256) / 6, rel=1e-15)
    d = r.summary["disagg"]
    assert d["prefill"]["kv_cache"]["peak_usage"] == 63 / 64
    assert d["decode"]["kv_cache"]["mean_usage"] == 63 / 256


def test_a_short_prompt_stays_on_the_decode_engine() -> None:
    # min_prompt_tokens 100: the 50-token prompt prefills on the decode engine (first
    # token after one step, nothing on the link); the 200-token one goes through 1P1D.
    r = disagg(make_requests([3, 3], prompt=[50, 200], arrivals=[0.0, 1.0]),
               min_prompt_tokens=100)
    assert col(r, "ttft_s") == [STEP, STEP + LATENCY + 200 * 1024 / BANDWIDTH + STEP]
    assert list(r.request_table["prefill_replica"]) == [None, 0]
    assert list(r.request_table["decode_replica"]) == [0, 0]
    assert math.isnan(col(r, "prefill_time_s")[0])
    d = r.summary["disagg"]
    assert d["num_local"] == 1 and d["link"]["num_transfers"] == 1
    assert d["link"]["bytes_moved"] == 200 * 1024


def waves() -> list[Request]:
    """Three waves of requests arriving together, each drained before the next: no
    prefill overlaps a decode in an aggregated engine."""
    outs = [4, 7, 2, 9, 5, 3, 6, 8, 4, 2, 7, 5]
    prompts = [100, 300, 50, 400, 250, 120, 90, 310, 60, 200, 150, 80]
    arrivals = [0.0] * 4 + [10.0] * 4 + [20.0] * 4
    return make_requests(outs, prompt=prompts, arrivals=arrivals)


def test_instant_link_reproduces_the_aggregated_decode_timeline() -> None:
    # 1P1D on an instant link with the aggregated engine's pool: each request's tokens
    # come one step later (the decode engine's step recomputing the last prompt token
    # follows the prefill engine's step), and every gap after the first token is the
    # aggregated engine's: same TPOT, same ITL samples, same decode steps.
    agg = run_sim(waves(), step_time=STEP, num_gpu_blocks=1000)
    dis = disagg(waves(), link=INSTANT_LINK, prefill_blocks=1000, decode_blocks=1000)
    assert col(dis, "first_token_time") == [t + STEP for t in col(agg, "first_token_time")]
    assert col(dis, "finish_time") == [t + STEP for t in col(agg, "finish_time")]
    assert np.array_equal(agg.request_table["tpot_s"], dis.request_table["tpot_s"],
                          equal_nan=True)
    assert sorted(agg.itl_s) == sorted(dis.itl_s)
    decode = dis.step_table["pool"] == "decode"
    recompute = dis.step_table["num_prefill_tokens"] > 0
    agg_decode = agg.step_table["num_prefill_tokens"] == 0
    assert list(dis.step_table["start_time"][decode & ~recompute]) == [
        t + STEP for t in agg.step_table["start_time"][agg_decode]]
    assert list(dis.step_table["num_seqs"][decode & ~recompute]) == list(
        agg.step_table["num_seqs"][agg_decode])


def random_workload(seed: int, n: int = 150) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.02, n))
    return make_requests(list(rng.integers(1, 60, n)), prompt=list(rng.integers(8, 700, n)),
                         arrivals=list(arrivals))


@pytest.mark.parametrize(("seed", "shape", "router"), [
    (0, (1, 1), "round-robin"), (1, (2, 3), "least-outstanding"), (2, (3, 2), "least-kv")])
def test_decode_fast_path_matches_the_step_by_step_reference(
        seed: int, shape: tuple[int, int], router: str) -> None:
    kw: dict[str, object] = dict(num_prefill=shape[0], num_decode=shape[1], router=router,
                                 decode_blocks=400, prefill_blocks=300,
                                 min_prompt_tokens=64, max_num_seqs=16,
                                 max_num_batched_tokens=512)
    fast = disagg(random_workload(seed), **kw)  # type: ignore[arg-type]
    slow = disagg(random_workload(seed), fast_path=False, **kw)  # type: ignore[arg-type]
    for c in ("first_token_time", "finish_time", "kv_wait_time_s", "kv_transfer_time_s"):
        assert np.array_equal(fast.request_table[c], slow.request_table[c],
                              equal_nan=True), c
    assert len(fast.step_table["start_time"]) == len(slow.step_table["start_time"])
    assert fast.summary["num_finished"] == 150


def test_bad_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        LinkSpec("x", 0.0, 0.0)
    with pytest.raises(ValueError, match="latency"):
        LinkSpec("x", 1.0, -1.0)
    with pytest.raises(ValueError, match="replicas"):
        Pool(0, SchedulerConfig(), ConstantCostModel(STEP), make_router("round-robin"), 10)
    with pytest.raises(ValueError, match="disagg_min_prompt_tokens"):
        disagg(make_requests([2]), min_prompt_tokens=-1)


def test_transfers_late_in_a_long_run_all_end() -> None:
    # At t = 1e6 s one ulp of the clock is about 1.2e-10 s, 6 bytes at 50 GB/s: a shared
    # finish time that rounds onto the present instant must still end its transfers
    # (the run must not spin at that instant).
    env = simpy.Environment(initial_time=1e6)
    link = KVLink(env, LinkSpec("ib", 50e9, 5e-6))
    rng = np.random.default_rng(3)
    ended: list[float] = []

    def start(nbytes: float) -> None:
        link.start(nbytes, ended.append)

    for k in range(200):
        env.schedule(_Later(env, start, float(rng.integers(1, 10**7)) + 0.3),
                     delay=float(rng.exponential(1e-4)) * (k % 7))
    steps = 0
    while env.peek() != math.inf and steps < 100_000:
        env.step()
        steps += 1
    assert len(ended) == 200 and link.num_transfers == 200
    assert link.earliest_delivery() is None


class _Later(simpy.events.Event):
    """An event that starts a transfer when processed."""

    def __init__(self, env: simpy.Environment, start: Callable[[float], None],
                 nbytes: float) -> None:
        super().__init__(env)
        self._ok, self._value = True, None
        self.callbacks.append(lambda _e: start(nbytes))


def test_fast_path_sees_a_request_routed_at_the_instant_a_decode_run_is_planned() -> None:
    # Arrivals on the step grid: b (a short prompt kept local) wakes the decode engine at
    # the instant c is routed to the prefill engine but not yet taken up; the decode
    # run planned then must still stop when c's KV can land.
    s = 2.0 ** -6

    def requests() -> list[Request]:
        return [Request("a", 59.5 * s, 290, 44, 44), Request("b", 60 * s, 3, 23, 23),
                Request("c", 64 * s, 386, 46, 46)]

    cfg = SchedulerConfig(max_num_seqs=9, max_num_batched_tokens=541)
    firsts = []
    for fast in (False, True):
        r = simulate_disagg(
            RequestListArrivals(requests()),
            prefill=Pool(1, cfg, ConstantCostModel(s), make_router("round-robin"), 168),
            decode=Pool(1, cfg, ConstantCostModel(s), make_router("round-robin"), 192),
            policy_factory=ChunkedPolicy, link=LinkSpec("t", 1e9, 1e-5),
            kv_bytes_per_token=1024.0, min_prompt_tokens=64, block_size=4, fast_path=fast)
        firsts.append(r.request_table["first_token_time"])
    assert np.array_equal(firsts[0], firsts[1])
