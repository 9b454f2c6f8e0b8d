"""The simulation options, declared once: every RunConfig field a command exposes, with its
flag (the field's name: ``max_num_seqs`` is ``--max-num-seqs``), type, default and help,
and the list form that sweep and plan vary (the same option, comma-separated values).

Each command picks its options with ``declare`` (a command may give one its own default
or help where the meaning there differs, e.g. plan's ``--num-requests`` is per probe) and
receives them as keyword arguments through ``with_options``; the values build one
RunConfig, whose construction is each option's one check (sim/app/runs/runner.py).
typer reads a command's options from its signature, so ``with_options`` writes the
declared ones there (``__signature__``, which ``inspect.signature`` honours). This module
imports nothing heavy: ``servesim --help`` stays quick. tests/test_cli.py keeps these
defaults equal to RunConfig's.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer


@dataclass(frozen=True)
class Opt:
    """One command-line option: ``name`` is the RunConfig field and, with ``-`` for
    ``_``, the flag; ``type`` the type of one value; ``values`` an example of the list
    form ("" when sweep and plan do not vary it); ``flags`` the flag names when there are
    several (an alias), else derived from ``name``; ``hidden``: left out of ``--help``
    (a command that refuses the option in one line, or sets it itself);
    ``list_valued``: its one value is a list, comma-separated text on the command line
    (a config file may give a list)."""

    name: str
    type: Any
    default: Any
    help: str
    values: str = ""
    flags: tuple[str, ...] = ()
    hidden: bool = False
    list_valued: bool = False

    def parameter(self) -> inspect.Parameter:
        """The keyword parameter typer turns into this option."""
        info = typer.Option(*self.flags, help=self.help, hidden=self.hidden)
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY,
                                 default=self.default, annotation=Annotated[self.type, info])


_ROUTERS = ("round-robin, least-outstanding, least-kv, cache-aware (longest cached prefix, "
            "load-guarded; needs --prefix-cache), cache-aware-approx (the SGLang router's: "
            "longest prefix it routed, load-guarded, else the smallest tree)")

#: Every simulation option, in the order ``--help`` lists them.
OPTIONS: Mapping[str, Opt] = {o.name: o for o in (
    Opt("model", str | None, None, "Model preset (see `servesim list`), or a Hugging "
        "Face config.json or a folder holding one (a local snapshot; `servesim inspect` "
        "shows what is derived from it). Default: llama-3.1-8b, or with --profile the "
        "profile's model (another model is refused)."),
    Opt("gpu", str | None, None, "GPU preset (see `servesim list`) or a GPU spec file "
        "(.json, .toml, .yaml or .yml; keys as in calibration/data/gpus.json). Default: "
        "h100-sxm, or with --profile the device it was measured on (cpu for a CPU profile, "
        "whose KV cache is then the profile's; a --gpu that is another device is refused)."),
    Opt("dtype", str | None, None, "Weights and KV dtype: bf16, fp16, fp32 (or vLLM's "
        "auto, bfloat16, float16, half, float32, float). Default: auto (bf16 for every "
        "preset), or with --profile the profile's dtype (another is refused)."),
    Opt("quantization", str | None, None, "Weight quantization, vLLM's --quantization: "
        "fp8, compressed-tensors, awq, gptq (default: the checkpoint's quantization_config, "
        "else none; awq and gptq without one: 4-bit, groups of 128)."),
    Opt("kv_cache_dtype", str, "auto", "KV-cache dtype, vLLM's --kv-cache-dtype: auto "
        "(the model dtype) or fp8 (1 byte per element; also fp8_e4m3, fp8_e5m2)."),
    Opt("policy", str, "chunked", "Scheduling policy: chunked, continuous, static, or "
        "module:Class (module may be a path/to/file.py).", "static,continuous,chunked"),
    Opt("max_num_seqs", int | None, None, "Most requests per batch (default: vLLM's API "
        "server's for the GPU: 1024 on H100/H200/B200-class, else 256).", "16,32,64,128,256"),
    Opt("max_num_batched_tokens", int | None, None, "Token budget per step, at least a "
        "--max-num-seqs given with it (a default max_num_seqs is lowered to it, as vLLM "
        "does), and at least max_model_len for continuous, which never chunks (vLLM "
        "refuses less); static batching has none (default: vLLM's API server's for the "
        "GPU: 16384 from 160 GiB, 8192 on H100/H200, else 2048; at least max_model_len "
        "for continuous).", "2048,8192"),
    Opt("gpu_memory_utilization", float, 0.9,
        "Fraction of GPU memory the engine may use, in (0, 1].", "0.7,0.8,0.9"),
    Opt("block_size", int | None, None, "Tokens per KV block (default: vLLM's for the "
        "engine: 128 with a profile of vLLM's CPU engine, an MLA model's attention "
        "backend's on a GPU (32 on a B200), else 16)."),
    Opt("max_model_len", int | None, None,
        "Most tokens per request (default: the model's context length)."),
    Opt("allow_long_max_model_len", bool, False, "Allow a max_model_len above the model's "
        "context length, as vLLM's env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 does (also "
        "read here; recorded in config.json).", flags=("--allow-long-max-model-len",)),
    Opt("num_gpu_blocks", int | None, None,
        "Override the KV block count (vLLM's num_gpu_blocks_override).",
        flags=("--num-gpu-blocks", "--num-gpu-blocks-override")),
    Opt("kv_cache_memory_bytes", int | None, None,
        "KV cache size in bytes per GPU, instead of the budget from "
        "gpu_memory_utilization (vLLM's --kv-cache-memory).",
        flags=("--kv-cache-memory", "--kv-cache-memory-bytes")),
    Opt("long_prefill_token_threshold", int, 0,
        "Cap of one request's prefill chunk per step (0 = off).", "0,512,2048"),
    Opt("scheduler_reserve_full_isl", bool, True,
        "Admit only if all of a request's tokens fit in the free pool."),
    Opt("enforce_eager", bool, False,
        "vLLM's --enforce-eager: no CUDA graphs, so the KV cache keeps the memory vLLM "
        ">= 0.21 sets aside for them (about 0.5-1.7 GiB a GPU for the presets). Changes "
        "the memory plan only, not the step times."),
    Opt("cudagraph_mode", str | None, None, "vLLM's compilation_config cudagraph_mode, "
        "the CUDA graphs whose memory the KV cache gives up: NONE, PIECEWISE, FULL, "
        "FULL_DECODE_ONLY, FULL_AND_PIECEWISE, or 0-2 for the first three (default: the "
        "optimization level's, FULL_AND_PIECEWISE at vLLM's -O2). FULL becomes "
        "FULL_AND_PIECEWISE where the GPU's attention backend takes full graphs of decode "
        "batches only (all but H100/H200 and MI300X; for an MLA model all but B200, there "
        "at a block size that is a multiple of 32), as in vLLM. Memory plan only."),
    Opt("cudagraph_capture_sizes", str | None, None, "vLLM's --cudagraph-capture-sizes, "
        "comma-separated here (1,2,4,8): the batch sizes (tokens) graphs are captured for "
        "(default: vLLM's list). Memory plan only.", list_valued=True),
    Opt("max_cudagraph_capture_size", int | None, None, "vLLM's "
        "--max-cudagraph-capture-size: the largest size graphs are captured for (default: "
        "vLLM's, 2 x max_num_seqs up to 512, 1024 on B200). Memory plan only."),
    Opt("optimization_level", int | None, None, "vLLM's -O level, 0-3 (default: vLLM's, "
        "2): -O0 captures no CUDA graphs, -O1 piecewise ones only. Memory plan only."),
    Opt("compilation_mode", str | None, None, "vLLM's compilation_config mode: NONE, "
        "STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, VLLM_COMPILE or 0-3 (default: "
        "VLLM_COMPILE above -O0); any but VLLM_COMPILE drops the piecewise CUDA graphs. "
        "Memory plan only."),
    Opt("performance_mode", str, "balanced", "vLLM's --performance-mode: balanced, "
        "interactivity (CUDA graphs for every batch size up to 32) or throughput (twice "
        "vLLM's default max_num_seqs and max_num_batched_tokens where not given)."),
    Opt("max_tokens", int | None, None, "Client cap on output tokens for every request."),
    Opt("step_time", float | None, None,
        "Constant step time in seconds instead of a cost model."),
    Opt("profile", str | None, None, "Calibrated profile JSON to use as the cost model."),
    # The roofline's constants (calibration/roofline.py); None: its fitted ones.
    Opt("roofline_compute_efficiency", float | None, None, "Roofline: achieved / peak GEMM "
        "FLOP/s, in (0, 1] (default: the GPU's measured one, e.g. H100 0.77, else 0.75)."),
    Opt("roofline_memory_efficiency", float | None, None,
        "Roofline: achieved / peak memory bandwidth, in (0, 1] (default 0.9)."),
    Opt("roofline_step_overhead_s", float | None, None,
        "Roofline: seconds a step adds (scheduling, launch; default 0.00125)."),
    Opt("roofline_per_seq_overhead_s", float | None, None,
        "Roofline: seconds a sequence adds to its step (sampling; default 4e-05)."),
    Opt("trace", str | None, None, "Trace file: servesim CSV, Azure 2023 CSV, Mooncake JSONL "
        "or a vllm bench serve result (--save-result --save-detailed)."),
    Opt("trace_format", str | None, None,
        "Force the trace format: servesim, azure (2023 or 2024), mooncake, vllm-bench, "
        "burstgpt (filters: 'burstgpt:model=GPT-4,log_type=API log'), vidur, splitwise, "
        "lengths (no arrival times: give --rate)."),
    Opt("tokenizer", str | None, None, "A tokenizer.json counting a ShareGPT trace's tokens "
        "(needs the tokenizers package: pip install 'servesim[tokenizer]')."),
    Opt("scenario", str | None, None, "Built-in scenario (see `servesim list`)."),
    Opt("arrival", str | None, None,
        "Arrival process: poisson, gamma, constant, bursts, diurnal (a non-homogeneous "
        "Poisson process at mean --rate, its rate swinging by --diurnal-amplitude over "
        "24 h: lowest at t = 0, highest at 12 h) (re-times a trace)."),
    Opt("diurnal_amplitude", float | None, None, "--arrival diurnal: the rate's swing "
        "around its mean, a fraction in [0, 1] (default 0.5: from 0.5x to 1.5x --rate)."),
    Opt("rate", float | None, None, "Arrival rate in requests/s (a trace is re-timed by "
        "Poisson arrivals at this rate unless --arrival names another process, as vllm "
        "bench serve's --request-rate does; --time-scale replays its own arrivals faster).",
        "2,4,8; a trace is re-timed by Poisson arrivals (gamma with --burstiness) unless "
        "--arrival names another process"),
    Opt("burstiness", float | None, None,
        "Gamma shape k (CV = 1/sqrt(k); inf = constant gaps).", "0.5,1,4 (1 = Poisson)"),
    Opt("num_requests", int | None, None, "Requests to simulate (a trace re-timed by "
        "--rate or --arrival is oversampled to it, as vllm bench serve does: copies of "
        "random rows; one replayed with its own arrivals ends where it ends)."),
    Opt("window", float | None, None,
        "Keep trace arrivals within this many seconds of the first."),
    Opt("time_scale", float | None, None, "Speed a trace up (>1) or slow it down (<1)."),
    Opt("seed", int, 0, "Workload seed."),
    Opt("slo_ttft", float | None, None, "TTFT SLO in seconds, at most 60 (vLLM's "
        "--goodput ttft:MS is in milliseconds: ttft:2000 is --slo-ttft 2)."),
    Opt("slo_tpot", float | None, None, "TPOT SLO in seconds, at most 1 (vLLM's "
        "--goodput tpot:MS is in milliseconds: tpot:50 is --slo-tpot 0.05)."),
    Opt("queue", str, "fcfs", "Waiting-queue order: fcfs, priority, sjf (shortest prompt), "
        "oracle-srpt (true remaining output: an unrealizable bound), lpm (longest cached "
        "prefix first, SGLang; needs --prefix-cache). vLLM's --scheduling-policy.",
        flags=("--queue", "--scheduling-policy")),
    Opt("preemption_mode", str, "recompute",
        "Preemption under KV pressure: recompute or swap (to CPU)."),
    Opt("kv_allocation", str, "paged",
        "KV blocks: paged (on demand) or reserve (prompt + max_tokens at admission)."),
    Opt("swap_space", float, 4.0,
        "CPU swap space for --preemption-mode swap, GiB (vLLM's default)."),
    Opt("pcie_bandwidth", float, 25.0,
        "Host <-> GPU copy rate pricing swaps, GB/s (PCIe 4.0 x16 effective)."),
    Opt("tensor_parallel_size", int, 1, "GPUs per replica: weights, FLOPs and KV heads split "
        "N ways, two all-reduces per layer over the GPU's interconnect.", "4,8",
        flags=("--tensor-parallel-size", "-tp")),
    Opt("replicas", int, 1, "Identical engines behind a router, simulated together.", "1,2,4"),
    Opt("router", str, "round-robin", f"How requests are spread over replicas: {_ROUTERS}."),
    Opt("concurrency", int | None, None, "Closed loop: N users, each sending its next request "
        "when its previous one ends (instead of open-loop arrivals).", "8,16,32"),
    Opt("think_time", float, 0.0,
        "Closed loop: seconds a user waits before sending its next request."),
    Opt("trace_sample", bool | None, None,
        "Draw --num-requests at random from the whole trace (seeded) instead of taking "
        "the first ones; shuffled when re-timed (default: on when the trace is re-timed "
        "by --rate, --arrival or --burstiness, off when its own arrivals are replayed).",
        flags=("--trace-sample/--no-trace-sample",)),
    Opt("prefix_cache", str | None, None, "Prefix caching: none, block (vLLM's block-hash "
        "cache) or radix (SGLang's radix tree); prompts share blocks by Mooncake hash_ids or "
        "a scenario's prompt segments (docs/prefix_caching.md). Default: vLLM's, block where "
        "prompts carry content, else none (no hits possible).", "none,block,radix"),
    Opt("disagg", str | None, None, "Prefill/decode disaggregation, xPyD: x prefill and y "
        "decode engines, the KV cache sent between them (docs/disaggregation.md).",
        "none,1P1D,1P2D"),
    Opt("kv_link", str | None, None, "--disagg: the KV link, nvlink, ib, roce or tcp "
        "(presets with their sources; default ib)."),
    Opt("kv_link_gbps", float | None, None, "--disagg: the KV link's bandwidth in Gb/s "
        "(gigabits) a GPU, instead of the preset's."),
    Opt("kv_link_latency_us", float | None, None, "--disagg: the KV link's latency per "
        "transfer in microseconds, instead of the preset's."),
    Opt("disagg_min_prompt_tokens", int | None, None, "--disagg: a prompt shorter than this "
        "prefills on its decode engine, no transfer (Dynamo's conditional "
        "disaggregation; default 0: every prompt goes to the prefill pool)."),
    Opt("prefill_max_num_seqs", int | None, None, "--disagg: max_num_seqs of the prefill "
        "engines (default: --max-num-seqs)."),
    Opt("prefill_max_num_batched_tokens", int | None, None, "--disagg: "
        "max_num_batched_tokens of the prefill engines (default: --max-num-batched-tokens)."),
    Opt("decode_max_num_seqs", int | None, None, "--disagg: max_num_seqs of the decode "
        "engines (default: --max-num-seqs)."),
    Opt("decode_max_num_batched_tokens", int | None, None, "--disagg: "
        "max_num_batched_tokens of the decode engines (default: --max-num-batched-tokens)."),
    Opt("prefill_gpu", str | None, None, "--disagg: the prefill engines' GPU, a preset or "
        "spec file (default: --gpu; not with --profile)."),
    Opt("prefill_tensor_parallel_size", int | None, None, "--disagg: tensor parallel size "
        "of each prefill engine (default: --tensor-parallel-size).", "1,2,4"),
    Opt("prefill_gpu_memory_utilization", float | None, None, "--disagg: "
        "gpu_memory_utilization of the prefill engines (default: --gpu-memory-utilization)."),
    Opt("decode_gpu", str | None, None, "--disagg: the decode engines' GPU, a preset or "
        "spec file (default: --gpu; not with --profile)."),
    Opt("decode_tensor_parallel_size", int | None, None, "--disagg: tensor parallel size "
        "of each decode engine (default: --tensor-parallel-size).", "1,2,4"),
    Opt("decode_gpu_memory_utilization", float | None, None, "--disagg: "
        "gpu_memory_utilization of the decode engines (default: --gpu-memory-utilization)."),
)}

#: The API server's term (calibration/frontend.py): options of the commands that compare
#: with a client's measurements (validate --against), not RunConfig fields: the engine's
#: run is the same with or without them.
FRONTEND_OPTIONS: tuple[Opt, ...] = (
    Opt("frontend_ttft_s", float | None, None,
        "API server delay before each request's first token, in seconds (HTTP, "
        "tokenization); added to simulated client-side TTFT and E2E."),
    Opt("frontend_token_s", float | None, None,
        "API server cost per output token after the first, in seconds (detokenization, "
        "streaming); added to every simulated ITL, to TPOT, and n - 1 times to E2E."),
)


#: The config file of the commands that simulate: not a RunConfig field
#: (option_values.config_options reads it under the flags given).
CONFIG_OPTION = Opt(
    "config", Path | None, None, "Settings from a file, under the flags given: servesim's "
    "options in YAML or TOML (names with - or _), a vLLM serve --config YAML (its keys "
    "that mean the same are read, the rest named and ignored), or a run's config.json "
    "(reproduces that run; says so when its trace has changed).")

#: vLLM's spelling of the prefix-cache switch: sets prefix_cache (option_values.config_options).
PREFIX_SWITCH = Opt(
    "enable_prefix_caching", bool | None, None, "vLLM's switch: on = --prefix-cache block, "
    "off = none (default: vLLM's, on where prompts carry content).",
    flags=("--enable-prefix-caching/--no-enable-prefix-caching",))


#: vLLM's chunked-prefill switch: sets the policy (option_values.config_options).
CHUNKED_SWITCH = Opt(
    "enable_chunked_prefill", bool | None, None, "vLLM's switch: on = --policy chunked, "
    "off = --policy continuous (vLLM V1 without chunked prefill).",
    flags=("--enable-chunked-prefill/--no-enable-chunked-prefill",))


#: vLLM bench serve's SLOs for goodput, in ms: sets slo_ttft and slo_tpot
#: (option_values.config_options).
GOODPUT_OPTION = Opt(
    "goodput", str | None, None, "vLLM bench serve's SLOs, KEY:VALUE in milliseconds "
    "(ttft:2000 tpot:50; as vLLM writes it, the pairs after one --goodput): sets "
    "--slo-ttft and --slo-tpot in seconds.", flags=("--goodput",))


def list_form(opt: Opt) -> Opt:
    """``opt`` as sweep and plan take it: comma-separated values, each a cell of the grid;
    not given, every cell has the single default."""
    if not opt.values:
        raise ValueError(f"{opt.name} has no list form")
    default = "" if opt.default is None else f" (default {opt.default})"
    return dataclasses.replace(
        opt, type=str | None, default=None,
        help=f"{opt.help} Comma-separated values to compare, e.g. {opt.values}{default}.")


def seeds(default: str, help: str) -> Opt:
    """The list form of ``--seed`` (``--seed`` is an alias): comma-separated workload
    seeds, each giving every cell its own workload; ``help`` says what they do there."""
    return Opt("seeds", str, default, f"Workload seeds, comma-separated: {help}",
               flags=("--seeds", "--seed"))


def declare(names: Iterable[str], axes: Collection[str] = (),
            **changes: dict[str, Any]) -> tuple[Opt, ...]:
    """The declared options ``names``, in that order; those in ``axes`` in their list form;
    ``changes[name]`` a command's own ``default``, ``help`` or ``hidden`` for one (KeyError
    for an option not declared in OPTIONS)."""
    unknown = (set(axes) | set(changes)) - set(names)
    if unknown:
        raise KeyError(f"not among the command's options: {', '.join(sorted(unknown))}")
    opts = []
    for name in names:
        opt = list_form(OPTIONS[name]) if name in axes else OPTIONS[name]
        opts.append(dataclasses.replace(opt, **changes.get(name, {})))
    return tuple(opts)


F = TypeVar("F", bound=Callable[..., None])


def with_options(*opts: Opt) -> Callable[[F], F]:
    """A decorator: the command takes ``opts`` (before its own options in ``--help``) as
    keyword arguments, collected by its ``**opts`` parameter."""
    def add(command: F) -> F:
        sig = inspect.signature(command, eval_str=True)
        params = list(sig.parameters.values())
        if not params or params[-1].kind is not inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"{command.__name__} needs a **opts parameter for its options")
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params[:-1]]
        clash = {o.name for o in opts} & {p.name for p in own}
        if clash:
            raise TypeError(f"{command.__name__} declares {', '.join(sorted(clash))} twice")
        command.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[*(o.parameter() for o in opts), *own])
        return command
    return add
