"""Request state: the workload facts of one request plus its progress through the engine.

One owner: the engine's update step advances ``num_computed_tokens`` and produces output
tokens; policies move requests between their queues and call the KV cache manager.
Vocabulary follows vLLM V1 (``vllm/v1/request.py``): a request's ``num_computed_tokens``
catches up with ``num_tokens`` (prompt plus generated tokens) under a per-step budget.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestStatus(enum.Enum):
    """Lifecycle: WAITING -> RUNNING -> (PREEMPTED -> RUNNING ->) FINISHED, or REJECTED."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    REJECTED = "rejected"


@dataclass(slots=True, eq=False, init=False)
class Request:
    """One request.

    Spec fields (from the workload): ``request_id``, ``arrival_time`` (s),
    ``num_prompt_tokens``, ``output_len`` (tokens the request generates before it stops:
    a workload fact that no policy may read), ``max_tokens`` (the client's cap, which
    policies may read) and ``priority`` (lower value = more urgent, as in vLLM).

    ``max_output_tokens`` is the finish limit (output tokens after which it is done):
    ``min(output_len, max_tokens)`` at creation, narrowed by max_model_len when the
    engine admits it (``finish_limit``); every path reads it from here. It holds
    output_len, so no policy may read it either (oracle-srpt's bound apart).

    Progress fields are advanced by the engine; times are simulated seconds, None until
    the event happens. ``finish_reason`` is ``"stop"`` (output_len reached), ``"length"``
    (max_tokens or max_model_len reached) or None; ``reason`` explains a rejection.
    Equality is identity (two requests are never "equal" by value).
    """

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    output_len: int
    max_tokens: int
    priority: int = 0
    index: int = 0
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: str | None = None
    reason: str | None = None
    # Swap-out bookkeeping for swap preemption; 0 when not swapped.
    num_swapped_blocks: int = 0
    # Preemptions by swap (each also counts in num_preemptions).
    num_swaps: int = 0
    # Prefix caching (sim/kv/prefix_content.py). What the prompt says, without its
    # tokens: (segment id, tokens) pairs summing to num_prompt_tokens; None = content
    # unknown (the prompt is shared with no other request).
    prompt_segments: tuple[tuple[int, int], ...] | None = None
    # Its blocks grouped by the segment they end in, as segment chain hash, first
    # block, end block, flat (three ints a segment): computed lazily by a prefix cache
    # (sim/kv/prefix_content.py).
    prefix_spans: list[int] | None = None
    # Or its blocks' slots fixed for the whole workload before the run, as runs (first
    # positions, lengths) of the prefix index's arena, and the workload's number of
    # slots (sim/kv/prefix_slots.py).
    prefix_slots: tuple[list[int], list[int], int] | None = None
    # Prompt tokens found in the prefix cache at the first admission (vLLM's name).
    num_cached_tokens: int = 0
    max_output_tokens: int = field(init=False)

    def __init__(
        self, request_id: str, arrival_time: float, num_prompt_tokens: int,
        output_len: int, max_tokens: int, priority: int = 0, index: int = 0,
        num_computed_tokens: int = 0, num_output_tokens: int = 0,
        block_ids: list[int] | None = None, status: RequestStatus = RequestStatus.WAITING,
        num_preemptions: int = 0, first_scheduled_time: float | None = None,
        first_token_time: float | None = None, last_token_time: float | None = None,
        finish_time: float | None = None, finish_reason: str | None = None,
        reason: str | None = None, num_swapped_blocks: int = 0, num_swaps: int = 0,
        prompt_segments: tuple[tuple[int, int], ...] | None = None,
        prefix_spans: list[int] | None = None,
        prefix_slots: tuple[list[int], list[int], int] | None = None,
        num_cached_tokens: int = 0,
    ) -> None:
        # Written out (init=False): mypyc compiles it, where the one dataclasses
        # generates is interpreted Python (7,800 instructions a request).
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.num_prompt_tokens = num_prompt_tokens
        self.output_len = output_len
        self.max_tokens = max_tokens
        self.priority = priority
        self.index = index
        self.num_computed_tokens = num_computed_tokens
        self.num_output_tokens = num_output_tokens
        self.block_ids = [] if block_ids is None else block_ids
        self.status = status
        self.num_preemptions = num_preemptions
        self.first_scheduled_time = first_scheduled_time
        self.first_token_time = first_token_time
        self.last_token_time = last_token_time
        self.finish_time = finish_time
        self.finish_reason = finish_reason
        self.reason = reason
        self.num_swapped_blocks = num_swapped_blocks
        self.num_swaps = num_swaps
        self.prompt_segments = prompt_segments
        self.prefix_spans = prefix_spans
        self.prefix_slots = prefix_slots
        self.num_cached_tokens = num_cached_tokens
        # No max_model_len is known before admission; the engine's guard sets the limit.
        self.max_output_tokens = min(output_len, max_tokens)

    @property
    def num_tokens(self) -> int:
        """Known tokens: the prompt plus every generated token (vLLM's ``num_tokens``)."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_new_tokens(self) -> int:
        """Tokens still to compute before the next output token can be sampled."""
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED or self.status is RequestStatus.REJECTED


def finish_limit(req: Request, max_model_len: int) -> int:
    """Output tokens after which ``req`` is done generating: min(output_len, max_tokens,
    max_model_len - num_prompt_tokens). The engine stores it in ``max_output_tokens``
    when it admits the request; every path (a step's update, a fast-path run, a decode
    group, oracle-srpt's order) reads it there."""
    return min(req.output_len, req.max_tokens, max_model_len - req.num_prompt_tokens)
