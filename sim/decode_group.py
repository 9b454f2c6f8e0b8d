"""Decode groups (DecodeGroup): running requests that decode one token every step,
advanced by a step counter instead of one by one.

A policy that opts in keeps its longest run of steadily decoding requests at the head of
its running list in a DecodeGroup. Each group step every member computes one token and
samples one, so a member's progress is ``steps - joined`` tokens past the state it joined
with; its Request fields are brought up to date (``materialize``) only when someone needs
them: when it leaves the group (finishes, is preempted) or the group is dissolved. A
heap says when a member samples its last token. Block crossings are periodic: once a
member has needed its first new block, it needs one every ``block_size`` steps, so it
sits in one of ``block_size`` buckets (its crossing step modulo ``block_size``), kept in
running order; a heap holds the first crossing of members that have not crossed yet.
Per step the work is O(1) plus the members that finish or cross a block boundary,
instead of O(members).

The engine's step-by-step reference (``fast_path=False``) never builds a group;
tests/test_fastpath.py checks both give the same records.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from heapq import heapify, heappop, heappush
from itertools import chain

from sim.kv.block_pool import KVCacheManager
from sim.request import Request


class DecodeGroup:
    """Members (a prefix of the owner's running list, in order) and their lazy state.

    ``steps``: group steps run so far; ``ctx_sum``: the sum over members of c + 1 (the
    keys each decode attends to) for the next step; ``last_end``: every member's last
    token time (the end of the last group step). The owner may run steps without the
    group (continuous batching's prefill-only steps): members then all stall together,
    and the next group step's ITL is measured from ``last_end``. While such a stall is
    pending, requests join only when the owner says the group runs in the coming step
    (``grow(..., stalled=True)``); they are counted in ``fresh``: their last token came
    at the coming step's start, not at ``last_end``.
    """

    __slots__ = ("_base", "_buckets", "_cross", "_finish", "_joins", "_kv", "_phase",
                 "ctx_sum", "fresh", "last_end", "members", "steps")

    def __init__(self, kv: KVCacheManager) -> None:
        self._kv = kv
        self.members: list[Request] = []
        # r -> (steps, c, o) when last synced, and the join number its heap entries carry
        # (a request that left and joined again must not match its old entries).
        self._base: dict[Request, tuple[int, int, int, int]] = {}
        self._finish: list[tuple[int, int, Request]] = []  # (step of its last token, join, r)
        # (step of its first new block, join, r), for members that have not crossed yet
        self._cross: list[tuple[int, int, Request]] = []
        # Members that crossed once: bucket t % block_size holds, in join (= running)
        # order, those needing a new block in every step t of that phase.
        self._buckets: list[list[Request]] = [[] for _ in range(kv.block_size)]
        self._phase: dict[Request, int] = {}  # r -> its bucket
        self._joins = 0
        self.steps = 0
        self.ctx_sum = 0
        self.last_end = 0.0
        self.fresh = 0

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, req: Request) -> bool:
        return req in self._base

    @staticmethod
    def can_join(req: Request, now: float) -> bool:
        """A request one token from sampling, that has sampled before, and whose last
        token came at the end of the previous step (so its next ITL is that step's)."""
        return (req.num_output_tokens > 0 and req.last_token_time == now
                and req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens == 1)

    def add_all(self, reqs: Sequence[Request]) -> None:
        """Append ``reqs`` in order (each must satisfy can_join for the coming step). Their
        heap entries go in at once, heapified when they are many (a dissolved group
        re-forms over every running request); each entry's join number is its own, so the
        heaps pop in the same order however they were filled."""
        g, bs, j0 = self.steps, self._kv.block_size, self._joins
        if not self.members:
            self.last_end = reqs[0].last_token_time  # type: ignore[assignment]
        self._joins = j0 + len(reqs)
        base = self._base
        finish, cross = [], []
        ctx = 0
        for j, r in enumerate(reqs, j0 + 1):
            c, o = r.num_computed_tokens, r.num_output_tokens
            base[r] = (g, c, o, j)
            ctx += c + 1
            finish.append((g + r.max_output_tokens - o, j, r))
            cross.append((g + len(r.block_ids) * bs - c + 1, j, r))
        self.members.extend(reqs)
        self.ctx_sum += ctx
        for heap, new in ((self._finish, finish), (self._cross, cross)):
            if 8 * len(new) >= len(heap):
                heap.extend(new)
                heapify(heap)
            else:
                for e in new:
                    heappush(heap, e)

    def _live(self, entry: tuple[int, int, Request]) -> bool:
        b = self._base.get(entry[2])
        return b is not None and b[3] == entry[1]

    def grow(self, running: list[Request], now: float, stalled: bool = False) -> None:
        """Absorb the requests after the group's end of ``running`` that can join for a
        step starting at ``now``. While a stall is pending, only with ``stalled`` (the
        owner promises the group runs in the step starting at ``now``); they are then
        counted in ``fresh``."""
        members = self.members
        start = len(members)
        if start == len(running):
            return  # every running request is a member already (the usual case)
        pending = bool(members) and self.last_end != now
        if pending and not stalled:
            return
        end, n, can_join = start, len(running), self.can_join
        while end < n and can_join(running[end], now):
            end += 1
        if end > start:
            self.add_all(running[start:end])
            if pending:
                self.fresh += end - start

    def materialize(self, req: Request) -> None:
        """Bring ``req``'s Request fields up to date."""
        g0, c0, o0, j = self._base[req]
        d = self.steps - g0
        if d:
            req.num_computed_tokens = c0 + d
            req.num_output_tokens = o0 + d
            req.last_token_time = self.last_end
            self._base[req] = (self.steps, c0 + d, o0 + d, j)

    def remove(self, req: Request) -> None:
        """Take ``req`` out (materialized); it leaves its bucket at once, its heap
        entries die lazily."""
        phase = self._forget(req)
        if phase is not None:
            self._buckets[phase].remove(req)
        self.members.remove(req)

    def _forget(self, req: Request) -> int | None:
        """Materialize ``req`` and drop its lazy state; returns the bucket it sat in (the
        caller takes it out of that bucket and of ``members``)."""
        self.materialize(req)
        if self.fresh and req.last_token_time != self.last_end:
            self.fresh -= 1  # it joined while a stall was pending
        del self._base[req]
        self.ctx_sum -= req.num_computed_tokens + 1
        return self._phase.pop(req, None)

    def dissolve(self) -> None:
        """Materialize every member and empty the group."""
        for req in self.members:
            self.materialize(req)
        self.members.clear()
        self._base.clear()
        self._finish.clear()
        self._cross.clear()
        for bucket in self._buckets:
            bucket.clear()
        self._phase.clear()
        self.ctx_sum = 0
        self.fresh = 0

    # -- what the next steps hold --
    def steps_to_first_finish(self) -> int | None:
        """How many more group steps run before one samples a member's last token
        (0: the next step does); None for an empty group."""
        heap = self._finish
        while heap and not self._live(heap[0]):
            heappop(heap)
        return heap[0][0] - self.steps - 1 if heap else None

    def _due(self, step: int) -> list[tuple[int, int, Request]]:
        """Pop the live crossing entries due at or before ``step``, in order."""
        heap, out, base = self._cross, [], self._base
        while heap and heap[0][0] <= step:
            e = heappop(heap)
            b = base.get(e[2])  # _live, inlined: this loop runs for every block crossing
            if b is not None and b[3] == e[1]:
                out.append(e)
        return out

    def allocate_for_steps(self, num_steps: int, num_free_blocks: int) -> list[int] | None:
        """Allocate the blocks members need over the next ``num_steps`` steps; returns the
        number of new blocks per step, or None (nothing allocated) when they would not
        fit: the caller then takes the step-by-step path, which preempts as vLLM does.
        Blocks are handed out step by step, members in running order within a step, as
        the step-by-step path hands them out."""
        first = self.steps + 1
        bs = self._kv.block_size
        buckets = self._buckets
        if num_steps == 1 and not (self._cross and self._cross[0][0] <= first):
            # One step with no first crossing due: this step's bucket alone.
            bucket = buckets[first % bs]
            if len(bucket) > num_free_blocks:
                return None
            if bucket:
                self._kv.allocate_one_each(bucket)
            return [len(bucket)]
        end = first + num_steps
        due = self._due(end - 1)  # first crossings in the window, in (step, join) order
        if num_steps > bs:
            return self._allocate_long(first, end, due, num_free_blocks)
        # Each member crosses at most once in the window: the first crossers can take
        # their bucket places at once.
        self._place(due)
        phase_of = self._phase
        i = first % bs
        if num_steps == 1:
            window = [buckets[i]]
            total = len(buckets[i])
            per_step = [total]
        else:
            window = buckets[i:i + num_steps]
            if len(window) < num_steps:  # the window wraps round the buckets
                window += buckets[:num_steps - len(window)]
            per_step = list(map(len, window))
            total = sum(per_step)
        if total > num_free_blocks:
            for e in due:
                buckets[e[0] % bs].remove(e[2])
                del phase_of[e[2]]
                heappush(self._cross, e)
            return None
        if total:
            self._kv.allocate_one_each(
                window[0] if num_steps == 1 else list(chain.from_iterable(window)))
        return per_step

    def _place(self, due: list[tuple[int, int, Request]]) -> None:
        """Put first crossers into the bucket of their crossing step, in join order."""
        base, bs = self._base, self._kv.block_size
        for s, _, r in due:
            self._phase[r] = s % bs
            insort(self._buckets[s % bs], r, key=lambda m: base[m][3])

    def allocate_step(self, num_free_blocks: int) -> int:
        """The coming group step's blocks, members in running order while free blocks
        last. Returns how many members keep their place in the step: all of them when
        every block fits; else those before the first member left without one, the rest
        taken out of the group (materialized) for the owner to plan one by one, the first
        of them the member that found no block, where vLLM's preemption rules apply. The
        blocks handed out are the ones the step-by-step path hands out before it meets
        that member."""
        first = self.steps + 1
        if self._cross and self._cross[0][0] <= first:  # a first crossing may be due
            self._place(self._due(first))
        bucket = self._buckets[first % self._kv.block_size]
        if len(bucket) <= num_free_blocks:
            if bucket:
                self._kv.allocate_one_each(bucket)
            return len(self.members)
        if num_free_blocks:
            self._kv.allocate_one_each(bucket[:num_free_blocks])
        keep = self.members.index(bucket[num_free_blocks])  # members are in join order
        if keep == 0:
            self.dissolve()
        else:
            self._truncate(keep)
        return keep

    def _truncate(self, keep: int) -> None:
        """Take the members from index ``keep`` on out (``remove`` for each, their buckets
        rebuilt once rather than searched member by member)."""
        gone = self.members[keep:]
        del self.members[keep:]
        phases = {p for p in map(self._forget, gone) if p is not None}
        base = self._base
        for phase in phases:
            self._buckets[phase] = [m for m in self._buckets[phase] if m in base]

    def _allocate_long(self, first: int, end: int, due: list[tuple[int, int, Request]],
                       num_free_blocks: int) -> list[int] | None:
        """allocate_for_steps over a window longer than a block (members cross more than
        once): step by step, first crossers joining their bucket as they cross."""
        bs = self._kv.block_size
        buckets, base, phase_of = self._buckets, self._base, self._phase
        total = sum(len(buckets[t % bs]) for t in range(first, end))
        for s, _, _ in due:
            total += (end - 1 - s) // bs + 1
        if total > num_free_blocks:
            for e in due:
                heappush(self._cross, e)
            return None
        per_step = [0] * (end - first)
        order: list[Request] = []
        di, nd = 0, len(due)
        for t in range(first, end):
            bucket = buckets[t % bs]
            while di < nd and due[di][0] == t:  # first crossing: joins its bucket
                r = due[di][2]
                insort(bucket, r, key=lambda m: base[m][3])
                phase_of[r] = t % bs
                di += 1
            per_step[t - first] = len(bucket)
            order.extend(bucket)
        if order:
            self._kv.allocate_one_each(order)
        return per_step

    def crossings(self, limit: int) -> list[int]:
        """New blocks the members need in each of the next ``limit`` steps."""
        first = self.steps + 1
        end = first + limit
        bs = self._kv.block_size
        buckets = self._buckets
        counts = [len(buckets[t % bs]) for t in range(first, end)]
        for e in self._cross:
            if e[0] >= end or not self._live(e):
                continue
            for t in range(e[0], end, bs):
                counts[t - first] += 1
        return counts

    def safe_steps(self, limit: int, num_free_blocks: int) -> int:
        """How many of the next ``limit`` steps fit their block allocations."""
        bs = self._kv.block_size
        if len(self.members) * -(-limit // bs) <= num_free_blocks:
            return limit  # even if every member crossed as often as it can, they fit
        used = 0
        for j, k in enumerate(self.crossings(limit)):
            used += k
            if used > num_free_blocks:
                return j
        return limit

    def advance(self, num_steps: int, end: float) -> list[Request]:
        """Account for ``num_steps`` group steps ending at ``end`` (blocks already
        allocated); returns the members that sampled their last token in the last of
        them, materialized and removed (the caller marks them finished)."""
        self.steps += num_steps
        self.ctx_sum += len(self.members) * num_steps
        self.last_end = end
        self.fresh = 0
        heap = self._finish
        done = []
        while heap and heap[0][0] <= self.steps:
            e = heappop(heap)
            if self._live(e):
                done.append(e[2])
        for r in done:
            self.remove(r)
        return done
