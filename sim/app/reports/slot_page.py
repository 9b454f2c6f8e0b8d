"""The slot diagram's HTML page and its plotly figure (plotly imported lazily): one
horizontal bar per cell of a SlotGrid (sim/app/reports/diagram.py), held-idle cells
hatched, with the text rendering of each grid under its figure."""

from __future__ import annotations

from typing import Any

from sim.app.reports.diagram import SlotGrid, legend_text, render_text

_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b",
            "#9d755d", "#ff9da6", "#bab0ac")


def figure(grid: SlotGrid) -> Any:
    """A plotly Figure of one grid: one horizontal bar per cell; useful cells in their
    request's colour with its letter, idle cells hatched, empty cells outlined."""
    import plotly.graph_objects as go

    colour = {lab: _PALETTE[i % len(_PALETTE)] for i, (lab, _) in enumerate(grid.legend)}
    groups: dict[str, dict[str, list[Any]]] = {
        k: {"x": [], "y": [], "text": [], "hover": [], "colour": []}
        for k in ("useful", "idle", "empty")
    }
    for slot, row in enumerate(grid.cells):
        for step, cell in enumerate(row):
            kind = "empty" if cell is None else "useful" if cell.num_tokens else "idle"
            g = groups[kind]
            g["x"].append(step)
            g["y"].append(slot + 1)
            g["text"].append("" if cell is None or kind == "idle" else cell.label)
            who = "" if cell is None else f"{cell.label} = request {cell.request_id}, "
            g["hover"].append(f"step {step + grid.first_step}, slot {slot + 1}: {who}"
                              + (f"{cell.num_tokens} tokens" if cell else "empty"))
            g["colour"].append("#ffffff" if cell is None else colour[cell.label])
    fig = go.Figure()
    styles = {
        "useful": {"pattern": {"shape": ""}, "name": "useful (computing)"},
        # Hatch lines in the holder's colour on white; an array colour in "overlay" mode
        # makes plotly.js warn when it draws the legend swatch.
        "idle": {"pattern": {"shape": "/", "fillmode": "replace", "bgcolor": "#ffffff",
                             "fgcolor": groups["idle"]["colour"], "solidity": 0.4},
                 "name": "held idle (hatched)"},
        "empty": {"pattern": {"shape": ""}, "name": "empty"},
    }
    for kind, g in groups.items():
        st = styles[kind]
        fig.add_trace(go.Bar(
            x=[1] * len(g["x"]), base=g["x"], y=g["y"], orientation="h", width=0.92,
            name=f"{st['name']}: {getattr(grid.shown, kind)}/{grid.shown.total}",
            text=g["text"], textposition="inside", insidetextanchor="middle",
            hovertext=g["hover"], hoverinfo="text",
            marker={"color": g["colour"], "pattern": st["pattern"],
                    "line": {"color": "#999999", "width": 1}},
        ))
    title = f"{grid.title}: {grid.shown.fractions_text()}"
    note = grid.cut_note()
    if note:
        title += f"<br><sup>{note}</sup>"
    fig.update_layout(
        title={"text": title}, barmode="overlay", plot_bgcolor="#ffffff",
        height=170 + 28 * max(grid.shown_slots, 1), margin={"l": 60, "r": 20, "t": 70, "b": 80},
        legend={"orientation": "h", "yanchor": "top", "x": 0,
                "y": -60 / (28 * max(grid.shown_slots, 1))},
        xaxis={"title": "step", "range": [0, max(grid.shown_steps, 1)], "dtick": 1,
               "tickvals": [i + 0.5 for i in range(grid.shown_steps)],
               "ticktext": [str(i + grid.first_step) for i in range(grid.shown_steps)]},
        yaxis={"title": "slot", "range": [grid.shown_slots + 0.5, 0.5],
               "tickvals": list(range(1, grid.shown_slots + 1))},
        uniformtext={"minsize": 8, "mode": "hide"},
    )
    return fig


def render_html(grids: list[SlotGrid], *, idle_letters: bool = False) -> str:
    """A self-contained HTML page: one figure per grid (plotly.js inlined once) and the
    text rendering of each under it."""
    import html

    from sim.app.reports.html_page import page

    parts: list[Any] = [
        "<p>One row per batch slot, one column per engine step. Coloured cell with a letter:"
        " the request computed tokens in its slot (useful); hatched: the request holds the "
        "slot without computing (idle); white: empty slot. Text rendering: "
        f"{html.escape(legend_text(idle_letters))}</p>"]
    for g in grids:
        text = "\n".join(render_text(g, idle_letters=idle_letters))
        parts += [figure(g), f"<pre>{html.escape(text)}</pre>"]
    return page("servesim slot diagram", parts)
