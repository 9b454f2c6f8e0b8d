"""load_search.search_all: a plan's load searches probe several loads at once (the next
levels of each search's bisection tree) and take the path, and the answer, that the
one-probe-at-a-time search takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.app.runs.load_search import (
    SLO,
    Probe,
    ProbeTask,
    SearchTask,
    search,
    search_all,
    speculation_depth,
)
from sim.app.runs.runner import RunConfig

BOUNDARY = 7.3
"""The fake probes' feasible loads: those up to this (req/s)."""


def fake_runner(rounds: list[list[float]]) -> Any:
    """A runner whose probes are feasible up to BOUNDARY; records each round's loads."""
    def run(fn: Any, items: list[ProbeTask]) -> list[Probe]:
        rounds.append([t.load for t in items if t.load is not None])
        return [Probe(t.load or 0.0, 0, feasible=(t.load or 0.0) <= BOUNDARY,
                      throughput_rps=t.load or 0.0) for t in items]
    return run


TASK = SearchTask(0, RunConfig(step_time=0.01), 0, SLO(1.0, None), start=1.0, tolerance=0.02)

#: Doubling from 1 to the first infeasible load (8), then bisection until the bracket is
#: within 2% of its lower end: 7.25 feasible, 7.375 not, 0.125 <= 0.02 x 7.25 = 0.145.
PATH = [1.0, 2.0, 4.0, 8.0, 6.0, 7.0, 7.5, 7.25, 7.375]


def test_one_worker_probes_one_load_a_round() -> None:
    rounds: list[list[float]] = []
    res = search_all([TASK], fake_runner(rounds), parallelism=1)[0]
    assert [p.load for p in res.probes] == PATH and rounds == [[x] for x in PATH]
    assert (res.sustainable, res.upper) == (7.25, 7.375)


def test_many_workers_probe_a_tree_a_round_and_keep_the_path() -> None:
    rounds: list[list[float]] = []
    res = search_all([TASK], fake_runner(rounds), parallelism=8)[0]
    assert [p.load for p in res.probes] == PATH
    assert (res.sustainable, res.upper) == (7.25, 7.375)
    # Four levels a round (15 loads): 1, 2 or 0.5, 4 / 1 / 0.25 ..., in tree order.
    assert [len(r) for r in rounds] == [15, 15, 1]
    assert rounds[0][:4] == [1.0, 2.0, 4.0, 8.0]


def test_depth_fills_the_workers() -> None:
    assert speculation_depth(1, 1) == 1
    assert speculation_depth(2, 1) == 2  # 3 loads on 2 workers
    assert speculation_depth(3, 3) == 1
    assert speculation_depth(8, 1) == 4 and speculation_depth(1000, 1) == 4
    assert speculation_depth(14, 2) == 3


def test_real_probes_give_the_sequential_answer(tmp_path: Path) -> None:
    trace = tmp_path / "fixed.csv"
    trace.write_text("arrival_time,num_prompt_tokens,output_len\n"
                     + "".join(f"{i},64,{8 + i % 9}\n" for i in range(200)))
    cfg = RunConfig(trace=str(trace), num_requests=100, step_time=0.01, max_num_seqs=8)
    tasks = [SearchTask(0, cfg, seed, SLO(ttft_s=0.1, tpot_s=None), start=4.0,
                        tolerance=0.05) for seed in (0, 1)]
    one_by_one = [search(t) for t in tasks]
    at_once = search_all(tasks, lambda fn, items: [fn(x) for x in items], parallelism=6)
    assert at_once == one_by_one
    assert all(r.sustainable > 0 and r.upper is not None for r in at_once)
