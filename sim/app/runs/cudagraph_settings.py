"""A run's CUDA-graph settings under vLLM's names (RunConfig's GRAPH_FIELDS and
performance_mode), each as given: read from a vLLM serve config's compilation keys
(``read_serve_keys``), checked once with the RunConfig (``check_graph_fields``), turned
into the CudaGraphConfig that settles the mode vLLM runs with and sizes the graphs'
memory (``run_cudagraph_config``, calibration/cuda_graphs.py), said where vLLM would
run another mode than the one given (``graph_notes``) and written back as vLLM serve
keys (``graph_serve_keys``). The mode is settled from all of them after the command
line has overridden the file, as vLLM settles its own. ``cfg`` below is a RunConfig
(typed Any: run_config imports this module)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from calibration.attention_backends import full_cudagraph_support
from calibration.cuda_graphs import CudaGraphConfig, compilation_mode_name, cudagraph_mode_name

#: RunConfig's CUDA-graph fields, vLLM's names (None: vLLM's default; config.json records
#: them only when set): compilation_config's cudagraph_mode, cudagraph_capture_sizes and
#: max_cudagraph_capture_size, the optimization level (-O) and compilation_config's
#: mode (compilation_mode). performance_mode, a RunConfig field too, has vLLM's default.
GRAPH_FIELDS = ("cudagraph_mode", "cudagraph_capture_sizes", "max_cudagraph_capture_size",
                "optimization_level", "compilation_mode")

#: RunConfig's mode fields, which vLLM takes by name or, as an integer, by value
#: (cuda_graphs.cudagraph_mode_name, compilation_mode_name).
MODE_FIELDS = ("cudagraph_mode", "compilation_mode")

#: The vLLM serve keys (vLLM 0.32's EngineArgs, in _ spelling) read here: the
#: compilation config (a mapping, or its JSON text as ``--compilation-config`` takes
#: it), the optimization level (``-O0`` .. ``-O3``) and the two capture-size arguments
#: vLLM also takes at the top (EngineArgs.create_engine_config copies them into the
#: compilation config). performance_mode is an option under vLLM's own name.
SERVE_KEYS = ("compilation_config", "optimization_level", "cudagraph_capture_sizes",
              "max_cudagraph_capture_size")

#: compilation_config's keys that change the graphs vLLM captures, and the RunConfig
#: field each sets; its others are named and ignored.
COMPILATION_KEYS = {"mode": "compilation_mode", "cudagraph_mode": "cudagraph_mode",
                    "cudagraph_capture_sizes": "cudagraph_capture_sizes",
                    "max_cudagraph_capture_size": "max_cudagraph_capture_size"}


def flag_mode(text: str) -> str | int:
    """A mode flag's text (MODE_FIELDS) as vLLM's command line passes it on: digits as
    the integer, which vLLM takes by value (``-cc.cudagraph_mode=1``: its
    FlexibleArgumentParser json.loads a dotted argument's value,
    vllm/utils/argparse_utils.py), other text as given, taken by name only. A config
    file's text is never read as digits, as vLLM's validators read none."""
    return int(text) if re.fullmatch(r"\s*-?\d+\s*", text) else text


def read_serve_keys(keys: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The RunConfig values (by field) and ignored keys of a vLLM serve config's
    SERVE_KEYS (``keys``, by _ name), each value as given, checked as vLLM reads it: the
    modes by name or value, the optimization level 0-3, a maximum capture size an
    integer (or its digits, as vLLM's pydantic and argparse take them), capture sizes a
    list of integers >= 1 (at the top also one integer: vLLM's YAML reader passes it as
    ``--cudagraph-capture-sizes N``; an empty list there is none, as that reader drops
    it). A capture-size key given both at the top and in compilation_config is refused
    as vLLM refuses it (EngineArgs.create_engine_config: "mutually exclusive"). Raises
    ValueError naming the key for a value vLLM does not take."""
    cc = _compilation_config(keys.get("compilation_config"))
    values: dict[str, Any] = {}
    for name in ("cudagraph_capture_sizes", "max_cudagraph_capture_size"):
        top, inner = keys.get(name), cc.get(name)
        if name == "cudagraph_capture_sizes" and top == []:
            top = None
        if top is not None and inner is not None:
            raise ValueError(f"{name} and compilation_config.{name} are mutually exclusive")
    readers: dict[str, Callable[[Any, str], Any]] = {
        "mode": compilation_mode_name, "cudagraph_mode": cudagraph_mode_name,
        "cudagraph_capture_sizes": _sizes, "max_cudagraph_capture_size": _integer}
    for key, field in COMPILATION_KEYS.items():
        if cc.get(key) is not None:
            values[field] = readers[key](cc[key], f"compilation_config.{key}")
    if keys.get("cudagraph_capture_sizes") not in (None, []):
        top = keys["cudagraph_capture_sizes"]
        values["cudagraph_capture_sizes"] = _sizes(top if isinstance(top, list) else [top],
                                                   "cudagraph_capture_sizes")
    for name, read in (("max_cudagraph_capture_size", _integer),
                       ("optimization_level", _level)):
        if keys.get(name) is not None:
            values[name] = read(keys[name], name)
    ignored = [f"compilation_config.{k}" for k in cc if k not in COMPILATION_KEYS]
    return values, ignored


def _compilation_config(value: Any) -> dict[str, Any]:
    """compilation_config as a mapping: vLLM's YAML mapping or its JSON text (what
    ``--compilation-config`` parses); {} when not given. ValueError otherwise."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"compilation_config: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"compilation_config must be a mapping or its JSON text, got {value!r}")
    return value


def _digits(value: Any) -> int | None:
    """An integer as vLLM reads one from a file: an int (not a bool) or its decimal
    digits; None for anything else."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _sizes(value: Any, key: str) -> list[int]:
    """A list of capture sizes, each an integer >= 1 (an empty list passes here:
    CudaGraphConfig refuses it only where graphs are captured)."""
    sizes = [_digits(n) for n in value] if isinstance(value, list) else None
    if sizes is None or any(n is None or n < 1 for n in sizes):
        raise ValueError(f"{key} must be a list of integers >= 1, got {value!r}")
    return [n for n in sizes if n is not None]


def _integer(value: Any, key: str) -> int:
    """max_cudagraph_capture_size: an integer (its range is CudaGraphConfig's check)."""
    n = _digits(value)
    if n is None:
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return n


def _level(value: Any, key: str) -> int:
    """vLLM's optimization level, 0-3 (an int, as ``--optimization-level`` parses it)."""
    n = _digits(value)
    if n is None or not 0 <= n <= 3:
        raise ValueError(f"{key} must be 0, 1, 2 or 3, got {value!r}")
    return n


def check_graph_fields(cfg: Any) -> None:
    """RunConfig's CUDA-graph fields, checked and normalized once, as CudaGraphConfig
    checks them with the run's enforce_eager (ValueError naming the field): the modes as
    their upper-case names; cudagraph_capture_sizes a tuple of integers (from a list, or
    text as the option takes it, "1,2,4,8")."""
    sizes = cfg.cudagraph_capture_sizes
    if isinstance(sizes, str):
        try:
            sizes = tuple(int(n) for n in sizes.replace(",", " ").split())
        except ValueError:
            raise ValueError(f"cudagraph_capture_sizes must be integers separated by commas, "
                             f"got {cfg.cudagraph_capture_sizes!r}") from None
    elif isinstance(sizes, list | tuple):
        sizes = tuple(sizes)
    elif sizes is not None:
        raise ValueError(f"cudagraph_capture_sizes must be a list of integers, got {sizes!r}")
    object.__setattr__(cfg, "cudagraph_capture_sizes", sizes)
    graphs = _config(cfg, cfg.enforce_eager)
    for name in ("cudagraph_mode", "compilation_mode", "cudagraph_capture_sizes"):
        object.__setattr__(cfg, name, getattr(graphs, name))


def _config(cfg: Any, enforce_eager: bool) -> CudaGraphConfig:
    return CudaGraphConfig(cfg.cudagraph_mode, cfg.cudagraph_capture_sizes,
                           cfg.max_cudagraph_capture_size, cfg.optimization_level,
                           cfg.compilation_mode, cfg.performance_mode, enforce_eager)


def run_cudagraph_config(cfg: Any) -> CudaGraphConfig | None:
    """The CUDA-graph settings ``cfg`` plans with; None with enforce_eager, which vLLM
    0.32 turns into cudagraph_mode NONE whatever else is given (VllmConfig.__post_init__)."""
    return None if cfg.enforce_eager else _config(cfg, False)


def graph_notes(cfg: Any, model: Any, gpu: Any) -> tuple[str, ...]:
    """What vLLM 0.32 warns of where it runs another cudagraph_mode than the one given
    (``model`` a ModelSpec, ``gpu`` the run's GPUSpec, None on a CPU): a given mode
    settled otherwise by the optimization level or compilation mode
    (CudaGraphConfig.mode), or FULL on a GPU (and for an MLA model, at a block size)
    whose attention backend takes full graphs of decode batches only
    (CudaGraphConfig.runtime_mode, full_cudagraph_support); none where no mode is
    given."""
    graphs = run_cudagraph_config(cfg)
    if graphs is None or graphs.cudagraph_mode is None or gpu is None:
        return ()
    mla = model.kv_lora_rank is not None
    nope, head = model.qk_nope_head_dim, model.attention_head_size
    mixed = full_cudagraph_support(gpu.name, mla, cfg.block_size, nope, head)
    mode = graphs.runtime_mode(mixed)
    if mode == graphs.cudagraph_mode:
        return ()
    if mode != graphs.mode:
        at = ("" if mixed is not False
              or not full_cudagraph_support(gpu.name, mla, None, nope, head)
              else f" at block_size {cfg.block_size}")  # only the block size stops it
        why = (f"the attention backend it picks on {gpu.name}{at} takes full CUDA graphs "
               "of uniform decode batches only: resolve_cudagraph_mode_and_sizes")
    else:
        why = (f"compilation mode {graphs.compilation} compiles no piecewise graph: "
               "_normalize_piecewise_cudagraph_mode")
    return (f"cudagraph_mode {graphs.cudagraph_mode} runs as {mode} in vLLM 0.32 ({why}); "
            "the KV plan follows it",)


def graph_serve_keys(cfg: Any) -> dict[str, Any]:
    """vLLM serve keys of ``cfg``'s CUDA-graph settings where given (none for vLLM's
    defaults), which read_serve_keys reads back to the same fields: compilation_config's
    cudagraph_mode and mode, and the top-level optimization_level,
    cudagraph_capture_sizes and max_cudagraph_capture_size (an empty list, which only a
    run without graphs has, is left out: vLLM's YAML reader drops it)."""
    keys: dict[str, Any] = {}
    compilation = {key: getattr(cfg, field) for key, field in COMPILATION_KEYS.items()
                   if field in ("cudagraph_mode", "compilation_mode")
                   and getattr(cfg, field) is not None}
    if compilation:
        keys["compilation_config"] = compilation
    for name in ("optimization_level", "cudagraph_capture_sizes",
                 "max_cudagraph_capture_size"):
        value = getattr(cfg, name)
        if value is not None and value != ():
            keys[name] = list(value) if isinstance(value, tuple) else value
    return keys
