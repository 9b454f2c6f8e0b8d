"""GPU specifications: the GPUSpec record (memory as the label and as the framework reports
it, bandwidth, dense peak FLOP/s per dtype, interconnect, measured GEMM efficiency), the GPU
presets carried in calibration/data/gpus.json with their sources, and GPU spec files (JSON,
TOML or YAML) a user writes for a GPU no preset names.

Sizes are in bytes, rates in FLOP/s and bytes/s, times in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from calibration.specs import GIB, load_data, require_positive

FLOPS_DTYPES = ("bf16", "fp16", "fp8", "fp32")
"""The dtypes GPUSpec.peak_flops answers for."""

SPEC_FILE_SUFFIXES = (".json", ".toml", ".yaml", ".yml")
"""GPU spec file formats: JSON, TOML through the standard library's tomllib (Python 3.11+),
YAML through PyYAML's safe_load (a dependency of servesim)."""

_REQUIRED_KEYS = (
    "memory_bandwidth_gb_s",
    "bf16_tensor_dense_tflops",
    "fp16_tensor_dense_tflops",
    "fp32_tflops",
)


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One GPU's spec-sheet numbers.

    memory_bytes: capacity on the vendor label (GiB for binary-sized parts).
    memory_bytes_reported: the total the framework reports for the device
      (torch.cuda.mem_get_info()[1], what vLLM budgets gpu_memory_utilization against), a
      little under the label (25,250,627,584 B = 23.52 GiB on a 24 GB RTX 4090, 79.22 GiB on
      an H100 80GB); None when no source gives it, and the label stands in (total_memory_bytes).
    memory_bandwidth_bytes_per_s: vendor peak DRAM bandwidth.
    bf16_flops / fp16_flops / fp8_flops: dense tensor-core peak with FP32 accumulate (no 2:4
      sparsity); fp8_flops None on GPUs without FP8 tensor cores (Ampere) or where no source
      was checked. fp32_flops: non-tensor FP32.
    interconnect_bandwidth_bytes_per_s: per-GPU all-reduce (bus) bandwidth, i.e. one direction
      of the GPU's links (half the vendor's bidirectional NVLink or PCIe total);
      interconnect_latency_s: fixed cost per all-reduce; both None unless sourced.
    gemm_efficiency: achieved / dense-peak bf16 GEMM throughput of a 7-8B Llama layer's four
      linear layers at 2,048 tokens, the compute efficiency the roofline prices this GPU at;
      None: the roofline's default (calibration.roofline.gemm_efficiency).
    non_torch_bytes / tp_non_torch_bytes: memory a single-GPU vLLM worker / one of a
      tensor-parallel group (NCCL and custom all-reduce buffers included) adds outside
      PyTorch's allocator in its profile run, where vLLM logs on this GPU's platform measured
      or imply it; None: calibration.memory's defaults.
    Raises ValueError naming the field for non-positive numbers, a gemm_efficiency outside
    (0, 1].
    """

    name: str
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    bf16_flops: float
    fp16_flops: float
    fp32_flops: float
    interconnect_bandwidth_bytes_per_s: float | None = None
    interconnect_latency_s: float | None = None
    source: str = ""
    fp8_flops: float | None = None
    memory_bytes_reported: int | None = None
    gemm_efficiency: float | None = None
    non_torch_bytes: int | None = None
    tp_non_torch_bytes: int | None = None

    def __post_init__(self) -> None:
        require_positive(
            "GPUSpec",
            memory_bytes=self.memory_bytes,
            memory_bandwidth_bytes_per_s=self.memory_bandwidth_bytes_per_s,
            bf16_flops=self.bf16_flops,
            fp16_flops=self.fp16_flops,
            fp32_flops=self.fp32_flops,
        )
        optional = {
            "interconnect_bandwidth_bytes_per_s": self.interconnect_bandwidth_bytes_per_s,
            "fp8_flops": self.fp8_flops,
            "memory_bytes_reported": self.memory_bytes_reported,
            "non_torch_bytes": self.non_torch_bytes,
            "tp_non_torch_bytes": self.tp_non_torch_bytes,
        }
        require_positive("GPUSpec", **{k: v for k, v in optional.items() if v is not None})
        if self.interconnect_latency_s is not None and self.interconnect_latency_s < 0:
            raise ValueError(
                f"GPUSpec.interconnect_latency_s must be >= 0, got {self.interconnect_latency_s}"
            )
        if self.gemm_efficiency is not None and not 0.0 < self.gemm_efficiency <= 1.0:
            raise ValueError(
                f"GPUSpec.gemm_efficiency must be in (0, 1], got {self.gemm_efficiency}"
            )

    @property
    def total_memory_bytes(self) -> int:
        """What vLLM budgets against: the reported total when known, else the label."""
        if self.memory_bytes_reported is not None:
            return self.memory_bytes_reported
        return self.memory_bytes

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for "bf16", "fp16", "fp8" or "fp32". ValueError naming dtype for
        another name, or for "fp8" on a GPU without an FP8 figure (no FP8 tensor cores)."""
        if dtype == "bf16":
            return self.bf16_flops
        if dtype == "fp16":
            return self.fp16_flops
        if dtype == "fp32":
            return self.fp32_flops
        if dtype == "fp8":
            if self.fp8_flops is None:
                raise ValueError(f"dtype 'fp8': GPU {self.name} has no FP8 tensor-core peak")
            return self.fp8_flops
        raise ValueError(f"dtype must be one of {', '.join(FLOPS_DTYPES)}, got {dtype!r}")


def _scaled(entry: Mapping[str, Any], key: str, unit: float) -> float | None:
    """entry[key] in base units (unit = 1e9 for GB/s, 1e12 for TFLOPS, 1e-6 for us), or None
    when the entry carries no such figure. Small units divide, so 10 us is exactly 1e-05 s."""
    value = entry.get(key)
    if value is None:
        return None
    return float(value) * unit if unit >= 1 else float(value) / round(1 / unit)


def _memory_bytes(entry: Mapping[str, Any], where: str) -> int:
    """The label capacity: memory_bytes, or memory_gib * 2**30."""
    if entry.get("memory_bytes") is not None:
        return int(entry["memory_bytes"])
    if entry.get("memory_gib") is not None:
        return round(float(entry["memory_gib"]) * GIB)
    raise ValueError(f"{where}: a GPU spec needs memory_gib or memory_bytes")


def spec_from_entry(entry: Mapping[str, Any], where: str = "GPU spec") -> GPUSpec:
    """A GPUSpec from one calibration/data/gpus.json entry or a spec file's mapping (the same
    keys; units in the key names: GiB, GB/s, TFLOPS, us). Raises ValueError naming ``where``
    and the missing keys, a value that is no number (a YAML true or date included), or the
    field of an invalid number."""
    missing = [k for k in ("name", *_REQUIRED_KEYS) if entry.get(k) is None]
    if missing:
        raise ValueError(f"{where}: missing keys: {', '.join(missing)}")
    bad = [k for k, v in entry.items() if k in _NUMERIC_KEYS and v is not None
           and not _reads_as_number(v)]
    if bad:
        raise ValueError(f"{where}: not a number: {', '.join(bad)}")
    try:
        return _spec(entry, where)
    except (TypeError, ValueError, OverflowError) as e:  # OverflowError: an infinite size
        raise ValueError(f"{where}: {e}") from None


def _reads_as_number(value: Any) -> bool:
    """A number, or a string that reads as one (not a bool, a date or a list)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


_NUMERIC_KEYS = frozenset((*_REQUIRED_KEYS, "memory_gib", "memory_bytes",
                           "memory_bytes_reported", "interconnect_bandwidth_gb_s",
                           "interconnect_latency_us", "fp8_tensor_dense_tflops",
                           "gemm_efficiency", "non_torch_gib", "tp_non_torch_gib"))
"""Spec keys whose values are numbers (a string of digits reads as one)."""


def _spec(entry: Mapping[str, Any], where: str) -> GPUSpec:
    """spec_from_entry's GPUSpec, its keys checked."""
    reported = entry.get("memory_bytes_reported")
    gemm = entry.get("gemm_efficiency")
    non_torch, tp_non_torch = entry.get("non_torch_gib"), entry.get("tp_non_torch_gib")
    return GPUSpec(
        name=str(entry["name"]),
        memory_bytes=_memory_bytes(entry, where),
        memory_bandwidth_bytes_per_s=float(entry["memory_bandwidth_gb_s"]) * 1e9,
        bf16_flops=float(entry["bf16_tensor_dense_tflops"]) * 1e12,
        fp16_flops=float(entry["fp16_tensor_dense_tflops"]) * 1e12,
        fp32_flops=float(entry["fp32_tflops"]) * 1e12,
        interconnect_bandwidth_bytes_per_s=_scaled(entry, "interconnect_bandwidth_gb_s", 1e9),
        interconnect_latency_s=_scaled(entry, "interconnect_latency_us", 1e-6),  # us -> s
        source=str(entry.get("source", where)),
        fp8_flops=_scaled(entry, "fp8_tensor_dense_tflops", 1e12),
        memory_bytes_reported=None if reported is None else int(reported),
        gemm_efficiency=None if gemm is None else float(gemm),
        non_torch_bytes=None if non_torch is None else round(float(non_torch) * GIB),
        tp_non_torch_bytes=None if tp_non_torch is None else round(float(tp_non_torch) * GIB),
    )


def _suffixes() -> str:
    """".json, .toml, .yaml or .yml"."""
    return f"{', '.join(SPEC_FILE_SUFFIXES[:-1])} or {SPEC_FILE_SUFFIXES[-1]}"


def _parse(file: Path, text: str) -> Any:
    """The document in ``text`` by ``file``'s suffix. The parsers are imported here, not at
    the top, so that ``servesim --help`` does not load them."""
    suffix = file.suffix.lower()
    try:
        if suffix == ".toml":
            import tomllib  # Python 3.11+; servesim itself supports 3.10

            return tomllib.loads(text)
        if suffix in (".yaml", ".yml"):
            import yaml

            try:
                return yaml.safe_load(text)
            except yaml.YAMLError as e:  # not a ValueError; its text spans lines
                raise ValueError(" ".join(str(e).split())) from e
        return json.loads(text)
    except (ValueError, ImportError) as e:
        raise ValueError(f"{file}: cannot read GPU spec: {e}") from e


def load_gpu_spec(path: str | Path) -> GPUSpec:
    """Read a GPU spec file: JSON, TOML or YAML holding one table with gpus.json's keys
    (name, memory_gib or memory_bytes, memory_bytes_reported, memory_bandwidth_gb_s,
    bf16/fp16/fp8_tensor_dense_tflops, fp32_tflops, interconnect_bandwidth_gb_s,
    interconnect_latency_us, gemm_efficiency, non_torch_gib, tp_non_torch_gib). Raises
    ValueError for a missing file, another suffix, a parse error, a document that is not a
    table or missing keys, naming the file."""
    file = Path(path)
    if file.suffix.lower() not in SPEC_FILE_SUFFIXES:
        raise ValueError(f"{file}: a GPU spec file must end in {_suffixes()}")
    if not file.is_file():
        raise ValueError(f"{file}: no such GPU spec file")
    data = _parse(file, file.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{file}: a GPU spec file holds one table of keys")
    return spec_from_entry({"name": file.stem, "source": f"GPU spec file {file}", **data},
                           str(file))


def _gpu_presets() -> tuple[Mapping[str, GPUSpec], Mapping[str, str]]:
    """(specs by name, alias -> name)."""
    specs: dict[str, GPUSpec] = {}
    aliases: dict[str, str] = {}
    for entry in load_data("gpus.json")["gpus"]:
        spec = spec_from_entry(entry, f"gpus.json entry {entry.get('name')!r}")
        specs[spec.name] = spec
        aliases.update({alias: spec.name for alias in entry["aliases"]})
    return MappingProxyType(specs), MappingProxyType(aliases)


def list_gpus() -> list[str]:
    """Preset GPU names (aliases excluded), in the order of calibration/data/gpus.json."""
    return list(_gpu_presets()[0])


def get_gpu(name: str) -> GPUSpec:
    """The preset called ``name`` or one of its aliases (case-insensitive, e.g.
    "a100-80gb-sxm"), or, when ``name`` ends in .json, .toml, .yaml or .yml, the spec file at
    that path (load_gpu_spec). ValueError listing the known presets otherwise."""
    if name.lower().endswith(SPEC_FILE_SUFFIXES):
        return load_gpu_spec(name)
    specs, aliases = _gpu_presets()
    key = name.lower()
    spec = specs.get(aliases.get(key, key))
    if spec is None:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(specs)} "
                         f"(or a {'/'.join(SPEC_FILE_SUFFIXES)} spec file)")
    return spec
