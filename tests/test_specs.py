"""ModelSpec / GPUSpec: hand-computed sizes, presets, lookups and HF config loading."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from calibration.gpus import GPUSpec, get_gpu, list_gpus, load_gpu_spec
from calibration.hf_config import spec_from_hf_config
from calibration.specs import DTYPE_BYTES, GIB, get_model, list_models

MODELS = [
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-7b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "mistral-7b",
    "llama-2-7b",
    "mixtral-8x7b",
]
GPUS = [
    "a100-40gb",
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200-sxm",
    "b200",
    "mi300x",
    "l4",
    "l40s",
    "rtx-3060",
    "rtx-3090",
    "rtx-4090",
    "rtx-5090",
]

# 2 * layers * kv_heads * head_dim * 2 bytes, by hand (matches shared/models README table).
KV_BYTES_BF16 = {
    "qwen2.5-0.5b": 2 * 24 * 2 * 64 * 2,  # 12,288
    "qwen2.5-1.5b": 2 * 28 * 2 * 128 * 2,  # 28,672
    "qwen2.5-7b": 2 * 28 * 4 * 128 * 2,  # 57,344
    "llama-3.1-8b": 2 * 32 * 8 * 128 * 2,  # 131,072
    "llama-3.1-70b": 2 * 80 * 8 * 128 * 2,  # 327,680
    "mistral-7b": 131_072,
    "llama-2-7b": 2 * 32 * 32 * 128 * 2,  # 524,288
    "mixtral-8x7b": 131_072,
}


def test_presets_are_listed_in_order() -> None:
    assert list_models() == MODELS
    assert list_gpus() == GPUS


@pytest.mark.parametrize("name", MODELS)
def test_kv_bytes_per_token(name: str) -> None:
    spec = get_model(name)
    assert spec.kv_bytes_per_token() == KV_BYTES_BF16[name]
    assert spec.kv_bytes_per_token(DTYPE_BYTES["fp32"]) == 2 * KV_BYTES_BF16[name]
    assert spec.source


def test_qwen_1_5b_kv_is_28_kib() -> None:
    assert get_model("qwen2.5-1.5b").kv_bytes_per_token(2) == 28_672


def test_llama_3_1_8b_param_count() -> None:
    spec = get_model("llama-3.1-8b")
    embedding = 128_256 * 4096
    attention = 4096 * 4096 * 2 + 4096 * 1024 * 2  # q, o; k, v (8 kv heads * 128)
    mlp = 3 * 4096 * 14_336
    per_layer = attention + mlp + 2 * 4096
    expected = embedding + 32 * per_layer + 4096 + embedding  # untied LM head
    assert expected == 8_030_261_248
    assert spec.num_params() == expected
    assert spec.num_params() == pytest.approx(8.03e9, rel=0.01)
    assert spec.weight_bytes() == 2 * expected
    assert spec.weight_bytes(4) == 4 * expected
    # Active: everything but the embedding lookup (the LM head is a matmul).
    assert spec.num_active_params_per_token() == expected - embedding


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("qwen2.5-0.5b", 0.49e9),  # Qwen2.5 report: 0.49B
        ("qwen2.5-1.5b", 1.54e9),
        ("qwen2.5-7b", 7.61e9),
        ("llama-3.1-70b", 70.6e9),
        ("mistral-7b", 7.24e9),
        ("llama-2-7b", 6.74e9),
        ("mixtral-8x7b", 46.7e9),
    ],
)
def test_param_counts_match_published_sizes(name: str, published: float) -> None:
    assert get_model(name).num_params() == pytest.approx(published, rel=0.01)


def test_qwen_has_qkv_biases_and_tied_embeddings() -> None:
    spec = get_model("qwen2.5-0.5b")
    assert spec.attention_bias and spec.tie_word_embeddings
    q, kv = 14 * 64, 2 * 64
    assert spec.attention_params_per_layer == 896 * (q + 2 * kv) + q * 896 + (q + 2 * kv)
    # Tied: the LM head adds no stored parameters but still runs per token.
    untied = replace(spec, tie_word_embeddings=False)
    assert untied.num_params() - spec.num_params() == 151_936 * 896
    assert spec.num_active_params_per_token() == untied.num_active_params_per_token()
    assert not get_model("llama-3.1-8b").attention_bias


def test_mixtral_active_params_use_top2_experts() -> None:
    spec = get_model("mixtral-8x7b")
    assert (spec.num_experts, spec.num_experts_per_tok) == (8, 2)
    attention = 4096 * 4096 * 2 + 4096 * 1024 * 2
    expert = 3 * 4096 * 14_336
    router, norms = 4096 * 8, 2 * 4096
    lm_head = 32_000 * 4096
    total = 32_000 * 4096 + 32 * (attention + 8 * expert + router + norms) + 4096 + lm_head
    active = 32 * (attention + 2 * expert + router + norms) + 4096 + lm_head
    assert spec.num_params() == total
    assert spec.num_active_params_per_token() == active
    assert active == pytest.approx(12.75e9, rel=0.01)


def test_tensor_parallel_kv_sharding() -> None:
    spec = get_model("llama-3.1-70b")
    assert spec.kv_bytes_per_token(2, tensor_parallel_size=8) == 327_680 // 8
    # More GPUs than KV heads: vLLM replicates one KV head per GPU.
    assert spec.kv_bytes_per_token(2, tensor_parallel_size=16) == 327_680 // 8
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        get_model("llama-3.1-8b").kv_bytes_per_token(2, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        spec.kv_bytes_per_token(2, tensor_parallel_size=0)


def test_lookups_are_case_insensitive_with_aliases() -> None:
    assert get_model("Llama-3.1-8B") is not None
    assert get_model("Llama-3.1-8B").hf_id == "meta-llama/Llama-3.1-8B"
    assert get_gpu("H100-SXM").name == "h100-sxm"
    assert get_gpu("a100-80gb-sxm") == get_gpu("a100-80gb")
    assert get_gpu("A100-80GB-SXM").name == "a100-80gb"


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ValueError) as model_err:
        get_model("gpt-5")
    assert str(model_err.value) == "unknown model 'gpt-5'; known: " + ", ".join(MODELS)
    with pytest.raises(ValueError) as gpu_err:
        get_gpu("tpu-v5")
    assert str(gpu_err.value) == ("unknown GPU 'tpu-v5'; known: " + ", ".join(GPUS)
                                  + " (or a .json/.toml/.yaml/.yml spec file)")


def test_gpu_numbers() -> None:
    h100 = get_gpu("h100-sxm")
    assert h100.memory_bytes == 80 * GIB
    assert h100.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.peak_flops("bf16") == pytest.approx(989.4e12)
    assert h100.peak_flops("fp16") == pytest.approx(989.4e12)
    assert h100.peak_flops("fp32") == pytest.approx(67e12)
    assert h100.interconnect_bandwidth_bytes_per_s == pytest.approx(450e9)  # NVLink 4, one way
    assert h100.interconnect_latency_s == pytest.approx(10e-6)
    assert get_gpu("h200-sxm").memory_bytes == 140 * GIB  # 141 GB label, ~140 GiB usable
    assert get_gpu("rtx-3060").peak_flops("bf16") == pytest.approx(25.5e12)  # FP32 accumulate
    assert all(get_gpu(name).source for name in GPUS)
    with pytest.raises(ValueError, match="dtype"):
        h100.peak_flops("int8")


def test_gpu_spec_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="memory_bandwidth_bytes_per_s"):
        GPUSpec("x", GIB, 0.0, 1e12, 1e12, 1e12)
    with pytest.raises(ValueError, match="fp8_flops"):
        GPUSpec("x", GIB, 1e12, 1e12, 1e12, 1e12, fp8_flops=0.0)


def test_gpu_fp8_peak_and_reported_memory() -> None:
    h100 = get_gpu("h100-sxm")
    assert h100.peak_flops("fp8") == pytest.approx(1978.9e12)  # 3,958 with sparsity / 2
    assert h100.total_memory_bytes == round(79.22 * GIB)  # vLLM's total_gpu_memory
    a100 = get_gpu("a100-80gb")
    with pytest.raises(ValueError, match="fp8"):
        a100.peak_flops("fp8")  # Ampere has no FP8 tensor cores
    assert a100.total_memory_bytes == 80 * GIB  # no reported figure: the label stands in
    assert get_gpu("rtx-4090").total_memory_bytes == 25_250_627_584


SPEC = {"memory_gib": 48, "memory_bytes_reported": 47_697_362_944,
        "memory_bandwidth_gb_s": 864, "bf16_tensor_dense_tflops": 362.05,
        "fp16_tensor_dense_tflops": 362.05, "fp8_tensor_dense_tflops": 733,
        "fp32_tflops": 91.6, "interconnect_bandwidth_gb_s": 32, "interconnect_latency_us": 40}


def _check_spec(spec: GPUSpec, name: str) -> None:
    assert spec.name == name
    assert spec.memory_bytes == 48 * GIB and spec.total_memory_bytes == 47_697_362_944
    assert spec.memory_bandwidth_bytes_per_s == pytest.approx(864e9)
    assert spec.peak_flops("fp8") == pytest.approx(733e12)
    assert spec.interconnect_latency_s == pytest.approx(40e-6)


def test_gpu_spec_file_json_and_toml(tmp_path: Path) -> None:
    (tmp_path / "my-l40s.json").write_text(json.dumps(SPEC))
    _check_spec(get_gpu(str(tmp_path / "my-l40s.json")), "my-l40s")
    toml = "\n".join(f"{k} = {v}" for k, v in {**SPEC, "name": '"lab-l40s"'}.items())
    (tmp_path / "x.toml").write_text(toml)
    _check_spec(get_gpu(str(tmp_path / "x.toml")), "lab-l40s")


def test_gpu_spec_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such GPU spec file"):
        get_gpu(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"memory_gib": 24}))
    with pytest.raises(ValueError, match="missing keys: memory_bandwidth_gb_s"):
        get_gpu(str(tmp_path / "bad.json"))
    (tmp_path / "broken.toml").write_text("memory_gib = ")
    with pytest.raises(ValueError, match="cannot read GPU spec"):
        get_gpu(str(tmp_path / "broken.toml"))
    with pytest.raises(ValueError, match=r"\.json, \.toml, \.yaml or \.yml"):
        load_gpu_spec(tmp_path / "x.ini")


def test_model_spec_validation_names_the_field() -> None:
    spec = get_model("llama-3.1-8b")
    with pytest.raises(ValueError, match="num_kv_heads"):
        replace(spec, num_kv_heads=5)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        replace(spec, num_experts_per_tok=2)
    with pytest.raises(ValueError, match="hidden_size"):
        replace(spec, hidden_size=0)


def _write_config(folder: Path, config: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


LLAMA_CONFIG: dict[str, object] = {
    "_name_or_path": "meta-llama/Llama-3.1-8B",
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "attention_bias": False,
}


def test_from_hf_config_matches_preset(tmp_path: Path) -> None:
    path = _write_config(tmp_path / "llama-3.1-8b", LLAMA_CONFIG)
    spec = spec_from_hf_config(path)
    preset = get_model("llama-3.1-8b")
    assert replace(spec, source="") == replace(preset, source="")
    assert spec_from_hf_config(path.parent) == spec  # a folder works too


def test_from_hf_config_qwen_and_mixtral(tmp_path: Path) -> None:
    qwen = dict(LLAMA_CONFIG, model_type="qwen2")
    del qwen["attention_bias"]
    assert spec_from_hf_config(_write_config(tmp_path / "q", qwen)).attention_bias
    mixtral = dict(LLAMA_CONFIG, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2)
    spec = spec_from_hf_config(_write_config(tmp_path / "m", mixtral))
    assert (spec.num_experts, spec.num_experts_per_tok) == (8, 2)


def test_from_hf_config_names_missing_keys(tmp_path: Path) -> None:
    config = {k: v for k, v in LLAMA_CONFIG.items() if k not in ("vocab_size", "hidden_size")}
    with pytest.raises(ValueError, match="hidden_size, vocab_size"):
        spec_from_hf_config(_write_config(tmp_path, config))


def test_calibration_does_not_read_shared_at_runtime() -> None:
    package = Path(__file__).resolve().parent.parent / "calibration"
    for module in ("specs.py", "memory.py", "roofline.py"):
        text = (package / module).read_text()  # "shared experts" is a model term
        assert "../shared" not in text and "shared/" not in text
