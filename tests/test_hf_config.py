"""Models from a Hugging Face config.json (calibration/hf_config.py): three public
architectures that are not presets (tests/data/hf_configs: a dense GQA model, an MoE with
MLA, an FP8 checkpoint) read, sized by hand, and run; the layer patterns and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibration.hf_config import resolve_model, spec_from_hf_config
from calibration.specs import ModelSpec, get_model
from sim.app.cli.main import app

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def test_qwen3_8b_dense_gqa_by_hand() -> None:
    spec = spec_from_hf_config(CONFIGS / "Qwen3-8B")
    assert (spec.name, spec.num_kv_heads, spec.head_dim, spec.qk_norm) == ("Qwen3-8B", 8, 128, True)
    # Per layer: qkv 4096 x (32*128 + 2*8*128 = 6144) = 25,165,824; o 4096 x 4096 =
    # 16,777,216; q/k norms 2*128 = 256; MLP 3*4096*12288 = 150,994,944; norms 2*4096 =
    # 8,192 -> 192,946,432, x36 = 6,946,071,552. Embedding and untied LM head
    # 2*151936*4096 = 1,244,659,712; final norm 4,096. Total 8,190,735,360 (HF: 8.19B).
    assert spec.num_params() == 8_190_735_360
    assert spec.weight_bytes(2) == 16_381_470_720
    # KV: 2 * 36 layers * 8 heads * 128 * 2 bytes = 147,456; fp8 halves it.
    assert spec.kv_bytes_per_token(2) == 147_456
    assert resolve_model(str(CONFIGS / "Qwen3-8B"), kv_cache_dtype="fp8").kv_bytes_per_token(
        2) == 73_728
    # TP 4: 2 KV heads per GPU -> 36,864.
    assert spec.kv_bytes_per_token(2, 4) == 36_864


def test_deepseek_v2_lite_moe_mla_by_hand() -> None:
    spec = spec_from_hf_config(CONFIGS / "DeepSeek-V2-Lite" / "config.json")
    assert (spec.num_experts, spec.num_experts_per_tok, spec.num_dense_layers) == (64, 6, 1)
    assert (spec.kv_lora_rank, spec.qk_rope_head_dim, spec.v_head_dim) == (512, 64, 128)
    assert (spec.head_dim, spec.q_lora_rank, spec.shared_expert_intermediate_size) == (
        192, None, 2 * 1408)
    # Attention per layer: q_proj 2048 x 16*192 = 6,291,456; kv_a_proj_with_mqa
    # 2048 x (512+64) = 1,179,648; kv_b_proj 512 x 16*(128+128) = 2,097,152; o_proj
    # 16*128 x 2048 = 4,194,304; kv_a_layernorm 512 -> 13,763,072.
    assert spec.attention_params_per_layer == 13_763_072
    # Dense layer 0: + MLP 3*2048*10944 = 67,239,936 + norms 4,096 -> 81,007,104.
    # MoE layers 1-26: 64 experts * 3*2048*1408 = 553,648,128; shared 3*2048*2816 =
    # 17,301,504; router 2048*64 = 131,072; + 13,763,072 + 4,096 -> 584,847,872, x26 =
    # 15,206,044,672. Embedding + LM head 2*102400*2048 = 419,430,400; final norm 2,048.
    # Total 15,706,484,224 (DeepSeek: 15.7B); active: 6 experts -> 83,104,256 per MoE
    # layer, x26 = 2,160,710,656 + 81,007,104 + 2,048 + LM head 209,715,200 = 2,451,435,008
    # (DeepSeek: 2.4B activated).
    assert spec.num_params() == 15_706_484_224
    assert spec.num_active_params_per_token() == 2_451_435_008
    assert spec.weight_bytes(2) == 31_412_968_448
    # MLA caches the latent and the rope key: 27 * (512 + 64) * 2 = 31,104 per token, the
    # same on every GPU under TP; fp8: 15,552.
    assert spec.kv_bytes_per_token(2) == 31_104
    assert spec.kv_bytes_per_token(2, 2) == 31_104
    fp8 = resolve_model(str(CONFIGS / "DeepSeek-V2-Lite"), kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token(2) == 15_552
    # Per (query, context) pair: 2 * 27 * 16 * (2*512 + 64) = 940,032 FLOPs.
    assert spec.attention_flops_per_pair() == 940_032


def test_qwen3_8b_fp8_checkpoint_by_hand() -> None:
    spec = spec_from_hf_config(CONFIGS / "Qwen3-8B-FP8")
    q = spec.quantization
    assert q is not None and (q.method, q.strategy, q.block_size) == ("fp8", "block", (128, 128))
    # Per layer, fp8 weights (1 byte) + fp32 scales per 128x128 tile:
    #   qkv 4096->6144: 25,165,824 + 48*32*4 = 6,144;  o 4096->4096: 16,777,216 + 32*32*4
    #   = 4,096;  gate_up 4096->24576: 100,663,296 + 192*32*4 = 24,576;  down 12288->4096:
    #   50,331,648 + 32*96*4 = 12,288  -> 192,985,088; q/k norms 256*2 = 512 and two
    #   norms 8192*2 = 16,384 in bf16 -> 193,001,984, x36 = 6,948,071,424.
    #   Embedding + LM head unquantized 2*151936*4096*2 = 2,489,319,424; final norm 8,192.
    #   Total 9,437,399,040.
    assert spec.weight_bytes(2) == 9_437_399_040
    assert spec.num_params() == 8_190_735_360
    assert spec.kv_bytes_per_token(2) == 147_456  # the KV cache stays bf16 unless asked


def _run(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}{len(extra)}"
    result = CliRunner().invoke(app, [
        "run", "--model", str(CONFIGS / name), "--gpu", "h100-sxm", "--num-requests", "30",
        "--rate", "4", "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("name", ["Qwen3-8B", "DeepSeek-V2-Lite", "Qwen3-8B-FP8"])
def test_runs_from_config_json(tmp_path: Path, name: str) -> None:
    config = _run(tmp_path, name)
    spec = spec_from_hf_config(CONFIGS / name)
    resolved = config["resolved"]
    assert ModelSpec(**resolved["model_spec"]) == spec  # the spec, as run, in config.json
    assert resolved["kv_plan"]["kv_bytes_per_token"] == spec.kv_bytes_per_token(2)
    assert resolved["kv_plan"]["weights_bytes"] >= spec.weight_bytes(2)
    # At the same block size (an MLA model's FP8 KV cache on an H100 would otherwise get
    # FLASHMLA's 64: tests/test_attention_backends.py).
    fp8 = _run(tmp_path, name, "--kv-cache-dtype", "fp8", "--block-size", "16")["resolved"]
    assert 2 * fp8["kv_plan"]["kv_bytes_per_token"] == resolved["kv_plan"]["kv_bytes_per_token"]
    # Half the bytes per token: twice the blocks from the same budget (floor: +1 at most).
    assert fp8["num_gpu_blocks"] - 2 * resolved["num_gpu_blocks"] in (0, 1)


def test_inspect_prints_the_derived_figures() -> None:
    result = CliRunner().invoke(app, ["inspect", "--model", str(CONFIGS / "Qwen3-8B-FP8")])
    assert result.exit_code == 0, result.output
    assert "8,190,735,360" in result.output and "9,437,399,040" in result.output
    assert "147,456" in result.output and "W8A8-FP8" in result.output
    bad = CliRunner().invoke(app, ["inspect", "--model", "llama-3.1-8b", "--quantization", "x"])
    assert bad.exit_code == 1 and "quantization 'x' is not supported" in bad.output


def _write(tmp_path: Path, config: dict) -> Path:
    file = tmp_path / "m" / "config.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(config))
    return file


BASE = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
        "max_position_embeddings": 32768}


def test_sliding_window_layers(tmp_path: Path) -> None:
    mistral = spec_from_hf_config(_write(tmp_path, {**BASE, "sliding_window": 4096}))
    assert (mistral.sliding_window, mistral.num_sliding_window_layers) == (4096, 32)
    qwen2 = {**BASE, "sliding_window": 4096, "use_sliding_window": False}
    assert spec_from_hf_config(_write(tmp_path, qwen2)).sliding_window is None
    on = {**qwen2, "use_sliding_window": True, "max_window_layers": 28}
    assert spec_from_hf_config(_write(tmp_path, on)).num_sliding_window_layers == 4
    types = ["sliding_attention", "full_attention"] * 16
    mixed = spec_from_hf_config(_write(tmp_path, {**BASE, "sliding_window": 512,
                                                  "layer_types": types}))
    assert mixed.num_sliding_window_layers == 16
    # Every layer's KV counts in full (vLLM's hybrid manager: one page per layer per block).
    assert mixed.kv_bytes_per_token(2) == get_model("mistral-7b").kv_bytes_per_token(2)


def test_moe_layer_patterns(tmp_path: Path) -> None:
    qwen_moe = {**BASE, "num_experts": 8, "num_experts_per_tok": 2,
                "moe_intermediate_size": 1024, "decoder_sparse_step": 2,
                "mlp_only_layers": [1]}
    # MoE where (i+1) % 2 == 0 and i not in [1]: i = 3, 5, ..., 31 -> 15 MoE, 17 dense.
    assert spec_from_hf_config(_write(tmp_path, qwen_moe)).num_dense_layers == 17
    deepseek = {**BASE, "n_routed_experts": 8, "num_experts_per_tok": 2,
                "first_k_dense_replace": 3, "moe_layer_freq": 2}
    # MoE where i >= 3 and i even: 4, 6, ..., 30 -> 14 MoE, 18 dense.
    assert spec_from_hf_config(_write(tmp_path, deepseek)).num_moe_layers == 14


def test_text_config_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nested = {"model_type": "mistral3", "text_config": BASE}
    assert spec_from_hf_config(_write(tmp_path, nested)).num_layers == 32
    missing = _write(tmp_path, {"hidden_size": 8})
    with pytest.raises(ValueError, match=f"{missing}: config.json lacks required keys: "
                                         "num_hidden_layers"):
        spec_from_hf_config(missing)
    with pytest.raises(ValueError, match="not a JSON file"):
        spec_from_hf_config(_bad_json(tmp_path))
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5'; known: qwen2\.5-0\.5b"):
        resolve_model("gpt-5")
    # A preset name wins over a folder of that name.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama-3.1-8b").mkdir()
    (tmp_path / "llama-3.1-8b" / "config.json").write_text(json.dumps(BASE))
    assert resolve_model("llama-3.1-8b") == get_model("llama-3.1-8b")


def _bad_json(tmp_path: Path) -> Path:
    file = tmp_path / "bad.json"
    file.write_text("{not json")
    return file
