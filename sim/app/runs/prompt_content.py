"""Each request's prompt content, from its workload row, for the prefix caches and the
cache-aware-approx router: the slots of its blocks fixed for the whole workload before the
run (sim/kv/prefix_slots.py), or its segments (sim/kv/prefix_content.py)."""

from __future__ import annotations

from collections.abc import Callable

from scenarios.workload import Workload
from sim.kv.prefix_content import Segments, mooncake_segments, unique_segment_id
from sim.kv.prefix_slots import PrefixSlotTable
from sim.request import Request
from sim.source import ContentFn

#: Most slots fixed before a run, over all replicas (each replica's cache has an int64
#: arena of the workload's slots: 256 MB in all); a workload with more distinct (chain,
#: block) pairs names its blocks per request, in arenas compacted as they fill.
MAX_FIXED_SLOTS = 1 << 25


def prompt_content(w: Workload, block_size: int, replicas: int = 1) -> ContentFn | None:
    """Each request's prompt content for a prefix cache, given at arrival: the slots of
    its blocks, fixed for the whole workload in one pass before the run
    (sim/kv/prefix_slots.py) from the workload's own ``prompt_segments`` or else its
    Mooncake ``hash_ids`` at 512 tokens an id; past ``MAX_FIXED_SLOTS`` slots over
    ``replicas`` caches its segments instead (the caches then make their slots per
    request, with the same results); None when it has neither (every prompt is then its
    own)."""
    if w.prompt_segments is None and w.hash_ids is None:
        return None
    table = PrefixSlotTable.for_workload(w.num_prompt_tokens, w.output_len, w.request_id,
                                         block_size, prompt_segments=w.prompt_segments,
                                         hash_ids=w.hash_ids)
    if table.num_slots * replicas > MAX_FIXED_SLOTS:
        return segments_content(w)
    runs = table.runs

    def content(req: Request) -> None:
        req.prefix_slots = runs(req.index)

    return content


def workload_segments(w: Workload) -> Callable[[Request], Segments]:
    """Each request's prompt as segments: the workload's own ``prompt_segments``, its
    Mooncake ``hash_ids`` read by ``mooncake_segments``, or else one segment of the
    request's own (a prompt of unknown content shares nothing)."""
    segments, hashes = w.prompt_segments, w.hash_ids
    prompt = w.num_prompt_tokens

    def of(req: Request) -> Segments:
        i = req.index
        if segments is not None:
            return segments[i]  # type: ignore[return-value]
        if hashes is not None:
            return mooncake_segments(hashes[i], int(prompt[i]), req.request_id)
        return ((unique_segment_id(req.request_id), req.num_prompt_tokens),)

    return of


def segments_content(w: Workload) -> ContentFn:
    """Each request's ``prompt_segments``: the workload's own, or its Mooncake
    ``hash_ids`` read by ``mooncake_segments``."""
    of = workload_segments(w)

    def content(req: Request) -> None:
        req.prompt_segments = of(req)

    return content
