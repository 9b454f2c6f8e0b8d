"""The space of ``servesim run``'s options that tests/test_fuzz_run_options.py draws from:
every option's values from its valid, edge and invalid ranges, the files "@" values
name (config files, a trace, bad files), and the hypothesis strategies over one option,
pairs of options and their groups."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import strategies as st

from tests.vllm_rules import POLICIES

#: The profile the "@profile" value names (a profile of qwen2.5-0.5b).
PROFILE = Path(__file__).resolve().parents[1] / "calibration/profiles/cpu-qwen2.5-0.5b.json"
PROFILE_MODEL = json.loads(PROFILE.read_text())["model"]

# What is drawn: every option of `servesim run`, its values, the files they name.
BIG = "1" + "0" * 30
INT_JUNK = ("", "abc", "1.5", "1e3", "nan", "0x10", BIG, "-" + BIG)
FLOAT_JUNK = ("", "abc", "nan", "inf", "-inf", "1e400", "1,5", "-0")
STR_JUNK = ("", " ", "bogus", "ü", "a" * 300)
MODELS = ("llama-3.1-8b", "qwen2.5-0.5b", "llama-2-7b")
GPUS = ("h100-sxm", "a100-40gb", "l4", "h200-sxm", "b200")

#: Every option of ``servesim run`` with its values ("@name" is a file of the
#: ``files`` fixture); ints and floats also take random values (INT_RANGE, FLOATS).
VALUES: dict[str, tuple[str, ...]] = {
    "model": (*MODELS, "LLAMA-2-7B", "@dir", "@missing.json", *STR_JUNK),
    "gpu": (*GPUS, "@missing.json", "@list.json", *STR_JUNK),
    "dtype": ("bf16", "fp16", "fp32", "int8", *STR_JUNK),
    "quantization": ("fp8", "awq", "gptq", "compressed-tensors", *STR_JUNK),
    "kv-cache-dtype": ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp16", *STR_JUNK),
    "policy": (*POLICIES, "no_such_module:Policy", "@dir:Policy", *STR_JUNK),
    "max-num-seqs": ("1", "2", "16", "256", "1024", "1025", "8192", "100000", "0", "-1", *INT_JUNK),
    "max-num-batched-tokens": ("1", "16", "255", "256", "1023", "1024", "2048", "4095",
                               "4096", "8192", "131071", "131072", "0", "-1", *INT_JUNK),
    "gpu-memory-utilization": ("0.01", "0.05", "0.3", "0.5", "0.9", "1", "1.0001", "0",
                               "-0.5", *FLOAT_JUNK),
    "block-size": ("1", "8", "15", "16", "24", "32", "48", "64", "256", "0", "-16", *INT_JUNK),
    "max-model-len": ("-1", "0", "1", "2", "16", "17", "512", "4096", "4097", "8192",
                      "32768", "32769", "131072", "131073", "1000000", *INT_JUNK),
    "num-gpu-blocks": ("0", "1", "2", "3", "10", "257", "1000", "100000", "-1",
                       "1000000000000", *INT_JUNK),
    "kv-cache-memory": ("0", "-1", "1", "1000000", "1000000000", "10000000000",
                        "1000000000000", *INT_JUNK),
    "long-prefill-token-threshold": ("0", "1", "512", "4096", "4097", "131072", "131073",
                                     "-1", *INT_JUNK),
    "scheduler-reserve-full-isl": ("--scheduler-reserve-full-isl",
                                   "--no-scheduler-reserve-full-isl"),
    "max-tokens": ("1", "16", "0", "-1", "1000000000", *INT_JUNK),
    "cudagraph-mode": ("NONE", "piecewise", "FULL", "FULL_DECODE_ONLY",
                       "FULL_AND_PIECEWISE", "0", *STR_JUNK),
    "cudagraph-capture-sizes": ("1", "1,2,4,8", "8 16", "100000", "0", "-1", "1,,2", "1.5",
                                BIG, *STR_JUNK),
    "max-cudagraph-capture-size": ("1", "64", "512", "100000", "0", "-1", *INT_JUNK),
    "optimization-level": ("0", "1", "2", "3", "4", "-1", *INT_JUNK),
    "compilation-mode": ("NONE", "vllm_compile", "STOCK_TORCH_COMPILE", "0", "3", "4",
                         *STR_JUNK),
    "performance-mode": ("balanced", "interactivity", "throughput", "Throughput", *STR_JUNK),
    "enforce-eager": ("--enforce-eager", "--no-enforce-eager"),
    "step-time": ("0.01", "1e-9", "1e-300", "0", "-1", *FLOAT_JUNK),
    "profile": ("@profile", "@list.json", "@missing.json", "@dir", "@budget1.yaml", ""),
    "trace": ("@trace.csv", "@empty.csv", "@missing.csv", "@dir", "@list.json", ""),
    "trace-format": ("servesim", "azure", "mooncake", "vllm-bench", *STR_JUNK),
    "scenario": ("default", "bursty", "code", "cpu-chat", "multi-turn", "system-prompts",
                 "teaching", *STR_JUNK),
    "arrival": ("poisson", "gamma", "constant", "bursts", *STR_JUNK),
    "rate": ("0.5", "5", "1e6", "1e-320", "0", "-1", *FLOAT_JUNK),
    "burstiness": ("0.5", "1", "4", "0", "-1", *FLOAT_JUNK),
    "num-requests": ("1", "20", "0", "-1", "1000000000000", *INT_JUNK),
    "window": ("1", "0.5", "0", "-1", *FLOAT_JUNK),
    "time-scale": ("2", "0.5", "0", "-1", *FLOAT_JUNK),
    "seed": ("0", "1", "-1", str(2**32), str(2**64), *INT_JUNK),
    "slo-ttft": ("1", "0.05", "0", "-1", *FLOAT_JUNK),
    "slo-tpot": ("1", "0.05", "0", "-1", *FLOAT_JUNK),
    "queue": ("fcfs", "priority", "sjf", "oracle-srpt", "lpm", *STR_JUNK),
    "preemption-mode": ("recompute", "swap", *STR_JUNK),
    "kv-allocation": ("paged", "reserve", *STR_JUNK),
    "swap-space": ("0", "4", "1e6", "1e308", "-1", *FLOAT_JUNK),
    "pcie-bandwidth": ("25", "1e-9", "1e308", "0", "-1", *FLOAT_JUNK),
    "tensor-parallel-size": ("1", "2", "3", "4", "7", "8", "14", "16", "0", "-1", *INT_JUNK),
    "replicas": ("1", "2", "4", "1025", "0", "-1", *INT_JUNK),
    "router": ("round-robin", "least-outstanding", "least-kv", "cache-aware",
               "cache-aware-approx", *STR_JUNK),
    "concurrency": ("1", "4", "1000000", "0", "-1", *INT_JUNK),
    "think-time": ("0", "0.5", "-1", *FLOAT_JUNK),
    "trace-sample": ("--trace-sample", "--no-trace-sample"),
    "prefix-cache": ("none", "block", "radix", *STR_JUNK),
    "enable-prefix-caching": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
    "allow-long-max-model-len": ("--allow-long-max-model-len",),
    "config": ("@budget1.yaml", "@vllm.yaml", "@tp3.toml", "@bad.yaml", "@list.json",
               "@missing.yaml", "@dir", "@trace.csv", ""),
    "compare": ("static,continuous,chunked", "chunked", "continuous", "static",
                "continuous,chunked", "chunked:reserve", "chunked:paged,chunked:reserve",
                "", ",", "bogus", "chunked,chunked", "chunked:bogus"),
    "out": ("out", "", "@file.txt", "@dir", "nested/a/b", "@file.txt/sub"),
    "full-steps": ("--full-steps",),
    "report": ("--report",),
}
SWITCHES = {f for f, vs in VALUES.items() if all(v.startswith("--") for v in vs)}
#: Integer options and the largest random value each draws (a bigger block count or KV
#: memory is a bigger pool to build: seconds per run).
INT_RANGE = {"max-num-seqs": 2**20, "max-num-batched-tokens": 2**20, "block-size": 2**20,
             "max-model-len": 2**22, "num-gpu-blocks": 2**20, "kv-cache-memory": 2**40,
             "long-prefill-token-threshold": 2**20, "max-tokens": 2**20, "seed": 2**70,
             "tensor-parallel-size": 2**10, "concurrency": 2**20,
             "max-cudagraph-capture-size": 2**12}
FLOATS = ("gpu-memory-utilization", "step-time", "rate", "burstiness", "window",
          "time-scale", "slo-ttft", "slo-tpot", "swap-space", "pcie-bandwidth",
          "think-time")

#: Config files the ``config`` option reads, and the options each sets (by hand).
CONFIG_FILES: dict[str, tuple[str, dict[str, str]]] = {
    "budget1.yaml": ("max-num-batched-tokens: 1\n", {"max-num-batched-tokens": "1"}),
    "vllm.yaml": ("model: meta-llama/Llama-2-7b-hf\nmax_model_len: 8192\n",
                  {"model": "llama-2-7b", "max-model-len": "8192"}),
    "tp3.toml": ("tensor_parallel_size = 3\n", {"tensor-parallel-size": "3"}),
}
OTHER_FILES = {"trace.csv": "arrival_time,num_prompt_tokens,output_len\n0,10,5\n"
               "0.5,20000,3\n1,100,2\n", "empty.csv": "", "bad.yaml": "a: [1, 2\n",
               "list.json": "[1, 2]\n", "file.txt": "not servesim's\n"}


def value(flag: str) -> st.SearchStrategy[str]:
    """A value for ``flag``: one of VALUES, or a random number of its type."""
    listed = st.sampled_from(VALUES[flag])
    if flag in INT_RANGE:
        return listed | st.integers(-3, INT_RANGE[flag]).map(str)
    if flag in FLOATS:
        return listed | st.floats().map(repr)
    return listed


def options(flags: st.SearchStrategy[list[str]]) -> st.SearchStrategy[dict[str, str]]:
    """Options (flag without ``--`` -> value) for the flags drawn."""
    return flags.flatmap(lambda fs: st.fixed_dictionaries({f: value(f) for f in fs}))


NUM_REQUESTS = st.integers(1, 20).map(str)
FLAGS = sorted(VALUES)
#: Options that act on one thing together (pairs are drawn within one half the time).
GROUPS = (
    ("trace", "trace-format", "scenario", "arrival", "rate", "burstiness", "num-requests",
     "window", "time-scale", "trace-sample", "concurrency", "think-time", "seed",
     "max-tokens", "slo-ttft", "slo-tpot", "step-time"),
    ("model", "gpu", "dtype", "quantization", "kv-cache-dtype", "max-model-len",
     "allow-long-max-model-len", "block-size", "num-gpu-blocks", "kv-cache-memory",
     "gpu-memory-utilization", "tensor-parallel-size", "profile", "config"),
    ("policy", "compare", "max-num-seqs", "max-num-batched-tokens",
     "long-prefill-token-threshold", "scheduler-reserve-full-isl", "preemption-mode",
     "swap-space", "pcie-bandwidth", "kv-allocation", "prefix-cache",
     "enable-prefix-caching", "queue", "replicas", "router"),
    ("out", "full-steps", "report", "compare", "config", "trace"),
    ("cudagraph-mode", "cudagraph-capture-sizes", "max-cudagraph-capture-size",
     "optimization-level", "compilation-mode", "performance-mode", "enforce-eager",
     "num-gpu-blocks", "gpu", "max-num-seqs", "max-num-batched-tokens", "policy"),
)
PAIRS = st.sampled_from((FLAGS, *GROUPS)).flatmap(
    lambda flags: st.lists(st.sampled_from(flags), min_size=2, max_size=2, unique=True))
