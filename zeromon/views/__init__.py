"""What a front end shows, as plain data (no UI library): the TUI (`zeromon.tui`) and the Dash dashboard
(`zeromon_dashboard`) both draw from here, so that no number is computed twice.

- ``fleet``: a FleetView turned into rank rows, the header, trends, findings (grouped) and no-agent text.
- ``rank_detail``: one rank's drill-down: memory by category, collectives, the phase timeline.
- ``hang``: the hang verdict's banner, a row per rank (its state, where it stands) and the grouped stacks.
- ``planning``: `zeromon plan`'s inputs read from text (the CLI's flags, the dashboard's form).
"""
