"""ShareGPT JSON tokenized by a local tokenizer (scenarios/sharegpt.py): token counts and
prompt segments checked by hand on a tiny word-level tokenizer built here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scenarios.traces import load_trace
from sim.kv.prefix_content import answer_segment_id, unique_segment_id

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "x"]


def conversation(*texts: str) -> dict[str, object]:
    roles = ("human", "gpt")
    return {"id": "c", "conversations": [{"from": roles[k % 2], "value": t}
                                         for k, t in enumerate(texts)]}


@pytest.fixture
def tokenizer(tmp_path: Path) -> Path:
    """A word-level tokenizer.json that adds a BOS to each text, as Llama's does."""
    tokenizers = pytest.importorskip("tokenizers", reason="the optional extra tokenizer")
    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def test_turns_counted_and_chained(tmp_path: Path, tokenizer: Path) -> None:
    path = write(tmp_path, [
        conversation("a b c d", "e f g", "h i", "j k l m n"),  # 2 turns
        conversation("a b c"),  # one message: left out, as vLLM
        conversation("x", "a b c d"),  # first prompt 2 tokens < 4: vLLM's filter
        conversation("a b c", "d e f", "", "g"),  # stops at the empty message
    ])
    w = load_trace(path, tokenizer=tokenizer)
    assert w.request_id == ("0.0", "3.0", "0.1")  # every first turn, then second turns
    # BOS + words for a first prompt and every answer (vLLM's counts); later messages
    # without: 0.1 = 5 (0.0's prompt) + 4 (its answer) + 2 ("h i")
    np.testing.assert_array_equal(w.num_prompt_tokens, [5, 4, 11])
    np.testing.assert_array_equal(w.output_len, [4, 4, 6])
    np.testing.assert_array_equal(w.arrival_time, [0.0, 0.0, 0.0])
    assert w.prompt_segments == (
        ((unique_segment_id("0.0"), 5),),
        ((unique_segment_id("3.0"), 4),),
        ((unique_segment_id("0.0"), 5), (answer_segment_id("0.0"), 4),
         (unique_segment_id("0.1"), 2)))
    assert w.source == "sharegpt s.json: 2 conversations, 3 turns, 2 conversations left out"


def test_without_tokenizer_one_line_names_the_option(tmp_path: Path) -> None:
    path = write(tmp_path, [conversation("a b c d", "e f g h")])
    with pytest.raises(ValueError) as err:
        load_trace(path)
    assert str(err.value) == ("s.json is ShareGPT JSON (text, no token counts): give "
                              "--tokenizer PATH, the model's tokenizer.json")


@pytest.mark.parametrize(("doc", "message"), [
    ([conversation("a b c d", "e f g h"), {"conversations": [{"value": 3}]}],
     "s.json: [1].conversations[0].value is not a string"),
    ([{"conversations": "hi"}], "s.json: [0].conversations is not a list"),
    ([conversation("x", "y")], "s.json: no conversation passes vLLM's ShareGPT filter"),
])
def test_bad_entries_named(tmp_path: Path, tokenizer: Path, doc: object,
                           message: str) -> None:
    with pytest.raises(ValueError) as err:
        load_trace(write(tmp_path, doc), "sharegpt", tokenizer=tokenizer)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_invalid_json_names_the_line(tmp_path: Path, tokenizer: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('[{"conversations": [\n{"from": "human", "value": "a"},\n}]\n')
    with pytest.raises(ValueError, match=r"^s.json line 3: invalid JSON"):
        load_trace(path, tokenizer=tokenizer)


def test_tokenizer_with_another_format_refused(tmp_path: Path, tokenizer: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n')
    with pytest.raises(ValueError, match="--tokenizer applies to ShareGPT JSON only"):
        load_trace(path, tokenizer=tokenizer)


def test_cli_run_second_turns_hit_the_first(tmp_path: Path, tokenizer: Path) -> None:
    from typer.testing import CliRunner

    from sim.app.cli.main import app
    doc = [conversation("a b c d " * 8, "e f g h " * 4, "i j", "k l m n")] * 20
    args = ["run", "--trace", str(write(tmp_path, doc)), "--rate", "2", "--step-time",
            "0.01", "--prefix-cache", "block", "--out", str(tmp_path / "run")]
    assert "--tokenizer" in CliRunner().invoke(app, args).output
    res = CliRunner().invoke(app, [*args, "--tokenizer", str(tokenizer)])
    assert res.exit_code == 0, res.output
    cache = json.loads((tmp_path / "run" / "summary.json").read_text())["prefix_cache"]
    # 20 first turns of 33 tokens, 20 second turns of 33 + 17 + 2 = 52
    assert cache["queried_tokens"] == 20 * 33 + 20 * 52
    # each second turn finds its first turn's prompt and answer: 50 tokens, 3 full blocks
    assert cache["hit_tokens"] == 20 * 3 * 16


def test_a_ray_driver_ships_a_sharegpt_trace_read_with_its_tokenizer(
        tmp_path: Path, tokenizer: Path) -> None:
    """sweep's driver reads the trace for Ray workers as they would: with --tokenizer
    (without it a ShareGPT file cannot be read at all)."""
    from sim.app.runs.run_config import RunConfig
    from sim.app.runs.sweep import driver_inputs

    path = write(tmp_path, [conversation("a b c d", "e f g", "h i", "j k l m n")])
    cfg = RunConfig(trace=str(path), tokenizer=str(tokenizer), rate=1.0, step_time=0.01)
    _, shipment = driver_inputs(cfg, "ray")
    (workload,) = shipment.values()
    np.testing.assert_array_equal(workload.num_prompt_tokens, [5, 11])
