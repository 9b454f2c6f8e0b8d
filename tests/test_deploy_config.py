"""A plan's answer as a deployment: the ``vllm serve`` YAML of the chosen config, read
back by ``servesim run --config``, reproduces the planned configuration's run; the
commands per replica; what the YAML cannot carry."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.deploy_config import NOTHING_TO_DEPLOY, SERVE_FILE, deployment, serve_file
from sim.app.runs.runner import RunConfig

runner = CliRunner()


def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("arrival_time,num_prompt_tokens,output_len\n"
                    + "".join(f"{i * 0.1},{200 + 37 * (i % 7)},{20 + i % 11}\n"
                              for i in range(60)))
    return path


def test_serve_yaml_read_back_reproduces_the_planned_run(tmp_path: Path) -> None:
    planned = RunConfig(gpu="l40s", max_num_seqs=8, long_prefill_token_threshold=512,
                        prefix_cache="block", gpu_memory_utilization=0.8)
    d = deployment(planned, replicas=2, router="round-robin")
    assert d.serve == {
        "model": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 1, "dtype": "bfloat16",
        "max_model_len": 131072, "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,  # vLLM's API-server default on an L40S
        "gpu_memory_utilization": 0.8, "block_size": 16, "enable_prefix_caching": True,
        "enable_chunked_prefill": True, "kv_cache_dtype": "auto",
        "long_prefill_token_threshold": 512}
    assert d.commands() == [
        f"CUDA_VISIBLE_DEVICES=0 vllm serve --config {SERVE_FILE} --port 8000  # node 1",
        f"CUDA_VISIBLE_DEVICES=1 vllm serve --config {SERVE_FILE} --port 8001  # node 1"]
    yaml_file = tmp_path / SERVE_FILE
    yaml_file.write_text(d.yaml())
    load = ["--trace", str(trace(tmp_path)), "--num-requests", "60", "--gpu", "l40s"]
    res = runner.invoke(app, ["run", "--config", str(yaml_file), *load, "--out",
                              str(tmp_path / "from_yaml")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["run", "--max-num-seqs", "8", "--long-prefill-token-threshold",
                              "512", "--prefix-cache", "block", "--gpu-memory-utilization",
                              "0.8", *load, "--out", str(tmp_path / "planned")])
    assert res.exit_code == 0, res.output
    a, b = (json.loads((tmp_path / name / "config.json").read_text())
            for name in ("from_yaml", "planned"))
    # The same resolved config, field for field; the YAML pins max_model_len, which the
    # planned run left to the model's context length (the same 131,072 tokens).
    assert a["max_model_len"] == a["resolved"]["max_model_len"] == 131072
    assert {**a, "max_model_len": None} == b
    assert ((tmp_path / "from_yaml" / "summary.json").read_text()
            == (tmp_path / "planned" / "summary.json").read_text())


def test_what_the_yaml_cannot_carry_is_said() -> None:
    d = deployment(RunConfig(gpu="h100-sxm", prefix_cache="radix", policy="continuous",
                             tensor_parallel_size=2), replicas=3, router="cache-aware")
    assert d.serve["enable_chunked_prefill"] is False and d.serve["enable_prefix_caching"]
    assert [n for n in d.notes if "SGLang" in n] == [
        "the plan used SGLang's radix cache, which vLLM does not have (enable_prefix_caching "
        "is vLLM's block cache); SGLang's equivalent: python -m sglang.launch_server "
        "--model-path meta-llama/Llama-3.1-8B --tp 2 --max-running-requests 1024 "
        "--chunked-prefill-size 131072 --mem-fraction-static 0.9"]
    static = deployment(RunConfig(policy="static"), replicas=None, router="round-robin")
    assert static.notes[0].startswith("policy static has no vLLM setting")
    assert d.commands()[2] == (f"CUDA_VISIBLE_DEVICES=4,5 vllm serve --config "
                               f"{SERVE_FILE} --port 8002  # node 1")
    assert serve_file(d).split("\n")[1].startswith(
        "# vllm serve --config vllm_serve.yaml: 3 replica(s) x TP 2")
    assert serve_file(None) == NOTHING_TO_DEPLOY and NOTHING_TO_DEPLOY.startswith("# ")


def test_replicas_wrap_at_a_node_of_eight_gpus() -> None:
    # TP 4: two replicas a node; the 5th replica is the first on node 3.
    d = dataclasses.replace(deployment(RunConfig(gpu="h100-sxm"), 1, "round-robin"),
                            replicas=5, tensor_parallel_size=4)
    serve = f"vllm serve --config {SERVE_FILE}"
    assert d.commands() == [
        f"CUDA_VISIBLE_DEVICES=0,1,2,3 {serve} --port 8000  # node 1",
        f"CUDA_VISIBLE_DEVICES=4,5,6,7 {serve} --port 8001  # node 1",
        f"CUDA_VISIBLE_DEVICES=0,1,2,3 {serve} --port 8000  # node 2",
        f"CUDA_VISIBLE_DEVICES=4,5,6,7 {serve} --port 8001  # node 2",
        f"CUDA_VISIBLE_DEVICES=0,1,2,3 {serve} --port 8000  # node 3"]
    assert dataclasses.replace(d, replicas=2, tensor_parallel_size=16).commands() == [
        f"{serve} --port 8000  # nodes 1-2: TP 16 spans 2 nodes, start a Ray cluster on "
        "them first",
        f"{serve} --port 8000  # nodes 3-4: TP 16 spans 2 nodes, start a Ray cluster on "
        "them first"]
