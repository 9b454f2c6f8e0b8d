"""The request_id column of a Workload: strings, held as row numbers where they are ones.

Owns how request ids are stored. Most traces carry no ids of their own, so a request's
id is its input row number as a string ("0", "1", ...). Held as Python strings, two
million of them took about 500 MB (a tuple and a set per copy); held as one int64 array
of row numbers they take 16 MB, and each id is written out as ``str(row)`` only where it
is read (a Request made, requests.csv written). Ids a trace gives (servesim's
``request_id`` column, ShareGPT turns) are kept as strings. Either way the column reads as
an immutable sequence of ``str`` and compares equal to any sequence of the same strings.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, overload

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt


class RequestIds(Sequence[str]):
    """An immutable sequence of request ids (``str``): ``str(rows[i])`` for a column of
    row numbers (``from_rows``), or the strings given (``from_names``)."""

    __slots__ = ("_names", "_rows")

    def __init__(self, rows: np.ndarray | None, names: tuple[str, ...] | None) -> None:
        self._rows = rows
        self._names = names

    @classmethod
    def from_rows(cls, rows: npt.ArrayLike) -> RequestIds:
        """Ids ``str(r)`` of integer row numbers ``rows`` (copied, read-only int64).

        Raises:
            ValueError: ``rows`` is not 1-D or holds non-integers.
        """
        arr = np.array(rows, copy=True)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"request_id rows must be 1-D integers, got {arr.dtype} "
                             f"of shape {arr.shape}")
        arr = arr.astype(np.int64)
        arr.setflags(write=False)
        return cls(arr, None)

    @classmethod
    def from_names(cls, names: Sequence[object]) -> RequestIds:
        """Ids ``str(x)`` of each of ``names``; a RequestIds is returned as it is."""
        if isinstance(names, RequestIds):
            return names
        return cls(None, tuple(str(x) for x in names))

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else len(self._names or ())

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> RequestIds: ...

    def __getitem__(self, index: int | slice) -> str | RequestIds:
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        if self._rows is not None:
            return str(int(self._rows[index]))
        assert self._names is not None
        return self._names[index]

    def take(self, positions: npt.ArrayLike) -> RequestIds:
        """The ids at ``positions`` (integer indices), in that order."""
        pos = np.asarray(positions, dtype=np.int64)
        if self._rows is not None:
            rows = self._rows[pos]
            rows.setflags(write=False)
            return RequestIds(rows, None)
        assert self._names is not None
        return RequestIds(None, tuple(self._names[i] for i in pos.tolist()))

    def appended(self, count: int) -> RequestIds:
        """These ids and ``count`` more, ``str(len(self))``, ``str(len(self) + 1)``, ...:
        the ids vLLM's benchmark datasets give the rows they oversample (their index in
        the list, vllm/benchmarks/datasets.py ``maybe_oversample_requests``). The result
        may repeat an id this one holds (all_unique says)."""
        n = len(self)
        if self._rows is not None:
            return RequestIds.from_rows(np.concatenate(
                [self._rows, np.arange(n, n + count, dtype=np.int64)]))
        return RequestIds(None, (*(self._names or ()), *map(str, range(n, n + count))))

    def __iter__(self) -> Iterator[str]:
        if self._rows is not None:
            return map(str, self._rows.tolist())
        return iter(self._names or ())

    def all_unique(self) -> bool:
        """Whether no id repeats (distinct int64 rows have distinct decimal strings)."""
        if self._rows is not None:
            rows = self._rows
            if len(rows) < 2 or bool(np.all(rows[1:] > rows[:-1])):
                return True  # increasing: the common case, checked without a sort
            ordered = np.sort(rows)  # (np.unique would import numpy.ma: 0.05 s)
            return bool(np.all(ordered[1:] != ordered[:-1]))
        return len(set(self._names or ())) == len(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RequestIds) and self._rows is not None \
                and other._rows is not None:
            return bool(np.array_equal(self._rows, other._rows))
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(
            a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to tuples: no hash to agree with

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:4])
        return f"RequestIds([{head}{', ...' if len(self) > 4 else ''}], n={len(self)})"
