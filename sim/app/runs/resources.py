"""The memory a run will need, estimated before its workload is built, against what this
process can still get: :func:`check_memory` refuses a run that cannot fit with one line
naming --num-requests, the estimate and the memory available, instead of a MemoryError
(or the kernel's OOM killer) minutes into the simulation.

A run's memory grows with its requests (the workload's arrays, the request objects, their
records, the request table and its CSV) and with its steps (one record a step), which
depend on the load and are known only once it has run. The estimate counts the requests
alone, at BYTES_PER_REQUEST, a floor: a run it refuses could not fit whatever its load; a
run it lets through may still run out of memory later, and then the command's one line
(sim/app/cli/common.py memory_line) names --num-requests too.

What the process can get is the least of: the kernel's MemAvailable (/proc/meminfo); the
headroom under RLIMIT_AS (``ulimit -v``: the limit less VmSize) and RLIMIT_DATA (``ulimit
-d``: the limit less VmData); and the headroom under the memory limit of the process's
cgroup and each of its ancestors (v2 memory.max less memory.current, v1
memory.limit_in_bytes less memory.usage_in_bytes). Linux reports all of them; where a
figure cannot be read it is left out.
"""

from __future__ import annotations

import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.app.runs.run_config import RunConfig

BYTES_PER_REQUEST = 1_100
"""Bytes each request of a run holds at its peak, at the least: the growth of
tracemalloc's peak (every Python object and numpy buffer) over prepare, simulate and
write from 8,000 to 16,000 requests, divided by 8,000 (benchmarks/request_memory.py on
Python 3.11, numpy 2): 1,185 B for the Azure conversation trace's lengths at 1,000 req/s,
1,298 B for the default scenario at 1,000 req/s, 1,391 B at 25 req/s, 5,707 B at its own
5 req/s, where the step records of small batches add to the requests' own; rounded down
below the least of them, since the estimate must be a floor. Resident memory grows faster
than what is traced (the allocator's slack: 6.0 kB a request for the default scenario by
/usr/bin/time -v between 10,000 and 100,000 requests)."""

#: A cgroup v1 limit at or above this is "no limit" (the kernel writes 2**63 less a page).
_NO_CGROUP_LIMIT = 1 << 62


@dataclass(frozen=True)
class Available:
    """Bytes this process can still allocate under one limit, and which limit it is."""

    num_bytes: int
    source: str


def check_memory(cfg: RunConfig) -> None:
    """Raise ValueError naming --num-requests when the run's requests alone (at
    BYTES_PER_REQUEST each) need more memory than :func:`available_memory`. The count is
    --num-requests, or a trace's rows where fewer (counted only when the bound from the
    file's size does not fit); a run cut by --window is not checked (the cut's count is
    known only once the workload is built) nor a scenario's own count (a few thousand)."""
    if cfg.window is not None:
        return
    trace = Path(cfg.trace) if cfg.trace else None
    if trace is not None and not trace.is_file():
        return  # the trace reader says what is wrong with it
    n = cfg.num_requests
    if trace is not None and n is None:
        n = trace.stat().st_size // 2  # a row is at least a digit and a line end
    if n is None or n < 1:
        return
    avail = available_memory()
    if avail is None or n * BYTES_PER_REQUEST <= avail.num_bytes:
        return
    if trace is not None:
        n = min(n, max(count_lines(trace) - 1, 0))  # the header, if any, is no request
        if n * BYTES_PER_REQUEST <= avail.num_bytes:
            return
    raise ValueError(memory_refusal(n, cfg.num_requests is not None, avail))


def memory_refusal(n: int, given: bool, avail: Available) -> str:
    """The refusal line for ``n`` requests (``given``: as --num-requests, else a trace's
    own) that need more than ``avail``."""
    what = f"--num-requests {n:,}" if given else f"the trace's {n:,} requests"
    most = avail.num_bytes // BYTES_PER_REQUEST
    most -= most % 10 ** max(len(str(most)) - 2, 0)  # two significant digits, rounded down
    return (f"{what} need{'s' if given else ''} at least {_gib(n * BYTES_PER_REQUEST)} of "
            f"memory ({BYTES_PER_REQUEST:,} bytes a request), more than the "
            f"{_gib(avail.num_bytes)} this process can get ({avail.source}); lower "
            f"--num-requests below {most:,}")


def available_memory(proc: Path = Path("/proc"),
                     cgroup_root: Path = Path("/sys/fs/cgroup")) -> Available | None:
    """The least memory this process can still get (module docstring), or None when no
    figure can be read. ``proc`` and ``cgroup_root`` are where Linux mounts them."""
    found = [*_mem_available(proc), *_rlimit_headroom(proc), *_cgroup_headroom(proc,
                                                                               cgroup_root)]
    return min(found, key=lambda a: a.num_bytes, default=None)


def _mem_available(proc: Path) -> Iterator[Available]:
    kib = _field_kib(proc / "meminfo", "MemAvailable")
    if kib is not None:
        yield Available(kib * 1024, "MemAvailable in /proc/meminfo")


def _rlimit_headroom(proc: Path) -> Iterator[Available]:
    """The headroom under RLIMIT_AS and RLIMIT_DATA (soft limits), where set."""
    for limit, field, name in ((resource.RLIMIT_AS, "VmSize", "RLIMIT_AS, ulimit -v"),
                               (resource.RLIMIT_DATA, "VmData", "RLIMIT_DATA, ulimit -d")):
        soft = resource.getrlimit(limit)[0]
        if soft == resource.RLIM_INFINITY:
            continue
        used = (_field_kib(proc / "self" / "status", field) or 0) * 1024
        yield Available(max(soft - used, 0), f"{name}: {_gib(soft)} less {_gib(used)} in use")


def _cgroup_headroom(proc: Path, root: Path) -> Iterator[Available]:
    """The headroom under each memory limit of the process's cgroups (v2 and v1), from
    its own cgroup up to the hierarchy's root."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base, files = root, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, files = root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        folder = base / path.lstrip("/")
        while True:
            found = _cgroup_limit(folder, *files)
            if found is not None:
                yield found
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent


def _cgroup_limit(folder: Path, limit_file: str, usage_file: str) -> Available | None:
    """The headroom under one cgroup's memory limit; None without a limit or its files."""
    try:
        limit_text = (folder / limit_file).read_text().strip()
        usage = int((folder / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    if limit_text == "max" or not limit_text.isdigit() or int(limit_text) >= _NO_CGROUP_LIMIT:
        return None
    limit = int(limit_text)
    return Available(max(limit - usage, 0), f"cgroup {folder / limit_file}: "
                                            f"{_gib(limit)} less {_gib(usage)} in use")


def _field_kib(path: Path, field: str) -> int | None:
    """A ``Field:   1234 kB`` line's number from /proc/meminfo or /proc/self/status."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == field and value.split() and value.split()[0].isdigit():
            return int(value.split()[0])
    return None


def count_lines(path: Path, chunk: int = 1 << 20) -> int:
    """Line ends in the file (a last line without one counts too)."""
    count, last = 0, b"\n"
    with path.open("rb") as f:
        while block := f.read(chunk):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _gib(num_bytes: int) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    if num_bytes < 2**30:
        return f"{num_bytes / 2**20:,.0f} MiB"
    return f"{num_bytes / 2**30:,.1f} GiB"
