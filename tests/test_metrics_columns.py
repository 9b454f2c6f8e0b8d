"""Column tables on the run path (sim/table.py, metrics.Recorder's columns,
compress_steps): rows in workload order, step compression on a hand-built table, CSV bytes
equal to what ``DataFrame.to_csv(index=False)`` writes (the format the run files promise),
lazy DataFrames, and no pandas import on ``servesim run``."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim.table
from policies.chunked import ChunkedPolicy
from policies.routers import LeastOutstandingRouter
from sim.cluster import simulate_cluster
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.metrics import REQUEST_COLUMNS, Recorder, StepRow
from sim.request import Request, RequestStatus
from sim.source import RequestListArrivals
from sim.step_compression import compress_steps
from sim.table import ColumnBuffer, to_frame, write_csv
from tests.conftest import make_requests, run_sim


def recorder_with_every_kind_of_request() -> Recorder:
    """Finished (one- and many-token), rejected and preempted requests, recorded out of
    workload order, and 33 steps (30 one by one, then a decode run of 3)."""
    rec = Recorder()
    rng = np.random.default_rng(3)
    for i in rng.permutation(40).tolist():
        r = Request(f"req,{i}" if i == 5 else str(i), float(rng.random() * 10), 10 + i,
                    1 + i % 4, 1 + i % 4, index=i)
        if i % 7 == 3:
            r.status, r.reason = RequestStatus.REJECTED, f"too long ({i} tokens)"
        else:
            r.status, r.finish_reason = RequestStatus.FINISHED, "stop" if i % 2 else "length"
            r.first_scheduled_time = r.arrival_time + float(rng.random())
            r.first_token_time = r.first_scheduled_time + float(rng.random())
            r.num_output_tokens = 1 + i % 4
            r.finish_time = r.first_token_time + 0.1 * i
            r.num_preemptions = i % 3
            r.num_swaps = i % 2 * (i % 3)
        rec.record_request(r)
    for j in range(30):
        rec.record_step(StepRow(0.5 * j, 0.5, 2 + j % 3, 16 * (j % 2), 2, 40 + j, j % 4, 2,
                                j % 2, 1, int(j == 7)))
    rec.record_decode_run([15.0, 15.5, 16.0, 16.5], [0.5, 0.5, 0.5], 3, [70, 71, 72], 0, 1, 4)
    return rec


def test_request_rows_in_workload_order_and_typed_step_columns() -> None:
    rec = recorder_with_every_kind_of_request()
    cols = rec.request_columns()
    assert list(cols) == list(REQUEST_COLUMNS)
    assert list(cols["request_id"]) == [f"req,{i}" if i == 5 else str(i) for i in range(40)]
    rejected = [i for i in range(40) if i % 7 == 3]
    assert np.flatnonzero(cols["status"] == RequestStatus.REJECTED.value).tolist() == rejected
    assert cols["reason"][10] == "too long (10 tokens)" and cols["reason"][11] is None
    assert cols["num_output_tokens"][:5].tolist() == [1, 2, 3, 0, 1]  # 3 was rejected
    steps = rec.step_columns()
    assert len(steps["start_time"]) == rec.num_steps == 33
    assert steps["start_time"].dtype == np.float64 and steps["num_seqs"].dtype == np.int64
    assert steps["kv_blocks_used"].tolist()[-3:] == [70, 71, 72]
    assert steps["num_seqs"].tolist()[-4:] == [2 + 29 % 3, 3, 3, 3]


def test_compress_steps_by_hand() -> None:
    # Steps 0-2 share a composition; 3 changes it; 4 preempts (its own row) and so starts
    # a new row after it too; 5 and 6 share one again.
    steps = {
        "start_time": np.arange(7, dtype=np.float64),
        "duration_s": np.array([0.5, 0.25, 0.125, 1.0, 2.0, 4.0, 8.0]),
        "num_seqs": np.array([2, 2, 2, 3, 3, 3, 3]),
        "kv_blocks_used": np.array([5, 7, 6, 8, 9, 9, 10]),
        "num_preempted": np.array([0, 0, 0, 0, 1, 0, 0]),
        "tag": np.array([0, 1, 2, 3, 4, 5, 6]),  # another column: the row's first step's
    }
    for c in ("num_prefill_tokens", "num_decode_tokens", "num_waiting", "slots_useful",
              "slots_idle", "slots_empty"):
        steps[c] = np.ones(7, dtype=np.int64)
    out = compress_steps(steps)
    assert list(out) == [*steps, "num_steps"]
    assert out["num_steps"].tolist() == [3, 1, 1, 2]
    assert out["start_time"].tolist() == [0.0, 3.0, 4.0, 5.0]
    assert out["duration_s"].tolist() == [0.875, 1.0, 2.0, 12.0]
    assert out["kv_blocks_used"].tolist() == [7, 8, 9, 10]
    assert out["tag"].tolist() == [0, 3, 4, 5]
    empty = compress_steps({c: v[:0] for c, v in steps.items()})
    assert list(empty) == [*steps, "num_steps"] and len(empty["num_steps"]) == 0


def test_compress_steps_never_merges_two_engines_steps() -> None:
    # A cluster's steps interleave in time: replica 0, 1, 0, 1, then 1, 1. All six have one
    # composition, so only the engine columns split them; with a pool column, (decode, 1)
    # and (prefill, 1) differ too.
    steps = {"start_time": np.arange(6, dtype=np.float64),
             "duration_s": np.ones(6), "kv_blocks_used": np.ones(6, dtype=np.int64),
             "num_preempted": np.zeros(6, dtype=np.int64),
             "replica": np.array([0, 1, 0, 1, 1, 1])}
    for c in ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_waiting",
              "slots_useful", "slots_idle", "slots_empty"):
        steps[c] = np.ones(6, dtype=np.int64)
    out = compress_steps(steps)
    # each engine's steps on their own: replica 0's two (t 0, 2), replica 1's four
    assert out["replica"].tolist() == [0, 1] and out["num_steps"].tolist() == [2, 4]
    assert out["start_time"].tolist() == [0.0, 1.0]
    assert out["duration_s"].tolist() == [2.0, 4.0]
    steps["pool"] = np.array(["decode"] * 5 + ["prefill"], dtype=object)
    out = compress_steps(steps)
    # (decode, 0) at 0 and 2; (decode, 1) at 1, 3, 4; (prefill, 1) at 5
    assert out["num_steps"].tolist() == [2, 3, 1]
    assert out["pool"].tolist() == ["decode", "decode", "prefill"]
    assert out["start_time"].tolist() == [0.0, 1.0, 5.0]


TRICKY = {
    "f": np.array([0.1, -0.0, 1e16, 1e-05, 123.0, np.nan, np.inf, 5e-324, 2.5]),
    "i": np.array([0, -1, 2**40, 3, 4, 5, 6, 7, 8], dtype=np.int64),
    "s": np.array(["a", "b,c", 'say "hi"', "two\nlines", "cr\r", "", None, np.nan, "é"],
                  dtype=object),
    "none": np.array([None] * 9, dtype=object),
    "b": np.array([True, False] * 4 + [True]),
    "f32": np.array([0.1, 1.5, np.nan, 3, 4, 5, 6, 7, 8], dtype=np.float32),
}


@pytest.mark.parametrize("names", [list(TRICKY), ["s"], ["f", "i"], ["none"]])
def test_write_csv_bytes_equal_pandas_to_csv(tmp_path: Path, names: list[str]) -> None:
    table = {n: TRICKY[n] for n in names}
    write_csv(tmp_path / "a.csv", table)
    pd.DataFrame(table).to_csv(tmp_path / "b.csv", index=False)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    write_csv(tmp_path / "c.csv", {n: v[:0] for n, v in table.items()})
    pd.DataFrame({n: v[:0] for n, v in table.items()}).to_csv(tmp_path / "d.csv", index=False)
    assert (tmp_path / "c.csv").read_bytes() == (tmp_path / "d.csv").read_bytes()


def test_adjacent_number_columns_written_as_one_block_equal_pandas_to_csv(
        tmp_path: Path) -> None:
    # Runs of adjacent int columns of one dtype, and of float64 columns orjson writes as
    # repr does (NaN included), are formatted together; a float column holding an
    # exponent or an infinity, or an int column of another dtype, breaks the run.
    rng = np.random.default_rng(3)
    n = 5000
    clock = np.cumsum(rng.exponential(0.2, n))
    dur = 1e-3 + rng.exponential(0.03, n)
    dur[::7] = np.nan
    dur[1] = -0.0
    dur[2], dur[3] = 1e-4, 9.999999999999998e15
    odd = clock.copy()
    odd[5], odd[6] = 2.5e-07, np.inf
    table = {"clock": clock, "dur": dur, "clock2": clock * 3, "odd": odd, "after": dur,
             "a": rng.integers(-2**63, 2**63 - 1, n), "b": rng.integers(0, 9, n),
             "u": rng.integers(2**63, 2**64 - 1, n, dtype=np.uint64),
             "u2": rng.integers(0, 2**64 - 1, n, dtype=np.uint64),
             "s": np.array(["x", None] * (n // 2), dtype=object), "c": np.arange(n),
             "last": dur}
    write_csv(tmp_path / "a.csv", table)
    pd.DataFrame(table).to_csv(tmp_path / "b.csv", index=False)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert sim.table._block_kind(dur) == "f" and sim.table._block_kind(odd) is None


def test_numbers_are_written_as_repr_and_str_on_every_exponent_and_both_edges() -> None:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**64, 400_000, dtype=np.uint64).view(np.float64)  # every exponent
    times = np.cumsum(rng.exponential(0.2, 200_000))  # a run's clock, s
    edges = np.array([1e-4, 1e16, 0.0, -0.0, -1e-4, -1e16, 9.999999999999999e15,
                      2.0**53, 1.7976931348623157e308, -5e-324])
    with np.errstate(over="ignore"):  # the largest float's next is inf: a case too
        around = [np.nextafter(edges, np.inf), np.nextafter(edges, -np.inf)]
    values = np.concatenate([bits, times, rng.exponential(0.03, 200_000), edges, *around])
    assert sim.table.float64_texts(values) == list(map(repr, values.tolist()))
    assert sim.table.float64_texts(values[::3]) == list(map(repr, values[::3].tolist()))
    assert sim.table.float64_texts(np.zeros(0)) == []
    ints = [rng.integers(-2**63, 2**63 - 1, 50_000), np.array([0, -1, 2**63 - 1, -2**63]),
            rng.integers(0, 2**64 - 1, 1000, dtype=np.uint64), rng.integers(0, 500, 5000)]
    for column in ints:
        assert sim.table.csv_fields(column) == list(map(str, column.tolist()))


def test_write_csv_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim.table, "CHUNK_ROWS", 4)
    rec = recorder_with_every_kind_of_request()
    write_csv(tmp_path / "a.csv", rec.request_columns())
    to_frame(rec.request_columns()).to_csv(tmp_path / "b.csv", index=False)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    with pytest.raises(ValueError, match="differ in length"):
        write_csv(tmp_path / "x.csv", {"a": np.zeros(2), "b": np.zeros(3)})


def test_sim_result_frames_are_lazy_and_cached() -> None:
    res = run_sim(make_requests([3, 1, 5], prompt=[8, 4, 20]), max_num_seqs=2)
    assert not res._frames
    df = res.requests
    assert res.requests is df and list(df["request_id"]) == ["0", "1", "2"]
    pd.testing.assert_frame_equal(res.steps, to_frame(res.step_table))


def test_cluster_tables_in_workload_and_start_time_order() -> None:
    reqs = make_requests([(7 * i) % 23 + 1 for i in range(30)],
                         prompt=[(13 * i) % 50 + 4 for i in range(30)],
                         arrivals=[i * 0.7 for i in range(30)])
    res = simulate_cluster(
        RequestListArrivals(reqs), num_replicas=3, router=LeastOutstandingRouter(),
        policy_factory=ChunkedPolicy, config=SchedulerConfig(max_num_seqs=4),
        cost_model=ConstantCostModel(1.0), num_gpu_blocks=1000)
    assert list(res.requests["request_id"]) == [str(i) for i in range(30)]
    steps = res.steps
    expect = steps.sort_values(["start_time", "replica"], kind="stable")
    assert (expect.index == np.arange(len(steps))).all()
    assert set(steps["replica"]) == {0, 1, 2} == set(res.requests["replica"])


def test_servesim_run_does_not_import_pandas(tmp_path: Path) -> None:
    code = ("import sys\nfrom sim.app.cli.main import app\n"
            "sys.argv = ['servesim', 'run', '--rate', '20', '--num-requests', '200', "
            f"'--replicas', '2', '--out', {str(tmp_path / 'run')!r}]\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('PANDAS', 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "PANDAS False" in out
    assert (tmp_path / "run" / "steps.csv").exists()


def test_compressed_rows_that_start_together_keep_the_tables_order() -> None:
    # Replicas 2 and 10 step at 0 and at 1, 2 first each time: rows 2 then 10 (not the
    # order of their names as strings, "10" < "2").
    steps = {"start_time": np.array([0.0, 0.0, 1.0, 1.0]), "duration_s": np.ones(4),
             "kv_blocks_used": np.ones(4, dtype=np.int64),
             "num_preempted": np.zeros(4, dtype=np.int64),
             "replica": np.array([2, 10, 2, 10])}
    for c in ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_waiting",
              "slots_useful", "slots_idle", "slots_empty"):
        steps[c] = np.ones(4, dtype=np.int64)
    out = compress_steps(steps)
    assert out["replica"].tolist() == [2, 10] and out["num_steps"].tolist() == [2, 2]


def test_column_buffer_keeps_every_value_across_settles() -> None:
    col = ColumnBuffer(np.float64)
    col.pending.extend([0.1, 2, 1e-300])  # an int among floats is taken as a float
    col.settle()
    col.settle()  # nothing pending: no empty chunk
    col.pending.append(float("nan"))
    assert len(col) == 4
    values = col.values()
    assert values.dtype == np.float64 and values.flags.writeable
    assert values[:3].tolist() == [0.1, 2.0, 1e-300] and np.isnan(values[3])
    values[0] = 5.0  # a new array: the buffer's own chunks are untouched
    assert col.values()[0] == 0.1
    ints = ColumnBuffer(np.int64)
    ints.pending.extend([2**63 - 1, -2**63, True])
    assert ints.values().tolist() == [2**63 - 1, -2**63, 1]
    assert ints.values().dtype == np.int64
    ints.clear()
    assert len(ints) == 0 and ints.values().dtype == np.int64 and not len(ints.values())
    ints.pending.append(1.5)
    with pytest.raises(struct.error):
        ints.settle()
