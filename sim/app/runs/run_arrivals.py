"""The arrival source a prepared run's engine reads: the workload's own arrivals (open
loop, sim.source.ColumnArrivals), or closed-loop users over its rows (``concurrency``,
sim.source.ClosedLoopArrivals), each with the prompt content prefix caching needs."""

from __future__ import annotations

from scenarios.workload import Workload
from sim.app.runs.run_config import RunConfig
from sim.engine import ReleaseHook
from sim.source import ArrivalSource, ClosedLoopArrivals, ColumnArrivals


def arrival_source(w: Workload, cfg: RunConfig,
                   prefix_cache: str) -> tuple[ArrivalSource, ReleaseHook | None]:
    """The arrival source of workload ``w`` run as ``cfg`` (resolved) says, and the release
    hook it needs: the workload's own arrivals (open loop), or closed-loop users over its
    rows (``concurrency``); prompt content where ``prefix_cache`` is not "none" (its
    module imported only then)."""
    assert cfg.block_size is not None, "RunConfig resolves the block size"
    content = None
    if prefix_cache != "none":
        from sim.app.runs.prompt_content import prompt_content

        content = prompt_content(w, cfg.block_size, cfg.replicas)
    if cfg.concurrency is None:
        return ColumnArrivals(w.arrival_time, w.num_prompt_tokens, w.output_len,
                              w.max_tokens, w.priority, w.request_id, content), None
    # (RunConfig checked it is integral; a sweep may hand it as 4.0 or a numpy int)
    src = ClosedLoopArrivals(w.num_prompt_tokens, w.output_len, w.max_tokens,
                             int(cfg.concurrency), float(cfg.think_time), w.priority,
                             w.request_id, content)
    return src, src.release
