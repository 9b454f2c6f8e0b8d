"""Models from a Hugging Face config.json: reading one (a file, or a folder holding one, such
as a local snapshot; nothing is downloaded) into a ModelSpec, and resolving what ``--model``
names (a preset or such a path) together with the deployment's ``--quantization`` and
``--kv-cache-dtype`` into the one spec a run sizes and prices.

Keys are read as the transformers config classes of these families define them (Llama,
Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE, DeepSeek-V2/V3); a multimodal
config's ``text_config`` is read when the top level has no layers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calibration.quantization import check_kv_cache_dtype, resolve
from calibration.specs import ModelSpec, get_model, list_models

# Qwen2 puts biases on q/k/v without a config key saying so.
_BIASED_QKV_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe"})
# Qwen3 normalises q and k per head (q_norm, k_norm) without a config key saying so.
_QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe"})
_REQUIRED_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)


def read_hf_config(path: str | Path) -> tuple[dict[str, Any], Path]:
    """The parsed config.json at ``path`` (a file, or a folder holding config.json) and the
    file read. Raises ValueError naming the file when it cannot be read, is not JSON or is
    not a JSON object."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{file}: cannot read it ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{file}: not a JSON file ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a Hugging Face config.json (a JSON object), "
                         f"got {type(data).__name__}")
    return data, file


def spec_from_hf_config(path: str | Path) -> ModelSpec:
    """The spec of the config.json at ``path`` (a file, or a folder holding one); its
    quantization_config, when present, sets the weights' format. The name is the folder's
    for a file called config.json (a snapshot's), else the file's stem.

    Defaults follow the transformers config classes: num_key_value_heads =
    num_attention_heads, head_dim = hidden_size / heads, tie_word_embeddings False, no
    experts, attention_bias True only for Qwen2. Raises ValueError naming the file and the
    missing required keys, a head_dim that cannot be derived, an MoE layer pattern
    servesim cannot count, or an unsupported quantization_config."""
    config, file = read_hf_config(path)
    try:
        return _spec(config, name=file.parent.name if file.name == "config.json" else file.stem,
                     source=f"Hugging Face config.json at {file}")
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{file}: {exc}") from exc


def _spec(config: Mapping[str, Any], name: str, source: str) -> ModelSpec:
    text = config.get("text_config")
    if config.get("num_hidden_layers") is None and isinstance(text, Mapping):
        config = {**text, "quantization_config": config.get("quantization_config")}
    missing = [key for key in _REQUIRED_KEYS if config.get(key) is None]
    if missing:
        raise ValueError(f"config.json lacks required keys: {', '.join(missing)}")
    model_type = str(config.get("model_type", ""))
    qc = config.get("quantization_config")
    return ModelSpec(
        name=name,
        hf_id=str(config.get("_name_or_path") or name),
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=int(config["hidden_size"]),
        num_attention_heads=int(config["num_attention_heads"]),
        num_kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        head_dim=_head_dim(config),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config["max_position_embeddings"]),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", model_type in _BIASED_QKV_MODEL_TYPES)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
        rope_theta=float(config.get("rope_theta") or 10000.0),
        source=source,
        qk_norm=model_type in _QK_NORM_MODEL_TYPES,
        quantization=resolve(qc, None) if isinstance(qc, Mapping) else None,
        **_moe_fields(config),
        **_mla_fields(config),
        **_sliding_window_fields(config),
    )


def _head_dim(config: Mapping[str, Any]) -> int:
    """head_dim, or for MLA qk_nope_head_dim + qk_rope_head_dim, or hidden / heads."""
    if config.get("kv_lora_rank") is not None:
        return int(config["qk_nope_head_dim"]) + int(config["qk_rope_head_dim"])
    if config.get("head_dim") is not None:
        return int(config["head_dim"])
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    if hidden % heads:
        raise ValueError(f"no head_dim and hidden_size ({hidden}) is not a multiple of "
                         f"num_attention_heads ({heads})")
    return hidden // heads


def _moe_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """Routed experts (num_local_experts: Mixtral; num_experts: Qwen-MoE; n_routed_experts:
    DeepSeek), experts per token, the expert width, the shared MLP (DeepSeek
    n_shared_experts * moe_intermediate_size; Qwen2-MoE shared_expert_intermediate_size) and
    how many layers keep a dense MLP (DeepSeek: layer i is MoE when i >= first_k_dense_replace
    and i % moe_layer_freq == 0; Qwen-MoE: when (i + 1) % decoder_sparse_step == 0 and i is
    not in mlp_only_layers)."""
    experts = int(config.get("num_local_experts") or config.get("num_experts")
                  or config.get("n_routed_experts") or 1)
    if experts <= 1:
        return {}
    layers = int(config["num_hidden_layers"])
    width = config.get("moe_intermediate_size")
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    if config.get("n_shared_experts"):
        shared = int(config["n_shared_experts"]) * int(width or config["intermediate_size"])
    if "first_k_dense_replace" in config or "moe_layer_freq" in config:
        first, freq = int(config.get("first_k_dense_replace") or 0), int(
            config.get("moe_layer_freq") or 1)
        moe = [i >= first and i % freq == 0 for i in range(layers)]
    else:
        step, dense_only = int(config.get("decoder_sparse_step") or 1), set(
            config.get("mlp_only_layers") or ())
        moe = [(i + 1) % step == 0 and i not in dense_only for i in range(layers)]
    return {
        "num_experts": experts,
        "num_experts_per_tok": int(config.get("num_experts_per_tok") or 1),
        "moe_intermediate_size": int(width) if width else None,
        "shared_expert_intermediate_size": shared,
        "num_dense_layers": layers - sum(moe),
    }


def _mla_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """Multi-head latent attention's sizes (DeepSeek-V2/V3) when kv_lora_rank is set."""
    if config.get("kv_lora_rank") is None:
        return {}
    q_lora = config.get("q_lora_rank")
    return {
        "kv_lora_rank": int(config["kv_lora_rank"]),
        "q_lora_rank": int(q_lora) if q_lora else None,
        "qk_rope_head_dim": int(config["qk_rope_head_dim"]),
        "v_head_dim": int(config["v_head_dim"]),
    }


def _sliding_window_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The window and how many layers use it: layer_types' "sliding_attention" entries when
    the config lists them; Qwen2's use_sliding_window (layers from max_window_layers on);
    else every layer when sliding_window is set (Mistral)."""
    window = config.get("sliding_window")
    layers = int(config["num_hidden_layers"])
    types = config.get("layer_types")
    if isinstance(types, list):
        count = sum(1 for t in types if t == "sliding_attention")
    elif "use_sliding_window" in config:
        count = layers - int(config.get("max_window_layers") or 0) if config[
            "use_sliding_window"] else 0
    else:
        count = layers if window else 0
    if not window or count <= 0:
        return {}
    return {"sliding_window": int(window), "num_sliding_window_layers": count}


def resolve_model(model: str, quantization: str | None = None,
                  kv_cache_dtype: str = "auto") -> ModelSpec:
    """The spec a run uses: ``model`` is a preset name (calibration/data/models.json) or a
    path to a config.json or a folder holding one; ``quantization`` (vLLM's
    --quantization) and ``kv_cache_dtype`` (vLLM's --kv-cache-dtype) as
    deployed applies. Raises ValueError naming the model (with the presets) when it is
    neither, and as spec_from_hf_config and deployed do."""
    presets = list_models()
    if model.lower() in presets:  # a preset name wins over a same-named folder
        spec = get_model(model)
    elif Path(model).exists():
        spec = spec_from_hf_config(model)
    else:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(presets)} (or a "
                         "Hugging Face config.json, or a folder holding one)")
    return deployed(spec, quantization, kv_cache_dtype)


def deployed(spec: ModelSpec, quantization: str | None, kv_cache_dtype: str) -> ModelSpec:
    """``spec`` with the run's quantization and KV-cache dtype: the checkpoint's own
    quantization stays (a different ``quantization`` is refused, as vLLM refuses it);
    an unquantized spec takes ``quantization``'s default format
    (calibration/quantization.py from_name). Returns ``spec`` itself when nothing changes.
    Raises ValueError naming quantization or kv_cache_dtype."""
    check_kv_cache_dtype(kv_cache_dtype)
    weights = spec.quantization
    if weights is not None:
        if quantization is not None and quantization != weights.method:
            raise ValueError(f"quantization {quantization!r} differs from the checkpoint's "
                             f"quantization_config ({weights.method!r}) of {spec.name}")
    else:
        weights = resolve(None, quantization)
    if weights == spec.quantization and kv_cache_dtype == spec.kv_cache_dtype:
        return spec
    return dataclasses.replace(spec, quantization=weights, kv_cache_dtype=kv_cache_dtype)


#: RoPE types whose max_position_embeddings is already the scaled length, so vLLM does
#: not apply their ``factor`` again (vLLM 0.32 vllm/config/model.py
#: ``_get_and_verify_max_len``).
_PRESCALED_ROPE_TYPES = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn",
                                   "deepseek_llama_scaling"})


@dataclasses.dataclass(frozen=True)
class ContextLimit:
    """What besides max_position_embeddings bounds a user's max_model_len in vLLM 0.32
    (vllm/config/model.py ``_get_and_verify_max_len``): ``rope_factor``, the RoPE scaling
    factor vLLM multiplies the derived length by (None: none applies), and
    ``model_max_length``, config.json's own key that allows a longer max_model_len (None:
    absent). A preset's config carries neither that applies (Llama 3.1's llama3 RoPE is
    pre-scaled)."""

    rope_factor: float | None = None
    model_max_length: int | None = None


def context_limit(model: str) -> ContextLimit:
    """The ContextLimit of what ``--model`` names: empty for a preset; for a config.json
    (or a folder holding one) its ``rope_scaling`` (or ``rope_parameters``; each layer
    type's when nested) factor unless the type is pre-scaled or the model is Gemma 3, and
    its ``model_max_length``. Raises ValueError as read_hf_config does."""
    if model.lower() in list_models() or not Path(model).exists():
        return ContextLimit()
    config: Mapping[str, Any] = read_hf_config(model)[0]
    text = config.get("text_config")
    if config.get("num_hidden_layers") is None and isinstance(text, Mapping):
        config = text
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    params = list(rope.values()) if isinstance(rope, Mapping) and all(
        isinstance(v, Mapping) for v in rope.values()) else [rope]
    factor = None
    if "gemma3" not in str(config.get("model_type", "")):
        for rp in params:
            if not isinstance(rp, Mapping):
                continue
            kind = rp.get("rope_type") or rp.get("type") or "default"
            if kind not in _PRESCALED_ROPE_TYPES and rp.get("factor") is not None:
                factor = float(rp["factor"])
    mml = config.get("model_max_length")
    return ContextLimit(factor, int(mml) if mml is not None else None)
