"""A run's CUDA-graph settings (sim/app/runs/cudagraph_settings.py): a vLLM serve YAML's
compilation_config, optimization level and capture-size keys read as vLLM 0.32 reads
them, each kept as given and settled with the command line's as vLLM settles them, the
KV plan they give (Llama-3.1-8B on an H100 with vLLM's defaults: 1,024 sequences, 8,192
tokens), config.json's record of them and the deployment YAML that writes them back."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from calibration.cuda_graphs import CUDA_GRAPH_BYTES_PER_GRAPH_LAYER
from sim.app.cli.main import app
from sim.app.cli.options import OPTIONS as ALL_OPTIONS
from sim.app.runs.config_file import read_config
from sim.app.runs.cudagraph_settings import GRAPH_FIELDS
from sim.app.runs.deploy_config import Deployment, serve_keys
from sim.app.runs.runner import Prepared, RunConfig, prepare

pytest.importorskip("yaml")
runner = CliRunner()
OPTIONS = {"model", "enforce_eager", "performance_mode", "policy", *GRAPH_FIELDS}

#: Llama-3.1-8B's bf16 KV block: 16 tokens x 32 layers x 8 KV heads x 128 x (K, V) x 2 B.
BLOCK_BYTES = 16 * 32 * 8 * 128 * 2 * 2

# The default plan on an H100, by hand (calibration/memory.py):
#   kv = ceil(0.9 x total) - weights - activation peak - non-torch - CUDA graphs
#: What torch reports of an H100 80GB (calibration/data/gpus.json), x vLLM's default 0.9.
REQUESTED = math.ceil(0.9 * 85_061_827_297)
#: Llama-3.1-8B's 8,030,261,248 parameters: untied embeddings and LM head (128,256 x 4,096
#: each), 32 layers of q, o (4,096^2 each), k, v (4,096 x 1,024 each), gate, up, down
#: (4,096 x 14,336 each) and two norms, a final norm; bf16, plus the rotary cos/sin cache
#: of 131,072 positions x 128 (calibration/memory.py rope_cache_bytes).
PARAMS = (2 * 128_256 * 4_096 + 4_096
          + 32 * (2 * 4_096**2 + 2 * 4_096 * 1_024 + 3 * 4_096 * 14_336 + 2 * 4_096))
WEIGHTS = 2 * PARAMS + 131_072 * 128 * 2
#: The profile run's peak (activation_peak_bytes): the sampler's, 1.5 x 8,192 tokens x
#: 4,096 x 2 B of hidden states + 1,024 rows x 128,256 logits x 14.6 B, above the forward's
#: 8,192 x 2 B x (3 x 4,096 + 3 x 14,336).
ACTIVATIONS = max(8_192 * 2 * (3 * 4_096 + 3 * 14_336),
                  math.ceil(1.5 * 8_192 * 4_096 * 2 + 1_024 * 128_256 * 14.6))
NON_TORCH = 268_435_456  # 0.25 GiB: NON_TORCH_BYTES_TP1
#: FULL_AND_PIECEWISE over 51 sizes: the first capture + 100 further graphs x 32 layers
#: (tests/test_cuda_graphs.py).
GRAPHS = 332_859_965 + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 32 * 100
DEFAULT_KV_BYTES = REQUESTED - WEIGHTS - ACTIVATIONS - NON_TORCH - GRAPHS
DEFAULT_BLOCKS = DEFAULT_KV_BYTES // BLOCK_BYTES
#: No graphs: (DEFAULT_KV_BYTES + GRAPHS) // BLOCK_BYTES.
EAGER_BLOCKS = (DEFAULT_KV_BYTES + GRAPHS) // BLOCK_BYTES


def read(tmp_path: Path, text: str, options: set[str] = OPTIONS) -> Any:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return read_config(path, options)


def plan(tmp_path: Path, text: str, **flags: Any) -> Prepared:
    """The run a vLLM serve YAML ``text`` configures under ``flags`` (the command line's;
    a constant step time, 2 requests)."""
    cf = read(tmp_path, "model: meta-llama/Llama-3.1-8B\n" + text)
    return prepare(RunConfig(gpu="h100-sxm", num_requests=2, step_time=0.01,
                             **{**cf.values, **flags}))


def invoke(tmp_path: Path, *args: str) -> Any:
    return runner.invoke(app, ["run", *args, "--num-requests", "2", "--step-time", "0.01",
                               "--out", str(tmp_path / "r")])


def refused(res: Any, *needles: str) -> None:
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.exit_code == 1 and lines[-1].startswith("error:"), res.output
    assert all(n in lines[-1] for n in needles), lines[-1]


def test_the_default_plan_is_the_sum_of_its_parts() -> None:
    default = prepare(RunConfig(gpu="h100-sxm", num_requests=2, step_time=0.01))
    p = default.kv_plan
    assert p is not None
    assert (p.requested_bytes, p.weights_bytes, p.activation_bytes, p.non_torch_bytes,
            p.cudagraph_bytes) == (REQUESTED, WEIGHTS, ACTIVATIONS, NON_TORCH, GRAPHS)
    assert (p.kv_bytes, default.num_gpu_blocks) == (DEFAULT_KV_BYTES, DEFAULT_BLOCKS)
    assert (DEFAULT_KV_BYTES, DEFAULT_BLOCKS, EAGER_BLOCKS) == (57_258_284_020, 27_302,
                                                                  27_739)


def test_compilation_config_and_top_level_keys_are_read_as_given(tmp_path: Path) -> None:
    cf = read(tmp_path, "compilation-config:\n  cudagraph_mode: piecewise\n  mode: 3\n"
                        "  pass_config: {fuse_norm_quant: true}\n"
                        "max-cudagraph-capture-size: '64'\noptimization-level: 1\n"
                        "port: 8000\n")
    assert cf.values == {"cudagraph_mode": "PIECEWISE", "compilation_mode": "VLLM_COMPILE",
                         "max_cudagraph_capture_size": 64, "optimization_level": 1}
    assert cf.ignored == ("port", "compilation_config.pass_config") and cf.notes == ()
    # --compilation-config's JSON text; its capture sizes are the same setting, and a
    # top-level one may be one integer (vLLM's YAML reader: --cudagraph-capture-sizes 8).
    cf = read(tmp_path, "compilation_config: '{\"cudagraph_mode\": \"FULL_DECODE_ONLY\", "
                        "\"cudagraph_capture_sizes\": [1, 2, 4]}'\n")
    assert cf.values == {"cudagraph_mode": "FULL_DECODE_ONLY",
                         "cudagraph_capture_sizes": [1, 2, 4]}
    assert read(tmp_path, "cudagraph_capture_sizes: 8\n").values == {
        "cudagraph_capture_sizes": [8]}
    # EngineArgs.create_engine_config: "mutually exclusive" (vllm/engine/arg_utils.py).
    with pytest.raises(ValueError, match=r"cudagraph_capture_sizes and compilation_config\."
                                         r"cudagraph_capture_sizes are mutually exclusive"):
        read(tmp_path, "cudagraph_capture_sizes: [8]\n"
                       "compilation_config: {cudagraph_capture_sizes: [8]}\n")


@pytest.mark.parametrize(("text", "message"), [
    ("compilation_config: {cudagraph_capture_sizes: 5}\n",
     "compilation_config.cudagraph_capture_sizes must be a list of integers >= 1, got 5"),
    ("compilation_config: {cudagraph_capture_sizes: [[1]]}\n",
     "compilation_config.cudagraph_capture_sizes must be a list of integers >= 1, got [[1]]"),
    ("compilation_config: {cudagraph_capture_sizes: [true, 2]}\n",
     "compilation_config.cudagraph_capture_sizes must be a list of integers >= 1, "
     "got [True, 2]"),
    ("cudagraph_capture_sizes: [0, 8]\n",
     "cudagraph_capture_sizes must be a list of integers >= 1, got [0, 8]"),
    ("compilation_config: {max_cudagraph_capture_size: 6.5}\n",
     "compilation_config.max_cudagraph_capture_size must be an integer, got 6.5"),
    ("compilation_config: {cudagraph_mode: SOMETIMES}\n",
     "compilation_config.cudagraph_mode must be one of NONE, PIECEWISE, FULL, "
     "FULL_DECODE_ONLY, FULL_AND_PIECEWISE or the integer 0, 1 or 2, got 'SOMETIMES'"),
    ("compilation_config: {mode: 7}\n", "compilation_config.mode must be one of "
     "NONE, STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, VLLM_COMPILE or the integer 0-3, got 7"),
    ("optimization_level: fast\n", "optimization_level must be 0, 1, 2 or 3, got 'fast'"),
])
def test_a_bad_value_names_the_file_the_key_and_the_form(tmp_path: Path, text: str,
                                                        message: str) -> None:
    with pytest.raises(ValueError) as e:
        read(tmp_path, text)
    assert str(e.value) == f"config {tmp_path / 'serve.yaml'}: {message}"


def test_the_level_and_compilation_mode_settle_with_the_command_line(tmp_path: Path) -> None:
    # Kept as given, they settle with a --cudagraph-mode as VllmConfig.__post_init__ and
    # _normalize_piecewise_cudagraph_mode settle them: -O0 alone captures nothing, and
    # compilation mode NONE drops the piecewise graphs of whatever mode is asked for.
    for text, flags, blocks in (
            ("optimization-level: 0\n", {}, EAGER_BLOCKS),
            ("compilation_config: {mode: 0}\n", {"cudagraph_mode": "PIECEWISE"}, EAGER_BLOCKS),
            ("optimization_level: 1\n", {"cudagraph_mode": "FULL_AND_PIECEWISE"},
             DEFAULT_BLOCKS),
            ("compilation_config: {cudagraph_mode: NONE}\n", {}, EAGER_BLOCKS),
            ("enforce-eager: true\n", {}, EAGER_BLOCKS)):
        prep = plan(tmp_path, text, **flags)
        assert prep.num_gpu_blocks == blocks, (text, flags)
        # Said where a mode given runs as another, as vLLM logs it.
        assert len(prep.warnings) == ("cudagraph_mode" in flags
                                      and prep.num_gpu_blocks == EAGER_BLOCKS), prep.warnings
    (line,) = plan(tmp_path, "compilation_config: {mode: 0}\n",
                   cudagraph_mode="PIECEWISE").warnings
    assert line == ("cudagraph_mode PIECEWISE runs as NONE in vLLM 0.32 (compilation mode "
                    "NONE compiles no piecewise graph: _normalize_piecewise_cudagraph_mode); "
                    "the KV plan follows it")
    # -O1: piecewise graphs only, 51 of them (50 after the first capture).
    level1 = plan(tmp_path, "optimization_level: 1\n")
    assert level1.kv_plan is not None and level1.kv_plan.cudagraph_bytes == (
        332_859_965 + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 32 * 50)


def test_a_max_capture_size_of_64_gives_back_the_graphs_above_it(tmp_path: Path) -> None:
    capped = plan(tmp_path, "max_cudagraph_capture_size: 64\n")
    assert capped.kv_plan is not None
    # Default: 51 sizes, each a piecewise and a full graph (100 after the first capture).
    # Max 64: 1, 2, 4, 8..64 every 8 = 11 sizes, all <= 1,024 sequences, so 11 piecewise
    # and 11 full graphs (20 after it). 80 fewer graphs x 32 layers x 182,452 B =
    # 467,077,120 B.
    saved = 80 * 32 * CUDA_GRAPH_BYTES_PER_GRAPH_LAYER
    assert saved == 467_077_120
    assert capped.kv_plan.kv_bytes - DEFAULT_KV_BYTES == saved
    assert capped.num_gpu_blocks == (DEFAULT_KV_BYTES + saved) // BLOCK_BYTES == 27_525


def test_full_is_planned_as_vllm_resolves_it_on_the_gpu(tmp_path: Path) -> None:
    # An A100's FlashAttention 2 takes full graphs of decode batches only: vLLM runs FULL
    # as FULL_AND_PIECEWISE there (calibration/cuda_graphs.py full_cudagraph_support); an
    # H100's FlashAttention 3 runs FULL as asked: 51 full graphs (50 further), 50 fewer
    # than the default's 100.
    blocks = {}
    for mode in ("FULL", "FULL_AND_PIECEWISE"):
        res = invoke(tmp_path, "--gpu", "a100-80gb", "--cudagraph-mode", mode)
        assert res.exit_code == 0, res.output
        blocks[mode] = json.loads((tmp_path / "r" / "config.json").read_text())
    assert blocks["FULL"]["cudagraph_mode"] == "FULL"  # recorded as given, and said
    res = invoke(tmp_path, "--gpu", "a100-80gb", "--cudagraph-mode", "FULL")
    assert ("warning: cudagraph_mode FULL runs as FULL_AND_PIECEWISE in vLLM 0.32 (the "
            "attention backend it picks on a100-80gb takes full CUDA graphs of uniform "
            "decode batches only") in res.stderr
    assert (blocks["FULL"]["resolved"]["num_gpu_blocks"]
            == blocks["FULL_AND_PIECEWISE"]["resolved"]["num_gpu_blocks"])
    h100 = plan(tmp_path, "compilation_config: {cudagraph_mode: FULL}\n")
    assert h100.num_gpu_blocks == (
        DEFAULT_KV_BYTES + 50 * 32 * CUDA_GRAPH_BYTES_PER_GRAPH_LAYER) // BLOCK_BYTES


#: An MLA model (tests/data/hf_configs: 27 layers).
DEEPSEEK_V2_LITE = str(Path(__file__).parent / "data" / "hf_configs" / "DeepSeek-V2-Lite")


@pytest.mark.parametrize(("block_size", "runs_full"), [(16, False), (32, True), (64, True)])
def test_an_mla_model_runs_full_on_b200_only_at_flashinfer_mla_block_sizes(
        block_size: int, runs_full: bool) -> None:
    # On a B200 (capability 10.x) FLASHINFER_MLA, which runs mixed batches in full graphs,
    # takes a block size that is a multiple of 32 only; at 16 vLLM picks an MLA backend
    # that does not, and FULL runs as FULL_AND_PIECEWISE. vLLM's defaults there: 1,024
    # sequences, largest capture size 1,024: sizes 1, 2, 4, 8..248 (31), 256..1,024 (49),
    # 83 in all, every one <= 1,024 sequences. FULL: 83 full graphs (82 further);
    # FULL_AND_PIECEWISE: 83 piecewise and 83 full (164 further); 27 layers.
    prep = prepare(RunConfig(model=DEEPSEEK_V2_LITE, gpu="b200", block_size=block_size,
                             cudagraph_mode="FULL", num_requests=2, step_time=0.01))
    assert prep.kv_plan is not None
    further = 82 if runs_full else 164
    assert prep.kv_plan.cudagraph_bytes == (332_859_965
                                            + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 27 * further)
    assert prep.warnings == (() if runs_full else (
        "cudagraph_mode FULL runs as FULL_AND_PIECEWISE in vLLM 0.32 (the attention backend "
        "it picks on b200 at block_size 16 takes full CUDA graphs of uniform decode batches "
        "only: resolve_cudagraph_mode_and_sizes); the KV plan follows it",))


def test_modes_in_a_file_are_names_or_integers_as_vllm_reads_them(tmp_path: Path) -> None:
    # vLLM 0.32 (config/compilation.py): validate_cudagraph_mode_before and
    # validate_mode_before look text up by name only; an integer is taken by value.
    cf = read(tmp_path, "compilation_config: {cudagraph_mode: 1, mode: 0}\n")
    assert cf.values == {"cudagraph_mode": "PIECEWISE", "compilation_mode": "NONE"}
    for text, key, allowed in (
            ("compilation_config: {cudagraph_mode: '1'}\n", "cudagraph_mode",
             "NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE or the integer "
             "0, 1 or 2, got '1'"),
            ("compilation_config: {mode: '3'}\n", "mode", "NONE, STOCK_TORCH_COMPILE, "
             "DYNAMO_TRACE_ONCE, VLLM_COMPILE or the integer 0-3, got '3'")):
        with pytest.raises(ValueError) as e:
            read(tmp_path, text)
        assert str(e.value) == (f"config {tmp_path / 'serve.yaml'}: compilation_config."
                                f"{key} must be one of {allowed}")
    # servesim's own option names in a file read the same way.
    (tmp_path / "ints.yaml").write_text("cudagraph_mode: 1\ncompilation_mode: 0\n")
    res = invoke(tmp_path, "--config", str(tmp_path / "ints.yaml"))
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (cfg["cudagraph_mode"], cfg["compilation_mode"]) == ("PIECEWISE", "NONE")
    (tmp_path / "text.yaml").write_text("cudagraph_mode: '1'\n")
    refused(invoke(tmp_path, "--config", str(tmp_path / "text.yaml")),
            "cudagraph_mode must be one of NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, "
            "FULL_AND_PIECEWISE or the integer 0, 1 or 2, got '1'")


def test_mode_flags_take_digits_as_vllms_command_line_does(tmp_path: Path) -> None:
    # vLLM's -cc.cudagraph_mode=1 and -cc.mode=0: FlexibleArgumentParser json.loads a
    # dotted argument's value (utils/argparse_utils.py), so the digits arrive as integers.
    res = invoke(tmp_path, "--cudagraph-mode", "1", "--compilation-mode", "0")
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (cfg["cudagraph_mode"], cfg["compilation_mode"]) == ("PIECEWISE", "NONE")
    refused(invoke(tmp_path, "--cudagraph-mode", "3"), "or the integer 0, 1 or 2, got 3")


def test_performance_mode_changes_the_sizes_and_the_default_limits(tmp_path: Path) -> None:
    # interactivity: every size 1-32, then 40..248 every 8 and 256..512 every 16: 76 sizes,
    # all <= 1,024 sequences: 150 graphs after the first capture, 50 more than the default.
    fine = plan(tmp_path, "performance-mode: interactivity\n")
    assert fine.kv_plan is not None
    assert fine.kv_plan.cudagraph_bytes == GRAPHS + 50 * 32 * CUDA_GRAPH_BYTES_PER_GRAPH_LAYER
    # throughput: twice vLLM's H100 defaults (engine/arg_utils.py
    # _set_default_max_num_seqs_and_batched_tokens_args); given limits stay.
    wide = plan(tmp_path, "performance-mode: throughput\n")
    assert (wide.scheduler.max_num_seqs, wide.scheduler.max_num_batched_tokens) == (2048, 16384)
    kept = plan(tmp_path, "performance-mode: throughput\n", max_num_seqs=64)
    assert kept.scheduler.max_num_seqs == 64
    assert serve_keys(fine)["performance_mode"] == "interactivity"
    assert "performance_mode" not in serve_keys(plan(tmp_path, ""))
    with pytest.raises(ValueError, match="performance_mode must be one of balanced, "
                                         "interactivity, throughput, got 'fast'"):
        plan(tmp_path, "performance-mode: fast\n")


def test_capture_checks_apply_only_where_graphs_are_captured(tmp_path: Path) -> None:
    # vLLM asserts a non-empty list and a maximum >= 1 only when it captures graphs
    # (vllm/config/vllm.py _set_cudagraph_sizes).
    empty = "compilation_config: {cudagraph_capture_sizes: []%s}\n"
    none = plan(tmp_path, empty % ", cudagraph_mode: NONE")
    assert none.num_gpu_blocks == EAGER_BLOCKS
    with pytest.raises(ValueError, match=r"cudagraph_capture_sizes must hold at least one "
                                         r"size when vLLM captures CUDA graphs "
                                         r"\(cudagraph_mode FULL_AND_PIECEWISE\)"):
        plan(tmp_path, empty % "")
    assert plan(tmp_path, "max_cudagraph_capture_size: 0\n",
                enforce_eager=True).num_gpu_blocks == EAGER_BLOCKS


def test_config_json_records_the_settings_and_reproduces_the_run(tmp_path: Path) -> None:
    serve = tmp_path / "serve.yaml"
    serve.write_text("model: meta-llama/Llama-3.1-8B\ncompilation_config:\n"
                     "  cudagraph_mode: FULL_DECODE_ONLY\n  mode: VLLM_COMPILE\n"
                     "cudagraph_capture_sizes: [1, 2, 4, 8, 16]\noptimization-level: 3\n"
                     "performance-mode: interactivity\n")
    first, again = tmp_path / "first", tmp_path / "again"
    res = runner.invoke(app, ["run", "--config", str(serve), "--num-requests", "5",
                              "--step-time", "0.01", "--out", str(first)])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("warning") == 1  # the model's Hugging Face id, read as a preset
    cfg = json.loads((first / "config.json").read_text())
    assert {k: cfg[k] for k in (*GRAPH_FIELDS, "performance_mode") if k in cfg} == {
        "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4, 8, 16],
        "optimization_level": 3, "compilation_mode": "VLLM_COMPILE",
        "performance_mode": "interactivity"}  # max_cudagraph_capture_size: vLLM's
    # FULL_DECODE_ONLY: 5 full graphs of 1..16 (<= 1,024 sequences), no piecewise ones.
    assert cfg["resolved"]["kv_plan"]["cudagraph_bytes"] == (
        332_859_965 + CUDA_GRAPH_BYTES_PER_GRAPH_LAYER * 32 * 4)
    res = runner.invoke(app, ["run", "--config", str(first / "config.json"),
                              "--out", str(again)])
    assert res.exit_code == 0, res.output
    for name in ("requests.csv", "steps.csv", "summary.json", "config.json"):
        assert (again / name).read_bytes() == (first / name).read_bytes()


def test_vllms_default_level_is_no_news(tmp_path: Path) -> None:
    # optimization_level 2 is vLLM's default: no warning, the default plan, and config.json
    # records the level as given but no cudagraph_mode.
    serve = tmp_path / "serve.yaml"
    serve.write_text("optimization_level: 2\n")
    res = runner.invoke(app, ["run", "--config", str(serve), "--num-requests", "2",
                              "--step-time", "0.01", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0 and "warning" not in res.stderr, res.output
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["optimization_level"] == 2 and "cudagraph_mode" not in cfg
    assert "compilation_mode" not in cfg and "performance_mode" not in cfg
    assert cfg["resolved"]["num_gpu_blocks"] == DEFAULT_BLOCKS


def test_a_command_without_the_graph_options_ignores_the_keys_unread(tmp_path: Path) -> None:
    # servesim validate takes no CUDA-graph option: a compilation_config it cannot use
    # is named as ignored, malformed or not.
    validate = {"model", "policy", "max_num_seqs"}
    for text in ("compilation_config: {cudagraph_mode: NONE}\n",
                 "compilation_config: {cudagraph_capture_sizes: 5}\noptimization_level: 9\n",
                 "compilation_config: '{not json'\n"):
        cf = read(tmp_path, text, validate)
        assert cf.values == {} and set(cf.ignored) <= {"compilation_config",
                                                       "optimization_level"}, text


def test_flags_and_the_deployment_yaml_carry_the_settings(tmp_path: Path) -> None:
    res = invoke(tmp_path, "--cudagraph-capture-sizes", "1,2,4", "--max-cudagraph-capture-size",
                 "4", "--cudagraph-mode", "piecewise", "--optimization-level", "1",
                 "--compilation-mode", "3")
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert {k: cfg[k] for k in GRAPH_FIELDS} == {
        "cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4],
        "max_cudagraph_capture_size": 4, "optimization_level": 1,
        "compilation_mode": "VLLM_COMPILE"}
    settings = {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": (1, 2, 4),
                "max_cudagraph_capture_size": 4, "optimization_level": 1,
                "compilation_mode": "NONE"}
    keys = serve_keys(prepare(RunConfig(num_requests=2, step_time=0.01, **settings)))
    assert keys["compilation_config"] == {"cudagraph_mode": "PIECEWISE", "mode": "NONE"}
    assert (keys["cudagraph_capture_sizes"], keys["max_cudagraph_capture_size"],
            keys["optimization_level"]) == ([1, 2, 4], 4, 1)
    (tmp_path / "vllm_serve.yaml").write_text(
        Deployment(keys, "h100-sxm", 1, 1, "round-robin").yaml())
    back = read_config(tmp_path / "vllm_serve.yaml", OPTIONS).values
    assert {k: back[k] for k in GRAPH_FIELDS} == {**settings, "cudagraph_capture_sizes": [1, 2, 4]}
    assert "compilation_config" not in serve_keys(prepare(RunConfig(num_requests=2,
                                                                    step_time=0.01)))


def test_an_empty_mode_and_a_listed_text_option_are_refused(tmp_path: Path) -> None:
    refused(invoke(tmp_path, "--cudagraph-mode", ""), "cudagraph_mode must be one of NONE, "
            "PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE or the integer 0, 1 or 2, "
            "got ''")
    # Only a list-valued option (cudagraph_capture_sizes) takes a YAML list.
    (tmp_path / "p.yaml").write_text("policy: [chunked]\n")
    refused(invoke(tmp_path, "--config", str(tmp_path / "p.yaml")),
            "config: policy must be str, got ['chunked']")
    assert set(GRAPH_FIELDS) <= set(ALL_OPTIONS)
    assert [n for n, o in ALL_OPTIONS.items() if o.list_valued] == ["cudagraph_capture_sizes"]
