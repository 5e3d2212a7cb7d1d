"""The Planner page's "from this run" figures: a step as compute, transfer and waiting for peers, and the peak's
memory by category against the capacity, measured beside replayed beside predicted (zeromon.views.whatif)."""

from __future__ import annotations

import plotly.graph_objects as go

from zeromon.model.units import format_bytes
from zeromon.views.whatif import WhatIfView
from zeromon_dashboard.figures.memory import CATEGORY_COLOURS, LINE_COLOURS
from zeromon_dashboard.figures.style import base_layout, unit

STEP_TITLE = "A step: measured, the model's replay, predicted"
MEMORY_TITLE = "Peak tracked memory by category"
# (part, legend name, colour): "exposed" is the measured run's blocked time, which it does not split.
STEP_PARTS = (("compute", "compute", "#6baed6"), ("transfer", "transfer", "#d62728"),
              ("waiting", "waiting for peers", "#fd8d3c"), ("exposed", "exposed (measured, not split)", "#969696"))
CAPACITY_DRAWN_WITHIN = 4.0  # the capacity line is drawn when at most this many times the tallest bar


def step_waterfall(view: WhatIfView) -> go.Figure:
    """One stacked bar per figure; ``customdata`` holds the seconds. The parts are medians over ranks of each
    rank's median, and need not add up to the median step (the mark above each bar)."""
    fig = go.Figure()
    labels = [bar.label for bar in view.steps]
    for part, name, colour in STEP_PARTS:
        values = [bar.parts.get(part) for bar in view.steps]
        if not any(v for v in values):
            continue
        fig.add_trace(go.Bar(x=labels, y=[(v or 0.0) * 1e3 for v in values], name=name, marker_color=colour,
                             customdata=[v or 0.0 for v in values], meta={"kind": "step", "part": part},
                             hovertext=[f"{label}: {name} {(v or 0.0) * 1e3:.1f} ms"
                                        for label, v in zip(labels, values, strict=True)], hoverinfo="text"))
    fig.add_trace(go.Scatter(x=labels, y=[(bar.step_s or 0.0) * 1e3 for bar in view.steps], mode="markers+text",
                             text=[f"{bar.step_s * 1e3:.1f} ms" if bar.step_s is not None else "" for bar in view.steps],
                             textposition="top center", marker={"symbol": "line-ew-open", "size": 30,
                                                                "color": "#111827"},
                             name="median step", meta={"kind": "step_time"},
                             customdata=[bar.step_s for bar in view.steps]))
    error = "" if view.replay_error_pct is None else f" (the replay {view.replay_error_pct:+.1f}% from measured)"
    top = max([sum(bar.parts.values()) for bar in view.steps] + [bar.step_s or 0.0 for bar in view.steps]) * 1e3
    base_layout(fig, f"{STEP_TITLE}{error}", height=380, barmode="stack", bargap=0.4,
                yaxis={"title": "ms", "range": [0, 1.2 * top if top > 0 else 1]},
                xaxis={"type": "category"}, legend={"orientation": "h", "y": -0.18, "x": 0})
    fig.update_layout(margin={"t": 70})
    return fig


def memory_stacks(view: WhatIfView) -> go.Figure:
    """The categories at the peak, stacked, for the measured run and the prediction; the capacity as a line."""
    tallest = max([bar.total or 0 for bar in view.memory] + [0])
    # A capacity far above the bars (a CPU rank's share of the host's memory) would flatten them: said instead.
    capacity_drawn = bool(view.capacity) and (view.capacity or 0) <= CAPACITY_DRAWN_WITHIN * max(tallest, 1)
    unit_name, size = unit(max(tallest, view.capacity or 0) if capacity_drawn else tallest)
    labels = [bar.label for bar in view.memory]
    names = sorted({name for bar in view.memory for name in bar.categories})
    fig = go.Figure()
    for name in names:
        values = [bar.categories.get(name, 0) for bar in view.memory]
        fig.add_trace(go.Bar(x=labels, y=[v / size for v in values], name=name,
                             marker_color=CATEGORY_COLOURS.get(name, "#969696"), customdata=values,
                             meta={"kind": "category", "category": name},
                             hovertext=[f"{label}: {name} {format_bytes(v)}" for label, v in zip(labels, values,
                                                                                                  strict=True)],
                             hoverinfo="text"))
    title = MEMORY_TITLE
    if capacity_drawn and view.capacity:
        fig.add_hline(y=view.capacity / size, line={"color": LINE_COLOURS["capacity"], "dash": "dash"},
                      annotation_text=f"capacity {format_bytes(view.capacity)}", annotation_position="top left")
    elif view.capacity and tallest:
        title += f" (capacity {format_bytes(view.capacity)}: {100.0 * tallest / view.capacity:.1f}% of it at most)"
    base_layout(fig, title, height=380, barmode="stack", bargap=0.4, xaxis={"type": "category"},
                yaxis={"title": unit_name, "rangemode": "tozero"}, legend={"orientation": "h", "y": -0.18, "x": 0},
                meta={"capacity": view.capacity})
    return fig
