"""The composition root for ``servesim run``: resolve one RunConfig (flags > scenario >
defaults), build the workload, the KV plan, the cost model and the policy, simulate, and
write the run directory whole or not at all. The only module besides the CLI that imports
all four packages."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.memory import KVCachePlan, check_max_model_len, plan_for
from calibration.roofline import RooflineCostModel
from calibration.specs import DTYPE_BYTES, get_gpu, get_model
from policies.registry import get_policy_class
from scenarios.build import build_workload
from scenarios.workload import Workload
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel, CostModel
from sim.simulate import SimResult, simulate
from sim.source import ColumnArrivals

VERSION = "0.1.0"


@dataclass(frozen=True)
class RunConfig:
    """Everything a run depends on; written to config.json. None means "derive"."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100-sxm"
    dtype: str = "bf16"
    policy: str = "chunked"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_model_len: int | None = None
    num_gpu_blocks: int | None = None
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

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        for name in ("step_time", "slo_ttft", "slo_tpot"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number > 0 seconds, got {v}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass
class Prepared:
    """A resolved run, ready to simulate."""

    config: RunConfig
    scheduler: SchedulerConfig
    workload: Workload
    cost_model: CostModel
    num_gpu_blocks: int
    kv_plan: KVCachePlan | None
    cost_model_label: str


def prepare(cfg: RunConfig) -> Prepared:
    """Resolve presets, the workload, the KV capacity and the cost model.

    Raises ValueError (one line naming the field) or FileNotFoundError on bad input.
    """
    model = get_model(cfg.model)
    gpu = get_gpu(cfg.gpu)
    get_policy_class(cfg.policy)
    max_model_len = cfg.max_model_len or model.max_position_embeddings
    plan = plan_for(model, gpu, cfg.dtype, cfg.gpu_memory_utilization,
                    cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.block_size)
    if cfg.num_gpu_blocks is not None:
        num_blocks = cfg.num_gpu_blocks
        if num_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2, got {num_blocks}")
        # vLLM would refuse to start when max_model_len exceeds the pool; a simulator keeps
        # going and rejects each request that can never fit, with its reason.
    else:
        num_blocks = plan.num_gpu_blocks
        check_max_model_len(plan, max_model_len)
    sched = SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=max_model_len,
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        scheduler_reserve_full_isl=cfg.scheduler_reserve_full_isl,
    )
    workload = build_workload(
        trace=Path(cfg.trace) if cfg.trace else None, trace_format=cfg.trace_format,
        scenario=cfg.scenario, arrival=cfg.arrival, rate=cfg.rate,
        burstiness=cfg.burstiness, num_requests=cfg.num_requests, window_s=cfg.window,
        time_scale=cfg.time_scale, max_tokens=cfg.max_tokens, seed=cfg.seed,
    )
    cost, label = _cost_model(cfg, model, gpu)
    return Prepared(cfg, sched, workload, cost, num_blocks, plan, label)


def _cost_model(cfg: RunConfig, model: Any, gpu: Any) -> tuple[CostModel, str]:
    if cfg.step_time is not None:
        return ConstantCostModel(cfg.step_time), f"constant {cfg.step_time} s per step"
    if cfg.profile is not None:
        from calibration.profile import ProfileCostModel, load_profile

        prof = load_profile(cfg.profile)
        return ProfileCostModel(prof), f"profile {cfg.profile}"
    rl = RooflineCostModel(model, gpu, cfg.dtype)
    return rl, f"roofline {model.name} on {gpu.name} ({cfg.dtype})"


def simulate_prepared(
    prep: Prepared, progress: Callable[[int], None] | None = None
) -> SimResult:
    """Run the engine over the prepared workload; ``progress(num_done)`` is called about
    100 times over the workload's arrival span."""
    w = prep.workload
    arrivals = ColumnArrivals(w.arrival_time, w.num_prompt_tokens, w.output_len, w.max_tokens,
                              w.priority, w.request_id)
    span = float(w.arrival_time[-1] - w.arrival_time[0]) if len(w) else 0.0
    return simulate(
        arrivals, policy_factory=get_policy_class(prep.config.policy), config=prep.scheduler,
        cost_model=prep.cost_model, num_gpu_blocks=prep.num_gpu_blocks,
        block_size=prep.config.block_size, slo_ttft_s=prep.config.slo_ttft,
        slo_tpot_s=prep.config.slo_tpot, progress=progress,
        slice_s=span / 100 if span > 0 else math.inf,
    )


def resolved_config(prep: Prepared) -> dict[str, Any]:
    """config.json: the flags as resolved, plus what was derived from them."""
    out: dict[str, Any] = {"servesim_version": VERSION, **dataclasses.asdict(prep.config)}
    out["resolved"] = {
        "max_model_len": prep.scheduler.max_model_len,
        "num_gpu_blocks": prep.num_gpu_blocks,
        "kv_capacity_tokens": prep.num_gpu_blocks * prep.config.block_size,
        "cost_model": prep.cost_model_label,
        "workload": prep.workload.source,
        "num_requests": len(prep.workload),
        "kv_plan": dataclasses.asdict(prep.kv_plan) if prep.kv_plan else None,
    }
    return out


def write_run(out_dir: Path, prep: Prepared, result: SimResult) -> None:
    """Write requests.csv, steps.csv, summary.json and config.json into ``out_dir``,
    whole or not at all: files go to a temporary sibling directory that replaces
    ``out_dir`` only once every file is complete."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        result.requests.to_csv(tmp / "requests.csv", index=False)
        result.steps.to_csv(tmp / "steps.csv", index=False)
        (tmp / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(resolved_config(prep), indent=2) + "\n")
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
