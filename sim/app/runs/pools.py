"""A disaggregated run's settings (``servesim run --disagg xPyD``): its pools (the xPyD
form), their vLLM knobs and devices (each pool's GPU, tensor parallelism and memory
share: ``pool_value``), the KV link, checked with the RunConfig (``check_disagg``); the
link (``link_spec``: a --kv-link preset, its figures overridden by --kv-link-gbps /
--kv-link-latency-us) and each pool's scheduler config (the run's, with the pool's batch
limits). ``cfg`` below is a RunConfig (typed Any: run_config imports this module)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from calibration.gpus import get_gpu
from sim.app.runs.disagg_fields import (
    DEVICE_FIELDS,
    DISAGG_FIELDS,
    LIMIT_FIELDS,
    POOL_KNOBS,
    POOLS,
)
from sim.config import SchedulerConfig
from sim.disagg.link_spec import GBIT, KV_LINKS, LinkSpec

#: The link a disaggregated run gets when it names none (one NDR InfiniBand port a GPU).
DEFAULT_KV_LINK = "ib"

#: Most replicas a pool may have (each engine is simulated in this process).
MAX_POOL_REPLICAS = 256

_XPYD = re.compile(r"^(\d+)P(\d+)D$", re.IGNORECASE)


def parse_disagg(text: str) -> tuple[int, int]:
    """(prefill replicas, decode replicas) of ``text`` in xPyD form ("1P1D", "2P4D").
    Raises ValueError naming disagg and the form."""
    m = _XPYD.match(text.strip())
    x, y = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if not (1 <= x <= MAX_POOL_REPLICAS and 1 <= y <= MAX_POOL_REPLICAS):
        raise ValueError(f"disagg must be xPyD with 1 <= x, y <= {MAX_POOL_REPLICAS} prefill "
                         f"and decode replicas (e.g. 1P1D, 2P4D), got {text!r}")
    return x, y


def check_disagg(cfg: Any) -> None:
    """The disaggregation fields of ``cfg``, checked once (ValueError naming the field):
    the xPyD form; a preset link name; a bandwidth > 0 and a latency >= 0; integers >= 0
    (min prompt tokens) and >= 1 (pool knobs, pool TP); each pool's device
    (``_check_devices``); and the run options it cannot take yet."""
    if cfg.disagg is None:
        given = [f for f in DISAGG_FIELDS if getattr(cfg, f) is not None]
        if given:
            raise ValueError(f"{given[0]} applies to disaggregated runs only: give --disagg "
                             "xPyD")
        return
    parse_disagg(cfg.disagg)
    if cfg.kv_link is not None and cfg.kv_link not in KV_LINKS:
        raise ValueError(f"kv_link must be one of {', '.join(KV_LINKS)}, got {cfg.kv_link!r}")
    gbps, us = cfg.kv_link_gbps, cfg.kv_link_latency_us
    if gbps is not None and not (gbps > 0 and math.isfinite(gbps)):
        raise ValueError(f"kv_link_gbps must be a finite number > 0 Gb/s, got {gbps}")
    if us is not None and not (us >= 0 and math.isfinite(us)):
        raise ValueError(f"kv_link_latency_us must be a finite number >= 0 us, got {us}")
    _check_ints(cfg)
    _check_devices(cfg)
    for field, value, allowed in (("replicas", cfg.replicas, 1),
                                  ("concurrency", cfg.concurrency, None)):
        if value != allowed:
            raise ValueError(f"{field} {value} conflicts with disagg {cfg.disagg}: the pools "
                             "are its replicas, and it takes open-loop arrivals")
    if cfg.prefix_cache not in (None, "none"):
        raise ValueError(f"prefix_cache {cfg.prefix_cache} conflicts with disagg "
                         f"{cfg.disagg}: disaggregated runs have no prefix cache yet")


def _check_ints(cfg: Any) -> None:
    low = {"disagg_min_prompt_tokens": 0, **dict.fromkeys(POOL_KNOBS, 1),
           **{f"{pool}_tensor_parallel_size": 1 for pool in POOLS}}
    for field, least in low.items():
        value = getattr(cfg, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < least):
            raise ValueError(f"{field} must be an integer >= {least}, got {value!r}")


def _check_devices(cfg: Any) -> None:
    """Each pool's own device (ValueError naming the pool's field): a GPU preset or spec
    file (calibration/gpus.py get_gpu) and a memory share in (0, 1]. What a device cannot
    run (a profile's one device, weights that do not fit) is the runner's engine check on
    the pool's own config (disagg.pool_engines names the pool)."""
    for pool in POOLS:
        gpu, _, util = (getattr(cfg, f"{pool}_{f}") for f in DEVICE_FIELDS)
        if util is not None and (isinstance(util, bool) or not isinstance(util, int | float)
                                 or not 0 < util <= 1):
            raise ValueError(f"{pool}_gpu_memory_utilization must be in (0, 1], got {util!r}")
        if gpu is not None:
            try:
                get_gpu(str(gpu))
            except ValueError as e:
                raise ValueError(f"{pool}_gpu: {e}") from None


def pool_value(cfg: Any, pool: str, field: str) -> Any:
    """``pool``'s value of the run's ``field`` (one of DEVICE_FIELDS): the pool's own
    (``{pool}_{field}``) where given, else the run's."""
    own = getattr(cfg, f"{pool}_{field}")
    return getattr(cfg, field) if own is None else own


def pool_gpus(cfg: Any) -> int:
    """GPUs a disaggregated run serves on: x x TP_p + y x TP_d for its xPyD pools (each
    pool's TP: its own where given, else the run's)."""
    x, y = parse_disagg(cfg.disagg)
    return (x * pool_value(cfg, "prefill", "tensor_parallel_size")
            + y * pool_value(cfg, "decode", "tensor_parallel_size"))


def pool_run_config(cfg: Any, pool: str) -> Any:
    """The RunConfig of ``pool``'s own engine (None when the pool keeps the run's GPU, TP,
    gpu_memory_utilization and batch limits): the run's config, aggregated, on the pool's
    device with the pool's max_num_seqs and max_num_batched_tokens where given, which
    size its KV plan as a vLLM launch with them would (the profile run's activation peak
    and the CUDA graphs it captures); what the run left to defaults (batch limits, the
    roofline's constants) is left to that device's."""
    if not _has_own_engine(cfg, pool):
        return None
    limits = {f: getattr(cfg, f"{pool}_{f}") for f in LIMIT_FIELDS
              if getattr(cfg, f"{pool}_{f}") is not None}
    device = {f: pool_value(cfg, pool, f) for f in DEVICE_FIELDS}
    return dataclasses.replace(cfg, disagg=None, **dict.fromkeys(DISAGG_FIELDS), **device,
                               **limits)


def _has_own_engine(cfg: Any, pool: str) -> bool:
    """Whether ``pool`` replaces any of the run's batch limits or device fields."""
    return any(getattr(cfg, f"{pool}_{f}") is not None for f in (*LIMIT_FIELDS, *DEVICE_FIELDS))


def own_pool_engines(cfg: Any) -> bool:
    """Whether every pool of a disaggregated ``cfg`` runs an engine of its own
    (pool_run_config), so that no pool runs the run-level engine: its KV plan, sized by
    the run's batch limits and memory share, applies to no pool and is not made
    (runner._engines; each pool's own engine plans and checks its own)."""
    return cfg.disagg is not None and all(_has_own_engine(cfg, p) for p in POOLS)


def pool_devices_text(devices: tuple[tuple[int, str | None], ...]) -> str:
    """The two pools' engines by TP and GPU (``devices``: (TP, the pool's own GPU or
    None) for the prefill pool, then the decode pool): "TP 2" when they match on the
    run's GPU, else "prefill TP 2 on h200-sxm, decode TP 1"."""
    if len(set(devices)) == 1 and not devices[0][1]:
        return f"TP {devices[0][0]}"
    return ", ".join(f"{p} TP {tp}" + (f" on {gpu}" if gpu else "")
                     for p, (tp, gpu) in zip(POOLS, devices, strict=True))


def link_spec(cfg: Any) -> LinkSpec:
    """The run's KV link: --kv-link's preset (DEFAULT_KV_LINK when none), with its
    bandwidth and latency replaced by --kv-link-gbps / --kv-link-latency-us when given."""
    base = KV_LINKS[cfg.kv_link or DEFAULT_KV_LINK]
    if cfg.kv_link_gbps is None and cfg.kv_link_latency_us is None:
        return base
    return LinkSpec(
        base.name if cfg.kv_link_gbps is None else "custom",
        base.bandwidth_bytes_per_s if cfg.kv_link_gbps is None else cfg.kv_link_gbps * GBIT,
        base.latency_s if cfg.kv_link_latency_us is None else cfg.kv_link_latency_us * 1e-6)


def pool_config(sched: SchedulerConfig, cfg: Any, pool: str) -> SchedulerConfig:
    """``pool``'s ("prefill" or "decode") scheduler config: the run's without a prefix
    cache, with the pool's max_num_seqs / max_num_batched_tokens where given. Raises
    ValueError naming the pool's field for what the config refuses."""
    seqs = getattr(cfg, f"{pool}_max_num_seqs")
    tokens = getattr(cfg, f"{pool}_max_num_batched_tokens")
    try:
        return dataclasses.replace(
            sched, prefix_cache="none",
            max_num_seqs=sched.max_num_seqs if seqs is None else seqs,
            max_num_batched_tokens=sched.max_num_batched_tokens if tokens is None else tokens)
    except ValueError as e:
        raise ValueError(f"{pool}_{e}") from None


