"""``static``: request-level batching, as HF ``generate`` or FasterTransformer serve.

When the engine is idle, take up to max_num_seqs waiting requests (queue order) whose KV
reservation of prompt + max_tokens fits; prefill them all in one step, then decode until
every member is done. Nothing joins a running batch; a finished member keeps its slot,
idle, until the batch ends, and results are returned at batch end (so E2E = batch end and
the first token time = end of the prefill step). Costs are charged as HF generate computes
them: the prefill is padded to the longest prompt of the batch, and every decode step
computes the whole batch, finished members included. There is no token budget: a run of
it takes no max_num_batched_tokens and records none (docs/policies.md).
"""

from __future__ import annotations

from typing import ClassVar

from policies.base import QueuePolicy
from sim.batch import BatchPlan, BatchShape, SteadyDecode
from sim.request import Request, RequestStatus


class StaticPolicy(QueuePolicy):
    """Static (request-level) batching; see the module docstring."""

    name: ClassVar[str] = "static"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._max_prompt = 0
        self._num_decodes = 0

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def schedule(self, now: float) -> BatchPlan:
        if not self.running:
            return self._start_batch()
        self._num_decodes += 1
        live = [(r, 1) for r in self.running if r.status is RequestStatus.RUNNING]
        b = len(self.running)
        # Each member attends over the padded prompt plus every token generated so far.
        shape = BatchShape(num_decode_seqs=b, num_sampled_seqs=b,
                           decode_context_tokens=b * (self._max_prompt + self._num_decodes))
        return BatchPlan(live, [], self.running, shape)

    def steady_decode(self, now: float) -> SteadyDecode | None:
        """The fast-path promise for this class's schedule(): between a batch's
        prefill and its first finish every step decodes the same live members and
        charges the whole batch (sim/fastpath.py)."""
        if not self.running:
            return None
        live = [r for r in self.running if r.status is RequestStatus.RUNNING]
        if not live or any(r.num_output_tokens == 0 or r.num_new_tokens != 1 for r in live):
            return None
        b = len(self.running)
        ctx = b * (self._max_prompt + self._num_decodes + 1)
        return SteadyDecode(live, self.running, BatchShape(0, 0, 0, 0, b, ctx, b), b)

    def advance(self, num_steps: int) -> None:
        """Account for ``num_steps`` decode steps advanced by the engine's fast path."""
        self._num_decodes += num_steps

    def _start_batch(self) -> BatchPlan:
        kv, cap = self.kv, self.kv.num_usable_blocks * self.kv.block_size
        while len(self.waiting) and len(self.running) < self.config.max_num_seqs:
            req = self.waiting.peek()
            if kv.allocate_up_to(req, min(req.num_prompt_tokens + req.max_tokens, cap)) is None:
                break
            self.admit(req)
        if not self.running:
            return BatchPlan()
        b = len(self.running)
        p = self._max_prompt = max(r.num_prompt_tokens for r in self.running)
        self._num_decodes = 0
        shape = BatchShape(num_prefill_tokens=b * p, num_prefill_seqs=b,
                           prefill_attention_pairs=b * p * (p + 1) // 2, num_sampled_seqs=b)
        return BatchPlan([(r, r.num_prompt_tokens) for r in self.running], [], self.running, shape)

    def on_step_end(self, done: list[Request], now: float) -> list[Request]:
        if any(r.status is RequestStatus.RUNNING for r in self.running):
            return []
        batch, self.running = self.running, []
        for req in batch:
            self.kv.free(req)
        return batch
