"""The analytic roofline cost model: one engine step's time from FLOPs and bytes moved, priced
at derated spec-sheet peaks of a ModelSpec on a GPUSpec. No measurement, no torch.

    step_time = max(flops / (peak_flops * compute_efficiency),
                    bytes / (bandwidth * memory_efficiency))
                + all-reduce time (tensor parallel only) + step_overhead_s
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from calibration.gpus import GPUSpec
from calibration.specs import DTYPE_BYTES, ModelSpec
from sim.batch import BatchShape

DEFAULT_COMPUTE_EFFICIENCY = 0.7
"""Achieved / dense-peak GEMM throughput: the middle of the 60-80% that large bf16 GEMMs
reach on these parts (calibration/data/gpus.json _readme, "caveat")."""

DEFAULT_MEMORY_EFFICIENCY = 0.85
"""Achieved / peak DRAM bandwidth: the middle of the 80-90% a streaming read reaches
(calibration/data/gpus.json _readme, "caveat")."""

DEFAULT_STEP_OVERHEAD_S = 2e-3
"""Per-step CPU time not hidden behind the GPU: scheduling, input preparation, kernel
launches, sampling and output processing. vLLM's own profiling of v0.5.3 (blog "vLLM v0.6.0:
2.7x Throughput Improvement and 5x Latency Reduction", 2024-09-05) found Llama-3-8B on one
H100 spending only 38% of the time on the GPU forward pass, with scheduling alone 29%; later
releases overlap much of it (async output processing, V1 engine). 2 ms is a round middle for
a step of a few ms; a fitted profile replaces it."""


@dataclass(frozen=True, slots=True)
class RooflineCostModel:
    """Roofline step time for ``model`` on ``gpu`` (seconds per engine step).

    FLOPs = 2 * (active linear params except the LM head) * num_tokens
          + 2 * LM-head params * num_sampled_seqs  (logits only for sampled rows, as vLLM)
          + 4 * layers * heads * head_dim * (prefill_attention_pairs + decode_context_tokens)
    Bytes = weights read once per step: all non-expert weights (the LM head only when a row
            is sampled; the embedding table not at all: a lookup reads num_tokens rows)
          + expert weights touched: MoE layers read E * (1 - (1 - k/E)^T) of their E experts,
            the expected number of distinct experts T tokens hit under uniform independent
            top-k routing (an approximation: real routers are skewed, so fewer are touched)
          + KV reads (decode_context_tokens + prefill_context_tokens) * kv bytes/token
          + KV writes num_tokens * kv bytes/token
          + activations: each of the four matmuls per layer (qkv, o, gate_up, down) reads its
            input and writes its output once per token.
    Tensor parallel over N GPUs divides the sharded FLOPs and bytes by N and adds two ring
    all-reduces per layer of num_tokens * hidden * dtype bytes, each
    2 (N-1)/N * bytes / interconnect bandwidth + interconnect latency, not overlapped.
    This needs the GPU's interconnect numbers: every preset carries them with sources
    (calibration/data/gpus.json; bandwidth is one direction of the GPU's NVLink or PCIe links);
    a GPUSpec without them only runs tensor_parallel_size 1.
    An empty shape (no tokens) costs step_overhead_s.

    Raises ValueError naming the field: dtype not in DTYPE_BYTES, efficiencies outside (0, 1],
    step_overhead_s negative or not finite, tensor_parallel_size < 1 or not dividing the heads,
    tensor_parallel_size > 1 on a GPU without interconnect numbers.
    """

    model: ModelSpec
    gpu: GPUSpec
    dtype: str = "bf16"
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    tensor_parallel_size: int = 1
    # Per-GPU constants precomputed once so step_time is a handful of float operations.
    _seconds_per_flop: float = field(init=False, repr=False, compare=False)
    _seconds_per_byte: float = field(init=False, repr=False, compare=False)
    _body_flops_per_token: float = field(init=False, repr=False, compare=False)
    _head_flops_per_row: float = field(init=False, repr=False, compare=False)
    _attention_flops_per_pair: float = field(init=False, repr=False, compare=False)
    _fixed_weight_bytes: float = field(init=False, repr=False, compare=False)
    _head_bytes: float = field(init=False, repr=False, compare=False)
    _expert_bytes: float = field(init=False, repr=False, compare=False)
    _num_experts: int = field(init=False, repr=False, compare=False)
    _miss_fraction: float = field(init=False, repr=False, compare=False)
    _kv_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _activation_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _comm_seconds_per_token: float = field(init=False, repr=False, compare=False)
    _comm_seconds_fixed: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._validate()
        m, n = self.model, self.tensor_parallel_size
        dtype_bytes = DTYPE_BYTES[self.dtype]
        body_params = m.num_active_params_per_token() - m.lm_head_params
        q_dim = m.num_attention_heads * m.head_dim
        experts_per_layer = m.num_experts * m.expert_params_per_layer
        fixed_params = (
            m.num_layers
            * (m.attention_params_per_layer + m.router_params_per_layer + m.norm_params_per_layer)
            + m.hidden_size
        )
        act_elems = m.num_layers * (
            4 * m.hidden_size
            + (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim
            + q_dim
            + 3 * m.num_experts_per_tok * m.intermediate_size
        )
        values = {
            "_seconds_per_flop": 1.0 / (self.gpu.peak_flops(self.dtype) * self.compute_efficiency),
            "_seconds_per_byte": 1.0
            / (self.gpu.memory_bandwidth_bytes_per_s * self.memory_efficiency),
            "_body_flops_per_token": 2.0 * body_params / n,
            "_head_flops_per_row": 2.0 * m.lm_head_params / n,
            "_attention_flops_per_pair": 4.0 * m.num_layers * q_dim / n,
            "_fixed_weight_bytes": float(fixed_params * dtype_bytes) / n,
            "_head_bytes": float(m.lm_head_params * dtype_bytes) / n,
            "_expert_bytes": float(m.num_layers * experts_per_layer * dtype_bytes) / n,
            "_num_experts": m.num_experts,
            "_miss_fraction": 1.0 - m.num_experts_per_tok / m.num_experts,
            "_kv_bytes_per_token": float(m.kv_bytes_per_token(dtype_bytes, n)),
            "_activation_bytes_per_token": float(act_elems * dtype_bytes) / n,
        }
        values.update(self._comm_constants(dtype_bytes))
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def _validate(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if not (math.isfinite(self.step_overhead_s) and self.step_overhead_s >= 0.0):
            raise ValueError(f"step_overhead_s must be >= 0 seconds, got {self.step_overhead_s}")
        self.model.check_tensor_parallel(self.tensor_parallel_size)
        if self.tensor_parallel_size > 1 and (
            self.gpu.interconnect_bandwidth_bytes_per_s is None
            or self.gpu.interconnect_latency_s is None
        ):
            raise ValueError(
                f"tensor_parallel_size {self.tensor_parallel_size} needs the GPU's "
                f"interconnect_bandwidth_bytes_per_s and interconnect_latency_s; {self.gpu.name} "
                "has none: give them with dataclasses.replace(gpu, ...)"
            )

    def _comm_constants(self, dtype_bytes: int) -> dict[str, float]:
        n = self.tensor_parallel_size
        bandwidth = self.gpu.interconnect_bandwidth_bytes_per_s
        latency = self.gpu.interconnect_latency_s
        if n == 1 or bandwidth is None or latency is None:
            return {"_comm_seconds_per_token": 0.0, "_comm_seconds_fixed": 0.0}
        all_reduces = 2 * self.model.num_layers
        ring_factor = 2.0 * (n - 1) / n
        bytes_per_token = self.model.hidden_size * dtype_bytes
        return {
            "_comm_seconds_per_token": all_reduces * ring_factor * bytes_per_token / bandwidth,
            "_comm_seconds_fixed": all_reduces * latency,
        }

    def decode_run_times(self, num_decode_seqs: int, num_sampled_seqs: int,
                         decode_context_tokens: int, growth: int, num_steps: int,
                         start: float = 0.0, until: float = math.inf) -> list[float]:
        """step_time of ``num_steps`` decode-only shapes whose decode_context_tokens start
        at ``decode_context_tokens`` and grow by ``growth`` a step: the same arithmetic in
        the same order (bit-identical results), without building a BatchShape per step.
        With ``until``, stops before the first step after the first that would start at
        or after ``until`` when the first starts at ``start`` (the steps run back to
        back). The engine's fast path prices its runs of steady decode steps with it
        (this makes the model a ``sim.interface.BulkDecodePricer``)."""
        tokens = num_decode_seqs
        if tokens == 0 or self._num_experts > 1:
            prices: list[float] = []
            t = start
            for j in range(num_steps):
                if j and t >= until:
                    break
                prices.append(self.step_time(BatchShape(
                    0, 0, 0, 0, tokens, decode_context_tokens + j * growth, num_sampled_seqs)))
                t = t + prices[-1]
            return prices
        sampled = num_sampled_seqs
        base_flops = self._body_flops_per_token * tokens + self._head_flops_per_row * sampled
        weight_bytes = self._fixed_weight_bytes + (self._head_bytes if sampled else 0.0)
        weight_bytes += self._expert_bytes
        attn, kvb = self._attention_flops_per_pair, self._kv_bytes_per_token
        act = self._activation_bytes_per_token * tokens
        spf, spb = self._seconds_per_flop, self._seconds_per_byte
        tail = self._comm_seconds_per_token * tokens + self._comm_seconds_fixed
        overhead = self.step_overhead_s
        out = []
        ctx = decode_context_tokens
        t = start
        for j in range(num_steps):
            if j and t >= until:
                break
            compute_s = (base_flops + attn * ctx) * spf
            memory_s = (weight_bytes + kvb * (ctx + tokens) + act) * spb
            price = (compute_s if compute_s > memory_s else memory_s) + tail + overhead
            out.append(price)
            t = t + price
            ctx += growth
        return out

    def step_time(self, shape: BatchShape) -> float:
        """Seconds for one engine step of ``shape`` (see the class docstring)."""
        tokens = shape.num_prefill_tokens + shape.num_decode_seqs
        if tokens == 0:
            return self.step_overhead_s
        sampled = shape.num_sampled_seqs
        flops = (
            self._body_flops_per_token * tokens
            + self._head_flops_per_row * sampled
            + self._attention_flops_per_pair
            * (shape.prefill_attention_pairs + shape.decode_context_tokens)
        )
        weight_bytes = self._fixed_weight_bytes + (self._head_bytes if sampled else 0.0)
        if self._num_experts > 1:
            touched = 1.0 - self._miss_fraction**tokens
            weight_bytes += self._expert_bytes * touched
        else:
            weight_bytes += self._expert_bytes
        kv_tokens = shape.decode_context_tokens + shape.prefill_context_tokens + tokens
        moved = (
            weight_bytes
            + self._kv_bytes_per_token * kv_tokens
            + self._activation_bytes_per_token * tokens
        )
        compute_s = flops * self._seconds_per_flop
        memory_s = moved * self._seconds_per_byte
        comm_s = self._comm_seconds_per_token * tokens + self._comm_seconds_fixed
        return (compute_s if compute_s > memory_s else memory_s) + comm_s + self.step_overhead_s
