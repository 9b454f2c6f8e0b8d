"""Real execution of engine steps: the StepExecutor that ``servesim validate`` runs in place
of a cost model (sim.engine.StepExecutor).

Owns :class:`TorchExecutor`: the calibration decoder (calibration.torch_model, random
weights, the profile's model, dtype and torch threads), the KV caches of the requests in
flight, the per-request token ids, the step timer, and :class:`StepTiming` (what one
executed step measured). The engine, the policy, the block allocator and the arrivals are
the simulator's own; only the step times come from here.

**Caches.** Each request gets a cache (a slot of the decoder's slot cache) when it is first
scheduled, holding exactly its computed tokens: a prefill chunk writes its n tokens after
the request's prior context, a decode writes one token and attends over the request's
real context. A request's cache is dropped when it leaves the batch (finished, or preempted:
recompute then rebuilds it from token 0, as the engine says). A request first scheduled with
computed tokens (a prefix-cache hit, a swap-in) gets a cache of that length without
computing it, as a cache hit or a swap-in copy would. The decodes of a step sit in a
contiguous run of slots, longest context first (so their keys are strided views, as the
calibration measured them, and as a paged kernel reads blocks in place); before each step,
outside the timed region, requests are moved between slots to make it so. Moves copy only
a request's real tokens and are rare: contexts all grow by one a step, so the order only
changes when a request joins or leaves the decodes.

**Decode groups.** torch's attention pads a batch of decodes to its longest context; the
profile prices the true key count, as a paged kernel reads it. So the sorted decodes are
split into runs of similar context, each its own attention call, choosing the split that
minimises padded keys plus ``group_keys`` keys per call (dynamic programming over the
sorted contexts; 128 is about one call's overhead in keys on the calibration CPU). With
uniform contexts (the calibration grid, static batching) that is one call, as measured.

Why slots and not one growing tensor per request: with separate tensors every decode needs
its own attention call; on the 2-core CPU that cost 5-14% more per 16-32-sequence decode
step than the batched call the profile measured, which a paged-attention kernel does not
pay either, so validation would have measured this executor's layout instead of the
simulator's error.

**Static batching** charges a plan's ``cost_shape`` (the prompt padded to the batch's
longest, finished members still computed) and is executed as charged: at the prefill step
every holder of the batch runs a chunk of the padded length (its prompt left-padded with
token 0), at each decode step every holder, finished members included, decodes one token
over its padded cache. The executed shape is checked against the cost shape.

**Sampling**: the LM head's logits of the rows that sample are cast to fp32 (as vLLM's
sampler does) and reduced by argmax (greedy, one token per sampling request per step),
inside the timed region; a request's next decode feeds its last token.

**Timing**: ``timer="thread"`` reads the calling thread's CPU time around the step (only
valid on CPU with one torch thread, where the whole step runs on that thread): time during
which another process holds the core is not counted, so the figure is what the step takes on
a dedicated core. ``"wall"`` reads perf_counter (CUDA synchronised before and after).
``"auto"`` picks thread on CPU with one thread, wall otherwise. Both clocks are recorded.
``repeats`` > 1 executes each step that many times from the same state (the same cache
lengths and inputs, so the same keys, values and sampled tokens) and keeps the run that
``statistic`` picks (calibration.fit.chosen_run): the statistic the profile was fitted to
(fit.statistic), so that both sides of the comparison take the same order statistic of
their runs. 1 (the default) is a plain real run.

**Device probe**: every ``probe_every_s`` seconds of executed step time (0: never),
before the next step, :meth:`TorchExecutor.probe` times one sampled decode over
``probe_context`` cached tokens in a free slot, as steps are timed, to show the device's
drift during a run (a shared VM's neighbours slow every step; calibration.device_probe).
It runs outside the timed steps (the simulated clock never includes it) and touches no
request's cache or slot.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from calibration.device_probe import PROBE_CONTEXT, borrowed_slot, check_probe, probe_shape
from calibration.fit import check_statistic, chosen_run
from calibration.measure import device_name
from calibration.torch_model import Chunk, build_decoder
from sim.batch import BatchPlan, BatchShape

if TYPE_CHECKING:
    from calibration.specs import ModelSpec
    from sim.request import Request

TIMERS = ("auto", "thread", "wall")


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One executed step: wall-clock seconds, the calling thread's CPU seconds, and the
    seconds returned to the engine (the chosen clock)."""

    wall_s: float
    thread_s: float
    seconds: float


@dataclass(frozen=True, slots=True)
class _Work:
    """One sequence of a step: ``n`` tokens after ``context`` cached ones."""

    req: Request
    n: int
    context: int
    decode: bool
    sample: bool


class TorchExecutor:
    """Runs each step of a plan on the device and returns its measured seconds.

    capacity: the most tokens one request's cache holds (prompt plus outputs, padded for
    static batching); max_num_seqs: the engine's batch limit (one slot each, plus a spare
    for moves). Sets torch's CPU threads to ``threads`` until :meth:`close` (None: leave
    them). probe_every_s, probe_context (at most capacity - 1): the device probe. Raises
    ValueError naming dtype, device, threads, timer, capacity or probe_every_s when invalid.
    """

    def __init__(self, spec: ModelSpec, *, capacity: int, max_num_seqs: int,
                 dtype: str = "bf16", device: str = "cpu", threads: int | None = 1,
                 timer: str = "auto", repeats: int = 1, seed: int = 0,
                 group_keys: int = 128, warmup: bool = True, statistic: str = "min",
                 probe_every_s: float = 0.0, probe_context: int = PROBE_CONTEXT) -> None:
        check_statistic(statistic)
        check_probe(probe_every_s, probe_context)
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        if timer not in TIMERS:
            raise ValueError(f"timer must be one of {', '.join(TIMERS)}, got {timer!r}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        cpu = device == "cpu"
        if timer == "thread" and not (cpu and threads == 1):
            raise ValueError("timer 'thread' needs device cpu and threads 1 (the thread's "
                             "CPU time misses other threads' and the GPU's work)")
        self.timer = timer if timer != "auto" else ("thread" if cpu and threads == 1
                                                     else "wall")
        self._saved_threads = torch.get_num_threads()
        if threads is not None and cpu:
            torch.set_num_threads(threads)
        self.model = build_decoder(spec, None, dtype, device, seed)
        self.device_name = device_name(torch, self.model.device)
        self.cache = self.model.new_cache(max_num_seqs + 1, capacity)
        self._owner: list[Request | None] = [None] * (max_num_seqs + 1)
        self._slot: dict[Request, int] = {}
        self._tokens: dict[Request, list[int]] = {}
        self._seed = seed
        self.repeats = repeats
        self.statistic = statistic
        self.group_keys = group_keys
        self._sync = torch.cuda.synchronize if self.model.device.type == "cuda" else None
        self.timings: list[StepTiming] = []
        self.probe_every_s = probe_every_s
        self.probe_context = min(probe_context, capacity - 1)
        self.probes: list[tuple[int, StepTiming]] = []  # (steps executed before, timing)
        self._since_probe = math.inf  # step seconds since the last probe: the first step probes
        if warmup:
            self._warmup()

    def close(self) -> None:
        """Restore torch's CPU thread count."""
        torch.set_num_threads(self._saved_threads)

    # -- the StepExecutor ---------------------------------------------------------------
    def __call__(self, plan: BatchPlan, shape: BatchShape) -> float:
        self._release(plan)
        if self.probe_every_s > 0 and self._since_probe >= self.probe_every_s:
            self.probe()
        work = self._padded(plan) if plan.cost_shape is not None else self._work(plan)
        # Longest context first; ties keep their slots (no moves).
        decodes = sorted((w for w in work if w.decode),
                         key=lambda w: (-w.context, self._slot.get(w.req, len(self._owner))))
        self._place([w.req for w in decodes], [w.req for w in work if not w.decode])
        groups = decode_groups([w.context for w in decodes], self.group_keys)
        chunks = [w for w in work if not w.decode]
        ids: list[int] = []
        for w in decodes:
            self.cache.lengths[self._slot[w.req]] = w.context
            ids.append(self._tokens[w.req][-1])
        for w in chunks:
            self.cache.lengths[self._slot[w.req]] = w.context
            ids.extend(self._chunk_ids(w))
        token_ids = torch.tensor(ids, dtype=torch.long, device=self.model.device)
        step_chunks = [Chunk(self._slot[w.req], w.n, w.sample) for w in chunks]
        sampled, timing = self._timed(range(len(decodes)), step_chunks, token_ids, groups)
        rows = decodes + [w for w in chunks if w.sample]
        for w, tok in zip(rows, sampled, strict=True):
            self._tokens[w.req].append(tok)
        self.timings.append(timing)
        self._since_probe += timing.seconds
        return timing.seconds

    @property
    def probe_shape(self) -> BatchShape:
        """The probe's step as the profile prices it (calibration.device_probe)."""
        return probe_shape(self.probe_context)

    def probe(self) -> StepTiming | None:
        """Time the probe's step (:attr:`probe_shape`) in the last free cache slot, timed
        and sampled as a step is, and record it in ``probes``; the slot is given back as
        found (calibration.device_probe.borrowed_slot). None, and nothing recorded, when
        every slot holds a request."""
        free = [s for s, r in enumerate(self._owner) if r is None]
        if not free:
            return None
        ids = torch.zeros(1, dtype=torch.long, device=self.model.device)
        with borrowed_slot(self.cache, free[-1], self.probe_context) as s:
            _, timing = self._timed(range(s, s + 1), (), ids, [1])
        self.probes.append((len(self.timings), timing))
        self._since_probe = 0.0
        return timing

    def _timed(self, decode_slots: range, chunks: Sequence[Chunk], token_ids: torch.Tensor,
               groups: list[int]) -> tuple[list[int], StepTiming]:
        """The run of ``repeats`` runs of the step, each from the same cache lengths, that
        ``statistic`` picks."""
        sync, lengths = self._sync, self.cache.lengths
        before = list(lengths)
        runs: list[StepTiming] = []
        for _ in range(self.repeats):
            lengths[:] = before
            if sync is not None:
                sync()
            w0, t0 = time.perf_counter(), time.thread_time()
            logits = self.model.step(self.cache, decode_slots, chunks,
                                     token_ids=token_ids, decode_groups=groups or None)
            # fp32 logits, as vLLM's sampler takes them (a bf16 argmax on CPU is 4x slower);
            # tolist() copies to the host, so it waits for the device.
            sampled = logits.float().argmax(-1).tolist()
            if sync is not None:
                sync()
            t1, w1 = time.thread_time(), time.perf_counter()
            wall, thread = w1 - w0, t1 - t0
            runs.append(StepTiming(wall, thread, thread if self.timer == "thread" else wall))
        return sampled, runs[chosen_run([r.seconds for r in runs], self.statistic)]

    # -- what runs this step ------------------------------------------------------------
    def _work(self, plan: BatchPlan) -> list[_Work]:
        """The plan as scheduled; decode / prefill chunk / sampling as sim.batch.shape_of
        classifies them, so the executed shape is the priced one."""
        out = []
        for req, n in plan.scheduled:
            c = req.num_computed_tokens
            s = self._slot.get(req)
            # A cache holds exactly the computed tokens (recompute restarts it at 0).
            assert s is None or c == 0 or self.cache.lengths[s] == c, (req.request_id, c)
            decode = n == 1 and req.num_output_tokens > 0
            out.append(_Work(req, n, c, decode, decode or c + n >= req.num_tokens))
            self._ensure_tokens(req)
        return out

    def _padded(self, plan: BatchPlan) -> list[_Work]:
        """A plan charged as its cost_shape (static batching), executed as charged over the
        batch's holders: every holder prefills the padded prompt, or decodes one token."""
        cs = plan.cost_shape
        assert cs is not None
        holders = list(plan.holders if plan.holders is not None else
                       (r for r, _ in plan.scheduled))
        b = len(holders)
        if cs.num_prefill_seqs and cs.num_prefill_seqs == b and not cs.num_decode_seqs \
                and cs.num_prefill_tokens % b == 0:
            n = cs.num_prefill_tokens // b
            work = [_Work(r, n, 0, False, cs.num_sampled_seqs == b) for r in holders]
        elif cs.num_decode_seqs == b and not cs.num_prefill_seqs:
            work = [_Work(r, 1, self.cache.lengths[self._slot[r]], True, True)
                    for r in holders]
        else:
            raise ValueError(f"cannot execute cost_shape {cs} over {b} holders: only a "
                             "padded prefill or a decode of every holder is supported")
        for w in work:
            self._ensure_tokens(w.req)
        done = _shape(work)
        if done != cs:
            raise ValueError(f"executed shape {done} differs from the cost_shape {cs}")
        return work

    def _chunk_ids(self, w: _Work) -> list[int]:
        """Input ids of a prefill chunk: the request's tokens at [context, context + n),
        left-padded with 0 where the chunk is longer than the request (static padding)."""
        toks = self._tokens[w.req]
        end = w.context + w.n
        if len(toks) >= end:
            return toks[w.context:end]
        return [0] * (end - len(toks)) + toks[w.context:]

    def _ensure_tokens(self, req: Request) -> None:
        if req not in self._tokens:
            rng = np.random.default_rng([self._seed, req.index])
            vocab = self.model.spec.vocab_size
            self._tokens[req] = rng.integers(0, vocab, req.num_prompt_tokens).tolist()

    # -- caches -------------------------------------------------------------------------
    def _release(self, plan: BatchPlan) -> None:
        """Drop the caches of requests no longer in the batch (finished or preempted), and
        the token ids of finished ones (a preempted request recomputes from them)."""
        live = set(plan.holders) if plan.holders is not None else set()
        live.update(r for r, _ in plan.scheduled)
        for req in [r for r in self._slot if r not in live]:
            self._owner[self._slot.pop(req)] = None
        for req in [r for r in self._tokens if r not in live and r.finish_reason is not None]:
            del self._tokens[req]

    def _place(self, decodes: list[Request], others: list[Request]) -> None:
        """Give every scheduled request a slot: decodes[i] slot i, the others any slot
        after the decodes."""
        b = len(decodes)
        wanted = set(decodes)
        for s in range(b):  # move whatever else sits in the decode run out of it
            r = self._owner[s]
            if r is not None and r not in wanted:
                self._move(r, self._free_slot(b))
        pending = [(r, i) for i, r in enumerate(decodes) if self._slot.get(r) != i]
        while pending:
            rest = [(r, i) for r, i in pending if self._owner[i] is not None]
            for r, i in pending:
                if self._owner[i] is None:
                    self._move(r, i)
            if len(rest) == len(pending):  # a cycle: park one occupant past the run
                occupant = self._owner[rest[0][1]]
                assert occupant is not None
                self._move(occupant, self._free_slot(b))
            pending = [(r, i) for r, i in rest if self._slot.get(r) != i]
        for r in others:
            if r not in self._slot:
                self._move(r, self._free_slot(b))

    def _free_slot(self, first: int) -> int:
        for s in range(first, len(self._owner)):
            if self._owner[s] is None:
                return s
        raise AssertionError("no free cache slot: more requests in flight than max_num_seqs")

    def _move(self, req: Request, dst: int) -> None:
        """Put ``req`` in slot ``dst`` (free), copying its cached tokens if it had a slot."""
        src = self._slot.get(req)
        cache = self.cache
        if src is not None:
            n = cache.lengths[src]
            for t in (*cache.k, *cache.v):
                t[dst, :, :n] = t[src, :, :n]
            cache.lengths[dst] = n
            self._owner[src] = None
        else:
            cache.lengths[dst] = 0
        self._owner[dst] = req
        self._slot[req] = dst

    def _warmup(self) -> None:
        """Two untimed steps (a chunk and a decode), so allocator and kernel set-up is not
        charged to the first real step; the cache is left empty."""
        cache, last = self.cache, len(self._owner) - 1
        n = min(64, cache.shape[2] - 1)
        if n < 1:  # a one-token cache: nothing admissible will run
            return
        dev = self.model.device
        for _ in range(2):
            cache.lengths[0] = cache.lengths[last] = 0
            self.model.step(cache, (), [Chunk(0, n)],
                            token_ids=torch.zeros(n, dtype=torch.long, device=dev))
            self.model.step(cache, range(1), [Chunk(last, n)],
                            token_ids=torch.zeros(n + 1, dtype=torch.long, device=dev))
        cache.lengths[:] = [0] * len(cache.lengths)


def decode_groups(contexts: Sequence[int], group_keys: int) -> list[int]:
    """Sizes of consecutive runs of ``contexts`` (sorted longest first) minimising the
    keys read when each run is padded to its first (longest) context, plus ``group_keys``
    per run. [] for no decodes."""
    n = len(contexts)
    best = [0.0] + [math.inf] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            cost = best[i] + (j - i) * (contexts[i] + 1) + group_keys
            if cost < best[j]:
                best[j], cut[j] = cost, i
    sizes, j = [], n
    while j:
        sizes.append(j - cut[j])
        j = cut[j]
    return sizes[::-1]


def _shape(work: Sequence[_Work]) -> BatchShape:
    """The BatchShape of executed work (sim.batch.shape_of's definitions)."""
    p_tok = p_seqs = p_ctx = p_pairs = d_seqs = d_ctx = sampled = 0
    for w in work:
        if w.decode:
            d_seqs += 1
            d_ctx += w.context + 1
        else:
            p_tok += w.n
            p_seqs += 1
            p_ctx += w.context
            p_pairs += w.n * w.context + w.n * (w.n + 1) // 2
        sampled += w.sample
    return BatchShape(p_tok, p_seqs, p_ctx, p_pairs, d_seqs, d_ctx, sampled)
