"""Pure figure functions: view data in, a plotly figure out. No Dash, no I/O, no clock, so each is
tested without a browser (tests/test_dashboard_figures.py)."""
