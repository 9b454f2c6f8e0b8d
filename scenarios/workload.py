"""The Workload: one pre-generated, immutable table of request specs.

Owns the columnar representation every policy run shares (Vidur's "one workload for every
policy compared") and its validation, done once in ``__post_init__``: equal column lengths,
token counts >= 1, arrivals finite, >= 0 and non-decreasing, request ids unique. It also owns
the pure transformations the CLI applies (cap max_tokens, re-time, speed up, cut). Arrival
processes live in ``arrivals``, length samplers in ``lengths``, file formats in ``traces``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from scenarios.request_ids import RequestIds

if TYPE_CHECKING:
    import numpy.typing as npt

_INT_FIELDS = ("num_prompt_tokens", "output_len", "max_tokens", "priority")
_POSITIVE_FIELDS = ("num_prompt_tokens", "output_len", "max_tokens")


def _frozen(values: npt.ArrayLike, dtype: type[np.generic], name: str) -> np.ndarray:
    """A read-only 1-D copy of ``values`` as ``dtype``; integer columns must hold integers."""
    arr = np.array(values, copy=True)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if dtype is np.int64 and arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.number) or not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
        bad = np.flatnonzero(arr != np.round(arr))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}] = {arr[bad[0]]!r} is not an integer")
    arr = arr.astype(dtype, copy=False)  # already a private copy
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """Columnar request specs, sorted by arrival_time (stable).

    Columns (all of length ``n = len(workload)``):

    - ``arrival_time``: float64 seconds, finite, >= 0, non-decreasing; the first may be > 0.
    - ``num_prompt_tokens``: int64 >= 1.
    - ``output_len``: int64 >= 1, tokens the request generates before it stops (a workload
      fact no policy may read).
    - ``max_tokens``: int64 >= 1, the client's cap (``Workload.from_arrays`` defaults it to
      ``output_len``).
    - ``priority``: int64, lower = more urgent (default 0).
    - ``request_id``: unique strings (default ``"0", "1", ...`` = input row index) as a
      RequestIds (scenarios/request_ids.py: default ids are held as int64 row numbers).
    - ``hash_ids``: optional Mooncake prefix-block hashes (512 tokens per block) per request.
    - ``prompt_segments``: optional prompt content per request as (segment id, tokens)
      pairs summing to its num_prompt_tokens (synthetic shared prefixes and sessions; see
      sim/kv/prefix_content.py); a prefix cache reads these, or else ``hash_ids``.
    - ``source``: human description of where the workload came from.
    - ``notes``: lines for the user about how it was built (a diurnal process that covers
      less than a day), printed as warnings; like ``source``, not compared.

    Arrays are copied and made read-only at construction. Use ``Workload.from_arrays`` to
    fill defaults and sort unsorted input. Equality compares every column but ``source``
    and ``notes``.

    Raises:
        ValueError: a column has the wrong length, a token count is < 1 (the message names
            the field, the index and the request_id), an arrival is not finite, negative or
            out of order, or a request_id repeats.
    """

    arrival_time: np.ndarray
    num_prompt_tokens: np.ndarray
    output_len: np.ndarray
    max_tokens: np.ndarray
    priority: np.ndarray
    request_id: RequestIds
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    source: str = ""
    prompt_segments: tuple[tuple[tuple[int, int], ...], ...] | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "arrival_time", _frozen(self.arrival_time, np.float64, "arrival_time")
        )
        for name in _INT_FIELDS:
            object.__setattr__(self, name, _frozen(getattr(self, name), np.int64, name))
        object.__setattr__(self, "request_id", RequestIds.from_names(self.request_id))
        if self.hash_ids is not None:
            hashes = tuple(tuple(int(h) for h in row) for row in self.hash_ids)
            object.__setattr__(self, "hash_ids", hashes)
        if self.prompt_segments is not None:
            segs = tuple(tuple((int(sid), int(n)) for sid, n in row)
                         for row in self.prompt_segments)
            object.__setattr__(self, "prompt_segments", segs)
        self._validate()

    def _validate(self) -> None:
        n = len(self.arrival_time)
        for name in (*_INT_FIELDS, "request_id", "hash_ids", "prompt_segments"):
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise ValueError(f"{name} has {len(column)} entries, arrival_time has {n}")
        if self.prompt_segments is not None:
            self._validate_segments()
        for name in _POSITIVE_FIELDS:
            bad = np.flatnonzero(getattr(self, name) < 1)
            if bad.size:
                i = int(bad[0])
                raise ValueError(
                    f"{name}[{i}] (request_id {self.request_id[i]!r}) = "
                    f"{getattr(self, name)[i]} must be >= 1"
                )
        t = self.arrival_time
        bad = np.flatnonzero(~np.isfinite(t) | (t < 0))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"arrival_time[{i}] = {t[i]} must be finite and >= 0")
        bad = np.flatnonzero(np.diff(t) < 0)
        if bad.size:
            i = int(bad[0]) + 1
            raise ValueError(
                f"arrival_time must be non-decreasing: arrival_time[{i}] = {t[i]} < "
                f"arrival_time[{i - 1}] = {t[i - 1]} (use Workload.from_arrays to sort)"
            )
        if not self.request_id.all_unique():
            raise ValueError("request_id values must be unique")

    def _validate_segments(self) -> None:
        assert self.prompt_segments is not None
        for i, row in enumerate(self.prompt_segments):
            total = 0
            for _, length in row:
                if length < 1:
                    raise ValueError(f"prompt_segments[{i}] (request_id "
                                     f"{self.request_id[i]!r}) has a segment of {length} "
                                     "tokens; each must be >= 1")
                total += length
            if total != self.num_prompt_tokens[i]:
                raise ValueError(f"prompt_segments[{i}] (request_id {self.request_id[i]!r}) "
                                 f"sums to {total} tokens, num_prompt_tokens is "
                                 f"{self.num_prompt_tokens[i]}")

    @classmethod
    def from_arrays(
        cls,
        arrival_time: npt.ArrayLike,
        num_prompt_tokens: npt.ArrayLike,
        output_len: npt.ArrayLike,
        *,
        max_tokens: npt.ArrayLike | None = None,
        priority: npt.ArrayLike | None = None,
        request_id: Sequence[str] | RequestIds | None = None,
        hash_ids: Sequence[Sequence[int]] | None = None,
        source: str = "",
        prompt_segments: Sequence[Sequence[tuple[int, int]]] | None = None,
    ) -> Workload:
        """Build a Workload, filling defaults and stable-sorting rows by arrival_time.

        Defaults: ``max_tokens = output_len``, ``priority = 0``, ``request_id`` = the input
        row index as a string (assigned before sorting, so ids name input rows).
        """
        t = np.asarray(arrival_time, dtype=np.float64)
        n = len(t)
        prompt = np.asarray(num_prompt_tokens)
        out = np.asarray(output_len)
        cap = out if max_tokens is None else np.asarray(max_tokens)
        prio = np.zeros(n, dtype=np.int64) if priority is None else np.asarray(priority)
        ids = (RequestIds.from_rows(np.arange(n)) if request_id is None
               else RequestIds.from_names(request_id))
        hashes = None if hash_ids is None else tuple(tuple(h) for h in hash_ids)
        segs = (None if prompt_segments is None
                else tuple(tuple(row) for row in prompt_segments))
        for name, column in (("num_prompt_tokens", prompt), ("output_len", out),
                             ("max_tokens", cap), ("priority", prio), ("request_id", ids),
                             ("hash_ids", hashes), ("prompt_segments", segs)):
            if column is not None and len(column) != n:
                raise ValueError(f"{name} has {len(column)} entries, arrival_time has {n}")
        # Rows in order are passed as they are (the constructor copies each column once).
        order: np.ndarray | slice = slice(None)
        if np.any(t[1:] < t[:-1]):
            order = np.argsort(t, kind="stable")
            ids = ids.take(order)
            hashes = None if hashes is None else tuple(hashes[i] for i in order)
            segs = None if segs is None else tuple(segs[i] for i in order)
        return cls(
            arrival_time=t[order], num_prompt_tokens=prompt[order], output_len=out[order],
            max_tokens=cap[order], priority=prio[order], request_id=ids, hash_ids=hashes,
            source=source, prompt_segments=segs,
        )

    def __len__(self) -> int:
        return len(self.arrival_time)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workload):
            return NotImplemented
        return (
            all(np.array_equal(getattr(self, f), getattr(other, f))
                for f in ("arrival_time", *_INT_FIELDS))
            and self.request_id == other.request_id
            and self.hash_ids == other.hash_ids
            and self.prompt_segments == other.prompt_segments
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking columns: not hashable

    def __repr__(self) -> str:
        span = float(self.arrival_time[-1] - self.arrival_time[0]) if len(self) else 0.0
        return f"Workload(n={len(self)}, span_s={span:.3f}, source={self.source!r})"

    def _replace(self, index: np.ndarray | slice | None = None, **changes: object) -> Workload:
        """A new Workload with rows ``index`` (all when None) and some columns replaced."""
        sel = slice(None) if index is None else index
        ids = self.request_id
        hashes = self.hash_ids
        segs = self.prompt_segments
        if index is not None:
            positions = range(len(self))[sel] if isinstance(sel, slice) else sel
            ids = ids.take(np.asarray(positions))
            hashes = None if hashes is None else tuple(hashes[int(i)] for i in positions)
            segs = None if segs is None else tuple(segs[int(i)] for i in positions)
        fields: dict[str, object] = {
            "arrival_time": self.arrival_time[sel],
            **{name: getattr(self, name)[sel] for name in _INT_FIELDS},
            "request_id": ids,
            "hash_ids": hashes,
            "source": self.source,
            "prompt_segments": segs,
            "notes": self.notes,
        }
        fields.update(changes)
        return Workload(**fields)  # type: ignore[arg-type]

    def sampled(self, num_requests: int, rng: np.random.Generator,
                shuffle: bool = False) -> Workload:
        """``num_requests`` rows drawn at random without replacement (every row when
        ``num_requests >= len(self)``), kept in their original order with their own
        arrival times; or, with ``shuffle``, in random order (a stationary mix, for
        re-timing: the rows then carry the sorted arrival times of the rows drawn).

        Raises:
            ValueError: ``num_requests`` < 1.
        """
        if int(num_requests) != num_requests or num_requests < 1:
            raise ValueError(f"num_requests must be an integer >= 1, got {num_requests!r}")
        n = min(int(num_requests), len(self))
        if not shuffle:
            if n == len(self):
                return self
            return self._replace(np.sort(rng.choice(len(self), size=n, replace=False)))
        rows = rng.permutation(len(self))[:n]
        return self._replace(rows, arrival_time=np.sort(self.arrival_time[rows]))

    def oversampled(self, num_requests: int, rng: np.random.Generator) -> Workload:
        """Every row, then ``num_requests - len(self)`` more drawn uniformly with
        replacement (none when ``num_requests <= len(self)``), as vLLM's benchmark
        datasets oversample (vllm/benchmarks/datasets.py ``maybe_oversample_requests``):
        a drawn row is a copy whose request_id is its index (``RequestIds.appended``).
        The copies come after every row and the rows carry the sorted arrival times of
        the rows drawn (as ``sampled`` with ``shuffle`` does): a result to re-time.

        Raises:
            ValueError: ``num_requests`` < 1, an empty workload to draw from, or a copy's
                id that one of the rows already has (as vLLM refuses duplicate ids).
        """
        if int(num_requests) != num_requests or num_requests < 1:
            raise ValueError(f"num_requests must be an integer >= 1, got {num_requests!r}")
        extra = int(num_requests) - len(self)
        if extra <= 0:
            return self
        if not len(self):
            raise ValueError("cannot oversample an empty workload")
        rows = np.concatenate([np.arange(len(self)), rng.integers(0, len(self), size=extra)])
        ids = self.request_id.appended(extra)
        if not ids.all_unique():
            raise ValueError(f"oversampling to {num_requests} requests numbers the copies "
                             f"{len(self)}..{num_requests - 1}, and a trace request_id "
                             "already takes one of those names")
        return self._replace(rows, arrival_time=np.sort(self.arrival_time[rows]),
                             request_id=ids)

    def with_max_tokens(self, cap: int | None) -> Workload:
        """Every request's ``max_tokens`` set to ``cap`` (tokens, >= 1); None = unchanged.

        ``output_len`` is kept: a request stops at ``min(output_len, max_tokens)``.
        """
        if cap is None:
            return self
        if int(cap) != cap or cap < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {cap!r}")
        return self._replace(max_tokens=np.full(len(self), int(cap), dtype=np.int64))

    def retimed(self, arrival_time: npt.ArrayLike) -> Workload:
        """Same requests, lengths and order; new (sorted) ``arrival_time`` in seconds.

        Raises:
            ValueError: ``arrival_time`` has a different length, or is not finite,
                >= 0 and non-decreasing.
        """
        t = np.asarray(arrival_time, dtype=np.float64)
        if t.shape != (len(self),):
            raise ValueError(f"arrival_time must have shape ({len(self)},), got {t.shape}")
        return self._replace(arrival_time=t)

    def time_scaled(self, speedup: float) -> Workload:
        """Arrivals ``speedup`` times as fast: every arrival_time divided by ``speedup``.

        ``speedup`` 2.0 halves every gap (twice the request rate); 0.5 doubles them;
        ``inf`` puts every arrival at t = 0.

        Raises:
            ValueError: ``speedup`` is not > 0 (NaN included), or so small that an
                arrival time overflows to inf.
        """
        if not speedup > 0:
            raise ValueError(f"time_scale (speedup) must be > 0, got {speedup!r}")
        with np.errstate(over="ignore"):  # an overflow is refused below, by name
            t = self.arrival_time / speedup
        if len(t) and not np.isfinite(t[-1]):
            raise ValueError(f"time_scale (speedup) {speedup!r} slows the trace's arrivals past "
                             "what a float64 clock holds; give a larger time_scale")
        return self._replace(arrival_time=t)

    def rows(self, start: int, stop: int) -> Workload:
        """Rows ``[start, stop)`` (a window of a long workload, sim/app/runs/window_replay.py),
        with their request ids and content; the whole workload when they span it."""
        if start == 0 and stop >= len(self):
            return self
        return self._replace(slice(start, stop))

    def cut(self, num_requests: int | None = None, window_s: float | None = None) -> Workload:
        """The first ``num_requests`` requests and/or those arriving within ``window_s``.

        The window is half-open, ``[t0, t0 + window_s)`` with ``t0`` the first arrival, so
        it always holds the first request. Both limits apply together; None = no limit.

        Raises:
            ValueError: ``num_requests`` < 1 or ``window_s`` not > 0.
        """
        keep = len(self)
        if num_requests is not None:
            if int(num_requests) != num_requests or num_requests < 1:
                raise ValueError(f"num_requests must be an integer >= 1, got {num_requests!r}")
            keep = min(keep, int(num_requests))
        if window_s is not None:
            if not window_s > 0:
                raise ValueError(f"window_s must be > 0, got {window_s!r}")
            if len(self):
                end = self.arrival_time[0] + window_s
                keep = min(keep, int(np.searchsorted(self.arrival_time, end, side="left")))
        if keep == len(self):
            return self
        return self._replace(slice(0, keep))
