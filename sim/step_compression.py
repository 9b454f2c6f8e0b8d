"""steps.csv's run-length compression: consecutive steps of one engine with one batch
composition share a row (``num_steps`` says how many), so a long steady decode is one
row; a step with a preemption keeps its own. Used by the run directory's writers
(sim/app/runs/run_files.py, sim/record_spool.py) and the Chrome trace."""

from __future__ import annotations

import numpy as np

from sim.table import Table, column

#: The columns whose change starts a new compressed row (a step's composition).
RLE_KEY = ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_waiting",
           "slots_useful", "slots_idle", "slots_empty")

#: The columns naming a step's engine in a cluster's or disaggregated run's step table
#: (where present): steps of different engines never share a compressed row.
ENGINE_KEY = ("pool", "replica")


def compress_steps(steps: Table, counts: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Run-length compress a step table (columns as in STEP_COLUMNS, and any others,
    such as a cluster's ``replica``): consecutive steps of one engine (ENGINE_KEY) with the
    same composition (RLE_KEY) and no preemption share one row (each engine's steps
    compressed on their own, the rows then ordered by their first step's start) with
    ``num_steps`` = how
    many, the first step's ``start_time`` (and other columns), the summed ``duration_s``
    and the largest ``kv_blocks_used``. A step with a preemption always keeps its own
    row. Returns a column table: the input's columns in their order, then ``num_steps``
    (int64). An uncompressed table is the same with ``num_steps`` = 1 everywhere.
    ``counts``: how many steps each input row already stands for (int64; default 1), so
    a compressed row carried over from an earlier chunk joins the next chunk's first
    group with the same sums a whole-table compression makes (sim/record_spool.py)."""
    cols = {c: column(steps, c) for c in steps}
    n = len(cols["start_time"])
    if n == 0:
        return {**cols, "num_steps": np.zeros(0, dtype=np.int64)}
    engines = [cols[c] for c in ENGINE_KEY if c in cols]
    if counts is None and engines and n > 1:
        # Each engine's steps compressed on their own (a cluster's interleave in time),
        # the rows then in order of their first step's start.
        code = np.unique(np.stack([np.asarray(e).astype(str) for e in engines]), axis=1,
                         return_inverse=True)[1].ravel()
        if code.max() > 0:
            by_engine = np.argsort(code, kind="stable")
            out, first = _compress({c: v[by_engine] for c, v in cols.items()}, None)
            # rows by their first step's start, ties in the table's own order
            order = np.lexsort((by_engine[first], out["start_time"]))
            return {c: v[order] for c, v in out.items()}
    return _compress(cols, counts)[0]


def _compress(cols: dict[str, np.ndarray],
              counts: np.ndarray | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """compress_steps of one table's rows in their order (a new row at every change of
    composition or engine, and around a preemption), and each row's first step's
    position in the table."""
    n = len(cols["start_time"])
    pre = cols["num_preempted"] > 0
    new = np.ones(n, dtype=bool)
    new[1:] = pre[1:] | pre[:-1]
    for c in (*RLE_KEY, *(e for e in ENGINE_KEY if e in cols)):
        k = cols[c]
        new[1:] |= k[1:] != k[:-1]
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    out = {c: v[first] for c, v in cols.items()}
    out["duration_s"] = np.bincount(group, weights=cols["duration_s"])
    out["kv_blocks_used"] = np.maximum.reduceat(cols["kv_blocks_used"], first)
    out["num_steps"] = (np.bincount(group) if counts is None
                        else np.bincount(group, weights=counts)).astype(np.int64)
    return out, first
