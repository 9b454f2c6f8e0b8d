"""A disaggregated run's RunConfig fields by name: the two pools, the batch limits and
device fields each pool may replace, and every field that applies to a disaggregated run
only. Names only, so that RunConfig reads them without loading the pools' settings
(sim/app/runs/pools.py checks and reads their values)."""

from __future__ import annotations

#: The two pools, in the order their fields are named.
POOLS = ("prefill", "decode")

#: The run's batch limits a pool may replace: ``{pool}_{field}`` is that pool's (None:
#: the run's value).
LIMIT_FIELDS = ("max_num_seqs", "max_num_batched_tokens")

#: The per-pool vLLM knobs: RunConfig fields, each the run's field of that name for one
#: pool.
POOL_KNOBS = tuple(f"{pool}_{field}" for pool in POOLS for field in LIMIT_FIELDS)

#: The run's device fields a pool may replace: ``{pool}_{field}`` is that pool's (None:
#: the run's value; pools.pool_value).
DEVICE_FIELDS = ("gpu", "tensor_parallel_size", "gpu_memory_utilization")

#: The per-pool device fields: RunConfig fields, each the run's field of that name for one
#: pool.
POOL_DEVICES = tuple(f"{pool}_{field}" for pool in POOLS for field in DEVICE_FIELDS)

#: The fields that apply to a disaggregated run only.
DISAGG_FIELDS = ("kv_link", "kv_link_gbps", "kv_link_latency_us",
                 "disagg_min_prompt_tokens", *POOL_KNOBS, *POOL_DEVICES)
