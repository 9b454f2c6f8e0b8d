"""vLLM's start-up checks (sim/app/runs/startup_checks.py) and flag conflicts: every
configuration vLLM 0.32 refuses to start with is refused before anything is simulated,
one line in vLLM's words; compare's cells get their own policy's defaults; a sweep
refuses a cell vLLM refuses and a plan skips one. The numbers are chosen by hand: a
Llama-3.1-8B block of 16 tokens in bf16 holds 16 x 131,072 B = 2 MiB of KV."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import Result
from typer.testing import CliRunner

from sim.app.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "calibration/profiles/cpu-qwen2.5-0.5b.json")  # torch, CPU
VLLM_CPU_PROFILE = str(ROOT / "calibration/profiles/cpu-vllm-qwen2.5-0.5b-8l.json")
FAST = ("--num-requests", "6", "--step-time", "0.01")


@pytest.fixture(autouse=True)
def _no_long_max_model_len_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


def refused(res: Result, *words: str) -> str:
    """Assert one error line on stderr naming ``words``, exit code 1, no traceback."""
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def config(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "config.json").read_text())


# -- vLLM's scheduler config: SchedulerConfig.verify_max_model_len -------------------------

def test_budget_below_max_num_seqs_is_refused(tmp_path: Path) -> None:
    res = invoke("run", *FAST, "--max-num-seqs", "64", "--max-num-batched-tokens", "32",
                 "--out", str(tmp_path / "r"))
    refused(res, "max_num_batched_tokens (32) must be greater than or equal to "
                 "max_num_seqs (64).")
    assert not (tmp_path / "r").exists()
    ok = invoke("run", *FAST, "--max-num-seqs", "64", "--max-num-batched-tokens", "64",
                "--out", str(tmp_path / "r"))
    assert ok.exit_code == 0, ok.output


def test_unchunked_budget_below_max_model_len_is_refused(tmp_path: Path) -> None:
    args = (*FAST, "--max-num-batched-tokens", "4096", "--max-model-len", "8192")
    res = invoke("run", *args, "--policy", "continuous", "--out", str(tmp_path / "c"))
    refused(res, "policy continuous (no chunked prefill)", "max_num_batched_tokens (4096) "
                 "is smaller than max_model_len (8192)", "decrease max_model_len")
    chunked = invoke("run", *args, "--policy", "chunked", "--out", str(tmp_path / "k"))
    assert chunked.exit_code == 0, chunked.output  # chunked prefill: any budget >= seqs


def test_long_prefill_threshold_above_max_model_len_is_refused(tmp_path: Path) -> None:
    res = invoke("run", *FAST, "--max-model-len", "8192", "--long-prefill-token-threshold",
                 "8193", "--out", str(tmp_path / "r"))
    refused(res, "long_prefill_token_threshold (8193) cannot be greater than the "
                 "max_model_len (8192).")


# -- vLLM's model config: _get_and_verify_max_len, verify_with_parallel_config --------------

def test_max_model_len_above_the_context_needs_the_override(tmp_path: Path) -> None:
    # Llama-2-7B's context is 4,096 tokens.
    within = invoke("run", *FAST, "--model", "llama-2-7b", "--out", str(tmp_path / "w"))
    assert within.exit_code == 0, within.output
    assert "allow_long_max_model_len" not in config(tmp_path / "w")  # recorded only when set
    args = ("run", *FAST, "--model", "llama-2-7b", "--max-model-len", "8192")
    refused(invoke(*args, "--out", str(tmp_path / "a")),
            "User-specified max_model_len (8192) is greater than the derived max_model_len "
            "(max_position_embeddings=4096", "--allow-long-max-model-len",
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    refused(invoke(*args, "--out", str(tmp_path / "a"),
                   env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "0"}), "max_model_len (8192)")
    flag = invoke(*args, "--allow-long-max-model-len", "--out", str(tmp_path / "f"))
    assert flag.exit_code == 0, flag.output
    assert config(tmp_path / "f")["allow_long_max_model_len"] is True
    assert config(tmp_path / "f")["resolved"]["max_model_len"] == 8192
    env = invoke(*args, "--out", str(tmp_path / "e"),
                 env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": " True "})  # as vLLM's envs.py reads it
    assert env.exit_code == 0, env.output
    assert config(tmp_path / "e")["allow_long_max_model_len"] is True
    # The recorded override reproduces the run without the env var.
    again = invoke("run", "--config", str(tmp_path / "e" / "config.json"),
                   "--out", str(tmp_path / "again"))
    assert again.exit_code == 0, again.output
    assert ((tmp_path / "again" / "requests.csv").read_text()
            == (tmp_path / "e" / "requests.csv").read_text())


@pytest.mark.parametrize(("model", "tp", "words"), [
    # 64 heads over 3 GPUs: ModelConfig.verify_with_parallel_config.
    ("llama-3.1-70b", "3", ("tensor_parallel_size: Total number of attention heads (64) "
                            "must be divisible by tensor parallel size (3).",)),
    # 14 heads split 7 ways, but 2 KV heads cannot be replicated over 7 GPUs
    # (QKVParallelLinear: divide(7, 2)).
    ("qwen2.5-0.5b", "7", ("tensor_parallel_size: 7 is not divisible by 2",
                           "num_kv_heads 2")),
])
def test_tensor_parallelism_must_shard_evenly(tmp_path: Path, model: str, tp: str,
                                              words: tuple[str, ...]) -> None:
    res = invoke("run", *FAST, "--model", model, "--tensor-parallel-size", tp,
                 "--out", str(tmp_path / "r"))
    refused(res, *words)


#: Llama-2-7B's config.json (the keys servesim reads): a 4,096-token context.
LLAMA2 = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
          "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
          "vocab_size": 32000, "max_position_embeddings": 4096}


@pytest.mark.parametrize(("extra", "longest", "derived"), [
    # Linear RoPE scaling: vLLM derives 4096 x 4 = 16384.0 (a float, as it prints it).
    ({"rope_scaling": {"type": "linear", "factor": 4.0}}, 16384,
     "max_position_embeddings=16384.0 or model_max_length=None"),
    # Llama 3's RoPE is pre-scaled: its factor is not applied again.
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 4096,
     "max_position_embeddings=4096 or model_max_length=None"),
    # config.json's model_max_length allows a longer max_model_len.
    ({"model_max_length": 8192}, 8192, "max_position_embeddings=4096 or model_max_length=8192"),
])
def test_max_model_len_follows_vllms_derived_length(tmp_path: Path, extra: dict[str, Any],
                                                    longest: int, derived: str) -> None:
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**LLAMA2, **extra}))
    args = ("run", *FAST, "--model", str(model), "--max-model-len")
    ok = invoke(*args, str(longest), "--out", str(tmp_path / "ok"))
    assert ok.exit_code == 0, ok.output
    refused(invoke(*args, str(longest + 1), "--out", str(tmp_path / "no")),
            f"User-specified max_model_len ({longest + 1}) is greater than the derived "
            f"max_model_len ({derived} in model's config.json")


#: Qwen3-Coder-480B-A35B-Instruct's config.json (the keys servesim reads): every layer MoE.
QWEN3_MOE = {"model_type": "qwen3_moe", "num_hidden_layers": 62, "hidden_size": 6144,
             "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
             "intermediate_size": 8192, "moe_intermediate_size": 2560, "num_experts": 160,
             "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "vocab_size": 151936, "max_position_embeddings": 262144}


def test_an_all_moe_model_has_no_dense_mlp_to_shard(tmp_path: Path) -> None:
    # TP 24: 96 heads / 24 = 4; 24 GPUs replicate 8 KV heads 3 times. intermediate_size
    # 8192 is not divisible by 24, but Qwen3-MoE builds no dense MLP from it (every layer
    # is MoE; the experts' 2560 are split by floor division), so vLLM loads it.
    model = tmp_path / "qwen3-moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_MOE))
    args = ("run", *FAST, "--model", str(model), "--tensor-parallel-size", "24",
            "--max-model-len", "4096")
    res = invoke(*args, "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    # One layer keeping a dense MLP (mlp_only_layers) builds one of 8192 over 24 GPUs.
    (model / "config.json").write_text(json.dumps({**QWEN3_MOE, "mlp_only_layers": [0]}))
    refused(invoke(*args, "--out", str(tmp_path / "d")),
            "tensor_parallel_size: 8192 is not divisible by 24", "intermediate_size 8192")


# -- block size: CacheConfig, the attention backends ---------------------------------------

def run_with(tmp_path: Path, *args: str) -> Result:
    return invoke("run", "--num-requests", "6", *args, "--out", str(tmp_path / "r"))


def test_a_gpu_takes_multiples_of_16(tmp_path: Path) -> None:
    # The roofline prices a GPU: no CUDA attention backend takes 8 (FlashAttention,
    # Triton and FlexAttention want a multiple of 16, FlashInfer 16, 32 or 64).
    refused(run_with(tmp_path, "--block-size", "8"),
            "block_size (8) must be a multiple of 16 on a GPU",
            "No valid attention backend found for cuda")
    assert run_with(tmp_path, "--block-size", "48").exit_code == 0  # FlashAttention takes 48
    # A constant clock prices no device, servesim's torch profile no vLLM backend.
    assert run_with(tmp_path, "--block-size", "8", "--step-time", "0.01").exit_code == 0
    assert run_with(tmp_path, "--block-size", "8", "--profile", PROFILE).exit_code == 0


def test_block_size_must_be_positive(tmp_path: Path) -> None:
    refused(run_with(tmp_path, "--block-size", "0", "--step-time", "0.01"),
            "block_size: Input should be greater than 0")


def test_vllms_cpu_engine_takes_multiples_of_32(tmp_path: Path) -> None:
    refused(run_with(tmp_path, "--profile", VLLM_CPU_PROFILE, "--block-size", "16"),
            "block_size (16) must be a multiple of 32 on vLLM's CPU engine")
    ok = run_with(tmp_path, "--profile", VLLM_CPU_PROFILE, "--block-size", "128")
    assert ok.exit_code == 0, ok.output  # vLLM's CPU default


def test_an_unset_block_size_is_vllms_default_for_the_engine(tmp_path: Path) -> None:
    # vllm/platforms/cpu.py: "elif not cache_config.user_specified_block_size:
    # cache_config.block_size = 128"; CacheConfig.DEFAULT_BLOCK_SIZE = 16 elsewhere.
    from sim.app.runs.run_config import RunConfig

    assert RunConfig(profile=VLLM_CPU_PROFILE).block_size == 128
    assert RunConfig(profile=VLLM_CPU_PROFILE, model="qwen2.5-0.5b").block_size == 128
    assert RunConfig(profile=PROFILE).block_size == 16  # servesim's torch engine
    assert RunConfig().block_size == 16
    assert RunConfig(profile=VLLM_CPU_PROFILE, block_size=256).block_size == 256
    res = run_with(tmp_path, "--profile", VLLM_CPU_PROFILE)
    assert res.exit_code == 0, res.output
    assert config(tmp_path / "r")["block_size"] == 128  # the resolved size, recorded
    again = invoke("run", "--config", str(tmp_path / "r" / "config.json"),
                   "--out", str(tmp_path / "again"))
    assert again.exit_code == 0, again.output
    for name in ("requests.csv", "steps.csv", "config.json"):
        assert ((tmp_path / "again" / name).read_text()
                == (tmp_path / "r" / name).read_text()), name


# -- the KV cache: check_enough_kv_cache_memory ---------------------------------------------

def test_a_pool_below_one_max_model_len_request_is_refused(tmp_path: Path) -> None:
    # 600 blocks less vLLM's null block hold 599 x 16 = 9,584 tokens (1,198 MiB = 1.17 GiB);
    # the default max_model_len 131,072 needs 8,192 blocks = 16 GiB. vLLM checks its
    # num_gpu_blocks_override this way too.
    base = ("run", *FAST, "--num-gpu-blocks", "600")
    refused(invoke(*base, "--out", str(tmp_path / "a")),
            "max_model_len: To serve at least one request with the model's max seq len "
            "(131072), (16.0 GiB KV cache is needed, which is larger than the available KV "
            "cache memory (1.17 GiB). Based on the available memory, the estimated maximum "
            "model length is 9584.", "num_gpu_blocks")
    refused(invoke(*base, "--max-model-len", "9585", "--out", str(tmp_path / "a")),
            "max seq len (9585)", "estimated maximum model length is 9584")
    ok = invoke(*base, "--max-model-len", "9584", "--out", str(tmp_path / "b"))
    assert ok.exit_code == 0, ok.output


def test_a_pool_larger_than_the_gpu_is_refused(tmp_path: Path) -> None:
    # 50,000 blocks of 2 MiB = 97.66 GiB: more than an H100's 79.22 GiB (as torch reports
    # it) before the weights.
    res = invoke("run", *FAST, "--num-gpu-blocks", "50000", "--max-model-len", "8192",
                 "--out", str(tmp_path / "r"))
    refused(res, "num_gpu_blocks: a KV cache of 97.66 GiB does not fit the GPU's 79.22 GiB")


def test_a_pool_sized_by_hand_leaves_room_for_the_cuda_graphs(tmp_path: Path) -> None:
    # An H100 holds 85,061,827,297 B as torch reports it; Llama-3.1-8B takes 16,060,522,496
    # B of weights + 33,554,432 B of rotary cache, and 268,435,456 B (0.25 GiB) of
    # non-torch memory: 68,699,314,913 B left, 32,758 blocks of 2 MiB (68,698,505,216 B).
    # vLLM 0.32 allocates an overridden pool whatever memory says, then captures its CUDA
    # graphs (gpu_worker.py compile_or_warm_up_model): 332,859,965 + 182,452 x 32 layers x
    # 100 further graphs = 916,706,365 B with vLLM's defaults, which 32,758 blocks leave no
    # room for. 32,321 blocks (67,782,049,792 B) leave 67,782,608,548 B >= them.
    base = ("run", *FAST, "--num-gpu-blocks")
    refused(invoke(*base, "32758", "--out", str(tmp_path / "a")),
            "num_gpu_blocks: a KV cache of 63.98 GiB leaves the GPU's 79.22 GiB no room",
            "for the 0.85 GiB of CUDA graphs vLLM captures after allocating it",
            "CUDA out of memory")
    for blocks, extra in (("32321", ()), ("32758", ("--enforce-eager",)),
                          ("32758", ("--cudagraph-mode", "NONE"))):
        ok = invoke(*base, blocks, *extra, "--out", str(tmp_path / "b"))
        assert ok.exit_code == 0, ok.output
        assert config(tmp_path / "b")["resolved"]["num_gpu_blocks"] == int(blocks)
    refused(invoke(*base, "32322", "--out", str(tmp_path / "c")), "no room")


# -- flag conflicts ------------------------------------------------------------------------

def test_profile_with_another_model_is_refused(tmp_path: Path) -> None:
    res = invoke("run", *FAST[:2], "--profile", PROFILE, "--model", "llama-3.1-8b",
                 "--out", str(tmp_path / "r"))
    refused(res, "--model llama-3.1-8b conflicts with --profile", "qwen2.5-0.5b")
    same = invoke("run", *FAST[:2], "--profile", PROFILE, "--model", "qwen2.5-0.5b",
                  "--out", str(tmp_path / "s"))
    assert same.exit_code == 0, same.output
    alone = invoke("run", *FAST[:2], "--profile", PROFILE, "--out", str(tmp_path / "p"))
    assert alone.exit_code == 0, alone.output
    assert config(tmp_path / "p")["model"] == "qwen2.5-0.5b"  # the resolved name


def test_model_left_out_is_the_default_or_the_profiles() -> None:
    from sim.app.runs.runner import RunConfig

    assert RunConfig().model == "llama-3.1-8b"
    assert RunConfig(profile=PROFILE).model == "qwen2.5-0.5b"


def test_step_time_with_profile_is_refused(tmp_path: Path) -> None:
    res = invoke("run", *FAST, "--profile", PROFILE, "--out", str(tmp_path / "r"))
    refused(res, "--step-time", "--profile")


def test_static_refuses_a_token_budget(tmp_path: Path) -> None:
    res = invoke("run", *FAST, "--policy", "static", "--max-num-batched-tokens", "2048",
                 "--out", str(tmp_path / "r"))
    refused(res, "static batching has no token budget", "--policy static",
            "--max-num-batched-tokens")


def test_a_static_run_records_no_budget_and_reproduces(tmp_path: Path) -> None:
    res = invoke("run", *FAST, "--policy", "static", "--out", str(tmp_path / "s"))
    assert res.exit_code == 0, res.output
    assert config(tmp_path / "s")["max_num_batched_tokens"] is None
    again = invoke("run", "--config", str(tmp_path / "s" / "config.json"),
                   "--out", str(tmp_path / "again"))
    assert again.exit_code == 0, again.output
    for name in ("requests.csv", "steps.csv", "config.json"):
        assert ((tmp_path / "again" / name).read_text()
                == (tmp_path / "s" / name).read_text()), name


# -- run --compare: each cell its own engine -------------------------------------------------

def test_compare_cells_get_their_own_policys_defaults(tmp_path: Path) -> None:
    # An A100-40GB's API-server budget is 2,048; vLLM without chunked prefill raises a
    # default budget to max_model_len: max(2048, max_model_len).
    for max_model_len, continuous_budget in ((8192, 8192), (1024, 2048)):
        out = tmp_path / f"cmp{max_model_len}"
        res = invoke("run", *FAST, "--gpu", "a100-40gb", "--max-model-len",
                     str(max_model_len), "--out", str(out), "--compare", "continuous,chunked")
        assert res.exit_code == 0, res.output
        assert config(out / "continuous")["max_num_batched_tokens"] == continuous_budget
        assert config(out / "chunked")["max_num_batched_tokens"] == 2048


def test_compare_static_cell_runs_without_the_budget(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    res = invoke("run", *FAST, "--max-num-batched-tokens", "4096", "--out", str(out),
                 "--compare", "static,chunked")
    assert res.exit_code == 0, res.output
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "static batching has no token budget" in warnings[0]
    assert config(out / "static")["max_num_batched_tokens"] is None
    assert config(out / "chunked")["max_num_batched_tokens"] == 4096


def test_compare_takes_a_budget_when_no_cell_is_static(tmp_path: Path) -> None:
    # The cells set the policies: --policy static names none of them, so its lack of a
    # token budget is no conflict with --max-num-batched-tokens.
    out = tmp_path / "cmp"
    res = invoke("run", *FAST, "--policy", "static", "--max-num-batched-tokens", "8192",
                 "--max-model-len", "8192", "--out", str(out), "--compare", "chunked,continuous")
    assert res.exit_code == 0, res.output
    assert "warning:" not in res.stderr
    assert config(out / "chunked")["max_num_batched_tokens"] == 8192
    assert config(out / "continuous")["max_num_batched_tokens"] == 8192


def test_compare_refuses_a_cell_vllm_refuses_before_any_runs(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    res = invoke("run", *FAST, "--max-num-batched-tokens", "2048", "--max-model-len", "8192",
                 "--out", str(out), "--compare", "chunked,continuous")
    refused(res, "compare: cell 'continuous'", "max_num_batched_tokens (2048) is smaller "
                 "than max_model_len (8192)")
    assert not out.exists()


# -- sweep refuses, plan skips ---------------------------------------------------------------

def test_sweep_refuses_a_cell_vllm_refuses(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    res = invoke("sweep", *FAST, "--max-num-seqs", "16,64", "--max-num-batched-tokens", "32",
                 "--workers", "1", "--out", str(out))
    refused(res, "sweep cell max_num_seqs 64", "max_num_batched_tokens (32) must be greater "
                 "than or equal to max_num_seqs (64).")
    assert not out.exists()
    # Not a start-up check: weights that leave no room for the KV cache keep their row.
    res = invoke("sweep", *FAST, "--gpu-memory-utilization", "0.01,0.9", "--workers", "1",
                 "--out", str(out))
    assert res.exit_code == 0, res.output
    assert list(pd.read_csv(out / "sweep.csv")["error"].isna()) == [False, True]


def test_plan_skips_a_candidate_vllm_refuses(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = invoke("plan", "--num-requests", "20", "--step-time", "0.01", "--slo-ttft", "1",
                 "--tensor-parallel-size", "1,3", "--seeds", "0", "--max-probes", "3",
                 "--workers", "1", "--out", str(out))
    assert res.exit_code == 0, res.output
    configs = json.loads((out / "plan.json").read_text())["configs"]
    assert configs[0]["error"] == "" and configs[0]["interval"][0] > 0
    assert configs[1]["error"].startswith(
        "skipped: vLLM refuses it at start-up: tensor_parallel_size: Total number of "
        "attention heads (32) must be divisible by tensor parallel size (3).")
    assert "skipped: vLLM refuses it" in (out / "capacity.md").read_text()
