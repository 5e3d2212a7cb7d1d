"""Trace: `zeromon report --trace DIR` in the browser, for PyTorch profiler (Kineto) traces: its per-rank
table (overlap, exposed communication per iteration and in all, HTA's temporal breakdown) with the
notes on what it leaves out, each rank's temporal breakdown, its overlap and exposed communication,
and both per iteration. The numbers are the report's (zeromon.views.trace and the report's figures).
Traces do not change: the page is drawn once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dash_ag_grid as dag
from dash import html

from zeromon.analysis.trace_overlap import RankTraceOverlap
from zeromon.views.run_data import RunData
from zeromon.views.trace import TABLE_LEGEND, trace_notes, trace_rows
from zeromon_dashboard.context import Context
from zeromon_dashboard.figures.trace import trace_page_figures
from zeromon_dashboard.pages.common import graph, message, section
from zeromon_dashboard.state import PageState

if TYPE_CHECKING:
    from dash import Dash

PAGE = "trace"


def _number(decimals: int, suffix: str = "") -> dict[str, str]:
    """A cell shown as the text report shows it ('-' where there is no number); sorted as a number."""
    return {"function": f"params.value == null ? '-' : d3.format('.{decimals}f')(params.value) + '{suffix}'"}


# The columns of `zeromon report --trace`, with its headers.
COLUMNS = [
    {"field": "rank", "headerName": "rank", "type": "numericColumn", "maxWidth": 90},
    {"field": "iterations", "headerName": "iterations", "type": "numericColumn"},
    {"field": "overlap_pct", "headerName": "overlap", "type": "numericColumn", "valueFormatter": _number(1, "%")},
    {"field": "exposed_ms_per_iteration", "headerName": "exposed ms/iter", "type": "numericColumn",
     "valueFormatter": _number(1)},
    {"field": "exposed_ms_total", "headerName": "exposed ms total", "type": "numericColumn",
     "valueFormatter": _number(1)},
    {"field": "idle_pct", "headerName": "idle", "type": "numericColumn", "valueFormatter": _number(1, "%")},
    {"field": "compute_pct", "headerName": "compute", "type": "numericColumn", "valueFormatter": _number(1, "%")},
    {"field": "non_compute_pct", "headerName": "non-compute", "type": "numericColumn",
     "valueFormatter": _number(1, "%")},
]


def table_records(traces: Sequence[RankTraceOverlap]) -> list[dict[str, Any]]:
    """The table's rows at full precision (the grid rounds them as the text report does)."""
    return [{"rank": r.rank, "iterations": r.iterations, "overlap_pct": r.overlap_pct,
             "exposed_ms_per_iteration": r.exposed_ms_per_iteration, "exposed_ms_total": r.exposed_ms_total,
             "idle_pct": r.idle_pct, "compute_pct": r.compute_pct, "non_compute_pct": r.non_compute_pct}
            for r in trace_rows(traces)]


def notes(traces: Sequence[RankTraceOverlap]) -> html.Div:
    return html.Div([html.P(line) for line in (*TABLE_LEGEND, *trace_notes(traces))], id="trace-notes",
                    className="notes")


def _grid_height_px(rows: int) -> int:
    """The rows' height (the theme's 42 px a row under a 50 px header), scrolled past 12 rows: AG Grid's
    autoHeight keeps room for ~4 rows, too much under one or two."""
    return 50 + 42 * min(max(rows, 1), 12) + 2


def _summary(data: RunData) -> str:
    n = len(data.traces)
    world = max((r.world_size for r in data.traces if r.world_size), default=None)
    return (f"{n} rank{'s' if n != 1 else ''}" + (f" of a world of {world}" if world else "")
            + ": GPU kernels only, overlap and temporal breakdown as Holistic Trace Analysis defines them.")


def layout(state: PageState, data: RunData, ctx: Context) -> Any:
    if not data.traces:
        return html.Div(message("No profiler trace was read: start `zeromon dashboard --trace DIR` with a folder "
                                "of PyTorch profiler traces.", element_id="trace-none"), id="page-trace")
    figures = trace_page_figures(data.traces)
    grid = dag.AgGrid(id="trace-table", rowData=table_records(data.traces), columnDefs=COLUMNS,
                      columnSize="sizeToFit", defaultColDef={"sortable": True, "resizable": True},
                      style={"height": f"{_grid_height_px(len(data.traces))}px"}, className="ag-theme-alpine")
    return html.Div([
        message(_summary(data), element_id="trace-summary"),
        section("Per rank", grid, notes(data.traces)),
        section("Temporal breakdown", graph("trace-breakdown", figures["trace-breakdown"])),
        section("Overlap and exposed communication", graph("trace-overlap", figures["trace-overlap"]),
                graph("trace-iterations", figures["trace-iterations"])),
    ], id="page-trace")


def register(app: Dash, ctx: Context) -> None:
    """Nothing to redraw: traces are read once (the app's page callback draws the layout, guarded)."""
