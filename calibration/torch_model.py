"""A random-weight torch decoder built from a ModelSpec, for timing only.

Owns: the dtype/device names the calibration accepts, the slot KV cache (:class:`KVCache`),
the decoder modules (RMSNorm, rotary embedding, grouped-query attention, SwiGLU MLP or
top-k MoE, LM head) and :meth:`Decoder.step`, one engine step over a mix of decodes and
prefill chunks laid out as vLLM lays them out: all tokens flattened through the linear
layers, attention per sequence against its own cache.

Weights are random (normal, std 0.02, from a seeded ``torch.Generator``; no global RNG).
Dense kernels take the same time whatever the values in the matrices, so random weights
time the real architecture honestly; they only cost nothing to download. The one place
values matter is MoE routing (which experts get which tokens): a random router spreads
tokens roughly evenly, which real routers only approximate.

This module, calibration/measure.py and calibration/executor.py (real runs for
``servesim validate``) are the only importers of torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from calibration.specs import ModelSpec

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}


def resolve_dtype(name: str) -> torch.dtype:
    """Map "bf16" | "fp16" | "fp32" to a torch dtype; ValueError naming ``dtype`` else."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def resolve_device(name: str) -> torch.device:
    """Map "cpu" | "cuda" | "cuda:N" to a torch device; ValueError naming ``device`` when
    the name is unknown or CUDA is not available."""
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but torch sees no CUDA device")
    return torch.device(name)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One prefill chunk in a step: ``num_tokens`` new tokens for cache slot ``slot``,
    after the slot's current length (the prior context). ``sample``: the chunk ends its
    prompt, so its last position goes through the LM head."""

    slot: int
    num_tokens: int
    sample: bool = True


@dataclass(slots=True)
class KVCache:
    """Keys and values of every sequence in a step, one slot per sequence.

    k[layer], v[layer]: tensors of shape [num_slots, num_kv_heads, capacity, head_dim].
    lengths[slot]: tokens already cached for that slot (its context), <= capacity.
    Decodes use a contiguous run of slots so their keys are one strided view (no gather
    copy), the way a paged kernel reads blocks in place.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    lengths: list[int] = field(default_factory=list)

    @classmethod
    def allocate(cls, num_layers: int, num_kv_heads: int, head_dim: int, num_slots: int,
                 capacity: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        """Zeroed cache; ValueError naming the field when a size is < 1."""
        for name, val in (("num_layers", num_layers), ("num_slots", num_slots),
                          ("capacity", capacity)):
            if val < 1:
                raise ValueError(f"{name} must be >= 1, got {val}")
        shape = (num_slots, num_kv_heads, capacity, head_dim)
        k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        return cls(k, v, [0] * num_slots)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """[num_slots, num_kv_heads, capacity, head_dim] of each layer's K (and V)."""
        return tuple(self.k[0].shape)  # type: ignore[return-value]

    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


@dataclass(slots=True)
class _StepPlan:
    """Per-step index tensors, built once and shared by every layer."""

    positions: torch.Tensor  # [T] absolute position of each token
    decode_slots: list[int]
    # One attention call per group of consecutive decodes: (first row, rows, keys read per
    # decode = the group's max context + 1, [rows, 1, 1, keys] bool mask or None if uniform).
    decode_groups: list[tuple[int, int, int, torch.Tensor | None]]
    chunks: list[tuple[int, int, int, int, torch.Tensor | None]]  # slot, start, c, n, mask
    sample_rows: torch.Tensor  # [S] rows of the flattened batch that reach the LM head


def _normal(shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype,
            device: torch.device) -> nn.Parameter:
    t = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, 0.02, generator=gen)
    return nn.Parameter(t, requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device),
                                   requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on x [T, heads, D] with cos/sin [T, 1, D] (half-split layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query attention: fused QKV projection, rotary, SDPA per cache view."""

    def __init__(self, spec: ModelSpec, gen: torch.Generator, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.h, self.kv, self.d = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
        out = (self.h + 2 * self.kv) * self.d
        self.qkv_w = _normal((out, spec.hidden_size), gen, dtype, device)
        self.qkv_b = _normal((out,), gen, dtype, device) if spec.attention_bias else None
        self.o_w = _normal((spec.hidden_size, self.h * self.d), gen, dtype, device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kc: torch.Tensor, vc: torch.Tensor, plan: _StepPlan) -> torch.Tensor:
        t = x.shape[0]
        qkv = F.linear(x, self.qkv_w, self.qkv_b)
        q, k, v = qkv.split([self.h * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        q = _rotate(q.view(t, self.h, self.d), cos, sin)
        k = _rotate(k.view(t, self.kv, self.d), cos, sin)
        v = v.view(t, self.kv, self.d)
        out = torch.empty_like(q)
        b = len(plan.decode_slots)
        if b:
            first = plan.decode_slots[0]
            slots = torch.arange(first, first + b, device=x.device)
            kc[slots, :, plan.positions[:b]] = k[:b]
            vc[slots, :, plan.positions[:b]] = v[:b]
            # A decode's query heads that share a KV head go in as that head's query rows:
            # no causal mask is needed among them and no KV head is copied (enable_gqa is
            # several times slower for bf16 on CPU).
            qg = q[:b].view(b, self.kv, self.h // self.kv, self.d)
            for r, n, keys, mask in plan.decode_groups:
                s0 = first + r
                o = F.scaled_dot_product_attention(
                    qg[r:r + n], kc[s0:s0 + n, :, :keys], vc[s0:s0 + n, :, :keys],
                    attn_mask=mask)
                out[r:r + n] = o.reshape(n, self.h, self.d)
        for slot, start, c, n, mask in plan.chunks:
            kc[slot, :, c:c + n] = k[start:start + n].transpose(0, 1)
            vc[slot, :, c:c + n] = v[start:start + n].transpose(0, 1)
            qc = q[start:start + n].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qc, kc[slot:slot + 1, :, :c + n], vc[slot:slot + 1, :, :c + n],
                attn_mask=mask, is_causal=mask is None, enable_gqa=True)
            out[start:start + n] = o[0].transpose(0, 1)
        return F.linear(out.view(t, self.h * self.d), self.o_w)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); a top-k MoE of such experts when the spec
    has num_experts > 1 (router softmax, per-expert gather, weighted scatter-add)."""

    def __init__(self, spec: ModelSpec, gen: torch.Generator, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        hid, inter = spec.hidden_size, spec.intermediate_size
        self.num_experts = spec.num_experts if spec.num_experts > 1 else 0
        self.top_k = spec.num_experts_per_tok
        e = max(self.num_experts, 1)
        self.gate_up = _normal((e, 2 * inter, hid), gen, dtype, device)
        self.down = _normal((e, hid, inter), gen, dtype, device)
        self.router = _normal((e, hid), gen, dtype, device) if self.num_experts else None

    def _expert(self, x: torch.Tensor, i: int) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up[i]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down[i])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.router is None:
            return self._expert(x, 0)
        weights, experts = F.linear(x, self.router).softmax(-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for i in range(self.num_experts):
            rows, which = (experts == i).nonzero(as_tuple=True)
            if rows.numel():
                y = self._expert(x[rows], i) * weights[rows, which].unsqueeze(-1)
                out.index_add_(0, rows, y)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, gen: torch.Generator, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.norm_in = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.attn = Attention(spec, gen, dtype, device)
        self.norm_mlp = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.mlp = MLP(spec, gen, dtype, device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kc: torch.Tensor, vc: torch.Tensor, plan: _StepPlan) -> torch.Tensor:
        x = x + self.attn(self.norm_in(x), cos, sin, kc, vc, plan)
        return x + self.mlp(self.norm_mlp(x))


class Decoder(nn.Module):
    """Embedding -> layers -> final norm -> LM head (tied to the embedding when the spec
    says so). Build with :func:`build_decoder`; run with :meth:`step`."""

    def __init__(self, spec: ModelSpec, num_layers: int, dtype: torch.dtype,
                 device: torch.device, seed: int) -> None:
        super().__init__()
        gen = torch.Generator(device=device).manual_seed(seed)
        self.spec, self.dtype, self.device = spec, dtype, device
        self.embed = _normal((spec.vocab_size, spec.hidden_size), gen, dtype, device)
        self.layers = nn.ModuleList(DecoderLayer(spec, gen, dtype, device)
                                    for _ in range(num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.lm_head = (self.embed if spec.tie_word_embeddings
                        else _normal((spec.vocab_size, spec.hidden_size), gen, dtype, device))
        half = torch.arange(0, spec.head_dim, 2, dtype=torch.float32, device=device)
        self.inv_freq = spec.rope_theta ** (-half / spec.head_dim)  # [D/2]

    def new_cache(self, num_slots: int, capacity: int) -> KVCache:
        """A zeroed KV cache for this decoder: num_slots sequences of up to capacity tokens."""
        return KVCache.allocate(len(self.layers), self.spec.num_kv_heads, self.spec.head_dim,
                                num_slots, capacity, self.dtype, self.device)

    def weight_bytes(self) -> int:
        """Bytes of parameters held (the tied LM head counted once)."""
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def _decode_groups(self, ctx: list[int], sizes: Sequence[int] | None,
                       capacity: int) -> list[tuple[int, int, int, torch.Tensor | None]]:
        """(first row, rows, keys, mask) of each decode group; one group by default."""
        sizes = [len(ctx)] if sizes is None else list(sizes)
        if sum(sizes) != len(ctx) or any(n < 1 for n in sizes):
            raise ValueError(f"decode_groups {sizes} must be sizes >= 1 summing to the "
                             f"{len(ctx)} decodes")
        out, r = [], 0
        for n in sizes:
            part = ctx[r:r + n]
            keys = max(part) + 1
            if keys > capacity:
                raise ValueError(f"a decode after {keys - 1} tokens does not fit the "
                                 f"capacity {capacity}")
            mask = None
            if min(part) != max(part):  # pad to the group's longest context, masked
                lim = torch.tensor(part, device=self.device).view(-1, 1, 1, 1)
                mask = torch.arange(keys, device=self.device).view(1, 1, 1, -1) <= lim
            out.append((r, n, keys, mask))
            r += n
        return out

    def _plan(self, cache: KVCache, decode_slots: Sequence[int], chunks: Sequence[Chunk],
              decode_groups: Sequence[int] | None = None) -> _StepPlan:
        dev = self.device
        ctx = [cache.lengths[s] for s in decode_slots]
        if ctx and list(decode_slots) != list(range(decode_slots[0], decode_slots[0] + len(ctx))):
            raise ValueError("decode_slots must be a contiguous ascending run of slots")
        groups = self._decode_groups(ctx, decode_groups, cache.shape[2]) if ctx else []
        positions, sample_rows, plans = list(ctx), list(range(len(ctx))), []
        start = len(ctx)
        for ch in chunks:
            c, n = cache.lengths[ch.slot], ch.num_tokens
            if n < 1 or c + n > cache.shape[2]:
                raise ValueError(f"chunk of {n} tokens after {c} does not fit the capacity "
                                 f"{cache.shape[2]} of slot {ch.slot}")
            mask = None
            if c:  # query i (absolute c+i) sees keys 0..c+i
                q_pos = torch.arange(c, c + n, device=dev).view(-1, 1)
                mask = torch.arange(c + n, device=dev).view(1, -1) <= q_pos
            plans.append((ch.slot, start, c, n, mask))
            positions.extend(range(c, c + n))
            start += n
            if ch.sample:
                sample_rows.append(start - 1)
        return _StepPlan(torch.tensor(positions, device=dev), list(decode_slots), groups,
                         plans, torch.tensor(sample_rows, device=dev, dtype=torch.long))

    @torch.inference_mode()
    def step(self, cache: KVCache, decode_slots: Sequence[int] = (),
             chunks: Sequence[Chunk] = (), gen: torch.Generator | None = None,
             token_ids: torch.Tensor | None = None,
             decode_groups: Sequence[int] | None = None) -> torch.Tensor:
        """Run one step: one token for each slot in ``decode_slots`` (a contiguous run of
        slots, each over its cached context) and every prefill chunk, then the LM head on
        the sampled rows. Advances ``cache.lengths``.

        decode_groups: sizes of consecutive runs of the decodes, each attended in its own
        call over its own longest context (default: one call over all, padded to the
        longest context with a mask; the calibration grid uses uniform contexts). Grouping
        decodes of similar context avoids most of the padding, as a paged kernel does.

        token_ids: [T] input ids, decodes first then each chunk's tokens (default: random
        from ``gen``; timing does not depend on them, tests of correctness do).
        Returns logits [num_sampled, vocab_size] (decodes first, then sampling chunks).
        Raises ValueError when a chunk overflows its slot, decode slots are not a run, or
        token_ids has the wrong length.
        """
        plan = self._plan(cache, decode_slots, chunks, decode_groups)
        t = plan.positions.numel()
        if t == 0:
            raise ValueError("a step needs at least one decode or prefill chunk")
        if token_ids is None:
            tokens = torch.randint(0, self.spec.vocab_size, (t,), device=self.device,
                                   generator=gen)
        elif token_ids.shape != (t,):
            raise ValueError(f"token_ids must have shape ({t},), got {tuple(token_ids.shape)}")
        else:
            tokens = token_ids.to(self.device)
        freqs = plan.positions.float().unsqueeze(-1) * self.inv_freq  # [T, D/2]
        angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # [T, 1, D]
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        x = F.embedding(tokens, self.embed)
        for layer, kc, vc in zip(self.layers, cache.k, cache.v, strict=True):
            x = layer(x, cos, sin, kc, vc, plan)
        for s in decode_slots:
            cache.lengths[s] += 1
        for ch in chunks:
            cache.lengths[ch.slot] += ch.num_tokens
        return F.linear(self.norm(x[plan.sample_rows]), self.lm_head)


def build_decoder(spec: ModelSpec, num_layers: int | None = None, dtype: str = "bf16",
                  device: str = "cpu", seed: int = 0) -> Decoder:
    """A random-weight decoder with ``spec``'s dimensions and ``num_layers`` layers
    (default: all ``spec.num_layers``; fewer measures a subset, scaled up later).

    Raises ValueError naming ``num_layers``, ``dtype`` or ``device`` when invalid.
    """
    layers = spec.num_layers if num_layers is None else num_layers
    if not 1 <= layers <= spec.num_layers:
        raise ValueError(f"num_layers must be in 1..{spec.num_layers}, got {layers}")
    return Decoder(spec, layers, resolve_dtype(dtype), resolve_device(device), seed)
