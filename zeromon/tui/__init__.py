"""`zeromon attach`: the live Textual TUI. ``zeromon.tui.app.ZeromonApp(source)`` draws any source with
``start()``, ``stop()`` and ``latest() -> FleetView``; ``zeromon.views.fleet`` and ``zeromon.views.rank_detail``
turn a FleetView into what is shown, without Textual (the dashboard draws from them too), so they are
tested without a terminal."""
