"""Where requests come from, as the engine sees it: an ArrivalSource hands over the
requests that have arrived by a given simulated time. Requests are created lazily at
arrival so a million-request workload never holds a million Request objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from sim.request import Request


class ArrivalSource(Protocol):
    """Arrivals in non-decreasing time order."""

    def next_arrival_time(self) -> float | None:
        """Time (s) of the next arrival not yet handed over, or None when exhausted."""
        ...

    def pop_arrived(self, now: float) -> list[Request]:
        """Every request with arrival_time <= now not yet handed over, in order."""
        ...


class ColumnArrivals:
    """An ArrivalSource over column arrays (the shape of scenarios.Workload).

    arrival_time: float seconds, non-decreasing; token columns int >= 1; all of length N.
    Request ``index`` is the position in these columns.
    """

    __slots__ = ("_i", "_ids", "_m", "_n", "_o", "_p", "_prio", "_t")

    def __init__(
        self,
        arrival_time: Sequence[float] | np.ndarray,
        num_prompt_tokens: Sequence[int] | np.ndarray,
        output_len: Sequence[int] | np.ndarray,
        max_tokens: Sequence[int] | np.ndarray,
        priority: Sequence[int] | np.ndarray | None = None,
        request_id: Sequence[str] | None = None,
    ) -> None:
        n = len(arrival_time)
        self._t = [float(x) for x in arrival_time]
        self._p = [int(x) for x in num_prompt_tokens]
        self._o = [int(x) for x in output_len]
        self._m = [int(x) for x in max_tokens]
        self._prio = [int(x) for x in priority] if priority is not None else [0] * n
        self._ids = list(request_id) if request_id is not None else None
        if not (len(self._p) == len(self._o) == len(self._m) == len(self._prio) == n):
            raise ValueError("arrival columns must all have the same length")
        self._i = 0
        self._n = n

    def __len__(self) -> int:
        return self._n

    def next_arrival_time(self) -> float | None:
        return self._t[self._i] if self._i < self._n else None

    def pop_arrived(self, now: float) -> list[Request]:
        i, n, t = self._i, self._n, self._t
        out: list[Request] = []
        while i < n and t[i] <= now:
            rid = self._ids[i] if self._ids is not None else str(i)
            out.append(
                Request(rid, t[i], self._p[i], self._o[i], self._m[i], self._prio[i], i)
            )
            i += 1
        self._i = i
        return out


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
