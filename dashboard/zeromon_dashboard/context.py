"""What every page of the dashboard shares with the application: the context its callbacks get (the data,
the server's settings, the page's URL state), and the guard that keeps a failing callback's traceback on the
terminal. Below the pages and the application, which both import it."""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import dash
from dash import Dash

from zeromon.model.classes import frozen
from zeromon.views.run_data import Feed, RunData
from zeromon_dashboard.state import PageState, parse_state, state_search

T = TypeVar("T")


@frozen
class Context:
    """What the pages' callbacks need besides the URL: the data and how the server was started."""

    feed: Feed
    app: Dash
    refresh_s: float
    allow_model_import: bool  # the planner may import MODULE:FACTORY (only when bound to loopback)

    def data(self) -> RunData:
        return self.feed.latest()

    def href(self, page: str, search: str = "") -> str:
        return str(self.app.get_relative_path("/" if page == "overview" else f"/{page}")) + search

    def rank_href(self, page: str, rank: int) -> str:
        """The link of one rank on ``page``: '/memory?ranks=3'."""
        return self.href(page, state_search(PageState(page=page, ranks=(rank,))))

    def state(self, pathname: str | None, search: str | None) -> PageState:
        path = self.app.strip_relative_path(pathname or "/") or ""
        return parse_state("/" + str(path), search)


def guarded(fallback: Callable[[Exception], T]) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A callback that cannot fail in the browser: an exception becomes ``fallback(exc)`` (a message
    in the page), and its traceback goes to the terminal. PreventUpdate passes through."""
    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> T:
            try:
                return fn(*args, **kwargs)
            except dash.exceptions.PreventUpdate:
                raise
            except Exception as exc:
                print(f"zeromon dashboard: {fn.__name__} failed:", file=sys.stderr)
                traceback.print_exc(file=sys.stderr)
                return fallback(exc)
        return inner
    return wrap


def failure_text(exc: Exception) -> str:
    """The page's one line for a failed callback (the traceback is on the dashboard's terminal)."""
    from zeromon.errors import ZeromonError

    if isinstance(exc, ZeromonError):
        return str(exc)
    return f"This part of the page could not be drawn ({type(exc).__name__}: {exc}); the terminal that runs " \
           "`zeromon dashboard` has the details."
