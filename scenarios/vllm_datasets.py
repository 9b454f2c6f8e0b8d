"""vLLM's synthetic benchmark datasets that are defined by numbers alone, as scenarios:
``random`` and ``prefix_repetition`` (``vllm bench serve --dataset-name``).

Owns their parameters, defaults and length rules, as vLLM defines them
(vllm/benchmarks/datasets: ``RandomDataset``, ``get_sampling_params`` and
``PrefixRepetitionRandomDataset``):

- ``random``: prompt lengths uniform on the integers ``[floor(input_len * (1 - r)),
  ceil(input_len * (1 + r))]`` and output lengths on ``[max(1, floor(output_len * (1 -
  r))), max(1, ceil(output_len * (1 + r)))]`` (``r`` = range_ratio, in [0, 1)), after a
  ``prefix_len``-token prefix every prompt shares. Defaults: input_len 1024, output_len
  128, range_ratio 0, prefix_len 0. vLLM subtracts the tokenizer's special tokens (a BOS)
  from input_len before drawing and the server adds them back; without a tokenizer here
  that count is 0, so the lengths are those the server sees when range_ratio is 0.
- ``prefix_repetition``: ``num_prefixes`` prefixes of ``prefix_len`` tokens, each followed
  by ``num_requests // num_prefixes`` prompts of ``suffix_len`` tokens of their own, every
  output ``output_len`` tokens, in shuffled order. As in vLLM, ``num_requests`` is rounded
  down to a multiple of num_prefixes (an error when below it). Defaults: prefix_len 256,
  suffix_len 256, num_prefixes 10, output_len 128.

Both keep vLLM's traffic defaults: 1,000 requests (``--num-prompts``) all sent at t = 0
(``--request-rate inf``); ``--rate`` gives Poisson arrivals and ``--burstiness`` gamma
ones, as vLLM's do. Prompts carry content (shared prefixes as prompt segments,
sim/kv/prefix_content.py), so ``--prefix-cache`` hits where vLLM's would. The draws use
servesim's seeded generators, not vLLM's, so a seed gives other (equally distributed)
lengths than vLLM's same seed.

Parameters are given in the scenario's name: ``random:input_len=2048,range_ratio=0.5``;
each key is vLLM's option name with or without its dataset prefix and dashes
(``random-input-len``, ``random_input_len`` and ``input_len`` are one key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scenarios.lengths import Fixed, Independent, LengthModel
from scenarios.prefixes import SYSTEM_PROMPT_ID
from scenarios.workload import Workload
from sim.kv.prefix_content import unique_segment_id

#: vLLM's dataset names, their parameters and defaults (vllm bench serve's).
DATASETS: dict[str, dict[str, float]] = {
    "random": {"input_len": 1024, "output_len": 128, "range_ratio": 0.0, "prefix_len": 0},
    "prefix_repetition": {"prefix_len": 256, "suffix_len": 256, "num_prefixes": 10,
                          "output_len": 128},
}
#: vllm bench serve's --num-prompts default.
DEFAULT_NUM_PROMPTS = 1000


def split_name(name: str) -> tuple[str, dict[str, float]] | None:
    """``(dataset, parameters with defaults filled in)`` for a scenario name such as
    ``random:input_len=2048``; None when the name is not one of ``DATASETS``.

    Raises:
        ValueError: an unknown key, a value that is not a number (an integer where vLLM's
            is one), or a key given twice (the message names the scenario and the key).
    """
    base, _, args = name.partition(":")
    base = base.strip()
    if base not in DATASETS:
        return None
    params = dict(DATASETS[base])
    given: set[str] = set()
    for item in filter(None, (x.strip() for x in args.split(","))):
        raw_key, sep, text = item.partition("=")
        key = _key(base, raw_key)
        if not sep or key not in params:
            known = ", ".join(DATASETS[base])
            raise ValueError(f"scenario {base}: {item!r} is not key=value with a key of "
                             f"{known}")
        if key in given:
            raise ValueError(f"scenario {base}: {key} given twice")
        given.add(key)
        params[key] = _number(base, key, text.strip())
    return base, params


def _key(base: str, raw: str) -> str:
    """vLLM's option name in any of its spellings, as the parameter's name."""
    key = raw.strip().lstrip("-").replace("-", "_").lower()
    return key.removeprefix(f"{base}_")


def _number(base: str, key: str, text: str) -> float:
    try:
        value = float(text) if key == "range_ratio" else int(text)
    except ValueError:
        kind = "a number" if key == "range_ratio" else "an integer"
        raise ValueError(f"scenario {base}: {key} {text!r} is not {kind}") from None
    return value


@dataclass(frozen=True, slots=True)
class RandomLengths:
    """vLLM's ``random`` lengths (module docstring): a LengthModel (scenarios/lengths.py).
    ``prefix_len`` tokens are added to every prompt (their content: ``RepeatedPrefixes``).

    Raises:
        ValueError: input_len < 1, output_len < 1, prefix_len < 0, range_ratio outside
            [0, 1), or a shortest prompt of 0 tokens (the message names the field).
    """

    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    prefix_len: int = 0

    def __post_init__(self) -> None:
        for field, low in (("input_len", 1), ("output_len", 1), ("prefix_len", 0)):
            value = getattr(self, field)
            if int(value) != value or value < low:
                raise ValueError(f"{field} must be an integer >= {low}, got {value!r}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise ValueError(f"range_ratio must be in [0, 1), got {self.range_ratio!r}")
        if self.prefix_len + self.bounds()[0][0] < 1:
            raise ValueError(f"input_len {self.input_len} with range_ratio "
                             f"{self.range_ratio:g} allows 0-token prompts; raise input_len "
                             "or prefix_len, or lower range_ratio")

    def bounds(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """((lowest, highest) sampled prompt tokens, (lowest, highest) output tokens),
        both inclusive, as vLLM's get_sampling_params computes them."""
        r = self.range_ratio
        in_low = math.floor(self.input_len * (1 - r))
        in_high = math.ceil(self.input_len * (1 + r))
        out_low = max(math.floor(self.output_len * (1 - r)), 1)
        out_high = max(math.ceil(self.output_len * (1 + r)), 1)
        return (in_low, in_high), (out_low, out_high)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        (in_low, in_high), (out_low, out_high) = self.bounds()
        prompt = rng.integers(in_low, in_high, size=n, endpoint=True, dtype=np.int64)
        output = rng.integers(out_low, out_high, size=n, endpoint=True, dtype=np.int64)
        return prompt + self.prefix_len, output

    def describe(self) -> str:
        (in_low, in_high), (out_low, out_high) = self.bounds()
        prefix = f"{self.prefix_len} + " * bool(self.prefix_len)
        return (f"prompt {prefix}uniform({in_low}..{in_high}) x output "
                f"uniform({out_low}..{out_high})")


@dataclass(frozen=True, slots=True)
class RepeatedPrefixes:
    """Prompt content: ``num_prefixes`` prefixes of ``prefix_len`` tokens, each starting
    ``len(workload) // num_prefixes`` prompts (the rest dropped), in random order; after
    it, each prompt's own tokens. A PrefixModel (scenarios/prefixes.py) applied to lengths
    that already include the prefix.

    Raises:
        ValueError: num_prefixes < 1 or prefix_len < 1 (at construction); fewer requests
            than prefixes, or a prompt no longer than the prefix (at ``apply``).
    """

    num_prefixes: int
    prefix_len: int

    def __post_init__(self) -> None:
        for field in ("num_prefixes", "prefix_len"):
            value = getattr(self, field)
            if int(value) != value or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")

    def describe(self) -> str:
        if self.num_prefixes == 1:
            return f"one {self.prefix_len}-token prefix shared by every prompt"
        return f"{self.num_prefixes} prefixes of {self.prefix_len} tokens, equally repeated"

    def apply(self, workload: Workload, rng: np.random.Generator) -> Workload:
        per_prefix = len(workload) // self.num_prefixes
        if per_prefix == 0:
            raise ValueError(f"num_requests ({len(workload)}) must be >= num_prefixes "
                             f"({self.num_prefixes})")
        kept = workload._replace(slice(0, per_prefix * self.num_prefixes))
        if int(kept.num_prompt_tokens.min()) < self.prefix_len:
            raise ValueError(f"every prompt must hold its {self.prefix_len}-token prefix")
        pick = np.repeat(np.arange(self.num_prefixes), per_prefix)
        if self.num_prefixes > 1:
            pick = rng.permutation(pick)
        segments = tuple(
            ((SYSTEM_PROMPT_ID + int(k), self.prefix_len),
             *(((unique_segment_id(rid), int(n) - self.prefix_len),)
               if n > self.prefix_len else ()))
            for k, n, rid in zip(pick, kept.num_prompt_tokens, kept.request_id, strict=True))
        return kept._replace(prompt_segments=segments)


def scenario_parts(base: str, params: dict[str, float]
                   ) -> tuple[LengthModel, RepeatedPrefixes | None, str]:
    """The length model, prompt content (None: none shared) and description of the
    dataset ``base`` with ``params`` (as ``split_name`` returns them).

    Raises:
        ValueError: a parameter out of range (the message names it).
    """
    p = {k: params[k] for k in DATASETS[base]}
    label = f"vLLM {base}(" + ", ".join(f"{k}={v:g}" for k, v in p.items()) + ")"
    if base == "random":
        lengths: LengthModel = RandomLengths(int(p["input_len"]), int(p["output_len"]),
                                             float(p["range_ratio"]), int(p["prefix_len"]))
        prefix_len = int(p["prefix_len"])
        prefix = RepeatedPrefixes(1, prefix_len) if prefix_len else None
        return lengths, prefix, label
    for field in ("suffix_len", "output_len"):
        if int(p[field]) < 1:
            raise ValueError(f"{field} must be an integer >= 1, got {int(p[field])}")
    prefix = RepeatedPrefixes(int(p["num_prefixes"]), int(p["prefix_len"]))
    lengths = Independent(Fixed(int(p["prefix_len"] + p["suffix_len"])),
                          Fixed(int(p["output_len"])))
    return lengths, prefix, label
