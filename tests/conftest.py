"""Shared test factories (vLLM-style): make_requests, run_sim, the shared/ path, the
fast_runs spy (and whether the engine runs compiled, where spies cannot work), the
hypothesis profiles of the property and differential tests, and a session folder for
the parsed-trace cache."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import settings

import sim.fastpath
from policies import get_policy_class
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel, CostModel
from sim.fastpath import FastPath, Run
from sim.request import Request
from sim.simulate import SimResult, simulate
from sim.source import RequestListArrivals

SHARED = Path(__file__).resolve().parents[1].parent / "shared"

#: Whether the engine core runs compiled (setup.py builds it with mypyc; the suite runs
#: so in tests/test_compiled.py): a compiled class's methods cannot be replaced.
ENGINE_COMPILED = not sim.fastpath.__file__.endswith(".py")


def skip_spies_when_compiled(what: str) -> None:
    """Skip a test that spies on ``what`` (a method it replaces) when the engine runs
    compiled, where the replacement would never be called."""
    if ENGINE_COMPILED:
        pytest.skip(f"spies on {what}, a method of a compiled class (setup.py), which "
                    "cannot be replaced; the source run of the suite checks it")


@pytest.fixture(autouse=True, scope="session")
def _trace_cache_in_a_temporary_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Parsed-trace cache entries (scenarios/traces/column_cache.py) go to a folder of this
    session, never the user's ~/.cache; the CLI's child processes inherit it."""
    folder = tmp_path_factory.mktemp("servesim-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVESIM_CACHE_DIR", str(folder))
        mp.delenv("SERVESIM_TRACE_CACHE", raising=False)
        yield

# Examples per hypothesis test: a few on a local run (the example database replays any
# failure found before), many in CI (.ci/run sets HYPOTHESIS_PROFILE=ci). The tests'
# own @settings leave max_examples to the profile.
settings.register_profile("dev", max_examples=30)
settings.register_profile("ci", max_examples=500, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "dev")


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test with a clear reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not found: the shared/ folder (public traces) is not beside the repo")
    return p


@pytest.fixture
def fast_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The steps of every fast-path run the engine applies during the test, in order
    (spied on FastPath.apply); empty when every step ran one by one."""
    skip_spies_when_compiled("FastPath.apply")
    runs: list[int] = []
    apply = FastPath.apply

    def spy(self: FastPath, run: Run) -> list[Request]:
        runs.append(len(run.times) - 1)
        return apply(self, run)

    monkeypatch.setattr(FastPath, "apply", spy)
    return runs


def make_requests(
    output_lens: Sequence[int], prompt: int | Sequence[int] = 4,
    arrivals: float | Sequence[float] = 0.0, max_tokens: Sequence[int] | None = None,
    priorities: Sequence[int] | None = None,
) -> list[Request]:
    n = len(output_lens)
    prompts = [prompt] * n if isinstance(prompt, int) else list(prompt)
    times = [float(arrivals)] * n if isinstance(arrivals, (int, float)) else list(arrivals)
    caps = list(max_tokens) if max_tokens is not None else list(output_lens)
    prios = list(priorities) if priorities is not None else [0] * n
    return [
        # Python numbers: the compiled engine's Request refuses numpy scalars.
        Request(str(i), float(times[i]), int(prompts[i]), int(output_lens[i]), int(caps[i]),
                int(prios[i]), i)
        for i in range(n)
    ]


def run_sim(
    requests: list[Request], policy: str = "chunked", *, step_time: float = 1.0,
    cost_model: CostModel | None = None, num_gpu_blocks: int = 100_001,
    block_size: int = 16, **config: object,
) -> SimResult:
    cfg = SchedulerConfig(**config)  # type: ignore[arg-type]
    return simulate(
        RequestListArrivals(requests), policy_factory=get_policy_class(policy), config=cfg,
        cost_model=cost_model or ConstantCostModel(step_time),
        num_gpu_blocks=num_gpu_blocks, block_size=block_size,
    )


def cache_op(kv: object, r: Request, extra: int, free: bool, block_size: int) -> None:
    """One random operation on a prefix-caching pool (hypothesis tests of both caches):
    release ``r`` when ``free`` or when it is complete, admit it through the cache when it
    holds nothing (its hit plus up to ``extra`` tokens), else grow it by up to ``extra``
    tokens. ``kv`` is a sim.kv.prefix_cache.PrefixCachingKV."""
    if r.block_ids and (free or r.num_computed_tokens >= r.num_tokens):
        kv.free(r)  # type: ignore[attr-defined]
        r.num_computed_tokens = 0
    elif not r.block_ids:
        hit = kv.get_computed_blocks(r)  # type: ignore[attr-defined]
        n = min(r.num_tokens - hit.num_computed_tokens, extra)
        if kv.allocate_slots(r, n, hit) is not None:  # type: ignore[attr-defined]
            r.num_computed_tokens += n
    elif kv.allocate_slots(r, min(extra, r.num_tokens - r.num_computed_tokens)):  # type: ignore[attr-defined]
        r.num_computed_tokens = min(r.num_tokens, r.num_computed_tokens + extra)
