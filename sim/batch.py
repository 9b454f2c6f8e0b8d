"""What a policy decided for one step (BatchPlan) and what a cost model needs to price it
(BatchShape: token counts and context sizes, no Request objects).

The dataclasses here are made at almost every engine step, so each writes its
``__init__`` out (``init=False``: dataclasses makes none): mypyc compiles a written one,
where the one dataclasses generates is interpreted Python, about five times the cost
(with sim/request.py's and sim/fastpath.py's, 8% of a 10,000-request run's instructions).
tests/test_compiled.py checks that each one takes its fields, in order, with their
defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sim.decode_group import DecodeGroup
from sim.request import Request


@dataclass(slots=True, unsafe_hash=True, init=False)
class BatchShape:
    """The work of one engine step, as a cost model sees it: read-only by contract, not
    frozen (built every step on the hottest path, where a frozen dataclass constructs
    about five times as slowly), and hashable by its fields.

    A scheduled entry with n new tokens over c already-computed tokens is a *decode* when
    it is a single token of a request that has produced output (n == 1); every other entry
    is a *prefill chunk* (including recompute after preemption).

    Fields (all token counts are ints >= 0):
      num_prefill_tokens: sum of n over prefill chunks.
      num_prefill_seqs: number of prefill chunks.
      prefill_context_tokens: sum of c (prior context) over prefill chunks.
      prefill_attention_pairs: sum over prefill chunks of n*c + n*(n+1)/2, the number of
        (query, key) pairs causal attention computes (quadratic in the chunk length).
      num_decode_seqs: number of decodes (each is one token).
      decode_context_tokens: sum over decodes of c + 1, the keys each decode attends to.
      num_sampled_seqs: sequences that produce a token this step (LM-head rows).
    """

    num_prefill_tokens: int = 0
    num_prefill_seqs: int = 0
    prefill_context_tokens: int = 0
    prefill_attention_pairs: int = 0
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0
    num_sampled_seqs: int = 0

    def __init__(self, num_prefill_tokens: int = 0, num_prefill_seqs: int = 0,
                 prefill_context_tokens: int = 0, prefill_attention_pairs: int = 0,
                 num_decode_seqs: int = 0, decode_context_tokens: int = 0,
                 num_sampled_seqs: int = 0) -> None:  # written out: module docstring
        self.num_prefill_tokens = num_prefill_tokens
        self.num_prefill_seqs = num_prefill_seqs
        self.prefill_context_tokens = prefill_context_tokens
        self.prefill_attention_pairs = prefill_attention_pairs
        self.num_decode_seqs = num_decode_seqs
        self.decode_context_tokens = decode_context_tokens
        self.num_sampled_seqs = num_sampled_seqs

    @property
    def num_tokens(self) -> int:
        """All tokens through the linear layers this step."""
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def num_seqs(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs


@dataclass(slots=True, init=False)
class BatchPlan:
    """One step's decision.

    scheduled: (request, num_new_tokens) pairs in execution order; num_new_tokens >= 1.
    preempted: requests preempted while building this step (already freed by the policy).
    holders: the requests holding a batch slot this step, computing or not (the policy's
      running list, not copied: read it before the step ends); used for the useful /
      idle / empty slot accounting and the slot diagram. None = the scheduled requests.
    cost_shape: the shape to charge when it differs from what ``scheduled`` implies
      (static batching pads prompts and keeps computing finished members); None = derive.
    extra_time_s: time added to the step on top of the cost model (e.g. swap transfers).
    group: a DecodeGroup whose every member also computes and samples one token this step
      (not listed in ``scheduled``; its blocks for the step are already allocated).
    """

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    holders: Sequence[Request] | None = None
    cost_shape: BatchShape | None = None
    extra_time_s: float = 0.0
    group: DecodeGroup | None = None

    def __init__(self, scheduled: list[tuple[Request, int]] | None = None,
                 preempted: list[Request] | None = None,
                 holders: Sequence[Request] | None = None,
                 cost_shape: BatchShape | None = None, extra_time_s: float = 0.0,
                 group: DecodeGroup | None = None) -> None:  # written out: module docstring
        self.scheduled = [] if scheduled is None else scheduled
        self.preempted = [] if preempted is None else preempted
        self.holders = holders
        self.cost_shape = cost_shape
        self.extra_time_s = extra_time_s
        self.group = group

    def __bool__(self) -> bool:
        return bool(self.scheduled) or bool(self.group)

    @property
    def num_slots_held(self) -> int:
        return len(self.holders) if self.holders is not None else len(self.scheduled)


def shape_of(scheduled: list[tuple[Request, int]], num_group_decodes: int = 0,
             group_context_tokens: int = 0) -> BatchShape:
    """Derive the BatchShape of a list of (request, num_new_tokens) entries, read before
    the engine applies them (so num_computed_tokens is the prior context), plus
    ``num_group_decodes`` decodes over ``group_context_tokens`` keys in all (a decode
    group's members, each sampling a token)."""
    p_tok = p_seqs = p_ctx = p_pairs = sampled = 0
    d_seqs, d_ctx = 0, 0
    for req, n in scheduled:
        c = req.num_computed_tokens
        if n == 1 and req.num_output_tokens > 0:
            d_seqs += 1
            d_ctx += c + 1
            sampled += 1
        else:
            p_tok += n
            p_seqs += 1
            p_ctx += c
            p_pairs += n * c + n * (n + 1) // 2
            if c + n >= req.num_prompt_tokens + req.num_output_tokens:
                sampled += 1
    if num_group_decodes:
        return BatchShape(p_tok, p_seqs, p_ctx, p_pairs, d_seqs + num_group_decodes,
                          d_ctx + group_context_tokens, sampled + num_group_decodes)
    return BatchShape(p_tok, p_seqs, p_ctx, p_pairs, d_seqs, d_ctx, sampled)


def chunk_shape(num_tokens: int, has_output: bool, computed: int, n: int,
                num_group_decodes: int, group_context_tokens: int) -> BatchShape:
    """``shape_of([(req, n)], num_group_decodes, group_context_tokens)`` for a request with
    ``num_tokens`` known tokens (prompt plus output), ``has_output`` when it has sampled
    before, and ``computed`` computed tokens: the same fields, from the numbers alone (a
    fast-path run prices the steps of one request's chunks before it applies them)."""
    if not num_group_decodes:
        group_context_tokens = 0  # as shape_of adds it: only with group decodes
    if n == 1 and has_output:
        return BatchShape(0, 0, 0, 0, 1 + num_group_decodes,
                          computed + 1 + group_context_tokens, 1 + num_group_decodes)
    sampled = num_group_decodes + (1 if computed + n >= num_tokens else 0)
    return BatchShape(n, 1, computed, n * computed + n * (n + 1) // 2, num_group_decodes,
                      group_context_tokens, sampled)


@dataclass(slots=True, init=False)
class LastChunkAdmission:
    """What the step of a promised prefill's last chunk also does (``ChunkedPrefill.admits``):
    it admits ``request``, the head of waiting, for its first chunk of ``num_tokens``
    tokens, which do not reach its first sample, and nothing else, provided
    ``blocks_needed`` blocks are free when the step admits it (its admission test,
    after the members' and the last chunk's blocks of that step). Admitting it takes
    ``blocks_allocated`` blocks; ``admit`` (the policy's) admits it."""

    request: Request
    num_tokens: int
    blocks_needed: int
    blocks_allocated: int
    admit: Callable[[], None]

    def __init__(self, request: Request, num_tokens: int, blocks_needed: int,
                 blocks_allocated: int, admit: Callable[[], None]) -> None:
        # written out: module docstring
        self.request = request
        self.num_tokens = num_tokens
        self.blocks_needed = blocks_needed
        self.blocks_allocated = blocks_allocated
        self.admit = admit


@dataclass(slots=True, init=False)
class ChunkedPrefill:
    """Part of a steady-decode promise (``SteadyDecode.prefill``): besides the decodes,
    every step schedules the next chunk of ``request``, the tail of running, prefilling:
    ``chunk`` tokens, or all it has left when that is fewer (its last chunk, the step in
    which it samples). ``covers_last``: whether the promise holds for the step of that
    last chunk too (False when the budget that chunk leaves may admit a waiting request
    other than as ``admits`` says). ``admits``: the admission that step makes, when it
    makes one (the run then stops before that step when its blocks do not fit).
    ``arrivals_wait``: the chunk takes all the budget the decodes leave, whoever waits
    (no long_prefill_token_threshold that an arrival could bring into force below it),
    so a request arriving during the run changes none of its steps but that of a last
    chunk shorter than ``chunk`` (the budget it leaves admits)."""

    request: Request
    chunk: int
    covers_last: bool
    admits: LastChunkAdmission | None = None
    arrivals_wait: bool = False

    def __init__(self, request: Request, chunk: int, covers_last: bool,
                 admits: LastChunkAdmission | None = None,
                 arrivals_wait: bool = False) -> None:  # written out: module docstring
        self.request = request
        self.chunk = chunk
        self.covers_last = covers_last
        self.admits = admits
        self.arrivals_wait = arrivals_wait


@dataclass(slots=True, init=False)
class SteadyDecode:
    """A policy's promise about the steps ahead (its optional ``steady_decode()`` hook,
    sim.interface.SteadyDecoder): until a request finishes, a request arrives, or a
    block allocation would not fit, every step schedules exactly one token for each of
    ``requests`` (in that order) and nothing else, with ``holders`` holding the slots,
    and is priced as the decode-only ``shape`` whose ``decode_context_tokens`` grows by
    ``context_growth`` per step.
    The engine may then advance many such steps at once (sim/fastpath.py). Read-only
    by contract, not frozen (made before most engine steps: see BatchShape). With
    ``group`` set, ``requests`` are that DecodeGroup's members (lazily advanced). With
    ``prefill`` (only beside a group), every step also runs that request's next chunk,
    until its last chunk (the step that samples its first token, where the promise ends),
    and the steps are priced as those chunks next to the decodes."""

    requests: Sequence[Request]
    holders: Sequence[Request]
    shape: BatchShape
    context_growth: int
    group: DecodeGroup | None = None
    prefill: ChunkedPrefill | None = None

    def __init__(self, requests: Sequence[Request], holders: Sequence[Request],
                 shape: BatchShape, context_growth: int, group: DecodeGroup | None = None,
                 prefill: ChunkedPrefill | None = None) -> None:
        # written out: module docstring
        self.requests = requests
        self.holders = holders
        self.shape = shape
        self.context_growth = context_growth
        self.group = group
        self.prefill = prefill
