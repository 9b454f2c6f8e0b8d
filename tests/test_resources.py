"""sim/app/runs/resources.py and the out-of-memory line (sim/app/cli/common.py): a run
whose requests cannot fit in the memory this process can get is refused before its
workload is built, with one line naming --num-requests, the estimate and what is
available; a MemoryError (numpy's "Unable to allocate ..." too) that happens anyway ends
in one line naming --num-requests. No test here allocates what it reports: the available
memory is faked, or capped with RLIMIT_AS in a child process. The resources module is
imported by the tests that use it, so that the command-line tests run (and fail) on a
tree without it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.app.cli.main import app
from sim.app.runs.runner import RunConfig

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
UNLIMITED = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)


def fake_proc(tmp_path: Path, cgroup: str, mem_available_kib: int = 2_000_000,
              vm_size_kib: int = 1_048_576) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal:  8000000 kB\nMemAvailable:  {mem_available_kib} "
                                  "kB\nSwapFree:  0 kB\n")
    (proc / "self" / "status").write_text(f"Name:\tpython\nVmSize:\t {vm_size_kib} kB\n"
                                          "VmData:\t  524288 kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


def cgroup_files(folder: Path, limit: str, usage: int, v1: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    names = (("memory.limit_in_bytes", "memory.usage_in_bytes") if v1
             else ("memory.max", "memory.current"))
    (folder / names[0]).write_text(limit + "\n")
    (folder / names[1]).write_text(f"{usage}\n")


def test_the_least_headroom_wins_cgroup_v2(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.app.runs import resources
    from sim.app.runs.resources import Available, available_memory

    monkeypatch.setattr(resources.resource, "getrlimit", lambda _: UNLIMITED)
    proc = fake_proc(tmp_path, "0::/a/b\n")
    root = tmp_path / "cgroup"
    cgroup_files(root / "a" / "b", "1073741824", 73_741_824)  # 1 GiB, 1e9 B left
    cgroup_files(root / "a", "max", 500_000_000)  # no limit of its own
    assert available_memory(proc, root) == Available(
        1_000_000_000, f"cgroup {root}/a/b/memory.max: 1.0 GiB less 70 MiB in use")
    cgroup_files(root / "a", "1500000000", 600_000_000)  # an ancestor with 9e8 B left
    got = available_memory(proc, root)
    assert got is not None and got.num_bytes == 900_000_000


def test_memavailable_when_no_limit_is_lower(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """cgroup v1 writes 2**63 less a page for "no limit"; MemAvailable 2,000,000 kB."""
    from sim.app.runs import resources
    from sim.app.runs.resources import Available, available_memory

    monkeypatch.setattr(resources.resource, "getrlimit", lambda _: UNLIMITED)
    proc = fake_proc(tmp_path, "4:memory:/job\n1:cpu:/job\n")
    root = tmp_path / "cgroup"
    cgroup_files(root / "memory" / "job", "9223372036854771712", 10**9, v1=True)
    assert available_memory(proc, root) == Available(2_048_000_000,
                                                     "MemAvailable in /proc/meminfo")
    cgroup_files(root / "memory" / "job", str(2**30), 2**29, v1=True)
    got = available_memory(proc, root)
    assert got is not None and got.num_bytes == 2**29


def test_rlimit_as_headroom_is_the_limit_less_vmsize(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.app.runs import resources
    from sim.app.runs.resources import Available, available_memory

    limits = {resource.RLIMIT_AS: (3 * 2**30, resource.RLIM_INFINITY)}
    monkeypatch.setattr(resources.resource, "getrlimit", lambda r: limits.get(r, UNLIMITED))
    proc = fake_proc(tmp_path, "0::/\n", mem_available_kib=8_000_000, vm_size_kib=1_048_576)
    assert available_memory(proc, tmp_path / "none") == Available(
        2 * 2**30, "RLIMIT_AS, ulimit -v: 3.0 GiB less 1.0 GiB in use")


def test_no_figure_at_all_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sim.app.runs import resources

    monkeypatch.setattr(resources.resource, "getrlimit", lambda _: UNLIMITED)
    assert resources.available_memory(tmp_path / "noproc", tmp_path / "nocgroup") is None


def fake_available(monkeypatch: pytest.MonkeyPatch, num_bytes: int) -> None:
    from sim.app.runs import resources

    monkeypatch.setattr(resources, "available_memory",
                        lambda: resources.Available(num_bytes, "a test's limit"))


def test_too_many_requests_are_refused_with_the_estimate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """200,000 x 1,100 B = 220,000,000 B = 210 MiB > 100 MiB; 100 MiB / 1,100 B = 95,325
    requests, 95,000 to two digits."""
    from sim.app.runs.resources import BYTES_PER_REQUEST, check_memory

    assert BYTES_PER_REQUEST == 1_100
    fake_available(monkeypatch, 100 * MIB)
    with pytest.raises(ValueError) as info:
        check_memory(RunConfig(num_requests=200_000))
    assert str(info.value) == (
        "--num-requests 200,000 needs at least 210 MiB of memory (1,100 bytes a request), "
        "more than the 100 MiB this process can get (a test's limit); lower --num-requests "
        "below 95,000")
    check_memory(RunConfig(num_requests=95_000))  # 104,500,000 B <= 104,857,600 B
    check_memory(RunConfig(num_requests=200_000, window=60.0))  # the cut's count is unknown
    check_memory(RunConfig())  # a scenario's own count


def test_a_trace_is_counted_by_its_rows(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3-row trace holds 3 requests whatever --num-requests says; a 1,000-row one needs
    1,100,000 B = 1 MiB, more than 512 KiB."""
    from sim.app.runs.resources import check_memory, count_lines

    small, large = tmp_path / "small.csv", tmp_path / "large.csv"
    small.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "0,10,10\n" * 3)
    large.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "0,10,10\n" * 1000)
    assert (count_lines(small), count_lines(large)) == (4, 1001)
    fake_available(monkeypatch, 512 * 1024)
    check_memory(RunConfig(trace=str(small), num_requests=10_000_000))
    check_memory(RunConfig(trace=str(small)))
    with pytest.raises(ValueError, match=r"^the trace's 1,000 requests need at least 1 MiB "
                                         r"of memory .* lower --num-requests below 470$"):
        check_memory(RunConfig(trace=str(large)))


def test_the_cli_refuses_before_building_the_workload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def generate(*_a: object, **_k: object) -> None:
        raise AssertionError("the workload was built")

    monkeypatch.setattr("scenarios.build.generate", generate)
    fake_available(monkeypatch, 100 * MIB)
    res = CliRunner().invoke(app, ["run", "--num-requests", "200000",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 1 and not (tmp_path / "run").exists()
    assert res.stderr.splitlines() == [
        "error: --num-requests 200,000 needs at least 210 MiB of memory (1,100 bytes a "
        "request), more than the 100 MiB this process can get (a test's limit); lower "
        "--num-requests below 95,000"]


@pytest.mark.parametrize(("error", "detail"), [
    (lambda: np.empty(2**60, dtype=np.uint8),
     " (Unable to allocate 1.00 EiB for an array with shape (1152921504606846976,) and data "
     "type uint8)"),
    (lambda: (_ for _ in ()).throw(MemoryError()), ""),
])
def test_a_memory_error_names_num_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           error: object, detail: str) -> None:
    """numpy refuses 2**60 bytes without allocating them (its _ArrayMemoryError, a
    MemoryError); Python's own MemoryError has no text at all."""
    monkeypatch.setattr("scenarios.build.generate", lambda *a, **k: error())  # type: ignore[operator]
    res = CliRunner().invoke(app, ["run", "--num-requests", "50",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [
        f"error: out of memory{detail}: the workload does not fit in this machine's memory; "
        "lower --num-requests, or cut a trace with --window"]


def test_ten_million_requests_under_rlimit_as_are_refused_at_once(tmp_path: Path) -> None:
    """A real child process under a 3 GiB address-space cap (``ulimit -v``): 10,000,000
    requests need at least 11,000,000,000 B = 10.2 GiB, so the run stops before building
    its workload, within seconds, instead of failing minutes later."""
    cap = 3 * 2**30

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sim.app.cli", "run", "--num-requests", "10000000",
         "--out", str(tmp_path / "run")],
        cwd=tmp_path, env=env, preexec_fn=limit, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: --num-requests 10,000,000 needs at least 10.2 GiB of "
                               "memory (1,100 bytes a request), more than the ")
    assert "lower --num-requests below " in lines[0]
    assert time.monotonic() - start < 30 and not (tmp_path / "run").exists()
