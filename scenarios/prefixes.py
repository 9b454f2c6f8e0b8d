"""Shared-prefix workloads: generators that give prompts a content, as the
(segment id, tokens) pairs a prefix cache reads (``Workload.prompt_segments``; see
sim/kv/prefix_content.py), without materializing any token.

- ``SharedPrefixes``: K system prompts of given lengths, picked per request with Zipf
  popularity (probability of the i-th most popular proportional to 1 / i^s), each
  followed by the request's own user message (the length model's prompt length).
- ``MultiTurn``: chat sessions; each turn's prompt is the previous turn's prompt plus
  its answer plus a new message (the length model's prompt length), optionally after a
  system prompt every session shares. Session starts come from the scenario's arrival
  process slowed by the mean number of turns (so the request rate stays about the
  scenario's); each next turn follows after an exponential think time. Arrivals are
  open loop: under load a turn may arrive before its previous answer is complete, and
  then hits only what is cached by then.

A generator's ``apply(workload, rng)`` returns the workload with prompt lengths, segments
(and, for sessions, arrival times) replaced; request ids are kept, since a turn's prompt
names the previous turn's answer by its request id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from scenarios.workload import Workload
from sim.kv.prefix_content import answer_segment_id, unique_segment_id

#: Segment ids of synthetic system prompts: SYSTEM_PROMPT_ID + k for the k-th prompt.
SYSTEM_PROMPT_ID = 1 << 40


class PrefixModel(Protocol):
    """Gives a generated workload's prompts their content."""

    def apply(self, workload: Workload, rng: np.random.Generator) -> Workload: ...

    def describe(self) -> str: ...


def zipf_weights(k: int, s: float) -> np.ndarray:
    """Popularity of K items, proportional to 1 / rank^s (s = 0: uniform)."""
    w = 1.0 / np.arange(1, k + 1, dtype=np.float64) ** s
    return w / w.sum()


@dataclass(frozen=True, slots=True)
class SharedPrefixes:
    """``num_prefixes`` system prompts of ``prefix_len`` tokens (one length for all, or
    one per prompt, most popular first), Zipf(``zipf``) popularity.

    Raises:
        ValueError: num_prefixes < 1, a length < 1 or a count that does not match, or
            zipf < 0 (the message names the field).
    """

    num_prefixes: int = 8
    prefix_len: int | tuple[int, ...] = 2048
    zipf: float = 1.0

    def __post_init__(self) -> None:
        if int(self.num_prefixes) != self.num_prefixes or self.num_prefixes < 1:
            raise ValueError(f"num_prefixes must be an integer >= 1, got {self.num_prefixes!r}")
        lens = self.lengths()
        if len(lens) != self.num_prefixes or min(lens) < 1:
            raise ValueError(f"prefix_len must be one length >= 1 or {self.num_prefixes} of "
                             f"them, got {self.prefix_len!r}")
        if not (self.zipf >= 0 and math.isfinite(self.zipf)):
            raise ValueError(f"zipf must be a finite number >= 0, got {self.zipf!r}")

    def lengths(self) -> tuple[int, ...]:
        if isinstance(self.prefix_len, int):
            return (self.prefix_len,) * self.num_prefixes
        return tuple(int(x) for x in self.prefix_len)

    def describe(self) -> str:
        lens = sorted(set(self.lengths()))
        span = f"{lens[0]}" if len(lens) == 1 else f"{lens[0]}..{lens[-1]}"
        return f"{self.num_prefixes} system prompts of {span} tokens, zipf {self.zipf:g}"

    def apply(self, workload: Workload, rng: np.random.Generator) -> Workload:
        lens = np.asarray(self.lengths(), dtype=np.int64)
        pick = rng.choice(self.num_prefixes, size=len(workload),
                          p=zipf_weights(self.num_prefixes, self.zipf))
        user = workload.num_prompt_tokens
        segments = tuple(
            ((SYSTEM_PROMPT_ID + int(k), int(lens[k])), (unique_segment_id(rid), int(u)))
            for k, u, rid in zip(pick, user, workload.request_id, strict=True))
        return workload._replace(num_prompt_tokens=user + lens[pick],
                                 prompt_segments=segments)


@dataclass(frozen=True, slots=True)
class MultiTurn:
    """Chat sessions of a geometric number of turns (mean ``mean_turns`` >= 1), an
    exponential think time of mean ``think_time_s`` between a turn's arrival and the
    next, a ``system_prompt_len``-token system prompt shared by every session (0 =
    none), and at most ``max_context`` tokens (prompt plus answer) a turn: a session
    that would grow past it ends and the turn opens a new session.

    Raises:
        ValueError: a field out of range (the message names it).
    """

    mean_turns: float = 5.0
    think_time_s: float = 30.0
    system_prompt_len: int = 0
    max_context: int = 32768

    def __post_init__(self) -> None:
        if not (self.mean_turns >= 1 and math.isfinite(self.mean_turns)):
            raise ValueError(f"mean_turns must be a finite number >= 1, got {self.mean_turns!r}")
        if not (self.think_time_s >= 0 and math.isfinite(self.think_time_s)):
            raise ValueError(f"think_time_s must be a finite number >= 0, got "
                             f"{self.think_time_s!r}")
        if int(self.system_prompt_len) != self.system_prompt_len or self.system_prompt_len < 0:
            raise ValueError(f"system_prompt_len must be an integer >= 0, got "
                             f"{self.system_prompt_len!r}")
        if int(self.max_context) != self.max_context or self.max_context < 2:
            raise ValueError(f"max_context must be an integer >= 2, got {self.max_context!r}")

    def describe(self) -> str:
        sys_part = f", {self.system_prompt_len}-token system prompt" * bool(
            self.system_prompt_len)
        return (f"sessions of {self.mean_turns:g} turns on average, think time "
                f"{self.think_time_s:g} s{sys_part}")

    def apply(self, workload: Workload, rng: np.random.Generator) -> Workload:
        n = len(workload)
        msg, out = workload.num_prompt_tokens, workload.output_len
        ids = workload.request_id
        starts = workload.arrival_time * self.mean_turns  # sessions at rate / mean_turns
        turns_left = rng.geometric(1.0 / self.mean_turns, size=n)
        gaps = rng.exponential(self.think_time_s, size=n) if self.think_time_s else np.zeros(n)
        system = (((SYSTEM_PROMPT_ID, self.system_prompt_len),)
                  if self.system_prompt_len else ())
        arrival = np.empty(n)
        prompt = np.empty(n, dtype=np.int64)
        segments: list[tuple[tuple[int, int], ...]] = []
        session = -1
        left = 0
        prev: tuple[tuple[int, int], ...] = ()
        prev_len = prev_out = 0
        for i in range(n):
            m, o = int(msg[i]), int(out[i])
            grow = prev_len + prev_out + m
            if left <= 0 or grow + o > self.max_context:  # a new session
                session += 1
                left = int(turns_left[session])
                segs = (*system, (unique_segment_id(ids[i]), m))
                t = float(starts[session])
            else:
                segs = (*prev, (answer_segment_id(ids[i - 1]), prev_out),
                        (unique_segment_id(ids[i]), m))
                t = arrival[i - 1] + float(gaps[i])
            arrival[i] = t
            prev, prev_out = segs, o
            prev_len = prompt[i] = sum(length for _, length in segs)
            segments.append(segs)
            left -= 1
        return Workload.from_arrays(
            arrival, prompt, out, max_tokens=workload.max_tokens, priority=workload.priority,
            request_id=ids, source=workload.source, prompt_segments=segments)
