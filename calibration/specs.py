"""Model specifications: the ModelSpec record, its derived sizes (parameter counts, weight
and KV-cache bytes, FLOPs), the dtype names, and the model presets carried in
calibration/data/models.json with their sources (GPUs: calibration/gpus.py).

Sizes are in bytes, rates in FLOP/s and bytes/s, times in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"bf16": 2, "fp16": 2, "fp32": 4})
"""Bytes per element of each supported dtype name."""

GIB = 1 << 30
"""Bytes in one GiB."""

# Qwen2 puts biases on q/k/v without a config key saying so.
_BIASED_QKV_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe"})
_REQUIRED_HF_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


def require_positive(owner: str, **values: int | float) -> None:
    """Raise ValueError naming ``owner.field`` for the first value that is not > 0."""
    for field_name, value in values.items():
        if not value > 0:
            raise ValueError(f"{owner}.{field_name} must be > 0, got {value}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture of a decoder-only transformer (Llama / Mistral / Qwen2 / Mixtral family:
    RMSNorm, rotary positions, GQA attention, SwiGLU MLP, optional top-k MoE).

    Fields mirror Hugging Face config.json keys (num_layers = num_hidden_layers,
    num_kv_heads = num_key_value_heads, num_experts = num_local_experts). intermediate_size
    is per expert for MoE models. attention_bias means biases on the q, k and v projections
    (Qwen2); an o-projection bias (Llama's attention_bias=True) is not counted (h params per
    layer). Raises ValueError naming the field for non-positive sizes, num_attention_heads
    not a multiple of num_kv_heads, or num_experts_per_tok outside [1, num_experts].
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

    # ---- parameter counts ------------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        """q, k, v, o projection weights (+ q/k/v biases when attention_bias)."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        params = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        if self.attention_bias:
            params += q + 2 * kv
        return params

    @property
    def expert_params_per_layer(self) -> int:
        """One SwiGLU MLP (gate, up, down: 3 * hidden * intermediate); one expert for MoE."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def router_params_per_layer(self) -> int:
        """MoE gate (hidden x num_experts); 0 for dense models."""
        return self.hidden_size * self.num_experts if self.num_experts > 1 else 0

    @property
    def norm_params_per_layer(self) -> int:
        """Two RMSNorm weight vectors (input and post-attention)."""
        return 2 * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """vocab x hidden: the LM-head matmul (the embedding matrix itself when tied)."""
        return self.vocab_size * self.hidden_size

    def num_params(self) -> int:
        """All stored parameters: embedding, per-layer attention, all experts' MLPs, router
        and norms, the final norm, and the LM head unless tied to the embedding.
        Llama-3.1-8B: 8,030,261,248."""
        per_layer = (
            self.attention_params_per_layer
            + self.num_experts * self.expert_params_per_layer
            + self.router_params_per_layer
            + self.norm_params_per_layer
        )
        lm_head = 0 if self.tie_word_embeddings else self.lm_head_params
        embedding = self.vocab_size * self.hidden_size
        return embedding + self.num_layers * per_layer + self.hidden_size + lm_head

    def num_active_params_per_token(self) -> int:
        """Parameters one token passes through: only num_experts_per_tok experts per layer,
        the LM head (even when tied), no embedding lookup (a gather, not a matmul).
        Mixtral-8x7B: about 12.75e9."""
        per_layer = (
            self.attention_params_per_layer
            + self.num_experts_per_tok * self.expert_params_per_layer
            + self.router_params_per_layer
            + self.norm_params_per_layer
        )
        return self.num_layers * per_layer + self.hidden_size + self.lm_head_params

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes of all weights (num_params() * dtype_bytes)."""
        require_positive("ModelSpec.weight_bytes", dtype_bytes=dtype_bytes)
        return self.num_params() * dtype_bytes

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
        """KV-cache bytes per token (on each GPU under tensor parallelism):
        2 (K and V) * num_layers * kv heads * head_dim * dtype_bytes.
        Qwen2.5-1.5B in bf16: 2 * 28 * 2 * 128 * 2 = 28,672."""
        require_positive("ModelSpec.kv_bytes_per_token", dtype_bytes=dtype_bytes)
        heads = self.kv_heads_per_gpu(tensor_parallel_size)
        return 2 * self.num_layers * heads * self.head_dim * dtype_bytes

    # ---- loading ---------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, path: str | Path) -> ModelSpec:
        """Build a spec from a Hugging Face config.json (a file, or a folder holding one).

        Defaults follow the transformers config classes of these families:
        num_key_value_heads = num_attention_heads, head_dim = hidden_size / heads,
        tie_word_embeddings False, no experts, attention_bias True only for Qwen2.
        Raises ValueError listing the missing required keys, or when head_dim is absent and
        hidden_size is not a multiple of num_attention_heads.
        """
        file = Path(path)
        if file.is_dir():
            file = file / "config.json"
        config: dict[str, Any] = json.loads(file.read_text())
        missing = [key for key in _REQUIRED_HF_KEYS if config.get(key) is None]
        if missing:
            raise ValueError(f"{file}: config.json lacks required keys: {', '.join(missing)}")
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        head_dim = config.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise ValueError(
                    f"{file}: no head_dim and hidden_size ({hidden}) is not a multiple of "
                    f"num_attention_heads ({heads})"
                )
            head_dim = hidden // heads
        experts = config.get("num_local_experts") or config.get("num_experts") or 1
        model_type = str(config.get("model_type", ""))
        return cls(
            name=file.parent.name or file.stem,
            hf_id=str(config.get("_name_or_path") or file.parent.name),
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config["max_position_embeddings"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_experts=int(experts),
            num_experts_per_tok=int(config.get("num_experts_per_tok", 1)) if experts > 1 else 1,
            attention_bias=bool(
                config.get("attention_bias", model_type in _BIASED_QKV_MODEL_TYPES)
            ),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            source=f"Hugging Face config.json at {file}",
        )


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
