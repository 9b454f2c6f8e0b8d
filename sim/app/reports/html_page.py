"""The page shell every HTML report shares (run reports, the slot diagram, validation):
one self-contained file that works offline, plotly.js inlined once in the head for all
its figures; and the HTML table its tables are made of. plotly is imported lazily, inside
``page``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from sim.app.runs.out_dir import GENERATOR_META

CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:8px 0 20px;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}tr.diff td{font-weight:bold;background:#fff6d5}
pre{font-size:13px;background:#f7f7f7;padding:8px;overflow-x:auto}
.figure{margin:12px 0 28px}h2{margin-top:28px;font-size:20px}
.row{display:flex;flex-wrap:wrap;gap:32px;align-items:flex-start}.note{font-size:12px;color:#666}"""


def page(title: str, parts: Sequence[str | Any]) -> str:
    """A self-contained HTML page: ``parts`` are HTML strings or plotly figures, in order.
    plotly.js is inlined once in the head; each figure is a div and an inline script. The
    head carries servesim's generator mark (sim/app/runs/out_dir.py), so a later command
    may replace the page."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    body = []
    n = 0
    for part in parts:
        if isinstance(part, str):
            body.append(part)
            continue
        n += 1
        body.append('<div class="figure">' + pio.to_html(
            part, full_html=False, include_plotlyjs=False, div_id=f"figure-{n}",
            config={"displaylogo": False, "responsive": True}) + "</div>")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"{GENERATOR_META}<title>{html.escape(title)}</title><style>{CSS}</style>\n"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script>\n</head><body>\n"
            f"<h1>{html.escape(title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n")


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, table_id: str = "",
           bold_rows: set[int] | None = None) -> str:
    """An HTML table; cells are escaped here."""
    idattr = f' id="{table_id}"' if table_id else ""
    out = [f"<table{idattr}><thead><tr>"
           + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        cls = ' class="diff"' if bold_rows and i in bold_rows else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)
