"""The JSON trace formats, told apart by content: Mooncake JSON Lines, the
``vllm bench serve --save-result`` JSON and ShareGPT JSON. The trace readers' format
detection calls ``detect_json`` and ``load_json`` (the hook between this family and the
CSV family's detection in scenarios/traces).

Owns the rules that tell them apart, each naming what it saw: a list whose first entry
holds ``conversations`` is ShareGPT; an object with vLLM's result keys (input_lens,
ttfts, request_throughput, ...; scenarios/vllm_bench.py) a vLLM result, whether saved
with --save-detailed or not (vllm_bench then says what is missing); an object with
``timestamp`` a Mooncake line; any other JSON is refused with the keys it has.
"""

from __future__ import annotations

import json
from pathlib import Path

from scenarios import mooncake, sharegpt, vllm_bench
from scenarios.workload import Workload

JSON_FORMATS = ("mooncake", "vllm-bench", "sharegpt")
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


def detect_json(path: Path, lines: list[str]) -> str | None:
    """The JSON format of a file (one of ``JSON_FORMATS``); None when its first line
    does not start a JSON value ({ or [): not this family.

    Raises:
        ValueError: JSON of none of these formats (the message names what it holds).
    """
    first = lines[0].lstrip()
    if not first.startswith(("{", "[")):
        return None
    if first.startswith("["):
        if sharegpt.looks_like("\n".join(lines[:64])):
            return "sharegpt"
        raise ValueError(f"{path.name}: a JSON list without \"conversations\" (first line "
                         f"{first[:60]!r}); a JSON trace is ShareGPT (a list of "
                         "conversations), a vllm bench serve result or Mooncake JSONL")
    if vllm_bench.is_result(lines):
        return "vllm-bench"
    keys = _first_keys(first)
    if keys is None or any(k in keys for k in _MOONCAKE_KEYS):
        return "mooncake"  # the Mooncake reader names a bad first line
    raise ValueError(f"{path.name} line 1: a JSON object with keys {', '.join(keys[:8])}; "
                     "a vllm bench serve result has input_lens, ttfts, "
                     "request_throughput, ..., a Mooncake line "
                     f"{', '.join(_MOONCAKE_KEYS)}")


def _first_keys(line: str) -> list[str] | None:
    """The keys of the JSON object on ``line``; None when it is not one."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return None
    return list(obj) if isinstance(obj, dict) else None


def load_json(path: Path, lines: list[str], fmt: str,
              tokenizer: Path | str | None = None,
              stop: mooncake.StopFn | None = None) -> Workload:
    """Read ``lines`` of ``path`` as the JSON format ``fmt``. ``tokenizer``: a
    tokenizer.json, for ShareGPT only; ``stop``: when a Mooncake file's rows read so far
    hold the cut (mooncake.load_workload). Raises ValueError as each reader does, and
    for a tokenizer given with another format."""
    if fmt == "sharegpt":
        return sharegpt.load_workload(path, lines, tokenizer)
    if tokenizer is not None:
        raise ValueError(f"--tokenizer applies to ShareGPT JSON only; {path.name} is "
                         f"{fmt}, with token counts of its own")
    if fmt == "mooncake":
        return mooncake.load_workload(path, lines, stop)
    return vllm_bench.load_workload(path, lines)
