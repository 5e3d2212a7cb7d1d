"""Ranks: step time as a rank × step heatmap (a click opens that rank's step on the Communication
page), who waits for whom with the straggler and step-skew findings, and each rank's memory peak
against the median with the memory-imbalance finding; the findings worded as `zeromon report` words
them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import dash
from dash import Input, Output, html

from zeromon.analysis.findings import Finding
from zeromon.model.classes import frozen
from zeromon.views.ranks import (
    MEMORY_KINDS,
    WAIT_KINDS,
    StepMatrix,
    binned,
    cell_step,
    memory_peaks,
    step_matrix,
    waits,
)
from zeromon.views.run_data import RunData
from zeromon_dashboard.context import Context, failure_text, guarded
from zeromon_dashboard.figures.ranks import (
    HEATMAP_TITLE,
    IMBALANCE_TITLE,
    WAITS_TITLE,
    heatmap_figure,
    imbalance_figure,
    waits_figure,
)
from zeromon_dashboard.figures.style import empty
from zeromon_dashboard.pages.common import drawn_store, graph, message, register_redraw, section
from zeromon_dashboard.pages.overview import findings_list
from zeromon_dashboard.state import PageState, state_search

if TYPE_CHECKING:
    from dash import Dash

PAGE = "ranks"


def findings_block(findings: Sequence[Finding], element_id: str, none_text: str,
                   rank_href: Callable[[str, int], str] | None = None) -> Any:
    """The Overview's findings list (the report's words, one entry per problem across ranks, its worst rank linked
    with ``rank_href``) under its own id, or a line saying there is none."""
    if not findings:
        return message(none_text, "ok", element_id=f"{element_id}-none")
    block = findings_list(findings, rank_href=rank_href)
    block.id = element_id  # two lists on one page: ids of their own
    return block


def _of_kinds(data: RunData, kinds: Sequence[str]) -> list[Finding]:
    return [f for f in data.findings if f.kind in kinds]


@frozen
class _Drawn:
    data: RunData
    rank_href: Callable[[str, int], str] | None  # what the findings' worst ranks link with
    heatmap: StepMatrix  # as drawn (binned): what a click on a cell looks up
    outputs: tuple[Any, ...]


# The last data drawn: the page's drawing does not depend on the URL, so another tab, a return to
# the page, the redraw after the layout and a click reuse it (many ranks' figures are slow to
# draw and large). One entry: the feed's current data, held anyway.
_last: _Drawn | None = None


def _drawn(data: RunData, rank_href: Callable[[str, int], str] | None = None) -> _Drawn:
    global _last
    last = _last
    # ctx.rank_href is a bound method: a new object at each reading, equal to the last.
    if last is None or last.data is not data or last.rank_href != rank_href:
        last = _last = _draw_new(data, rank_href)
    return last


def _draw(state: PageState, data: RunData, rank_href: Callable[[str, int], str] | None = None) -> tuple[Any, ...]:
    return _drawn(data, rank_href).outputs


def _draw_new(data: RunData, rank_href: Callable[[str, int], str] | None) -> _Drawn:
    wait_findings = _of_kinds(data, WAIT_KINDS)
    memory_findings = _of_kinds(data, MEMORY_KINDS)
    matrix = step_matrix(data)
    heatmap = binned(matrix)
    outputs = (heatmap_figure(heatmap), waits_figure(waits(data, matrix)),
               findings_block(wait_findings, "ranks-waits-findings-list",
                              "No straggler and no step-time skew: no rank makes the others wait in most steps.",
                              rank_href),
               imbalance_figure(memory_peaks(data), memory_findings[0] if memory_findings else None),
               findings_block(memory_findings, "ranks-imbalance-findings-list",
                              "No memory imbalance: the ranks' peaks are within 10% (or 64 MiB) of the highest.",
                              rank_href))
    return _Drawn(data=data, rank_href=rank_href, heatmap=heatmap, outputs=outputs)


def _fallback(exc: Exception) -> tuple[Any, ...]:
    text = failure_text(exc)
    return (empty(HEATMAP_TITLE, text), empty(WAITS_TITLE, text), "", empty(IMBALANCE_TITLE, text), "")


OUTPUTS = (("ranks-heatmap", "figure"), ("ranks-waits", "figure"), ("ranks-waits-findings", "children"),
           ("ranks-imbalance", "figure"), ("ranks-imbalance-findings", "children"))


def layout(state: PageState, data: RunData, ctx: Context) -> Any:
    heatmap, waits_, wait_findings, imbalance, memory_findings = _draw(state, data, ctx.rank_href)
    note = ([message("No rank has reported yet: the page fills in with the first step.", element_id="ranks-none")]
            if not data.histories else [])
    return html.Div([
        # What the layout drew, as register_redraw keys it: the first tick does not draw it again.
        drawn_store(PAGE, data, state),
        *note,
        section("Step time", graph("ranks-heatmap", heatmap),
                html.P("Click a cell to open that rank's step on the Communication page.", className="hint")),
        section("Who waits for whom", graph("ranks-waits", waits_), html.Div(wait_findings, id="ranks-waits-findings")),
        section("Memory balance", graph("ranks-imbalance", imbalance),
                html.Div(memory_findings, id="ranks-imbalance-findings")),
    ], id="page-ranks")


def clicked_step(point: dict[str, Any], heatmap: StepMatrix) -> tuple[int, int] | None:
    """(rank, recorded step index) of a clicked heatmap cell (Dash's clickData gives its x and y):
    the step it shows, a bin's slowest."""
    rank, x = point.get("y"), point.get("x")
    if not isinstance(rank, int | float) or not isinstance(x, int | float):
        return None
    step = cell_step(heatmap, int(rank), float(x))
    return None if step is None else (int(rank), step)


def register(app: Dash, ctx: Context) -> None:
    register_redraw(app, ctx, PAGE, OUTPUTS, lambda state, data: _draw(state, data, ctx.rank_href), _fallback)

    @app.callback(Output("url", "pathname", allow_duplicate=True), Output("url", "search", allow_duplicate=True),
                  Input("ranks-heatmap", "clickData"), prevent_initial_call=True)
    @guarded(lambda exc: (dash.no_update, dash.no_update))
    def open_step(click: dict[str, Any] | None) -> tuple[Any, Any]:
        points = (click or {}).get("points") or []
        cell = clicked_step(points[0], _drawn(ctx.data()).heatmap) if points else None
        if cell is None:
            raise dash.exceptions.PreventUpdate
        rank, step = cell
        return ctx.href("communication"), state_search(PageState(ranks=(rank,), step=step))
