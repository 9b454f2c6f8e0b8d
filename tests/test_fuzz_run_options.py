"""Fuzz of ``servesim run``'s options (hypothesis, in-process through typer's CliRunner):
one option with a value from its valid, edge or invalid range, two options together, the
conflicting pairs, and joint engine configurations drawn near vLLM's limits.

Every run must end cleanly: no exception but SystemExit escapes, no "Traceback" and no
Python warning reaches the user, within ``SECONDS_PER_RUN``; the exit code is 0, 1 or 2;
on 1, stderr is ``warning:`` lines and one ``error:`` line. Exit 2 is click's usage error
(a value of the wrong type, an unknown flag): CliRunner calls the typer app, whereas the
``servesim`` console script (sim/app/cli/main.py ``main``) turns a usage error into one
``error:`` line and exit 1, which ``_check_usage_error`` confirms on the same arguments;
so 2 counts as clean.

No run may succeed on a configuration vLLM 0.32 refuses to start with (tests/vllm_rules.py,
written from vLLM's source, not from servesim's checks): neither what the flags ask for
(``vllm_refusals``) nor what any config.json written records (``recorded_refusals``).
Conflicting flags (``conflicts``) fail naming both, or succeed with a ``warning:`` naming
both.

Examples per test: the hypothesis profile's (tests/conftest.py) over EXAMPLE_DIVISOR: an
example is a whole CLI run (20-400 ms), not the microseconds of a property test.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shlex
import signal
import sys
import tempfile
import traceback
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from types import FrameType
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from calibration.specs import get_model
from sim.app.cli import main as cli_main
from tests.run_option_space import (
    BIG,
    CONFIG_FILES,
    FLAGS,
    GPUS,
    MODELS,
    NUM_REQUESTS,
    OTHER_FILES,
    PAIRS,
    PROFILE,
    PROFILE_MODEL,
    SWITCHES,
    options,
)
from tests.vllm_rules import POLICIES, Model, recorded_refusals, vllm_refusals

EXAMPLE_DIVISOR = 6
EXAMPLES = max(8, settings().max_examples // EXAMPLE_DIVISOR)
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
#: Longest a run of at most 20 requests may take before it counts as a hang, seconds.
SECONDS_PER_RUN = 30

#: Warnings Python shows a user by default (the others are hidden outside __main__).
HIDDEN_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                   ResourceWarning)

@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the "@" files: config files, a trace, bad files, a foreign
    directory; "@missing.*" are never written."""
    root = tmp_path_factory.mktemp("fuzz_files")
    for name, (text, _) in CONFIG_FILES.items():
        (root / name).write_text(text)
    for name, text in OTHER_FILES.items():
        (root / name).write_text(text)
    (root / "dir").mkdir()
    (root / "dir" / "keep.txt").write_text("a folder servesim did not write\n")
    return root


# Running one command and judging its outcome.
def command(given: Mapping[str, str], files: Path) -> list[str]:
    """``run`` with ``given`` over the cheap base (1-20 requests into ./out)."""
    opts = {"num-requests": "5", "out": "out", **given}
    args = ["run"]
    for flag, v in opts.items():
        v = str(PROFILE) if v == "@profile" else str(files / v[1:]) if v[:1] == "@" else v
        args += [v] if flag in SWITCHES else [f"--{flag}", v]
    return args


def merged(given: Mapping[str, str]) -> dict[str, str]:
    """The options a run is asked for: the flags given, then its config file's."""
    opts = {"num-requests": "5", **given}
    name = given.get("config", "")[1:]
    for flag, v in CONFIG_FILES.get(name, ("", {}))[1].items():
        opts.setdefault(flag, v)
    return opts


def conflicts(opts: Mapping[str, str]) -> list[tuple[str, str]]:
    """The conflicting options asked for, as the two words the message must name."""
    out = []
    if opts.get("profile") == "@profile":
        if opts.get("model", "qwen2.5-0.5b").lower() != "qwen2.5-0.5b":
            out.append(("profile", "model"))
        if "step-time" in opts:
            out.append(("step-time", "profile"))
    if "concurrency" in opts and "rate" in opts:
        out.append(("concurrency", "rate"))
    if (opts.get("policy") == "static" and "compare" not in opts
            and "max-num-batched-tokens" in opts):
        out.append(("static", "max-num-batched-tokens"))
    return out


def names(line: str, words: tuple[str, str]) -> bool:
    """Whether ``line`` names both ``words`` (as a flag, or with _ for -)."""
    low = line.lower()
    return all(w in low or w.replace("-", "_") in low or w.replace("-", " ") in low
               for w in words)


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail the test after ``seconds`` (pytest's Failed is a BaseException: servesim's
    handlers of bad input let it pass)."""
    def expire(signum: int, frame: FrameType | None) -> None:
        pytest.fail(f"a hang: no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def fresh_directory() -> Iterator[None]:
    """Work in a new empty directory (relative --out paths and runs/latest land there)."""
    back = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="fuzz_run_") as d:
        os.chdir(d)
        try:
            yield
        finally:
            os.chdir(back)


def invoke(args: list[str]) -> tuple[Result, list[str]]:
    """Run ``servesim *args`` in-process; the result and the warnings a user would see."""
    with (warnings.catch_warnings(record=True) as caught, time_limit(SECONDS_PER_RUN),
          mock.patch.dict(os.environ)):
        os.environ.pop("VLLM_ALLOW_LONG_MAX_MODEL_LEN", None)  # the flag alone allows
        warnings.simplefilter("always")
        res = CliRunner().invoke(cli_main.app, args)
    shown = [f"{w.category.__name__}: {w.message}" for w in caught
             if not issubclass(w.category, HIDDEN_WARNINGS)]
    return res, shown


def assert_clean(res: Result, shown: list[str], line: str) -> None:
    """No traceback, no stray output on stderr, exit code 0, 1 or 2."""
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        assert res.exc_info is not None
        innermost = traceback.format_exception(*res.exc_info)[-3:]
        pytest.fail(f"traceback from {line}\n{''.join(innermost)}")
    assert "Traceback" not in res.output, f"a traceback printed by {line}\n{res.output}"
    assert res.exit_code in (0, 1, 2), f"exit {res.exit_code} from {line}\n{res.output}"
    assert not shown, f"Python warnings shown to the user by {line}: {shown}"
    if res.exit_code == 1:
        lines = [x for x in res.stderr.splitlines() if x.strip()]
        bad = [x for x in lines[:-1] if not x.startswith("warning:")]
        assert lines and lines[-1].startswith("error:") and not bad, (
            f"exit 1 without one error: line from {line}\nstderr: {res.stderr!r}")


def _check_usage_error(args: list[str], line: str) -> None:
    """The console script makes click's usage error one error: line and exit 1 (its
    SIGINT and SIGTERM handlers are the test process's again afterwards)."""
    out, err = io.StringIO(), io.StringIO()
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with (mock.patch.object(sys, "argv", ["servesim", *args]), redirect_stdout(out),
              redirect_stderr(err), pytest.raises(SystemExit) as stop):
            cli_main.main()
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)
    lines = err.getvalue().splitlines()
    assert stop.value.code == 1 and len(lines) == 1 and lines[0].startswith("error:"), (
        f"usage error of {line} through the servesim script: exit {stop.value.code}, "
        f"stderr {err.getvalue()!r}")


def check(given: Mapping[str, str], files: Path) -> Result:
    """Run ``given``; assert a clean outcome and no success vLLM would refuse or that
    passes a conflict over in silence. Returns the result."""
    args = command(given, files)
    line = "servesim " + shlex.join(args).replace(str(files), "FILES")
    with fresh_directory():
        res, shown = invoke(args)
        assert_clean(res, shown, line)
        if res.exit_code == 2:
            _check_usage_error(args, line)
        if res.exit_code == 0:
            _check_success(given, res, line)
    return res


def _check_success(given: Mapping[str, str], res: Result, line: str) -> None:
    """A run that succeeded: vLLM starts with what was asked and with what was
    simulated (every config.json written under the working directory), and each
    conflict was warned about."""
    opts = merged(given)
    refused = vllm_refusals(opts, PROFILE_MODEL if opts.get("profile") == "@profile" else None)
    assert not refused, f"exit 0 on a configuration vLLM refuses ({'; '.join(refused)}): {line}"
    for path in sorted(Path.cwd().rglob("config.json")):
        refused = recorded_refusals(json.loads(path.read_text()))
        assert not refused, (f"{path.parent.name}: simulated a configuration vLLM refuses "
                             f"({'; '.join(refused)}): {line}")
    warned = [x for x in res.stderr.splitlines() if x.startswith("warning:")]
    for pair in conflicts(opts):
        assert any(names(x, pair) for x in warned), (
            f"{pair[0]} with {pair[1]}: exit 0 with no warning naming both: {line}")


@FUZZ
@given(n=NUM_REQUESTS, given_=options(st.sampled_from(FLAGS).map(lambda f: [f])))
@example(n="50", given_={"max-num-batched-tokens": "1"})
@example(n="20", given_={"max-num-seqs": "8192"})
@example(n="5", given_={"compare": "static,continuous,chunked"})
@example(n="5", given_={"swap-space": "1e308"})
@example(n="5", given_={"num-gpu-blocks": "2"})
@example(n="5", given_={"config": "@vllm.yaml"})
def test_one_option(files: Path, n: str, given_: dict[str, str]) -> None:
    """One option, any value: a clean outcome, no success vLLM would refuse."""
    check({"num-requests": n, **given_}, files)


@FUZZ
@given(n=NUM_REQUESTS, given_=options(PAIRS))
@example(n="20", given_={"model": "llama-2-7b", "max-model-len": "100000"})
@example(n="5", given_={"preemption-mode": "swap", "swap-space": "1e308"})
@example(n="5", given_={"model": "llama-2-7b", "num-gpu-blocks": "256"})
@example(n="5", given_={"policy": "continuous", "max-num-batched-tokens": "2048"})
@example(n="5", given_={"kv-cache-memory": "1000000000000", "gpu": "h100-sxm"})
@example(n="5", given_={"model": "qwen2.5-0.5b", "tensor-parallel-size": "7"})
@example(n="5", given_={"max-tokens": BIG, "seed": "1"})
@example(n="5", given_={"think-time": "1e308", "concurrency": "2"})
@example(n="5", given_={"time-scale": "1e-320", "trace": "@trace.csv"})
def test_two_options(files: Path, n: str, given_: dict[str, str]) -> None:
    """Two options together, any values: as test_one_option."""
    check({"num-requests": n, **given_}, files)


#: The conflicting pairs the issue names, with valid values for each side.
CONFLICT_PAIRS = st.sampled_from([
    {"profile": st.just("@profile"), "model": st.sampled_from(("llama-3.1-8b", "llama-2-7b"))},
    {"profile": st.just("@profile"), "step-time": st.sampled_from(("0.01", "0.5"))},
    {"policy": st.just("static"), "max-num-batched-tokens": st.sampled_from(("2048", "8192"))},
    {"concurrency": st.sampled_from(("1", "4")), "rate": st.sampled_from(("0.5", "5"))},
]).flatmap(st.fixed_dictionaries)


@FUZZ
@given(n=NUM_REQUESTS, given_=CONFLICT_PAIRS)
def test_conflicting_pairs(files: Path, n: str, given_: dict[str, str]) -> None:
    """A conflict alone fails with one line naming both flags (or, where servesim
    documents a precedence, succeeds with a warning naming both: checked in check)."""
    res = check({"num-requests": n, **given_}, files)
    assert res.exit_code != 2
    if res.exit_code == 1:
        (pair,) = conflicts(merged(given_))
        assert names(res.stderr.splitlines()[-1], pair), (
            f"the error does not name {pair}: {res.stderr!r}")


#: The presets' context lengths and one past each.
CONTEXTS = ("4096", "4097", "32768", "32769", "131072", "131073")
ENGINE: dict[str, st.SearchStrategy[str]] = {
    "model": st.sampled_from(MODELS), "gpu": st.sampled_from(GPUS),
    "policy": st.sampled_from(POLICIES),
    "max-num-seqs": st.sampled_from(("256", "1024", "4096")) | st.integers(1, 2**14).map(str),
    "max-num-batched-tokens": st.integers(1, 2**18).map(str),
    "max-model-len": st.integers(1, 2**18).map(str) | st.sampled_from(CONTEXTS),
    "block-size": st.sampled_from(("8", "16", "32", "48", "128")),
    "tensor-parallel-size": st.sampled_from(("1", "2", "3", "4", "7", "8", "14", "16")),
    "gpu-memory-utilization": st.floats(0.001, 1.0).map(repr),
    "long-prefill-token-threshold": st.integers(0, 2**18).map(str),
    "allow-long-max-model-len": st.just("--allow-long-max-model-len"),
    "kv-cache-dtype": st.sampled_from(("auto", "fp8")),
}


@st.composite
def pool_edge(draw: st.DrawFn) -> dict[str, str]:
    """A KV pool of G blocks (given as blocks, or as bytes within a block of G blocks)
    and a max_model_len within a block of G - 1 blocks, the most one request may take
    beside vLLM's null block."""
    model, bs = draw(st.sampled_from(MODELS)), draw(st.sampled_from((16, 32)))
    g = draw(st.integers(2, 3000))
    mml = max(1, (g - 1) * bs + draw(st.integers(-bs, bs)))
    opts = {"model": model, "block-size": str(bs), "max-model-len": str(mml),
            "policy": draw(st.sampled_from(POLICIES)),
            "allow-long-max-model-len": "--allow-long-max-model-len"}
    if draw(st.booleans()):
        return {**opts, "num-gpu-blocks": str(g)}
    block = bs * Model.of(dataclasses.asdict(get_model(model))).kv_bytes_per_token(2, 1)
    return {**opts, "kv-cache-memory": str(g * block + draw(st.integers(-block, block)))}


@FUZZ
@given(n=NUM_REQUESTS, given_=st.fixed_dictionaries({}, optional=ENGINE) | pool_edge())
@example(n="5", given_={"max-model-len": "420640", "allow-long-max-model-len":
                        "--allow-long-max-model-len"})
@example(n="5", given_={"num-gpu-blocks": "257", "max-model-len": "4097"})
@example(n="5", given_={"block-size": "8", "max-num-seqs": "10000", "policy": "chunked"})
def test_engine_configurations(files: Path, n: str, given_: dict[str, str]) -> None:
    """Several engine options at once, valid values near vLLM's limits."""
    check({"num-requests": n, **given_}, files)
