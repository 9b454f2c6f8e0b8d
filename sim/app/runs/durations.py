"""Durations as users write them on the command line (``90``, ``10m``, ``1.5h``, ``1d``):
--parallel-windows, --warmup and plan's --by-window."""

from __future__ import annotations

import math
import re

#: Seconds per unit of a duration's suffix.
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def parse_duration(text: str, option: str, positive: bool = False) -> float:
    """Seconds of ``text``: a number with an optional unit s, m, h or d. Raises ValueError
    naming ``option`` for anything else, a negative or infinite one, or with ``positive``
    a zero one."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([smhd]?)\s*", text, re.I)
    if m is None:
        raise ValueError(f"{option} must be a duration: a number of seconds, or with a "
                         f"unit s, m, h or d (e.g. 90, 10m, 1h), got {text!r}")
    seconds = float(m.group(1)) * _UNITS[m.group(2).lower() or "s"]
    if not math.isfinite(seconds):
        raise ValueError(f"{option} must be finite, got {text!r}")
    if positive and not seconds > 0:
        raise ValueError(f"{option} must be a duration > 0 (e.g. 1h, 30m or 900), got "
                         f"{text!r}")
    return seconds
