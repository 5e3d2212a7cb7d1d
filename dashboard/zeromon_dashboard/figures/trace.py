"""The Trace page's figures: `zeromon report --trace --html`'s (each rank's temporal breakdown, its
overlap and exposed communication, both per iteration), in the dashboard's style, sized to the ranks,
and saying why where there is nothing to draw."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from zeromon.analysis.trace_overlap import RankTraceOverlap
from zeromon.exporters.html_report import trace_figures
from zeromon_dashboard.figures.style import base_layout, empty

TITLES = {"trace-breakdown": "Temporal breakdown per rank (% of GPU kernel time, whole trace)",
          "trace-overlap": "Exposed communication and overlap per rank (whole trace)",
          "trace-iterations": "Exposed communication and overlap per iteration"}
_BAR_PX = 22  # a rank's bar in the breakdown


def _height(figure_id: str, ranks: int) -> int:
    if figure_id == "trace-breakdown":
        return max(240, 120 + ranks * _BAR_PX)
    return 380


def trace_page_figures(traces: Sequence[RankTraceOverlap]) -> dict[str, go.Figure]:
    """The three figures by id; ``trace-iterations`` says why when no trace has a ProfilerStep."""
    if not traces:
        return {fid: empty(title, "no trace read") for fid, title in TITLES.items()}
    made: dict[str, go.Figure] = {}
    for figure_id, fig in trace_figures(traces):
        # The report's titles and legends, the dashboard's fonts, margins and heights.
        made[figure_id] = base_layout(fig, fig.layout.title.text, _height(figure_id, len(traces)))
    if "trace-iterations" not in made:
        made["trace-iterations"] = empty(
            TITLES["trace-iterations"],
            "no ProfilerStep iterations in these traces (profile with schedule() and prof.step() to have them)")
    return made
