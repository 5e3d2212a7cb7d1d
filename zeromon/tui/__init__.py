"""`zeromon attach`: the live Textual TUI. ``zeromon.tui.app.ZeromonApp(source)`` draws any source with
``start()``, ``stop()`` and ``latest() -> FleetView``; ``view_model`` and ``rank_detail`` turn a
FleetView into what is shown, without Textual, so they are tested without a terminal."""
