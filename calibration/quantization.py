"""Weight quantization and the KV-cache dtype: which formats servesim sizes, how one is read
from a Hugging Face ``quantization_config`` or named by vLLM's ``--quantization``, and the
bytes one linear layer takes in each (its packed weights plus the scales and zero points
vLLM allocates for it). ModelSpec (calibration/specs.py) applies these rules layer by layer.

Sources are vLLM 0.32.0 (vllm/model_executor/layers/quantization/): ``fp8.py``
(Fp8LinearMethod.create_weights) with ``utils/fp8_utils.py`` (create_fp8_scale_parameter,
create_fp8_input_scale), ``compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py``,
``compressed_tensors_w8a8_int8.py`` and ``compressed_tensors_wNa16.py``, ``auto_awq.py``
(AutoAWQMarlinLinearMethod.create_weights) and ``auto_gptq.py``
(AutoGPTQLinearMethod.create_weights); vllm/config/cache.py for the KV-cache dtype names.

Sizes are in bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

QUANTIZATION_METHODS = ("fp8", "compressed-tensors", "awq", "gptq")
"""vLLM's ``--quantization`` names servesim sizes; any other is refused by name."""

KV_CACHE_DTYPES: Mapping[str, int | None] = {
    "auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}
"""vLLM's ``--kv-cache-dtype`` values servesim sizes, with bytes per element (None: the
model's dtype, as vLLM's ``auto``). vLLM 0.32 vllm/config/cache.py CacheDType lists more
(per-token-head and 4-bit caches with their own scale layouts); those are refused."""

DEFAULT_INT4_GROUP_SIZE = 128
"""Group size taken for ``--quantization awq`` or ``gptq`` without a quantization_config:
AutoAWQ's q_group_size and AutoGPTQ's group_size default, and what nearly every published
int4 checkpoint uses."""

_FP32_BYTES = 4
_INT32_BYTES = 4


@dataclass(frozen=True, slots=True)
class WeightQuantization:
    """How the linear layers' weights are stored (embeddings, the LM head, norms, biases
    and MoE router gates stay in the model dtype, as these formats leave them).

    ``method`` is vLLM's name; ``weight_bits`` 8 or 4; ``weight_type`` "float" or "int";
    ``strategy`` the weight scales' layout: "tensor" (one fp32 per logical matrix),
    "channel" (one fp32 per output row), "block" (one fp32 per ``block_size`` tile) or
    "group" (one model-dtype scale per ``group_size`` inputs of each output row);
    ``zero_points`` whether int4 zero points are stored (packed 8 to an int32);
    ``static_input_scale`` whether one fp32 activation scale per logical matrix is stored;
    ``activation_bits`` 8 when activations are quantized too (W8A8), None for weight-only.
    Raises ValueError naming the field on an unknown method, bits, type or strategy, or
    a missing group or block size.
    """

    method: str
    weight_bits: int
    weight_type: str
    strategy: str
    group_size: int | None = None
    block_size: tuple[int, int] | None = None
    zero_points: bool = False
    static_input_scale: bool = False
    activation_bits: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.block_size, list):  # read back from JSON
            object.__setattr__(self, "block_size", tuple(self.block_size))
        if self.method not in QUANTIZATION_METHODS:
            raise ValueError(_refusal(self.method))
        if self.weight_bits not in (4, 8):
            raise ValueError(f"quantization weight_bits must be 4 or 8, got {self.weight_bits}")
        if self.weight_type not in ("float", "int"):
            raise ValueError(f"quantization weight_type must be float or int, "
                             f"got {self.weight_type!r}")
        if self.strategy not in ("tensor", "channel", "block", "group"):
            raise ValueError(f"quantization strategy must be tensor, channel, block or "
                             f"group, got {self.strategy!r}")
        if self.strategy == "group" and not (self.group_size and self.group_size > 0):
            raise ValueError(f"quantization group_size must be > 0, got {self.group_size}")
        if self.strategy == "block" and (
                self.block_size is None or len(self.block_size) != 2 or min(self.block_size) < 1):
            raise ValueError(f"quantization block_size must be two sizes > 0, "
                             f"got {self.block_size}")

    @property
    def scheme(self) -> str:
        """A short label: W8A8-FP8, W8A8-INT8, W8A16-FP8, W4A16, ..."""
        acts = "A16" if self.activation_bits is None else f"A{self.activation_bits}"
        kind = "-FP8" if self.weight_type == "float" and self.weight_bits == 8 else (
            "-INT8" if self.weight_bits == 8 else "")
        return f"W{self.weight_bits}{acts}{kind}"

    @property
    def fp8_compute(self) -> bool:
        """Whether the matmuls run in fp8 (fp8 weights and fp8 activations), so that a GPU's
        fp8 tensor throughput applies; weight-only formats dequantise to the model dtype."""
        return self.weight_type == "float" and self.activation_bits == 8

    def linear_bytes(self, in_features: int, out_features: int, shards: int,
                     dtype_bytes: int) -> int:
        """Bytes of one linear layer of ``in_features`` x ``out_features`` weights, fused
        from ``shards`` logical matrices as vLLM fuses them (qkv: 3, gate_up: 2), with
        ``dtype_bytes`` the model dtype's size. Hand check, 4096 x 4096, bf16, group 128,
        W4A16 with zero points (awq): 4096*4096/2 + 32*4096*2 + 32*4096/2 = 8,716,288."""
        k, n = in_features, out_features
        packed = k * n * self.weight_bits // 8
        if self.strategy == "group":
            assert self.group_size is not None
            groups = -(-k // self.group_size)
            extra = groups * n * dtype_bytes  # scales in the model dtype
            if self.zero_points:  # int4 zero points, 8 to an int32
                extra += groups * -(-n * self.weight_bits // 32) * _INT32_BYTES
            if self.method == "compressed-tensors":
                extra += 2 * 8  # weight_shape: two int64
            return packed + extra
        if self.strategy == "block":
            assert self.block_size is not None
            bn, bk = self.block_size
            scales = -(-n // bn) * -(-k // bk)
        elif self.strategy == "channel":
            scales = n
        else:
            scales = shards
        inputs = shards if self.static_input_scale else 0
        return packed + (scales + inputs) * _FP32_BYTES

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON values (config.json, profiles)."""
        return {f: (list(v) if isinstance(v, tuple) else v)
                for f in self.__dataclass_fields__ for v in (getattr(self, f),)}


def _refusal(name: str) -> str:
    return (f"quantization {name!r} is not supported; supported (vLLM's names): "
            f"{', '.join(QUANTIZATION_METHODS)}")


def check_kv_cache_dtype(name: str) -> None:
    """Raise ValueError naming kv_cache_dtype and the allowed values for an unknown one."""
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)} "
                         f"(vLLM's --kv-cache-dtype), got {name!r}")


def check_quantization_name(name: str | None) -> None:
    """Raise ValueError listing the supported names when ``name`` is not one of them."""
    if name is not None and name not in QUANTIZATION_METHODS:
        raise ValueError(_refusal(name))


def from_name(name: str) -> WeightQuantization:
    """The format ``--quantization NAME`` means on a checkpoint without a
    quantization_config: fp8 is vLLM's online quantization (fp8 weights with one scale per
    logical matrix, dynamic fp8 activations); awq and gptq are 4-bit weight-only with
    groups of DEFAULT_INT4_GROUP_SIZE and stored zero points (vLLM allocates qzeros for
    both). compressed-tensors has no meaning without the checkpoint's scheme. Raises
    ValueError naming the method."""
    check_quantization_name(name)
    if name == "fp8":
        return WeightQuantization("fp8", 8, "float", "tensor", activation_bits=8)
    if name in ("awq", "gptq"):
        return WeightQuantization(name, 4, "int", "group", group_size=DEFAULT_INT4_GROUP_SIZE,
                                  zero_points=True)
    raise ValueError("quantization compressed-tensors takes its scheme (W8A8, W4A16, ...) "
                     "from the checkpoint's quantization_config; give a config.json that "
                     "has one")


def from_hf_config(qc: Mapping[str, Any]) -> WeightQuantization:
    """The format a Hugging Face ``quantization_config`` describes. Raises ValueError
    naming the method when it is not supported, or the key that does not fit."""
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        block = qc.get("weight_block_size")
        return WeightQuantization(
            "fp8", 8, "float", "block" if block else "tensor",
            block_size=tuple(block) if block else None,
            static_input_scale=qc.get("activation_scheme", "dynamic") == "static",
            activation_bits=8)
    if method in ("awq", "gptq"):
        bits = int(qc.get("bits", qc.get("w_bit", 4)))
        group = int(qc.get("group_size", qc.get("q_group_size", DEFAULT_INT4_GROUP_SIZE)))
        return WeightQuantization(method, bits, "int", "channel" if group == -1 else "group",
                                  group_size=None if group == -1 else group,
                                  zero_points=True)
    if method == "compressed-tensors":
        return _from_compressed_tensors(qc)
    raise ValueError(_refusal(method or "(no quant_method)"))


def _from_compressed_tensors(qc: Mapping[str, Any]) -> WeightQuantization:
    """One config group's scheme (the usual single group targeting Linear)."""
    groups = list((qc.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors quantization_config has {len(groups)} "
                         "config_groups; servesim sizes checkpoints with exactly one")
    weights, acts = groups[0].get("weights") or {}, groups[0].get("input_activations")
    bits, wtype = int(weights.get("num_bits", 8)), str(weights.get("type", "int"))
    strategy = str(weights.get("strategy", "tensor"))
    block = weights.get("block_structure")
    if bits == 4 and acts is not None:
        raise ValueError("compressed-tensors W4A8/W4A4 schemes are not supported; "
                         "supported: W8A8 (fp8 or int8), W8A16, W4A16")
    if strategy == "group" and weights.get("group_size") in (None, -1):
        strategy = "channel"
    if bits == 4 and strategy == "channel":
        raise ValueError("compressed-tensors W4A16 needs a group_size (channel-wise int4 "
                         "is stored as one group per row: give group_size = in_features)")
    return WeightQuantization(
        "compressed-tensors", bits, wtype, strategy,
        group_size=int(weights["group_size"]) if strategy == "group" else None,
        block_size=tuple(block) if strategy == "block" and block else None,
        zero_points=strategy == "group" and not weights.get("symmetric", True),
        static_input_scale=acts is not None and not acts.get("dynamic", True),
        activation_bits=None if acts is None else int(acts.get("num_bits", 8)))


def resolve(config_qc: Mapping[str, Any] | None, name: str | None) -> WeightQuantization | None:
    """The weights' format for a run: the checkpoint's quantization_config when it has
    one, else ``--quantization`` (``name``), else None (unquantized). vLLM refuses a
    ``--quantization`` that differs from the checkpoint's method (ModelConfig
    _verify_quantization), and so does this: ValueError naming both."""
    check_quantization_name(name)
    if config_qc is None:
        return None if name is None else from_name(name)
    found = from_hf_config(config_qc)
    if name is not None and name != found.method:
        raise ValueError(f"quantization {name!r} differs from the checkpoint's "
                         f"quantization_config ({found.method!r})")
    return found


def kv_element_bytes(kv_cache_dtype: str, dtype_bytes: int) -> int:
    """Bytes of one KV-cache element: 1 for the fp8 caches (vLLM stores e4m3/e5m2 with
    one scale per layer, not per token), else the model dtype's ``dtype_bytes``."""
    check_kv_cache_dtype(kv_cache_dtype)
    fixed = KV_CACHE_DTYPES[kv_cache_dtype]
    return dtype_bytes if fixed is None else fixed
