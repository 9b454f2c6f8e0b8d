"""``servesim run --compare``: one generated workload through several policy cells, one run
directory per cell, and a side-by-side table.

A cell is ``POLICY[:MODIFIER]...``; a modifier is a KV allocation (paged, reserve), a
preemption mode (recompute, swap), a queue order (fcfs, priority, sjf, oracle-srpt, lpm) or
a prefix cache (none, block, radix), and overrides that one setting of the base run.
Modifiers are read from the right, so a user policy keeps its own colon:
``my_pkg.mod:MyPolicy:reserve``. Cells are separated by commas: ``static,continuous,chunked``
or ``chunked:paged,chunked:reserve:swap`` or ``chunked:none,chunked:block,chunked:radix``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from policies.registry import POLICIES, get_policy_class
from sim.app.runs.out_dir import check_run_dir, commit_dirs, discard
from sim.app.runs.run_files import stage_run
from sim.app.runs.runner import Prepared, RunConfig, check_router, prefix_cache_mode
from sim.config import KV_ALLOCATIONS, PREEMPTION_MODES, PREFIX_CACHE_MODES, QUEUE_ORDERS
from sim.simulate import SimResult

#: Modifier value -> the RunConfig / SchedulerConfig field it sets.
MODIFIERS: dict[str, str] = {
    **{v: "kv_allocation" for v in KV_ALLOCATIONS},
    **{v: "preemption_mode" for v in PREEMPTION_MODES},
    **{v: "queue" for v in QUEUE_ORDERS},
    **{v: "prefix_cache" for v in PREFIX_CACHE_MODES},
}


@dataclass(frozen=True)
class Cell:
    """One column of a comparison: its label (as typed), the policy, and the settings it
    overrides (RunConfig field names)."""

    label: str
    policy: str
    overrides: dict[str, str]

    @property
    def dir_name(self) -> str:
        """The cell's run directory name: the label with ':' and '/' made safe."""
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.label).strip("-") or "cell"


def parse_cells(spec: str) -> list[Cell]:
    """Parse ``--compare``. Raises ValueError (one line) on an empty cell, a modifier given
    twice in one cell, an unknown policy, or two cells with the same run directory."""
    cells: list[Cell] = []
    for label in (part.strip() for part in spec.split(",")):
        if not label:
            raise ValueError(f"compare: empty cell in {spec!r}")
        parts = label.split(":")
        overrides: dict[str, str] = {}
        while len(parts) > 1 and parts[-1] in MODIFIERS:
            value = parts.pop()
            field = MODIFIERS[value]
            if field in overrides:
                raise ValueError(f"compare: cell {label!r} sets {field} twice")
            overrides[field] = value
        policy = ":".join(parts)
        if policy in MODIFIERS:
            raise ValueError(f"compare: cell {label!r} names no policy")
        if len(parts) > 1 and parts[0] in POLICIES:  # a built-in, then no modifier
            raise ValueError(f"compare: cell {label!r}: unknown modifier {parts[-1]!r}; "
                             f"modifiers: {', '.join(MODIFIERS)}")
        get_policy_class(policy)
        cells.append(Cell(label, policy, overrides))
    dirs = [c.dir_name for c in cells]
    for d in dirs:
        if dirs.count(d) > 1:
            raise ValueError(f"compare: two cells write the same run directory {d!r}")
    return cells


def cell_config(base: RunConfig, cell: Cell) -> RunConfig:
    """The cell's whole config: ``base`` with the cell's policy and overrides, validated
    (the router included); ValueError naming the cell for one that cannot run."""
    overrides: dict[str, Any] = dict(cell.overrides)
    try:
        cfg = dataclasses.replace(base, policy=cell.policy, **overrides)
        check_router(cfg)
    except ValueError as e:
        raise ValueError(f"compare: cell {cell.label!r}: {e}") from None
    return cfg


def cell_prepared(base: Prepared, cell: Cell) -> Prepared:
    """The base run with the cell's policy and overrides; the workload object is shared,
    so every cell simulates exactly the same requests."""
    cfg = cell_config(base.config, cell)
    overrides: dict[str, Any] = {**cell.overrides,
                                 "prefix_cache": prefix_cache_mode(cfg, base.workload)}
    sched = dataclasses.replace(base.scheduler, **overrides)
    return dataclasses.replace(base, config=cfg, scheduler=sched)


def run_compare(
    base: Prepared, cells: list[Cell], out: Path,
    simulate_fn: Callable[[Prepared], SimResult],
) -> list[tuple[Cell, dict[str, Any]]]:
    """Simulate every cell on the base workload, write ``out/<cell>/`` for each, and
    return (cell, summary) pairs in order. The cells' run directories are staged as
    they finish and swapped in together at the end, so a cell that fails leaves every
    previous run directory as it was; each is checked before the first simulation
    (sim/app/runs/out_dir.py: ValueError for one that is not a run directory)."""
    for cell in cells:
        check_run_dir(Path(out) / cell.dir_name)
    results, staged = [], []
    try:
        for cell in cells:
            prep = cell_prepared(base, cell)
            res = simulate_fn(prep)
            path = Path(out) / cell.dir_name
            staged.append((stage_run(path, prep, res), path))
            results.append((cell, res.summary))
    except BaseException:
        discard(staged)
        raise
    commit_dirs(staged)
    return results


def _pair(st: dict[str, float | None], scale: float, digits: int) -> str:
    """p50/p99 of ``st`` times ``scale``, with ``digits`` decimals, none from 1,000 on
    (so a saturated run's latencies in the thousands fit the column)."""
    vals = [None if st[k] is None else st[k] * scale for k in ("p50", "p99")]  # type: ignore[operator]
    if any(v is not None and abs(v) >= 1000 for v in vals):
        digits = 0
    return "/".join("-" if v is None else f"{v:,.{digits}f}" for v in vals)


def _hit_rate(summary: dict[str, Any]) -> str:
    hit = summary.get("prefix_cache", {}).get("hit_rate_tokens")
    return "-" if hit is None else f"{hit:.1%}"


def compare_table(results: list[tuple[Cell, dict[str, Any]]], title: str = "compare") -> Table:
    """One row per cell: throughput, TTFT / TPOT / E2E p50 and p99, slot fractions,
    preemptions (of which swaps) and rejections; narrow enough for 120 columns. A
    caption names the saturated cells (no column is widened for it)."""
    t = Table(title=title, header_style="bold")
    saturated = [c.label for c, s in results if s.get("saturated")]
    if saturated:
        t.caption = ("saturated (the queue grows over the arrival window; latency "
                     f"percentiles are not steady-state): {', '.join(saturated)}")
    cached = any(s.get("prefix_cache", {}).get("mode", "none") != "none" for _, s in results)
    for name in ("cell", "req/s", "out\ntok/s", "TTFT s\np50/p99", "TPOT ms\np50/p99",
                 "E2E s\np50/p99", "slots %\nuse/idle/empty", "preempt\n(swaps)", "reject",
                 *(("prefix\nhit %",) if cached else ())):
        if name == "cell":
            t.add_column(name, no_wrap=True,
                         min_width=max((len(c.label) for c, _ in results), default=4))
        else:
            t.add_column(name, justify="right")
    for cell, s in results:
        thr, sl = s["throughput"], s["slots"]
        t.add_row(
            cell.label, f"{thr['requests_per_s']:.2f}", f"{thr['output_tokens_per_s']:,.0f}",
            _pair(s["ttft_s"], 1, 1), _pair(s["tpot_s"], 1000, 0),
            _pair(s["e2e_latency_s"], 1, 1),
            "/".join(f"{sl[f'{k}_fraction']:.0%}".rstrip("%") for k in ("useful", "idle", "empty")),
            f"{s['num_preemptions']:,} ({s.get('num_swaps', 0):,})", f"{s['num_rejected']:,}",
            *((_hit_rate(s),) if cached else ()),
        )
    return t
