"""The pages, one module each: ``layout(state, data, ctx)`` builds the page (controls set from the URL,
figures drawn), ``register(app, ctx)`` adds its callbacks (redraw on the feed's new data, controls
written back to the URL)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from zeromon_dashboard.context import Context
from zeromon_dashboard.state import PAGES, PageState, state_search

if TYPE_CHECKING:
    from dash import Dash

    from zeromon.views.run_data import RunData

def module(page: str) -> Any:
    return importlib.import_module(f"zeromon_dashboard.pages.{page}")


def layout(state: PageState, data: RunData, ctx: Context) -> Any:
    return module(state.page).layout(state, data, ctx)


def register(app: Dash, ctx: Context) -> None:
    for page in PAGES:
        module(page).register(app, ctx)


def search_kept(state: PageState) -> str:
    """What a link to another page keeps of this one's URL: the ranks and the step."""
    return state_search(PageState(ranks=state.ranks, step=state.step))
