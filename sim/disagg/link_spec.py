"""One KV-link port's figures (``LinkSpec``) and the ``--kv-link`` presets (``KV_LINKS``)
with their sources: plain values, without SimPy, so the CLI can read them without
loading the engine (sim/disagg/link.py moves the bytes)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One port's figures: ``bandwidth_bytes_per_s`` (bytes/s a direction, > 0; inf for
    a link that moves any amount at once) and ``latency_s`` (s, >= 0, paid by every
    transfer before its bytes move). Raises ValueError naming the field out of range."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"kv_link bandwidth must be > 0 bytes/s, got "
                             f"{self.bandwidth_bytes_per_s!r}")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"kv_link latency must be a finite number >= 0 s, got "
                             f"{self.latency_s!r}")

    def transfer_time(self, num_bytes: float) -> float:
        """Seconds ``num_bytes`` take alone on the link: latency + bytes / bandwidth."""
        return self.latency_s + num_bytes / self.bandwidth_bytes_per_s


#: Gb/s -> bytes/s.
GBIT = 1e9 / 8

#: The --kv-link presets: one GPU's port in one direction, at line rate. Bandwidths are
#: the vendors' figures; latencies are nominal one-way figures for a KV read (set up and
#: first byte), not measurements: give --kv-link-latency-us for your fabric.
#: - nvlink: H100 SXM NVLink 4, 900 GB/s bidirectional = 450 GB/s a direction (NVIDIA H100
#:   Tensor Core GPU datasheet); 2 us.
#: - ib: one NDR InfiniBand port per GPU, 400 Gb/s (NVIDIA ConnectX-7 datasheet), as DGX
#:   H100 has (8 ConnectX-7 for 8 GPUs); 5 us.
#: - roce: 200 Gb/s RoCE v2 Ethernet per GPU (NVIDIA ConnectX-6 Dx datasheet); 10 us.
#: - tcp: 100 Gb/s Ethernet without RDMA (kernel TCP); 50 us.
KV_LINKS: dict[str, LinkSpec] = {
    "nvlink": LinkSpec("nvlink", 450e9, 2e-6),
    "ib": LinkSpec("ib", 400 * GBIT, 5e-6),
    "roce": LinkSpec("roce", 200 * GBIT, 10e-6),
    "tcp": LinkSpec("tcp", 100 * GBIT, 50e-6),
}

#: A link that moves any amount at once: 1P1D on it is an aggregated engine's timeline.
INSTANT_LINK = LinkSpec("instant", math.inf, 0.0)
