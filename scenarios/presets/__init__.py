"""Named scenarios: a ready-made arrival process plus length model, chosen by name.

Owns the preset table and ``ScenarioSpec``. The table is plain Python, not TOML: the
project supports Python 3.10 (``requires-python`` in pyproject.toml), which has no
``tomllib``. It ships no data files (pyproject.toml lists no package data for it).

Presets (lengths fitted as a log-normal with median = p50 and sigma = sqrt(2 ln(mean/p50)),
clipped to the range observed in the trace; statistics from ../shared/traces/README.md):

- ``default``: chat traffic. Poisson at 5.0 req/s (close to the Azure conversation trace's
  5.53 req/s), 1,000 requests. Prompt: Azure conv 2023 input mean 1,154.7 / p50 1,020
  -> median 1020, sigma 0.498, clipped to [2, 14050]. Output: mean 211.1 / p50 129 ->
  median 129, sigma 0.992, clipped to [7, 1000] (1,000 is the trace's maximum, likely the
  service's cap). The fit matches medians; after clipping the means are about 1,154 and
  200.6 (1.9% of outputs sit at the 1,000 cap) and the p99s about 3,240 and 1,000, against
  the trace's 4,142 and 601: a two-parameter log-normal cannot match all three statistics.
- ``bursty``: ``default`` with gamma arrivals of burstiness 0.25 (gap CV 2).
- ``code``: Azure code 2023 (prefill-heavy): Poisson at 2.5 req/s, 1,000 requests; prompt
  mean 2,047.9 / p50 1,469 -> median 1469, sigma 0.815, [3, 7437]; output mean 27.9 /
  p50 13 -> median 13, sigma 1.236, [1, 1899] (not the trace's minimum 6: a log-normal
  with this sigma puts 27% of its mass below 6, and clipping would pile it there). Clipped
  means about 1,975 (2.3% of prompts at 7,437) and 27.8.
- ``teaching``: 6 requests all at t = 0, 4-token prompts, output_len 8, 2, 3, 4, 4, 6.
- ``cpu-chat``: short chat sized for validating on a CPU (``servesim validate`` with the
  shipped CPU profile, docs/fidelity.md): Poisson at 0.5 req/s, 200 requests; prompt
  log-normal median 96, sigma 0.6, clipped to [32, 256]; output median 24, sigma 0.6,
  clipped to [8, 64]. Every step stays inside the profile's measured grid (32 seqs, 512
  batched tokens, context 2048).
- ``system-prompts`` (for prefix caching): ``default`` traffic whose prompts each
  start with one of 8 system prompts of 2,048 tokens, Zipf 1.0 popularity (the most
  popular in 37% of requests), then the chat-length user message.
- ``multi-turn`` (for prefix caching): chat sessions of 5 turns on average behind a shared
  1,024-token system prompt; each turn's prompt is the previous prompt plus its answer plus
  a new chat-length message, 30 s think time on average, contexts up to 32,768 tokens.
  Sessions start at 0.4/s (rate 2 / 5 turns), about 2 req/s once sessions overlap;
  the 1,000 requests span about 990 s as the last sessions' turns trail on.
- ``random`` and ``prefix_repetition``: vLLM's synthetic benchmark datasets, with vLLM's
  parameters and defaults after the name (``random:input_len=2048,range_ratio=0.5``;
  scenarios/vllm_datasets.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scenarios import vllm_datasets
from scenarios.arrivals import ARRIVAL_PROCESSES, MIN_RATE
from scenarios.lengths import Independent, InOrder, LengthModel, LogNormal
from scenarios.prefixes import MultiTurn, PrefixModel, SharedPrefixes


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    """A named workload recipe: ``num_requests`` requests from ``arrival`` at ``rate``.

    ``rate`` in req/s (> 0, inf = all at t = 0); ``burstiness`` is the gamma shape (used when
    ``arrival`` is "gamma"); ``burst_size`` requests per wave for "bursts"; ``max_tokens``
    caps every request (None = cap at output_len).

    Raises:
        ValueError: a field outside its range (the message names it).
    """

    name: str
    description: str
    lengths: LengthModel
    arrival: str = "poisson"
    rate: float = 5.0
    num_requests: int = 1000
    burstiness: float = 1.0
    burst_size: int = 8
    max_tokens: int | None = None
    prefix: PrefixModel | None = None

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVAL_PROCESSES:
            raise ValueError(
                f"arrival must be one of {', '.join(ARRIVAL_PROCESSES)}; got {self.arrival!r}"
            )
        if not self.rate >= MIN_RATE:
            raise ValueError(f"rate must be >= {MIN_RATE:g} requests/s (inf allowed), got "
                             f"{self.rate!r}")
        if int(self.num_requests) != self.num_requests or self.num_requests < 1:
            raise ValueError(f"num_requests must be an integer >= 1, got {self.num_requests!r}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0 (inf allowed), got {self.burstiness!r}")
        if int(self.burst_size) != self.burst_size or self.burst_size < 1:
            raise ValueError(f"burst_size must be an integer >= 1, got {self.burst_size!r}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens!r}")


AZURE_CONV_LENGTHS = Independent(
    prompt=LogNormal.from_mean_median(mean=1154.7, median=1020, min_len=2, max_len=14050),
    output=LogNormal.from_mean_median(mean=211.1, median=129, min_len=7, max_len=1000),
)
AZURE_CODE_LENGTHS = Independent(
    prompt=LogNormal.from_mean_median(mean=2047.9, median=1469, min_len=3, max_len=7437),
    output=LogNormal.from_mean_median(mean=27.9, median=13, min_len=1, max_len=1899),
)
CPU_CHAT_LENGTHS = Independent(
    prompt=LogNormal(median=96, sigma=0.6, min_len=32, max_len=256),
    output=LogNormal(median=24, sigma=0.6, min_len=8, max_len=64),
)

_PRESETS: dict[str, ScenarioSpec] = {
    spec.name: spec
    for spec in (
        ScenarioSpec(
            name="default",
            description="chat: Poisson 5 req/s, Azure-conv-fitted log-normal lengths",
            lengths=AZURE_CONV_LENGTHS,
            arrival="poisson", rate=5.0, num_requests=1000,
        ),
        ScenarioSpec(
            name="bursty",
            description="chat lengths, gamma arrivals at 5 req/s with burstiness 0.25 (CV 2)",
            lengths=AZURE_CONV_LENGTHS,
            arrival="gamma", rate=5.0, num_requests=1000, burstiness=0.25,
        ),
        ScenarioSpec(
            name="code",
            description="coding assistant: Poisson 2.5 req/s, Azure-code-fitted lengths",
            lengths=AZURE_CODE_LENGTHS,
            arrival="poisson", rate=2.5, num_requests=1000,
        ),
        ScenarioSpec(
            name="teaching",
            description="6 requests at t=0, 4-token prompts, outputs 8, 2, 3, 4, 4, 6",
            lengths=InOrder(num_prompt_tokens=np.full(6, 4),
                            output_len=np.array([8, 2, 3, 4, 4, 6])),
            arrival="constant", rate=math.inf, num_requests=6,
        ),
        ScenarioSpec(
            name="cpu-chat",
            description="short chat for CPU validation: Poisson 0.5 req/s, prompts 32-256, "
                        "outputs 8-64",
            lengths=CPU_CHAT_LENGTHS, arrival="poisson", rate=0.5, num_requests=200,
        ),
        ScenarioSpec(
            name="system-prompts",
            description="chat behind 8 shared 2,048-token system prompts (Zipf 1.0); "
                        "for --prefix-cache",
            lengths=AZURE_CONV_LENGTHS, arrival="poisson", rate=5.0, num_requests=1000,
            prefix=SharedPrefixes(num_prefixes=8, prefix_len=2048, zipf=1.0),
        ),
        ScenarioSpec(
            name="multi-turn",
            description="chat sessions (5 turns on average, 30 s think time) behind a "
                        "1,024-token system prompt; for --prefix-cache",
            lengths=AZURE_CONV_LENGTHS, arrival="poisson", rate=2.0, num_requests=1000,
            prefix=MultiTurn(mean_turns=5.0, think_time_s=30.0, system_prompt_len=1024),
        ),
    )
}


def list_scenarios() -> list[str]:
    """Names of the built-in scenarios, sorted: the presets and vLLM's synthetic datasets
    (whose parameters follow the name: ``random:input_len=2048``)."""
    return sorted([*_PRESETS, *vllm_datasets.DATASETS])


def get_scenario(name: str) -> ScenarioSpec:
    """The scenario called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    dataset = vllm_datasets.split_name(name)
    if dataset is not None:
        return _vllm_dataset(*dataset)
    try:
        return _PRESETS[name]
    except KeyError:
        raise ValueError(
            f"scenario must be one of {', '.join(list_scenarios())}; got {name!r}"
        ) from None


def _vllm_dataset(base: str, params: dict[str, float]) -> ScenarioSpec:
    """vLLM's synthetic dataset ``base`` (scenarios/vllm_datasets.py) with vLLM's traffic
    defaults: --num-prompts 1000, --request-rate inf."""
    lengths, prefix, label = vllm_datasets.scenario_parts(base, params)
    return ScenarioSpec(name=label, description=label, lengths=lengths, arrival="poisson",
                        rate=math.inf, num_requests=vllm_datasets.DEFAULT_NUM_PROMPTS,
                        prefix=prefix)
