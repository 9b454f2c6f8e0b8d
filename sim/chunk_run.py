"""Chunk runs: the fast path's runs of one request's prefill chunks beside the decode
group (a SteadyDecode with ``prefill``: chunked's promise for the steps that admit a
request and prefill it while the group decodes, the step of its last chunk admitting
the next request where the promise says so; past arrivals when its chunks take the
whole budget, so that only the step of a shorter last chunk would admit them). Which
steps are safe (``plan_chunk_run``) and what they do (``apply_chunk_run``), with the
results of the step-by-step engine: the same step times summed in the same order, one
step row each, the ITL samples booked in the same order. sim/fastpath.py's FastPath
calls both; tests/test_prefill_runs.py compares the paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from sim.batch import BatchShape, LastChunkAdmission, SteadyDecode, chunk_shape
from sim.decode_group import DecodeGroup
from sim.kv.block_pool import KVCacheManager
from sim.metrics import Recorder
from sim.request import Request
from sim.run_times import cut_run, drop_last_step, run_limit

#: A planned chunk run: step boundaries (s), step durations (s), the prefill's tokens in
#: each step, whether its last step samples a token (else none does: a lone prefill's
#: chunks before its last), and whether that step makes the promise's admission
#: (ChunkedPrefill.admits: it holds the prefill's last chunk).
ChunkPlan = tuple[list[float], list[float], list[int], bool, bool]

#: Prices a chunk run's steps (BulkChunkPricer.chunk_run_times).
ChunkPricer = Callable[[int, bool, int, Sequence[int], int, int, int, float, float],
                       list[float]]


def plan_chunk_run(steady: SteadyDecode, kv: KVCacheManager,
                   step_time: Callable[[BatchShape], float], now: float, max_steps: int,
                   next_arrival: float | None, end_before: float | None,
                   price_chunks: ChunkPricer | None = None,
                   pass_arrivals: bool = False) -> ChunkPlan | None:
    """The longest safe run of ``steady``'s group beside its prefill's chunks, from
    ``now`` (s): up to the step in which a member finishes or the prefill samples (its
    last chunk, when the promise covers it), while the blocks of both fit, at most
    ``max_steps``, cut before an arrival or a routing instant as step_times cuts. One
    step is worth a run: it skips schedule(). None when no step is safe. The step of the
    last chunk, when the promise has it admit the head of waiting, is safe when that
    request's blocks fit too, and is priced with both prefills.
    ``price_chunks``: the cost model's chunk_run_times, when it has one (else each step
    is priced by ``step_time``). ``pass_arrivals``: with the promise's ``arrivals_wait``,
    only a last chunk shorter than the others stops before the step that would see an
    arrival (the caller hands the arrivals over at the steps that see them)."""
    group, prefill = steady.group, steady.prefill
    assert group is not None and prefill is not None, "a prefill runs beside a group"
    req = prefill.request
    to_finish = group.steps_to_first_finish()
    limit = max_steps if to_finish is None else min(to_finish + 1, max_steps)
    rest = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
    chunks = prefill_chunks(rest, prefill.chunk, prefill.covers_last, limit)
    adm = prefill.admits if sum(chunks) == rest else None
    chunks = chunks[:prefill_safe_steps(group, req, chunks, kv.block_size,
                                        kv.num_free_blocks,
                                        adm.blocks_needed if adm is not None else 0)]
    if not chunks:
        return None
    if adm is not None and sum(chunks) < rest:
        adm = None  # stopped before the last chunk
    times, dts = prefill_step_times(steady, chunks, step_time, now, next_arrival, end_before,
                                    price_chunks, adm,
                                    pass_arrivals and prefill.arrivals_wait)
    if len(times) < 2:
        return None
    k = len(dts)
    last = sum(chunks[:k]) == rest
    return times, dts, chunks[:k], bool(group.members) or last, last and adm is not None


def apply_chunk_run(steady: SteadyDecode, plan: ChunkPlan, kv: KVCacheManager,
                    rec: Recorder, num_waiting: int, max_num_seqs: int,
                    waiting: Sequence[int] | None = None) -> list[Request]:
    """What the planned steps would have done one by one: blocks, tokens, ITL samples
    and step rows (``num_waiting`` and ``max_num_seqs`` for the rows; ``waiting``: for
    a run that went past arrivals, the waiting queue of each step instead, with what
    had arrived by its start). The group's
    blocks for the whole run are handed out before the prefill's (the plain pool's
    block ids are read by nothing; a prefix cache never makes this promise). Returns the
    requests that sampled their last token in the last step: members, then the
    prefill's request."""
    times, _, chunks, _, admitting = plan
    group, prefill = steady.group, steady.prefill
    assert group is not None and prefill is not None
    req, k = prefill.request, len(chunks)
    if req.first_scheduled_time is None:  # admitted for the run's first step
        req.first_scheduled_time = times[0]
    members = bool(group.members)
    group_blocks = group.allocate_for_steps(k, kv.num_free_blocks) if members else [0] * k
    assert group_blocks is not None, "fast path: blocks checked by prefill_safe_steps"
    _record(steady, plan, group_blocks, kv, rec, num_waiting, max_num_seqs, waiting)
    c = req.num_computed_tokens + sum(chunks)
    if kv.allocate_up_to(req, c) is None:
        raise AssertionError("fast path: blocks checked by prefill_safe_steps did not fit")
    req.num_computed_tokens = c
    if admitting:  # the last step admits the head of waiting for its first chunk
        adm = prefill.admits
        assert adm is not None
        adm.admit()
        b = adm.request
        if b.first_scheduled_time is None:  # else it ran before (a preempted request)
            b.first_scheduled_time = times[k - 1]
        b.num_computed_tokens += adm.num_tokens
    done = _book(req, group, times, rec)
    finished = group.advance(k, times[k]) if members else []
    finished.extend(done)
    return finished


def _book(req: Request, group: DecodeGroup, times: list[float], rec: Recorder
          ) -> list[Request]:
    """A chunk run's ITL samples in the step-by-step engine's order (in a step, the
    prefill's token before the members': Engine._apply, then _apply_group), and the
    token its last chunk samples (the first sets first_token_time; a recomputed
    request's is an ITL sample). Returns [req] when that token was its last."""
    k, n = len(times) - 1, len(group.members)
    if n and k > 1:  # the steps before the last
        _book_group_first_step(group, times, rec)
        if k > 2:
            rec.book_itl_run(times[1:k], n, n)
    done = []
    if req.num_computed_tokens >= req.num_prompt_tokens + req.num_output_tokens:
        o = req.num_output_tokens + 1
        req.num_output_tokens = o
        end, start = times[k], times[k - 1]
        if o == 1:
            req.first_token_time = end
        elif req.last_token_time == start:
            rec.book_itl_step(end - start, 1)
        else:
            rec.book_itl(end - req.last_token_time)  # type: ignore[operator]
        req.last_token_time = end
        if o >= req.max_output_tokens:
            done.append(req)
    if n:  # the last step
        if k == 1:
            _book_group_first_step(group, times, rec)
        else:
            rec.book_itl_step(times[k] - times[k - 1], n)
    return done


def _book_group_first_step(group: DecodeGroup, times: list[float], rec: Recorder) -> None:
    """The members' samples in a chunk run's first step, as Engine._apply_group books
    them (those that joined during a stall apart)."""
    n, fresh = len(group.members), group.fresh
    if fresh:
        rec.book_itl_step(times[1] - times[0], fresh)
    if n > fresh:
        rec.book_itl_step(times[1] - group.last_end, n - fresh)


def _record(steady: SteadyDecode, plan: ChunkPlan, group_blocks: Sequence[int],
            kv: KVCacheManager, rec: Recorder, num_waiting: int, max_num_seqs: int,
            waiting: Sequence[int] | None) -> None:
    """A chunk run's step rows, one by one (its tokens change from step to step): the
    blocks in use after each step's allocations, the group's and the prefill's (called
    after the group's and before the prefill's allocation); the waiting queue of each
    step, ``num_waiting`` or each step's in ``waiting``."""
    times, dts, chunks, _, admitting = plan
    prefill = steady.prefill
    assert prefill is not None
    req = prefill.request
    bs, g, held = kv.block_size, len(steady.requests), len(steady.holders)
    useful, empty = g + 1, max_num_seqs - held
    decode = req.num_output_tokens > 0  # a one-token chunk is then priced as a decode
    c, blocks = req.num_computed_tokens, len(req.block_ids)
    used = kv.num_used_blocks - sum(group_blocks) - blocks  # before the run, without it
    row_blocks = []
    for j, n in enumerate(chunks):
        c += n
        used += group_blocks[j]
        row_blocks.append(used + max(blocks, -(-c // bs)))
    # The other columns change only with the chunk's tokens and the arrivals, and the
    # chunks are equal but for a last, shorter one: one stored row per stretch of steps
    # alike, not per step.
    k = len(chunks) - admitting
    i = 0
    while i < k:
        n, e = chunks[i], i + 1
        w = waiting[i] if waiting is not None else num_waiting
        while e < k and chunks[e] == n and (waiting is None or waiting[e] == w):
            e += 1
        prefill_tokens, decode_tokens = (0, useful) if n == 1 and decode else (n, g)
        rec.record_steps(times[i:e], dts[i:e], row_blocks[i:e],
                         (useful, prefill_tokens, decode_tokens, w, useful,
                          held - useful, empty, 0))
        i = e
    if admitting:  # its last row: both prefills, one more slot held, one fewer waiting
        adm = prefill.admits
        # (no arrival came during the run: the step that admits would have seen it)
        assert adm is not None and waiting is None
        rec.record_steps(times[k:], dts[k:], [row_blocks[k] + adm.blocks_allocated],
                         (useful + 1, chunks[k] + adm.num_tokens, g, num_waiting - 1,
                          useful + 1, held - useful, empty - 1, 0))


def prefill_chunks(rest: int, chunk: int, covers_last: bool, limit: int) -> list[int]:
    """The tokens a prefill with ``rest`` tokens left gets in each of at most ``limit``
    steps, ``chunk`` a step: the steps before its last chunk (the one that samples), and
    that one when ``covers_last``."""
    full = min((rest - 1) // chunk, limit)
    out = [chunk] * full
    if covers_last and full < limit and rest - full * chunk <= chunk:
        out.append(rest - full * chunk)
    return out


def prefill_safe_steps(group: DecodeGroup, req: Request, chunks: Sequence[int],
                       block_size: int, num_free_blocks: int, last_step_blocks: int = 0) -> int:
    """How many of the steps of ``chunks`` fit in the free pool: in each, the members'
    new blocks (their block crossings) and then ``req``'s for its chunk, and in the last
    ``last_step_blocks`` more (an admission's test). The run stops before the step where
    they would not (the step-by-step engine would dissolve the group, preempt, or not
    admit there)."""
    k = len(chunks)
    held = len(req.block_ids)
    c = req.num_computed_tokens
    g = len(group.members)
    if g * -(-k // block_size) + max(0, -(-(c + sum(chunks)) // block_size) - held) \
            + last_step_blocks <= num_free_blocks:
        return k  # even if every member crossed as often as it can, they fit
    crossings = group.crossings(k) if g else [0] * k
    used = 0
    for j, n in enumerate(chunks):
        c += n
        need = -(-c // block_size) - held
        if need > 0:
            held += need
            used += need
        used += crossings[j]
        if used > num_free_blocks:
            return j
    return k - 1 if used + last_step_blocks > num_free_blocks else k


def prefill_step_times(steady: SteadyDecode, chunks: Sequence[int],
                       step_time: Callable[[BatchShape], float], start: float,
                       next_arrival: float | None, end_before: float | None,
                       price_chunks: ChunkPricer | None = None,
                       admits: LastChunkAdmission | None = None,
                       pass_arrivals: bool = False
                       ) -> tuple[list[float], list[float]]:
    """step_times for a run of the decode group beside ``chunks`` of the promise's
    prefill: each step priced as shape_of prices the chunk next to the members'
    decodes (sim.batch.chunk_shape; by ``price_chunks`` in one call when given), the
    last, with ``admits``, as shape_of prices it beside that admission's first chunk;
    cut as step_times cuts. With ``pass_arrivals`` (ChunkedPrefill.arrivals_wait) only
    the step of a last chunk shorter than the others stops the run at ``next_arrival``:
    the run ends before it when an arrival comes by its start."""
    prefill = steady.prefill
    assert prefill is not None
    req = prefill.request
    num_tokens = req.num_prompt_tokens + req.num_output_tokens
    has_output = req.num_output_tokens > 0
    g, growth = steady.shape.num_decode_seqs, steady.context_growth
    ctx = steady.shape.decode_context_tokens  # chunk_shape ignores it without decodes
    limit = run_limit(None if pass_arrivals else next_arrival, end_before)
    alone = chunks[:-1] if admits is not None else chunks
    prices: Iterable[float]
    if price_chunks is not None:  # priced only up to the step at the limit (if any)
        prices = price_chunks(num_tokens, has_output, req.num_computed_tokens, alone, g,
                              ctx, growth, start, limit)
    else:
        def priced() -> Iterator[float]:  # lazily: cut_run may stop before the last
            c = req.num_computed_tokens
            for j, n in enumerate(alone):
                yield step_time(chunk_shape(num_tokens, has_output, c, n, g, ctx + j * growth))
                c += n

        prices = priced()
    if admits is not None:
        prices = _then_admission(prices, len(alone), lambda: step_time(_admission_shape(
            req.num_computed_tokens + sum(alone), chunks[-1], admits, g,
            ctx + len(alone) * growth)))
    times, dts = cut_run(prices, start, limit, end_before, min_steps=0)
    if (pass_arrivals and next_arrival is not None and len(dts) == len(chunks) > 1
            and chunks[-1] < prefill.chunk and times[-2] >= next_arrival):
        drop_last_step(times, dts)  # that step would admit what arrived
    return times, dts


def _then_admission(prices: Iterable[float], num_alone: int,
                    admission_price: Callable[[], float]) -> Iterator[float]:
    """``prices``, then the admission step's price if all ``num_alone`` came (a bulk
    pricer stops at the arrival); lazily, so a run cut early prices no step past the cut
    (a re-plan at every arrival would otherwise price a long prompt's every chunk)."""
    n = 0
    for price in prices:
        n += 1
        yield price
    if n == num_alone:
        yield admission_price()


def _admission_shape(computed: int, n: int, admits: LastChunkAdmission,
                     num_group_decodes: int, group_context_tokens: int) -> BatchShape:
    """shape_of([(req, n), (admitted, its tokens)], num_group_decodes,
    group_context_tokens) for the step of a prefill's last chunk (``n`` tokens over
    ``computed``, sampling: never a one-token decode) beside an admission's first chunk
    (not sampling), from the numbers alone."""
    b = admits.request
    c, m = b.num_computed_tokens, admits.num_tokens
    pairs = n * computed + n * (n + 1) // 2 + m * c + m * (m + 1) // 2
    if num_group_decodes:
        return BatchShape(n + m, 2, computed + c, pairs, num_group_decodes,
                          group_context_tokens, 1 + num_group_decodes)
    return BatchShape(n + m, 2, computed + c, pairs, 0, 0, 1)
