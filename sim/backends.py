"""Where many independent simulations run: a local process pool (the default) or a Ray
cluster. Owns ``map_ordered``: apply a picklable top-level function to every item and
return the results in item order, whatever order they finish in, so a sweep's output never
depends on scheduling.

The Ray backend is optional (``pip install 'servesim[ray]'``); ray is imported only when
asked for. With ``address`` it joins an existing cluster (every node must have servesim
installed and reach the files a task reads, e.g. the trace); without, it starts a local
Ray instance for the call and shuts it down after, unless one is already running in this
process (then it is used as is).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

BACKENDS = ("local", "ray")

RAY_MISSING = ("the ray backend needs the ray package: pip install 'servesim[ray]' "
               "(or pip install ray)")


def default_workers() -> int:
    """One worker per CPU this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def map_ordered(
    fn: Callable[[T], R], items: Sequence[T], *, workers: int | None = None,
    backend: str = "local", address: str | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[R]:
    """``[fn(x) for x in items]``, run in parallel; ``on_done(n_finished)`` after each.

    workers: local processes (default: one per CPU; 1 runs in this process, no pool).
    backend: "local" or "ray"; address: a Ray cluster to join (ray only).
    Raises ValueError for an unknown backend, workers < 1, an address without ray, or ray
    not installed; whatever ``fn`` raises is re-raised here.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if address is not None and backend != "ray":
        raise ValueError("address applies only to the ray backend")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if backend == "ray":
        return _map_ray(fn, items, address, on_done)
    n = min(workers or default_workers(), max(len(items), 1))
    if n == 1:
        out = []
        for i, x in enumerate(items):
            out.append(fn(x))
            if on_done is not None:
                on_done(i + 1)
        return out
    return _map_pool(fn, items, n, on_done)


def _pool_context() -> Any:
    # forkserver children start from a clean, single-threaded server (no inherited rich
    # progress thread); preloading the simulator makes each child start in milliseconds.
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["sim.runner", "sim.cluster"])
        return ctx
    return multiprocessing.get_context("spawn")


def _map_pool(fn: Callable[[T], R], items: Sequence[T], workers: int,
              on_done: Callable[[int], None] | None) -> list[R]:
    results: list[Any] = [None] * len(items)
    with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context()) as pool:
        futures = {pool.submit(fn, x): i for i, x in enumerate(items)}
        try:
            for done, fut in enumerate(as_completed(futures), start=1):
                results[futures[fut]] = fut.result()
                if on_done is not None:
                    on_done(done)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return results


def _map_ray(fn: Callable[[T], R], items: Sequence[T], address: str | None,
             on_done: Callable[[int], None] | None) -> list[R]:
    try:
        import ray
    except ImportError as e:
        raise ValueError(RAY_MISSING) from e
    started = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        started = True
    try:
        remote = ray.remote(fn)
        refs = [remote.remote(x) for x in items]
        pending, finished = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            finished += len(ready)
            if on_done is not None:
                on_done(finished)
        return list(ray.get(refs))
    finally:
        if started:
            ray.shutdown()
