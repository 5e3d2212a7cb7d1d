"""The rank grid: one cell per rank, coloured by OOM risk or by exposed communication."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from zeromon.analysis.comm_advice import EXPOSED_SHARE_CRITICAL
from zeromon.analysis.findings import Severity
from zeromon.views.overview import RankCell, grid_shape
from zeromon_dashboard.figures.style import LEVEL_COLOURS, empty, figure_of, layout_of

_RISK_Z = {None: 0, Severity.OK: 1, Severity.INFO: 1, Severity.WARN: 2, Severity.CRITICAL: 3}
# Discrete colours for z = 0 (no data), 1 ok, 2 warn, 3 critical: each a band of the 0-3 scale.
_RISK_SCALE = [[0.0, LEVEL_COLOURS["none"]], [0.125, LEVEL_COLOURS["none"]], [0.125, LEVEL_COLOURS["ok"]],
               [0.5, LEVEL_COLOURS["ok"]], [0.5, LEVEL_COLOURS["warn"]], [0.875, LEVEL_COLOURS["warn"]],
               [0.875, LEVEL_COLOURS["critical"]], [1.0, LEVEL_COLOURS["critical"]]]
_EXPOSED_SCALE = [[0.0, "#f7fbff"], [1 / 3, "#fdd49e"], [2 / 3, "#fc8d59"], [1.0, "#b30000"]]
STALE_MARK = "○"


def _matrix(cells: Sequence[RankCell], value: object) -> tuple[list[list[object]], list[list[str]], list[list[str]]]:
    rows, cols = grid_shape(len(cells))
    z: list[list[object]] = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    for cell in cells:
        z[cell.row][cell.col] = value(cell)  # type: ignore[operator]
        hover[cell.row][cell.col] = cell.hover
    return z, text, hover


def _label(cell: RankCell, share: float | None, small: bool) -> str:
    mark = "" if cell.answering else STALE_MARK
    if small:
        return f"{mark}{cell.rank}"
    return f"{mark}{cell.rank}<br>{'-' if share is None else f'{share:.0%}'}"


def rank_grid(cells: Sequence[RankCell], colour_by: str = "risk") -> go.Figure:
    """``colour_by``: 'risk' (OOM risk; the text is the peak's share of capacity) or 'exposed' (the
    share of step time that is exposed communication, red from EXPOSED_SHARE_CRITICAL up)."""
    title = ("OOM risk per rank (peak memory / capacity)" if colour_by == "risk"
             else "Exposed communication per rank (share of step time)")
    if not cells:
        return empty(title, "no rank has reported yet")
    rows, cols = grid_shape(len(cells))
    small = len(cells) > 64
    if colour_by == "risk":
        z, text, hover = _matrix(cells, lambda c: _RISK_Z[c.risk] if c.used_share is not None or c.risk else 0)
        for c in cells:
            text[c.row][c.col] = _label(c, c.used_share, small)
        heat: dict[str, object] = {"z": z, "zmin": 0, "zmax": 3, "colorscale": _RISK_SCALE, "showscale": False}
    else:
        z, text, hover = _matrix(cells, lambda c: c.exposed_share)
        for c in cells:
            text[c.row][c.col] = _label(c, c.exposed_share, small)
        heat = {"z": z, "zmin": 0, "zmax": EXPOSED_SHARE_CRITICAL, "colorscale": _EXPOSED_SCALE,
                "colorbar": {"title": {"text": "exposed"}, "tickformat": ".0%", "len": 0.9}}
    heat.update(type="heatmap", text=text, texttemplate="%{text}", hovertext=hover, hoverinfo="text", xgap=2, ygap=2,
                textfont={"size": 9 if small else 11})
    cell_px = 26 if small else 56
    layout = layout_of(title, height=max(160, 70 + rows * cell_px))
    layout.update(xaxis={"visible": False, "constrain": "domain"},
                  yaxis={"visible": False, "autorange": "reversed", "scaleanchor": "x"},
                  margin={"l": 10, "r": 10, "t": 40, "b": 10}, meta={"ranks": len(cells), "columns": cols})
    return figure_of([heat], layout)  # as dicts: the live Overview redraws both grids every second
