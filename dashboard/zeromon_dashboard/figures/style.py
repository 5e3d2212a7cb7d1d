"""Colours and the small layout pieces every figure shares."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from zeromon.exporters.html_report import MEANING_COLOURS, OTHER_COLOURS, PHASE_COLOURS

__all__ = ["MEANING_COLOURS", "OTHER_COLOURS", "PHASE_COLOURS", "LEVEL_COLOURS", "empty", "base_layout", "unit"]

# ok / warn / critical / no data, readable without colour too: the cells carry text.
LEVEL_COLOURS = {"ok": "#4daf4a", "warn": "#ff9f1c", "critical": "#d62728", "none": "#d9d9d9", "stale": "#969696"}
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12}


def base_layout(fig: go.Figure, title: str, height: int | None = None, **more: Any) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0, "xanchor": "left"}, font=FONT, template="plotly_white",
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
