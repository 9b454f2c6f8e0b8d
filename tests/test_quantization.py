"""Weight quantization formats (calibration/quantization.py) and their bytes, per linear layer
and for a whole model, against hand computation; the KV-cache dtype; refusals by name."""

from __future__ import annotations

import dataclasses

import pytest

from calibration.hf_config import deployed, resolve_model
from calibration.quantization import (
    QUANTIZATION_METHODS,
    WeightQuantization,
    from_hf_config,
    from_name,
    kv_element_bytes,
    resolve,
)
from calibration.specs import get_model, list_models
from sim.app.runs.runner import RunConfig

AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
              "version": "gemm"}
GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
               "sym": True}
# RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8's scheme: fp8 weights, one scale per tensor,
# static per-tensor fp8 activations; lm_head ignored.
CT_W8A8_FP8 = {
    "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True,
                    "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor",
                              "symmetric": True, "dynamic": False}}},
}
CT_W4A16 = {
    "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"], "input_activations": None,
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                    "symmetric": True, "dynamic": False}}},
}


def test_int4_group_formats_by_hand() -> None:
    # 4096 x 4096, groups of 128 inputs: 32 groups per output row.
    # awq / gptq: packed 4096*4096/2 = 8,388,608; scales 32*4096*2 (bf16) = 262,144;
    # zero points 32 * (4096*4/32 = 512 int32) * 4 = 65,536. Total 8,716,288.
    for q in (from_hf_config(AWQ_CONFIG), from_hf_config(GPTQ_CONFIG), from_name("awq"),
              from_name("gptq")):
        assert (q.weight_bits, q.strategy, q.group_size, q.zero_points) == (4, "group", 128, True)
        assert q.linear_bytes(4096, 4096, 1, 2) == 8_716_288
    # compressed-tensors W4A16, symmetric: no zero points, plus weight_shape (2 int64 = 16):
    # 8,388,608 + 262,144 + 16 = 8,650,768.
    ct = from_hf_config(CT_W4A16)
    assert ct.scheme == "W4A16" and not ct.fp8_compute
    assert ct.linear_bytes(4096, 4096, 1, 2) == 8_650_768
    # Down projection 14336 -> 4096: 112 groups; 14336*4096/2 = 29,360,128 packed,
    # 112*4096*2 = 917,504 scales, 112*512*4 = 229,376 zeros: 30,507,008.
    assert from_name("awq").linear_bytes(14336, 4096, 1, 2) == 30_507_008


def test_fp8_formats_by_hand() -> None:
    # qkv of Llama-3.1-8B: 4096 -> 6144 (3 fused matrices), 1 byte per weight = 25,165,824.
    ct = from_hf_config(CT_W8A8_FP8)
    assert ct.scheme == "W8A8-FP8" and ct.fp8_compute and ct.static_input_scale
    # per-tensor: 3 weight scales + 3 static input scales, fp32: 24 bytes.
    assert ct.linear_bytes(4096, 6144, 3, 2) == 25_165_824 + 24
    # block 128 x 128 (Qwen3 / DeepSeek FP8): ceil(6144/128)=48 * ceil(4096/128)=32 = 1,536
    # fp32 scales = 6,144 bytes.
    block = from_hf_config({"quant_method": "fp8", "activation_scheme": "dynamic",
                            "fmt": "e4m3", "weight_block_size": [128, 128]})
    assert block.strategy == "block" and block.block_size == (128, 128)
    assert block.linear_bytes(4096, 6144, 3, 2) == 25_165_824 + 6_144
    # vLLM's online fp8 (--quantization fp8 on a bf16 checkpoint): one scale per matrix.
    assert from_name("fp8").linear_bytes(4096, 4096, 1, 2) == 16_777_216 + 4
    # int8 per-channel (W8A8-INT8, dynamic per-token activations): 4096 fp32 row scales.
    channel = WeightQuantization("compressed-tensors", 8, "int", "channel", activation_bits=8)
    assert channel.scheme == "W8A8-INT8"
    assert channel.linear_bytes(4096, 4096, 1, 2) == 16_777_216 + 16_384


def test_llama_8b_awq_weight_bytes_by_hand() -> None:
    # Per layer (awq, groups of 128, bf16 scales):
    #   qkv 4096->6144: 12,582,912 + 32*6144*2 = 393,216 + 32*768*4 = 98,304 -> 13,074,432
    #   o 4096->4096: 8,716,288
    #   gate_up 4096->28672: 58,720,256 + 32*28672*2 = 1,835,008 + 32*3584*4 = 458,752
    #     -> 61,014,016
    #   down 14336->4096: 30,507,008
    #   two norms 2*4096*2 = 16,384                   -> 113,328,128 per layer, x32 =
    #   3,626,500,096; embedding + LM head unquantized 2*128256*4096*2 = 2,101,346,304;
    #   final norm 8,192. Total 5,727,854,592 (5.33 GiB; the published
    #   hugging-quants Meta-Llama-3.1-8B-Instruct-AWQ-INT4 safetensors hold 5.73 GB).
    spec = resolve_model("llama-3.1-8b", quantization="awq")
    assert spec.weight_bytes(2) == 5_727_854_592
    assert spec.weight_bytes_by_part(2)["lm_head"] == 128256 * 4096 * 2
    assert spec.num_params() == get_model("llama-3.1-8b").num_params()


def test_unquantized_is_unchanged() -> None:
    for name in list_models():
        spec = get_model(name)
        assert deployed(spec, None, "auto") is spec
        assert spec.weight_bytes(2) == spec.num_params() * 2
        assert sum(spec.weight_bytes_by_part(4).values()) == spec.num_params() * 4


def test_fp8_kv_cache_halves_kv_bytes_per_token() -> None:
    # bf16 element = 2 bytes, fp8 = 1: Llama-3.1-8B 2*32*8*128*2 = 131,072 -> 65,536.
    assert deployed(get_model("llama-3.1-8b"), None, "fp8").kv_bytes_per_token(2) == 65_536
    for name in list_models():
        spec = get_model(name)
        for tp in (1, 2):
            half = deployed(spec, None, "fp8").kv_bytes_per_token(2, tp)
            assert 2 * half == spec.kv_bytes_per_token(2, tp)
    assert kv_element_bytes("auto", 4) == 4 and kv_element_bytes("fp8_e5m2", 2) == 1


def test_refusals_name_the_allowed_values() -> None:
    listed = ", ".join(QUANTIZATION_METHODS)
    with pytest.raises(ValueError, match=f"'bitsandbytes' is not supported.*{listed}"):
        from_name("bitsandbytes")
    with pytest.raises(ValueError, match="'gguf' is not supported"):
        from_hf_config({"quant_method": "gguf"})
    with pytest.raises(ValueError, match="compressed-tensors takes its scheme"):
        from_name("compressed-tensors")
    with pytest.raises(ValueError, match="differs from the checkpoint"):
        resolve(AWQ_CONFIG, "fp8")
    assert resolve(AWQ_CONFIG, "awq") == from_hf_config(AWQ_CONFIG)
    assert resolve(None, None) is None
    two = {**CT_W4A16, "config_groups": {"a": {}, "b": {}}}
    with pytest.raises(ValueError, match="2 config_groups"):
        from_hf_config(two)
    with pytest.raises(ValueError, match="quantization 'nf4' is not supported"):
        RunConfig(quantization="nf4")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8"):
        RunConfig(kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        deployed(get_model("llama-3.1-8b"), None, "fp4")


def test_round_trip_through_json_form() -> None:
    spec = resolve_model("llama-3.1-8b", quantization="awq", kv_cache_dtype="fp8")
    again = type(spec)(**dataclasses.asdict(spec))  # a profile or config.json read back
    assert again == spec and isinstance(again.quantization, WeightQuantization)
    q = from_hf_config({"quant_method": "fp8", "weight_block_size": [128, 128]})
    assert WeightQuantization(**q.to_dict()) == q
