"""calibration.torch_model and calibration.measure on a tiny random-weight decoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calibration.grid import REGIONS, GridConfig
from calibration.measure import cpu_kind, measure
from calibration.profile import load_profile
from calibration.specs import ModelSpec
from tests.test_calibration_profile import make_app

torch = pytest.importorskip("torch")

from calibration.torch_model import Chunk, build_decoder  # noqa: E402


def tiny_spec(**overrides: object) -> ModelSpec:
    fields: dict[str, object] = dict(
        name="tiny", hf_id="test/tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
        num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=100,
        max_position_embeddings=256, tie_word_embeddings=True, attention_bias=True,
        rope_theta=10000.0)
    fields.update(overrides)
    return ModelSpec(**fields)  # type: ignore[arg-type]


def test_kv_cache_shape_and_mixed_step() -> None:
    model = build_decoder(tiny_spec(), dtype="fp32")
    cache = model.new_cache(num_slots=3, capacity=32)
    assert len(cache.k) == len(cache.v) == 2
    assert cache.shape == (3, 2, 32, 16)
    assert cache.num_bytes() == 2 * 2 * 3 * 2 * 32 * 16 * 4
    cache.lengths[:] = [5, 5, 3]
    logits = model.step(cache, decode_slots=[0, 1], chunks=[Chunk(2, 7, sample=True)])
    assert logits.shape == (3, 100)
    assert torch.isfinite(logits).all()
    assert cache.lengths == [6, 6, 10]


def test_chunked_prefill_and_decode_match_one_full_prefill() -> None:
    """The cache, the causal masks with prior context and the rotary positions agree."""
    model = build_decoder(tiny_spec(), dtype="fp32")
    ids = torch.randint(0, 100, (11,), generator=torch.Generator().manual_seed(1))
    full = model.new_cache(1, 16)
    want = model.step(full, chunks=[Chunk(0, 11)], token_ids=ids)[0]
    parts = model.new_cache(3, 16)
    parts.lengths[:] = [0, 0, 0]
    assert model.step(parts, chunks=[Chunk(2, 6, sample=False)], token_ids=ids[:6]).shape == (
        0, 100)
    model.step(parts, chunks=[Chunk(2, 4, sample=False)], token_ids=ids[6:10])
    # decode the last token in slot 2 (a one-slot decode run), alongside nothing else
    got = model.step(parts, decode_slots=[2], token_ids=ids[10:])[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert parts.lengths[2] == 11


def test_uneven_decode_contexts_use_a_mask() -> None:
    model = build_decoder(tiny_spec(), dtype="fp32")
    ids = torch.randint(0, 100, (5,), generator=torch.Generator().manual_seed(2))
    one = model.new_cache(1, 16)
    model.step(one, chunks=[Chunk(0, 4, sample=False)], token_ids=ids[:4])
    want = model.step(one, decode_slots=[0], token_ids=ids[4:])[0]
    two = model.new_cache(2, 16)
    model.step(two, chunks=[Chunk(0, 4, sample=False), Chunk(1, 9, sample=False)],
               token_ids=torch.cat([ids[:4], ids[:4], ids[:5]]))
    got = model.step(two, decode_slots=[0, 1], token_ids=torch.tensor([ids[4], 7]))
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)


def test_moe_and_untied_build_and_run() -> None:
    spec = tiny_spec(num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
    model = build_decoder(spec, num_layers=1, dtype="bf16")
    cache = model.new_cache(2, 16)
    assert model.step(cache, decode_slots=[0], chunks=[Chunk(1, 5)]).shape == (2, 100)


def test_invalid_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="num_layers"):
        build_decoder(tiny_spec(), num_layers=3)
    with pytest.raises(ValueError, match="dtype"):
        build_decoder(tiny_spec(), dtype="int8")
    with pytest.raises(ValueError, match="device"):
        build_decoder(tiny_spec(), device="tpu")
    model = build_decoder(tiny_spec())
    with pytest.raises(ValueError, match="capacity"):
        model.step(model.new_cache(1, 8), chunks=[Chunk(0, 9)])


def test_measure_tiny_grid_covers_every_region() -> None:
    grid = GridConfig(max_num_seqs=4, max_num_batched_tokens=32, max_context=64, repeats=2)
    m = measure(tiny_spec(), grid, dtype="fp32", progress=False)
    assert {p.region for p in m.points} == set(REGIONS)
    assert len(m.points) == m.num_planned
    assert all(p.seconds > 0 and p.repeats == 2 for p in m.points)
    assert m.memory["weight_bytes"] > 0 and m.memory["peak_bytes"] is None
    assert m.num_layers == 2 and "torch threads" in m.device_name
    kind = m.device_name.split("; ")[1]
    assert torch.backends.cpu.get_cpu_capability() in kind


ZEN3 = ("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu avx2\n")
ZEN4 = ("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu avx2 avx512f avx512bw avx512_bf16\n\nprocessor\t: 1\ncpu family\t: 99\n")


def test_cpu_kind_tells_apart_cpus_named_alike() -> None:
    assert cpu_kind("AVX2", ZEN3) == "family 25 model 1, AVX2"
    # the first processor's fields; of the flags, only those that decide the bf16 path
    assert cpu_kind("AVX512", ZEN4) == "family 25 model 17, AVX512 avx512f avx512_bf16"
    assert cpu_kind("DEFAULT", "") == "DEFAULT"


def test_measure_budget_keeps_what_was_measured() -> None:
    # 100,000 rounds over the grid take minutes on any machine, so the 1 s budget must
    # cut every point short (50 rounds fit in a second on a fast one)
    grid = GridConfig(max_num_seqs=4, max_num_batched_tokens=32, max_context=64,
                      repeats=100_000)
    m = measure(tiny_spec(), grid, dtype="fp32", budget_s=1.0, progress=False)
    assert m.elapsed_s < 3.0
    assert 0 < len(m.points) <= m.num_planned
    assert all(p.repeats < 100_000 for p in m.points)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_measure_on_cuda_records_peak_memory() -> None:
    grid = GridConfig(max_num_seqs=4, max_num_batched_tokens=32, max_context=64, repeats=2)
    m = measure(tiny_spec(), grid, dtype="bf16", device="cuda", progress=False)
    assert m.memory["peak_bytes"] >= m.memory["weight_bytes"]
    assert all(p.peak_bytes for p in m.points)


def test_cli_measures_an_hf_config_end_to_end(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 100, "max_position_embeddings": 256, "tie_word_embeddings": True}))
    out = tmp_path / "tiny.json"
    result = CliRunner().invoke(make_app(), [
        "calibrate", "--config", str(config), "--dtype", "fp32", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "32", "--max-context", "64", "--repeats", "2",
        "--force", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    prof = load_profile(out)
    assert prof.num_layers_measured == 2 and prof.dtype == "fp32"
    assert len(prof.points) == prof.grid["num_planned"]
    assert "held-out" in result.stdout


def test_cli_bad_dtype_is_one_line() -> None:
    result = CliRunner().invoke(make_app(), ["calibrate", "--dtype", "int8", "--max-num-seqs",
                                             "4", "--max-num-batched-tokens", "32"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: dtype must be one of ['bf16', 'fp16', 'fp32'], got 'int8'"]


def test_decode_groups_give_the_same_logits_as_one_padded_call() -> None:
    """Grouping decodes (one attention call per group, each over its own longest context)
    changes the cost, not the result."""
    model = build_decoder(tiny_spec(), dtype="fp32")
    cache = model.new_cache(num_slots=4, capacity=32)
    gen = torch.Generator().manual_seed(3)
    cache.lengths[:] = [0, 0, 0, 0]
    model.step(cache, chunks=[Chunk(s, n, sample=False) for s, n in enumerate((20, 18, 6, 5))],
               gen=gen)
    ids = torch.randint(0, 100, (4,), generator=gen)
    cache.lengths[:] = [20, 18, 6, 5]
    one = model.step(cache, decode_slots=range(4), token_ids=ids)
    cache.lengths[:] = [20, 18, 6, 5]
    two = model.step(cache, decode_slots=range(4), token_ids=ids, decode_groups=[2, 2])
    torch.testing.assert_close(one, two, rtol=1e-5, atol=1e-5)
    assert cache.lengths == [21, 19, 7, 6]
    with pytest.raises(ValueError, match="decode_groups"):
        model.step(cache, decode_slots=range(4), token_ids=ids, decode_groups=[3])


def test_measure_timer_thread_records_the_clock() -> None:
    grid = GridConfig(max_num_seqs=2, max_num_batched_tokens=16, max_context=32, repeats=1)
    m = measure(tiny_spec(), grid, dtype="fp32", progress=False, timer="thread")
    assert m.engine == {"name": "torch", "timer": "thread", "threads": 1}
    assert all(p.seconds > 0 for p in m.points)
    auto = measure(tiny_spec(), grid, dtype="fp32", progress=False, threads=None)
    assert auto.engine["timer"] == "wall"  # several threads: their CPU time is not the step's
    with pytest.raises(ValueError, match="timer 'thread' needs device cpu and threads 1"):
        measure(tiny_spec(), grid, threads=None, timer="thread")
