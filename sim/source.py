"""Where requests come from, as the engine sees it: an ArrivalSource hands over the
requests that have arrived by a given simulated time. Requests are created lazily at
arrival so a million-request workload never holds a million Request objects."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from sim.request import Request

#: Gives a request its prompt's content for prefix caching (see sim/kv/prefix_content.py), from
#: its workload row ``req.index``: sets ``prompt_segments`` or ``prefix_slots``. Called
#: once per request, at arrival.
ContentFn = Callable[[Request], None]


class ArrivalSource(Protocol):
    """Arrivals in non-decreasing time order. A source that a router feeds also gives
    its next routing instant (sim.interface.RoutedArrivals)."""

    def next_arrival_time(self) -> float | None:
        """Time (s) of the next arrival not yet handed over, or None when exhausted."""
        ...

    def pop_arrived(self, now: float) -> list[Request]:
        """Every request with arrival_time <= now not yet handed over, in order."""
        ...


#: Rows turned into Python lists at a time: the hot path indexes lists (faster than numpy
#: scalars), and converting a chunk at a time keeps a 10-million-row workload from holding
#: about 240 bytes of Python objects per row (2.4 GB) next to its 48 bytes of arrays.
_CHUNK_ROWS = 1 << 14


class ColumnArrivals:
    """An ArrivalSource over column arrays (the shape of scenarios.Workload).

    arrival_time: float seconds, non-decreasing; token columns int >= 1; all of length N.
    Request ``index`` is the position in these columns. ``content`` (prefix caching only)
    gives each request its prompt's content as it arrives. The columns are held as numpy
    arrays and read _CHUNK_ROWS rows at a time.

    Raises:
        ValueError: the columns differ in length.
    """

    __slots__ = ("_base", "_cols", "_content", "_ids", "_j", "_k", "_m", "_n", "_o",
                 "_p", "_prio", "_rids", "_t")

    def __init__(
        self,
        arrival_time: Sequence[float] | np.ndarray,
        num_prompt_tokens: Sequence[int] | np.ndarray,
        output_len: Sequence[int] | np.ndarray,
        max_tokens: Sequence[int] | np.ndarray,
        priority: Sequence[int] | np.ndarray | None = None,
        request_id: Sequence[str] | None = None,
        content: ContentFn | None = None,
    ) -> None:
        n = len(arrival_time)
        self._content = content
        ints = [np.asarray(c, dtype=np.int64) for c in (num_prompt_tokens, output_len,
                                                         max_tokens)]
        prio = (np.asarray(priority, dtype=np.int64) if priority is not None
                else np.zeros(n, dtype=np.int64))
        self._cols = (np.asarray(arrival_time, dtype=np.float64), *ints, prio)
        self._ids = request_id
        if any(len(c) != n for c in self._cols) or (request_id is not None
                                                    and len(request_id) != n):
            raise ValueError("arrival columns must all have the same length")
        self._n = n
        self._load(0)

    def _load(self, base: int) -> None:
        """Make rows [base, base + _CHUNK_ROWS) the current chunk, as Python lists."""
        end = min(base + _CHUNK_ROWS, self._n)
        self._t, self._p, self._o, self._m, self._prio = (c[base:end].tolist()
                                                          for c in self._cols)
        self._rids = (list(self._ids[base:end]) if self._ids is not None
                      else [str(i) for i in range(base, end)])
        self._base, self._j, self._k = base, 0, end - base

    def __len__(self) -> int:
        return self._n

    def next_arrival_time(self) -> float | None:
        return self._t[self._j] if self._j < self._k else None

    def pop_arrived(self, now: float) -> list[Request]:
        j, k, t = self._j, self._k, self._t
        if j >= k or t[j] > now:
            return []  # the usual case: the engine asks before every step
        out: list[Request] = []
        content = self._content
        while True:
            base, p, o, m, prio, rids = (self._base, self._p, self._o, self._m,
                                         self._prio, self._rids)
            while j < k and t[j] <= now:
                req = Request(rids[j], t[j], p[j], o[j], m[j], prio[j], base + j)
                if content is not None:
                    content(req)
                out.append(req)
                j += 1
            self._j = j
            if j < k or base + k >= self._n:
                return out
            self._load(base + k)
            j, k, t = 0, self._k, self._t


class RequestListArrivals:
    """An ArrivalSource over ready-made Request objects (tests, small scenarios)."""

    __slots__ = ("_i", "_reqs")

    def __init__(self, requests: Sequence[Request]) -> None:
        self._reqs = sorted(requests, key=lambda r: r.arrival_time)
        self._i = 0

    def __len__(self) -> int:
        return len(self._reqs)

    def next_arrival_time(self) -> float | None:
        return self._reqs[self._i].arrival_time if self._i < len(self._reqs) else None

    def pop_arrived(self, now: float) -> list[Request]:
        i, reqs = self._i, self._reqs
        j = i
        while j < len(reqs) and reqs[j].arrival_time <= now:
            j += 1
        self._i = j
        return reqs[i:j]


class ClosedLoopArrivals:
    """Closed-loop clients: ``concurrency`` users, each sending its next request
    ``think_time_s`` after its previous one finished or was rejected (``vllm bench serve
    --max-concurrency`` with an unbounded rate, GuideLLM's concurrent mode).

    The requests are the columns' rows in order (row i is the i-th request sent; the
    arrival_time column, if any, is not used); the first ``concurrency`` are sent at t = 0.
    The engine must call ``release(req, now)`` for every request it records (its
    ``on_release`` hook). ``exhausted()`` is True once every row has been handed over.
    Raises ValueError for concurrency < 1, a negative or non-finite think time, or columns
    of different lengths.
    """

    __slots__ = ("_content", "_ids", "_m", "_n", "_next", "_o", "_p", "_pending", "_prio",
                 "_think")

    def __init__(
        self,
        num_prompt_tokens: Sequence[int] | np.ndarray,
        output_len: Sequence[int] | np.ndarray,
        max_tokens: Sequence[int] | np.ndarray,
        concurrency: int,
        think_time_s: float = 0.0,
        priority: Sequence[int] | np.ndarray | None = None,
        request_id: Sequence[str] | None = None,
        content: ContentFn | None = None,
    ) -> None:
        self._content = content
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if not (think_time_s >= 0 and math.isfinite(think_time_s)):
            raise ValueError(f"think_time must be a finite number >= 0 seconds, got "
                             f"{think_time_s!r}")
        self._p = [int(x) for x in num_prompt_tokens]
        self._o = [int(x) for x in output_len]
        self._m = [int(x) for x in max_tokens]
        n = len(self._p)
        self._prio = [int(x) for x in priority] if priority is not None else [0] * n
        self._ids = list(request_id) if request_id is not None else None
        if not (len(self._o) == len(self._m) == len(self._prio) == n):
            raise ValueError("closed-loop columns must all have the same length")
        self._n = n
        self._think = float(think_time_s)
        first = min(int(concurrency), n)
        # (send time, row): rows are assigned in release order, so ties keep row order.
        self._pending: list[tuple[float, int]] = [(0.0, i) for i in range(first)]
        self._next = first

    def __len__(self) -> int:
        return self._n

    def next_arrival_time(self) -> float | None:
        return self._pending[0][0] if self._pending else None

    def pop_arrived(self, now: float) -> list[Request]:
        out: list[Request] = []
        pending = self._pending
        while pending and pending[0][0] <= now:
            t, i = heapq.heappop(pending)
            rid = self._ids[i] if self._ids is not None else str(i)
            req = Request(rid, t, self._p[i], self._o[i], self._m[i], self._prio[i], i)
            if self._content is not None:
                self._content(req)
            out.append(req)
        return out

    def release(self, req: Request, now: float) -> None:
        """The user whose request ``req`` just ended sends the next row after thinking."""
        if self._next < self._n:
            heapq.heappush(self._pending, (now + self._think, self._next))
            self._next += 1

    def exhausted(self) -> bool:
        """True when every row has been handed over (no release can add another)."""
        return not self._pending and self._next >= self._n
