"""Streamed records (sim/record_spool.py, sim/spilled_stats.py): ``servesim run`` writes
requests.csv and steps.csv as the run goes, byte for byte the files a run held in memory
writes, with the Recorder flushing every few steps so that rows come out of workload
order and steps.csv's groups cross chunk boundaries; the summary's sums and order
statistics over spilled files; a failed streamed run leaves nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import sim.metrics
import sim.spilled_stats as ss
from sim.app.cli.main import app
from sim.app.runs.run_files import run_streamed, streams_records, write_run
from sim.app.runs.runner import RunConfig, prepare, simulate_prepared
from sim.latency_stats import ItlSamples, weighted_stats
from sim.metrics import Recorder
from sim.record_spool import SPILL_DIR
from sim.step_compression import compress_steps
from tests.test_metrics_columns import recorder_with_every_kind_of_request

FILES = ("requests.csv", "steps.csv", "summary.json", "config.json")
#: A small run with preemptions (a pool of 600 blocks, priorities, swaps) and one on
#: the default workload with the token budget splitting prompts.
CASES = [
    dict(num_requests=300, queue="priority", preemption_mode="swap", num_gpu_blocks=600,
         max_model_len=8192, rate=20.0),
    dict(num_requests=200, max_num_batched_tokens=256),
]


def held_and_streamed(tmp_path: Path, opts: dict[str, object],
                      full_steps: bool) -> tuple[Path, Path]:
    """The run written from tables held in memory, and streamed; their directories."""
    prep = prepare(RunConfig(**opts))  # type: ignore[arg-type]
    assert streams_records(prep)
    held, streamed = tmp_path / "held", tmp_path / "streamed"
    write_run(held, prep, simulate_prepared(prep), full_steps=full_steps)
    summary = run_streamed(streamed, prep, full_steps=full_steps)
    assert summary["num_requests"] == opts["num_requests"]
    return held, streamed


@pytest.mark.parametrize("full_steps", [False, True])
@pytest.mark.parametrize("opts", CASES)
def test_streamed_files_equal_held_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         opts: dict[str, object], full_steps: bool) -> None:
    monkeypatch.setattr(sim.metrics, "_PACK_ROWS", 3)  # flush every 3 record calls
    held, streamed = held_and_streamed(tmp_path, opts, full_steps)
    for name in FILES:
        assert (streamed / name).read_bytes() == (held / name).read_bytes(), name
    assert sorted(p.name for p in streamed.iterdir()) == sorted(FILES)  # spill removed
    if not full_steps:  # the chunks of 3 calls were joined into longer rows
        rows = (streamed / "steps.csv").read_text().splitlines()[1:]
        assert max(int(r.rsplit(",", 1)[1]) for r in rows) > 3


def test_run_command_streams_and_holds_only_what_is_pending(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """servesim run streams: its Recorder hands its records on and keeps none (the
    tables it could still give are empty at the end), and the files are the held run's."""
    recorders: list[Recorder] = []

    def watched(sink: sim.metrics.RecordSink | None = None) -> Recorder:
        rec = Recorder(sink)
        recorders.append(rec)
        return rec

    monkeypatch.setattr("sim.simulate.Recorder", watched)
    monkeypatch.setattr(sim.metrics, "_PACK_ROWS", 5)
    res = CliRunner().invoke(app, ["run", "--num-requests", "120", "--out",
                                   str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    [rec] = recorders
    assert rec.num_requests == 120 and rec.num_steps > 100
    assert len(rec.request_columns()["request_id"]) == 0
    assert len(rec.step_columns()["start_time"]) == 0
    assert len(rec.itl_samples()) == 0
    prep = prepare(RunConfig(num_requests=120))
    write_run(tmp_path / "held", prep, simulate_prepared(prep))
    for name in FILES:
        assert ((tmp_path / "run" / name).read_bytes()
                == (tmp_path / "held" / name).read_bytes()), name


def test_a_failed_streamed_run_leaves_nothing(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> dict[str, object]:
        assert (tmp_path / "out").exists() is False
        staged = [p for p in tmp_path.iterdir() if (p / SPILL_DIR).is_dir()]
        assert len(staged) == 1 and (staged[0] / "requests.csv").exists()
        raise KeyboardInterrupt

    monkeypatch.setattr("sim.record_spool.RecordSpool.finish", fail)
    prep = prepare(RunConfig(num_requests=20))
    with pytest.raises(KeyboardInterrupt):
        run_streamed(tmp_path / "out", prep)
    assert list(tmp_path.iterdir()) == []


def test_step_compression_carried_across_every_split() -> None:
    """A step table compressed in two chunks, the first's open group carried as one row
    (its num_steps as count), equals the whole table compressed, at every split."""
    steps = recorder_with_every_kind_of_request().step_columns()
    steps["duration_s"] = np.random.default_rng(0).random(len(steps["duration_s"]))
    whole = compress_steps(steps)
    for cut in range(1, len(steps["start_time"])):
        first = compress_steps({c: v[:cut] for c, v in steps.items()})
        carry = {c: v[-1:] for c, v in first.items()}
        rest = compress_steps({c: np.concatenate([carry[c], v[cut:]]) for c, v in steps.items()},
                              np.concatenate([carry["num_steps"],
                                              np.ones(len(steps["start_time"]) - cut, np.int64)]))
        for c, v in whole.items():
            joined = np.concatenate([first[c][:-1], rest[c]])
            assert joined.tobytes() == v.tobytes(), (cut, c)


def column_file(path: Path, values: np.ndarray, chunk: int = 997) -> ss.ColumnFile:
    f = ss.ColumnFile(path, values.dtype)
    for lo in range(0, len(values), chunk):
        f.append(values[lo:lo + chunk])
    f.close()
    return f


def test_pairwise_sum_over_a_file_is_numpys_sum(tmp_path: Path) -> None:
    x = np.random.default_rng(1).random(200_003) * 1e-3
    f = column_file(tmp_path / "x", x)
    assert ss.pairwise_sum(f.read, len(f), leaf=1000) == x.sum()
    assert ss.pairwise_sum(f.read, len(f)) == x.sum()
    assert ss.pairwise_sum(f.read, 0) == 0.0


def test_itl_selection_passes_equal_weighted_stats(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ITL_IN_MEMORY, p50-p99 and max are exact order statistics (the same bits
    as weighted_stats), and so is the mean (an exact sum, rounded once)."""
    rng = np.random.default_rng(2)
    step_s = np.round(rng.exponential(0.02, 30_000), 4)
    step_s[::1000] = np.nan  # left out, as weighted_stats leaves them
    counts = rng.integers(0, 40, 30_000)
    irregular = rng.exponential(0.05, 2_000)
    files = (column_file(tmp_path / "a", step_s), column_file(tmp_path / "b", counts),
             column_file(tmp_path / "c", irregular))
    ref = weighted_stats(ItlSamples(np.concatenate([step_s, irregular]),
                                    np.concatenate([counts, np.ones(2_000, np.int64)])))
    assert ss.spilled_itl_stats(*files) == ref  # in memory: identical
    monkeypatch.setattr(ss, "ITL_IN_MEMORY", 100)
    monkeypatch.setattr(ss, "CHUNK", 4096)
    assert ss.spilled_itl_stats(*files) == ref
