"""The shared pieces every policy uses: the waiting queue, the running list, the swapped
list, KV allocation (paged or reserve), preemption (recompute or swap, with the transfer
time) and victim choice.

A policy is built as ``PolicyClass(config: SchedulerConfig, kv: KVCacheManager)`` and the
engine calls: ``add_request`` at arrival, ``schedule(now) -> BatchPlan`` before each step,
``on_step_end(done, now) -> released`` after it (the policy frees the blocks of requests it
releases; the engine stamps their finish time). Optionally, ``rejection_reason(request)``
returns why the policy can never serve a request (checked at arrival; None = accept).
The engine's view and the optional hooks are the Protocols of sim/interface.py; the
fast-path promises (``steady_decode``, ``attach_decode_group``) count only for the class
that declares them and its subclasses that keep its schedule() and on_step_end()
(``sim.interface.declares``; docs/policies.md).
Policies may read a request's ``max_tokens`` but never its ``output_len`` (a workload fact
no engine knows; only the ``oracle-srpt`` queue does, and says so in its name).
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from mypy_extensions import mypyc_attr

from policies.queues import LPMQueue, make_queue
from sim.batch import BatchPlan, BatchShape, SteadyDecode
from sim.config import SchedulerConfig
from sim.decode_group import DecodeGroup
from sim.kv.block_pool import KVCacheManager
from sim.kv.prefix_cache import ComputedBlocks, PrefixCachingKV
from sim.request import Request, RequestStatus


@mypyc_attr(allow_interpreted_subclasses=True)
class QueuePolicy:
    """Base for policies with a waiting queue, a running list and a swapped list (vLLM's
    shape). Subclasses write ``schedule``; the helpers below keep KV allocation mode and
    preemption mode out of every policy's own code."""

    name: ClassVar[str] = "base"

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting = make_queue(config.queue)
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        bpb = config.kv_bytes_per_block
        self.num_swap_blocks = config.swap_space_bytes // bpb if bpb else 0
        self.num_swap_blocks_used = 0
        self._transfer_bytes = 0
        # The prefix cache, when the pool is one: admissions reuse its hits.
        self.prefix_cache = kv if isinstance(kv, PrefixCachingKV) else None
        self.lpm = isinstance(self.waiting, LPMQueue) and self.prefix_cache is not None
        # Lazily advanced steady decoders at the head of running (sim/decode_group.py),
        # when the policy opts in and the engine hands one over.
        self.decode_group: DecodeGroup | None = None

    def add_request(self, request: Request) -> None:
        self.waiting.push(request)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.swapped)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0 or bool(self.swapped)

    def stuck_request(self) -> Request | None:
        if len(self.waiting):
            return self.waiting.peek()
        return self.swapped[0] if self.swapped else None

    def rejection_reason(self, req: Request) -> str | None:
        """Why this policy can never serve ``req`` (None = it can): in reserve mode, a
        reservation larger than the whole pool."""
        if self.config.kv_allocation == "reserve":
            need = self.kv.blocks_for(req.num_prompt_tokens + req.max_tokens)
            if need > self.kv.num_usable_blocks:
                return (f"reserve allocation needs {need} KV blocks (prompt + max_tokens); "
                        f"the whole pool has {self.kv.num_usable_blocks}")
        return None

    def on_step_end(self, done: list[Request], now: float) -> list[Request]:
        """Release finished requests at once: free their blocks and slots."""
        running = self.running
        for req in done:
            self.kv.free(req)
            running.remove(req)  # one C-level scan each: cheaper than rebuilding the list
        return done

    # -- KV allocation: paged (on demand) or reserve (prompt + max_tokens at admission) --
    def target_tokens(self, req: Request, num_new_tokens: int) -> int:
        """Tokens ``req`` must hold blocks for to compute ``num_new_tokens`` more."""
        n = req.num_computed_tokens + num_new_tokens
        if self.config.kv_allocation == "reserve":
            return max(n, req.num_prompt_tokens + req.max_tokens)
        return n

    def blocks_needed(self, req: Request, num_new_tokens: int,
                      hit: ComputedBlocks | None = None) -> int:
        """Blocks that admitting ``req`` for ``num_new_tokens`` tokens would take from the
        free pool: by ``allocate``, or with ``hit`` (its prefix-cache hit) by
        ``admit_allocating``, for the tokens after the hit."""
        if hit is not None:
            assert self.prefix_cache is not None
            return self.prefix_cache.get_num_blocks_to_allocate(
                req, self.target_tokens(req, hit.num_computed_tokens + num_new_tokens), hit)
        need = self.kv.blocks_for(self.target_tokens(req, num_new_tokens))
        return max(0, need - len(req.block_ids))

    def allocate(self, req: Request, num_new_tokens: int) -> bool:
        """Grow ``req``'s blocks for ``num_new_tokens`` more tokens; False (nothing
        allocated) when the free pool is too small. In reserve mode the first call holds
        ceil((prompt + max_tokens) / block_size) blocks until the request finishes, as
        Orca and FasterTransformer reserve the maximum length."""
        total = req.num_computed_tokens + num_new_tokens
        if total <= len(req.block_ids) * self.kv.block_size:
            return True  # the held blocks suffice (most decode steps): the hot path
        return self.kv.allocate_up_to(req, self.target_tokens(req, num_new_tokens)) is not None

    # -- admission, through a prefix cache's hit when there is one (sim/kv/prefix_cache.py) --
    def admit_allocating(self, req: Request, num_new_tokens: int,
                         hit: ComputedBlocks | None) -> None:
        """Admit ``req``, the head of waiting, its blocks for ``num_new_tokens`` tokens
        after ``hit`` (the prefix cache's ``get_computed_blocks``; None without a cache)
        found to fit by the policy's admission test: the cache's ``allocate_slots``, or
        ``allocate``."""
        if hit is None:
            ok = self.allocate(req, num_new_tokens)
        else:
            assert self.prefix_cache is not None
            ok = self.prefix_cache.allocate_slots(req, num_new_tokens, hit) is not None
        assert ok, "the admission test checked the blocks"
        self.admit(req)

    def order_waiting(self) -> None:
        """``--queue lpm``: sort waiting by cached prefix, once per step (SGLang's
        ``calc_priority`` before each prefill round)."""
        cache = self.prefix_cache
        assert cache is not None and isinstance(self.waiting, LPMQueue)
        self.waiting.order(cache.cached_prefix_tokens)

    # -- preemption --
    def pick_victim(self) -> Request:
        """The running request to preempt: the tail (most recently admitted) under FCFS,
        SJF and oracle-srpt; the largest (priority, arrival_time) under priority, first
        such in running order (vLLM 0.33 ``Scheduler.schedule``), so a request never
        preempts one of equal priority that arrived before it. vLLM's arrival times are
        never equal; simulated ones can be, so ties fall to the later workload index."""
        if self.config.queue == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time, r.index))
        return self.running[-1]

    def allocate_preempting(
        self, req: Request, n: int, scheduled: dict[Request, int], preempted: list[Request]
    ) -> tuple[bool, int, int]:
        """Allocate for ``n`` more tokens of running ``req``, preempting victims
        (pick_victim) until it fits or ``req`` itself is the victim. A victim already
        scheduled this step is unscheduled, a decode group member (given its token in
        group_step; only the priority queue picks one) alike. Returns (allocated, tokens
        given back to the budget, number of scheduled victims, which sat before ``req``
        in running)."""
        returned = unscheduled = 0
        group = self.decode_group
        while not self.allocate(req, n):
            victim = self.pick_victim()
            if victim in scheduled:
                returned += scheduled.pop(victim)
                unscheduled += 1
            elif group is not None and victim in group:
                returned += 1
                unscheduled += 1
            self.preempt(victim)
            preempted.append(victim)
            if victim is req:
                return False, returned, unscheduled
        return True, returned, unscheduled

    def preempt(self, req: Request) -> None:
        """Preempt a running request. Swap mode, while the CPU swap space has room: copy
        its computed blocks out (the transfer time is charged), keep num_computed_tokens
        and park it in ``swapped``. Otherwise (recompute, or swap space full): free the
        blocks, forget computed tokens (generated tokens are kept and recomputed) and put
        it at the head of waiting."""
        if self.decode_group is not None and req in self.decode_group:
            self.decode_group.remove(req)
        self.running.remove(req)
        num_blocks = self.kv.blocks_for(req.num_computed_tokens)
        self.kv.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        if (self.config.preemption_mode == "swap" and num_blocks > 0
                and self.num_swap_blocks_used + num_blocks <= self.num_swap_blocks):
            self.num_swap_blocks_used += num_blocks
            self._transfer_bytes += num_blocks * (self.config.kv_bytes_per_block or 0)
            req.num_swapped_blocks = num_blocks
            req.num_swaps += 1
            self.swapped.append(req)
            return
        req.num_computed_tokens = 0
        self.waiting.push_front(req)

    def swap_in(self, req: Request, num_new_tokens: int) -> bool:
        """Bring the oldest swapped request back to running (its blocks copied in, the
        transfer time charged) with room for ``num_new_tokens``; False when the blocks do
        not fit (nothing changes then)."""
        assert req is self.swapped[0], "swap in oldest first"
        if not self.allocate(req, num_new_tokens):
            return False
        self.swapped.popleft()
        self.num_swap_blocks_used -= req.num_swapped_blocks
        self._transfer_bytes += req.num_swapped_blocks * (self.config.kv_bytes_per_block or 0)
        req.num_swapped_blocks = 0
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        return True

    def resume_swapped(self, scheduled: dict[Request, int], budget: int,
                       watermark: int = 0) -> int:
        """Swap requests back in, oldest swap first, while max_num_seqs, the token budget
        and the free blocks (keeping ``watermark`` blocks free while anything runs) allow;
        each is scheduled for its next tokens. Returns the budget left."""
        while self.swapped and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.swapped[0]
            n = min(req.num_new_tokens, budget)
            reserve = watermark if self.running else 0
            if self.blocks_needed(req, n) + reserve > self.kv.num_free_blocks:
                break
            if not self.swap_in(req, n):
                break
            scheduled[req] = n
            budget -= n
        return budget

    def waiting_blocked(self, budget: int) -> bool:
        """Whether the head of waiting cannot be admitted in the coming step (``budget``
        tokens left after the running requests' decodes) and stays so while nothing
        frees blocks: decode steps only take blocks, so then every step until a finish
        or an arrival is decodes only (a steady decode). Policies whose admission rule
        is monotone in the free blocks override it; False (not known) by default."""
        return False

    def iteration_steady_decode(self) -> SteadyDecode | None:
        """The steady-decode promise of an iteration-level policy (chunked, continuous):
        nothing swapped, every running request one token from sampling, the token budget
        covering them all, and no waiting request admissible while they decode (none
        waiting, or every slot taken). A policy makes the promise by defining
        ``steady_decode`` in the class that defines its schedule() (see
        ``sim.interface.declares``)."""
        running = self.running
        n = len(running)
        cfg = self.config
        if (not n or self.swapped or n > cfg.max_num_batched_tokens
                or (len(self.waiting) and (n < cfg.max_num_seqs or self.lpm))):
            return None
        ctx = 0
        for r in running:
            c = r.num_computed_tokens
            if r.num_output_tokens == 0 or r.num_prompt_tokens + r.num_output_tokens - c != 1:
                return None
            ctx += c + 1
        return SteadyDecode(running, running, BatchShape(0, 0, 0, 0, n, ctx, n), n)

    def admit(self, req: Request) -> None:
        """Move the head of waiting into running."""
        self.waiting.pop()
        req.status = RequestStatus.RUNNING
        self.running.append(req)

    def make_plan(self, scheduled: dict[Request, int], preempted: list[Request],
                  group: DecodeGroup | None = None) -> BatchPlan:
        """The step's BatchPlan (``group``: a decode group whose members also run). Swap
        transfers done while planning are charged to this step (vLLM V0 copies blocks
        before the forward pass), or to the next step that runs when this one schedules
        nothing."""
        extra = 0.0
        if (scheduled or group) and self._transfer_bytes:
            extra = self._transfer_bytes / self.config.pcie_bandwidth_bytes_per_s
            self._transfer_bytes = 0
        return BatchPlan(list(scheduled.items()), preempted, self.running, None, extra, group)

    # -- lazy decodes (sim/decode_group.py): the group is the head of running; a member
    # is preempted only when the victim rule reaches past the tail (the priority queue),
    # and then counts as a scheduled request unscheduled (allocate_preempting) --
    def group_step(self, now: float) -> tuple[int, int]:
        """Grow the decode group over the head of running, then give each member its one
        token for this step: their blocks are allocated here, first, as running order
        wants. Returns (token budget left, running entries covered). When the budget
        cannot cover every member the group dissolves, and when the free blocks cannot,
        it keeps the members before the first left without a block
        (DecodeGroup.allocate_step); the rest of the step is planned request by request,
        where vLLM's preemption rules apply."""
        budget = self.config.max_num_batched_tokens
        group = self.decode_group
        if group is None:
            return budget, 0
        group.grow(self.running, now, stalled=True)  # the group runs in this step
        n = len(group)
        if not n:
            return budget, 0
        if n > budget:
            group.dissolve()
            return budget, 0
        n = group.allocate_step(self.kv.num_free_blocks)
        return budget - n, n

    def group_steady_decode(self, now: float) -> SteadyDecode | None:
        """iteration_steady_decode for a policy with a decode group: steady when the group
        (grown first) covers every running request."""
        group = self.decode_group
        if group is None:
            return self.iteration_steady_decode()
        running = self.running
        # The group is a prefix of running: it holds the tail when it holds them all.
        members = group.members
        if members and len(members) < len(running) and not group.can_join(running[-1], now):
            return None  # the group cannot grow over the tail (a prefill, say): not steady
        if self.lpm and len(self.waiting):
            return None  # lpm re-sorts waiting every step (a stable sort: its history counts)
        cfg = self.config
        if self.swapped or (len(self.waiting) and len(running) < cfg.max_num_seqs
                            and not self.waiting_blocked(
                                cfg.max_num_batched_tokens - len(running))):
            return None  # work other than these decodes may run next
        # Past that check the group runs in the coming step whatever the engine does with
        # this promise (a run, or schedule(): no prefill can be admitted, nothing resumed),
        # so requests may join it even while a stall is pending.
        group.grow(running, now, stalled=True)
        n = len(members)
        if not n:
            return self.iteration_steady_decode()
        if n < len(running) or n > cfg.max_num_batched_tokens:
            return None
        return SteadyDecode(group.members, running, BatchShape(0, 0, 0, 0, n, group.ctx_sum, n),
                            n, group)
