"""GPU specifications: the GPUSpec record (spec-sheet memory, bandwidth, peak FLOP/s,
interconnect) and the GPU presets carried in calibration/data/gpus.json with their sources.

Sizes are in bytes, rates in FLOP/s and bytes/s, times in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from calibration.specs import DTYPE_BYTES, GIB, load_data, require_positive


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One GPU's spec-sheet numbers.

    memory_bytes: capacity (the vendor label in GiB; the driver reports a little less, e.g.
      79.22 GiB on an H100 80GB). memory_bandwidth_bytes_per_s: vendor peak DRAM bandwidth.
    bf16_flops / fp16_flops: dense tensor-core peak with FP32 accumulate (no 2:4 sparsity);
    fp32_flops: non-tensor FP32. interconnect_bandwidth_bytes_per_s: per-GPU all-reduce (bus)
    bandwidth, i.e. one direction of the GPU's links (half the vendor's bidirectional NVLink or
    PCIe total); interconnect_latency_s: fixed cost per all-reduce; both None unless sourced
    (the presets carry them, with sources, in calibration/data/gpus.json).
    Raises ValueError naming the field for non-positive numbers.
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

    def __post_init__(self) -> None:
        require_positive(
            "GPUSpec",
            memory_bytes=self.memory_bytes,
            memory_bandwidth_bytes_per_s=self.memory_bandwidth_bytes_per_s,
            bf16_flops=self.bf16_flops,
            fp16_flops=self.fp16_flops,
            fp32_flops=self.fp32_flops,
        )
        if self.interconnect_bandwidth_bytes_per_s is not None:
            require_positive(
                "GPUSpec",
                interconnect_bandwidth_bytes_per_s=self.interconnect_bandwidth_bytes_per_s,
            )
        if self.interconnect_latency_s is not None and self.interconnect_latency_s < 0:
            raise ValueError(
                f"GPUSpec.interconnect_latency_s must be >= 0, got {self.interconnect_latency_s}"
            )

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for "bf16", "fp16" or "fp32"; ValueError naming dtype otherwise."""
        if dtype == "bf16":
            return self.bf16_flops
        if dtype == "fp16":
            return self.fp16_flops
        if dtype == "fp32":
            return self.fp32_flops
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")


def _scaled(entry: Mapping[str, Any], key: str, unit: float) -> float | None:
    """entry[key] in base units (unit = 1e9 for GB/s, 1e-6 for us), or None when the
    preset carries no such figure. Small units divide, so 10 us is exactly 1e-05 s."""
    value = entry.get(key)
    if value is None:
        return None
    return float(value) * unit if unit >= 1 else float(value) / round(1 / unit)


def _gpu_presets() -> tuple[Mapping[str, GPUSpec], Mapping[str, str]]:
    """(specs by name, alias -> name)."""
    specs: dict[str, GPUSpec] = {}
    aliases: dict[str, str] = {}
    for entry in load_data("gpus.json")["gpus"]:
        name = entry["name"]
        specs[name] = GPUSpec(
            name=name,
            memory_bytes=round(entry["memory_gib"] * GIB),
            memory_bandwidth_bytes_per_s=entry["memory_bandwidth_gb_s"] * 1e9,
            bf16_flops=entry["bf16_tensor_dense_tflops"] * 1e12,
            fp16_flops=entry["fp16_tensor_dense_tflops"] * 1e12,
            fp32_flops=entry["fp32_tflops"] * 1e12,
            interconnect_bandwidth_bytes_per_s=_scaled(entry, "interconnect_bandwidth_gb_s", 1e9),
            interconnect_latency_s=_scaled(entry, "interconnect_latency_us", 1e-6),  # us -> s
            source=entry["source"],
        )
        aliases.update({alias: name for alias in entry["aliases"]})
    return MappingProxyType(specs), MappingProxyType(aliases)


def list_gpus() -> list[str]:
    """Preset GPU names (aliases excluded), in the order of calibration/data/gpus.json."""
    return list(_gpu_presets()[0])


def get_gpu(name: str) -> GPUSpec:
    """The preset called ``name`` or one of its aliases (case-insensitive, e.g.
    "a100-80gb-sxm"); ValueError listing the known ones."""
    specs, aliases = _gpu_presets()
    key = name.lower()
    spec = specs.get(aliases.get(key, key))
    if spec is None:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(specs)}")
    return spec
