"""A workload's prefix-cache slots fixed before the run (sim/kv/prefix_slots.py): hand-computed
tables, Mooncake hash ids read as ``mooncake_segments`` reads them, the slot relation
against ``prefix_spans`` and an independent layout model (hypothesis), bad input, and
whole runs with fixed slots against the same requests given as segments (dynamic slots)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.app.runs.prompt_content as workload_content
from policies import get_policy_class
from scenarios.workload import Workload
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from sim.config import SchedulerConfig
from sim.kv.prefix_content import (
    CHAIN_ROOT,
    answer_segment_id,
    chain_hash,
    mooncake_segments,
    prefix_spans,
    unique_segment_id,
)
from sim.kv.prefix_slots import PrefixSlotTable, _ids, segment_chains
from sim.request import Request
from sim.simulate import simulate
from sim.source import ContentFn, RequestListArrivals
from tests.test_fastpath import ContextCost

Rows = Sequence[Sequence[tuple[int, int]]]


def from_rows(rows: Rows, block_size: int) -> PrefixSlotTable:
    """from_segments over rows of (segment id, tokens), each row's last its answer."""
    ids = [s for r in rows for s, _ in r]
    tokens = [n for r in rows for _, n in r]
    off = np.cumsum([0] + [len(r) for r in rows])
    return PrefixSlotTable.from_segments(np.array(ids, np.int64), np.array(tokens, np.int64),
                                         off, block_size)


def all_runs(t: PrefixSlotTable) -> list[tuple[list[int], list[int]]]:
    """Every row's runs: (first positions, lengths)."""
    return [tuple(list(map(int, x)) for x in t.runs(i)[:2]) for i in range(len(t))]  # type: ignore[misc]


# -- hand-computed tables --

def test_from_segments_by_hand() -> None:
    # Block size 4; chains in order of first meeting, each as many slots as the most
    # blocks a row ends in it: C7 = (7) 2 slots at 1-2 (row 2 ends only block 0 in it),
    # answer 100: 3; C79 = (7, 9) 2 at 4-5 (row 5's 9 tokens end blocks 2, 3; rows 1
    # and 4 cut it at 5 tokens: block 2 only; block 3 ends in their answers); answer
    # 101: 6; answer 102: 7 (row 2's block 1 straddles 7 and 102); row 3's segments 5
    # and 7 hold no block end, so (5, 7, 9) takes 8-10 and answer 103 11; answer 104
    # 12-13, answer 105 14. Row 6 (3 tokens in all) has no block.
    rows = [[(7, 8), (100, 5)], [(7, 8), (9, 5), (101, 3)], [(7, 6), (102, 2)],
            [(5, 2), (7, 1), (9, 9), (103, 4)], [(7, 8), (9, 5), (104, 7)],
            [(7, 8), (9, 9), (105, 3)], [(8, 2), (106, 1)]]
    t = from_rows(rows, 4)
    assert t.num_slots == 14 and len(t) == 7
    assert all_runs(t) == [([1], [3]), ([1, 4, 6], [2, 1, 1]), ([1, 7], [1, 1]), ([8], [4]),
                           ([1, 4, 12], [2, 1, 2]), ([1, 4, 14], [2, 2, 1]), ([], [])]


def test_for_workload_by_hand() -> None:
    # Block size 4, a session: b and d repeat a's prompt and answer (6 tokens), so their
    # block 2 (a's answer, offsets 0-3) is a's block 2. C7: 1-2, (7, Aa): 3,
    # (7, Aa, 9): 4-5 (d ends 2 blocks in it, b one), Ab: 6, Ad: 7. c's 6 + 1 tokens
    # end one block (in C7); its answer ends none.
    aa = answer_segment_id("a")
    segs = [[(7, 8)], [(7, 8), (aa, 6), (9, 2)], [(7, 6)], [(7, 8), (aa, 6), (9, 9)]]
    prompt = [sum(n for _, n in s) for s in segs]
    t = PrefixSlotTable.for_workload(np.array(prompt), np.array([6, 5, 1, 3]), "abcd", 4,
                                     prompt_segments=segs)
    assert t.num_slots == 7
    assert all_runs(t) == [([1], [3]), ([1, 6], [4, 1]), ([1], [1]), ([1, 7], [5, 1])]
    # The answers are the rows' last segments, named by answer_segment_id.
    same = from_rows([[*s, (answer_segment_id(r), o)] for s, r, o in
                      zip(segs, "abcd", [6, 5, 1, 3], strict=True)], 4)
    assert all_runs(same) == all_runs(t)


def test_hash_ids_by_hand() -> None:
    # Block size 256, 512 tokens an id. x: ids 1, 2 (188 tokens: cut; id 3 is past the
    # prompt), answer 100: C1 blocks 0-1 at 1-2, (1, 2) ends no block, Ax block 2 at 3.
    # y: ids 1, 2 whole then 76 tokens of its own, answer 30: C1, (1, 2) blocks 2-3 at
    # 4-5; nothing ends in the rest. z: no ids: its own 300 tokens (6), Az (7).
    t = PrefixSlotTable.for_workload(np.array([700, 1100, 300]), np.array([100, 30, 300]),
                                     "xyz", 256, hash_ids=[[1, 2, 3], [1, 2], []])
    assert t.num_slots == 7
    assert all_runs(t) == [([1], [3]), ([1, 4], [2, 2]), ([6], [2])]


# -- Mooncake hash ids --

@pytest.mark.parametrize("block_size", [16, 48, 512, 1000])
def test_hash_ids_read_as_mooncake_segments(block_size: int) -> None:
    rng = np.random.default_rng(block_size)
    roots = [rng.integers(0, 50, 8).tolist() for _ in range(3)]
    hash_ids: list[list[int]] = [[], [4, 5], [4, 5, 6, 7], [4, 5], [4]]
    prompt = [700, 1500, 600, 1024, 1]  # none, beyond the ids, ids beyond, exact, 1
    for i in range(200):
        ids = roots[i % 3][:int(rng.integers(0, 9))] + [1000 + i] * int(rng.integers(0, 2))
        hash_ids.append(ids)
        cover = 512 * len(ids) if ids and rng.random() < 0.9 else 2000
        prompt.append(int(rng.integers(1, cover + 1)))
    n = len(prompt)
    out = rng.integers(1, 900, n)
    rid = [f"m{i}" for i in range(n)]
    segs = [mooncake_segments(h, p, r) for h, p, r in zip(hash_ids, prompt, rid, strict=True)]
    assert segs[0] == ((unique_segment_id("m0"), 700),)
    assert segs[1] == ((4, 512), (5, 512), (unique_segment_id("m1"), 476))
    a = PrefixSlotTable.for_workload(np.array(prompt), out, rid, block_size, hash_ids=hash_ids)
    b = PrefixSlotTable.for_workload(np.array(prompt), out, rid, block_size,
                                     prompt_segments=segs)
    assert a.num_slots == b.num_slots and all_runs(a) == all_runs(b)


# -- against prefix_spans (hypothesis) --

def model_positions(reqs: list[Request], block_size: int) -> list[list[int]]:
    """Each request's block positions by the layout rule, from prefix_spans' chains:
    (chain, block within it) -> the chain's base + index; chains in order of first
    meeting, each as many slots as the most blocks a request ends in it."""
    names: list[list[tuple[int, int]]] = []
    size: dict[int, int] = {}
    for r in reqs:
        total = (r.num_prompt_tokens + r.output_len) // block_size
        spans = prefix_spans(r, block_size)
        row = []
        for k in range(0, len(spans), 3):
            chain, j0, j1 = spans[k:k + 3]
            row += [(chain, j - j0) for j in range(j0, min(j1, total))]
            if min(j1, total) > j0:
                size[chain] = max(size.get(chain, 0), min(j1, total) - j0)
        names.append(row)
    base, top = {}, 1
    for chain, n in size.items():  # dicts keep the order of first meeting
        base[chain], top = top, top + n
    return [[base[c] + i for c, i in row] for row in names]


def as_runs(pos: list[int]) -> tuple[list[int], list[int]]:
    """Positions as maximal runs of consecutive ones: (first positions, lengths)."""
    heads = [k for k in range(len(pos)) if not k or pos[k] != pos[k - 1] + 1]
    return [pos[h] for h in heads], np.diff([*heads, len(pos)]).tolist()


SEGMENT_IDS = [1, 2, 3, answer_segment_id("r0"), answer_segment_id("r1")]
ROWS = st.lists(st.tuples(st.lists(st.tuples(st.sampled_from(SEGMENT_IDS), st.integers(1, 12)),
                                   min_size=1, max_size=4), st.integers(1, 10)),
                min_size=1, max_size=7)


def session(rows: list[tuple[list[tuple[int, int]], int]], block_size: int,
            gaps: Sequence[float] = ()) -> tuple[list[Request], PrefixSlotTable]:
    """Requests r0, r1, ... of rows (segments, output_len), given their segments, and
    the table of the same rows."""
    reqs = []
    for i, (segs, out) in enumerate(rows):
        r = Request(f"r{i}", sum(gaps[:i + 1]), sum(n for _, n in segs), out, out, i % 2, i)
        r.prompt_segments = tuple(segs)
        reqs.append(r)
    t = PrefixSlotTable.for_workload(np.array([r.num_prompt_tokens for r in reqs]),
                                     np.array([r.output_len for r in reqs]),
                                     [r.request_id for r in reqs], block_size,
                                     prompt_segments=[segs for segs, _ in rows])
    return reqs, t


@settings(deadline=None)
@given(ROWS, st.integers(1, 8))
def test_slots_name_blocks_as_prefix_spans_do(rows: list[tuple[list[tuple[int, int]], int]],
                                              block_size: int) -> None:
    """Two blocks share a position exactly when prefix_spans gives them the same (chain,
    block within it), and every row's runs are the model's layout."""
    reqs, t = session(rows, block_size)
    got = [[p for s, n in zip(*runs, strict=True) for p in range(s, s + n)]
           for runs in all_runs(t)]
    name_at: dict[int, tuple[int, int]] = {}
    pos_of: dict[tuple[int, int], int] = {}
    for r, pos in zip(reqs, got, strict=True):
        assert len(pos) == (r.num_prompt_tokens + r.output_len) // block_size
        spans = prefix_spans(r, block_size)
        for j, p in enumerate(pos):
            k = max(k for k in range(0, len(spans), 3) if spans[k + 1] <= j)
            name = (spans[k], j - spans[k + 1])
            assert name_at.setdefault(p, name) == name  # one name a position ...
            assert pos_of.setdefault(name, p) == p  # ... and one position a name
    want = model_positions(reqs, block_size)
    assert [as_runs(p) for p in want] == all_runs(t)
    assert t.num_slots == max((p for row in want for p in row), default=0)


@settings(deadline=None)
@given(ROWS, st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.2]), min_size=7, max_size=7),
       st.integers(1, 8), st.sampled_from(["block", "radix"]), st.integers(20, 120))
def test_random_sessions_simulate_alike(rows: list[tuple[list[tuple[int, int]], int]],
                                        gaps: list[float], block_size: int, cache: str,
                                        room: int) -> None:
    """The same requests with fixed slots or with segments: the same records."""
    cfg = SchedulerConfig(prefix_cache=cache, max_num_seqs=4, max_num_batched_tokens=16,
                          queue="lpm")
    tables = []
    for fixed in (True, False):
        reqs, t = session(rows, block_size, gaps)
        for r in reqs if fixed else ():
            r.prefix_slots, r.prompt_segments = t.runs(r.index), None
        res = simulate(RequestListArrivals(reqs), policy_factory=get_policy_class("chunked"),
                       config=cfg, cost_model=ContextCost(), num_gpu_blocks=2 + room // block_size,
                       block_size=block_size)
        tables.append(res.request_table)
    for col in tables[0]:
        np.testing.assert_array_equal(tables[0][col], tables[1][col], err_msg=col)


# -- bad input --

@pytest.mark.parametrize(("ids", "tokens", "offsets", "message"), [
    ([1, 2], [3, 4], [1, 2], "offsets"),  # not from 0
    ([1, 2], [3, 4], [0, 0, 2], "offsets"),  # row 0 has no segment
    ([1, 2], [3, 4], [0, 1], "offsets"),  # not up to the number of segments
    ([1, 2], [3, 0], [0, 1, 2], ">= 1 token"),
    ([1, 2], [3, -2], [0, 2], ">= 1 token"),
])
def test_bad_segments_are_refused(ids: list[int], tokens: list[int], offsets: list[int],
                                  message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrefixSlotTable.from_segments(np.array(ids), np.array(tokens), np.array(offsets), 4)


def test_bad_block_size_and_lengths_are_refused() -> None:
    ids, tokens, off = np.array([1, 2]), np.array([3, 4]), np.array([0, 1, 2])
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        PrefixSlotTable.from_segments(ids, tokens, off, 0)
    with pytest.raises(ValueError, match="2 ids but 1 token counts"):
        PrefixSlotTable.from_segments(ids, tokens[:1], off, 4)


@settings(deadline=None)
@given(st.lists(st.lists(st.tuples(st.one_of(st.integers(-2**63, 2**63 - 1),
                                             st.sampled_from([-1, -2, 5, 5 + 2**61 - 1,
                                                              2**64 + 3, -2**70])),
                                   st.integers(1, 10**6)), min_size=1, max_size=6),
                min_size=1, max_size=5))
def test_chains_are_chain_hash_in_bulk(rows: list[list[tuple[int, int]]]) -> None:
    """segment_chains (numpy, the whole workload) gives every segment the value that
    chain_hash (Python, one request) gives it in prefix_spans, ids outside int64 and ids
    Python's hash would merge (-1 and -2; v and v + 2^61 - 1) included."""
    ids = _ids(s for r in rows for s, _ in r)
    tokens = np.array([n for r in rows for _, n in r], np.int64)
    off = np.cumsum([0] + [len(r) for r in rows])
    got = segment_chains(ids, tokens, off).tolist()
    want = []
    for r in rows:
        chain, prev = CHAIN_ROOT, 0
        for sid, n in r:
            chain = chain_hash(chain, prev, sid)
            want.append(chain)
            prev = n
    assert got == want


def test_ids_python_hash_would_merge_stay_apart() -> None:
    """hash(-1) == hash(-2) and hash(v) == hash(v + 2**61 - 1) in Python; chains keep them
    apart (both paths: the table computes the same chain_hash)."""
    assert chain_hash(CHAIN_ROOT, 0, -1) != chain_hash(CHAIN_ROOT, 0, -2)
    assert chain_hash(CHAIN_ROOT, 0, 5) != chain_hash(CHAIN_ROOT, 0, 5 + 2**61 - 1)
    t = from_rows([[(-1, 8), (9, 1)], [(-2, 8), (9, 1)]], 4)
    assert all_runs(t) == [([1], [2]), ([3], [2])]


def test_ids_past_int64_stand_for_their_hash() -> None:
    """A 64-bit unsigned hash id (as some traces carry) is read as its Python hash, as
    prefix_spans' tuple hashes read it: shared where equal, not an OverflowError."""
    big = 2**64 + 3
    rows = dict(num_prompt_tokens=np.array([600, 600, 600]), output_len=np.array([5, 5, 5]),
                request_id=["a", "b", "c"], block_size=16)
    t = PrefixSlotTable.for_workload(**rows, hash_ids=[[big, 7], [big, 8], [2**63, 7]])
    same = PrefixSlotTable.for_workload(**rows, hash_ids=[[hash(big), 7], [hash(big), 8],
                                                          [hash(2**63), 7]])
    assert all_runs(t) == all_runs(same)
    # Rows a and b share their first 512-token id: 32 blocks at positions 1-32.
    assert all_runs(t)[0][0][0] == all_runs(t)[1][0][0] == 1
    assert all_runs(t)[0][1][0] >= 32 and all_runs(t)[2][0][0] > 32
    segs = PrefixSlotTable.for_workload(**rows, prompt_segments=[[(big, 600)]] * 3)
    assert all_runs(segs)[0][0][0] == all_runs(segs)[2][0][0]


def test_a_table_needs_content() -> None:
    with pytest.raises(ValueError, match="prompt_segments or hash_ids"):
        PrefixSlotTable.for_workload(np.array([5]), np.array([1]), ["0"], 4)


# -- whole runs: fixed slots against dynamic ones --

def mooncake_like(n: int, seed: int) -> Workload:
    """Hash ids sharing three roots, some past the prompt, some prompts past their ids,
    some requests of less than a block, some capped below their output_len."""
    rng = np.random.default_rng(seed)
    roots = [rng.integers(0, 1000, 6).tolist() for _ in range(3)]
    hash_ids, prompt = [], []
    for i in range(n):
        ids = roots[i % 3][:int(rng.integers(0, 7))] + [10_000 + i] * int(rng.integers(0, 2))
        p = int(rng.integers(1, 512 * len(ids) + 1)) if ids else int(rng.integers(1, 900))
        hash_ids.append(ids)
        prompt.append(p + 300 * (rng.random() < 0.1) if i % 10 else int(rng.integers(1, 9)))
    out = rng.integers(1, 200, n)
    out[::10] = rng.integers(1, 8, len(out[::10]))
    return Workload.from_arrays(np.cumsum(rng.exponential(0.05, n)), prompt, out,
                                max_tokens=np.where(rng.random(n) < 0.2, out // 2 + 1, out),
                                hash_ids=hash_ids)


def as_segments(w: Workload, block_size: int, replicas: int = 1) -> ContentFn:
    """The dynamic path: each request's segments, its slots made by the index."""
    def content(req: Request) -> None:
        i = req.index
        req.prompt_segments = (tuple(w.prompt_segments[i]) if w.prompt_segments is not None
                               else mooncake_segments(w.hash_ids[i],  # type: ignore[index]
                                                      int(w.num_prompt_tokens[i]),
                                                      req.request_id))
    return content


@pytest.mark.parametrize("cache", ["block", "radix"])
@pytest.mark.parametrize(("scenario", "blocks", "policy", "users"), [
    ("multi-turn", 700, "chunked", None), ("system-prompts", 700, "continuous", None),
    ("mooncake", 500, "chunked", None), ("mooncake", 400, "continuous", 16),
])
def test_fixed_slots_simulate_as_dynamic_ones(monkeypatch: pytest.MonkeyPatch, cache: str,
                                              scenario: str, blocks: int, policy: str,
                                              users: int | None) -> None:
    """A pool tight enough to evict and preempt, open loop or closed (``users``): the
    same records, steps and summary."""
    prep = prepare(RunConfig(scenario="default" if scenario == "mooncake" else scenario,
                             num_requests=120, rate=None if users else 40.0, concurrency=users,
                             prefix_cache=cache, policy=policy, num_gpu_blocks=blocks,
                             max_model_len=(blocks - 1) * 16, max_num_seqs=24))
    if scenario == "mooncake":
        prep = dataclasses.replace(prep, workload=mooncake_like(150, 1))
    fixed_slots: list[bool] = []
    real = workload_content.prompt_content

    def spy(w: Workload, block_size: int, replicas: int = 1) -> ContentFn:
        content = real(w, block_size, replicas)
        assert content is not None

        def call(req: Request) -> None:
            content(req)
            fixed_slots.append(req.prefix_slots is not None and req.prompt_segments is None)
        return call

    # run_arrivals imports prompt_content when a run has a prefix cache: patched at its module.
    monkeypatch.setattr(workload_content, "prompt_content", spy)
    fixed = simulate_prepared(prep)
    monkeypatch.setattr(workload_content, "prompt_content", as_segments)
    dynamic = simulate_prepared(prep)
    assert len(fixed_slots) == len(prep.workload) and all(fixed_slots)
    pc = fixed.summary["prefix_cache"]
    assert pc["evictions"] > 0 and pc["hit_tokens"] > 0 and fixed.summary["num_preemptions"] > 0
    for table in ("request_table", "step_table"):
        a, b = getattr(fixed, table), getattr(dynamic, table)
        assert a.keys() == b.keys()
        for col in a:
            np.testing.assert_array_equal(a[col], b[col], err_msg=f"{table}.{col}")
    assert fixed.summary == dynamic.summary


def test_past_the_slot_limit_blocks_are_named_per_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A workload with more slots than MAX_FIXED_SLOTS hands out segments (the index then
    makes slots per request, compacting as it fills): the same records."""
    prep = prepare(RunConfig(scenario="multi-turn", num_requests=80, rate=40.0,
                             prefix_cache="block", num_gpu_blocks=600, max_model_len=9584,
                             max_num_seqs=16))
    fixed = simulate_prepared(prep)
    monkeypatch.setattr(workload_content, "MAX_FIXED_SLOTS", 10)
    content = workload_content.prompt_content(prep.workload, prep.config.block_size)
    assert content is not None
    req = Request("0", 0.0, int(prep.workload.num_prompt_tokens[0]), 1, 1, 0, 0)
    content(req)
    assert req.prefix_slots is None and req.prompt_segments == prep.workload.prompt_segments[0]
    per_request = simulate_prepared(prep)
    assert fixed.summary["prefix_cache"]["hit_tokens"] > 0
    assert fixed.summary == per_request.summary
    for col in fixed.request_table:
        np.testing.assert_array_equal(fixed.request_table[col], per_request.request_table[col])
