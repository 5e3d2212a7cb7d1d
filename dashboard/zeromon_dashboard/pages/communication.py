"""Communication: one step's timeline on the chosen ranks (phases, collectives by ZeRO meaning, overlap,
exposed communication, waits), exposed communication and overlap per step over the run, bus bandwidth
by op and message size against the peak, and bytes per step by meaning.

The ranks and the step live in the URL (``/communication?ranks=0,3&step=12``); without a step the
page shows a recording's median step after the first, or live the newest step every chosen rank has
finished."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dash
import dash_ag_grid as dag
from dash import Input, Output, State, dcc, html

from zeromon.analysis.bandwidth import (
    BandwidthRow,
    bandwidth_samples,
    bucket_label,
    merge_samples,
    table_of_samples,
)
from zeromon.views.fleet import short_bytes
from zeromon.views.run_data import RunData
from zeromon.views.timeline import default_step, step_bytes, step_choices, step_series, step_timeline
from zeromon_dashboard.context import Context, failure_text, guarded
from zeromon_dashboard.figures.communication import (
    bandwidth_figure,
    bytes_figure,
    per_step_figure,
    timeline_figure,
)
from zeromon_dashboard.figures.style import empty
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
from zeromon_dashboard.state import PageState, state_search

if TYPE_CHECKING:
    from dash import Dash

PAGE = "communication"
STEP_ID = "communication-step"

COLUMNS = [
    {"field": "op", "headerName": "op"},
    {"field": "group", "headerName": "group", "type": "numericColumn", "maxWidth": 100},
    {"field": "size", "headerName": "message size", "sortable": False},
    {"field": "calls", "headerName": "calls", "type": "numericColumn"},
    {"field": "total", "headerName": "bytes", "sortable": False},
    {"field": "time_ms", "headerName": "median time (ms)", "type": "numericColumn"},
    {"field": "algbw_gbs", "headerName": "algbw (GB/s)", "type": "numericColumn"},
    {"field": "busbw_gbs", "headerName": "busbw (GB/s)", "type": "numericColumn"},
    {"field": "busbw_p10_gbs", "headerName": "busbw p10 (GB/s)", "type": "numericColumn"},
    {"field": "peak_pct", "headerName": "of peak (%)", "type": "numericColumn"},
]


def bandwidth_rows(data: RunData, peak_busbw: float | None) -> tuple[BandwidthRow, ...]:
    """The report's table for a recording; else the table of the collectives the histories hold."""
    if data.report is not None:
        return data.report.bandwidth
    columns = [h.collectives for h in data.histories.values() if h.collectives is not None and len(h.collectives)]
    return table_of_samples(merge_samples(bandwidth_samples(c) for c in columns), peak_busbw)


def peak_of(data: RunData, feed: Any) -> float | None:
    """The peak busbw given to `zeromon dashboard --peak-busbw`: the report's rows carry it as a share."""
    if data.report is not None:
        for row in data.report.bandwidth:
            if row.peak_share:
                return row.median_busbw / row.peak_share
    peak = getattr(feed, "peak_busbw", None)
    return float(peak) if peak else None


def table_records(rows: Sequence[BandwidthRow]) -> list[dict[str, Any]]:
    return [{"op": r.op, "group": r.group_size, "size": bucket_label(r.size_bucket_bytes), "calls": r.count,
             "total": short_bytes(r.total_bytes), "time_ms": round(r.median_time_s * 1e3, 3),
             "algbw_gbs": round(r.median_algbw / 1e9, 3), "busbw_gbs": round(r.median_busbw / 1e9, 3),
             "busbw_p10_gbs": round(r.busbw_p10 / 1e9, 3),
             "peak_pct": None if r.peak_share is None else round(100 * r.peak_share, 1)} for r in rows]


def shown_step(state: PageState, data: RunData) -> int | None:
    """The URL's step, else the page's default for the chosen ranks."""
    if state.step is not None:
        return state.step
    return default_step(data.histories, chosen_ranks(state, data))


def _step_control(data: RunData, ranks: Sequence[int], step: int | None) -> tuple[int | None, int, str]:
    """The step input's value, its largest value, and the range it says (all shown from 1)."""
    span = step_choices(data.histories, ranks)
    if span is None:
        return None, 1, "no step yet"
    return (None if step is None else step + 1), span[1] + 1, f"steps {span[0] + 1}-{span[1] + 1}"


def _step_parts(state: PageState, data: RunData) -> tuple[tuple[int, ...], Any, Any, int | None, int, str]:
    """What shows the step: the chosen ranks, the timeline, the per-step figure (its marker), the
    step control's value, largest value and range."""
    ranks = chosen_ranks(state, data)
    step = shown_step(state, data)
    if step is None:
        timeline = empty("One step: computation and communication", "no step summarized yet on the chosen ranks")
    else:
        timeline = timeline_figure(step_timeline(data.histories, ranks, step))
    series = [step_series(data, r) for r in ranks]
    value, largest, span = _step_control(data, ranks, step)
    return ranks, timeline, per_step_figure(series, step), value, largest, span


def _draw(state: PageState, data: RunData, peak_busbw: float | None) -> tuple[Any, ...]:
    ranks, timeline, per_step, value, largest, span = _step_parts(state, data)
    rows = bandwidth_rows(data, peak_busbw)
    first = data.histories.get(ranks[0]) if ranks else None
    return (timeline, per_step, bandwidth_figure(rows, peak_busbw), table_records(rows),
            bytes_figure(step_bytes(first) if first is not None else None), value, largest, span)


def _draw_step(state: PageState, data: RunData) -> tuple[Any, ...]:
    """Only what shows the step: the timeline, the per-step figure's marker, the step control."""
    _, timeline, per_step, value, largest, span = _step_parts(state, data)
    return tuple(dash.no_update if i in _STEP_FREE else v for (i, _), v in zip(OUTPUTS, (
        timeline, per_step, None, None, None, value, largest, span), strict=True))


def _fallback(exc: Exception) -> tuple[Any, ...]:
    text = failure_text(exc)
    return (empty("One step: computation and communication", text), empty("Exposed communication per step", text),
            empty("Bus bandwidth", text), [], empty("Bytes per step", text), dash.no_update, dash.no_update, text)


OUTPUTS = (("comm-timeline", "figure"), ("comm-per-step", "figure"), ("comm-bandwidth", "figure"),
           ("comm-bandwidth-table", "rowData"), ("comm-bytes", "figure"), (STEP_ID, "value"), (STEP_ID, "max"),
           ("communication-step-range", "children"))


def _controls(data: RunData, ranks: Sequence[int], value: int | None, largest: int, span: str) -> html.Div:
    step = html.Div([html.Label("step", htmlFor=STEP_ID),
                     dcc.Input(id=STEP_ID, type="number", min=1, max=largest, step=1, value=value, debounce=True,
                               className="step-input"),
                     html.Span(span, id="communication-step-range", className="hint")], className="control")
    return html.Div([ranks_control(PAGE, data, ranks), step], className="controls")


def layout(state: PageState, data: RunData, ctx: Context) -> Any:
    timeline, per_step, bandwidth, records, sums, value, largest, span = _draw(state, data, peak_of(data, ctx.feed))
    grid = dag.AgGrid(id="comm-bandwidth-table", rowData=records, columnDefs=COLUMNS, columnSize="sizeToFit",
                      defaultColDef={"sortable": True, "resizable": True, "filter": True},
                      dashGridOptions={"domLayout": "autoHeight"}, style={"height": None},
                      className="ag-theme-alpine")
    note = ([message("No rank has reported yet: the page fills in with the first step.", element_id="communication-none")]
            if not data.histories else [])
    return html.Div([
        drawn_store(PAGE, data, state),
        _controls(data, chosen_ranks(state, data), value, largest, span),
        *note,
        section("One step", graph("comm-timeline", timeline)),
        section("Over the run", graph("comm-per-step", per_step), graph("comm-bytes", sums)),
        section("Bandwidth", graph("comm-bandwidth", bandwidth), grid),
    ], id="page-communication")


# The outputs that do not depend on the step: a change of step alone leaves them as drawn (the
# bytes per step of a 10,000-step run are 20,000 bars for the browser to lay out again).
_STEP_FREE = frozenset({"comm-bandwidth", "comm-bandwidth-table", "comm-bytes"})


def _same_but_step(drawn: str | None, data: RunData, state: PageState, ctx: Context) -> bool:
    """The drawn key (version|search) says the same data and ranks, another step."""
    if not drawn:
        return False
    version, _, search = drawn.partition("|")
    if version != str(data.version):
        return False
    before = ctx.state(f"/{PAGE}", search)
    return before.ranks == state.ranks and before.extra == state.extra and before.step != state.step


def register(app: Dash, ctx: Context) -> None:
    register_ranks_control(app, ctx, PAGE)
    register_redraw(app, ctx, PAGE, OUTPUTS, lambda state, data: _draw(state, data, peak_of(data, ctx.feed)),
                    _fallback, partial=lambda state, data, drawn: (
                        _draw_step(state, data) if _same_but_step(drawn, data, state, ctx) else None))

    @app.callback(Output("url", "search", allow_duplicate=True), Input(STEP_ID, "value"),
                  State("url", "pathname"), State("url", "search"), prevent_initial_call=True)
    @guarded(lambda exc: dash.no_update)
    def step_to_url(value: Any, pathname: str | None, search: str | None) -> Any:
        new = step_search(ctx.state(pathname, search), value, ctx.data())
        if new is None or new == (search or ""):
            raise dash.exceptions.PreventUpdate
        return new


def step_search(state: PageState, value: Any, data: RunData) -> str | None:
    """The URL's query once the step input shows ``value`` (from 1); None to leave the URL alone: a
    value that is no step, or the redraw setting the input to the page's default step (so that a
    live page without ``step=`` keeps following the newest step)."""
    if state.page != PAGE or isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        return None
    step = int(value) - 1
    if state.step is None and step == shown_step(state, data):
        return None
    return state_search(state.with_(step=step))
