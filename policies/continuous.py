"""``continuous``: iteration-level batching without chunked prefill, as vLLM V0's default
scheduler does it (``vllm/core/scheduler.py``, ``_schedule_default``): requests join and
leave the batch at every step (Orca's iteration-level scheduling, OSDI '22), but a step
either prefills or decodes, never both (Orca mixes them; ``chunked`` does too).

Rules, each step:
1. Prefill: unless a request is swapped out, admit waiting requests in queue order while
   max_num_seqs, the token budget (whole prompts: a prompt is never chunked) and the free
   blocks allow, keeping a watermark of 1% of num_gpu_blocks free (vLLM V0's
   ``watermark=0.01``) while anything runs. If any were admitted the step is prefill-only:
   running requests hold their slots but compute nothing (idle slots).
2. Otherwise decode: one token for every running request, in order. When one cannot get a
   block, preempt the victim (the tail of running; under priority the largest
   (priority, arrival_time)) until it fits, possibly itself.
3. Then, if nothing was preempted, swap requests back in (swap mode), oldest first; they
   decode in the same step. No waiting request is admitted while any is swapped out.
With a prefix cache an admitted request reuses its longest cached prefix and prefills
only the rest. A prompt longer than max_num_batched_tokens can never be scheduled, so such
requests are rejected at arrival with that reason (vLLM V0 ignores them with a warning).
A request preempted by recompute re-prefills its prompt plus its generated tokens in one
step; when that exceeds the budget it is the step's only prefill. long_prefill_token_threshold does
not apply (nothing is chunked).
"""

from __future__ import annotations

from typing import ClassVar

from policies.base import QueuePolicy
from sim.batch import BatchPlan, SteadyDecode
from sim.decode_group import DecodeGroup
from sim.kv.prefix_cache import ComputedBlocks
from sim.request import Request

#: Fraction of num_gpu_blocks kept free at admission (vLLM V0 CacheConfig default).
WATERMARK = 0.01


class ContinuousPolicy(QueuePolicy):
    """Prefill-first iteration-level batching; see the module docstring for the rules."""

    name: ClassVar[str] = "continuous"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.watermark_blocks = int(WATERMARK * self.kv.num_gpu_blocks)

    def rejection_reason(self, req: Request) -> str | None:
        budget = self.config.max_num_batched_tokens
        if req.num_prompt_tokens > budget:
            return (f"num_prompt_tokens ({req.num_prompt_tokens}) > max_num_batched_tokens "
                    f"({budget}): continuous batching never chunks a prompt")
        return super().rejection_reason(req)

    def attach_decode_group(self, group: DecodeGroup) -> None:
        """Opt in to lazy decodes (sim/decode_group.py); see ChunkedPolicy's (a prefix
        cache, the priority queue's victims)."""
        self.decode_group = group

    def steady_decode(self, now: float) -> SteadyDecode | None:
        """The fast-path promise for this class's schedule(): runs of pure decode
        steps may be advanced at once (sim/fastpath.py). A subclass that overrides
        schedule() does not inherit it (sim.interface.declares)."""
        return self.group_steady_decode(now)

    def schedule(self, now: float) -> BatchPlan:
        scheduled: dict[Request, int] = {}
        preempted: list[Request] = []
        if self.lpm:
            self.order_waiting()
        if not self.swapped:
            self._schedule_prefills(scheduled)
        if scheduled:
            # A prefill-only step: the decode group's members all stall together (the
            # group measures their next ITL from its last step's end).
            return self.make_plan(scheduled, preempted)
        budget, start = self.group_step(now)
        budget = self._schedule_decodes(scheduled, preempted, budget, start)
        if not preempted:
            self.resume_swapped(scheduled, budget, self.watermark_blocks)
        return self.make_plan(scheduled, preempted, self.decode_group if start else None)

    def waiting_blocked(self, budget: int) -> bool:
        """The admission test of _schedule_prefills for the head of waiting, without its
        side effects: True when it does not fit the free blocks less the watermark,
        which only shrink while the running requests decode (``budget`` does not
        matter: a step's first prefill may take more). Not judged (False): an lpm
        order, whose head follows the cache, and with a prefix cache what needs a
        lookup, as a hit shrinks when decodes evict cached blocks, which may let the
        head fit."""
        if self.lpm or not len(self.waiting):
            return False
        req = self.waiting.peek()
        if not self._may_admit(req):
            return True
        return (self.prefix_cache is None and self._admission(
            req, self.config.max_num_batched_tokens, None, True) is None)

    def _reserve(self) -> int:
        """Blocks an admission leaves free: the watermark, while anything runs."""
        return self.watermark_blocks if self.running else 0

    def _may_admit(self, req: Request) -> bool:
        """The admission test's part that needs no prefix-cache lookup: False when the
        whole of ``req`` certainly does not fit the free blocks less the watermark,
        whatever its hit (``PrefixCachingKV.may_fit``; without a cache ``_admission``
        judges that as cheaply)."""
        cache = self.prefix_cache
        return cache is None or cache.may_fit(
            req, req.num_prompt_tokens + req.num_output_tokens, self._reserve())

    def _admission(self, req: Request, budget: int, hit: ComputedBlocks | None,
                   first: bool) -> int | None:
        """The admission test, side-effect free, for ``req`` at the head of waiting with
        ``budget`` tokens left and ``hit`` (its prefix-cache hit; None without a cache):
        the tokens it prefills (all after the hit), or None when they exceed the budget
        (unless it is the step's ``first`` prefill) or do not fit the free blocks less
        the watermark."""
        n = req.num_new_tokens - (hit.num_computed_tokens if hit is not None else 0)
        if n > budget and not first:
            return None
        if self.blocks_needed(req, n, hit) + self._reserve() > self.kv.num_free_blocks:
            return None
        return n

    def _schedule_prefills(self, scheduled: dict[Request, int]) -> None:
        """Admit waiting requests in queue order, whole prompts, while max_num_seqs, the
        token budget and the admission test allow; each reuses its prefix-cache hit
        (vLLM's get_computed_blocks, then allocate_slots)."""
        budget = self.config.max_num_batched_tokens
        cache, waiting = self.prefix_cache, self.waiting
        while len(waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = waiting.peek()
            if not self._may_admit(req):
                break
            hit = cache.get_computed_blocks(req) if cache is not None else None
            n = self._admission(req, budget, hit, not scheduled)
            if n is None:
                break
            self.admit_allocating(req, n, hit)
            scheduled[req] = n
            budget -= n

    def _schedule_decodes(self, scheduled: dict[Request, int], preempted: list[Request],
                          budget: int, start: int) -> int:
        """Decode the running requests from index ``start`` on (the decode group's come
        first and already have their token) under ``budget``."""
        running = self.running
        i = start
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_new_tokens, budget)
            ok, back, shift = self.allocate_preempting(req, n, scheduled, preempted)
            budget += back
            i -= shift
            if ok:  # else it preempted itself; V0 goes on with the next running request
                scheduled[req] = n
                budget -= n
                i += 1
        return budget
