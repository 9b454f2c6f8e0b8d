"""vLLM benchmark results: the JSON that ``vllm bench serve --save-result --save-detailed``
writes, read as a replayable workload (trace format ``vllm-bench``) and as the
client-side figures a simulation is compared with (``servesim validate --against``).

Owns the format, as vLLM writes it (vllm/benchmarks/serve.py: ``benchmark()`` builds the
result, ``main_async`` saves it; each request's record is ``RequestFuncOutput`` in
vllm/benchmarks/lib/endpoint_request_func.py): one JSON object whose per-request fields
are lists in request order, written only with ``--save-detailed``:

- ``input_lens``: prompt tokens (the server's ``usage.prompt_tokens`` when it sends one).
- ``output_lens``: output tokens (``usage.completion_tokens``); 0 for a failed request.
- ``ttfts``: seconds from sending the request to its first streamed chunk.
- ``itls``: per request, the seconds between successive streamed chunks.
- ``latencies``: seconds from sending the request to its last chunk (the client's E2E).
- ``start_times``: ``time.perf_counter()`` when the request was sent (s, arbitrary origin;
  with ``--max-concurrency``, after the client's semaphore).
- ``errors``: "" for a success, the error text for a failed request.

Results of the older ``benchmarks/benchmark_serving.py`` have no ``start_times`` and no
``latencies``: a latency is then ``ttft + sum(itl)`` (vLLM's own timeline plot does the
same), and such a result can be a target but not a workload. Failed requests (a non-empty
``errors`` entry) are left out: they have no output length to replay. A request's arrival
is its start time minus the earliest successful start; its request_id is its index in the
file, so simulated and measured requests pair up.

Every error is one line naming the file, the field and the request index
("r.json: ttfts[3] is not a number"). Only the successful requests' entries are checked.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scenarios.workload import Workload

#: The per-request fields a result must hold, and those it may hold.
REQUIRED = ("input_lens", "output_lens", "ttfts", "itls")
OPTIONAL = ("latencies", "start_times", "errors")
#: Keys only a vLLM benchmark result has (a Mooncake line has timestamp, input_length,
#: output_length, hash_ids): how the format is told from content.
_RESULT_KEY = re.compile(
    r'"(?:input_lens|output_lens|ttfts|itls|start_times|request_throughput|'
    r'total_input_tokens)"\s*:')
_SAVE_DETAILED = "save it with vllm bench serve --save-result --save-detailed"


@dataclass(frozen=True, slots=True, eq=False)
class BenchResult:
    """The successful requests of one result, in file order (times in seconds).

    ``index``: each request's index in the file; ``start_time`` None when the file has
    no start_times; ``itl_s`` every chunk gap, pooled, ``num_itl`` how many each request
    has; ``num_failed``: requests left out; ``meta``: the result's scalar fields
    (backend, model_id, date, request_rate, max_concurrency, vLLM's own summary figures).
    """

    name: str
    index: np.ndarray
    num_prompt_tokens: np.ndarray
    output_len: np.ndarray
    ttft_s: np.ndarray
    latency_s: np.ndarray
    itl_s: np.ndarray
    num_itl: np.ndarray
    start_time: np.ndarray | None
    num_failed: int
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index)


def is_result(lines: list[str]) -> bool:
    """Whether a JSON file's ``lines`` are a vLLM benchmark result (one object with
    vLLM's keys, on one line as vLLM writes it, or pretty-printed), not JSON Lines."""
    head = lines[0].strip()
    text = "\n".join(lines) if head == "{" else head
    return _RESULT_KEY.search(text) is not None


def read_result(path: Path | str) -> BenchResult:
    """Read and check a result file. Raises FileNotFoundError (with the path), or
    ValueError (one line) for a directory, text that is not UTF-8 or JSON, or a field
    as parse_result says."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"result file not found: {path}")
    if not path.is_file():
        raise ValueError(f"{path} is not a file; give a vllm bench serve result JSON")
    try:
        text = path.read_bytes().removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path.name}: not UTF-8 text; a vllm bench serve result is "
                         "JSON") from None
    return parse_result(path.name, text)


def load_workload(path: Path, lines: list[str]) -> Workload:
    """The ``vllm-bench`` trace loader (scenarios/traces.py): the result's successful
    requests as a Workload."""
    return to_workload(parse_result(path.name, "\n".join(lines)))


def to_workload(result: BenchResult) -> Workload:
    """Arrivals from the start times (the earliest at 0), prompt lengths from input_lens,
    output lengths (and max_tokens) from output_lens, request_id the file index. Raises
    ValueError naming start_times when the result has none."""
    if result.start_time is None:
        raise ValueError(f"{result.name}: no start_times, so no arrival times to replay "
                         "(results of vLLM's older benchmark_serving.py lack them); "
                         "record it with vllm bench serve --save-result --save-detailed")
    arrival = result.start_time - result.start_time.min()
    n = result.num_failed
    failed = f", {n} failed request{'s' * (n > 1)} left out" if n else ""
    try:
        return Workload.from_arrays(
            arrival, result.num_prompt_tokens, result.output_len,
            request_id=[str(i) for i in result.index],
            source=f"vllm-bench result {result.name}{failed}")
    except ValueError as e:
        raise ValueError(f"{result.name}: {e}") from None


# -- parsing ----------------------------------------------------------------------------


def parse_result(name: str, text: str) -> BenchResult:
    """Check and read a result's text (``name``: the file's name, for messages)."""
    doc = _document(name, text)
    n = len(_list(doc, "input_lens", name))
    cols = {f: _list(doc, f, name, n) for f in REQUIRED + OPTIONAL if f in doc or f in REQUIRED}
    ok = [i for i in range(n) if not _failed(cols.get("errors"), i, name)]
    if not ok:
        raise ValueError(f"{name}: no successful request (every errors entry is set)")
    ttft = _floats(cols["ttfts"], ok, "ttfts", name)
    itls = [_itl(cols["itls"][i], i, name) for i in ok]
    if "latencies" in cols:
        latency = _floats(cols["latencies"], ok, "latencies", name)
    else:
        latency = ttft + np.array([math.fsum(g) for g in itls])
    for k, i in enumerate(ok):
        if latency[k] < ttft[k]:
            raise ValueError(f"{name}: latencies[{i}] {float(latency[k])!r} is less than "
                             f"ttfts[{i}] {float(ttft[k])!r}")
    start = (_floats(cols["start_times"], ok, "start_times", name, minimum=None)
             if "start_times" in cols else None)
    return BenchResult(
        name=name, index=np.array(ok, dtype=np.int64),
        num_prompt_tokens=_ints(cols["input_lens"], ok, "input_lens", name),
        output_len=_ints(cols["output_lens"], ok, "output_lens", name),
        ttft_s=ttft, latency_s=latency,
        itl_s=np.array([x for g in itls for x in g], dtype=np.float64),
        num_itl=np.array([len(g) for g in itls], dtype=np.int64),
        start_time=start, num_failed=n - len(ok),
        meta={k: v for k, v in doc.items()
              if v is None or isinstance(v, (str, int, float, bool))})


def _document(name: str, text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        results = [line for line in text.splitlines() if _RESULT_KEY.search(line)]
        if e.msg == "Extra data" and len(results) > 1:
            raise ValueError(f"{name}: {len(results)} results, one a line (vllm bench serve "
                             "--append-result); keep the one to use in a file of its own"
                             ) from None
        raise ValueError(f"{name}: invalid JSON ({e.msg} at line {e.lineno} column "
                         f"{e.colno})") from None
    except RecursionError:
        raise ValueError(f"{name}: JSON nested too deeply to read") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{name}: expected a vllm bench serve result (a JSON object), "
                         f"got a JSON {type(doc).__name__}")
    return doc


def _list(doc: dict[str, Any], key: str, name: str, n: int | None = None) -> list[Any]:
    """``doc[key]``, a list of ``n`` entries (any length when n is None)."""
    if key not in doc:
        raise ValueError(f"{name}: no {key} (a result holds its per-request fields only "
                         f"when saved with --save-detailed); {_SAVE_DETAILED}")
    value = doc[key]
    if not isinstance(value, list):
        raise ValueError(f"{name}: {key} is not a list")
    if n is not None and len(value) != n:
        raise ValueError(f"{name}: {key} has {len(value)} entries, input_lens {n}")
    return value


def _failed(errors: list[Any] | None, i: int, name: str) -> bool:
    if errors is None or errors[i] is None:
        return False
    if not isinstance(errors[i], str):
        raise ValueError(f"{name}: errors[{i}] is not a string")
    return errors[i] != ""


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} is not a number")
    return float(value)


def _floats(values: list[Any], ok: list[int], key: str, name: str,
            minimum: float | None = 0.0) -> np.ndarray:
    """The entries ``ok`` of ``values`` as float64 seconds: finite and >= ``minimum``."""
    out = np.empty(len(ok), dtype=np.float64)
    for k, i in enumerate(ok):
        x = _number(values[i], f"{name}: {key}[{i}]")
        if not math.isfinite(x) or (minimum is not None and x < minimum):
            bound = "" if minimum is None else f" and >= {minimum:g}"
            raise ValueError(f"{name}: {key}[{i}] {x!r} must be finite{bound}")
        out[k] = x
    return out


def _ints(values: list[Any], ok: list[int], key: str, name: str) -> np.ndarray:
    """The entries ``ok`` of ``values`` as int64 token counts >= 1."""
    out = np.empty(len(ok), dtype=np.int64)
    for k, i in enumerate(ok):
        x = values[i]
        if isinstance(x, float) and x.is_integer():
            x = int(x)
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"{name}: {key}[{i}] is not an integer")
        if not 1 <= x <= 2**63 - 1:
            raise ValueError(f"{name}: {key}[{i}] {x} must be >= 1 for a successful "
                             "request")
        out[k] = x
    return out


def _itl(gaps: Any, i: int, name: str) -> list[float]:
    """One request's chunk gaps (s), each finite and >= 0."""
    if not isinstance(gaps, list):
        raise ValueError(f"{name}: itls[{i}] is not a list")
    out = []
    for j, g in enumerate(gaps):
        x = _number(g, f"{name}: itls[{i}][{j}]")
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"{name}: itls[{i}][{j}] {x!r} must be finite and >= 0")
        out.append(x)
    return out
