"""Vendor vLLM's recorded scheduler decisions into tests/data/vllm_oracle.

Owns the trimming of ../shared/vllm-oracle/traces/*.trace.json (written by
../shared/vllm-oracle/oracle.py driving vLLM 0.33.0's V1 Scheduler) down to the fields that
tests/test_oracle.py reads, so the conformance tests run in a clone without ../shared.
Nothing is recomputed: every kept value is copied as vLLM's run recorded it.

Run from the repository root: ``python tests/data/vllm_oracle/trim.py [SHARED_ORACLE]``
(default ``../shared/vllm-oracle``). Rewrites every ``*.trace.json`` here from its
``traces/``, and every ``prefix/*.trace.json`` from its ``prefix/`` (the oracle with
prefix caching on shared content, ``prefix/oracle_prefix.py``: each request's
``prompt_segments`` are taken from the workload file beside the trace).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_SOURCE = HERE.parents[2].parent / "shared" / "vllm-oracle"

#: The scheduler settings the test passes to servesim.
CONFIG_KEYS = ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens",
               "max_model_len", "long_prefill_token_threshold", "scheduler_reserve_full_isl",
               "policy")
#: Per request: the workload (inputs) and vLLM's outcome (steps, counts).
REQUEST_KEYS = ("request_id", "arrival_step", "num_prompt_tokens", "output_len", "priority",
                "first_token_step", "finish_step", "num_output_tokens", "num_preemptions")
#: Per step: its 1-based number, the tokens scheduled in it, the requests it preempted
#: (ids), and ``idle`` on a step where nothing was scheduled.
STEP_KEYS = ("step", "idle", "total_scheduled_tokens", "preempted")


def trim(trace: dict[str, Any]) -> dict[str, Any]:
    """The fields of one oracle trace that the conformance test reads, plus the oracle's
    own provenance block (vLLM and torch versions, scheduler class, step numbering).
    Raises KeyError when a config or request field is missing."""
    return {
        "oracle": trace["oracle"],
        "effective_config": {k: trace["effective_config"][k] for k in CONFIG_KEYS},
        "requests": [{k: r[k] for k in REQUEST_KEYS} for r in trace["requests"]],
        "steps": [{k: s[k] for k in STEP_KEYS if k in s} for s in trace["steps"]],
    }


#: Per request, with prefix caching: its prompt content and the prompt tokens vLLM found
#: cached at its first admission.
PREFIX_REQUEST_KEYS = (*REQUEST_KEYS, "num_cached_tokens")


def trim_prefix(trace: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any]:
    """``trim`` for a prefix-caching trace: each request also keeps its
    ``num_cached_tokens`` and the ``prompt_segments`` of ``workload`` (the oracle's
    input), and the run its ``evicted_blocks``. Raises KeyError when a field is
    missing."""
    out = trim(trace)
    segments = {r["request_id"]: r.get("prompt_segments") for r in workload["requests"]}
    out["requests"] = [{**{k: r[k] for k in PREFIX_REQUEST_KEYS},
                        "prompt_segments": segments[r["request_id"]]}
                       for r in trace["requests"]]
    out["evicted_blocks"] = trace["summary"]["evicted_blocks"]
    return out


def dumps(trimmed: dict[str, Any]) -> str:
    """JSON with one request or step per line (short diffs when a trace is re-recorded)."""
    parts = []
    for key, value in trimmed.items():
        if isinstance(value, list):
            rows = ",\n  ".join(json.dumps(v) for v in value)
            parts.append(f'"{key}": [\n  {rows}\n ]')
        else:
            parts.append(f'"{key}": {json.dumps(value)}')
    return "{" + ",\n ".join(parts) + "}\n"


def main(source: Path) -> None:
    """Rewrite HERE/<case>.trace.json from every trace in ``source``/traces and
    HERE/prefix/<case>.trace.json from ``source``/prefix. Raises FileNotFoundError when
    either holds no trace."""
    for sub in ("traces", "prefix"):
        paths = sorted((source / sub).glob("*.trace.json"))
        if not paths:
            raise FileNotFoundError(f"no *.trace.json in {source / sub}")
        dest = HERE if sub == "traces" else HERE / "prefix"
        dest.mkdir(exist_ok=True)
        for path in paths:
            trace = json.loads(path.read_text())
            if sub == "prefix":
                workload = path.with_name(path.name.replace(".trace.json", ".json"))
                trimmed = trim_prefix(trace, json.loads(workload.read_text()))
            else:
                trimmed = trim(trace)
            (dest / path.name).write_text(dumps(trimmed))
            print(f"{sub}/{path.name}: {len(trimmed['requests'])} requests, "
                  f"{len(trimmed['steps'])} steps")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SOURCE)
