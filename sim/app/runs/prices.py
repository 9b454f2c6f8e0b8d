"""GPU prices for ``servesim plan --gpu a,b,c``: the shipped table of public on-demand
prices (calibration/data/gpu_prices.json: US dollars per GPU per hour, each row with
its provider, product, date and source), a user's price file over it, and
``--price GPU=USD_PER_HOUR`` over both.

A price file is JSON: either the shipped form (``{"prices": [{"gpu": ..., "usd_per_gpu_hour":
...}, ...]}``, provider, product, date and source optional) or a plain mapping
``{"h100-sxm": 3.49, ...}``. GPU names are gpus.json's presets or their aliases, read
as the preset's name. Every error is a ValueError naming the option.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibration.gpus import SPEC_FILE_SUFFIXES, get_gpu
from calibration.specs import load_data

PRICE_FILE = "gpu_prices.json"
"""The shipped table, in calibration/data."""


@dataclass(frozen=True)
class GpuPrice:
    """One GPU's price: ``usd_per_gpu_hour`` (> 0), and where it comes from."""

    gpu: str
    usd_per_gpu_hour: float
    provider: str = ""
    product: str = ""
    date: str = ""
    source: str = ""

    def describe(self) -> str:
        """'$3.49/GPU-hour (RunPod Secure Cloud, H100 SXM 80GB, 2026-09-25)'."""
        where = ", ".join(x for x in (self.provider, self.product, self.date) if x)
        return f"${self.usd_per_gpu_hour:,.4g}/GPU-hour" + (f" ({where})" if where else "")


def _gpu_name(name: Any, option: str) -> str:
    """The preset name of ``name`` (an alias reads as its preset); ValueError naming
    ``option`` for a GPU that is no preset (a spec file has no public price)."""
    text = str(name)
    try:
        if text.lower().endswith(SPEC_FILE_SUFFIXES):
            raise ValueError(f"a GPU spec file ({text}) has no public price; name a preset")
        return get_gpu(text).name
    except ValueError as e:
        raise ValueError(f"{option}: {e}") from None


def _usd(value: Any, gpu: str, option: str) -> float:
    """A price > 0 and finite, in US dollars per GPU-hour."""
    try:
        usd = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{option}: {gpu}: expected US dollars per GPU-hour, got "
                         f"{value!r}") from None
    if isinstance(value, bool) or not (math.isfinite(usd) and usd > 0):
        raise ValueError(f"{option}: {gpu}: a price must be a number > 0 (US dollars per "
                         f"GPU-hour), got {value!r}")
    return usd


def _rows(data: Any, option: str) -> dict[str, GpuPrice]:
    """The prices of one parsed file (either form), by preset name."""
    if isinstance(data, Mapping) and "prices" in data:
        rows = data["prices"]
        if not isinstance(rows, list):
            raise ValueError(f"{option}: 'prices' must be a list of rows")
        out = {}
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping) or "gpu" not in row or "usd_per_gpu_hour" not in row:
                raise ValueError(f"{option}: prices[{i}] needs 'gpu' and 'usd_per_gpu_hour'")
            gpu = _gpu_name(row["gpu"], option)
            out[gpu] = GpuPrice(gpu, _usd(row["usd_per_gpu_hour"], gpu, option),
                                *(str(row.get(k, "")) for k in ("provider", "product",
                                                                "date", "source")))
        return out
    if isinstance(data, Mapping):
        named = {_gpu_name(k, option): v for k, v in data.items() if not str(k).startswith("_")}
        return {g: GpuPrice(g, _usd(v, g, option)) for g, v in named.items()}
    raise ValueError(f"{option}: expected a JSON object of prices, got {type(data).__name__}")


def shipped_prices() -> dict[str, GpuPrice]:
    """calibration/data/gpu_prices.json, by preset name."""
    return _rows(load_data(PRICE_FILE), PRICE_FILE)


def read_price_file(path: Path | str) -> dict[str, GpuPrice]:
    """A user's price file (JSON, either form), by preset name; ValueError naming
    --price-file for a missing, unreadable or malformed file."""
    option = f"--price-file {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"{option}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{option}: not UTF-8 text, as JSON is ({e.reason} at byte "
                         f"{e.start})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{option}: not valid JSON ({e})") from None
    source = f"--price-file {Path(path).name}"
    return {g: p if p.source else GpuPrice(g, p.usd_per_gpu_hour, p.provider, p.product,
                                           p.date, source)
            for g, p in _rows(data, option).items()}


def parse_price_flags(flags: Iterable[str]) -> dict[str, GpuPrice]:
    """``--price GPU=USD_PER_HOUR`` values, by preset name (the last of a repeated GPU
    wins); ValueError naming --price for a malformed one."""
    out = {}
    for flag in flags:
        name, sep, value = flag.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--price: expected GPU=USD_PER_HOUR (e.g. h100-sxm=3.49), "
                             f"got {flag!r}")
        gpu = _gpu_name(name.strip(), "--price")
        out[gpu] = GpuPrice(gpu, _usd(value.strip(), gpu, "--price"), source="--price")
    return out


def price_table(price_file: Path | str | None = None,
                flags: Iterable[str] = ()) -> dict[str, GpuPrice]:
    """The prices a plan uses, by preset name: the shipped table, then the file's rows
    over it, then the flags over both."""
    table = shipped_prices()
    if price_file is not None:
        table.update(read_price_file(price_file))
    table.update(parse_price_flags(flags))
    return table
