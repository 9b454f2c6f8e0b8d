"""vLLM 0.32's start-up rules on CUDA graphs, for the test oracle of tests/vllm_rules.py:
the settings a run asks for (``Graphs``), the names vLLM takes (``graph_names``), whether
it captures graphs and the capture-size checks it then makes (``capture_sizes``). Written
from vLLM 0.32's source (files under ``vllm/``), never from servesim's checks."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: CUDAGraphMode's and CompilationMode's names (config/compilation.py), vLLM's
#: PerformanceMode values (config/vllm.py).
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
COMPILATION_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")
PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")
SET_CUDAGRAPH_SIZES = "config/vllm.py VllmConfig._set_cudagraph_sizes"


@dataclass(frozen=True)
class Graphs:
    """The CUDA-graph settings asked for, under vLLM's names, as given (None: vLLM's
    default); the modes as text, the others as numbers."""

    cudagraph_mode: str | None = None
    capture_sizes: tuple[int, ...] | None = None
    max_capture_size: int | None = None
    optimization_level: int | None = None
    compilation_mode: str | None = None
    enforce_eager: bool = False


def recorded_graphs(cfg: Mapping[str, Any]) -> Graphs:
    """The CUDA-graph settings a config.json records (each only where set)."""
    sizes = cfg.get("cudagraph_capture_sizes")
    return Graphs(cfg.get("cudagraph_mode"), None if sizes is None else tuple(sizes),
                  cfg.get("max_cudagraph_capture_size"), cfg.get("optimization_level"),
                  cfg.get("compilation_mode"), bool(cfg.get("enforce_eager")))


def graph_names(g: Graphs, performance_mode: str) -> list[str]:
    """CUDA-graph settings vLLM does not take, the modes given as command-line text
    (``-cc.cudagraph_mode=X``, ``-cc.mode=X``): vLLM's FlexibleArgumentParser json.loads
    a dotted argument's value (utils/argparse_utils.py), so digits arrive as an integer,
    other text as a string; config/compilation.py then takes a string by name only
    (validate_cudagraph_mode_before: CUDAGraphMode[value.upper()]; validate_mode_before:
    CompilationMode's names) and an integer by the enum's value (pydantic: CUDAGraphMode
    0-2, CompilationMode 0-3). Also an optimization level outside 0-3 (config/vllm.py
    OptimizationLevel), a performance_mode not one of its choices (PerformanceMode, a
    Literal: argparse choices)."""
    out = []
    if g.cudagraph_mode is not None and not _named(g.cudagraph_mode, CUDAGRAPH_MODES, 2):
        out.append(f"cudagraph_mode {g.cudagraph_mode!r} is not a CUDAGraphMode "
                   "(config/compilation.py validate_cudagraph_mode_before)")
    mode = g.compilation_mode
    if mode is not None and not _named(mode, COMPILATION_MODES, 3):
        out.append(f"compilation mode {mode!r} is not a CompilationMode "
                   "(config/compilation.py validate_mode_before)")
    if g.optimization_level is not None and not 0 <= g.optimization_level <= 3:
        out.append(f"optimization_level {g.optimization_level} is not 0-3 "
                   "(config/vllm.py OptimizationLevel)")
    if performance_mode not in PERFORMANCE_MODES:
        out.append(f"performance_mode {performance_mode!r} is not one of "
                   f"{PERFORMANCE_MODES} (config/vllm.py PerformanceMode)")
    return out


def _named(text: str, names: tuple[str, ...], top: int) -> bool:
    """Whether vLLM takes the command-line ``text`` for an enum of ``names`` with values
    0..``top``: an integer as json.loads reads it (an int, not a bool) in range, else
    text that names a member in any case."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text.upper() in names
    if isinstance(value, int) and not isinstance(value, bool):
        return 0 <= value <= top
    return isinstance(value, str) and value.upper() in names


def _captures(g: Graphs) -> bool:
    """Whether vLLM captures CUDA graphs (VllmConfig.__post_init__): not with
    enforce_eager; the mode given, else the level's (NONE at -O0, PIECEWISE at -O1,
    FULL_AND_PIECEWISE above); without VLLM_COMPILE (the default above -O0) a mode's
    piecewise graphs are dropped (_normalize_piecewise_cudagraph_mode), so PIECEWISE
    becomes NONE."""
    level = 2 if g.optimization_level is None else g.optimization_level
    mode = (g.cudagraph_mode or ("NONE", "PIECEWISE", "FULL_AND_PIECEWISE")[min(level, 2)])
    mode = CUDAGRAPH_MODES[int(mode)] if mode.isdigit() else mode.upper()
    compilation = (g.compilation_mode or ("VLLM_COMPILE" if level > 0 else "NONE")).upper()
    compiled = compilation in ("VLLM_COMPILE", "3")
    return not g.enforce_eager and mode != "NONE" and (compiled or mode != "PIECEWISE")


def capture_sizes(g: Graphs, policy: str, seqs: int, budget: int,
                   gpu_name: str) -> list[str]:
    """_set_cudagraph_sizes' checks where vLLM captures graphs (_captures), for the
    policies that are vLLM's, with ``seqs`` sequences and a ``budget`` of tokens on the
    GPU ``gpu_name``: the largest size, min(max_num_batched_tokens, the given
    maximum or min(2 x max_num_seqs, 512 or 1,024 on compute capability 10.x)), must be
    at least 1 (an assert); a given list must not be empty (an assert) and, with a
    maximum given too, have the maximum as its largest size up to the budget (ValueError:
    "should be consistent")."""
    if policy not in ("chunked", "continuous") or not _captures(g):
        return []
    default = 1024 if gpu_name == "b200" else 512
    largest = min(budget, min(2 * seqs, default) if g.max_capture_size is None
                  else g.max_capture_size)
    out = []
    if largest < 1:
        out.append(f"largest capture size {largest} < 1 ({SET_CUDAGRAPH_SIZES} assert)")
    if g.capture_sizes is not None and not g.capture_sizes:
        out.append(f"cudagraph_capture_sizes empty ({SET_CUDAGRAPH_SIZES} assert)")
    elif g.capture_sizes is not None and g.max_capture_size is not None:
        kept = [n for n in g.capture_sizes if n <= budget]
        if g.max_capture_size != max(kept, default=0):
            out.append(f"max_cudagraph_capture_size {g.max_capture_size} is not the largest "
                       f"of cudagraph_capture_sizes up to {budget} ({SET_CUDAGRAPH_SIZES})")
    return out
