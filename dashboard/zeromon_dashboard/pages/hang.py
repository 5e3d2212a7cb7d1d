"""Hang: is the job making progress, and if not, who holds it up and where (`zeromon hang` in the browser): the
verdict, cause first, every rank's state and where it stands (the collective it waits in and for whom, or its
own code's frame), and the training threads' stacks, identical ones together. Live from the agents' progress
reports; from a recording, from the reports its ranks wrote when they stalled or were stopped
(zeromon.views.hang)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dash import html

from zeromon.views.hang import COLUMNS, HangView, hang_view
from zeromon.views.run_data import RunData
from zeromon_dashboard.context import Context, failure_text
from zeromon_dashboard.pages.common import data_attrs, drawn_store, message, register_redraw, section
from zeromon_dashboard.state import PageState

if TYPE_CHECKING:
    from dash import Dash

PAGE = "hang"


def verdict_block(hang: HangView) -> Any:
    """The banner with every line of the verdict, or one line saying there is nothing to say."""
    banner = hang.banner
    if banner is None:
        return message(hang.status, "ok" if hang.rows else "info", element_id="hang-none")
    lines = [html.Div(banner.text, className="hang-headline"), *(html.Div(line) for line in banner.more)]
    return html.Div(lines, className=f"banner banner-{banner.level}", id="hang-verdict",
                    **data_attrs(level=banner.level, culprits=",".join(map(str, banner.culprits))))


def ranks_table(hang: HangView) -> Any:
    if not hang.rows:
        return message("no rank has reported its progress", element_id="hang-ranks-none")
    head = html.Tr([html.Th(label) for _, label in COLUMNS])
    rows = [html.Tr([html.Td(cell) for cell in row.cells], className=f"hang-{row.level}",
                    **data_attrs(rank=str(row.rank), state=row.state)) for row in hang.rows]
    return html.Table([html.Thead(head), html.Tbody(rows)], className="hang-ranks", id="hang-ranks")


def stacks_list(hang: HangView) -> Any:
    if not hang.stacks:
        return message("no stack reported", element_id="hang-stacks-none")
    return html.Div([html.Div([html.H3(block.title), html.Pre("\n".join(block.frames))], className="hang-stack",
                              **data_attrs(ranks=",".join(map(str, block.ranks))))
                     for block in hang.stacks], id="hang-stacks")


def _draw(state: PageState, data: RunData) -> tuple[Any, ...]:
    hang = hang_view(data.fleet)
    title = hang.stacks_title[:1].upper() + hang.stacks_title[1:] if hang.stacks_title else "Stacks"
    return verdict_block(hang), ranks_table(hang), title, stacks_list(hang)


def _fallback(exc: Exception) -> tuple[Any, ...]:
    return message(failure_text(exc), "error"), "", "Stacks", ""


OUTPUTS = (("hang-verdict-box", "children"), ("hang-ranks-box", "children"), ("hang-stacks-title", "children"),
           ("hang-stacks-box", "children"))


def layout(state: PageState, data: RunData, ctx: Context) -> Any:
    verdict, table, stacks_title, stacks = _draw(state, data)
    return html.Div([
        drawn_store(PAGE, data, state),
        html.Div(verdict, id="hang-verdict-box", className="banners"),
        section("Every rank (no progress: since its last collective or step)", html.Div(table, id="hang-ranks-box")),
        section(stacks_title, html.Div(stacks, id="hang-stacks-box"), title_id="hang-stacks-title"),
    ], id="page-hang")


def register(app: Dash, ctx: Context) -> None:
    register_redraw(app, ctx, PAGE, OUTPUTS, _draw, _fallback)
