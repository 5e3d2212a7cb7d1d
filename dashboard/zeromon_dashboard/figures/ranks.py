"""The Ranks page's figures: step time as a rank × step heatmap, who waits for whom, and each rank's
memory peak against the median."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from zeromon.analysis.findings import Finding
from zeromon.model.units import format_bytes
from zeromon.views.ranks import MemoryPeaks, StepMatrix, Waits, column_x
from zeromon_dashboard.figures.style import LEVEL_COLOURS, base_layout, empty, unit

HEATMAP_TITLE = "Step time per rank and step (ms)"
WAITS_TITLE = "Who waits for whom"
IMBALANCE_TITLE = "Peak memory per rank against the median"
# The colour scale ends at this percentile of the step times: a warm-up step ten times longer than
# the rest would otherwise wash every other cell out (it, and anything as slow, takes the darkest
# colour); and not below this multiple of the median, or a few ms of jitter would span every colour.
SCALE_TOP_PERCENTILE = 99.5
SCALE_TOP_OVER_MEDIAN = 1.25
FAST_DRAW_CELLS = 20_000
BAR_COLOUR = "#6baed6"
WAIT_COLOURS = {"caused": "#d62728", "waited": "#9ecae1"}


def _rank_axis(ranks: int) -> dict[str, object]:
    """Ranks as numbers, each labelled while there are few."""
    return {"title": "rank", **({"dtick": 1} if ranks <= 32 else {})}


def _heat_height(ranks: int) -> int:
    return 130 + min(max(ranks * 24, 170), 720)


def _scale(matrix: StepMatrix) -> tuple[float, float] | None:
    """The colour scale's ends, from the steps after the first (the first holds one-off work, as
    `zeromon report` says): from the fastest to a high percentile, and at least SCALE_TOP_OVER_MEDIAN
    times the median, so that a run whose steps only jitter stays pale and a slow step or rank is
    dark. None: no step."""
    shown = matrix.shown_step if matrix.shown_step is not None else np.broadcast_to(matrix.steps, matrix.step_ms.shape)
    values = matrix.step_ms[(shown != 0) & ~np.isnan(matrix.step_ms)]
    if not values.size:
        values = matrix.step_ms[~np.isnan(matrix.step_ms)]
    if not values.size:
        return None
    top = max(float(np.percentile(values, SCALE_TOP_PERCENTILE)), SCALE_TOP_OVER_MEDIAN * float(np.median(values)))
    return float(values.min()), top


def _evenly_spaced(values: np.ndarray) -> bool:
    steps = np.diff(values)
    return len(values) < 2 or bool(np.all(steps == steps[0]))


def _smoothing(x: np.ndarray, y: np.ndarray, cells: int) -> str | bool:
    """'fast' (one pixel per cell, scaled by the browser: a large map draws several times faster) where
    plotly allows it (evenly spaced x and y) and the cells are many; no smoothing else."""
    return "fast" if cells > FAST_DRAW_CELLS and _evenly_spaced(x) and _evenly_spaced(y) else False


def heatmap_figure(matrix: StepMatrix) -> go.Figure:
    """z: step time (ms), y: ranks, x: steps from 1 (a binned column sits at its bin's middle)."""
    if not matrix.ranks or not len(matrix.steps):
        return empty(HEATMAP_TITLE, "no rank has finished a step yet")
    title = HEATMAP_TITLE
    if matrix.binned:
        title += (f": {matrix.total_steps} steps in bins of {matrix.bin_size}, each cell the slowest step of its "
                  "bin")
        assert matrix.shown_step is not None  # binned() sets it
        customdata = np.stack([matrix.exposed_ms, (matrix.shown_step + 1).astype(np.float32)], axis=-1)
        hover = ("rank %{y}, step %{customdata[1]:.0f} (the slowest of its bin of " + str(matrix.bin_size)
                 + ")<br>step time %{z:.1f} ms<br>exposed comm %{customdata[0]:.1f} ms<extra></extra>")
    else:
        customdata = matrix.exposed_ms
        hover = "rank %{y}, step %{x}<br>step time %{z:.1f} ms<br>exposed comm %{customdata:.1f} ms<extra></extra>"
    x = column_x(matrix)  # a bin at its middle (the last may hold fewer steps)
    ends = _scale(matrix)
    clipped = ends is not None and float(np.nanmax(matrix.step_ms)) > ends[1]
    scale: dict[str, object] = {"zauto": True} if ends is None else {"zmin": ends[0], "zmax": ends[1], "zauto": False}
    ranks = np.asarray(matrix.ranks)
    heat = go.Heatmap(z=matrix.step_ms, x=x, y=ranks, customdata=customdata, hovertemplate=hover,
                      hoverongaps=False, colorscale="YlOrRd", **scale, zsmooth=_smoothing(x, ranks, matrix.step_ms.size),
                      colorbar={"title": {"text": f"ms<br>(≥{ends[1]:.0f}:<br>darkest)" if clipped and ends else "ms"},
                                "len": 0.9})
    fig = go.Figure(heat)
    base_layout(fig, title, _heat_height(len(matrix.ranks)),
                meta={"ranks": len(matrix.ranks), "steps": matrix.total_steps, "bin_size": matrix.bin_size})
    fig.update_layout(xaxis={"title": "step (from 1)"}, yaxis={**_rank_axis(len(matrix.ranks)), "autorange": "reversed"})
    return fig


def _bar_height(ranks: int) -> int:
    return 360 if ranks <= 64 else 420


def waits_figure(w: Waits) -> go.Figure:
    if len(w.ranks) < 2:
        return empty(WAITS_TITLE, "one rank: there is no peer to wait for")
    if not w.compared:
        return empty(WAITS_TITLE, "no collective matched on every rank" if w.measured else
                     "no step that every rank has finished yet")
    return _measured_waits(w) if w.measured else _live_waits(w)


def _measured_waits(w: Waits) -> go.Figure:
    ranks = [r.rank for r in w.ranks]
    extra = [[r.late, w.compared, r.steps_most_waited_for or 0] for r in w.ranks]
    detail = (f"<br>last at %{{customdata[0]}} of %{{customdata[1]}} matched collectives<br>its peers waited "
              f"for it the most in %{{customdata[2]}} of {w.steps} steps<extra></extra>")
    fig = go.Figure([
        go.Bar(x=ranks, y=[r.caused_wait_s for r in w.ranks], name="peers waited for it (s)", customdata=extra,
               marker_color=WAIT_COLOURS["caused"], hovertemplate="rank %{x}: its peers waited %{y:.3f} s for it"
               + detail),
        go.Bar(x=ranks, y=[r.waited_s for r in w.ranks], name="it waited for peers (s)", customdata=extra,
               marker_color=WAIT_COLOURS["waited"], hovertemplate="rank %{x}: it waited %{y:.3f} s for later peers"
               + detail),
    ])
    base_layout(fig, f"{WAITS_TITLE}: waits at collectives over the steps after the first ({w.steps} steps, "
                     "as `zeromon report` judges them)", _bar_height(len(ranks)),
                barmode="group", legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"})
    fig.update_layout(xaxis=_rank_axis(len(ranks)), yaxis={"title": "seconds", "rangemode": "tozero"})
    fig.update_layout(margin={"t": 80})
    return fig


def _live_waits(w: Waits) -> go.Figure:
    ranks = [r.rank for r in w.ranks]
    share = [r.late / w.compared for r in w.ranks]
    fig = go.Figure(go.Bar(
        x=ranks, y=[r.late for r in w.ranks], customdata=share, name="steps it finished last",
        marker_color=WAIT_COLOURS["caused"],
        hovertemplate=f"rank %{{x}}: finished last in %{{y}} of {w.compared} steps (%{{customdata:.0%}})"
                      "<extra></extra>"))
    base_layout(fig, f"{WAITS_TITLE} (live approximation): the rank that finished each step last, over the "
                     f"{w.compared} steps every rank has finished", _bar_height(len(ranks)))
    fig.update_layout(xaxis=_rank_axis(len(ranks)), yaxis={"title": "steps finished last", "rangemode": "tozero"})
    return fig


def _difference(peak: int, median: float) -> str:
    diff = peak - median
    share = f" ({diff / median:+.1%})" if median > 0 else ""
    return f"{'+' if diff >= 0 else '-'}{format_bytes(round(abs(diff)))}{share} against the median"


def imbalance_figure(peaks: MemoryPeaks, finding: Finding | None = None) -> go.Figure:
    """Bars: each rank's peak; a line: the median; the finding's rank (the highest) in the warning colour."""
    median = peaks.median
    if not peaks.peaks or median is None:
        return empty(IMBALANCE_TITLE, "no memory sample yet")
    name, size = unit(max(peaks.peaks.values()))
    ranks = list(peaks.peaks)
    colours = [LEVEL_COLOURS["warn"] if finding is not None and r == finding.rank else BAR_COLOUR for r in ranks]
    fig = go.Figure(go.Bar(
        x=ranks, y=[peaks.peaks[r] / size for r in ranks], marker_color=colours, name=f"peak ({peaks.level})",
        customdata=[[format_bytes(peaks.peaks[r]), _difference(peaks.peaks[r], median)] for r in ranks],
        hovertemplate="rank %{x}: peak %{customdata[0]}<br>%{customdata[1]}<extra></extra>"))
    fig.add_hline(y=median / size, line_dash="dash", line_color="#525252",
                  annotation_text=f"median {format_bytes(round(median))}", annotation_position="top left")
    base_layout(fig, f"{IMBALANCE_TITLE} ({peaks.level}, {name})", _bar_height(len(ranks)))
    fig.update_layout(xaxis=_rank_axis(len(ranks)), yaxis={"title": name, "rangemode": "tozero"})
    return fig
