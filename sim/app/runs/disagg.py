"""``servesim run --disagg xPyD``: the run's workload through its prefill and decode
pools (sim/disagg/), with the settings of sim/app/runs/pools.py. Each pool's engines run
the run's model on the pool's GPU and tensor parallelism with the pool's memory share and
batch limits (``pool_engines``: the run's engine where the pool changes none of them,
else prepare's engine side on the pool's own config), and the KV link moves one port pair's bytes
(``kv_transfer_bytes_per_token``: the side with fewer TP shards carries more a port)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from calibration.memory import KVCachePlan
from policies.registry import get_policy_class
from policies.routers import make_router
from scenarios.workload import Workload
from sim.app.runs.pools import (
    DEVICE_FIELDS,
    LIMIT_FIELDS,
    POOLS,
    link_spec,
    parse_disagg,
    pool_config,
    pool_run_config,
)
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
    pools: dict[str, PoolEngine] | None


@dataclass(frozen=True, slots=True)
class PoolEngine:
    """One pool's engine as prepared: its ``gpu`` (a preset name or GPU spec file),
    ``tensor_parallel_size``, scheduler config (the pool's batch limits; KV bytes a block
    on one TP shard), cost model, ``num_gpu_blocks`` (one engine's KV pool, per GPU) and
    the KV plan that sized it, and ``notes``: what vLLM would warn of an engine of the
    pool's own, each line naming the pool (none for a pool that runs the run's engine,
    whose notes are the run's)."""

    gpu: str
    tensor_parallel_size: int
    scheduler: SchedulerConfig
    cost_model: CostModel
    num_gpu_blocks: int
    kv_plan: KVCachePlan
    notes: tuple[str, ...] = ()

    def record(self) -> dict[str, Any]:
        """summary.json's figures of the pool's engine: gpu, tensor_parallel_size,
        num_gpu_blocks."""
        return {"gpu": self.gpu, "tensor_parallel_size": self.tensor_parallel_size,
                "num_gpu_blocks": self.num_gpu_blocks}


#: prepare's engine side for one config (sim/app/runs/runner.py gives it): the config
#: as resolved, its scheduler config, cost model, num_gpu_blocks, KV plan and what vLLM
#: would warn of it (cudagraph_settings.graph_notes).
EngineSide = tuple[RunConfig, SchedulerConfig, CostModel, int, KVCachePlan, tuple[str, ...]]

#: prepare's engine side of a config; raises ValueError (a Refused for what vLLM refuses
#: at start-up) as prepare does.
EngineOf = Callable[[RunConfig], EngineSide]


def pool_engines(cfg: RunConfig, run: EngineSide | None,
                 engine_of: EngineOf) -> dict[str, PoolEngine] | None:
    """A disaggregated run's engine per pool (None for an aggregated run): the run's
    engine ``run`` (as ``engine_of`` gives it, its notes left to the run) where the pool
    keeps the run's GPU, TP, gpu_memory_utilization and batch limits, else
    ``engine_of`` on the pool's own config (pools.pool_run_config: a vLLM launch of its
    own on the pool's GPU with its batch limits, which size its KV plan, its defaults
    and the roofline's constants for that GPU where the run left them), its notes
    prefixed with the pool's name; each with the pool's batch limits
    (pools.pool_config). ``run`` None: every pool has an engine of its own
    (pools.own_pool_engines). Raises ValueError (or Refused) naming the pool's fields
    for an engine vLLM would not start."""
    if cfg.disagg is None:
        return None
    out = {}
    for pool in POOLS:
        own = pool_run_config(cfg, pool)
        if own is None:
            assert run is not None, "a pool without an engine of its own runs the run's"
            resolved, sched, cost, blocks, plan, _ = run
            notes: tuple[str, ...] = ()
        else:
            resolved, sched, cost, blocks, plan, notes = _own_engine(cfg, pool, own, engine_of)
        assert resolved.gpu is not None, "RunConfig resolves the GPU"
        out[pool] = PoolEngine(resolved.gpu, resolved.tensor_parallel_size,
                               pool_config(sched, cfg, pool), cost, blocks, plan,
                               tuple(f"{pool} pool: {n}" for n in notes))
    return out


def _own_engine(cfg: RunConfig, pool: str, own: RunConfig, engine_of: EngineOf) -> EngineSide:
    """``engine_of(own)``, the engine of ``pool``'s own config; its errors name the
    pool's fields that ``cfg`` sets."""
    try:
        return engine_of(own)
    except ValueError as e:
        given = ", ".join(f"{pool}_{f} {getattr(cfg, f'{pool}_{f}')}"
                          for f in (*DEVICE_FIELDS, *LIMIT_FIELDS)
                          if getattr(cfg, f"{pool}_{f}") is not None)
        raise type(e)(f"{pool} pool ({given}): {e}") from None


def kv_transfer_bytes_per_token(prefill: PoolEngine, decode: PoolEngine,
                                block_size: int) -> float:
    """KV bytes a prompt token moves between a prefill engine's port and a decode
    engine's (sim/disagg/link.py prices one port pair at one NIC's bandwidth): the larger
    of the two pools' KV bytes a token on one GPU, total / min(TP_p, TP_d) for KV heads
    sharded over TP.

    vLLM's NixlConnector has each decode TP worker read its heads of the prompt's KV
    from the prefill workers that hold them (vllm-project/vllm
    vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
    NixlConnectorWorker.add_remote_agent, commit 002a105): with TP_d > TP_p, TP_d / TP_p
    decode workers each read a slice of one prefill worker's heads; with TP_p > TP_d,
    each decode worker reads from TP_p / TP_d prefill workers. Each prefill GPU sends
    total / TP_p bytes and each decode GPU receives total / TP_d, every GPU over its own
    NIC at once, so the side with fewer shards, total / min(TP_p, TP_d) a NIC, bounds the
    transfer. Since the link takes an engine as one port, transfers that share an engine
    of the side with more shards are slowed there as if it had one NIC (by up to
    TP_large / TP_small); a cache replicated on every shard (MLA, or TP above the KV
    heads) moves one GPU's copy."""
    p, d = prefill.scheduler.kv_bytes_per_block, decode.scheduler.kv_bytes_per_block
    assert p is not None and d is not None, "the runner sizes a block"
    return max(p, d) / block_size


def simulate_disagg_prepared(prep: PreparedRun,
                             progress: Callable[[int], None] | None = None,
                             fast_path: bool = True, watched: object = None) -> SimResult:
    """Simulate ``prep``'s workload through its xPyD pools (sim/disagg/system.py), each
    pool's engines as the runner prepared them (pool_engines); summary.json's
    ``disagg`` block gains each pool's gpu, tensor_parallel_size and num_gpu_blocks.
    ``watched``: a step observer or executor, refused (ValueError): the pools' engines
    take neither."""
    if watched is not None:
        raise ValueError("a step observer (slot diagram) or executor (validation) needs "
                         "an aggregated run (no --disagg)")
    cfg, w = prep.config, prep.workload
    assert cfg.disagg is not None and cfg.block_size is not None, "a checked disagg run"
    x, y = parse_disagg(cfg.disagg)
    engines = prep.pools
    assert engines is not None, "the runner prepares a disaggregated run's pools"
    arrivals = ColumnArrivals(w.arrival_time, w.num_prompt_tokens, w.output_len,
                              w.max_tokens, w.priority, w.request_id)
    span = float(w.arrival_time[-1] - w.arrival_time[0]) if len(w) else 0.0

    def pool(n: int, name: str) -> Pool:
        e = engines[name]
        router = make_router(cfg.router, prompt_segments=workload_segments(w))
        return Pool(n, e.scheduler, e.cost_model, router, e.num_gpu_blocks)

    result = simulate_disagg(
        arrivals, prefill=pool(x, "prefill"), decode=pool(y, "decode"),
        policy_factory=get_policy_class(cfg.policy), link=link_spec(cfg),
        kv_bytes_per_token=kv_transfer_bytes_per_token(engines["prefill"], engines["decode"],
                                                       cfg.block_size),
        min_prompt_tokens=cfg.disagg_min_prompt_tokens or 0, block_size=cfg.block_size,
        slo_ttft_s=cfg.slo_ttft, slo_tpot_s=cfg.slo_tpot, progress=progress,
        slice_s=span / 100 if span > 0 else math.inf, fast_path=fast_path)
    block = result.summary["disagg"]
    for name, e in engines.items():
        figures = block[name]
        block[name] = {"num_replicas": figures.pop("num_replicas"), **e.record(), **figures}
    return result
