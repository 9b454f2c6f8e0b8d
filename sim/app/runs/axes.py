"""The grid axes of ``servesim sweep`` and ``servesim plan``: which RunConfig fields each
command varies, in grid order, and how one value of each is parsed.

One module for the runs (sim/app/runs/sweep.py, sim/app/runs/plan.py) and the command
line (sim/app/cli/capacity.py declares an option per axis), kept light (no pandas, no
engine) so that ``servesim --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.config import PREFIX_CACHE_MODES


def prefix_cache_mode(text: str) -> str:
    """One value of the prefix_cache axis: none, block or radix. Raises ValueError for
    any other."""
    if text not in PREFIX_CACHE_MODES:
        raise ValueError(f"one of {', '.join(PREFIX_CACHE_MODES)}")
    return text


#: Axis name (a RunConfig field) -> parser of one value. Grid order follows this order.
AXES: dict[str, Callable[[str], Any]] = {
    "policy": str,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "gpu_memory_utilization": float,
    "long_prefill_token_threshold": int,
    "tensor_parallel_size": int,
    "replicas": int,
    "prefix_cache": prefix_cache_mode,
    "burstiness": float,
    "rate": float,
    "concurrency": int,
}

#: The axes that set a cell's load (at most one per grid).
LOAD_AXES = ("rate", "concurrency")

#: Engine knobs a plan may compare (the config grid), a subset of AXES in its order.
PLAN_AXES = ("policy", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
             "long_prefill_token_threshold", "tensor_parallel_size", "prefix_cache")
