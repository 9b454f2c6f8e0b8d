"""The disk cache of parsed CSV trace columns (scenarios/traces/column_cache.py): a second
whole read of an unchanged file skips pandas and gives the same workload; a changed file,
a broken entry, a cut read or a file pandas refuses are not served from it; it can be
turned off and never fails a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scenarios.traces import bulk, column_cache, load_trace
from scenarios.traces.formats import CSV_FORMATS

ROOT = Path(__file__).resolve().parents[1]
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROWS = ["2023-11-16 18:15:46.6805900,374,44\n", "2023-11-16 18:15:50.9951690,396,109\n",
        "2023-11-16 18:15:51.2129950,879,55\n"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of this test's own."""
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "traces"


def write_trace(path: Path, rows: list[str] = ROWS) -> Path:
    path.write_text(HEADER + "".join(rows))
    return path


def no_pandas_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a parse by pandas fail the test: what follows must come from the cache."""
    def refuse(*args: object) -> None:
        raise AssertionError("parsed again")
    monkeypatch.setattr(bulk, "_parse", refuse)


def test_a_second_whole_read_comes_from_disk(tmp_path: Path, cache: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    trace = write_trace(tmp_path / "azure.csv")
    first = load_trace(trace)
    assert len(list(cache.glob("*.npz"))) == 1
    no_pandas_parse(monkeypatch)
    second = load_trace(trace)
    assert second == first and second.source == first.source
    # 18:15:46.6805900 -> 50.9951690 and 51.2129950: 4.314579 s and 4.532405 s later.
    assert np.array_equal(second.arrival_time, [0.0, 4.314579, 4.532405])
    assert list(second.num_prompt_tokens) == [374, 396, 879]


def test_a_changed_file_is_parsed_again(tmp_path: Path, cache: Path) -> None:
    trace = write_trace(tmp_path / "azure.csv")
    assert len(load_trace(trace)) == 3
    write_trace(trace, [*ROWS, "2023-11-16 18:15:52.0000000,10,10\n"])
    assert len(load_trace(trace)) == 4


def test_same_size_and_time_with_other_bytes_is_parsed_again(tmp_path: Path,
                                                             cache: Path) -> None:
    trace = write_trace(tmp_path / "azure.csv")
    st = trace.stat()
    assert list(load_trace(trace).output_len) == [44, 109, 55]
    write_trace(trace, [ROWS[0].replace(",44", ",45"), *ROWS[1:]])
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert trace.stat().st_size == st.st_size and trace.stat().st_mtime_ns == st.st_mtime_ns
    assert list(load_trace(trace).output_len) == [45, 109, 55]


@pytest.mark.parametrize("damage", ["other bytes", "cut short", "a byte flipped"])
def test_a_broken_entry_is_a_miss_and_is_written_again(tmp_path: Path, cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       damage: str) -> None:
    # A cut or flipped zip makes np.load raise zipfile.BadZipFile, other bytes ValueError.
    trace = write_trace(tmp_path / "azure.csv")
    first = load_trace(trace)
    (entry,) = cache.glob("*.npz")
    whole = entry.read_bytes()
    middle = len(whole) // 2
    entry.write_bytes({"other bytes": b"not an npz", "cut short": whole[:middle],
                       "a byte flipped": whole[:middle] + bytes([whole[middle] ^ 0xFF])
                       + whole[middle + 1:]}[damage])
    assert load_trace(trace) == first
    no_pandas_parse(monkeypatch)
    assert load_trace(trace) == first


def test_cut_reads_and_refused_files_are_not_kept(tmp_path: Path, cache: Path) -> None:
    trace = write_trace(tmp_path / "azure.csv")
    cols = bulk.read(trace, CSV_FORMATS["azure"], {}, num_requests=2)
    assert cols is not None and not cache.exists()
    bad = write_trace(tmp_path / "bad.csv", [*ROWS, "2023-11-16 18:15:52.0000000,abc,10\n"])
    with pytest.raises(ValueError, match="line 5"):
        load_trace(bad)
    assert not cache.exists()


def test_turned_off_or_unwritable_it_only_costs_the_parse(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    trace = write_trace(tmp_path / "azure.csv")
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(tmp_path / "off"))
    monkeypatch.setenv("SERVESIM_TRACE_CACHE", "0")
    assert len(load_trace(trace)) == 3 and not (tmp_path / "off").exists()
    monkeypatch.delenv("SERVESIM_TRACE_CACHE")
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where the cache's folder would go")
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(blocker))
    assert len(load_trace(trace)) == 3 and blocker.is_file()
    # No cache folder named and no home directory to put one in.
    monkeypatch.delenv("SERVESIM_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert column_cache.cache_dir() is None and len(load_trace(trace)) == 3


def test_the_oldest_entries_go_past_max_entries(tmp_path: Path, cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(column_cache, "MAX_ENTRIES", 2)
    for i in range(3):
        load_trace(write_trace(tmp_path / f"t{i}.csv"))
        entries = sorted(cache.glob("*.npz"), key=lambda p: p.stat().st_mtime_ns)
        os.utime(entries[-1], ns=(i * 10**9, i * 10**9))  # written in this order
    assert len(list(cache.glob("*.npz"))) == 2
    no_pandas_parse(monkeypatch)
    load_trace(tmp_path / "t2.csv")
    with pytest.raises(AssertionError, match="parsed again"):
        load_trace(tmp_path / "t0.csv")


def test_a_later_process_does_not_import_pandas(tmp_path: Path, cache: Path) -> None:
    trace = write_trace(tmp_path / "azure.csv")
    script = ("import sys; from scenarios.traces import load_trace; "
              f"w = load_trace({str(trace)!r}); print(len(w), 'pandas' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
            for _ in range(2)]
    assert runs == [["3", "True"], ["3", "False"]]


def test_another_reader_or_pandas_parses_again(tmp_path: Path, cache: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # An upgrade that changes the reader's code or pandas' version must not be served
    # columns parsed by the old one.
    trace = write_trace(tmp_path / "azure.csv")
    load_trace(trace)
    version = column_cache._reader_version()
    assert len(version) == 64 and version == column_cache._reader_version()
    monkeypatch.setattr(column_cache, "_reader_version", lambda: "another reader")
    no_pandas_parse(monkeypatch)
    with pytest.raises(AssertionError, match="parsed again"):
        load_trace(trace)


def test_entries_past_max_bytes_go_but_the_newest_stays(tmp_path: Path, cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setattr(column_cache, "MAX_BYTES", 1)  # smaller than any entry
    for i in range(3):
        load_trace(write_trace(tmp_path / f"t{i}.csv"))
        assert len(list(cache.glob("*.npz"))) == 1  # only the one just written
    no_pandas_parse(monkeypatch)
    load_trace(tmp_path / "t2.csv")
