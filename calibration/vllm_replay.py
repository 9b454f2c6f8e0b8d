"""The replay mode of the vLLM driver (calibration/vllm_driver.py, request ``"mode":
"replay"``): a workload served by the engine's own scheduler, step by step, on a clock
made of the measured step times. Standard library only, like the driver; loaded beside it
in the Python that has vLLM.

Owns :func:`replay`. The request carries ``requests`` (``[arrival_s, num_prompt_tokens,
max_tokens, priority]`` per request, by arrival) and ``warmup_requests``. The clock starts
at 0 and advances by each step's measured seconds (thread-CPU time with ``timer`` thread:
a virtual clock on which other processes' use of the core does not count; else wall
time); before each step every request whose arrival time has passed is added, in order, as
servesim's engine admits arrivals at a step boundary; an idle engine jumps to the next
arrival. Prompts are fresh random token ids, so nothing is shared between requests.

Lines emitted (after the driver's ``start``): ``reject`` (``request``: its index, and
vLLM's reason) for a request the engine refuses to add (a prompt of at least max_model_len
tokens); ``step`` per engine step (``index``, ``start_s``, ``seconds`` by the timer,
``thread_s``, ``wall_s``, ``shape`` as sim.batch.BatchShape fields, ``scheduled``:
``[request index, new tokens]`` in vLLM's order, ``outputs``: ``[request index, output
tokens so far, finished]`` for the requests that produced a token, ``preempted``: request
indices, ``phases``); then the driver's ``end``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Emit = Callable[[dict[str, Any]], None]


def warm_up(engine: Any, request: dict[str, Any]) -> None:
    """Untimed service of ``warmup_requests`` requests (a full-budget prefill, then
    decodes) before the clock starts, so the first timed steps do not pay first-call
    costs (allocations, kernel selection); then the prefix cache is emptied."""
    n = int(request.get("warmup_requests", 0))
    if n <= 0:
        return
    budget = int(request["max_num_batched_tokens"])
    prompt = max(1, min(budget // n, int(request["max_model_len"]) - 8))
    ids = [engine.add(prompt, 4, (f"warm{i}", 0)) for i in range(n)]
    for _ in range(64):
        engine.step(budget)
        if not engine.unfinished():
            break
    engine.abort(ids)
    engine.reset_prefix_cache()


def replay(engine: Any, request: dict[str, Any], emit: Emit,
           shape_of: Callable[[list[tuple[int, int, bool, bool]]], dict[str, int]]) -> None:
    """Serve the request's workload on the engine (see the module docstring); ``shape_of``
    turns a step's (new tokens, prior context, decode, samples) items into BatchShape
    fields (the driver's, which loads this module). Raises
    RuntimeError when the engine schedules nothing while requests are unfinished and no
    arrival is left (it would never finish)."""
    warm_up(engine, request)
    work = request["requests"]
    budget = int(request["max_num_batched_tokens"])
    thread = request["timer"] == "thread"
    index_of: dict[str, int] = {}
    clock, nxt, step = 0.0, 0, 0
    while nxt < len(work) or engine.unfinished():
        if not engine.unfinished() and work[nxt][0] > clock:
            clock = float(work[nxt][0])
        while nxt < len(work) and work[nxt][0] <= clock:
            _add(engine, nxt, work[nxt], index_of, emit)
            nxt += 1
        if not engine.unfinished():
            continue
        items, thread_s, wall_s, phases = engine.step(budget)
        seconds = thread_s if thread else wall_s
        if not engine.scheduled and nxt == len(work):
            raise RuntimeError(f"the engine scheduled nothing at step {step} with requests "
                               "unfinished and no arrival left")
        emit({"kind": "step", "index": step, "start_s": clock, "seconds": seconds,
              "thread_s": thread_s, "wall_s": wall_s, "shape": shape_of(items),
              "scheduled": [[index_of[r], n] for r, n in engine.scheduled],
              "outputs": [[index_of[r], k, done] for r, k, done in engine.produced],
              "preempted": sorted(index_of[r] for r in engine.preempted),
              "phases": phases})
        clock += seconds
        step += 1


def _add(engine: Any, i: int, spec: list[Any], index_of: dict[str, int], emit: Emit) -> None:
    _, prompt, max_tokens, priority = spec
    try:
        rid = engine.add(int(prompt), int(max_tokens), (f"r{i}", 0), int(priority))
    except ValueError as exc:  # vLLM's input processor refuses the prompt
        emit({"kind": "reject", "request": i, "reason": " ".join(str(exc).split())[:300]})
        return
    index_of[rid] = i
