"""ShareGPT conversations (``vllm bench serve --dataset-name sharegpt``'s JSON), tokenized
with a local tokenizer file and read as a Workload whose multi-turn prompts carry content.

Owns the format and its token counts. The file is one JSON list of ``{"id",
"conversations": [{"from": "human" | "gpt", "value": text}, ...]}``; as vLLM's
``ShareGPTDataset`` reads it (vllm/benchmarks/datasets), entries with fewer than two
messages are left out, messages pair by position (0 with 1, 2 with 3, ...: a prompt and
its answer, whatever their roles), a prompt's tokens are the tokenizer's ids with its
special tokens (a BOS) and an answer's too (vLLM's expected_output_len, the max_tokens it
sends), and a conversation is kept only when its first turn passes vLLM's filter (prompt
and answer >= 4 tokens, prompt <= 1,024, both <= 2,048).

vLLM sends only the first turn; here every turn is a request: turn k's prompt is the
conversation so far, as prompt segments (sim/kv/prefix_content.py): the previous turn's
prompt, that turn's answer (``answer_segment_id``: the tokens it generated) and the new
message, counted without special tokens, so ``--prefix-cache`` finds earlier turns. A
conversation stops before a turn with an empty message or answer. The file has no
times: every request arrives at t = 0 (vllm bench serve's --request-rate inf), in turn
order (every conversation's first turn, then every second turn, ...), so re-timing
(``--rate``) spaces each conversation's turns by the others'. Request ids are
``"<entry index>.<turn>"``.

The tokenizer is a ``tokenizer.json`` read by the ``tokenizers`` package (the optional
extra ``tokenizer``). Every error is one line naming the file and the entry, message or
field ("sg.json: [3].conversations[1].value is not a string").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scenarios.workload import Workload
from sim.kv.prefix_content import answer_segment_id, unique_segment_id

#: vLLM's is_valid_sequence defaults: the first turn's limits (tokens).
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048
_EXTRA = "pip install 'servesim[tokenizer]'"


def looks_like(head: str) -> bool:
    """Whether a file starting with ``head`` is ShareGPT JSON: a list whose first entry
    holds ``"conversations"``."""
    return head.lstrip().startswith("[") and '"conversations"' in head


def load_workload(path: Path, lines: list[str], tokenizer: Path | str | None) -> Workload:
    """The ``sharegpt`` trace loader (module docstring).

    Raises:
        ValueError: no ``tokenizer`` (the message names --tokenizer), the tokenizers
            package absent, a tokenizer file it cannot read, invalid JSON, a bad entry
            (named), or no conversation left after vLLM's filter.
        FileNotFoundError: the tokenizer file does not exist.
    """
    if tokenizer is None:
        raise ValueError(f"{path.name} is ShareGPT JSON (text, no token counts): give "
                         "--tokenizer PATH, the model's tokenizer.json")
    encode = _encoder(Path(tokenizer))
    conversations = _conversations(path.name, "\n".join(lines))
    turns = [_turns(messages, encode) for messages in conversations]
    kept = [(i, t) for i, t in enumerate(turns) if t and _valid_first(*t[0])]
    if not kept:
        raise ValueError(f"{path.name}: no conversation passes vLLM's ShareGPT filter "
                         f"(first prompt and answer >= {MIN_LEN} tokens, prompt <= "
                         f"{MAX_PROMPT_LEN}, both <= {MAX_TOTAL_LEN})")
    return _workload(path.name, kept, len(conversations))


def _encoder(path: Path) -> Any:
    """``encode(texts, special) -> token counts`` of the tokenizer file at ``path``."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(f"--tokenizer needs the tokenizers package: {_EXTRA}") from None
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception on a bad file
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path.name}: not a tokenizer.json the tokenizers package reads "
                         f"({first})") from None

    def encode(texts: Sequence[str], special: bool) -> list[int]:
        batch = tok.encode_batch(list(texts), add_special_tokens=special)
        return [len(e.ids) for e in batch]

    return encode


def _conversations(name: str, text: str) -> list[list[str]]:
    """Each entry's message texts (entries of fewer than two messages left out, as vLLM
    does); ValueError naming the entry or message at fault."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} line {e.lineno}: invalid JSON ({e.msg})") from None
    except RecursionError:
        raise ValueError(f"{name}: JSON nested too deeply to read") from None
    if not isinstance(doc, list):
        raise ValueError(f"{name}: expected a JSON list of conversations, got "
                         f"{type(doc).__name__}")
    out = []
    for i, entry in enumerate(doc):
        if not isinstance(entry, dict):
            raise ValueError(f"{name}: [{i}] is not an object")
        messages = entry.get("conversations")
        if messages is None:
            continue
        if not isinstance(messages, list):
            raise ValueError(f"{name}: [{i}].conversations is not a list")
        texts = []
        for j, m in enumerate(messages):
            value = m.get("value") if isinstance(m, dict) else None
            if not isinstance(value, str):
                raise ValueError(f"{name}: [{i}].conversations[{j}].value is not a string")
            texts.append(value)
        out.append(texts if len(texts) >= 2 else [])
    return out


_Turn = tuple[int, int]  # (new prompt tokens, answer tokens)


def _turns(messages: list[str], encode: Any) -> list[_Turn]:
    """The conversation's turns as token counts: the first prompt with special tokens
    (vLLM's count), later messages without; answers with (vLLM's expected_output_len).
    Cut before the first turn with an empty message or answer."""
    if not messages:
        return []
    pairs = len(messages) // 2
    prompts, answers = messages[0:2 * pairs:2], messages[1:2 * pairs:2]
    first = encode(prompts[:1], True)
    later = encode(prompts[1:], False)
    out_lens = encode(answers, True)
    plain_answers = encode(answers, False)
    turns = []
    for p, o, plain in zip([*first, *later], out_lens, plain_answers, strict=True):
        if p < 1 or plain < 1:
            break
        turns.append((p, o))
    return turns


def _valid_first(prompt: int, answer: int) -> bool:
    """vLLM's is_valid_sequence with its defaults."""
    return (prompt >= MIN_LEN and answer >= MIN_LEN and prompt <= MAX_PROMPT_LEN
            and prompt + answer <= MAX_TOTAL_LEN)


def _workload(name: str, kept: list[tuple[int, list[_Turn]]], num_entries: int) -> Workload:
    """The requests of ``kept`` conversations in turn order, all at t = 0."""
    ids: list[str] = []
    prompt: list[int] = []
    out: list[int] = []
    segments: list[tuple[tuple[int, int], ...]] = []
    history: dict[int, tuple[tuple[tuple[int, int], ...], str, int]] = {}
    for k in range(max(len(t) for _, t in kept)):
        for i, turns in kept:
            if k >= len(turns):
                continue
            new, answer = turns[k]
            rid = f"{i}.{k}"
            segs: tuple[tuple[int, int], ...] = ((unique_segment_id(rid), new),)
            if k:
                prev_segs, prev_id, prev_out = history[i]
                segs = (*prev_segs, (answer_segment_id(prev_id), prev_out), *segs)
            history[i] = (segs, rid, answer)
            ids.append(rid)
            prompt.append(sum(n for _, n in segs))
            out.append(answer)
            segments.append(segs)
    left = num_entries - len(kept)
    note = f", {left} conversation{'s' * (left != 1)} left out" if left else ""
    try:
        return Workload.from_arrays(
            np.zeros(len(ids)), prompt, out, request_id=ids, prompt_segments=segments,
            source=f"sharegpt {name}: {len(kept)} conversations, {len(ids)} turns{note}")
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
