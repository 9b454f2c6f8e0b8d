"""A plan's answer as a deployment: the ``vllm serve --config`` YAML of the chosen engine
config (vLLM's EngineArgs keys, the ones sim/app/runs/config_file.py VLLM_KEYS reads
back, each pinned to the value the plan simulated rather than left to a vLLM default
that may change), the command line per replica, and what servesim leaves to the
operator (docs/capacity.md, "A config to deploy").

``servesim run --config vllm_serve.yaml --gpu GPU`` reads the YAML back into the same
engine config (tests/test_deploy_config.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from sim.app.runs.cudagraph_settings import graph_serve_keys
from sim.app.runs.out_dir import YAML_MARK
from sim.app.runs.plan import PlanResult
from sim.app.runs.pools import (
    POOLS,
    link_spec,
    parse_disagg,
    pool_devices_text,
    pool_value,
)
from sim.app.runs.runner import Prepared, RunConfig, prepare

SERVE_FILE = "vllm_serve.yaml"
"""The YAML's file name in a plan's output directory."""

NOTHING_TO_DEPLOY = (f"{YAML_MARK}\n# servesim plan chose no config (see capacity.md), so "
                     f"{SERVE_FILE} holds no settings\n")
"""vllm_serve.yaml of a plan without a chosen config: every plan writes the same files,
so that none is left over from an earlier plan into the same directory."""

#: GPUs per node the commands assume: an HGX/DGX board holds 8 (the 8-GPU instances of the
#: clouds, e.g. AWS p5.48xlarge, GCP a3-highgpu-8g, Azure ND H100 v5), so replicas wrap to
#: the next node there and every TP of 1, 2, 4, 8 fills a node evenly.
GPUS_PER_NODE = 8

#: servesim's dtype names as vLLM's --dtype spells them.
VLLM_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}

def decided_elsewhere(front: str = "the load balancer in front of the replicas") -> str:
    """What servesim leaves to the operator, ``front`` being what routes the requests."""
    return (f"servesim does not decide the networking ({front}, its health checks and "
            "timeouts, TLS, ports), the autoscaler's settings (the plan sizes a fixed fleet "
            "for one target rate), which machines are the nodes (the commands assume "
            f"{GPUS_PER_NODE} GPUs each), the container image and vLLM version, nor the "
            "tokenizer, chat template and sampling defaults: the YAML pins the engine's "
            "batch and memory settings only.")


DECIDED_ELSEWHERE = decided_elsewhere()


@dataclass(frozen=True)
class Deployment:
    """The chosen config as ``vllm serve`` runs it: ``serve`` the YAML's keys in vLLM's
    spelling, ``replicas`` x ``tensor_parallel_size`` GPUs of ``gpu`` behind a
    ``router``, ``notes`` on what the YAML cannot carry; ``disagg``, the xPyD system
    whose engines the replicas are (None: aggregated serving), and ``engines``, each of
    its engines' TP, the flags that set its pool's own values over the YAML's, and its
    GPU (empty: every replica as the YAML says)."""

    serve: dict[str, Any]
    gpu: str
    replicas: int | None
    tensor_parallel_size: int
    router: str
    notes: tuple[str, ...] = ()
    disagg: str | None = None
    engines: tuple[tuple[int, str, str], ...] = ()

    def yaml(self) -> str:
        """The YAML file: one ``key: value`` line per key (JSON scalars, which YAML
        reads as the same values), after servesim's mark (out_dir.YAML_MARK: a file
        without it is the user's, never replaced) and a comment naming the fleet."""
        size = (f"{self.replicas} replica(s) x TP {self.tensor_parallel_size}"
                if self.replicas else f"TP {self.tensor_parallel_size} per replica")
        if self.disagg is not None:
            size = f"{self.disagg}, " + (f"{self.replicas} engines, {self.engines_text()}"
                                         if self.replicas else
                                         f"TP {self.tensor_parallel_size} per engine")
        head = [YAML_MARK, f"# vllm serve --config {SERVE_FILE}: {size} on {self.gpu} "
                "(servesim plan's chosen config)"]
        return "\n".join(head + [f"{k}: {json.dumps(v)}" for k, v in self.serve.items()]) + "\n"

    def engines_text(self) -> str:
        """A disaggregated fleet's engines by TP and GPU: "TP 2", or "prefill TP 2 on
        h200-sxm, decode TP 1" ("" for an aggregated one)."""
        if not self.engines:
            return ""
        # prefill engines first: the first engine is a prefill one, the last a decode one
        return pool_devices_text(tuple((tp, gpu) for tp, _, gpu in
                                       (self.engines[0], self.engines[-1])))

    def commands(self) -> list[str]:
        """The shell command per replica (per engine, with its pool's flags, for a
        disaggregated fleet), its node (1, 2, ...) in a trailing comment so each line
        pastes as it is: replicas fill a node of GPUS_PER_NODE GPUs in order, each on its
        own TP GPUs and port (8000 up, per node), the next node taken when one does not
        fit; a replica wider than a node spans whole nodes of its own (vLLM runs it over
        a Ray cluster)."""
        engines = self.engines or (
            ((self.tensor_parallel_size, "", ""),) * (self.replicas or 1))
        lines: list[str] = []
        node, used, port, kind = 1, 0, 8000, ""
        for tp, flags, gpu in engines:
            serve = f"vllm serve --config {SERVE_FILE}{flags}"
            on = f" ({gpu})" if gpu else ""
            if gpu != kind and used:  # a node holds one GPU type
                node, used, port = node + 1, 0, 8000
            kind = gpu
            if tp > GPUS_PER_NODE:
                span = math.ceil(tp / GPUS_PER_NODE)
                node, used, port = (node + 1, 0, 8000) if used else (node, used, port)
                lines.append(f"{serve} --port 8000  # nodes {node}-{node + span - 1}{on}: "
                             f"TP {tp} spans {span} nodes, start a Ray cluster on them first")
                node += span
                continue
            if used + tp > GPUS_PER_NODE:
                node, used, port = node + 1, 0, 8000
            devices = ",".join(str(d) for d in range(used, used + tp))
            lines.append(f"CUDA_VISIBLE_DEVICES={devices} {serve} --port {port}"
                         f"  # node {node}{on}")
            used, port = used + tp, port + 1
        return lines


def serve_keys(prep: Prepared) -> dict[str, Any]:
    """vLLM serve keys of a prepared run, each as the run resolved it."""
    cfg, sched = prep.config, prep.scheduler
    assert prep.model is not None, "a prepared run has its model"
    model = prep.model.hf_id if cfg.model == prep.model.name else cfg.model
    keys: dict[str, Any] = {
        "model": model,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "dtype": VLLM_DTYPE_NAMES.get(str(cfg.dtype), cfg.dtype),
        "max_model_len": sched.max_model_len,
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "block_size": cfg.block_size,
        # a disaggregated run's pools have no prefix cache (sim/app/runs/pools.py)
        "enable_prefix_caching": sched.prefix_cache != "none" and cfg.disagg is None,
        "enable_chunked_prefill": cfg.policy == "chunked",
        "kv_cache_dtype": cfg.kv_cache_dtype,
    }
    if cfg.quantization is not None:
        keys["quantization"] = cfg.quantization
    if sched.long_prefill_token_threshold:
        keys["long_prefill_token_threshold"] = sched.long_prefill_token_threshold
    if cfg.num_gpu_blocks is not None:
        keys["num_gpu_blocks_override"] = cfg.num_gpu_blocks
    if cfg.enforce_eager:
        keys["enforce_eager"] = True
    if cfg.performance_mode != RunConfig.performance_mode:
        keys["performance_mode"] = cfg.performance_mode
    keys.update(graph_serve_keys(cfg))
    return keys


def notes(prep: Prepared) -> tuple[str, ...]:
    """What the YAML does not carry of the planned run."""
    cfg, out = prep.config, []
    if cfg.policy not in ("chunked", "continuous"):
        out.append(f"policy {cfg.policy} has no vLLM setting: vLLM schedules as chunked "
                   "(enable_chunked_prefill true) or continuous (false) batching")
    if prep.scheduler.prefix_cache == "radix":
        out.append("the plan used SGLang's radix cache, which vLLM does not have "
                   "(enable_prefix_caching is vLLM's block cache); SGLang's equivalent: "
                   f"python -m sglang.launch_server --model-path {serve_keys(prep)['model']} "
                   f"--tp {cfg.tensor_parallel_size} --max-running-requests "
                   f"{prep.scheduler.max_num_seqs} --chunked-prefill-size "
                   f"{prep.scheduler.max_num_batched_tokens} --mem-fraction-static "
                   f"{cfg.gpu_memory_utilization:g}")
    if cfg.kv_cache_memory_bytes is not None:
        out.append(f"--kv-cache-memory {cfg.kv_cache_memory_bytes} is not written: "
                   "servesim's YAML reader does not take it back")
    if cfg.disagg is not None:
        out.append(disagg_note(cfg))
    return tuple(out)


def disagg_note(cfg: RunConfig) -> str:
    """How a disaggregated plan's engines are started: the commands' first x are the
    prefill instances, the other y the decode instances, each with vLLM's NIXL KV
    connector (vLLM docs/features/nixl_connector_usage.md) behind a proxy that prefills
    with max_tokens 1 and then decodes (docs/features/disagg_prefill.md); the pools'
    own batch limits, which the one YAML cannot carry."""
    x, y = parse_disagg(cfg.disagg or "")
    return (f"disaggregated serving, {x}P{y}D: the first {x} command(s) are the prefill "
            f"instances, the other {y} the decode instances (each with its pool's own "
            "settings as flags over the YAML's); start each with "
            "--kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":"
            "\"kv_both\"}' and send requests through vLLM's disaggregated-serving proxy "
            "(it prefills on a prefill instance with max_tokens 1, then decodes on a decode "
            "instance), which is the router in front of them; the KV link the plan "
            f"assumed: {link_spec(cfg).name}; no prefix caching (servesim's disaggregated "
            "runs have none yet)")


#: vllm serve flags of an engine's own values (command-line flags take precedence over
#: --config's keys in vLLM's argument parser): YAML key -> flag.
POOL_FLAGS = {"tensor_parallel_size": "--tensor-parallel-size",
              "gpu_memory_utilization": "--gpu-memory-utilization",
              "max_num_seqs": "--max-num-seqs",
              "max_num_batched_tokens": "--max-num-batched-tokens"}


def pool_engines(prep: Prepared, serve: dict[str, Any]) -> tuple[tuple[int, str, str], ...]:
    """Each engine of a prepared disaggregated run's xPyD system, prefill engines first:
    its TP, the flags of its pool's engine values that differ from the YAML's ``serve``
    keys (POOL_FLAGS: TP, memory share, and the batch limits the pool's engine resolved,
    its own knobs or its GPU's vLLM defaults) and its GPU where the pool has its own
    ("" for the run's)."""
    cfg = prep.config
    assert prep.pools is not None, "a prepared disaggregated run has its pools"
    out: list[tuple[int, str, str]] = []
    for pool, n in zip(POOLS, parse_disagg(cfg.disagg or ""), strict=True):
        e = prep.pools[pool]
        own = {"tensor_parallel_size": e.tensor_parallel_size,
               "gpu_memory_utilization": pool_value(cfg, pool, "gpu_memory_utilization"),
               "max_num_seqs": e.scheduler.max_num_seqs,
               "max_num_batched_tokens": e.scheduler.max_num_batched_tokens}
        flags = "".join(f" {POOL_FLAGS[k]} {v:g}" if isinstance(v, float)
                        else f" {POOL_FLAGS[k]} {v}"
                        for k, v in own.items() if v != serve[k])
        gpu = e.gpu if getattr(cfg, f"{pool}_gpu") is not None else ""
        out += [(e.tensor_parallel_size, flags, gpu)] * n
    return tuple(out)


def deployment(config: RunConfig, replicas: int | None, router: str) -> Deployment:
    """The Deployment of engine config ``config`` (a plan's chosen config, any load),
    ``replicas`` of it behind ``router``."""
    prep = prepare(dataclasses.replace(config, replicas=1, num_requests=1))
    assert prep.config.gpu is not None, "RunConfig resolves the GPU"
    serve = serve_keys(prep)
    engines = pool_engines(prep, serve) if config.disagg is not None and replicas else ()
    return Deployment(serve, prep.config.gpu, len(engines) or replicas,
                      config.tensor_parallel_size, router, notes(prep), config.disagg,
                      engines)


def serve_file(d: Deployment | None) -> str:
    """vllm_serve.yaml's text: the Deployment's YAML, or NOTHING_TO_DEPLOY."""
    return d.yaml() if d is not None else NOTHING_TO_DEPLOY


def plan_deployment(res: PlanResult) -> Deployment | None:
    """The Deployment of a plan's chosen config at its replicas (None without a chosen
    config)."""
    if res.best is None:
        return None
    r = res.replicas
    return deployment(res.best.scaled(r) if r is not None else res.best.config, r,
                      res.spec.router)


def record(d: Deployment | None) -> dict[str, Any] | None:
    """plan.json's ``deploy``: the YAML's keys, the fleet and the commands; ``disagg``
    (the xPyD system, whose engines ``replicas`` counts) for disaggregated serving only."""
    if d is None:
        return None
    return {"file": SERVE_FILE, "vllm_serve": d.serve, "gpu": d.gpu, "replicas": d.replicas,
            "tensor_parallel_size": d.tensor_parallel_size, "router": d.router,
            "commands": d.commands(), "notes": list(d.notes),
            **({"disagg": d.disagg} if d.disagg is not None else {})}
