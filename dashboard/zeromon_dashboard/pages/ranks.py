"""Ranks: (being built)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dash import html

from zeromon.views.run_data import RunData
from zeromon_dashboard.state import PageState

if TYPE_CHECKING:
    from dash import Dash

    from zeromon_dashboard.app import Context

PAGE = "ranks"


def layout(state: PageState, data: RunData, ctx: Context) -> Any:
    return html.Div("(this page is being built)", id="page-ranks")


def register(app: Dash, ctx: Context) -> None:
    pass
