"""`zeromon dashboard`: the Dash web dashboard. ``create_app(feed)`` (``zeromon_dashboard.app``) serves
any feed of ``zeromon.views.run_data`` (a recording, a replay, live agents or Prometheus, profiler
traces); the figures are pure functions in ``zeromon_dashboard.figures``. Loaded lazily: importing the
package costs nothing until ``create_app`` is used."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from zeromon_dashboard.app import create_app

        return create_app
    raise AttributeError(name)
