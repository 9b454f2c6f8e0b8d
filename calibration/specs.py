"""Model specifications: the ModelSpec record, its layer structure and derived sizes
(parameter counts, weight and KV-cache bytes, quantized or not, FLOPs), the dtype names, and
the model presets carried in calibration/data/models.json with their sources (GPUs:
calibration/gpus.py; reading a Hugging Face config.json: calibration/hf_config.py; weight
formats: calibration/quantization.py).

Sizes are in bytes, rates in FLOP/s and bytes/s, times in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

from calibration.quantization import WeightQuantization, check_kv_cache_dtype, kv_element_bytes

DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"bf16": 2, "fp16": 2, "fp32": 4})
"""Bytes per element of each supported dtype name."""

GIB = 1 << 30
"""Bytes in one GiB."""


def require_positive(owner: str, **values: int | float) -> None:
    """Raise ValueError naming ``owner.field`` for the first value that is not > 0."""
    for field_name, value in values.items():
        if not value > 0:
            raise ValueError(f"{owner}.{field_name} must be > 0, got {value}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture of a decoder-only transformer (Llama / Mistral / Qwen2 / Qwen3 /
    Mixtral / Qwen-MoE / DeepSeek-V2/V3 families: RMSNorm, rotary positions, GQA/MQA or
    multi-head latent attention (MLA), SwiGLU MLP, optional top-k MoE), plus how it is
    deployed: its weights' quantization and the KV-cache dtype.

    Fields mirror Hugging Face config.json keys (num_layers = num_hidden_layers,
    num_kv_heads = num_key_value_heads, num_experts = num_local_experts / num_experts /
    n_routed_experts). intermediate_size is the dense MLP's width (and each expert's when
    moe_intermediate_size is None, as Mixtral's config says it). MoE models may keep a
    dense MLP in num_dense_layers layers (DeepSeek's first_k_dense_replace) and add one
    shared MLP of shared_expert_intermediate_size beside the routed experts.
    attention_bias means biases on the q, k and v projections (Qwen2); an o-projection bias
    (Llama's attention_bias=True) is not counted (h params per layer). qk_norm: Qwen3's
    per-head RMSNorm on q and k (2 * head_dim params per layer). MLA (kv_lora_rank set):
    head_dim is the q/k head size (qk_nope_head_dim + qk_rope_head_dim), v_head_dim the
    value head size, q_lora_rank the query's low-rank width (None: a full q projection).
    sliding_window and num_sliding_window_layers record the layers that attend over a
    window only (kv_bytes_per_token says how they count). quantization is the linear
    layers' storage format (calibration/quantization.py; None: the model dtype); it may be
    given as its dict form (a profile or config.json read back). kv_cache_dtype is vLLM's
    --kv-cache-dtype (auto: the model dtype; fp8: 1 byte per element).

    Raises ValueError naming the field for non-positive sizes, num_attention_heads not a
    multiple of num_kv_heads, num_experts_per_tok outside [1, num_experts], layer counts
    outside [0, num_layers], an MLA size missing or out of range, or an unknown
    kv_cache_dtype or quantization.
    """

    name: str
    hf_id: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    num_experts: int = 1
    num_experts_per_tok: int = 1
    attention_bias: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    source: str = ""
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0
    qk_norm: bool = False
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    v_head_dim: int | None = None
    sliding_window: int | None = None
    num_sliding_window_layers: int = 0
    quantization: WeightQuantization | None = None
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        require_positive(
            "ModelSpec",
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            num_experts=self.num_experts,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
        )
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelSpec.num_kv_heads ({self.num_kv_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"ModelSpec.num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                f"got {self.num_experts_per_tok}"
            )
        self._check_layout()
        if isinstance(self.quantization, Mapping):
            object.__setattr__(self, "quantization", WeightQuantization(**self.quantization))
        check_kv_cache_dtype(self.kv_cache_dtype)

    def _check_layout(self) -> None:
        for name in ("num_dense_layers", "num_sliding_window_layers"):
            value = getattr(self, name)
            if not 0 <= value <= self.num_layers:
                raise ValueError(f"ModelSpec.{name} must be in [0, num_layers="
                                 f"{self.num_layers}], got {value}")
        for name in ("moe_intermediate_size", "sliding_window", "q_lora_rank"):
            value = getattr(self, name)
            if value is not None:
                require_positive("ModelSpec", **{name: value})
        if self.shared_expert_intermediate_size < 0:
            raise ValueError("ModelSpec.shared_expert_intermediate_size must be >= 0, got "
                             f"{self.shared_expert_intermediate_size}")
        if self.kv_lora_rank is not None:
            require_positive("ModelSpec", kv_lora_rank=self.kv_lora_rank,
                             v_head_dim=self.v_head_dim or 0)
            if not 0 < self.qk_rope_head_dim < self.head_dim:
                raise ValueError(f"ModelSpec.qk_rope_head_dim must be in (0, head_dim="
                                 f"{self.head_dim}) for MLA, got {self.qk_rope_head_dim}")

    # ---- layer structure ---------------------------------------------------------------
    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is routed experts (0 for a dense model)."""
        return self.num_layers - self.num_dense_layers if self.num_experts > 1 else 0

    @property
    def qk_nope_head_dim(self) -> int:
        """The part of a query/key head without rotary embedding: head_dim less
        qk_rope_head_dim for MLA, head_dim otherwise (HF DeepSeek configs' name)."""
        return self.head_dim - self.qk_rope_head_dim

    @property
    def attention_head_size(self) -> int:
        """The head size vLLM's attention backends see: kv_lora_rank + qk_rope_head_dim for
        MLA (the latent; MLAAttention's head_size), head_dim otherwise."""
        if self.kv_lora_rank is not None:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.head_dim

    @property
    def expert_intermediate_size(self) -> int:
        """One routed expert's width: moe_intermediate_size, else intermediate_size."""
        return self.moe_intermediate_size or self.intermediate_size

    def attention_linears(self) -> tuple[tuple[int, int, int], ...]:
        """(in_features, out_features, fused matrices) of each attention weight matrix, as
        vLLM allocates them. GQA (llama.py): qkv_proj (3 fused), o_proj. MLA
        (deepseek_v2.py DeepseekV2MLAAttention): q_proj and kv_a_proj_with_mqa, or
        fused_qkv_a_proj (2 fused) and q_b_proj when q_lora_rank is set; kv_b_proj; o_proj."""
        h, q = self.hidden_size, self.num_attention_heads * self.head_dim
        if self.kv_lora_rank is None:
            kv = self.num_kv_heads * self.head_dim
            return (h, q + 2 * kv, 3), (q, h, 1)
        latent = self.kv_lora_rank + self.qk_rope_head_dim
        nope = self.head_dim - self.qk_rope_head_dim
        v = self.num_attention_heads * (self.v_head_dim or 0)
        if self.q_lora_rank is None:
            query: tuple[tuple[int, int, int], ...] = ((h, q, 1), (h, latent, 1))
        else:
            query = ((h, self.q_lora_rank + latent, 2), (self.q_lora_rank, q, 1))
        return (*query, (self.kv_lora_rank, self.num_attention_heads * nope + v, 1), (v, h, 1))

    def mlp_linears(self, intermediate: int) -> tuple[tuple[int, int, int], ...]:
        """A SwiGLU MLP of width ``intermediate``: gate_up_proj (2 fused) and down_proj."""
        return (self.hidden_size, 2 * intermediate, 2), (intermediate, self.hidden_size, 1)

    # ---- parameter counts ------------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        """The attention matrices (attention_linears), q/k/v biases when attention_bias,
        Qwen3's q/k norms, and MLA's latent norms (kv_a_layernorm, q_a_layernorm)."""
        return sum(k * n for k, n, _ in self.attention_linears()) + self._attention_vectors

    @property
    def _attention_vectors(self) -> int:
        """Attention parameters outside the matrices (kept in the model dtype)."""
        params = 2 * self.head_dim if self.qk_norm else 0
        if self.kv_lora_rank is not None:
            return params + self.kv_lora_rank + (self.q_lora_rank or 0)
        if self.attention_bias:
            params += (self.num_attention_heads + 2 * self.num_kv_heads) * self.head_dim
        return params

    @property
    def expert_params_per_layer(self) -> int:
        """One routed expert (gate, up, down: 3 * hidden * expert_intermediate_size); the
        MLP of a dense model."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def router_params_per_layer(self) -> int:
        """MoE gate (hidden x num_experts) of an MoE layer; 0 for dense models."""
        return self.hidden_size * self.num_experts if self.num_experts > 1 else 0

    @property
    def norm_params_per_layer(self) -> int:
        """Two RMSNorm weight vectors (input and post-attention)."""
        return 2 * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """vocab x hidden: the LM-head matmul (the embedding matrix itself when tied)."""
        return self.vocab_size * self.hidden_size

    def _layer_params(self, experts: int) -> tuple[int, int]:
        """(dense layer, MoE layer with ``experts`` routed experts) parameters."""
        h = self.hidden_size
        common = self.attention_params_per_layer + self.norm_params_per_layer
        dense = common + 3 * h * self.intermediate_size
        moe = (common + experts * self.expert_params_per_layer + self.router_params_per_layer
               + 3 * h * self.shared_expert_intermediate_size)
        return dense, moe

    def num_params(self) -> int:
        """All stored parameters: embedding, per-layer attention, dense MLPs, all experts'
        MLPs, shared experts, routers and norms, the final norm, and the LM head unless tied
        to the embedding. Llama-3.1-8B: 8,030,261,248."""
        dense, moe = self._layer_params(self.num_experts)
        lm_head = 0 if self.tie_word_embeddings else self.lm_head_params
        embedding = self.vocab_size * self.hidden_size
        layers = (self.num_layers - self.num_moe_layers) * dense + self.num_moe_layers * moe
        return embedding + layers + self.hidden_size + lm_head

    def num_active_params_per_token(self) -> int:
        """Parameters one token passes through: only num_experts_per_tok experts per MoE
        layer, the LM head (even when tied), no embedding lookup (a gather, not a matmul).
        Mixtral-8x7B: about 12.75e9."""
        dense, moe = self._layer_params(self.num_experts_per_tok)
        layers = (self.num_layers - self.num_moe_layers) * dense + self.num_moe_layers * moe
        return layers + self.hidden_size + self.lm_head_params

    def attention_flops_per_pair(self) -> int:
        """FLOPs of attention for one (query token, context token) pair, all layers.
        GQA: scores and values, 2 * 2 * heads * head_dim per layer. MLA as vLLM's decode
        path runs it (mla_attention.py: the query absorbed into the latent, scores over
        kv_lora_rank + qk_rope_head_dim, values over kv_lora_rank):
        2 * heads * (2 * kv_lora_rank + qk_rope_head_dim) per layer. Sliding-window layers
        are counted over the whole context (an upper bound past the window)."""
        heads = self.num_attention_heads
        if self.kv_lora_rank is None:
            return 4 * self.num_layers * heads * self.head_dim
        return 2 * self.num_layers * heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)

    # ---- bytes -----------------------------------------------------------------------
    def _linear_bytes(self, mats: tuple[tuple[int, int, int], ...], dtype_bytes: int) -> int:
        q = self.quantization
        if q is None:
            return sum(k * n for k, n, _ in mats) * dtype_bytes
        return sum(q.linear_bytes(k, n, s, dtype_bytes) for k, n, s in mats)

    def weight_bytes_by_part(self, dtype_bytes: int = 2) -> dict[str, int]:
        """Bytes of the weights by part (all layers): embedding, attention, dense_mlp,
        routed_experts, shared_experts, router, norms, lm_head. The attention and MLP
        matrices are stored as ``quantization`` says (calibration/quantization.py: packed
        weights plus their scales and zero points as vLLM allocates them); everything else
        (embedding, LM head, norms, biases, routers) in ``dtype_bytes`` per parameter, as
        these formats leave them. Unquantized, the parts sum to num_params() * dtype_bytes."""
        require_positive("ModelSpec.weight_bytes", dtype_bytes=dtype_bytes)
        moe, dense = self.num_moe_layers, self.num_layers - self.num_moe_layers
        shared = self.shared_expert_intermediate_size
        embedding = self.vocab_size * self.hidden_size * dtype_bytes
        return {
            "embedding": embedding,
            "attention": self.num_layers * (
                self._linear_bytes(self.attention_linears(), dtype_bytes)
                + self._attention_vectors * dtype_bytes),
            "dense_mlp": dense * self._linear_bytes(
                self.mlp_linears(self.intermediate_size), dtype_bytes),
            "routed_experts": moe * self.num_experts * self._linear_bytes(
                self.mlp_linears(self.expert_intermediate_size), dtype_bytes),
            "shared_experts": moe * self._linear_bytes(self.mlp_linears(shared), dtype_bytes)
            if shared else 0,
            "router": moe * self.router_params_per_layer * dtype_bytes,
            "norms": (self.num_layers * self.norm_params_per_layer + self.hidden_size)
            * dtype_bytes,
            "lm_head": 0 if self.tie_word_embeddings else embedding,
        }

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes of all weights: the sum of weight_bytes_by_part (num_params() *
        dtype_bytes when unquantized)."""
        return sum(self.weight_bytes_by_part(dtype_bytes).values())

    # ---- KV cache and tensor parallelism -----------------------------------------------
    def kv_heads_per_gpu(self, tensor_parallel_size: int = 1) -> int:
        """KV heads stored on each GPU: num_kv_heads / N, or 1 (replicated) when N exceeds
        num_kv_heads, as vLLM shards GQA. Raises ValueError naming tensor_parallel_size when
        N < 1, N does not divide num_attention_heads, or N < num_kv_heads and does not
        divide it."""
        self.check_tensor_parallel(tensor_parallel_size)
        return max(self.num_kv_heads // tensor_parallel_size, 1)

    def check_tensor_parallel(self, tensor_parallel_size: int) -> None:
        """Raise ValueError naming tensor_parallel_size when the heads cannot be sharded."""
        n = tensor_parallel_size
        if n < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {n}")
        if self.num_attention_heads % n:
            raise ValueError(
                f"tensor_parallel_size ({n}) must divide num_attention_heads "
                f"({self.num_attention_heads}) of {self.name}"
            )
        if n < self.num_kv_heads and self.num_kv_heads % n:
            raise ValueError(
                f"tensor_parallel_size ({n}) must divide num_kv_heads ({self.num_kv_heads}) "
                f"of {self.name}"
            )

    def kv_bytes_per_token(self, dtype_bytes: int = 2, tensor_parallel_size: int = 1) -> int:
        """KV-cache bytes per token (on each GPU under tensor parallelism), with elements of
        kv_element_bytes(kv_cache_dtype, dtype_bytes): 1 for fp8, else dtype_bytes.

        GQA/MQA: 2 (K and V) * num_layers * kv heads per GPU * head_dim * element.
        Qwen2.5-1.5B in bf16: 2 * 28 * 2 * 128 * 2 = 28,672.
        MLA: num_layers * (kv_lora_rank + qk_rope_head_dim) * element, on every GPU: vLLM
        caches the compressed latent and the rope key, one 576-wide entry per token per layer
        for DeepSeek-V2/V3, replicated under TP (vLLM 0.32 mla_attention.py
        MLAAttention.get_kv_cache_spec: num_kv_heads=1, max_tp_shards=1, head_size =
        kv_lora_rank + qk_rope_head_dim; v1/kv_cache_interface.py MLAAttentionSpec has no
        separate V).
        Sliding-window layers count in full: vLLM's hybrid KV cache manager gives every layer
        the same page per block (v1/core/kv_cache_utils.py
        _get_kv_cache_groups_uniform_page_size), so the pool divides by this per-token total;
        it then frees a sliding layer's blocks that fall out of its window, which servesim
        does not (as vLLM with --disable-hybrid-kv-cache-manager: unify_hybrid_kv_cache_specs
        turns those layers into full attention), so a long request holds at most this much.
        """
        require_positive("ModelSpec.kv_bytes_per_token", dtype_bytes=dtype_bytes)
        element = kv_element_bytes(self.kv_cache_dtype, dtype_bytes)
        if self.kv_lora_rank is not None:
            self.check_tensor_parallel(tensor_parallel_size)
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * element
        heads = self.kv_heads_per_gpu(tensor_parallel_size)
        return 2 * self.num_layers * heads * self.head_dim * element


# ---- presets ---------------------------------------------------------------------------
def load_data(filename: str) -> dict[str, Any]:
    """calibration/data/``filename``, parsed (a preset table)."""
    # Read on every lookup (small files, rare calls): no module-level cache to go stale.
    text = (
        resources.files("calibration")
        .joinpath("data")
        .joinpath(filename)
        .read_text(encoding="utf-8")
    )
    data: dict[str, Any] = json.loads(text)
    return data


def _model_presets() -> Mapping[str, ModelSpec]:
    fields = set(ModelSpec.__dataclass_fields__)
    specs = {
        entry["name"]: ModelSpec(**{k: v for k, v in entry.items() if k in fields})
        for entry in load_data("models.json")["models"]
    }
    return MappingProxyType(specs)


def list_models() -> list[str]:
    """Preset model names, in the order of calibration/data/models.json."""
    return list(_model_presets())


def get_model(name: str) -> ModelSpec:
    """The preset called ``name`` (case-insensitive); ValueError listing the known ones."""
    presets = _model_presets()
    spec = presets.get(name.lower())
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(presets)}")
    return spec
