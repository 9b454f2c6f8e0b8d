"""``servesim inspect``: what servesim derives from a model (a preset or a Hugging Face
config.json) as deployed: its architecture as read, parameters, weight bytes by part, KV
bytes per token and FLOPs per token. The figures come from ModelSpec
(calibration/specs.py), the same methods the KV plan and the roofline use."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from sim.app.cli.common import INPUT_ERRORS, console, fail
from sim.app.cli.options import declare, with_options

GIB = 1 << 30


def _size(num_bytes: int) -> str:
    return f"{num_bytes:,} B ({num_bytes / GIB:.2f} GiB)"


def architecture_rows(spec: Any) -> list[tuple[str, str]]:
    """(field, value) rows describing ``spec``'s architecture as servesim read it."""
    if spec.kv_lora_rank is not None:
        attention = (f"MLA: {spec.num_attention_heads} heads, kv_lora_rank "
                     f"{spec.kv_lora_rank}, rope {spec.qk_rope_head_dim}, q/k head "
                     f"{spec.head_dim}, v head {spec.v_head_dim}, q_lora_rank "
                     f"{spec.q_lora_rank}")
    else:
        kind = ("MHA" if spec.num_kv_heads == spec.num_attention_heads
                else "MQA" if spec.num_kv_heads == 1 else "GQA")
        attention = (f"{kind}: {spec.num_attention_heads} heads, {spec.num_kv_heads} KV "
                     f"heads, head_dim {spec.head_dim}")
    rows = [("model", f"{spec.name} ({spec.hf_id})"), ("source", spec.source),
            ("layers", str(spec.num_layers)), ("hidden size", f"{spec.hidden_size:,}"),
            ("attention", attention), ("MLP width", f"{spec.intermediate_size:,}")]
    if spec.num_experts > 1:
        rows.append(("experts", (
            f"{spec.num_experts} routed, {spec.num_experts_per_tok} per token, width "
            f"{spec.expert_intermediate_size:,}; shared width "
            f"{spec.shared_expert_intermediate_size:,}; {spec.num_moe_layers} MoE layers, "
            f"{spec.num_layers - spec.num_moe_layers} dense")))
    if spec.sliding_window is not None:
        rows.append(("sliding window", f"{spec.sliding_window:,} tokens on "
                                       f"{spec.num_sliding_window_layers} layers"))
    rows += [("vocabulary", f"{spec.vocab_size:,}"
              + (" (tied embeddings)" if spec.tie_word_embeddings else "")),
             ("context", f"{spec.max_position_embeddings:,}")]
    return rows


def derived_rows(spec: Any, dtype: str, tensor_parallel_size: int) -> list[tuple[str, str]]:
    """(figure, value) rows: parameters, weights (by part), KV and FLOPs per token."""
    from calibration.specs import DTYPE_BYTES

    dtype_bytes = DTYPE_BYTES[dtype]
    q = spec.quantization
    fmt = "unquantized" if q is None else f"{q.method} {q.scheme} ({q.strategy} scales)"
    rows = [("parameters", f"{spec.num_params():,}"),
            ("active parameters per token", f"{spec.num_active_params_per_token():,}"),
            ("weights", f"{fmt}; the rest in {dtype}"),
            ("weight bytes", _size(spec.weight_bytes(dtype_bytes)))]
    rows += [(f"  {part}", _size(b))
             for part, b in spec.weight_bytes_by_part(dtype_bytes).items() if b]
    kv = spec.kv_bytes_per_token(dtype_bytes)
    rows.append(("KV bytes per token", f"{kv:,} (kv_cache_dtype {spec.kv_cache_dtype})"))
    if tensor_parallel_size > 1:
        rows.append((f"  per GPU at TP {tensor_parallel_size}",
                     f"{spec.kv_bytes_per_token(dtype_bytes, tensor_parallel_size):,}"))
    rows += [("linear FLOPs per token", f"{2 * spec.num_active_params_per_token():,}"),
             ("attention FLOPs per context token", f"{spec.attention_flops_per_pair():,}")]
    return rows


@with_options(*declare(("model", "dtype", "quantization", "kv_cache_dtype",
                        "tensor_parallel_size")))
def inspect_model(**opts: Any) -> None:
    """Show what servesim derives from a model (a preset, or a Hugging Face config.json
    or a folder holding one) as deployed: parameters, weight bytes, KV bytes per token,
    FLOPs per token."""
    from calibration.hf_config import resolve_model
    from calibration.quantization import check_quantization_name
    from sim.app.runs.run_config import DEFAULT_MODEL, dtype_name

    try:
        dtype = dtype_name(opts["dtype"])
        check_quantization_name(opts["quantization"])
        spec = resolve_model(opts["model"] or DEFAULT_MODEL, opts["quantization"],
                             opts["kv_cache_dtype"])
        spec.check_tensor_parallel(opts["tensor_parallel_size"])
        rows = derived_rows(spec, dtype, opts["tensor_parallel_size"])
    except INPUT_ERRORS as e:
        fail(str(e))
    for title, body in (("architecture", architecture_rows(spec)), ("derived", rows)):
        t = Table(title=title, header_style="bold", show_header=False)
        t.add_column("", style="bold")
        t.add_column("")
        for name, value in body:
            t.add_row(name, value)
        console.print(t)
