"""``servesim run --disagg xPyD``: the run's workload through its prefill and decode
pools (sim/disagg/), with the settings of sim/app/runs/pools.py. Both pools run the
run's model on its GPU with its cost model, each engine with the run's KV pool
(num_gpu_blocks, as one engine's KV plan finds it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from policies.registry import get_policy_class
from policies.routers import make_router
from scenarios.workload import Workload
from sim.app.runs.pools import link_spec, parse_disagg, pool_config
from sim.app.runs.prompt_content import workload_segments
from sim.app.runs.run_config import RunConfig
from sim.config import SchedulerConfig
from sim.cost_model import CostModel
from sim.disagg.system import Pool, simulate_disagg
from sim.simulate import SimResult
from sim.source import ColumnArrivals


class PreparedRun(Protocol):
    """What this module reads of a prepared run (sim/app/runs/runner.py's Prepared)."""

    config: RunConfig
    scheduler: SchedulerConfig
    workload: Workload
    cost_model: CostModel
    num_gpu_blocks: int


def simulate_disagg_prepared(prep: PreparedRun,
                             progress: Callable[[int], None] | None = None,
                             fast_path: bool = True, watched: object = None) -> SimResult:
    """Simulate ``prep``'s workload through its xPyD pools (sim/disagg/system.py).
    ``watched``: a step observer or executor, refused (ValueError): the pools' engines
    take neither."""
    if watched is not None:
        raise ValueError("a step observer (slot diagram) or executor (validation) needs "
                         "an aggregated run (no --disagg)")
    cfg, w = prep.config, prep.workload
    assert cfg.disagg is not None and cfg.block_size is not None, "a checked disagg run"
    x, y = parse_disagg(cfg.disagg)
    assert prep.scheduler.kv_bytes_per_block is not None, "the runner sizes a block"
    arrivals = ColumnArrivals(w.arrival_time, w.num_prompt_tokens, w.output_len,
                              w.max_tokens, w.priority, w.request_id)
    span = float(w.arrival_time[-1] - w.arrival_time[0]) if len(w) else 0.0

    def pool(n: int, name: str) -> Pool:
        router = make_router(cfg.router, prompt_segments=workload_segments(w))
        return Pool(n, pool_config(prep.scheduler, cfg, name), prep.cost_model, router,
                    prep.num_gpu_blocks)

    return simulate_disagg(
        arrivals, prefill=pool(x, "prefill"), decode=pool(y, "decode"),
        policy_factory=get_policy_class(cfg.policy), link=link_spec(cfg),
        kv_bytes_per_token=prep.scheduler.kv_bytes_per_block / cfg.block_size,
        min_prompt_tokens=cfg.disagg_min_prompt_tokens or 0, block_size=cfg.block_size,
        slo_ttft_s=cfg.slo_ttft, slo_tpot_s=cfg.slo_tpot, progress=progress,
        slice_s=span / 100 if span > 0 else math.inf, fast_path=fast_path)
