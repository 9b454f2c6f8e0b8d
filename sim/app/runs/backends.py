"""Where many independent simulations run: a local process pool (the default) or a Ray
cluster. Owns ``Executor.map``: apply a picklable top-level function to every item and
return the results in item order, whatever order they finish in, so a sweep's output never
depends on scheduling. One Executor keeps its pool (or its Ray connection) for its whole
``with`` block, so a plan's many rounds pay the start-up once.

The Ray backend is optional (``pip install 'servesim[ray]'``); ray is imported only when
asked for. With ``address`` it joins an existing cluster (every node must have servesim
installed and reach the files a task reads, e.g. the trace); without, it starts a local
Ray instance for the block and shuts it down after, unless ray is already initialised in
this process (then that instance is used and left running).

Local workers start with the ``forkserver`` method where there is one (a clean,
single-threaded parent, whatever threads the CLI's progress bar runs): as with any
non-fork start method, a script that starts a sweep must guard its entry point with
``if __name__ == "__main__":``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from types import TracebackType
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


def _pool_context() -> Any:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["sim.app.runs.runner", "sim.cluster"])
        return ctx
    return multiprocessing.get_context("spawn")


class Executor:
    """``with Executor(workers, backend, address) as ex: ex.map(fn, items)``.

    workers: local processes (default: one per CPU; 1 runs in this process, no pool).
    backend: "local" or "ray"; address: a Ray cluster to join (ray only).
    Raises ValueError for an unknown backend, workers < 1, an address without ray, or ray
    not installed; whatever ``fn`` raises is re-raised by ``map``.
    """

    def __init__(self, workers: int | None = None, backend: str = "local",
                 address: str | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if address is not None and backend != "ray":
            raise ValueError("address applies only to the ray backend")
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.backend = backend
        self.address = address
        self.workers = workers or default_workers()
        self._pool: ProcessPoolExecutor | None = None
        self._ray: Any = None
        self._ray_started = False

    def __enter__(self) -> Executor:
        if self.backend == "ray":
            try:
                import ray
            except ImportError as e:
                raise ValueError(RAY_MISSING) from e
            self._ray = ray
            if not ray.is_initialized():
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
                self._ray_started = True
        elif self.workers > 1:
            self._pool = ProcessPoolExecutor(max_workers=self.workers,
                                             mp_context=_pool_context())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._ray_started:
            self._ray.shutdown()
            self._ray_started = False

    def map(self, fn: Callable[[T], R], items: Sequence[T],
            on_done: Callable[[int], None] | None = None) -> list[R]:
        """``[fn(x) for x in items]`` in parallel, in item order; ``on_done(n)`` after
        each finished item."""
        if self._ray is not None:
            return self._map_ray(fn, items, on_done)
        if self._pool is None or len(items) < 2:
            out = []
            for i, x in enumerate(items):
                out.append(fn(x))
                if on_done is not None:
                    on_done(i + 1)
            return out
        return self._map_pool(fn, items, on_done)

    def _map_pool(self, fn: Callable[[T], R], items: Sequence[T],
                  on_done: Callable[[int], None] | None) -> list[R]:
        assert self._pool is not None
        results: list[Any] = [None] * len(items)
        futures: dict[Future[R], int] = {self._pool.submit(fn, x): i
                                         for i, x in enumerate(items)}
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

    def _map_ray(self, fn: Callable[[T], R], items: Sequence[T],
                 on_done: Callable[[int], None] | None) -> list[R]:
        ray = self._ray
        remote = ray.remote(fn)
        refs = [remote.remote(x) for x in items]
        pending, finished = list(refs), 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            finished += len(ready)
            if on_done is not None:
                on_done(finished)
        return list(ray.get(refs))


def map_ordered(fn: Callable[[T], R], items: Sequence[T], *, workers: int | None = None,
                backend: str = "local", address: str | None = None,
                on_done: Callable[[int], None] | None = None) -> list[R]:
    """One ``Executor.map`` call in its own Executor (see Executor for the arguments)."""
    with Executor(min(workers or default_workers(), max(len(items), 1)), backend,
                  address) as ex:
        return ex.map(fn, items, on_done)
