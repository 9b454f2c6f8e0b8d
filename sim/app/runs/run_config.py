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
from scenarios.diurnal import check_amplitude
from sim.app.runs.config_file import VLLM_DTYPES
from sim.app.runs.cudagraph_settings import GRAPH_FIELDS, check_graph_fields
from sim.app.runs.defaults import UNBUDGETED_POLICIES
from sim.app.runs.device import default_device
from sim.app.runs.disagg_fields import DISAGG_FIELDS
from sim.app.runs.startup_checks import engine_platform, run_block_size
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
    none (128 on vLLM's CPU engine; for an MLA model on a GPU, its attention backend's;
    else 16: startup_checks.default_block_size).
    allow_long_max_model_len is vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    (sim/app/runs/startup_checks.py); trace_sample, decided with the workload, is on
    when a trace is re-timed (rate, arrival or burstiness given) and off when its own
    arrivals are replayed (sample_trace). gpu, resolved at construction, is the
    profile's device with a profile ("cpu" for a CPU: sim/app/runs/device.py), else
    h100-sxm; dtype, resolved at construction, is the profile's with a profile, else
    vLLM's auto (AUTO_DTYPE). The roofline_* fields set the roofline cost model's
    constants (None: its fitted ones, calibration/roofline.py); prepare records the
    values that priced a roofline run, and a run priced otherwise (profile, step_time)
    takes none. The GRAPH_FIELDS (cudagraph_mode, cudagraph_capture_sizes,
    max_cudagraph_capture_size, optimization_level, compilation_mode) and
    performance_mode are vLLM's settings as given (None: vLLM's;
    sim/app/runs/cudagraph_settings.py), which settle the CUDA graphs whose memory the
    KV plan deducts unless enforce_eager; performance_mode throughput also doubles the
    default batch limits (sim/app/runs/defaults.py)."""

    model: str | None = None
    gpu: str | None = None
    dtype: str | None = None
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
    enforce_eager: bool = False
    cudagraph_mode: str | None = None
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    max_cudagraph_capture_size: int | None = None
    optimization_level: int | None = None
    compilation_mode: str | None = None
    performance_mode: str = "balanced"
    max_tokens: int | None = None
    step_time: float | None = None
    profile: str | None = None
    roofline_compute_efficiency: float | None = None
    roofline_memory_efficiency: float | None = None
    roofline_step_overhead_s: float | None = None
    roofline_per_seq_overhead_s: float | None = None
    trace: str | None = None
    trace_format: str | None = None
    tokenizer: str | None = None
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
    trace_sample: bool | None = None
    prefix_cache: str | None = None
    diurnal_amplitude: float | None = None
    # Prefill/decode disaggregation (sim/app/runs/pools.py; None: an aggregated run).
    disagg: str | None = None
    kv_link: str | None = None
    kv_link_gbps: float | None = None
    kv_link_latency_us: float | None = None
    disagg_min_prompt_tokens: int | None = None
    prefill_max_num_seqs: int | None = None
    prefill_max_num_batched_tokens: int | None = None
    decode_max_num_seqs: int | None = None
    decode_max_num_batched_tokens: int | None = None
    prefill_gpu: str | None = None
    prefill_tensor_parallel_size: int | None = None
    prefill_gpu_memory_utilization: float | None = None
    decode_gpu: str | None = None
    decode_tensor_parallel_size: int | None = None
    decode_gpu_memory_utilization: float | None = None

    def __post_init__(self) -> None:
        _check_conflicts(self)
        _check_int64(self)
        if None in (self.model, self.block_size, self.gpu, self.dtype):
            _resolve_defaults(self)
        _check_roofline(self)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        check_quantization_name(self.quantization)
        check_kv_cache_dtype(self.kv_cache_dtype)
        check_graph_fields(self)
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
        if self.tokenizer is not None and self.trace is None:
            raise ValueError("tokenizer applies only with a trace (a ShareGPT file)")
        _check_scale_out(self)
        _check_prefix_cache(self)
        _check_diurnal(self)
        if self.disagg is not None or any(getattr(self, f) is not None for f in DISAGG_FIELDS):
            from sim.app.runs.pools import check_disagg

            check_disagg(self)

    @property
    def num_gpus(self) -> int:
        """GPUs the run serves on: replicas x TP, or its xPyD pools' (pools.pool_gpus)."""
        if self.disagg is None:
            return self.replicas * self.tensor_parallel_size
        from sim.app.runs.pools import pool_gpus

        return pool_gpus(self)


def dtype_name(dtype: str | None) -> str:
    """servesim's name (bf16, fp16, fp32) of a ``--dtype`` value, vLLM's names included
    (auto and None: AUTO_DTYPE). Raises ValueError naming the allowed values."""
    if dtype is None or dtype == "auto" or dtype in VLLM_DTYPES:
        return VLLM_DTYPES.get(dtype or "auto", AUTO_DTYPE)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)} (or vLLM's "
                         f"auto, {', '.join(VLLM_DTYPES)}), got {dtype!r}")
    return dtype


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
    """Set the model, the GPU, the dtype and the block size ``cfg`` leaves unset, from
    one read of its profile (a replace() keeps them): the profile's model, else
    DEFAULT_MODEL; the profile's device, else the default GPU (device.default_device);
    the profile's dtype, else AUTO_DTYPE; the block size vLLM
    picks on the run's engine, GPU and model (startup_checks.default_block_size; for an
    MLA model, its attention backend's). ValueError naming the
    file for a bad profile, or --gpu when no preset names the profile's GPU."""
    profile = None if cfg.profile is None else _load_profile(cfg.profile)
    spec = None if profile is None else ModelSpec(**profile.model)
    if cfg.model is None:
        object.__setattr__(cfg, "model", DEFAULT_MODEL if spec is None else spec.name)
    if cfg.gpu is None:
        object.__setattr__(cfg, "gpu", default_device(profile, cfg.profile))
    if cfg.dtype is None:
        object.__setattr__(cfg, "dtype", AUTO_DTYPE if profile is None else profile.dtype)
    if cfg.block_size is None:
        platform = engine_platform(cfg.step_time, profile)
        object.__setattr__(cfg, "block_size", run_block_size(cfg, platform, spec))


#: RunConfig's roofline fields and the calibration.roofline.RooflineCostModel arguments
#: they set.
ROOFLINE_FIELDS = {"roofline_compute_efficiency": "compute_efficiency",
                   "roofline_memory_efficiency": "memory_efficiency",
                   "roofline_step_overhead_s": "step_overhead_s",
                   "roofline_per_seq_overhead_s": "per_seq_overhead_s"}


def _check_roofline(cfg: RunConfig) -> None:
    """The roofline's constants: efficiencies fractions in (0, 1], overheads seconds in
    [0, MAX_SECONDS]; none with another cost model (profile, step_time), which they would
    not price. ValueError naming the field."""
    for name in ROOFLINE_FIELDS:
        v = getattr(cfg, name)
        if v is None:
            continue
        if name.endswith("_s"):
            if not 0 <= v <= MAX_SECONDS:
                raise ValueError(f"{name} must be a number of seconds in [0, "
                                 f"{MAX_SECONDS:g}], got {v}")
        elif not 0 < v <= 1:
            raise ValueError(f"{name} must be a fraction in (0, 1], got {v}")
        other = ("--profile" if cfg.profile is not None
                 else "--step-time" if cfg.step_time is not None else None)
        if other is not None:
            raise ValueError(f"--{name.replace('_', '-')} sets the roofline cost model, and "
                             f"{other} prices this run's steps instead: give one")


def _check_int64(cfg: RunConfig) -> None:
    """Every integer field fits the int64 columns and arrays the run keeps it in."""
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, int) and not isinstance(v, bool) and not -INT64 <= v < INT64:
            raise ValueError(f"{f.name} must be below 2**63, got {v}")


def sample_trace(cfg: RunConfig) -> bool:
    """Whether ``cfg``'s trace requests are drawn at random from the whole trace: the
    flag where given, else whenever the trace is re-timed (a steady-rate run should see
    the trace's whole mix, not its first minutes; a replay keeps its own order)."""
    if cfg.trace_sample is not None:
        return cfg.trace_sample
    retimed = cfg.rate is not None or cfg.arrival is not None or cfg.burstiness is not None
    return cfg.trace is not None and cfg.num_requests is not None and retimed


def with_policy(cfg: RunConfig, policy: str, **changes: Any) -> RunConfig:
    """``cfg`` under ``policy`` (and ``changes``); a policy without a token budget
    (static) takes none, so a budget given for the others is left out for it (compare's
    cells, diagram's panels)."""
    if policy in UNBUDGETED_POLICIES:
        changes["max_num_batched_tokens"] = None
    return dataclasses.replace(cfg, policy=policy, **changes)


def config_record(cfg: RunConfig) -> dict[str, Any]:
    """config.json's fields of ``cfg``: every field, but allow_long_max_model_len only
    when set (read back, its absence is False) and the roofline_* fields only when set
    (a run prepare resolved has them when the roofline priced it, and only then), and
    tokenizer and diurnal_amplitude only when set (only a ShareGPT trace needs the one,
    only the diurnal process the other), and the disaggregation and CUDA-graph fields
    only when set, performance_mode only when not vLLM's default (an aggregated run has
    none of the one; vLLM's own CUDA-graph settings need none of the other)."""
    out = dataclasses.asdict(cfg)
    if not cfg.allow_long_max_model_len:
        del out["allow_long_max_model_len"]
    if cfg.performance_mode == RunConfig.performance_mode:
        del out["performance_mode"]
    for name in (*ROOFLINE_FIELDS, "tokenizer", "diurnal_amplitude", "disagg",
                 *DISAGG_FIELDS, *GRAPH_FIELDS):
        if out[name] is None:
            del out[name]
    return out


def _check_diurnal(cfg: RunConfig) -> None:
    """diurnal_amplitude: a fraction in [0, 1], for arrival 'diurnal' only (ValueError
    naming the field)."""
    if cfg.diurnal_amplitude is None:
        return
    if cfg.arrival != "diurnal":
        raise ValueError(f"diurnal_amplitude applies to --arrival diurnal only, got "
                         f"arrival {cfg.arrival!r}")
    check_amplitude(cfg.diurnal_amplitude)


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
    # The default router needs no cache (tests/test_cli.py): its runs skip the import.
    if mode is not None and cfg.router != RunConfig.router:
        from policies.routers import check_prefix_cache

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
    if cfg.router != RunConfig.router:  # the default is a router (tests/test_cli.py)
        from policies.routers import ROUTERS

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
