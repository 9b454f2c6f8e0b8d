"""The device a run's steps are priced for and its KV cache sized on: a GPU (a preset or a
GPU spec file, ``--gpu``), or the CPU a calibration profile was measured on.

A profile's step costs are its device's, so the device is the profile's unless ``--gpu``
names it: ``cpu`` for a profile measured on a CPU (the profile records no GPU), the one
GPU preset whose chip the profile's CUDA device name names (``NVIDIA L4`` is ``l4``), and a
``--gpu`` that contradicts the profile is refused. On the CPU the KV cache is the one the
profile was measured with (its ``memory.kv_cache_bytes``: for vLLM's CPU engine the
``kv_cache_memory_bytes`` it was given, as VLLM_CPU_KVCACHE_SPACE sets it), unless
``--kv-cache-memory`` or ``--num-gpu-blocks`` sizes it; ``gpu_memory_utilization`` does
not apply there (vLLM's CPU engine budgets the host's memory, which no profile records).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from calibration.gpus import SPEC_FILE_SUFFIXES, GPUSpec, get_gpu, list_gpus

if TYPE_CHECKING:
    from calibration.profile import MeasuredRange, Profile
    from scenarios.workload import Workload
    from sim.config import SchedulerConfig

#: The GPU a run without a profile is priced on.
DEFAULT_GPU = "h100-sxm"

#: ``--gpu``'s name for the CPU a profile was measured on.
CPU_DEVICE = "cpu"

#: Largest KV cache a run on a profile's CPU may give, bytes: vLLM's CPU engine refuses a
#: cache above its NUMA node's available memory (vllm/v1/worker/cpu_worker.py
#: ``determine_available_memory``), which no profile records; 6 TiB is the most one CPU
#: socket addresses (AMD EPYC 9004: 12 channels x 2 DIMMs x 256 GB).
CPU_MAX_KV_BYTES = 6 << 40


def chip(gpu_name: str) -> str:
    """A GPU preset's chip as a device name spells it: the name's first part, upper case
    (``h100-sxm`` -> ``H100``), with a GeForce board's number (``rtx-4090`` -> ``RTX4090``)."""
    parts = gpu_name.upper().split("-")
    return parts[0] + parts[1] if parts[0] == "RTX" and len(parts) > 1 else parts[0]


def device_gpus(device_name: str) -> tuple[str, ...]:
    """The GPU presets whose chip ``device_name`` (as torch.cuda.get_device_name writes it:
    ``NVIDIA H100 80GB HBM3``, ``NVIDIA GeForce RTX 4090``) names as one of its words;
    where the name also gives the memory (``40GB``) only the presets of that size, and
    the PCIe board only where it says PCIe (torch names an SXM part by its memory:
    ``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-SXM4-40GB``)."""
    words = set(re.split(r"[\s_-]+", re.sub(r"RTX[\s_-]*", "RTX", device_name.upper())))
    found = [g for g in list_gpus() if chip(g) in words]
    sizes = {int(w[:-2]) for w in words if re.fullmatch(r"\d+GB", w)}
    if sizes:
        # Within 3%: torch's name rounds to the label (141GB on a 140 GiB H200 preset).
        found = [g for g in found if any(abs(get_gpu(g).memory_bytes / (1 << 30) - gb)
                                         <= 0.03 * gb for gb in sizes)]
    pcie = [g for g in found if "PCIE" in g.upper()]
    if pcie and len(pcie) < len(found):
        found = pcie if "PCIE" in words else [g for g in found if g not in pcie]
    return tuple(found)


def default_device(profile: Profile | None, path: str | None) -> str:
    """``--gpu`` when none is given: DEFAULT_GPU without a profile; with the profile at
    ``path``, its device: CPU_DEVICE for a CPU, else the one preset device_gpus finds.
    Raises ValueError naming --gpu when no preset or several name the profile's GPU."""
    if profile is None:
        return DEFAULT_GPU
    if profile.device == CPU_DEVICE:
        return CPU_DEVICE
    found = device_gpus(profile.device_name)
    if len(found) == 1:
        return found[0]
    which = (f"one of {', '.join(found)}" if found
             else "a GPU spec file for it (no preset names it)")
    raise ValueError(f"--profile {path} was measured on {profile.device_name}: give --gpu "
                     f"{which}; the GPU sizes the KV cache")


def run_device(gpu: str, profile: Profile | None, path: str | None) -> GPUSpec | None:
    """The GPUSpec of ``--gpu`` (None: the profile's CPU). Raises ValueError naming
    --gpu and --profile when they contradict: a CPU profile on a GPU, a GPU profile on
    the CPU, a preset whose chip is not the profile's GPU (a spec file is taken as the
    user's description of it); --gpu cpu without a CPU profile."""
    if profile is None or profile.device != CPU_DEVICE:
        if gpu == CPU_DEVICE:
            where = ("no --profile" if profile is None
                     else f"--profile {path}, measured on {profile.device_name}")
            raise ValueError(f"--gpu {CPU_DEVICE} is the CPU a profile was measured on, "
                             f"and this run has {where}: give a GPU preset or spec file")
        spec = get_gpu(gpu)
        if profile is None or gpu.lower().endswith(SPEC_FILE_SUFFIXES):
            return spec
        found = device_gpus(profile.device_name)
        if spec.name not in found:
            fix = " or ".join(found) or "a GPU spec file for it"
            raise ValueError(_conflict(gpu, profile, path) + f"; give --gpu {fix}")
        return spec
    if gpu != CPU_DEVICE:
        raise ValueError(_conflict(gpu, profile, path) + "; give no --gpu (the KV cache is "
                         "then the profile's: --kv-cache-memory or --num-gpu-blocks resizes it)")
    return None


def _conflict(gpu: str, profile: Profile, path: str | None) -> str:
    return (f"--gpu {gpu} conflicts with --profile {path}, measured on "
            f"{profile.device_name} ({profile.device}): its step costs are that device's")


def profile_kv_cache_bytes(profile: Profile, path: str | None) -> int:
    """The KV cache the profile was measured with, bytes (memory.kv_cache_bytes). Raises
    ValueError naming --kv-cache-memory when the profile records none."""
    value = profile.memory.get("kv_cache_bytes")
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise ValueError(f"--profile {path} records no KV cache size (memory.kv_cache_bytes "
                         f"{value!r}): give --kv-cache-memory or --num-gpu-blocks")
    return value


def check_cpu_pool(pool_bytes: int, option: str) -> None:
    """A KV cache sized by hand on a profile's CPU at most CPU_MAX_KV_BYTES; ValueError
    naming ``option`` otherwise."""
    if pool_bytes > CPU_MAX_KV_BYTES:
        raise ValueError(f"{option}: a KV cache of {pool_bytes / (1 << 30):,.2f} GiB is more "
                         f"than one CPU socket holds ({CPU_MAX_KV_BYTES >> 30:,} GiB); vLLM's "
                         "CPU engine refuses a cache above its node's available memory")


def range_warnings(measured: MeasuredRange | None, cfg: Any,
                   sched: SchedulerConfig, w: Workload) -> tuple[str, ...]:
    """The lines for a run (``cfg``, a RunConfig: run_config imports this module) whose
    limits or requests reach past its profile's measured range (none without a profile):
    a request counts when max_model_len admits its prompt and max_tokens, with its prompt
    and output tokens."""
    if measured is None:
        return ()
    import numpy as np  # here: the CLI's --help reads this module and needs no numpy

    assert cfg.max_num_seqs is not None, "prepare resolves the batch limits"
    ok = w.num_prompt_tokens + w.max_tokens <= sched.max_model_len
    tokens = (w.num_prompt_tokens + np.minimum(w.output_len, w.max_tokens))[ok]
    longest = int(tokens.max()) if len(tokens) else 0
    return tuple(measured.warnings(cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                   sched.max_model_len, longest))
