"""The analytic roofline cost model: one engine step's time priced operator by operator from
FLOPs and bytes moved, at derated spec-sheet peaks of a ModelSpec on a GPUSpec. No
measurement, no torch.

    step_time = sum over operators of max(flops / achieved FLOP/s, bytes / achieved bytes/s)
                + all-reduce time (tensor parallel only)
                + step_overhead_s + per_seq_overhead_s * num_seqs

The operators run one after the other, so a step whose linear layers are compute-bound (a
prefill chunk) while its decodes' attention is memory-bound (long contexts) pays both, which
one max over the whole step would hide. The efficiency constants are chosen against the
published step latencies in tests/data/published_step_latencies.csv (benchmarks/
roofline_accuracy.py prints the error table; docs/fidelity.md keeps it). A run may set
each constant (servesim run --roofline-compute-efficiency, --roofline-memory-efficiency,
--roofline-step-overhead-s, --roofline-per-seq-overhead-s); config.json records the ones
that priced it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from calibration.gpus import GPUSpec
from calibration.specs import DTYPE_BYTES, ModelSpec
from sim.batch import BatchShape

DEFAULT_COMPUTE_EFFICIENCY = 0.75
"""Achieved / dense-peak GEMM throughput on a GPU whose GPUSpec.gemm_efficiency is None: the
middle of the A100 (0.70) and H100 (0.77) presets' figures. Those are read from public
operator profiles, not from the step latencies the other constants are checked against;
calibration/data/gpus.json carries each preset's with its source (gemm_efficiency_source)."""

DEFAULT_MEMORY_EFFICIENCY = 0.9
"""Achieved / peak DRAM bandwidth of a weight- and KV-streaming operator, fitted (with the two
overheads below) by calibration.published.fit_constants on the points of tests/data/
published_step_latencies.csv not held out; the top of the 80-90% a streaming read reaches
(calibration/data/gpus.json _readme, "caveat")."""

DEFAULT_STEP_OVERHEAD_S = 1.25e-3
"""Per-step time outside the GPU's operators that no overlap hides (scheduling, input
preparation, graph launch, output processing), fitted as above: the batch-1 decode steps of
vLLM 0.21-0.23 with CUDA graphs sit about 1-1.5 ms over the roofline of their weights."""

DEFAULT_PER_SEQ_OVERHEAD_S = 40e-6
"""Per-sequence time a step pays on top of its operators (sampling, per-request input
preparation and output processing): what makes a memory-bound decode step grow with batch
size beyond its KV reads. Fitted as above; the batch sweeps in the table show it (L4 ITL 5.5
-> 7.1 ms from 8 to 32 sequences, H100 TPOT 6.48 -> 6.59 ms from 1 to 4: 37-67 us a
sequence, of which the KV reads explain 0-16 us)."""


def gemm_efficiency(gpu: GPUSpec) -> float:
    """The compute efficiency the roofline takes on ``gpu`` when given none: its
    gemm_efficiency (a preset's measured one, or a spec file's), else
    DEFAULT_COMPUTE_EFFICIENCY."""
    if gpu.gemm_efficiency is None:
        return DEFAULT_COMPUTE_EFFICIENCY
    return gpu.gemm_efficiency


@dataclass(frozen=True, slots=True)
class _LinearOp:
    """One linear layer summed over the model's layers (per GPU): FLOPs and activation
    bytes per token; weight bytes read once per step, always (fixed) or of the routed
    experts the step's tokens touch (routed)."""

    flops_per_token: float
    fixed_weight_bytes: float
    routed_weight_bytes: float
    activation_bytes_per_token: float


@dataclass(frozen=True, slots=True)
class RooflineCostModel:
    """Roofline step time for ``model`` on ``gpu`` (seconds per engine step).

    Operators, each priced at max(FLOPs / (peak * compute efficiency), bytes / (bandwidth *
    memory efficiency)) and summed (T = num_prefill_tokens + num_decode_seqs):
      qkv, o, gate/up, down projections of every layer: 2 * params * T FLOPs; weights read
        once; each reads its input and writes its output per token. MoE experts (gate/up
        and down): 2 * k * params * T FLOPs, weights of the E * (1 - (1 - k/E)^T) distinct
        experts T tokens touch under uniform independent top-k routing (real routers are
        skewed, so fewer are touched); the router and norms ride with qkv's weights.
      LM head on the sampled rows only (as vLLM): 2 * vocab * hidden * num_sampled_seqs
        FLOPs, its weights read when a row is sampled.
      element-wise work (norms, rotary, activation, residual adds): memory-bound, the
        activation bytes above counted once more per token.
      prefill attention: 4 * layers * heads * head_dim * prefill_attention_pairs FLOPs;
        reads (prefill_context_tokens) and writes (num_prefill_tokens) KV.
      decode attention: 4 * layers * heads * head_dim * decode_context_tokens FLOPs; reads
        decode_context_tokens of KV and writes num_decode_seqs.
    plus step_overhead_s and per_seq_overhead_s * (prefill chunks + decodes).
    Weights are read at the bytes ModelSpec.weight_bytes_by_part gives (quantized where its
    quantization says); linear layers with FP8 weights and activations run at the GPU's FP8
    peak when it has one, every other format at the dtype's peak (weight-only int4 saves
    bytes; its dequantisation is not priced).
    compute_efficiency None takes the GPU's gemm_efficiency (GPUSpec), else
    DEFAULT_COMPUTE_EFFICIENCY. The embedding table is not read (a lookup reads T rows).
    Tensor parallel over N GPUs divides the sharded FLOPs and bytes by N and adds two ring
    all-reduces per layer of T * hidden * dtype bytes, each 2 (N-1)/N * bytes /
    interconnect bandwidth + interconnect latency, not overlapped; this needs the GPU's
    interconnect numbers (every preset carries them with sources, calibration/data/gpus.json),
    so a GPUSpec without them only runs tensor_parallel_size 1.
    An empty shape (no tokens) costs step_overhead_s.

    Raises ValueError naming the field: dtype not in DTYPE_BYTES, efficiencies outside (0, 1],
    overheads negative or not finite, tensor_parallel_size < 1 or not dividing the heads,
    tensor_parallel_size > 1 on a GPU without interconnect numbers.
    """

    model: ModelSpec
    gpu: GPUSpec
    dtype: str = "bf16"
    compute_efficiency: float | None = None
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    tensor_parallel_size: int = 1
    per_seq_overhead_s: float = DEFAULT_PER_SEQ_OVERHEAD_S
    # Per-GPU constants precomputed once so step_time is a few dozen float operations.
    _seconds_per_flop: float = field(init=False, repr=False, compare=False)
    _seconds_per_byte: float = field(init=False, repr=False, compare=False)
    # qkv, o, gate/up, down: (compute s per token, fixed and routed weight-read s,
    # activation s per token).
    _op_seconds: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _num_experts: int = field(init=False, repr=False, compare=False)
    _miss_fraction: float = field(init=False, repr=False, compare=False)
    _head_flops_per_row: float = field(init=False, repr=False, compare=False)
    _head_bytes: float = field(init=False, repr=False, compare=False)
    _elementwise_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _attention_flops_per_pair: float = field(init=False, repr=False, compare=False)
    _kv_bytes_per_token: float = field(init=False, repr=False, compare=False)
    _comm_seconds_per_token: float = field(init=False, repr=False, compare=False)
    _comm_seconds_fixed: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._validate()
        efficiency = self.compute_efficiency
        if efficiency is None:
            efficiency = gemm_efficiency(self.gpu)
        values: dict[str, object] = {
            "_seconds_per_flop": 1.0 / (self.gpu.peak_flops(self.dtype) * efficiency),
            "_seconds_per_byte": 1.0
            / (self.gpu.memory_bandwidth_bytes_per_s * self.memory_efficiency),
        }
        values.update(self._operator_constants(DTYPE_BYTES[self.dtype]))
        values.update(self._comm_constants(DTYPE_BYTES[self.dtype]))
        spf, spb = values["_seconds_per_flop"], values["_seconds_per_byte"]
        assert isinstance(spf, float) and isinstance(spb, float)
        q = self.model.quantization
        if (q is not None and q.weight_type == "float" and q.activation_bits == 8
                and self.gpu.fp8_flops is not None):
            # FP8 weights and activations (vLLM's fp8 and compressed-tensors W8A8-FP8) run
            # the linear layers on the FP8 tensor cores; other formats dequantise to dtype.
            spf = 1.0 / (self.gpu.fp8_flops * efficiency)
        ops = values.pop("_linear_ops")
        assert isinstance(ops, tuple)
        values["_op_seconds"] = tuple(
            x for op in ops for x in (op.flops_per_token * spf, op.fixed_weight_bytes * spb,
                                      op.routed_weight_bytes * spb,
                                      op.activation_bytes_per_token * spb))
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple[type[RooflineCostModel], tuple[object, ...]]:
        """Pickled as its arguments and rebuilt by __init__ (the derived constants are
        recomputed, the same numbers): a frozen class compiled by mypyc (setup.py) cannot
        have its fields set one by one, as the default unpickling does. Sweeps and
        window replays send cost models to worker processes."""
        return (type(self), tuple(getattr(self, f.name) for f in fields(self) if f.init))

    def _validate(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        for name in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        for name in ("step_overhead_s", "per_seq_overhead_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be >= 0 seconds, got {value}")
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

    def _operator_constants(self, dtype_bytes: int) -> dict[str, object]:
        """FLOPs and bytes of each operator, summed over layers and divided over the GPUs.
        Sizes come from the ModelSpec: its attention and MLP matrices (attention_linears,
        mlp_linears: GQA or MLA, dense and MoE layers, shared experts), its weight bytes by
        part (quantized as its quantization says) and KV bytes per token (its
        kv_cache_dtype)."""
        m, n = self.model, self.tensor_parallel_size
        layers, h, k = m.num_layers, m.hidden_size, m.num_experts_per_tok
        moe, dense = m.num_moe_layers, m.num_layers - m.num_moe_layers
        parts = m.weight_bytes_by_part(dtype_bytes)
        attn = m.attention_linears()
        qkv_params = sum(i * o for i, o, _ in attn[:-1])
        o_params = attn[-1][0] * attn[-1][1]
        attn_bytes = parts["attention"]
        qkv_share = qkv_params / (qkv_params + o_params)
        widths = ((dense, 1, m.intermediate_size), (moe, k, m.expert_intermediate_size),
                  (moe, 1, m.shared_expert_intermediate_size))
        mlp_flops = sum(count * per * 3 * h * width for count, per, width in widths)
        mlp_act = sum(count * per * (2 * h + 3 * width) for count, per, width in widths)
        act_fn = sum(count * per * 3 * width for count, per, width in widths)
        fixed_mlp = parts["dense_mlp"] + parts["shared_experts"]
        routed = parts["routed_experts"]

        def op(flops: float, fixed: float, touched: float, in_out_elems: float) -> _LinearOp:
            return _LinearOp(2.0 * flops / n, fixed / n, touched / n,
                             in_out_elems * dtype_bytes / n)

        q_dim = m.num_attention_heads * m.head_dim
        kv_dim = m.num_kv_heads * m.head_dim
        return {
            "_linear_ops": (
                op(layers * qkv_params,
                   attn_bytes * qkv_share + parts["router"] + parts["norms"], 0.0,
                   layers * (h + sum(o for _, o, _ in attn[:-1]))),
                op(layers * o_params, attn_bytes * (1.0 - qkv_share), 0.0,
                   layers * (attn[-1][0] + h)),
                # gate/up (2/3 of each MLP's weights) then down (1/3).
                op(mlp_flops * 2 / 3, fixed_mlp * 2 / 3, routed * 2 / 3, mlp_act * 2 / 3),
                op(mlp_flops / 3, fixed_mlp / 3, routed / 3, mlp_act / 3)),
            "_num_experts": m.num_experts,
            "_miss_fraction": 1.0 - k / m.num_experts,
            "_head_flops_per_row": 2.0 * m.lm_head_params / n,
            "_head_bytes": float(m.lm_head_params * dtype_bytes) / n,
            # Two RMSNorms (read + write h), rotary (q and k), SiLU * up (read 2f, write f),
            # two residual adds (read 2h, write h).
            "_elementwise_bytes_per_token": dtype_bytes / n * (
                layers * (10 * h + 2 * (q_dim + kv_dim)) + act_fn),
            "_attention_flops_per_pair": float(m.attention_flops_per_pair()) / n,
            "_kv_bytes_per_token": float(m.kv_bytes_per_token(dtype_bytes, n)),
        }

    def _comm_constants(self, dtype_bytes: int) -> dict[str, object]:
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

    def _token_time(self, tokens: int, sampled: int, seqs: int) -> float:
        """Seconds of everything but attention for a step of ``tokens`` tokens, ``sampled``
        LM-head rows and ``seqs`` sequences: linear layers, experts, LM head, element-wise
        work, all-reduces and the overheads (the hot path: plain float arithmetic)."""
        cq, bq, _, aq, co, bo, _, ao, cu, bu, ru, au, cd, bd, rd, ad = self._op_seconds
        touched = 1.0 - self._miss_fraction**tokens if self._num_experts > 1 else 1.0
        c1, b1 = cq * tokens, bq + aq * tokens
        c2, b2 = co * tokens, bo + ao * tokens
        c3, b3 = cu * tokens, bu + ru * touched + au * tokens
        c4, b4 = cd * tokens, bd + rd * touched + ad * tokens
        total = ((c1 if c1 > b1 else b1) + (c2 if c2 > b2 else b2)
                 + (c3 if c3 > b3 else b3) + (c4 if c4 > b4 else b4))
        spf, spb = self._seconds_per_flop, self._seconds_per_byte
        if sampled:
            c = self._head_flops_per_row * sampled * spf
            b = self._head_bytes * spb
            total += c if c > b else b
        total += self._elementwise_bytes_per_token * tokens * spb
        total += self._comm_seconds_per_token * tokens + self._comm_seconds_fixed
        return total + self.step_overhead_s + self.per_seq_overhead_s * seqs

    def _decode_attention_time(self, decode_context_tokens: int, num_decode_seqs: int) -> float:
        """Seconds of the decodes' attention: their keys' FLOPs against reading their KV
        (and writing one token each)."""
        c = self._attention_flops_per_pair * decode_context_tokens * self._seconds_per_flop
        b = self._kv_bytes_per_token * (decode_context_tokens + num_decode_seqs) \
            * self._seconds_per_byte
        return c if c > b else b

    def step_time(self, shape: BatchShape) -> float:
        """Seconds for one engine step of ``shape`` (see the class docstring)."""
        tokens = shape.num_prefill_tokens + shape.num_decode_seqs
        if tokens == 0:
            return self.step_overhead_s
        price = self._token_time(tokens, shape.num_sampled_seqs,
                                 shape.num_prefill_seqs + shape.num_decode_seqs)
        if shape.num_prefill_tokens:
            c = self._attention_flops_per_pair * shape.prefill_attention_pairs \
                * self._seconds_per_flop
            b = self._kv_bytes_per_token \
                * (shape.prefill_context_tokens + shape.num_prefill_tokens) \
                * self._seconds_per_byte
            price += c if c > b else b
        if shape.num_decode_seqs:
            price += self._decode_attention_time(shape.decode_context_tokens,
                                                 shape.num_decode_seqs)
        return price

    def chunk_run_times(self, num_tokens: int, has_output: bool, computed: int,
                        chunks: Sequence[int], num_group_decodes: int,
                        group_context_tokens: int, growth: int, start: float = 0.0,
                        until: float = math.inf) -> list[float]:
        """step_time of ``sim.batch.chunk_shape(num_tokens, has_output, c_j, n_j,
        num_group_decodes, group_context_tokens + j * growth)`` for each chunk ``n_j`` of
        ``chunks``, c_j the computed tokens before it (``computed`` before the first):
        the same arithmetic in the same order (bit-identical results), without a
        BatchShape per step. ``until`` stops as decode_run_times stops. The engine's
        chunk runs (sim/chunk_run.py) price their steps with it (this makes the model a
        ``sim.interface.BulkChunkPricer``)."""
        g = num_group_decodes
        if not g:  # chunk_shape counts the group's context only with its decodes
            group_context_tokens = growth = 0
        ctx = group_context_tokens
        token_times: dict[tuple[int, int], float] = {}  # equal chunks: equal token times
        out: list[float] = []
        c, t = computed, start
        for j, n in enumerate(chunks):
            if j and t >= until:
                break
            if n == 1 and has_output:  # priced as one more decode
                price = (self._token_time(1 + g, 1 + g, 1 + g)
                         + self._decode_attention_time(c + 1 + ctx, 1 + g))
            else:
                sampled = g + 1 if c + n >= num_tokens else g
                cached = token_times.get((n, sampled))
                if cached is None:
                    cached = token_times[n, sampled] = self._token_time(n + g, sampled, 1 + g)
                price = cached
                a = self._attention_flops_per_pair * (n * c + n * (n + 1) // 2) \
                    * self._seconds_per_flop
                b = self._kv_bytes_per_token * (c + n) * self._seconds_per_byte
                price += a if a > b else b
                if g:
                    price += self._decode_attention_time(ctx, g)
            out.append(price)
            t = t + price
            c += n
            ctx += growth
        return out

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
        base = (self._token_time(num_decode_seqs, num_sampled_seqs, num_decode_seqs)
                if num_decode_seqs else self.step_overhead_s)
        out: list[float] = []
        ctx = decode_context_tokens
        t = start
        for j in range(num_steps):
            if j and t >= until:
                break
            price = (base + self._decode_attention_time(ctx, num_decode_seqs)
                     if num_decode_seqs else base)
            out.append(price)
            t = t + price
            ctx += growth
        return out
