"""The Planner page's figure: per planned stage (and offload), the memory one GPU holds, stacked as
parameters, gradients, optimizer state and activations, against the GPU's capacity and the
recommendation's budget, each bar marked fits / does not fit / unknown."""

from __future__ import annotations

import plotly.graph_objects as go

from zeromon.analysis.planner import PlanResult, StagePlan
from zeromon.model.units import format_bytes
from zeromon.views.planning import recommendation_text
from zeromon_dashboard.figures.style import LEVEL_COLOURS, base_layout, unit

TITLE = "Memory per GPU by ZeRO stage"
# (StagePlan field, legend name, colour): the Memory page's colours for the same kinds of memory.
PARTS = (("params_bytes", "params", "#2171b5"), ("grads_bytes", "grads", "#238b45"),
         ("optimizer_bytes", "optimizer state", "#fd8d3c"), ("activations_bytes", "activations", "#9e9ac8"))
CAPACITY_COLOUR = "#d62728"
BUDGET_COLOUR = "#ff7f0e"
FITS_MARK = {True: ("fits", LEVEL_COLOURS["ok"]), False: ("does not fit", LEVEL_COLOURS["critical"]),
             None: ("fits: unknown", "#6b7280")}


def bar_label(sp: StagePlan) -> str:
    """The bar's name: 'stage 0 (DDP)', 'stage 3<br>optimizer=cpu' (one bar per row of the table)."""
    name = "stage 0 (DDP)" if sp.stage == 0 else f"stage {sp.stage}"
    return name if sp.offload == "none" else f"{name}<br>{sp.offload}"


def _recommended(result: PlanResult, sp: StagePlan) -> bool:
    rec = result.recommendation
    return (rec.stage, rec.offload_optimizer, rec.offload_params) == (sp.stage, sp.offload_optimizer,
                                                                      sp.offload_params)


def plan_bars(result: PlanResult) -> go.Figure:
    """One stacked bar per planned row; ``customdata`` of each part holds its bytes per GPU."""
    capacity = result.inputs.gpu_memory_bytes
    top = max([sp.gpu_bytes for sp in result.stages] + [capacity or 0])
    unit_name, size = unit(top)
    labels = [bar_label(sp) for sp in result.stages]
    with_activations = result.inputs.activations is not None
    fig = go.Figure()
    for field, name, colour in PARTS:
        if field == "activations_bytes" and not with_activations:
            continue  # not asked for: a legend entry of zeros would say they were counted
        values = [getattr(sp, field) for sp in result.stages]
        fig.add_trace(go.Bar(
            x=labels, y=[v / size for v in values], name=name, marker_color=colour, customdata=values,
            hovertext=[f"{label.replace('<br>', ', ')}: {name} {format_bytes(v)} per GPU"
                       for label, v in zip(labels, values, strict=True)],
            hoverinfo="text", meta={"kind": "part", "part": field, "scale": size}))
    fig.add_trace(_fits_marks(result, labels, size))
    if capacity:
        _capacity_lines(fig, capacity, result.inputs.headroom_fraction, size)
    base_layout(fig, _title(result, unit_name), height=420, barmode="stack", bargap=0.35,
                xaxis={"title": "ZeRO stage (offload)", "type": "category"},
                yaxis={"title": f"{unit_name} per GPU", "rangemode": "tozero"},
                legend={"orientation": "h", "y": -0.22, "x": 0}, hovermode="closest")
    fig.update_layout(margin={"t": 60, "b": 90})  # room for the title's second half and the legend below
    return fig


def _fits_marks(result: PlanResult, labels: list[str], size: int) -> go.Scatter:
    """A text above each bar: fits / does not fit / fits: unknown (no capacity), and which is recommended."""
    texts, colours = [], []
    for sp in result.stages:
        text, colour = FITS_MARK[sp.fits]
        texts.append(f"<b>{text}</b>" + ("<br>recommended" if _recommended(result, sp) else ""))
        colours.append(colour)
    totals = [sp.gpu_bytes for sp in result.stages]
    return go.Scatter(
        x=labels, y=[t / size for t in totals], mode="text", text=texts, textposition="top center",
        textfont={"color": colours, "size": 12}, name="fits", showlegend=False, customdata=totals,
        hovertext=[f"{label.replace('<br>', ', ')}: {format_bytes(t)} per GPU"
                   for label, t in zip(labels, totals, strict=True)],
        hoverinfo="text", meta={"kind": "fits", "fits": [sp.fits for sp in result.stages]})


def _capacity_lines(fig: go.Figure, capacity: int, headroom_fraction: float, size: int) -> None:
    """The GPU's capacity, and the budget the recommendation keeps under it (its headroom)."""
    budget = int(capacity * (1 - headroom_fraction))
    fig.add_hline(y=capacity / size, line={"color": CAPACITY_COLOUR, "dash": "dash", "width": 2},
                  annotation_text=f"GPU capacity {format_bytes(capacity)}", annotation_position="top right",
                  annotation_font_color=CAPACITY_COLOUR, name="capacity")
    fig.add_hline(y=budget / size, line={"color": BUDGET_COLOUR, "dash": "dot", "width": 1.5}, showlegend=True,
                  name=f"{1 - headroom_fraction:.0%} of capacity: the recommendation's budget")

def _title(result: PlanResult, unit_name: str) -> str:
    inputs = result.inputs
    gpus = f"{inputs.total_gpus} GPU{'s' if inputs.total_gpus > 1 else ''}"
    return f"{TITLE} ({unit_name}, {gpus}); recommended: {recommendation_text(result.recommendation)}"
