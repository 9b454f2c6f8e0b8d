"""The grid axes of ``servesim sweep`` and ``servesim plan``: which RunConfig fields each
command varies, in grid order, and how one value of each is parsed.

One module for the runs (sim/app/runs/sweep.py, sim/app/runs/plan.py) and the command
line (sim/app/cli/capacity.py declares an option per axis), kept light (no pandas, no
engine) so that ``servesim --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.app.runs.pools import parse_disagg
from sim.config import PREFIX_CACHE_MODES


def prefix_cache_mode(text: str) -> str:
    """One value of the prefix_cache axis: none, block or radix. Raises ValueError for
    any other."""
    if text not in PREFIX_CACHE_MODES:
        raise ValueError(f"one of {', '.join(PREFIX_CACHE_MODES)}")
    return text


#: The disagg axis's value for an aggregated cell (sweep.cell_config applies it).
AGGREGATED = "none"


def disagg_value(text: str) -> str:
    """One value of the disagg axis: none (aggregated serving) or xPyD, normalized to
    upper case ("1p2d" -> "1P2D"). Raises ValueError for any other."""
    if text.strip().lower() == AGGREGATED:
        return AGGREGATED
    x, y = parse_disagg(text)
    return f"{x}P{y}D"


#: ``servesim plan --disagg auto``: aggregated serving and the pool ratios a plan
#: compares, each scaled to the target as a unit. Prefill-heavy traffic (long prompts,
#: short answers, as Azure's code trace) needs the xP1D side, decode-heavy traffic (chat)
#: the 1PyD side.
AUTO_DISAGG = (AGGREGATED, "1P1D", "1P2D", "1P3D", "2P1D", "3P1D")

#: Axis name (a RunConfig field) -> parser of one value. Grid order follows this order.
AXES: dict[str, Callable[[str], Any]] = {
    "policy": str,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "gpu_memory_utilization": float,
    "long_prefill_token_threshold": int,
    "tensor_parallel_size": int,
    "replicas": int,
    "disagg": disagg_value,
    "prefill_tensor_parallel_size": int,
    "decode_tensor_parallel_size": int,
    "prefix_cache": prefix_cache_mode,
    "burstiness": float,
    "rate": float,
    "concurrency": int,
}

#: The axes that set a cell's load (at most one per grid).
LOAD_AXES = ("rate", "concurrency")

#: Engine knobs a plan may compare (the config grid), a subset of AXES in its order.
PLAN_AXES = ("policy", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
             "long_prefill_token_threshold", "tensor_parallel_size", "disagg",
             "prefill_tensor_parallel_size", "decode_tensor_parallel_size", "prefix_cache")
