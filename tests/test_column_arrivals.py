"""ColumnArrivals hands out every row once, in order, with the row's own fields, across
the chunks it converts its columns in (sim/source.py)."""

from __future__ import annotations

import numpy as np
import pytest

from scenarios.request_ids import RequestIds
from sim.source import _CHUNK_ROWS, ColumnArrivals


def _drain(src: ColumnArrivals, times: list[float]) -> list[tuple[str, float, int, int]]:
    out = []
    for now in times:
        out += [(r.request_id, r.arrival_time, r.num_prompt_tokens, r.index)
                for r in src.pop_arrived(now)]
    return out


def test_rows_cross_chunk_boundaries_in_one_pop_and_one_by_one() -> None:
    n = 2 * _CHUNK_ROWS + 5
    t = np.repeat(np.arange(n // 5 + 1, dtype=np.float64), 5)[:n]  # five arrivals a second
    p = np.arange(n) % 97 + 1
    expected = [(str(i), float(t[i]), int(p[i]), i) for i in range(n)]
    # Everything at once: one pop crosses both chunk boundaries.
    src = ColumnArrivals(t, p, p, p, request_id=RequestIds.from_rows(np.arange(n)))
    assert src.next_arrival_time() == 0.0
    assert _drain(src, [float(t[-1])]) == expected
    assert src.next_arrival_time() is None and src.pop_arrived(1e9) == []
    # Second by second: each boundary crossed between or inside pops.
    src = ColumnArrivals(t, p, p, p)
    seen = []
    for now in np.unique(t):
        assert src.next_arrival_time() == now
        seen += _drain(src, [float(now)])
    assert seen == expected


def test_length_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match="same length"):
        ColumnArrivals([0.0, 1.0], [1, 2], [1], [1, 2])
