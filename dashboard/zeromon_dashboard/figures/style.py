"""Colours and the small layout pieces every figure shares."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from zeromon.exporters.html_report import MEANING_COLOURS, OTHER_COLOURS, PHASE_COLOURS

__all__ = ["blank", "MEANING_COLOURS", "OTHER_COLOURS", "PHASE_COLOURS", "LEVEL_COLOURS", "empty", "base_layout", "unit"]

# ok / warn / critical / no data, readable without colour too: the cells carry text.
LEVEL_COLOURS = {"ok": "#4daf4a", "warn": "#ff9f1c", "critical": "#d62728", "none": "#d9d9d9", "stale": "#969696"}
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12}
_GRID = "#ebf0f8"
# plotly_white's look (white background, light grid, plotly's colours), built once: naming
# template="plotly_white" builds and validates the whole template in every figure, ~10 ms each
# (most of a live page's refresh); this one costs ~0.9 ms.
TEMPLATE = go.layout.Template(layout={
    "plot_bgcolor": "white", "paper_bgcolor": "white", "colorway": pio.templates["plotly"].layout.colorway,
    "xaxis": {"gridcolor": _GRID, "zerolinecolor": _GRID, "linecolor": _GRID, "automargin": True},
    "yaxis": {"gridcolor": _GRID, "zerolinecolor": _GRID, "linecolor": _GRID, "automargin": True},
    "hoverlabel": {"align": "left"}})


def blank() -> go.Figure:
    """An empty figure on TEMPLATE (make_subplots' own would build plotly's default template: ~10 ms)."""
    return go.Figure(layout={"template": TEMPLATE})


def base_layout(fig: go.Figure, title: str, height: int | None = None, **more: Any) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0, "xanchor": "left"}, font=FONT, template=TEMPLATE,
                      margin={"l": 60, "r": 20, "t": 50, "b": 50}, **({"height": height} if height else {}), **more)
    return fig


def empty(title: str, why: str, height: int | None = 300) -> go.Figure:
    """A figure with nothing to draw says why, in its middle."""
    fig = go.Figure()
    base_layout(fig, title, height)
    fig.update_layout(xaxis={"visible": False}, yaxis={"visible": False},
                      annotations=[{"text": why, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5,
                                    "y": 0.5, "font": {"size": 14, "color": "#555"}}])
    return fig


def unit(largest_bytes: float) -> tuple[str, int]:
    """The binary unit that shows values up to ``largest_bytes`` with a few digits."""
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest_bytes >= size:
            return name, size
    return "B", 1
