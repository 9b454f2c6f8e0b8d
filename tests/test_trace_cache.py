"""scenarios/trace_cache.py: a trace parsed once per process and file version, keyed by
everything that changes the parse, and a driver's parse used where it was shipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scenarios.build import build_workload
from scenarios.trace_cache import PROCESS_CACHE, TraceCache, read_key


def write_trace(path: Path, n: int, output_len: int = 5) -> Path:
    path.write_text("arrival_time,num_prompt_tokens,output_len\n"
                    + "".join(f"{i * 0.5},{10 + i},{output_len}\n" for i in range(n)))
    return path


def test_a_file_is_parsed_once_per_version(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", 4)
    cache = TraceCache()
    first = cache.load(trace)
    assert cache.load(str(trace)) is first and cache.num_parses == 1
    assert list(first.num_prompt_tokens) == [10, 11, 12, 13]
    # The same path asked for in another format is another parse.
    assert cache.load(trace, "servesim") is not first and cache.num_parses == 2
    # Rewritten in place (another size and mtime): read again.
    write_trace(trace, 3)
    os.utime(trace, ns=(1, 1))
    again = cache.load(trace)
    assert cache.num_parses == 3 and list(again.arrival_time) == [0.0, 0.5, 1.0]


def test_relative_and_absolute_paths_share_one_parse(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    write_trace(tmp_path / "t.csv", 2)
    monkeypatch.chdir(tmp_path)
    cache = TraceCache()
    assert cache.load("t.csv") is cache.load(tmp_path / "t.csv")
    assert read_key("t.csv", None) == read_key(tmp_path / "t.csv", None)


def test_one_parse_serves_every_cut(tmp_path: Path) -> None:
    """A plan's checks, probes and cluster checks ask for different cuts of one file."""
    trace = write_trace(tmp_path / "t.csv", 10)
    cache = TraceCache()
    cuts = [cache.load(trace, num_requests=n, window_s=w, retimed=r)
            for n, w, r in ((8, None, False), (3, None, True), (None, 2.0, False),
                            (None, None, True))]
    assert cache.num_parses == 1
    assert [len(w) for w in cuts] == [8, 3, 4, 10]  # window [0, 2 s): 0, 0.5, 1, 1.5
    # A parse for re-timed runs does not stand for one that keeps the arrivals (a
    # length-only file refuses those).
    other = TraceCache()
    other.load(trace, retimed=True)
    other.load(trace, retimed=False)
    assert other.num_parses == 2


def test_a_large_file_is_read_only_as_far_as_its_cut(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("scenarios.trace_cache.WHOLE_READ_BYTES", 1)
    trace = write_trace(tmp_path / "t.csv", 10)
    cache = TraceCache()
    assert len(cache.load(trace, num_requests=6, window_s=None)) == 6
    assert len(cache.load(trace, num_requests=4, window_s=None)) == 4  # a prefix of 6
    assert cache.num_parses == 1
    assert len(cache.load(trace, num_requests=9, window_s=None)) == 9
    assert cache.num_parses == 2


def test_least_recently_used_parse_is_dropped(tmp_path: Path) -> None:
    cache = TraceCache(capacity=2)
    a, b, c = (write_trace(tmp_path / f"{x}.csv", 2) for x in "abc")
    cache.load(a), cache.load(b), cache.load(a), cache.load(c)  # b is the oldest use
    assert cache.num_parses == 3
    cache.load(a)
    assert cache.num_parses == 3
    cache.load(b)
    assert cache.num_parses == 4


def test_a_shipped_parse_stands_for_the_drivers_file(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.csv", 3, output_len=7)
    driver, worker = TraceCache(), TraceCache()
    shipment = driver.ship(trace)
    trace.unlink()  # the worker's host has no such file
    with pytest.raises(FileNotFoundError, match="trace file not found"):
        worker.load(trace)
    worker.receive(shipment)
    w = worker.load(trace)
    assert worker.num_parses == 0 and list(w.output_len) == [7, 7, 7]
    # Cut as each run asks, whatever else the reader is told.
    cut = worker.load(trace, num_requests=2, retimed=False)
    assert list(cut.arrival_time) == [0.0, 0.5]
    assert list(worker.load(trace, window_s=1.0).num_prompt_tokens) == [10, 11]


def test_build_workload_reads_a_trace_once_per_process(tmp_path: Path) -> None:
    """Every run of one process (sweep cells, plan probes: one cut, several rates,
    processes and seeds) shares one parse."""
    trace = write_trace(tmp_path / "t.csv", 20)
    before = PROCESS_CACHE.num_parses
    runs = [build_workload(trace=trace, trace_format=None, scenario=None, arrival=arrival,
                           rate=rate, burstiness=None, num_requests=5, window_s=None,
                           time_scale=None, max_tokens=None, seed=seed)
            for arrival, rate, seed in (("poisson", 4.0, 0), ("poisson", 8.0, 1),
                                        ("constant", 2.0, 2))]
    assert PROCESS_CACHE.num_parses - before == 1
    assert [list(w.num_prompt_tokens) for w in runs] == [[10, 11, 12, 13, 14]] * 3
    assert list(runs[2].arrival_time) == [0.5, 1.0, 1.5, 2.0, 2.5]  # constant 2/s
