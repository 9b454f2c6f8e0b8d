"""``servesim run --compare``: one generated workload through several policy cells, one run
directory per cell, and a side-by-side table.

A cell is ``POLICY[:MODIFIER]...``; a modifier is a KV allocation (paged, reserve), a
preemption mode (recompute, swap), a queue order (fcfs, priority, sjf, oracle-srpt, lpm) or
a prefix cache (none, block, radix), and overrides that one setting of the base run.
Modifiers are read from the right, so a user policy keeps its own colon:
``my_pkg.mod:MyPolicy:reserve``. Cells are separated by commas: ``static,continuous,chunked``
or ``chunked:paged,chunked:reserve:swap`` or ``chunked:none,chunked:block,chunked:radix``.

Each cell is its own engine, as a vLLM launch of its own would be: the batch limits the
user left unset are vLLM's defaults for the cell's policy (a continuous cell's budget is
at least max_model_len), which size its own KV cache, on the workload every cell shares.
A static cell takes no token budget: a budget given applies to the other cells
(budget_note says so). Every cell is checked, vLLM's start-up checks included, before
any runs.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table

from policies.registry import POLICIES, get_policy_class
from scenarios.workload import Workload
from sim.app.runs.defaults import UNBUDGETED_POLICIES
from sim.app.runs.out_dir import (
    check_run_dir,
    commit_dirs,
    discard,
    is_run_dir,
    written_by_servesim,
)
from sim.app.runs.run_config import with_policy
from sim.app.runs.run_files import stage_run
from sim.app.runs.runner import Prepared, RunConfig, check_config, check_router, prepare_on
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


def base_options(opts: dict[str, Any], cells: list[Cell]) -> dict[str, Any]:
    """run's options for the base config of a compare, whose cells set the policies: a
    --policy without a token budget (static) given with one gives way to the first cell
    that takes it, which the base then prepares; the budget is the cells' (a static cell
    runs without it: budget_note). Unchanged when no cell takes a budget."""
    if opts.get("policy") not in UNBUDGETED_POLICIES or opts.get(
            "max_num_batched_tokens") is None:
        return opts
    budgeted = [c.policy for c in cells if c.policy not in UNBUDGETED_POLICIES]
    return {**opts, "policy": budgeted[0]} if budgeted else opts


def cell_config(base: RunConfig, cell: Cell) -> RunConfig:
    """The cell's whole config: ``base`` as given (limits left unset stay unset, for the
    cell's own defaults) with the cell's policy and overrides, less a token budget for a
    static cell; ValueError naming the cell for one whose router cannot run."""
    try:
        cfg = with_policy(base, cell.policy, **cell.overrides)
        check_router(cfg)
    except ValueError as e:
        raise ValueError(f"compare: cell {cell.label!r}: {e}") from None
    return cfg


def check_cell(base: RunConfig, cell: Cell) -> None:
    """Raise what preparing the cell would (vLLM's start-up checks for its own limits
    and pool, the router), as ValueError naming the cell; nothing is simulated."""
    cfg = cell_config(base, cell)
    try:
        check_config(cfg, workload=False)
    except ValueError as e:
        raise ValueError(f"compare: cell {cell.label!r}: {e}") from None


def budget_note(base: RunConfig, cells: list[Cell]) -> str | None:
    """One line when a token budget is given and some cell is static, which has none:
    the budget applies to the other cells only. None otherwise."""
    static = [c.label for c in cells if c.policy in UNBUDGETED_POLICIES]
    if base.max_num_batched_tokens is None or not static:
        return None
    return (f"--max-num-batched-tokens {base.max_num_batched_tokens} applies to the "
            f"other cells: static batching has no token budget ({', '.join(static)} run "
            "without one)")


def cell_prepared(base: RunConfig, workload: Workload, cell: Cell) -> Prepared:
    """The cell's run: its own engine (prepare_on) on ``workload``, the object every cell
    shares, so every cell simulates exactly the same requests."""
    try:
        return prepare_on(cell_config(base, cell), workload)
    except ValueError as e:
        raise ValueError(f"compare: cell {cell.label!r}: {e}") from None


def run_compare(
    base: RunConfig, workload: Workload, cells: list[Cell], out: Path,
    simulate_fn: Callable[[Prepared], SimResult],
) -> list[tuple[Cell, dict[str, Any]]]:
    """Simulate every cell of ``base`` (the config as given) on ``workload``, write
    ``out/<cell>/`` for each, and return (cell, summary) pairs in order. Every cell is
    prepared (and so checked) before the first simulation; the cells' run directories
    are staged as they finish and swapped in together at the end, so a cell that fails
    leaves every previous run directory as it was; each is checked before the first
    simulation (sim/app/runs/out_dir.py: ValueError for one that is not a run
    directory). Run directories and the report an earlier compare left in ``out`` are
    removed once the cells are in (stale_entries), so ``out`` never mixes two workloads'
    cells."""
    for cell in cells:
        check_run_dir(Path(out) / cell.dir_name)
    stale = stale_entries(Path(out), cells)
    preps = [cell_prepared(base, workload, cell) for cell in cells]
    results, staged = [], []
    try:
        for cell, prep in zip(cells, preps, strict=True):
            res = simulate_fn(prep)
            path = Path(out) / cell.dir_name
            staged.append((stage_run(path, prep, res), path))
            results.append((cell, res.summary))
    except BaseException:
        discard(staged)
        raise
    commit_dirs(staged)
    for path in stale:  # what an earlier compare left: the directory holds this one only
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return results


def stale_entries(out: Path, cells: list[Cell]) -> list[Path]:
    """What ``out`` holds besides ``cells``' run directories, which the compare removes
    once its cells are in place so that the directory shows one workload's cells only:
    run directories and the report of an earlier compare. Raises ValueError naming --out
    when it holds anything else (servesim never removes what it did not write); hidden
    entries (staging, sim/staging.py) are left to their own clean-up."""
    if not out.is_dir():
        return []
    keep = {c.dir_name for c in cells}
    stale = []
    for entry in sorted(out.iterdir()):
        if entry.name in keep or entry.name.startswith("."):
            continue
        servesims = (is_run_dir(entry) if entry.is_dir() and not entry.is_symlink()
                     else entry.name == "report.html" and written_by_servesim(entry) is True)
        if not servesims:
            raise ValueError(f"--out: {out} holds {entry.name}, which is not a servesim run "
                             "directory or report; --compare writes a directory of its cells "
                             "only: give another --out")
        stale.append(entry)
    return stale


def sig3(value: float) -> str:
    """``value`` with three significant figures (0.0123, 1.23, 12.3, 123), whole and with
    thousands separated from 1,000 on (1,275), so a saturated run's latencies fit."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) >= 999.5:
        return f"{value:,.0f}"
    rounded = float(f"{value:.3g}")  # 9.996 -> 10.0: the digits count from the rounded value
    return f"{rounded:.{max(0, 2 - math.floor(math.log10(abs(rounded))))}f}"


def _pair(st: dict[str, float | None], scale: float, sep: str = "/") -> str:
    """p50 and p99 of ``st`` times ``scale`` (sig3; "-" for none), joined by ``sep``."""
    return sep.join("-" if st[k] is None else sig3(st[k] * scale)  # type: ignore[operator]
                    for k in ("p50", "p99"))


def _hit_rate(summary: dict[str, Any]) -> str:
    hit = summary.get("prefix_cache", {}).get("hit_rate_tokens")
    return "-" if hit is None else f"{hit:.1%}"


@dataclass(frozen=True)
class Layout:
    """How the compare table is fitted to a width: cell names broken after each ':',
    p50/p99 pairs over two lines (p50/ above p99), and a compact frame (no column
    rules, no padding: one space between columns)."""

    break_names: bool
    break_pairs: bool
    compact: bool


#: From widest to narrowest; the table takes the first that fits its width.
LAYOUTS = (Layout(False, False, False), Layout(True, False, False),
           Layout(True, True, False), Layout(True, True, True))


@dataclass(frozen=True)
class CompareTable:
    """The compare table, a rich renderable laid out for the width it is printed at:
    the first of LAYOUTS whose table fits (the last when none does), so a long cell name
    wraps at its ':' rather than squeeze the number columns, and no number is cut."""

    results: list[tuple[Cell, dict[str, Any]]]
    title: str

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for layout in LAYOUTS:
            table = build_table(self.results, self.title, layout)
            natural = Measurement.get(console, options.update_width(10_000), table).maximum
            if natural <= options.max_width:
                break
        yield table


def compare_table(results: list[tuple[Cell, dict[str, Any]]],
                  title: str = "compare") -> CompareTable:
    """One row per cell: throughput, TTFT / TPOT / E2E p50 and p99 (three significant
    figures), slot fractions, preemptions (of which swaps) and rejections, fitted to the
    width it is printed at (CompareTable). A caption names the saturated cells."""
    return CompareTable(results, title)


def build_table(results: list[tuple[Cell, dict[str, Any]]], title: str,
                layout: Layout) -> Table:
    """The compare table in ``layout``; no column is widened for the caption. Every
    column folds (never cuts) a value when even the narrowest layout does not fit."""
    frame: dict[str, Any] = (
        {"box": box.SIMPLE_HEAD, "show_edge": False, "padding": (0, 0)} if layout.compact
        else {})
    t = Table(title=title, header_style="bold", **frame)
    saturated = [c.label for c, s in results if s.get("saturated")]
    if saturated:
        t.caption = ("saturated (a backlog built up during the run; latency "
                     f"percentiles are not steady-state): {', '.join(saturated)}")
    cached = any(s.get("prefix_cache", {}).get("mode", "none") != "none" for _, s in results)
    slots = "slots %\nuse/idle/\nempty" if layout.break_pairs else "slots %\nuse/idle/empty"
    for name in ("cell", "req/s", "out\ntok/s", "TTFT s\np50/p99", "TPOT ms\np50/p99",
                 "E2E s\np50/p99", slots, "preempt\n(swaps)", "reject",
                 *(("prefix\nhit %",) if cached else ())):
        t.add_column(name, justify="left" if name == "cell" else "right", overflow="fold")
    sep = "/\n" if layout.break_pairs else "/"
    for cell, s in results:
        thr, sl = s["throughput"], s["slots"]
        t.add_row(
            cell.label.replace(":", ":\n") if layout.break_names else cell.label,
            f"{thr['requests_per_s']:.2f}", f"{thr['output_tokens_per_s']:,.0f}",
            _pair(s["ttft_s"], 1, sep), _pair(s["tpot_s"], 1000, sep),
            _pair(s["e2e_latency_s"], 1, sep),
            "/".join(f"{sl[f'{k}_fraction']:.0%}".rstrip("%") for k in ("useful", "idle", "empty")),
            f"{s['num_preemptions']:,} ({s.get('num_swaps', 0):,})", f"{s['num_rejected']:,}",
            *((_hit_rate(s),) if cached else ()),
        )
    return t
