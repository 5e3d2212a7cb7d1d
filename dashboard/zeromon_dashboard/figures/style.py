"""Colours and the small layout pieces every figure shares."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from zeromon.exporters.html_report import MEANING_COLOURS, OTHER_COLOURS, PHASE_COLOURS

__all__ = ["blank", "MEANING_COLOURS", "OTHER_COLOURS", "PHASE_COLOURS", "LEVEL_COLOURS", "empty", "base_layout", "unit",
           "layout_of", "figure_of", "rows_layout", "axes_of", "axis_key"]

# ok / warn / critical / no data, readable without colour too: the cells carry text.
LEVEL_COLOURS = {"ok": "#4daf4a", "warn": "#ff9f1c", "critical": "#d62728", "none": "#d9d9d9", "stale": "#969696"}
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12}
_GRID = "#ebf0f8"
# plotly_white's look (white background, light grid, plotly's colours), built once: naming
# template="plotly_white" builds and validates the whole template in every figure, most of a live
# page's refresh; this one costs a fraction of that.
TEMPLATE = go.layout.Template(layout={
    "plot_bgcolor": "white", "paper_bgcolor": "white", "colorway": pio.templates["plotly"].layout.colorway,
    "xaxis": {"gridcolor": _GRID, "zerolinecolor": _GRID, "linecolor": _GRID, "automargin": True},
    "yaxis": {"gridcolor": _GRID, "zerolinecolor": _GRID, "linecolor": _GRID, "automargin": True},
    "hoverlabel": {"align": "left"}})


_TEMPLATE_DICT = {"layout": TEMPLATE.layout.to_plotly_json()}


def blank() -> go.Figure:
    """An empty figure on TEMPLATE (make_subplots' own would build plotly's default template, every time)."""
    return go.Figure(layout={"template": TEMPLATE})


def base_layout(fig: go.Figure, title: str, height: int | None = None, **more: Any) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0, "xanchor": "left"}, font=FONT, template=TEMPLATE,
                      margin={"l": 60, "r": 20, "t": 50, "b": 50}, **({"height": height} if height else {}), **more)
    return fig


def layout_of(title: str, height: int | None = None, **more: Any) -> dict[str, Any]:
    """base_layout's layout as a plain dict, for figure_of."""
    return {"title": {"text": title, "x": 0, "xanchor": "left"}, "font": FONT, "template": _TEMPLATE_DICT,
            "margin": {"l": 60, "r": 20, "t": 50, "b": 50}, **({"height": height} if height else {}), **more}


def figure_of(data: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A figure made from plain dicts without plotly's validation, for the figures a live page redraws
    every second: building the Memory page's figures object by object (add_trace, update_layout,
    make_subplots) is most of its refresh, and from dicts a small part (tests/bench/bench_dashboard.py).
    The dicts are the figure's JSON, so what the page receives is the same; the
    tests that build them read the figure as ever."""
    return go.Figure({"data": data, "layout": layout}, _validate=False)


@lru_cache(maxsize=64)
def _rows_layout(heights: tuple[float, ...], spacing: float) -> dict[str, Any]:
    """make_subplots' layout (shared x axes, one column), made once for each shape: its domains,
    axis links and title annotations (make_subplots is slow, and a page redraws every second)."""
    from plotly.subplots import make_subplots

    titles = [f"title {i}" for i in range(len(heights))]  # placeholders, one annotation each
    fig = make_subplots(figure=blank(), rows=len(heights), cols=1, shared_xaxes=True, vertical_spacing=spacing,
                        row_heights=list(heights), subplot_titles=titles)
    layout: dict[str, Any] = fig.layout.to_plotly_json()
    layout.pop("template", None)
    return layout


def rows_layout(heights: Sequence[float], spacing: float, titles: Sequence[str]) -> dict[str, Any]:
    """The layout of a figure of ``len(heights)`` rows sharing their x axis, each titled: the axes
    (``xaxis``, ``xaxis2``, ...) and the title annotations, left-aligned, to be updated."""
    layout = copy.deepcopy(_rows_layout(tuple(heights), spacing))
    for annotation, text in zip(layout["annotations"], titles, strict=True):
        annotation.update(text=text, font={"size": 12}, x=0, xanchor="left")
    return layout


def axes_of(row: int) -> tuple[str, str]:
    """The x and y axis of a row of rows_layout, as a trace names them (``x``, ``y``; ``x2``, ``y2``)."""
    suffix = "" if row == 1 else str(row)
    return "x" + suffix, "y" + suffix


def axis_key(axis: str) -> str:
    """The layout's key of an axis a trace names: ``x2`` -> ``xaxis2``."""
    return axis[0] + "axis" + axis[1:]


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
