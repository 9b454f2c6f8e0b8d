"""A run's settings: RunConfig (every field a run depends on, checked once at
construction: ranges, conflicting flags, the router and closed-loop fields), and
config.json's record of it (config_record). sim/app/runs/runner.py resolves what it
leaves to derive (None) and runs it."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from calibration.quantization import check_kv_cache_dtype, check_quantization_name
from calibration.specs import DTYPE_BYTES, ModelSpec
from policies.routers import ROUTERS, check_prefix_cache
from sim.app.runs.config_file import VLLM_DTYPES
from sim.app.runs.defaults import UNBUDGETED_POLICIES
from sim.app.runs.startup_checks import default_block_size, engine_platform
from sim.config import PREFIX_CACHE_MODES
from sim.latency_stats import check_slo_seconds

if TYPE_CHECKING:
    from calibration.profile import Profile

#: Host <-> GPU copy rate for swap preemption, GB/s: PCIe 4.0 x16 is 16 GT/s x 16 lanes
#: with 128b/130b encoding = 31.5 GB/s a direction (PCI-SIG PCIe 4.0 base specification);
#: about 25 GB/s is what pinned-memory copies reach in practice (CUDA bandwidthTest).
PCIE_BANDWIDTH_GB_S = 25.0

#: Most CPU swap space a run may give, GiB: 1 EiB, so that its bytes are an int64.
MAX_SWAP_SPACE_GIB = 1 << 30

#: Longest step time, think time or SLO a run takes, seconds (about 32 years): sums of
#: them over a run's steps and requests stay finite.
MAX_SECONDS = 1e9

#: 2**63: integer fields must fit an int64.
INT64 = 1 << 63

#: The model a run simulates when it names none and has no profile.
DEFAULT_MODEL = "llama-3.1-8b"


#: vLLM's --dtype auto is the checkpoint's torch_dtype, with float32 checkpoints served
#: in bf16: bf16 for every preset (their config.json files say bfloat16).
AUTO_DTYPE = "bf16"


@dataclass(frozen=True)
class RunConfig:
    """Everything a run depends on; written to config.json. None means "derive":
    max_num_seqs and max_num_batched_tokens as vLLM's API server sets them for the GPU
    (static batching has no token budget: it takes and records none), prefix_cache as
    vLLM does (sim/app/runs/defaults.py); model, resolved at construction, is the
    profile's model with a profile, else DEFAULT_MODEL; block_size, resolved at
    construction too, is the one vLLM picks on the run's engine when the user gives
    none (128 on vLLM's CPU engine, else 16: startup_checks.default_block_size).
    allow_long_max_model_len is vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    (sim/app/runs/startup_checks.py)."""

    model: str | None = None
    gpu: str = "h100-sxm"
    dtype: str = "bf16"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    policy: str = "chunked"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    block_size: int | None = None
    max_model_len: int | None = None
    allow_long_max_model_len: bool = False
    num_gpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    max_tokens: int | None = None
    step_time: float | None = None
    profile: str | None = None
    trace: str | None = None
    trace_format: str | None = None
    scenario: str | None = None
    arrival: str | None = None
    rate: float | None = None
    burstiness: float | None = None
    num_requests: int | None = None
    window: float | None = None
    time_scale: float | None = None
    seed: int = 0
    slo_ttft: float | None = None
    slo_tpot: float | None = None
    queue: str = "fcfs"
    preemption_mode: str = "recompute"
    kv_allocation: str = "paged"
    swap_space: float = 4.0
    pcie_bandwidth: float = PCIE_BANDWIDTH_GB_S
    tensor_parallel_size: int = 1
    replicas: int = 1
    router: str = "round-robin"
    concurrency: int | None = None
    think_time: float = 0.0
    trace_sample: bool = False
    prefix_cache: str | None = None

    def __post_init__(self) -> None:
        _check_conflicts(self)
        _check_int64(self)
        if self.model is None or self.block_size is None:
            _resolve_defaults(self)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.dtype == "auto" or self.dtype in VLLM_DTYPES:
            object.__setattr__(self, "dtype", VLLM_DTYPES.get(self.dtype, AUTO_DTYPE))
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)} (or vLLM's "
                             f"auto, {', '.join(VLLM_DTYPES)}), got {self.dtype!r}")
        check_quantization_name(self.quantization)
        check_kv_cache_dtype(self.kv_cache_dtype)
        if not 0 <= self.swap_space <= MAX_SWAP_SPACE_GIB:
            raise ValueError(f"swap_space must be a number of GiB in [0, {MAX_SWAP_SPACE_GIB}], "
                             f"got {self.swap_space}")
        if not (self.pcie_bandwidth > 0 and math.isfinite(self.pcie_bandwidth)):
            raise ValueError(f"pcie_bandwidth must be a finite number > 0 GB/s, got "
                             f"{self.pcie_bandwidth}")
        if self.step_time is not None and not 0 < self.step_time <= MAX_SECONDS:
            raise ValueError(f"step_time must be a number of seconds in (0, {MAX_SECONDS:g}], "
                             f"got {self.step_time}")
        check_slo_seconds("slo_ttft", self.slo_ttft)
        check_slo_seconds("slo_tpot", self.slo_tpot)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.trace is not None and not str(self.trace).strip():
            raise ValueError("trace must name a file, got an empty string")
        _check_scale_out(self)
        _check_prefix_cache(self)


def _check_conflicts(cfg: RunConfig) -> None:
    """Flags that contradict each other: ValueError naming both (--model against
    --profile needs the profile read, so prepare checks it: runner._model_spec)."""
    if cfg.step_time is not None and cfg.profile is not None:
        raise ValueError("--step-time and --profile name two cost models (a constant step "
                         "time, a calibrated profile): give one")
    if cfg.policy in UNBUDGETED_POLICIES and cfg.max_num_batched_tokens is not None:
        raise ValueError(
            f"max_num_batched_tokens: static batching has no token budget (it prefills a "
            f"whole batch in one step and decodes it to the end); --policy {cfg.policy} "
            f"takes no --max-num-batched-tokens (got {cfg.max_num_batched_tokens})")


def _resolve_defaults(cfg: RunConfig) -> None:
    """Set the model and the block size ``cfg`` leaves unset, from one read of its
    profile (a replace() keeps both): the profile's model, else DEFAULT_MODEL; the block
    size vLLM picks on the run's engine (startup_checks.default_block_size). ValueError
    naming the file for a bad profile."""
    profile = None if cfg.profile is None else _load_profile(cfg.profile)
    spec = None if profile is None else ModelSpec(**profile.model)
    if cfg.model is None:
        object.__setattr__(cfg, "model", DEFAULT_MODEL if spec is None else spec.name)
    if cfg.block_size is None:
        platform = engine_platform(cfg.step_time, profile)
        object.__setattr__(cfg, "block_size", default_block_size(platform, spec))


def _check_int64(cfg: RunConfig) -> None:
    """Every integer field fits the int64 columns and arrays the run keeps it in."""
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, int) and not isinstance(v, bool) and not -INT64 <= v < INT64:
            raise ValueError(f"{f.name} must be below 2**63, got {v}")


def with_policy(cfg: RunConfig, policy: str, **changes: Any) -> RunConfig:
    """``cfg`` under ``policy`` (and ``changes``); a policy without a token budget
    (static) takes none, so a budget given for the others is left out for it (compare's
    cells, diagram's panels)."""
    if policy in UNBUDGETED_POLICIES:
        changes["max_num_batched_tokens"] = None
    return dataclasses.replace(cfg, policy=policy, **changes)


def config_record(cfg: RunConfig) -> dict[str, Any]:
    """config.json's fields of ``cfg``: every field, but allow_long_max_model_len only
    when set (read back, its absence is False)."""
    out = dataclasses.asdict(cfg)
    if not cfg.allow_long_max_model_len:
        del out["allow_long_max_model_len"]
    return out


def _check_prefix_cache(cfg: RunConfig) -> None:
    """Validate prefix_cache against the policy (the scheduler config checks the queue
    and the KV allocation)."""
    if cfg.prefix_cache is None:
        return
    if cfg.prefix_cache not in PREFIX_CACHE_MODES:
        raise ValueError(f"prefix_cache must be one of {', '.join(PREFIX_CACHE_MODES)}, "
                         f"got {cfg.prefix_cache!r}")
    if cfg.prefix_cache == "none":
        return
    if cfg.policy == "static":
        raise ValueError("prefix_cache applies to iteration-level policies (chunked, "
                         "continuous): static batching pads and computes every prompt")


def check_router(cfg: RunConfig, prefix_cache: str | None = None) -> None:
    """Raise ValueError when the router needs what the run lacks: ``cache-aware`` routes
    by the replicas' prefix caches. Checked where a run's final config is known (a
    compare cell or a sweep cell may bring the cache), not in RunConfig itself; the rule
    is the router's (policies/routers.py check_prefix_cache, which its start applies).
    ``prefix_cache`` is the run's mode where known (its scheduler's), else the config's;
    a default (None) is decided with the workload (prepare), so it passes here."""
    mode = prefix_cache or cfg.prefix_cache
    if mode is not None:
        check_prefix_cache(cfg.router, mode != "none")


#: Most replicas one run simulates (each has its own engine, pool and records in memory).
MAX_REPLICAS = 1024


def _check_scale_out(cfg: RunConfig) -> None:
    """Validate the tensor-parallel, replica, router and closed-loop fields."""
    for name in ("tensor_parallel_size", "replicas"):
        v = getattr(cfg, name)
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    if cfg.replicas > MAX_REPLICAS:
        raise ValueError(f"replicas must be at most {MAX_REPLICAS} (every replica is "
                         f"simulated in this process, about 1 MB each), got {cfg.replicas}")
    if cfg.router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {cfg.router!r}")
    if cfg.concurrency is not None:
        if int(cfg.concurrency) != cfg.concurrency or cfg.concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {cfg.concurrency!r}")
        if cfg.rate is not None:
            raise ValueError("give rate (open loop) or concurrency (closed loop), not both")
        for name in ("arrival", "burstiness", "time_scale"):
            if getattr(cfg, name) is not None:
                raise ValueError(f"{name} shapes open-loop arrivals; closed-loop users "
                                 "(concurrency) send when their previous request ends")
    if not 0 <= cfg.think_time <= MAX_SECONDS:
        raise ValueError(f"think_time must be a number of seconds in [0, {MAX_SECONDS:g}], "
                         f"got {cfg.think_time}")
    if cfg.think_time > 0 and cfg.concurrency is None:
        raise ValueError("think_time applies only to closed-loop clients (concurrency)")


def _load_profile(path: str) -> Profile:
    from calibration.profile import load_profile

    return load_profile(path)
