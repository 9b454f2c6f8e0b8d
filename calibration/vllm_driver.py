"""The child process of ``servesim calibrate --engine vllm``: drives one engine through
controlled steps and reports each step's shape and time as JSON lines.

It runs in the Python that has vLLM (``--python``), by file path, and imports nothing of
servesim (only the standard library here, vLLM inside calibration/vllm_engine.py, loaded
beside this file), so servesim itself never imports vLLM.

**Protocol.** One JSON object on stdin (built by calibration/vllm_measure.py: the engine
settings, ``points``, ``repeats``, ``warmup``, ``budget_s``, ``timer``; or, with ``"mode":
"replay"``, a workload that calibration/vllm_replay.py serves, whose lines that module's
docstring lists); on stdout one JSON
object a line: ``start`` (the engine's start-up facts), then per point and round a ``step``
line (its point, round as ``repeat``, ``warmup``, ``shape`` as sim.batch.BatchShape fields,
``decode_context``, ``seconds`` by the timer, ``thread_s``, ``wall_s``, per-phase
``phases``) or a ``skip`` line (with the reason), and ``end``; or ``error`` with one line of
message, then exit code 1. Library output goes to stderr, never to the protocol stream.

**How a grid point becomes a real step.** A point is ``b`` decodes at context ``d`` plus
one prefill chunk of ``n`` tokens after ``c`` (sampling or not). vLLM V1 gives each running
request min(its remaining tokens, the budget left), in admission order, then admits waiting
requests the same way; setting the per-step token budget (the scheduler's
``max_num_scheduled_tokens``) therefore decides every step. :func:`plan_fill` picks the
decoders' prompt lengths and the fill steps' budgets so that all ``b`` decoders reach the
context that the chunk request's own fill steps then bring to ``d`` (those prefilled early
decode while the others prefill); the chunk request is prefilled to ``c`` and given ``n``
tokens in the timed step. Every step is checked against the plan: the timed step's
composition, read from the SchedulerOutput, must be the point's. The grid is run in
interleaved rounds, one timed step per point a round; prompt sequences recur, so vLLM's
prefix cache spares most of a fill after the first round (:class:`Run`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, TextIO

PROTOCOL = 1
SHAPE_FIELDS = ("num_prefill_tokens", "num_prefill_seqs", "prefill_context_tokens",
                "prefill_attention_pairs", "num_decode_seqs", "decode_context_tokens",
                "num_sampled_seqs")

Item = tuple[int, int, bool, bool]
"""One scheduled request of a step: (new tokens, prior context, is a decode, samples)."""


class PlanError(ValueError):
    """A point the engine cannot be steered to (reason in the message): it is skipped."""


class Mismatch(PlanError):
    """The engine scheduled other tokens than the plan (a cached block was evicted)."""


def shape_of(items: list[Item]) -> dict[str, int]:
    """BatchShape fields of a step, by sim.batch.shape_of's rules."""
    s = dict.fromkeys(SHAPE_FIELDS, 0)
    for n, c, decode, samples in items:
        if decode:
            s["num_decode_seqs"] += 1
            s["decode_context_tokens"] += c + 1
        else:
            s["num_prefill_tokens"] += n
            s["num_prefill_seqs"] += 1
            s["prefill_context_tokens"] += c
            s["prefill_attention_pairs"] += n * c + n * (n + 1) // 2
        s["num_sampled_seqs"] += samples
    return s


def plan_fill(context: int, cap: int, cached: list[int],
              block: int) -> tuple[list[int], list[int]]:
    """Prompt lengths of requests admitted together, one per entry of ``cached``, and the
    token budget of each fill step, such that after the fill every request has
    ``context`` computed tokens: a request whose prefill ends in step s of F decodes in the
    F - 1 - s steps after it, so its prompt is context - (F - 1 - s). ``cached[i]``:
    tokens of request i's prompt sequence in the prefix cache, of which vLLM reuses
    whole ``block``-token blocks short of the prompt's last token. ``cap``: tokens a step
    may hold (max_num_batched_tokens), decodes included. The fewest fill steps win.
    Raises PlanError when no plan exists (context < 1 or cap <= len(cached))."""
    if not cached:
        return [], []
    if context < 1 or cap <= len(cached):
        raise PlanError(f"cannot fill {len(cached)} decodes to context {context} with "
                        f"{cap} tokens a step")
    for steps in range(1, context + 1):
        plan = _place(context, steps, cap, cached, block)
        if plan is not None:
            prompts, fill, ends = plan
            return prompts, [k + sum(e < j for e in ends) for j, k in enumerate(fill)]
    raise PlanError(f"no fill plan for {len(cached)} decodes at context {context}")


def _place(context: int, steps: int, cap: int, cached: list[int],
           block: int) -> tuple[list[int], list[int], list[int]] | None:
    """Greedy placement for a fill of exactly ``steps`` steps (padded with decode-only
    steps at the end): prompts, prefill tokens per step, each request's last step; None
    when it needs more steps. Request i starts where request i - 1 ended and ends in the
    earliest step e whose room holds the uncached part of its prompt, context - (steps -
    1 - e)."""
    prompts: list[int] = []
    ends: list[int] = []
    fill = [0] * steps
    step, ended_before = 0, 0  # the current step; requests that ended before it

    def need(i: int, prompt: int) -> int:
        return prompt - min(cached[i], (prompt - 1) // block * block)

    for i in range(len(cached)):
        free_now = cap - ended_before - fill[step]
        end = next((e for e in range(step, steps) if free_now + (e - step) * (cap - i)
                    >= need(i, context - (steps - 1 - e))), None)
        if end is None:
            return None
        prompts.append(context - (steps - 1 - end))
        ends.append(end)
        left = need(i, prompts[-1])
        for j in range(step, end + 1):
            take = left if j == end else min(free_now if j == step else cap - i, left - 1)
            fill[j] += take
            left -= take
        if end > step:
            ended_before = i
        step = end
    return prompts, fill, ends


class Run:
    """What every point shares: the engine (``add(prompt_len, max_tokens, prefix) -> id``
    where prefix = (key, n): the prompt's first n tokens are the key's fixed token
    sequence, the rest fresh; ``step(budget) -> (items, thread_s, wall_s, phases)``;
    ``abort(ids)``), its limits, the timer, and what the prefix cache holds.

    Decoder i of every point prompts with the same sequence (``d{i}``), and a point's
    chunk request with the same one every round, so a point after the first finds its
    prompts' blocks in vLLM's prefix cache and computes only the rest; within a step no two
    requests share a block, so attention reads as many distinct keys as in service.
    ``cached`` is what the driver knows the cache to hold, by sequence; when the engine
    schedules otherwise (a block was evicted), the point's sequences are replaced by fresh
    ones (``generation``) and it is tried once more."""

    def __init__(self, engine: Any, request: dict[str, Any], block: int) -> None:
        self.engine = engine
        self.cap = int(request["max_num_batched_tokens"])
        self.max_model_len = int(request["max_model_len"])
        self.warmup = int(request["warmup"])
        self.thread = request["timer"] == "thread"
        self.block = block
        self.cached: dict[str, int] = {}
        self.generation: dict[str, int] = {}

    def key(self, name: str) -> str:
        return f"{name}.{self.generation.get(name, 0)}"

    def forget(self, p: dict[str, Any]) -> None:
        """Fresh sequences for the point's requests (nothing of them cached)."""
        for name in [f"d{i}" for i in range(int(p["decode_seqs"]))] + [_chunk_name(p)]:
            self.generation[name] = self.generation.get(name, 0) + 1

    def fill(self, budget: int, what: str) -> None:
        """One untimed step of ``budget`` tokens; Mismatch when vLLM scheduled otherwise."""
        items = self.engine.step(budget)[0]
        if sum(it[0] for it in items) != budget:
            raise Mismatch(f"{what}: vLLM scheduled {sum(it[0] for it in items)} tokens, "
                           f"the plan {budget}")

    def point(self, p: dict[str, Any], r: int) -> dict[str, Any]:
        """The step line of grid point ``p`` in round ``r`` (warm-up rounds flagged);
        PlanError when the engine cannot be steered to it."""
        b, d = int(p["decode_seqs"]), int(p["decode_context"])
        n, c, sample = int(p["chunk_tokens"]), int(p["chunk_context"]), bool(p["chunk_sample"])
        if b + n > self.cap or b + n == 0:
            raise PlanError(f"{b} decodes + {n} chunk tokens: not a step of 1..{self.cap}")
        xkey = self.key(_chunk_name(p))
        hit = min(self.cached.get(xkey, 0), c // self.block * self.block) if n else 0
        chunks = _split(c - hit, self.cap - b)  # the chunk request's context, then the step
        keys = [self.key(f"d{i}") for i in range(b)]
        prompts, budgets = plan_fill(d - len(chunks), self.cap,
                                     [self.cached.get(k, 0) for k in keys], self.block)
        decoders = [self.engine.add(q, self.max_model_len - q, (k, q))
                    for k, q in zip(keys, prompts, strict=True)]
        try:
            for j, budget in enumerate(budgets):
                self.fill(budget, f"fill step {j}")
            for k, q in zip(keys, prompts, strict=True):
                self.cached[k] = max(self.cached.get(k, 0), q // self.block * self.block)
            line = self._timed([(1, d, True, True)] * b,
                               (n, c, sample, xkey) if n else None, chunks)
        finally:
            self.engine.abort(decoders)
        return {"kind": "step", "index": p["index"], "region": p["region"], "repeat": r,
                "warmup": r < self.warmup, "decode_context": d if b else 0, **line}

    def _timed(self, want: list[Item], chunk: tuple[int, int, bool, str] | None,
               chunks: list[int]) -> dict[str, Any]:
        """Prefill the chunk request to its context, then the timed step."""
        rid = None
        if chunk is not None:
            n, c, sample, key = chunk
            rid = self.engine.add(c + n + (0 if sample else 1), 2, (key, c))
            for k in chunks:
                self.fill(len(want) + k, "chunk context")
            self.cached[key] = max(self.cached.get(key, 0), c // self.block * self.block)
            want = [*want, (n, c, False, sample)]
        try:
            items, thread_s, wall_s, phases = self.engine.step(sum(it[0] for it in want))
        finally:
            if rid is not None:
                self.engine.abort([rid])
        if sorted(items) != sorted(want):
            raise Mismatch(f"vLLM scheduled {sorted(set(items))}, the plan {sorted(set(want))}")
        return {"shape": shape_of(items), "seconds": thread_s if self.thread else wall_s,
                "thread_s": thread_s, "wall_s": wall_s, "phases": phases}


def _chunk_name(p: dict[str, Any]) -> str:
    return f"x{p['region']}{p['index']}"


def _split(total: int, most: int) -> list[int]:
    """``total`` tokens in steps of at most ``most``."""
    return [min(most, total - i) for i in range(0, total, most)]


def measure(run: Run, points: list[dict[str, Any]], rounds: int, deadline: float,
            emit: Callable[[dict[str, Any]], None]) -> bool:
    """``rounds`` interleaved rounds over the points (as the torch engine times them, so a
    burst of load from another process spoils one run of many points rather than every
    run of one): each point's step line, or a skip line with the reason (a point the engine
    scheduled otherwise is tried once more with fresh sequences). Stops before a point
    that its last run says would end past ``deadline`` (a perf_counter time); returns
    whether it did."""
    last: dict[Any, float] = {}
    for r in range(rounds):
        for p in points:
            began = time.perf_counter()
            guess = last.get((p["region"], p["index"]), last.get(p["region"], 0.0))
            if began + guess > deadline:
                return True
            emit(_attempt(run, p, r))
            last[p["region"]] = last[(p["region"], p["index"])] = time.perf_counter() - began
    return False


def _attempt(run: Run, p: dict[str, Any], r: int) -> dict[str, Any]:
    """The point's step line, tried twice if the engine parts from the plan; else skip."""
    for attempt in (1, 2):
        try:
            return run.point(p, r)
        except Mismatch as exc:
            if attempt == 2:
                reason = str(exc)
            else:
                print(f"servesim: {p['region']} {p['index']}: {exc}; once more with fresh "
                      "sequences", file=sys.stderr)
                run.forget(p)
        except PlanError as exc:
            reason = str(exc)
            break
    return {"kind": "skip", "index": p["index"], "region": p["region"], "repeat": r,
            "reason": reason}


def _engine(request: dict[str, Any]) -> Any:
    """calibration/vllm_engine.py's VllmEngine, or vllm_fake.py's FakeEngine (engine
    "fake")."""
    name = {"vllm": "vllm_engine", "fake": "vllm_fake"}.get(request["engine"])
    if name is None:
        raise ValueError(f"engine must be vllm or fake, got {request['engine']!r}")
    module = _sibling(name)
    return module.VllmEngine(request) if name == "vllm_engine" else module.FakeEngine(request)


def _sibling(name: str) -> Any:
    """The module ``name`` loaded from beside this file: its folder is not on sys.path
    (see the end of this module) and the package is not importable in vLLM's Python."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"servesim_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _protocol_stream() -> TextIO:
    """A stream on the original stdout for the protocol alone; file descriptor 1 then
    points at stderr, so whatever else prints (vLLM's logs, C++ libraries) goes there."""
    sys.stdout.flush()
    stream = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return stream


def main() -> int:
    """Read the request, start the engine, measure, report; exit code 0, or 1 after an
    ``error`` line (a traceback goes to stderr)."""
    began = time.perf_counter()
    out = _protocol_stream()

    def emit(line: dict[str, Any]) -> None:
        out.write(json.dumps(line, allow_nan=False) + "\n")

    try:
        request = json.loads(sys.stdin.read())
        if request.get("protocol") != PROTOCOL:
            raise ValueError(f"request protocol {request.get('protocol')!r}, this driver "
                             f"speaks {PROTOCOL}")
        engine = _engine(request)
        facts = engine.facts()
        emit({"kind": "start", **facts})
        stopped = False
        if request.get("mode", "calibrate") == "replay":
            _sibling("vllm_replay").replay(engine, request, emit, shape_of)
        else:
            run = Run(engine, request, int(facts["block_size"]))
            rounds = int(request["warmup"]) + int(request["repeats"])
            stopped = measure(run, request["points"], rounds,
                              began + float(request["budget_s"]), emit)
        emit({"kind": "end", "elapsed_s": time.perf_counter() - began,
              "stopped_by_budget": stopped})
        return 0
    except Exception as exc:  # reported to the parent as one line, never swallowed
        traceback.print_exc(file=sys.stderr)
        what = f"request lacks key {exc}" if isinstance(exc, KeyError) else str(exc)
        message = " ".join(what.split())
        if not isinstance(exc, (ImportError, KeyError, ValueError)) or not message:
            message = f"{type(exc).__name__}: {message}".rstrip(": ")
        emit({"kind": "error", "message": message})
        return 1
    finally:
        out.flush()


if __name__ == "__main__":
    # Run by file path, Python puts this folder first on sys.path, where calibration's
    # profile.py would shadow the standard library's profile (cProfile imports it).
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(
            os.path.abspath(__file__)):
        del sys.path[0]
    sys.exit(main())
