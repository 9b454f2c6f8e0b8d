"""Column tables on the run path (sim/table.py, metrics.Recorder's columns): the same
frames, summaries, compressed steps and CSV bytes as the pandas code they replace, and no
pandas import on ``servesim run``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim.table
from policies.chunked import ChunkedPolicy
from sim.cluster import simulate_cluster
from sim.config import SchedulerConfig
from sim.cost_model import ConstantCostModel
from sim.metrics import REQUEST_COLUMNS, RLE_KEY, Recorder, compress_steps, summarize
from sim.request import Request, RequestStatus
from sim.source import RequestListArrivals
from sim.table import to_frame, write_csv
from tests.conftest import make_requests, run_sim

RAW = ("request_id", "arrival_time", "first_scheduled_time", "first_token_time",
       "finish_time", "num_prompt_tokens", "num_output_tokens", "num_preemptions", "status",
       "finish_reason", "reason", "num_swaps")


def reference_requests_frame(rec: Recorder) -> pd.DataFrame:
    """The pandas construction the Recorder used before column tables (the reference)."""
    df = pd.DataFrame.from_records(rec._req_rows, columns=list(RAW))
    df.insert(0, "_index", np.frombuffer(rec._req_index, dtype=np.int64))
    df = df.sort_values("_index", kind="stable").drop(columns="_index")
    df = df.reset_index(drop=True)
    for c in ("first_scheduled_time", "first_token_time", "finish_time"):
        df[c] = df[c].astype("float64")
    done = df["status"] == RequestStatus.FINISHED.value
    df["ttft_s"] = np.where(done, df["first_token_time"] - df["arrival_time"], np.nan)
    n_out = df["num_output_tokens"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = (df["finish_time"] - df["first_token_time"]) / (n_out - 1)
    df["tpot_s"] = np.where(done & (n_out > 1), tpot, np.nan)
    df["e2e_latency_s"] = np.where(done, df["finish_time"] - df["arrival_time"], np.nan)
    df["queued_time_s"] = df["first_scheduled_time"] - df["arrival_time"]
    return df[list(REQUEST_COLUMNS)]


def reference_compress(steps: pd.DataFrame) -> pd.DataFrame:
    """compress_steps as it was on DataFrames (the reference)."""
    key = steps[list(RLE_KEY)].to_numpy()
    pre = steps["num_preempted"].to_numpy() > 0
    new = np.ones(len(steps), dtype=bool)
    new[1:] = (key[1:] != key[:-1]).any(axis=1) | pre[1:] | pre[:-1]
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    out = steps.iloc[first].reset_index(drop=True)
    out["duration_s"] = np.bincount(group, weights=steps["duration_s"].to_numpy())
    out["kv_blocks_used"] = np.maximum.reduceat(steps["kv_blocks_used"].to_numpy(), first)
    out["num_steps"] = np.bincount(group).astype(np.int64)
    return out


def recorder_with_every_kind_of_request() -> Recorder:
    """Finished (one- and many-token), rejected and preempted requests, recorded out of
    workload order, and a few steps."""
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
        rec.record_step(0.5 * j, 0.5, 2 + j % 3, 16 * (j % 2), 2, 40 + j, j % 4, 2, j % 2,
                        1, int(j == 7))
    rec.record_decode_run([15.0, 15.5, 16.0, 16.5], [0.5, 0.5, 0.5], 3, [70, 71, 72], 0, 1, 4)
    return rec


def test_request_and_step_columns_equal_the_pandas_frames() -> None:
    rec = recorder_with_every_kind_of_request()
    pd.testing.assert_frame_equal(rec.requests_frame(), reference_requests_frame(rec))
    cols = rec.request_columns()
    assert list(cols) == list(REQUEST_COLUMNS)
    steps = rec.steps_frame()
    assert len(steps) == rec.num_steps == 33
    assert steps["start_time"].dtype == np.float64 and steps["num_seqs"].dtype == np.int64
    assert steps["kv_blocks_used"].tolist()[-3:] == [70, 71, 72]


def test_summarize_same_from_columns_and_frames() -> None:
    rec = recorder_with_every_kind_of_request()
    kw = dict(max_num_seqs=4, num_gpu_blocks=100, block_size=16, slo_ttft_s=1.0,
              slo_tpot_s=0.5)
    itl = np.linspace(0.01, 0.3, 50)
    a = summarize(rec.request_columns(), rec.step_columns(), itl, **kw)  # type: ignore[arg-type]
    b = summarize(reference_requests_frame(rec), rec.steps_frame(), itl, **kw)  # type: ignore[arg-type]
    assert json.dumps(a) == json.dumps(b)


def test_compress_steps_columns_equal_the_frame_version() -> None:
    rng = np.random.default_rng(0)
    n = 500
    steps = {"start_time": np.cumsum(rng.random(n)), "duration_s": rng.random(n)}
    for c in ("num_seqs", "num_prefill_tokens", "num_decode_tokens", "kv_blocks_used",
              "num_waiting", "slots_useful", "slots_idle", "slots_empty"):
        steps[c] = rng.integers(0, 2, n) if c != "kv_blocks_used" else rng.integers(0, 99, n)
    steps["num_preempted"] = (rng.random(n) < 0.05).astype(np.int64)
    steps["replica"] = rng.integers(0, 3, n)
    got = to_frame(compress_steps(steps))
    pd.testing.assert_frame_equal(got, reference_compress(pd.DataFrame(steps)))
    assert to_frame(compress_steps(pd.DataFrame(steps))).equals(got)
    empty = compress_steps({c: v[:0] for c, v in steps.items()})
    assert list(empty) == [*steps, "num_steps"] and len(empty["num_steps"]) == 0


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


def test_write_csv_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim.table, "CHUNK_ROWS", 4)
    rec = recorder_with_every_kind_of_request()
    write_csv(tmp_path / "a.csv", rec.request_columns())
    reference_requests_frame(rec).to_csv(tmp_path / "b.csv", index=False)
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
        RequestListArrivals(reqs), num_replicas=3, router="least-outstanding",
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
