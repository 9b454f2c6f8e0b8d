"""Where many independent simulations run: a local process pool (the default) or a Ray
cluster. Owns ``Executor.map``: apply a picklable top-level function to every item and
return the results in item order, whatever order they finish in, so a sweep's output never
depends on scheduling; and ``Executor.for_each``, which hands each result over in item
order as soon as all before it are in and keeps none, for a caller that writes them out
as they come (a window replay's records). One Executor keeps its pool (or its Ray
connection) for its whole ``with`` block, so a plan's many rounds pay the start-up once.

The Ray backend is optional (``pip install 'servesim[ray]'``); ray is imported only when
asked for. With ``address`` it joins an existing cluster; without, it starts a local Ray
instance for the block and shuts it down after, unless ray is already initialised in
this process (then that instance is used and left running). A cluster needs only Ray and
servesim's dependencies (numpy, pandas, simpy, ...): servesim's own packages travel with
every task of a joined cluster (ray_runtime_env, Ray's py_modules), and the files a run
reads are read here, in the driver: the caller resolves their paths
(sim/app/runs/sweep.py, plan.py) and gives the parsed trace as ``shipment``
(scenarios/trace_cache.py), put in Ray's object store once and installed in each
worker's trace cache, so no worker opens the trace file.

Local workers start with the ``forkserver`` method where there is one (a clean,
single-threaded parent, whatever threads the CLI's progress bar runs): as with any
non-fork start method, a script that starts a sweep must guard its entry point with
``if __name__ == "__main__":``.

No worker outlives the process that started it, and a stop ends them at once. Each local
worker watches a *lifeline*, a pipe whose write end only this process holds, and exits the
moment it closes, whatever it is computing: the ``with`` block closes it on the way out
of an exception (Ctrl-C, a signal the CLI turned into one), so an interrupted map ends in
milliseconds instead of after its running tasks, and the kernel closes it when this
process dies, even by SIGKILL. (Linux's PR_SET_PDEATHSIG would not do: a forkserver
worker's parent is the forkserver, which exits only once every worker has, as they hold
its "alive" pipe, so neither would ever go.) The pool stays a ProcessPoolExecutor rather
than a multiprocessing.Pool, whose terminate() would end it as quickly: a worker killed
from outside (the OOM killer) fails this map with BrokenProcessPool, where a Pool's map
waits for it forever. Workers ignore SIGINT and SIGHUP, which a terminal sends to its
whole process group: this process decides, and ends them.

Python runs signal handlers on the main thread only, so what a stop must not cut halfway
runs on a helper thread: submitting, which starts the workers (one cut between its fork
and its hand-over to the pool would die with a traceback), and Ray's waits (Ray turns any
exception but KeyboardInterrupt that a handler raises inside its calls into a
SystemError). On Ray, an interrupted map cancels its tasks (force=True: their worker
processes are killed) and a local instance started here is shut down; when this process
is killed outright, that instance's processes end with it (Ray fate-shares them).
``ray.init`` replaces the SIGTERM handler with its own; the caller's are put back once it
returns.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

BACKENDS = ("local", "ray")

RAY_MISSING = ("the ray backend needs the ray package: pip install 'servesim[ray]' "
               "(or pip install ray)")

#: servesim's top-level packages, shipped to Ray workers (pyproject's packages.find).
PACKAGES = ("sim", "policies", "scenarios", "calibration")


def ray_runtime_env() -> dict[str, Any]:
    """The runtime_env of the Ray job an Executor starts or joins: servesim's packages as
    py_modules (uploaded once per content, byte-compiled files left out), so a worker
    imports the driver's code whether or not servesim is installed on its node. (Ray
    takes folders to upload only for a whole job: a Ray this process had already
    initialised keeps its own runtime_env.)"""
    import importlib

    folders = [os.path.dirname(importlib.import_module(p).__file__ or "") for p in PACKAGES]
    return {"py_modules": folders, "excludes": ["__pycache__", "*.pyc"]}


def join_error(address: str, error: BaseException) -> str:
    """The line for a failed join of the cluster at ``address``: Ray's own message and
    what a head started with token authentication needs of this process."""
    mode = os.environ.get("RAY_AUTH_MODE", "unset")
    return (f"cannot join the Ray cluster at {address}: {error}. A head started with "
            f"RAY_AUTH_MODE=token needs RAY_AUTH_MODE=token here too (now {mode}) and its "
            "token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token")


def _run_shipped(shipment: Any, fn: Callable[[T], R], x: T) -> R:
    """A Ray task: install the driver's parsed traces in this worker's cache, then
    ``fn(x)``."""
    from scenarios.trace_cache import PROCESS_CACHE

    if shipment:
        PROCESS_CACHE.receive(shipment)
    return fn(x)


def default_workers() -> int:
    """One worker per CPU this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def _pool_context() -> Any:
    """The start method of local workers (module docstring). The forkserver preloads
    nothing: Python (3.10-3.13) imports its preloads with the folder it started in first
    on the path and never gives it the parent's, so a ``scenarios/`` or ``sim/`` folder
    where the command ran shadowed servesim's own in every worker. Each worker, forked
    from it, imports what its tasks need after taking the parent's path."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([])
        return ctx
    return multiprocessing.get_context("spawn")


#: Signals a terminal sends to its whole foreground process group; workers leave them to
#: the process that started them.
_GROUP_SIGNALS = (signal.SIGINT, signal.SIGHUP)


def _start_worker(lifeline: Connection) -> None:
    """Worker initializer: ignore the terminal's signals and exit when ``lifeline`` closes
    (module docstring)."""
    for signum in _GROUP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    threading.Thread(target=_exit_when_closed, args=(lifeline,), daemon=True,
                     name="servesim-lifeline").start()


def _exit_when_closed(lifeline: Connection) -> None:
    """Block until the starting process closes (or loses) the lifeline's write end, then
    end this worker at once: its task's result has no one left to take it."""
    lifeline.poll(None)  # nothing is ever sent: readable means closed
    os._exit(1)


class Executor:
    """``with Executor(workers, backend, address) as ex: ex.map(fn, items)``.

    workers: local processes (default: one per CPU; 1 runs in this process, no pool).
    backend: "local" or "ray"; address: a Ray cluster to join (ray only).
    shipment: parsed traces (scenarios.trace_cache.TraceCache.ship) every Ray task is
    given; local workers read the files themselves, once each (their trace cache).
    Raises ValueError for an unknown backend, workers < 1, an address without ray, ray
    not installed, or a cluster that cannot be joined (join_error); whatever ``fn``
    raises is re-raised by ``map``.
    """

    def __init__(self, workers: int | None = None, backend: str = "local",
                 address: str | None = None, shipment: dict[Any, Any] | None = None) -> None:
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
        self._lifeline: Connection | None = None  # the write end; the workers hold the other
        self.shipment = shipment or {}
        self._ray: Any = None
        self._ray_started = False
        self._shipment_ref: Any = None

    def __enter__(self) -> Executor:
        if self.backend == "ray":
            self._start_ray()
        elif self.workers > 1:
            ctx = _pool_context()
            reader, self._lifeline = ctx.Pipe(duplex=False)
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx,
                                             initializer=_start_worker, initargs=(reader,))
        return self

    def _start_ray(self) -> None:
        """Import ray and join its cluster (or start a local instance); the caller's
        signal handlers are put back after ``ray.init`` (module docstring)."""
        try:
            import ray
        except ImportError as e:
            raise ValueError(RAY_MISSING) from e
        self._ray = ray
        if ray.is_initialized():
            return
        handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, *_GROUP_SIGNALS)}
        try:
            # A local instance's workers run this Python on this file system: only a
            # joined cluster needs the code shipped (and a runtime_env's workers, set up
            # apart, outlive a killed driver by seconds).
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                     runtime_env=None if self.address is None else ray_runtime_env())
            self._ray_started = True
        except (ConnectionError, ray.exceptions.RayError) as e:
            ray.shutdown()
            if self.address is None:
                raise
            raise ValueError(join_error(self.address, e)) from None
        except BaseException:
            ray.shutdown()  # whatever an interrupted start had started
            raise
        finally:
            if threading.current_thread() is threading.main_thread():
                for signum, handler in handlers.items():
                    signal.signal(signum, handler)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Release the pool or Ray. After an exception the local workers are ended at once
        (their running tasks are abandoned); otherwise they are idle and exit by
        themselves."""
        if self._pool is not None:
            assert self._lifeline is not None
            if exc_type is not None:
                self._lifeline.close()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._lifeline.close()
            self._pool = self._lifeline = None
        self._shipment_ref = None
        if self._ray_started:
            self._ray.shutdown()
            self._ray_started = False

    @property
    def parallelism(self) -> int:
        """Tasks that can run at once: the local workers, or the Ray cluster's CPUs."""
        if self._ray is not None:
            return max(int(self._ray.cluster_resources().get("CPU", 1)), 1)
        return self.workers if self._pool is not None else 1

    def map(self, fn: Callable[[T], R], items: Sequence[T],
            on_done: Callable[[int], None] | None = None) -> list[R]:
        """``[fn(x) for x in items]`` in parallel, in item order; ``on_done(n)`` after
        each finished item."""
        out: list[R] = []
        self.for_each(fn, items, out.append, on_done)
        return out

    def for_each(self, fn: Callable[[T], R], items: Sequence[T],
                 on_result: Callable[[R], None],
                 on_done: Callable[[int], None] | None = None) -> None:
        """``on_result(fn(x))`` for every item, in item order, each as soon as it and
        every earlier item are done: only results that finish ahead of an earlier one
        are held, and none once handed over, so a caller writing them out (a window
        replay's records) holds a few at a time, not all. ``on_done(n)`` after each
        finished item (in finish order). Whatever ``fn`` or ``on_result`` raises ends
        the map (the remaining tasks cancelled) and is re-raised."""
        if self._ray is not None:
            self._each_ray(fn, items, on_result, on_done)
        elif self._pool is None or len(items) < 2:
            for i, x in enumerate(items):
                on_result(fn(x))
                if on_done is not None:
                    on_done(i + 1)
        else:
            self._each_pool(fn, items, on_result, on_done)

    def _each_pool(self, fn: Callable[[T], R], items: Sequence[T],
                   on_result: Callable[[R], None],
                   on_done: Callable[[int], None] | None) -> None:
        """for_each on the local pool; a future is dropped once its result is taken
        (as_completed drops its own references), so a result handed over is freed."""
        futures = self._submit_all(fn, items)
        ahead = _InOrder(on_result)
        try:
            for done, fut in enumerate(as_completed(futures), start=1):
                ahead.put(futures.pop(fut), fut.result())
                if on_done is not None:
                    on_done(done)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise

    def _submit_all(self, fn: Callable[[T], R], items: Sequence[T]) -> dict[Future[R], int]:
        """Every item submitted to the pool (future: its index), from a helper thread. The
        first submits start the workers, and Python runs signal handlers on the main
        thread only: a stop (the CLI's exception) cannot leave a worker half-started, forked
        but not yet known to the pool (it would die with a traceback once this process's
        semaphores are gone). A stop while they start waits for them (the forkserver's
        start, a second or so), then goes on."""
        pool = self._pool
        assert pool is not None

        def submit_all() -> dict[Future[R], int]:
            return {pool.submit(fn, x): i for i, x in enumerate(items)}

        with ThreadPoolExecutor(1, thread_name_prefix="servesim-submit") as submitter:
            return submitter.submit(submit_all).result()

    def _each_ray(self, fn: Callable[[T], R], items: Sequence[T],
                  on_result: Callable[[R], None],
                  on_done: Callable[[int], None] | None) -> None:
        """for_each on Ray: the tasks waited for on a helper thread, which also fetches
        each result in item order, hands it to ``on_result`` and drops its reference
        (freeing it in the object store). Ray runs Python's signal handlers inside its
        own blocking calls and turns any exception they raise but KeyboardInterrupt into
        a SystemError, whereas a helper thread runs none (Python runs them on the main
        thread only), so a stop reaches this thread as it was raised. On any exception
        the tasks are cancelled, force=True: their worker processes are killed, not only
        the queued tasks dropped."""
        ray = self._ray
        remote = ray.remote(_run_shipped)
        if self._shipment_ref is None:
            self._shipment_ref = ray.put(self.shipment)
        refs: list[Any] = []

        def take(i: int) -> None:
            result = ray.get(refs[i])
            refs[i] = None
            on_result(result)

        def wait_each() -> None:
            index = {ref: i for i, ref in enumerate(refs)}
            pending = list(refs)
            ahead = _InOrder(take)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:  # its result stays in Ray's object store until taken
                    i = index.pop(ref)
                    ahead.put(i, i)
                if on_done is not None:
                    on_done(len(refs) - len(pending))

        with ThreadPoolExecutor(1, thread_name_prefix="servesim-ray") as waiter:
            try:
                refs.extend(remote.remote(self._shipment_ref, fn, x) for x in items)
                waiter.submit(wait_each).result()
            except BaseException:
                for ref in refs:  # a finished task's cancel does nothing
                    if ref is not None:
                        ray.cancel(ref, force=True)
                raise


class _InOrder:
    """Results put by index in any order, handed to ``take`` in index order (0, 1, ...)
    as soon as each and all before it are in; only those ahead of a missing one are
    held. ``taken``: how many have been handed over."""

    def __init__(self, take: Callable[[Any], None]) -> None:
        self._take = take
        self._ahead: dict[int, Any] = {}
        self.taken = 0

    def put(self, index: int, result: Any) -> None:
        self._ahead[index] = result
        while self.taken in self._ahead:
            self._take(self._ahead.pop(self.taken))
            self.taken += 1


def map_ordered(fn: Callable[[T], R], items: Sequence[T], *, workers: int | None = None,
                backend: str = "local", address: str | None = None,
                on_done: Callable[[int], None] | None = None,
                shipment: dict[Any, Any] | None = None) -> list[R]:
    """``[fn(x) for x in items]`` by for_each_ordered (see Executor for the arguments)."""
    out: list[R] = []
    for_each_ordered(fn, items, out.append, workers=workers, backend=backend,
                     address=address, on_done=on_done, shipment=shipment)
    return out


def for_each_ordered(fn: Callable[[T], R], items: Sequence[T], on_result: Callable[[R], None],
                     *, workers: int | None = None, backend: str = "local",
                     address: str | None = None, on_done: Callable[[int], None] | None = None,
                     shipment: dict[Any, Any] | None = None) -> None:
    """One ``Executor.for_each`` call in its own Executor (see Executor for the
    arguments)."""
    with Executor(min(workers or default_workers(), max(len(items), 1)), backend,
                  address, shipment) as ex:
        ex.for_each(fn, items, on_result, on_done)
