"""``chunked``: vLLM V1's scheduler (chunked prefill, Sarathi-style mixed batches).

Rules, as vLLM 0.33 ``vllm/v1/core/sched/scheduler.py`` applies them (checked step by step
against ../shared/vllm-oracle):
1. A token budget of max_num_batched_tokens per step. Running requests first, in order:
   each gets num_tokens - num_computed_tokens new tokens (1 for a decode, the next chunk
   for a partial prefill), capped by long_prefill_token_threshold (only while more than
   one request is running or waiting), the budget, and max_model_len - 1 - computed.
2. When a running request cannot get blocks, preempt the victim (tail of running; under
   priority the largest (priority, arrival_time)) until it fits, possibly itself; after
   preempting itself the running requests behind it are still scheduled. A victim that
   was already scheduled this step gives its tokens back.
3. Then, only if nothing was preempted, admit waiting requests in queue order while
   budget and max_num_seqs allow and the blocks fit; with scheduler_reserve_full_isl the
   free pool must hold all of the request's current tokens (a check, not a reservation).
   The last admitted prompt may be chunked. Admission stops at the first that does not fit.
KV allocation (paged or reserve) and preemption (recompute or swap) are the base class's.
With a prefix cache (``--prefix-cache``), an admitted request reuses its longest cached
prefix (vLLM's ``get_computed_blocks``): its computed tokens start there and only the rest
is scheduled; with ``--queue lpm`` waiting is re-sorted each step by that prefix.
vLLM V1 has no swap; in swap mode (servesim's addition) swapped requests resume, oldest
first, after the running ones and before any waiting one, in steps that preempted nothing.
"""

from __future__ import annotations

from typing import ClassVar

from mypy_extensions import mypyc_attr

from policies.base import QueuePolicy
from sim.batch import BatchPlan, BatchShape, ChunkedPrefill, LastChunkAdmission, SteadyDecode
from sim.decode_group import DecodeGroup
from sim.kv.prefix_cache import ComputedBlocks
from sim.request import Request


@mypyc_attr(allow_interpreted_subclasses=True)
class ChunkedPolicy(QueuePolicy):
    """vLLM V1 chunked-prefill scheduling; see the module docstring for the rules."""

    name: ClassVar[str] = "chunked"

    def attach_decode_group(self, group: DecodeGroup) -> None:
        """Opt in to lazy decodes (sim/decode_group.py). A prefix cache does not stand
        in the way: it indexes decode blocks only when a request releases them
        (sim/kv/prefix_cache.py), after the group has brought the request up to date; nor
        does the priority queue, whose victims may be members (allocate_preempting)."""
        self.decode_group = group

    def steady_decode(self, now: float) -> SteadyDecode | None:
        """The fast-path promise for this class's schedule(): runs of pure decode
        steps, or of the decode group beside one request's prefill chunks, may be
        advanced at once (sim/fastpath.py). A subclass that overrides schedule() does
        not inherit it (sim.interface.declares)."""
        return self.group_steady_decode(now) or self._steady_prefill(now)

    def _steady_prefill(self, now: float) -> SteadyDecode | None:
        """The promise for steps that run the decode group and the next chunk of the one
        prefilling request behind it (schedule() serves them in group_step and
        _schedule_running, and admits nobody: the chunk takes the whole budget left, or
        no one waits, or every slot is taken), up to the step of its last chunk, which
        may admit the head of waiting beside it (_last_chunk_admission). None where a
        step may do more: resume, admit otherwise, charge a transfer, or preempt when its
        blocks do not fit (the fast path stops before such a step); and with a prefix
        cache, whose admissions and block hashes a run would bypass."""
        group = self.decode_group
        if (group is None or self.prefix_cache is not None or self.swapped
                or self._transfer_bytes):
            return None
        running = self.running
        group.grow(running, now, stalled=True)  # what group_step does first: it runs next
        g = len(group.members)
        if len(running) == g:
            self._admit_head(group)
        if len(running) != g + 1:
            return None
        req, cfg = running[-1], self.config
        computed = req.num_computed_tokens
        rest = req.num_prompt_tokens + req.num_output_tokens - computed
        budget = cfg.max_num_batched_tokens - g
        if (budget <= 0 or (rest == 1 and req.num_output_tokens)
                or rest > cfg.max_model_len - 1 - computed):
            return None  # no budget for it, a decode, or capped by max_model_len
        threshold = self._prefill_threshold()
        chunk = threshold if threshold and threshold < budget else budget
        # An arrival leaves the chunk as it is unless it brings a lower threshold into
        # force (it applies only while more than one request runs or waits).
        configured = cfg.long_prefill_token_threshold
        prefill = ChunkedPrefill(req, chunk, True, arrivals_wait=chunk == budget and not (
            0 < configured < budget))
        if len(self.waiting) and len(running) < cfg.max_num_seqs:
            if chunk < budget:
                return None  # every step leaves budget for an admission
            last = rest - (rest - 1) // chunk * chunk  # the last chunk's tokens
            if last < budget:  # the step of the last chunk admits: covered when simply
                prefill.admits = (None if last == 1 and req.num_output_tokens
                                  else self._last_chunk_admission(budget - last, threshold))
                if prefill.admits is None:
                    if rest <= chunk:
                        return None  # its one step is that step
                    prefill.covers_last = False
        return SteadyDecode(group.members, running,
                            BatchShape(0, 0, 0, 0, g, group.ctx_sum, g), g, group, prefill)

    def _last_chunk_admission(self, budget: int, threshold: int) -> LastChunkAdmission | None:
        """The admission _schedule_waiting makes in the step of a prefill's last chunk,
        which leaves ``budget`` > 0 tokens, when it is one the fast path covers: the head
        of waiting for a first chunk that does not reach its first sample, and no second
        admission after it (no budget or slot left, or nobody else waiting). None
        otherwise. Its blocks are checked when the run is planned (the test's free blocks
        are those after the step's other allocations)."""
        req = self.waiting.peek()
        rest = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
        n = min(threshold if threshold and rest > threshold else rest, budget)
        if n >= rest or (n == 1 and req.num_output_tokens):
            return None  # it would sample, or be priced as a decode
        if (n < budget and len(self.waiting) > 1
                and len(self.running) + 1 < self.config.max_num_seqs):
            return None  # a second admission may follow
        must_fit = rest if self.config.scheduler_reserve_full_isl else n
        return LastChunkAdmission(req, n, self.blocks_needed(req, must_fit),
                                  self.blocks_needed(req, n),
                                  lambda: self.admit_allocating(req, n, None))

    def schedule(self, now: float) -> BatchPlan:
        if self.lpm:
            self.order_waiting()
        threshold = self._prefill_threshold()
        scheduled: dict[Request, int] = {}
        preempted: list[Request] = []
        budget, start = self.group_step(now)
        budget = self._schedule_running(scheduled, preempted, threshold, budget, start)
        if not preempted:
            budget = self.resume_swapped(scheduled, budget)
            if not self.swapped:
                self._schedule_waiting(scheduled, budget, threshold)
        return self.make_plan(scheduled, preempted, self.decode_group if start else None)

    def _schedule_running(
        self, scheduled: dict[Request, int], preempted: list[Request], threshold: int,
        budget: int, start: int,
    ) -> int:
        """Running requests from index ``start`` on (the ones before are the decode
        group's, already given their token) in order, under ``budget``."""
        max_len = self.config.max_model_len
        running = self.running
        i = start
        bs = self.kv.block_size
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            n = req.num_prompt_tokens + req.num_output_tokens - computed
            if n == 1 and computed < len(req.block_ids) * bs and computed < max_len - 1:
                # A decode whose held blocks have room: the common case, kept short.
                scheduled[req] = 1
                budget -= 1
                i += 1
                continue
            if threshold and n > threshold:
                n = threshold
            n = min(n, budget, max_len - 1 - computed)
            if n <= 0:
                i += 1
                continue
            ok, back, shift = self.allocate_preempting(req, n, scheduled, preempted)
            budget += back
            i -= shift
            if not ok:
                # It preempted itself (only the priority queue's victim can sit before
                # the tail): vLLM 0.33 goes on with the running requests behind it, which
                # now start at index i.
                continue
            scheduled[req] = n
            budget -= n
            i += 1
        return budget

    def _admit_head(self, group: DecodeGroup) -> None:
        """Admit the head of waiting ahead of the coming step when that step certainly
        admits it: every running request is a member of ``group``, so the step runs their
        decodes (their blocks for it taken first) and then admits the head with its first
        chunk. schedule() then serves it as the running request it is, with the same
        chunk (its blocks are held), and nothing else changes."""
        waiting, cfg = self.waiting, self.config
        if not len(waiting) or len(self.running) >= cfg.max_num_seqs:
            return
        req = waiting.peek()
        budget = cfg.max_num_batched_tokens - len(group)
        if not self._may_admit(req, budget):
            return
        threshold = self._prefill_threshold()
        # Blocks the members take first: at most one each; counted when that bound fails.
        n = self._admission(req, budget, threshold, None, len(group))
        if n is None and len(group):
            n = self._admission(req, budget, threshold, None, group.crossings(1)[0])
        if n is not None:
            self.admit_allocating(req, n, None)

    def _prefill_threshold(self) -> int:
        """long_prefill_token_threshold as it applies now: only while more than one
        request is running or waiting (0: no cap)."""
        threshold = self.config.long_prefill_token_threshold
        return threshold if len(self.running) + len(self.waiting) > 1 else 0

    def waiting_blocked(self, budget: int) -> bool:
        """The admission test of _schedule_waiting for the head of waiting, without its
        side effects: True when it would not be admitted in the coming step (``budget``
        tokens left after the running requests' decodes), which stays so while the free
        blocks only shrink. Not judged (False): an lpm order, whose head follows the
        cache, and with a prefix cache what needs a lookup, as a hit shrinks when decodes
        evict cached blocks, which may let the head fit."""
        if self.lpm or not len(self.waiting):
            return False
        req = self.waiting.peek()
        if not self._may_admit(req, budget):
            return True
        return (self.prefix_cache is None
                and self._admission(req, budget, self._prefill_threshold(), None) is None)

    def _may_admit(self, req: Request, budget: int) -> bool:
        """The admission test's part that needs no prefix-cache lookup: False when no
        budget is left or, with scheduler_reserve_full_isl, the whole of ``req`` certainly
        does not fit, whatever its hit (``PrefixCachingKV.may_fit``; without a cache
        ``_admission`` judges that as cheaply)."""
        cache = self.prefix_cache
        return budget > 0 and (cache is None or not self.config.scheduler_reserve_full_isl
                               or cache.may_fit(req, req.num_prompt_tokens
                                                + req.num_output_tokens))

    def _admission(self, req: Request, budget: int, threshold: int,
                   hit: ComputedBlocks | None, taken_blocks: int = 0) -> int | None:
        """The admission test, side-effect free, for ``req`` at the head of waiting with
        ``budget`` > 0 tokens left and ``hit`` (its prefix-cache hit; None without a
        cache): the tokens it is scheduled for (those after the hit, capped by
        ``threshold`` and the budget), or None when it does not fit: the free blocks
        (less ``taken_blocks``, those the step takes before it) must hold them or, with
        scheduler_reserve_full_isl, all of its tokens (a check, not a reservation:
        vLLM's full_sequence_must_fit), which covers them."""
        cached = hit.num_computed_tokens if hit is not None else 0
        rest = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens - cached
        n = min(threshold if threshold and rest > threshold else rest, budget)
        must_fit = rest if self.config.scheduler_reserve_full_isl else n
        if self.blocks_needed(req, must_fit, hit) + taken_blocks > self.kv.num_free_blocks:
            return None
        return n

    def _schedule_waiting(
        self, scheduled: dict[Request, int], budget: int, threshold: int
    ) -> None:
        """Admit waiting requests in queue order while max_num_seqs allows and the
        admission test passes: each reuses its prefix-cache hit (vLLM's
        get_computed_blocks, then allocate_slots) and is scheduled for its first chunk."""
        cache, waiting = self.prefix_cache, self.waiting
        max_num_seqs = self.config.max_num_seqs
        while len(waiting) and len(self.running) < max_num_seqs:
            req = waiting.peek()
            if not self._may_admit(req, budget):
                break
            hit = cache.get_computed_blocks(req) if cache is not None else None
            n = self._admission(req, budget, threshold, hit)
            if n is None:
                break
            self.admit_allocating(req, n, hit)
            scheduled[req] = n
            budget -= n
