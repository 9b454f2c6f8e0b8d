"""Config files, both ways: reading one into a command's option values (servesim's own
options in YAML or TOML, a vLLM ``serve --config`` YAML, or a run's config.json), and
config.json itself, the resolved config written into every run directory, which names its
trace by absolute path, size and sha256 so that ``servesim run --config DIR/config.json``
reproduces the run from any directory and says when the trace has changed since.

YAML needs PyYAML, imported only when a YAML file is read; TOML uses the standard
library's tomllib (Python 3.11+) or tomli."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.app.runs.cudagraph_settings import GRAPH_FIELDS, read_serve_keys
from sim.app.runs.cudagraph_settings import SERVE_KEYS as GRAPH_SERVE_KEYS

#: servesim's version: config.json's ``servesim_version`` and ``servesim --version``.
VERSION = "0.1.0"

#: config.json's keys that are records, not options.
RECORD_KEYS = ("servesim_version", "trace_bytes", "trace_sha256", "resolved")

#: vLLM's dtype names (``--dtype``) as servesim's; "auto" (the model's own) sets nothing.
VLLM_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
               "float": "fp32"}

#: Suffixes of vLLM's human-readable integers (vllm/utils/argparse_utils.py
#: human_readable_int, vLLM 0.32: lower case decimal, upper case binary).
_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class ConfigFile:
    """A config file as option values: ``values`` by option name; ``ignored`` the keys
    that no option of the command takes; ``notes`` how a vLLM value was read (a model
    name taken as a preset); ``trace_sha256`` and ``trace_bytes`` config.json's record of
    its trace (None elsewhere)."""

    path: Path
    values: dict[str, Any]
    ignored: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    trace_sha256: str | None = None
    trace_bytes: int | None = None


def read_config(path: Path | str, options: Collection[str]) -> ConfigFile:
    """Read ``path`` (.yaml/.yml, .toml or .json, a mapping at the top) into values of the
    ``options`` a command takes. Keys may use - or _. A run's config.json (it has
    ``servesim_version``) gives its fields, its nulls left to the defaults; any other file
    gives servesim's options by name, vLLM serve keys that mean the same (VLLM_KEYS) and
    vLLM's CUDA-graph keys (cudagraph_settings.SERVE_KEYS: compilation_config, ...).
    Raises ValueError (naming the file) for a missing parser, bad syntax or a value of no
    meaning here, OSError for a file that cannot be read."""
    path = Path(path)
    data = _load(path)
    if not isinstance(data, dict):
        raise ValueError(f"config {path}: expected a mapping of settings at the top, got "
                         f"{type(data).__name__}")
    if "servesim_version" in data:
        return _run_config(path, data, options)
    values: dict[str, Any] = {}
    ignored, notes = [], []
    graph_keys = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in GRAPH_SERVE_KEYS:
            graph_keys[name] = value
            continue
        if name in VLLM_KEYS:
            target, read = VLLM_KEYS[name]
            try:
                got = read(value)
            except (TypeError, ValueError) as e:
                raise ValueError(f"config {path}: {key}: {e}") from None
            if got is None:
                continue
            value, note = got
            if note:
                notes.append(note)
            name = target
        if name in options:
            values[name] = value
        else:
            ignored.append(str(key))
    if graph_keys:
        _graph_values(path, graph_keys, options, values, ignored)
    return ConfigFile(path, values, tuple(ignored), tuple(notes))


def _graph_values(path: Path, keys: dict[str, Any], options: Collection[str],
                  values: dict[str, Any], ignored: list[str]) -> None:
    """read_config's CUDA-graph keys (cudagraph_settings.read_serve_keys) added to its
    ``values`` and ``ignored``; a command that takes no CUDA-graph options (validate)
    ignores all of ``keys`` unread, so that one it cannot use never refuses its file."""
    if not all(f in options for f in GRAPH_FIELDS):
        ignored.extend(keys)
        return
    try:
        got, skipped = read_serve_keys(keys)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config {path}: {e}") from None
    values.update(got)
    ignored.extend(skipped)


def _run_config(path: Path, data: dict[str, Any], options: Collection[str]) -> ConfigFile:
    values = {k: v for k, v in data.items() if k in options and v is not None}
    ignored = tuple(k for k in data if k not in options and k not in RECORD_KEYS)
    return ConfigFile(path, values, ignored, (), data.get("trace_sha256"),
                      data.get("trace_bytes"))


def _load(path: Path) -> Any:
    """The file's data by its suffix."""
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml", ".yaml", ".yml"):
        raise ValueError(f"config {path}: expected a .yaml, .yml, .toml or .json file")
    text = path.read_text()
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"config {path}: not valid JSON ({e})") from None
    if suffix == ".toml":
        return _toml(path, text)
    try:
        import yaml
    except ImportError:
        raise ValueError(f"config {path}: reading YAML needs PyYAML "
                         "(pip install pyyaml)") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"config {path}: not valid YAML ({' '.join(str(e).split())})"
                         ) from None


def _toml(path: Path, text: str) -> Any:
    try:
        import tomllib as toml
    except ImportError:  # Python 3.10
        try:
            import tomli as toml
        except ImportError:
            raise ValueError(f"config {path}: reading TOML needs Python 3.11 or tomli "
                             "(pip install tomli)") from None
    try:
        return toml.loads(text)
    except toml.TOMLDecodeError as e:
        raise ValueError(f"config {path}: not valid TOML ({e})") from None


def _same(value: Any) -> tuple[Any, str] | None:
    return value, ""


def _integer(value: Any) -> tuple[Any, str] | None:
    """An integer, or vLLM's human-readable form ("32k" = 32,000, "32K" = 32,768)."""
    if not isinstance(value, str):
        return value, ""
    unit = _UNITS.get(value[-1:], 1)
    try:
        return int(float(value[:-1] if unit > 1 else value) * unit), ""
    except ValueError:
        raise ValueError(f"expected an integer (or vLLM's 32k, 32K), got {value!r}") from None


def _switch(on: str, off: str) -> Callable[[Any], tuple[Any, str] | None]:
    """A vLLM on/off key read as the option value ``on`` or ``off``."""
    def read(value: Any) -> tuple[Any, str] | None:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return (on if value else off), ""
    return read


def _dtype(value: Any) -> tuple[Any, str] | None:
    if value == "auto":
        return None
    return VLLM_DTYPES.get(str(value), value), ""


def _model(value: Any) -> tuple[Any, str] | None:
    """A local path (a HF config.json or snapshot directory), absolute; a Hugging Face
    repo id whose name is a preset's (``meta-llama/Llama-3.1-8B-Instruct`` ->
    llama-3.1-8b: the instruction-tuned model has the base model's shapes); else as
    given (the model option then says what it accepts)."""
    from calibration.specs import list_models

    text = str(value)
    if Path(text).exists():
        return str(Path(text).absolute()), ""
    name = text.rsplit("/", 1)[-1].lower()
    presets = set(list_models())
    for suffix in ("", "-instruct", "-chat", "-hf", "-base"):
        if suffix == "" or name.endswith(suffix):
            candidate = name[: len(name) - len(suffix)] if suffix else name
            if candidate in presets and candidate != text:
                return candidate, f"model {text} read as the preset {candidate}"
    return text, ""


#: vLLM serve keys that mean what a servesim option means (vLLM 0.32's EngineArgs, in
#: _ spelling): the option each sets and how its value reads. Others are ignored.
VLLM_KEYS: Mapping[str, tuple[str, Callable[[Any], tuple[Any, str] | None]]] = {
    "model": ("model", _model),
    "max_num_seqs": ("max_num_seqs", _integer),
    "max_num_batched_tokens": ("max_num_batched_tokens", _integer),
    "max_model_len": ("max_model_len", _integer),
    "gpu_memory_utilization": ("gpu_memory_utilization", _same),
    "block_size": ("block_size", _integer),
    "enable_prefix_caching": ("prefix_cache", _switch("block", "none")),
    "enable_chunked_prefill": ("policy", _switch("chunked", "continuous")),
    "tensor_parallel_size": ("tensor_parallel_size", _integer),
    "kv_cache_dtype": ("kv_cache_dtype", _same),
    "quantization": ("quantization", _same),
    "dtype": ("dtype", _dtype),
    "num_gpu_blocks_override": ("num_gpu_blocks", _integer),
    "long_prefill_token_threshold": ("long_prefill_token_threshold", _integer),
    "enforce_eager": ("enforce_eager", _same),
}


def file_digest(path: Path | str) -> tuple[int, str]:
    """The file's size in bytes and sha256 (hex)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def trace_change(cfg: ConfigFile, trace: str) -> str | None:
    """One line when ``trace``, as a run's config.json recorded it, is not the file it
    was (size or sha256), or is gone; None when it is the same or nothing was recorded."""
    if cfg.trace_sha256 is None:
        return None
    try:
        size, sha = file_digest(trace)
    except OSError:
        return f"trace {trace}, recorded in {cfg.path}, cannot be read"
    if sha == cfg.trace_sha256:
        return None
    return (f"trace {trace} changed since {cfg.path} was written ({cfg.trace_bytes} -> "
            f"{size} bytes, sha256 {cfg.trace_sha256[:12]}... -> {sha[:12]}...): the run "
            "will not reproduce it")


def absolute_paths(trace: str | None, profile: str | None, policy: str, model: str,
                   gpu: str) -> dict[str, Any]:
    """The run's files as absolute paths, by RunConfig field, so that config.json names
    the same files from any directory: the trace and the profile; the file of a
    ``path/to/file.py:Class`` policy; a model that is a path (a HF config.json or its
    folder; a preset name wins over a same-named folder, as calibration/hf_config.py
    resolves it); a GPU spec file. Names that are not paths stay as they are."""
    from calibration.gpus import SPEC_FILE_SUFFIXES
    from calibration.specs import list_models

    out: dict[str, Any] = {"trace": _absolute(trace), "profile": _absolute(profile)}
    module, _, cls = policy.rpartition(":")
    if module.endswith(".py"):
        out["policy"] = f"{_absolute(module)}:{cls}"
    if model.lower() not in list_models() and Path(model).exists():
        out["model"] = _absolute(model)
    if gpu.lower().endswith(SPEC_FILE_SUFFIXES):
        out["gpu"] = _absolute(gpu)
    return out


def _absolute(path: str | None) -> str | None:
    return None if path is None else str(Path(path).absolute())


def trace_record(trace: str | None) -> dict[str, Any]:
    """config.json's record of the trace file: ``trace_bytes`` and ``trace_sha256``
    (None without a trace)."""
    size, sha = file_digest(trace) if trace is not None else (None, None)
    return {"trace_bytes": size, "trace_sha256": sha}
