"""The Dash application: a header (what is watched, its state, pause), the pages' links, and the page
the URL names. Each page is a module of ``zeromon_dashboard.pages`` with a layout and its callbacks;
every figure is built by a pure function of ``zeromon_dashboard.figures`` (RunData in, figure out).

The feed collects on its own threads; a callback only takes ``feed.latest()`` (no I/O) and draws it.
A callback that fails shows a one-line message in the page and prints its traceback on the
terminal: the browser never sees a stack trace (Dash's debug mode is off unless asked for).
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import dash
from dash import Dash, Input, Output, State, dcc, html

from zeromon.views.run_data import Feed, RunData
from zeromon_dashboard import pages
from zeromon_dashboard.context import Context, failure_text, guarded
from zeromon_dashboard.state import PAGES

log = logging.getLogger("zeromon.dashboard")
T = TypeVar("T")

TITLES = {"overview": "Overview", "memory": "Memory", "communication": "Communication", "ranks": "Ranks",
          "hang": "Hang", "planner": "Planner", "trace": "Trace"}


def _available(page: str, data: RunData) -> bool:
    if page == "planner":
        return True
    if data.kind == "trace":
        return page == "trace"
    return page != "trace"


def create_app(feed: Feed, *, prefix: str = "/", refresh_s: float = 1.0, allow_model_import: bool = False,
               title: str = "zeromon") -> Dash:
    """The dashboard for ``feed``, served under ``prefix`` (a reverse proxy's path: '/user/x/proxy/8050/')."""
    prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    app = Dash(__name__, title=title, update_title="", suppress_callback_exceptions=True,
               requests_pathname_prefix=prefix, routes_pathname_prefix="/", serve_locally=True)
    ctx = Context(feed=feed, app=app, refresh_s=refresh_s, allow_model_import=allow_model_import)
    first = feed.latest()
    app.layout = html.Div([
        dcc.Location(id="url", refresh="callback-nav"),
        dcc.Interval(id="tick", interval=int(refresh_s * 1000), disabled=not first.live),
        dcc.Store(id="paused", data=False),
        html.Header([
            html.Span("zeromon", className="brand"),
            html.Nav(id="nav", className="nav"),
            html.Span(id="status", className="status"),
            html.Button("pause", id="pause", className="pause", n_clicks=0,
                        style={} if first.live else {"display": "none"}),
        ], className="top"),
        html.Div(id="source-error", className="source-error"),
        html.Main(id="page", className="page"),
    ], className="app")

    @app.callback(Output("nav", "children"), Input("url", "pathname"), Input("url", "search"))
    @guarded(lambda exc: [html.Span(failure_text(exc))])
    def nav(pathname: str | None, search: str | None) -> list[Any]:
        state = ctx.state(pathname, search)
        data = ctx.data()
        keep = pages.search_kept(state)
        return [dcc.Link(TITLES[p], href=ctx.href(p, keep if p != "planner" else ""),
                         className="nav-link active" if p == state.page else "nav-link", id=f"nav-{p}")
                for p in PAGES if _available(p, data)]

    @app.callback(Output("page", "children"), Input("url", "pathname"), State("url", "search"))
    @guarded(lambda exc: html.Div(failure_text(exc), className="callback-error"))
    def page(pathname: str | None, search: str | None) -> Any:
        state = ctx.state(pathname, search)
        data = ctx.data()
        if not _available(state.page, data):
            other = "trace" if data.kind == "trace" else "overview"
            return html.Div([html.P(f"The {TITLES[state.page]} page needs "
                                    + ("a recording or a live run" if state.page != "trace" else
                                       "profiler traces: start `zeromon dashboard --trace DIR`") + "."),
                             dcc.Link(f"Go to {TITLES[other]}", href=ctx.href(other))], className="empty-page")
        return pages.layout(state, data, ctx)

    @app.callback(Output("status", "children"), Output("source-error", "children"),
                  Output("tick", "disabled"), Output("pause", "children"),
                  Input("tick", "n_intervals"), Input("pause", "n_clicks"))
    @guarded(lambda exc: (failure_text(exc), "", dash.no_update, dash.no_update))
    def status(_: int | None, clicks: int) -> tuple[Any, ...]:
        data = ctx.data()
        paused = bool(clicks) and clicks % 2 == 1
        if not data.live:
            return _status_text(data, paused=False), _error(data), True, "pause"
        return _status_text(data, paused), _error(data), paused, "resume" if paused else "pause"

    pages.register(app, ctx)
    return app


def _status_text(data: RunData, paused: bool) -> str:
    alive = data.fleet.alive
    n = len(data.fleet.ranks)
    parts = [data.source]
    if data.kind == "trace":
        parts.append(f"{len(data.traces)} rank{'s' if len(data.traces) != 1 else ''}")
    elif data.kind == "recording":
        parts.append(f"{len(data.histories)} ranks recorded" + ("" if data.finished else ", still being written"))
    elif data.fleet.totals is not None:  # Prometheus's recording rules: the whole job, not the worst ranks shown
        parts.append(f"{data.fleet.totals.ranks}/{data.fleet.totals.ranks_expected} ranks answering")
    else:
        parts.append(f"{alive}/{n} ranks answering")
    if data.kind == "replay" and data.position_s is not None and data.duration_s is not None:
        parts.append(f"at {data.position_s:.1f} of {data.duration_s:.1f} s" + (" (ended)" if data.finished else ""))
    elif data.kind == "live" and data.finished:
        parts.append("the run has ended: its last data")
    if data.live and not data.finished:
        parts.append("paused" if paused else "live")
    return " · ".join(parts)


def _error(data: RunData) -> Any:
    if not data.error:
        return ""
    return html.Div(data.error, className="banner banner-warn", id="source-error-text")
