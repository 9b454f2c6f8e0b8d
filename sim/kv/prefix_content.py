"""What a prompt says and what names each of its blocks, for the prefix caches (the
caches are sim/kv/prefix_cache.py, sim/kv/block_cache.py and sim/kv/radix_cache.py; user guide:
docs/prefix_caching.md).

**Prompt content without tokens.** A request's prompt is a chain of *segments*, ``(segment
id, tokens)`` pairs summing to its length (``Request.prompt_segments``): token t is named
by the segment it lies in and its offset there, so two prompts agree up to position e
exactly when their segments do. A Mooncake trace's ``hash_ids`` are segments of 512 tokens
(``mooncake_segments``; the last one holds the remainder); a synthetic system prompt or
conversation history is one segment reused by many requests. The tokens a request
generates form one more segment after its prompt, its *answer*, whose id is derived from
the request id (``answer_segment_id``): a multi-turn session puts (answer of turn t, its
length) into the prompt of turn t + 1, so turn t's decode blocks can hit. A request with
no segments gets one segment of its own (``unique_segment_id``): it shares nothing with
other requests but still finds its own blocks after a preemption.

**Block identity.** Engine block j covers tokens [j*bs, (j+1)*bs) and is named by every
token before its end e = (j+1)*bs, i.e. by (the segment chain through the segment k that
holds token e - 1, e), with ``chain_0 = H(ROOT, 0, id_0)`` and ``chain_k+1 = H(chain_k,
len_k, id_k+1)`` (``chain_hash``: 64-bit splitmix64 mixing; equal chains mean equal
prefixes up to collisions), which plays the part of vLLM's chained block hash
(``hash(parent, block tokens)``). Blocks are therefore indexed per segment: a request
keeps its *spans*, (chain_k, first block, end block) per segment (``prefix_spans``,
computed once, lazily: no token lists, no per-block hashes), and the index
(sim/kv/prefix_index.py) gives each (chain_k, block within it) a fixed slot, so a request's
blocks map to an array of slots and lookups, inserts and evictions of a whole chunk are
array operations. In a workload run the slots are fixed before the run, for every
request at once, by sim/kv/prefix_slots.py, from the same chains. Only
full blocks are cached, and only as far as their tokens are known
(prompt, then sampled tokens). When bs divides 512, block j of a Mooncake prompt lies in
Mooncake block j*bs // 512 and is named by (the Mooncake ids up to that block,
sub-index); when it does not, a block straddling two Mooncake blocks is named by the
later one's chain, which covers both, so a hit stops at the first engine block that
reaches into a differing Mooncake block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from itertools import repeat

from sim.kv.block_pool import cdiv
from sim.request import Request

#: Tokens per Mooncake ``hash_ids`` entry (FAST'25 traces).
MOONCAKE_BLOCK_TOKENS = 512
#: The chain before a prompt's first segment, and the constants of ``chain_hash``.
CHAIN_ROOT = 0x5E12E51
MIX_1, MIX_2, MIX_GOLD = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
_INT64 = 1 << 63

Segments = tuple[tuple[int, int], ...]


def _segment_id(kind: bytes, request_id: str) -> int:
    digest = hashlib.blake2b(request_id.encode(), digest_size=8, person=kind).digest()
    return int.from_bytes(digest, "little") >> 1


def answer_segment_id(request_id: str) -> int:
    """The segment id of the tokens ``request_id`` generates (stable across runs)."""
    return _segment_id(b"servesim-answer", request_id)


def unique_segment_id(request_id: str) -> int:
    """A segment id no other request's prompt uses (for prompts of unknown content)."""
    return _segment_id(b"servesim-prompt", request_id)


def segments_of(req: Request) -> Segments:
    """``req``'s prompt as segments: its ``prompt_segments``, or else one segment of its
    own (``unique_segment_id``) covering the whole prompt."""
    return req.prompt_segments or ((unique_segment_id(req.request_id), req.num_prompt_tokens),)


def mooncake_segments(hash_ids: Sequence[int], num_prompt_tokens: int, request_id: str,
                      tokens_per_id: int = MOONCAKE_BLOCK_TOKENS) -> Segments:
    """A Mooncake prompt as segments: one per hash id, ``tokens_per_id`` tokens each, the
    last cut to the prompt's end; ids beyond the prompt are ignored, and tokens beyond the
    ids (never in the shared traces) form a segment of the request's own."""
    k = min(len(hash_ids), cdiv(num_prompt_tokens, tokens_per_id))
    covered = k * tokens_per_id
    if covered > num_prompt_tokens:  # the usual: the last id's block is cut
        return (*zip(hash_ids[:k - 1], repeat(tokens_per_id)),
                (hash_ids[k - 1], tokens_per_id - (covered - num_prompt_tokens)))
    out = tuple(zip(hash_ids[:k], repeat(tokens_per_id)))
    if covered < num_prompt_tokens:
        out += ((unique_segment_id(request_id), num_prompt_tokens - covered),)
    return out


def _mix64(x: int) -> int:
    """splitmix64's finalizer on an unsigned 64-bit int (Steele, Lea and Flood, "Fast
    splittable pseudorandom number generators", OOPSLA 2014)."""
    x ^= x >> 30
    x = (x * MIX_1) & _MASK
    x ^= x >> 27
    x = (x * MIX_2) & _MASK
    return x ^ (x >> 31)


def segment_key(sid: int) -> int:
    """A segment id as the 64 bits ``chain_hash`` mixes: an int64 as its two's complement,
    any other int (a 64-bit unsigned hash, say) by its Python ``hash``."""
    if not -_INT64 <= sid < _INT64:
        sid = hash(sid)
    return sid & _MASK


def chain_hash(chain: int, prev_tokens: int, sid: int) -> int:
    """The chain after ``chain`` of the segment ``sid``, the previous segment holding
    ``prev_tokens`` tokens: ``mix(mix(chain * GOLD + prev_tokens) ^ mix(key(sid) ^
    GOLD))`` in unsigned 64-bit arithmetic, mix being splitmix64's finalizer. The same
    function as sim/kv/prefix_slots.py computes for a whole workload with numpy, so both
    name blocks alike."""
    h = _mix64((chain * MIX_GOLD + prev_tokens) & _MASK)
    return _mix64(h ^ _mix64(segment_key(sid) ^ MIX_GOLD))


def prefix_spans(req: Request, block_size: int) -> list[int]:
    """``req.prefix_spans``, computed on first use: for each segment holding the end of
    at least one block, its chain, the first block ending in it and the block after the
    last one, flat (three ints a segment: no tuple per segment for the garbage collector
    to visit); the answer last, always, as max_tokens tokens (no request generates
    more). See the module docstring."""
    spans = req.prefix_spans
    if spans is not None:
        return spans
    spans = []
    chain, prev_len, start, j0 = CHAIN_ROOT, 0, 0, 0
    for sid, length in segments_of(req):
        chain = chain_hash(chain, prev_len, sid)
        start += length
        j1 = start // block_size
        if j1 > j0:
            spans += (chain, j0, j1)
        prev_len, j0 = length, j1
    chain = chain_hash(chain, prev_len, answer_segment_id(req.request_id))
    spans += (chain, j0, (start + req.max_tokens) // block_size)
    req.prefix_spans = spans
    return spans
