"""What the pages share: graphs, messages, the ranks and step controls (written back to the URL), and
the redraw guard (a page redraws when the feed's data or the URL changed, not on every tick)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from zeromon.views.fleet import rank_rows, worst_row
from zeromon.views.run_data import RunData
from zeromon_dashboard.context import Context, guarded
from zeromon_dashboard.state import PageState, state_search

GRAPH_CONFIG: Any = {"displaylogo": False}


def graph(graph_id: str, figure: Any, height: int | None = None) -> dcc.Graph:
    style = {"height": f"{height}px"} if height else {}
    return dcc.Graph(id=graph_id, figure=figure, config=GRAPH_CONFIG, style=style, className="figure")


def message(text: str, level: str = "info", element_id: str | None = None) -> html.Div:
    props: dict[str, Any] = {"className": f"message message-{level}"}
    if element_id:
        props["id"] = element_id
    return html.Div(text, **props)


def data_attrs(**attrs: str) -> dict[str, Any]:
    """data-* attributes (what the browser tests read)."""
    return {f"data-{k}": v for k, v in attrs.items()}


def section(title: str, *children: Any, element_id: str | None = None, title_id: str | None = None) -> html.Section:
    props: dict[str, Any] = {"className": "section"}
    if element_id:
        props["id"] = element_id
    heading = html.H2(title, id=title_id) if title_id else html.H2(title)
    return html.Section([heading, *children], **props)


def known_ranks(data: RunData) -> list[int]:
    ranks = set(data.histories) | {r.rank for r in data.fleet.ranks if r.rank is not None}
    return sorted(ranks)


def default_ranks(data: RunData, n: int = 2) -> tuple[int, ...]:
    """The ranks a page shows when the URL names none: the worst rank (the TUI's worst row) first,
    then the lowest others, ``n`` in all."""
    ranks = known_ranks(data)
    worst = worst_row(rank_rows(data.fleet)) if data.fleet.ranks else None
    first = [worst.rank] if worst is not None and worst.rank is not None and worst.rank in ranks else []
    return tuple(first + [r for r in ranks if r not in first])[:n]


def chosen_ranks(state: PageState, data: RunData, n: int = 2) -> tuple[int, ...]:
    known = set(known_ranks(data))
    given = tuple(r for r in state.ranks if r in known)
    return given or default_ranks(data, n)


def ranks_control(page: str, data: RunData, chosen: Sequence[int], multi: bool = True) -> html.Div:
    options = [{"label": f"rank {r}", "value": r} for r in known_ranks(data)]
    value: Any = list(chosen) if multi else (chosen[0] if chosen else None)
    return html.Div([html.Label("ranks" if multi else "rank", htmlFor=f"{page}-ranks"),
                     dcc.Dropdown(id=f"{page}-ranks", options=options, value=value, multi=multi, clearable=False,
                                  className="ranks-dropdown")], className="control")


def register_ranks_control(app: dash.Dash, ctx: Context, page: str, n: int = 2) -> None:
    """The page's ranks dropdown writes ``ranks=`` into the URL (the figures redraw from the URL).
    ``n``: the page's default count (chosen_ranks). Dash fires the callback when the page's controls
    first render: a value that is the default while the URL names no ranks is not written, so the
    URL stays the page's plain one (and a live page keeps following the worst ranks)."""
    @app.callback(Output("url", "search", allow_duplicate=True), Input(f"{page}-ranks", "value"),
                  State("url", "pathname"), State("url", "search"), prevent_initial_call=True)
    def ranks_to_url(value: Any, pathname: str | None, search: str | None) -> str:
        state = ctx.state(pathname, search)
        ranks = tuple(value) if isinstance(value, list) else ((value,) if isinstance(value, int) else ())
        if ranks == state.ranks or (not state.ranks and ranks == default_ranks(ctx.data(), n)):
            raise dash.exceptions.PreventUpdate  # '?ranks=0-7' stays as written
        new = state_search(state.with_(ranks=ranks))
        if new == (search or ""):
            raise dash.exceptions.PreventUpdate
        return new


def redraw_guard(ctx: Context, search: str | None, drawn: str | None) -> tuple[RunData, str]:
    """The data to draw and its key; PreventUpdate when this very data and URL are drawn already."""
    data = ctx.data()
    key = f"{data.version}|{search or ''}"
    if key == drawn:
        raise dash.exceptions.PreventUpdate
    return data, key


def drawn_store(page: str, data: RunData | None = None, state: PageState | None = None) -> dcc.Store:
    """The page's redraw key, starting at what the layout drew (``data`` for ``state``): the first
    tick or URL change then redraws only what changed, not the whole page again."""
    key = f"{data.version}|{state_search(state)}" if data is not None and state is not None else None
    return dcc.Store(id=f"{page}-drawn", data=key)


def register_redraw(app: dash.Dash, ctx: Context, page: str, outputs: Sequence[tuple[str, str]],
                    draw: Callable[[PageState, RunData], Sequence[Any]],
                    fallback: Callable[[Exception], Sequence[Any]],
                    partial: Callable[[PageState, RunData, str | None], Sequence[Any] | None] | None = None) -> None:
    """Redraw ``outputs`` ((id, property) pairs) on every tick and URL change when the data moved on.
    ``partial(state, data, drawn)``: the outputs when only some need drawing again (dash.no_update for
    the others), given the key of what is drawn; None to draw them all."""
    @app.callback(*[Output(i, p) for i, p in outputs], Output(f"{page}-drawn", "data"),
                  Input("tick", "n_intervals"), Input("url", "search"), State("url", "pathname"),
                  State(f"{page}-drawn", "data"), prevent_initial_call=True)
    @guarded(lambda exc: (*fallback(exc), None))
    def redraw(_: int | None, search: str | None, pathname: str | None, drawn: str | None) -> tuple[Any, ...]:
        state = ctx.state(pathname, search)
        if state.page != page:
            raise dash.exceptions.PreventUpdate
        data, key = redraw_guard(ctx, search, drawn)
        values = partial(state, data, drawn) if partial is not None else None
        return (*(draw(state, data) if values is None else values), key)
