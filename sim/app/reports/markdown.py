"""Markdown for the capacity reports (capacity.md of servesim plan, alone or across GPU
types): a DataFrame as a markdown table, and one markdown line's **bold** and `code` as
HTML for capacity.html."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd


def md_table(df: pd.DataFrame) -> str:
    """``df`` as a markdown table: floats to 4 significant digits, missing as '-',
    booleans as yes/no; "(none)" for no rows."""
    if df.empty:
        return "(none)"

    def fmt(x: Any) -> str:
        if isinstance(x, bool):
            return "yes" if x else "no"
        if isinstance(x, float):
            return "-" if x != x else f"{x:.4g}"
        return "-" if x is None else str(x).replace("|", "/")
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *rows])


def md_inline(text: str) -> str:
    """Escape, then render **bold** and `code` as HTML."""
    out = html.escape(text)
    while out.count("**") >= 2:
        out = out.replace("**", "<b>", 1).replace("**", "</b>", 1)
    while out.count("`") >= 2:
        out = out.replace("`", "<code>", 1).replace("`", "</code>", 1)
    return out
