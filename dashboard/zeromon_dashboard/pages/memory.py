"""Memory: per chosen rank, memory over time stacked by category with the level, the capacity and the
OOM forecast's predicted peak; one row per rank (OOM risk, headroom, growth, steps to capacity, the
optimizer state still to come, allocator retries, OOMs, fragmentation); the peaks of all ranks side
by side (imbalance); the allocator's counters over time (GPU).

The ranks live in the URL (``/memory?ranks=0,3``); without them the page shows the worst rank and
the lowest other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dash_ag_grid as dag
from dash import html

from zeromon.views.memory import (
    MemoryRow,
    allocator_series,
    forecasts,
    memory_rows,
    memory_series,
    origin_ns,
    sample_columns,
)
from zeromon.views.run_data import RunData
from zeromon_dashboard.context import Context, failure_text
from zeromon_dashboard.figures.memory import MAX_RANK_ROWS, allocator_figure, imbalance_figure, stack_figure
from zeromon_dashboard.figures.style import LEVEL_COLOURS, empty
from zeromon_dashboard.pages.common import (
    chosen_ranks,
    drawn_store,
    graph,
    message,
    ranks_control,
    register_ranks_control,
    register_redraw,
    section,
)
from zeromon_dashboard.state import PageState

if TYPE_CHECKING:
    from dash import Dash

PAGE = "memory"
DEFAULT_RANKS = 2


def _bytes_column(field: str, name: str) -> dict[str, Any]:
    """Sorted by the number, shown as the TUI writes it (the record's ``{field}_text``)."""
    return {"field": field, "headerName": name, "type": "numericColumn",
            "valueFormatter": {"function": f"params.data.{field}_text"}}


_RISK_STYLE = {"styleConditions": [
    {"condition": f"params.data.risk_text == '{level}'",
     "style": {"backgroundColor": LEVEL_COLOURS[level], "color": "#fff" if level == "critical" else "#111"}}
    for level in ("critical", "warn")]}
COLUMNS = [
    {"field": "rank", "headerName": "rank", "type": "numericColumn", "minWidth": 70, "maxWidth": 80, "pinned": "left"},
    {"field": "device", "headerName": "device", "minWidth": 90},
    {"field": "risk", "headerName": "OOM risk", "valueFormatter": {"function": "params.data.risk_text"},
     "cellStyle": _RISK_STYLE, "minWidth": 90},
    _bytes_column("current", "current"),
    _bytes_column("peak", "peak"),
    _bytes_column("predicted", "predicted peak"),
    _bytes_column("capacity", "capacity"),
    _bytes_column("headroom", "headroom"),
    _bytes_column("growth", "growth / step"),
    _bytes_column("steps_to_capacity", "steps to capacity"),
    _bytes_column("optimizer", "optimizer to come"),
    _bytes_column("retries", "alloc retries"),
    _bytes_column("ooms", "OOMs"),
    _bytes_column("fragmentation", "fragmentation"),
]


def table_records(rows: Sequence[MemoryRow]) -> list[dict[str, Any]]:
    """One record per rank: each column's number (sorting) and ``{column}_text`` (shown)."""
    out = []
    for r in rows:
        t = r.texts
        values: dict[str, tuple[Any, str]] = {
            "risk": (r.risk.rank if r.risk is not None else None, t["OOM risk"]),
            "current": (r.current_bytes, t["current"]), "peak": (r.peak_bytes, t["peak"]),
            "predicted": (r.predicted_peak_bytes, t["predicted peak"]),
            "capacity": (r.capacity_bytes, t["capacity"]), "headroom": (r.headroom_bytes, t["headroom"]),
            "growth": (r.growth_bytes_per_step, t["growth/step"]),
            "steps_to_capacity": (r.steps_to_capacity, t["steps to capacity"]),
            "optimizer": (r.optimizer_to_come_bytes, t["optimizer to come"]),
            "retries": (r.alloc_retries, t["alloc retries"]), "ooms": (r.num_ooms, t["OOMs"]),
            "fragmentation": (r.fragmentation_bytes, t["fragmentation"])}
        record: dict[str, Any] = {"id": str(r.rank), "rank": r.rank, "device": r.device}
        for key, (number, text) in values.items():
            record[key], record[f"{key}_text"] = number, text
        out.append(record)
    return out


def _draw(state: PageState, data: RunData) -> tuple[Any, ...]:
    ranks = chosen_ranks(state, data, DEFAULT_RANKS)
    shown = [r for r in ranks if r in data.histories and data.histories[r].memory][:MAX_RANK_ROWS]
    origin = origin_ns(data.histories)
    chosen_forecasts = forecasts(data)
    series, allocator = [], []
    for r in shown if origin is not None else ():
        assert origin is not None
        columns = sample_columns(data.histories[r])  # once for both figures
        series.append(memory_series(data.histories[r], origin, chosen_forecasts.get(r), columns))
        allocator.append(allocator_series(data.histories[r], origin, columns))
    rows = memory_rows(data)
    return (stack_figure(series, len(ranks)), table_records(rows), imbalance_figure(rows),
            allocator_figure(allocator, len(ranks)))


def _fallback(exc: Exception) -> tuple[Any, ...]:
    text = failure_text(exc)
    return (empty("Memory over time by category", text), [], empty("Peak memory per rank", text),
            empty("Allocator: fragmentation, retries and OOMs", text))


OUTPUTS = (("memory-stack", "figure"), ("memory-table", "rowData"), ("memory-imbalance", "figure"),
           ("memory-allocator", "figure"))


def layout(state: PageState, data: RunData, ctx: Context) -> Any:
    stack, records, imbalance, allocator = _draw(state, data)
    grid = dag.AgGrid(id="memory-table", rowData=records, columnDefs=COLUMNS, columnSize="sizeToFit",
                      getRowId="params.data.id",
                      defaultColDef={"sortable": True, "resizable": True, "wrapHeaderText": True,
                                     "autoHeaderHeight": True, "minWidth": 80},
                      dashGridOptions={"domLayout": "autoHeight" if len(records) <= 32 else "normal"},
                      style={"height": None} if len(records) <= 32 else {"height": "600px"}, className="ag-theme-alpine")
    note = ([message("No rank has reported memory yet: the page fills in with the first sample.",
                     element_id="memory-none")] if not any(h.memory for h in data.histories.values()) else [])
    return html.Div([
        drawn_store(PAGE, data, state),
        html.Div([ranks_control(PAGE, data, chosen_ranks(state, data, DEFAULT_RANKS))], className="controls"),
        *note,
        section("Over time", graph("memory-stack", stack)),
        section("Ranks compared", grid, graph("memory-imbalance", imbalance)),
        section("Allocator", graph("memory-allocator", allocator)),
    ], id="page-memory")


def register(app: Dash, ctx: Context) -> None:
    register_ranks_control(app, ctx, PAGE, DEFAULT_RANKS)
    register_redraw(app, ctx, PAGE, OUTPUTS, _draw, _fallback)
