"""Azure LLM inference TIMESTAMP values as integer nanoseconds since the epoch (UTC).

Owns the two forms the Azure traces write: 2023's ``YYYY-MM-DD HH:MM:SS.fffffff`` (wall
clock, no zone; read as UTC) and 2024's ``YYYY-MM-DD HH:MM:SS.ffffff+00:00`` (an offset,
the fraction sometimes absent: ``2024-05-10 00:00:00+00:00``). Accepted: a space or ``T``
between date and time, 0-9 fraction digits, an offset ``Z``, ``+HH:MM`` or ``+HHMM``.
``row_ns`` parses one value and names the line at fault; ``bulk_ns`` parses a column with
pandas (the same values) and returns None for anything it does not plainly take (a leap
second, a bad value), so that the row parser names the line.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

NS_PER_S = 1_000_000_000
_EPOCH_DAY = datetime.date(1970, 1, 1).toordinal()
_FORMAT = "'YYYY-MM-DD HH:MM:SS[.fffffff][+HH:MM]'"
#: The shortest accepted value, ``YYYY-MM-DD HH:MM:SS``: pandas' ISO 8601 parser also
#: takes a date alone or hours and minutes alone, which the row parser refuses.
_MIN_CHARS = 19


def _offset_s(zone: str) -> int:
    """Seconds east of UTC of ``Z``, ``+HH:MM``, ``+HHMM`` or ``""`` (none: UTC)."""
    if zone in ("", "Z"):
        return 0
    sign = {"+": 1, "-": -1}[zone[0]]
    hh, mm = zone[1:3], zone[-2:]
    if len(zone) not in (5, 6) or (len(zone) == 6 and zone[3] != ":"):
        raise ValueError
    h, m = int(hh), int(mm)
    if not (0 <= h < 24 and 0 <= m < 60):
        raise ValueError
    return sign * (h * 3600 + m * 60)


def _split_zone(time_s: str) -> tuple[str, str]:
    """(``HH:MM:SS[.f]``, zone) of a time of day with an optional zone."""
    if time_s.endswith("Z"):
        return time_s[:-1], "Z"
    for sign in "+-":
        at = time_s.find(sign)
        if at >= 0:
            return time_s[:at], time_s[at:]
    return time_s, ""


def row_ns(text: str, where: str, dates: dict[str, int]) -> int:
    """Integer nanoseconds since the epoch (UTC) of one TIMESTAMP; ``dates`` caches day
    numbers. Raises ValueError naming ``where`` when ``text`` is not such a time."""
    try:
        value = text.strip()
        date_s, time_s = value[:10], value[11:]
        if len(value) < _MIN_CHARS or value[10] not in " T":
            raise ValueError
        day = dates.get(date_s)
        if day is None:
            day = dates[date_s] = datetime.date.fromisoformat(date_s).toordinal() - _EPOCH_DAY
        clock, zone = _split_zone(time_s)
        hms, _, frac = clock.partition(".")
        h, m, s = (int(x) for x in hms.split(":"))
        if not (0 <= h < 24 and 0 <= m < 60 and 0 <= s < 61 and len(frac) <= 9):
            raise ValueError
        frac_ns = int(frac.ljust(9, "0")) if frac else 0
        offset = _offset_s(zone)
    except (ValueError, KeyError):
        raise ValueError(f"{where}: TIMESTAMP {text!r} is not a {_FORMAT} time") from None
    seconds = ((day * 24 + h) * 60 + m) * 60 + s - offset
    return seconds * NS_PER_S + frac_ns


def bulk_ns(column: pd.Series) -> np.ndarray | None:
    """A column of TIMESTAMP strings as int64 nanoseconds (UTC), the values ``row_ns``
    gives; None when pandas does not take every value as such a time."""
    import pandas as pd  # only here: `servesim --help` does not load it

    text = column.str.strip()
    if len(text) == 0 or text.str.len().min() < _MIN_CHARS:
        return None
    try:
        parsed = pd.to_datetime(text, format="ISO8601", utc=True)
    except (ValueError, OverflowError, TypeError):
        return None
    if parsed.isna().any():
        return None
    return np.asarray(parsed.array.as_unit("ns").asi8, dtype=np.int64)
