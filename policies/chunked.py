"""``chunked``: vLLM V1's scheduler (chunked prefill, Sarathi-style mixed batches).

Rules, as vLLM 0.33 ``vllm/v1/core/sched/scheduler.py`` applies them (checked step by step
against ../shared/vllm-oracle):
1. A token budget of max_num_batched_tokens per step. Running requests first, in order:
   each gets num_tokens - num_computed_tokens new tokens (1 for a decode, the next chunk
   for a partial prefill), capped by long_prefill_token_threshold (only while more than
   one request is running or waiting), the budget, and max_model_len - 1 - computed.
2. When a running request cannot get blocks, preempt the victim (tail of running; under
   priority the largest (priority, arrival_time)) until it fits, possibly itself.
   A victim that was already scheduled this step gives its tokens back.
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

from policies.base import NO_FIT, QueuePolicy
from sim.batch import BatchPlan, SteadyDecode
from sim.decode_group import DecodeGroup
from sim.request import Request


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
        """Runs of pure decode steps may be advanced at once (sim/fastpath.py)."""
        return self.group_steady_decode(now)

    def schedule(self, now: float) -> BatchPlan:
        cfg = self.config
        if self.lpm:
            self.order_waiting()
        threshold = cfg.long_prefill_token_threshold
        if threshold and len(self.running) + len(self.waiting) <= 1:
            threshold = 0
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
                return budget  # it preempted itself: vLLM V1 stops scheduling running
            scheduled[req] = n
            budget -= n
            i += 1
        return budget

    def waiting_blocked(self, budget: int) -> bool:
        """_schedule_waiting's first admission test, without its side effects: True when
        it would stop at the head of waiting (a block shortage, or no budget). Neither
        outcome can change while the free blocks only shrink; an lpm order can (its
        head follows the cache), and a head that needs a lookup is not judged here."""
        cfg, kv = self.config, self.kv
        if self.lpm or not len(self.waiting):
            return False
        if budget <= 0:
            return True
        req = self.waiting.peek()
        if self.prefix_cache is not None:
            return cfg.scheduler_reserve_full_isl and not self.prefix_cache.may_fit(
                req, req.num_prompt_tokens + req.num_output_tokens)
        fits_all = kv.can_fit(req, req.num_tokens)
        if cfg.scheduler_reserve_full_isl and not fits_all:
            return True
        if fits_all and cfg.kv_allocation == "paged":
            return False  # its next chunk fits as well
        n = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
        threshold = cfg.long_prefill_token_threshold
        if threshold and len(self.running) + len(self.waiting) > 1 and n > threshold:
            n = threshold
        n = min(n, budget)
        if req.num_computed_tokens + n <= len(req.block_ids) * kv.block_size:
            return False
        return self.blocks_needed(req, n) > kv.num_free_blocks

    def _schedule_waiting(
        self, scheduled: dict[Request, int], budget: int, threshold: int
    ) -> None:
        cfg, kv, waiting = self.config, self.kv, self.waiting
        while len(waiting) and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = waiting.peek()
            n = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
            hit = self.prefix_hit(req, cfg.scheduler_reserve_full_isl)  # None: no cache
            if hit is NO_FIT:
                break
            if hit:
                n -= len(hit) * kv.block_size  # only the uncached tokens are computed
            if threshold and n > threshold:
                n = threshold
            n = min(n, budget)
            if hit is None:
                if cfg.scheduler_reserve_full_isl and not kv.can_fit(req, req.num_tokens):
                    break
                if not self.allocate(req, n):
                    break
            else:
                if (cfg.scheduler_reserve_full_isl and self.blocks_needed(
                        req, req.num_tokens - len(hit) * kv.block_size, hit)
                        > kv.num_free_blocks):
                    break
                if not self.allocate_cached(req, hit, n):
                    break
            self.admit(req)
            scheduled[req] = n
            budget -= n
