"""The Memory page's figures: memory over time per rank (stacked by category, with the level, the
capacity and the forecast's predicted peak), the allocator's counters over time, and the peak per rank
against the capacity and the median."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from tsdownsample import MinMaxLTTBDownsampler

from zeromon.analysis.findings import Severity
from zeromon.exporters.html_report import SMALL_CATEGORIES_SHARE
from zeromon.views.fleet import short_bytes
from zeromon.views.memory import AllocatorSeries, MemoryRow, MemorySeries, peak_spread
from zeromon_dashboard.figures.style import (
    LEVEL_COLOURS,
    axes_of,
    axis_key,
    empty,
    figure_of,
    layout_of,
    rows_layout,
    unit,
)

POINTS_PER_TRACE = 2000  # a longer series is decimated (MinMaxLTTB; its largest and smallest kept)
# Drawn values in float32: 7 digits are more than a plot shows, and half the bytes sent (a live page
# sends its series again every second).
SENT = np.float32
MAX_RANK_ROWS = 4  # ranks drawn over time, one row each: more would be too short to read
# A capacity more than this many times the highest value drawn would flatten the data to a line at
# the bottom (process RSS against host RAM, on CPU): it is said in the title instead.
CAPACITY_FAR_ABOVE = 4.0
ROW_PX = 240
TITLE_PX = 40  # above each row: its title
# The same colour for a category in every row: parameters blue, gradients green, optimizer state
# orange, activations purple, communication buffers pink.
CATEGORY_COLOURS = {
    "sharded_params": "#6baed6", "unsharded_params": "#2171b5", "buffers": "#9ecae1",
    "sharded_grads": "#74c476", "unsharded_grads": "#238b45", "optimizer_state": "#fd8d3c",
    "activations": "#9e9ac8", "temporaries": "#bdbdbd", "all_gather_buffers": "#f768a1",
    "reduce_scatter_buffers": "#c51b8a", "other": "#969696",
}
LINE_COLOURS = {"level": "#111827", "capacity": "#d62728", "predicted": "#ff7f0e", "median": "#525252"}
RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
_RISK_LEVEL = {None: "none", Severity.OK: "ok", Severity.INFO: "ok", Severity.WARN: "warn",
               Severity.CRITICAL: "critical"}
_LEVEL_NAMES = {"ok": "OOM risk ok", "warn": "OOM risk warn", "critical": "OOM risk critical",
                "none": "no forecast"}


# --- decimation ---------------------------------------------------------------------------------------------

def decimated(x: np.ndarray, y: np.ndarray, n_out: int = POINTS_PER_TRACE) -> np.ndarray:
    """The indices (ascending) of the points of (x, y) to draw, at most ``n_out``: all of them when
    they fit, else MinMaxLTTB's pick plus the largest and the smallest point, so that the peak a
    user looks for is always drawn. ``x`` ascending."""
    if len(x) <= n_out:
        return np.arange(len(x))
    index = MinMaxLTTBDownsampler().downsample(x, y, n_out=n_out - 2)
    extremes = np.asarray([np.argmax(y), np.argmin(y)], dtype=np.int64)
    return np.unique(np.concatenate([index.astype(np.int64), extremes]))


def _arrays(x: Sequence[float] | np.ndarray, y: Sequence[float | None] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x and y as float arrays, the points without a value (None, NaN) left out."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = ~np.isnan(ys)
    return (xs, ys) if keep.all() else (xs[keep], ys[keep])


def _line(x: Sequence[float] | np.ndarray, y: Sequence[float | None] | np.ndarray, size: float) -> tuple[np.ndarray, np.ndarray]:
    """Arrays, not lists: plotly checks a list value by value (slow for a page of traces)
    and sends an array as one typed block, float32 (SENT) to halve it."""
    xs, ys = _arrays(x, y)
    index = decimated(xs, ys)
    return xs[index].astype(SENT), (ys[index] / size).astype(SENT)


def _hover(what: str, unit_name: str, rank: int) -> str:
    """``unit_name`` '' for a count."""
    return f"%{{x:.1f}} s: {what} %{{y:.3~f}}{' ' + unit_name if unit_name else ''}<extra>rank {rank}</extra>"


def _how_many(drawn: int, chosen: int, lacking: str) -> str:
    """What the title says when fewer ranks are drawn than were chosen, and why."""
    if chosen <= drawn:
        return ""
    why = f"at most {MAX_RANK_ROWS} are drawn" if drawn == MAX_RANK_ROWS else f"the others have {lacking}"
    return f" ({drawn} of the {chosen} chosen ranks: {why})"


# --- memory over time -----------------------------------------------------------------------------------

def _categories_apart(s: MemorySeries) -> bool:
    """On CPU the categories are a sliver of the process's RSS: drawn on their own axis."""
    return bool(s.categories) and s.stacked_peak_bytes < SMALL_CATEGORIES_SHARE * s.level_peak_bytes


def _draws_capacity(s: MemorySeries) -> bool:
    top = max(s.level_peak_bytes, s.predicted_peak_bytes or 0, 0 if _categories_apart(s) else s.stacked_peak_bytes)
    return bool(s.capacity_bytes) and top * CAPACITY_FAR_ABOVE >= (s.capacity_bytes or 0)


def _level_title(s: MemorySeries, unit_name: str) -> str:
    title = f"rank {s.rank} ({s.device}): {s.level_name}, {unit_name}"
    if s.headroom_bytes is not None:
        title += f"; headroom {short_bytes(s.headroom_bytes)}"
    if s.steps_to_capacity is not None:
        title += ("; already over capacity" if s.steps_to_capacity <= 0
                  else f"; capacity in ~{s.steps_to_capacity:.0f} steps")
    if s.capacity_bytes and not _draws_capacity(s):
        title += f"; capacity {short_bytes(s.capacity_bytes)}, far above, not drawn"
    return title


def _categories_title(s: MemorySeries, unit_name: str) -> str:
    return (f"rank {s.rank} by category, {unit_name} (under {SMALL_CATEGORIES_SHARE:.0%} of the "
            f"{s.level_name}, so drawn apart)")


def _add_categories(data: list[dict[str, Any]], s: MemorySeries, row: int, size: float, unit_name: str,
                    legend: set[str]) -> None:
    """The walks stacked, decimated on their sum so that every category keeps the same times (and
    the stack's highest point is drawn)."""
    x = np.asarray(s.walk_t_s, dtype=np.float64)
    columns = {name: np.asarray(values, dtype=np.float64) for name, values in s.categories}
    index = decimated(x, np.sum(list(columns.values()), axis=0))
    xaxis, yaxis = axes_of(row)
    for name, values in columns.items():
        colour = CATEGORY_COLOURS.get(name, "#969696")
        data.append({
            "type": "scatter", "x": x[index].astype(SENT), "y": (values[index] / size).astype(SENT),
            "name": name.replace("_", " "), "legendgroup": name, "showlegend": name not in legend,
            "stackgroup": f"rank{s.rank}", "mode": "lines", "line": {"shape": "hv", "width": 0.5, "color": colour},
            "fillcolor": colour, "hovertemplate": _hover(name.replace("_", " "), unit_name, s.rank),
            "meta": {"kind": "category", "name": name, "rank": s.rank, "scale": size}, "xaxis": xaxis, "yaxis": yaxis})
        legend.add(name)


def _add_level_lines(data: list[dict[str, Any]], s: MemorySeries, row: int, size: float, unit_name: str,
                     first: bool) -> None:
    x, y = _line(s.t_s, s.level_bytes, size)
    xaxis, yaxis = axes_of(row)
    data.append({"type": "scatter", "x": x, "y": y, "name": "level (allocated on GPU, RSS on CPU)",
                 "legendgroup": "level", "showlegend": first, "mode": "lines",
                 "line": {"color": LINE_COLOURS["level"], "width": 1.5},
                 "hovertemplate": _hover(s.level_name, unit_name, s.rank),
                 "meta": {"kind": "level", "rank": s.rank, "scale": size}, "xaxis": xaxis, "yaxis": yaxis})
    ends = [float(s.t_s[0]), float(s.t_s[-1])] if len(s.t_s) else [float(s.walk_t_s[0]), float(s.walk_t_s[-1])]
    flat = (("predicted", "predicted peak", s.predicted_peak_bytes, "dot"),
            ("capacity", "capacity", s.capacity_bytes if _draws_capacity(s) else None, "dash"))
    for kind, label, value, dash in flat:
        if value is None:
            continue
        data.append({"type": "scatter", "x": ends, "y": [value / size] * 2, "name": label, "legendgroup": kind,
                     "showlegend": first, "mode": "lines",
                     "line": {"color": LINE_COLOURS[kind], "dash": dash, "width": 1.5},
                     "hovertemplate": f"{label}: {short_bytes(value)}<extra>rank {s.rank}</extra>",
                     "meta": {"kind": kind, "rank": s.rank, "scale": size}, "xaxis": xaxis, "yaxis": yaxis})


def _level_unit(s: MemorySeries) -> tuple[str, int]:
    return unit(max(s.level_peak_bytes, s.predicted_peak_bytes or 0,
                    s.capacity_bytes if _draws_capacity(s) and s.capacity_bytes else 0,
                    0 if _categories_apart(s) else s.stacked_peak_bytes))


def _rows_of(shown: Sequence[MemorySeries]) -> list[tuple[str, MemorySeries]]:
    """The figure's rows: each rank's level (its categories stacked under it), and below it a row
    of its own for categories too small to see against the level."""
    return [(kind, s) for s in shown for kind in (("level", "categories") if _categories_apart(s) else ("level",))]


def stack_figure(series: Sequence[MemorySeries], chosen: int | None = None) -> go.Figure:
    """One row per rank (the first MAX_RANK_ROWS; ``chosen``: how many were chosen, said when more):
    the categories stacked, the level, the predicted peak and the capacity, over seconds since the
    run's first sample. Built as dicts (figure_of): the live Memory page redraws it every second."""
    title = "Memory over time by category"
    shown = [s for s in series if len(s.t_s) or len(s.walk_t_s)][:MAX_RANK_ROWS]
    if not shown:
        return empty(title, "no memory sample yet on the chosen ranks")
    title += _how_many(len(shown), max(chosen or 0, len(series)), "no memory sample yet")
    rows = _rows_of(shown)
    units = [_level_unit(s) if kind == "level" else unit(s.stacked_peak_bytes) for kind, s in rows]
    titles = [_level_title(s, u[0]) if kind == "level" else _categories_title(s, u[0])
              for (kind, s), u in zip(rows, units, strict=True)]
    heights = [ROW_PX if kind == "level" else ROW_PX * 0.6 for kind, _ in rows]
    height = 110 + sum(heights) + TITLE_PX * len(rows)
    layout = rows_layout(heights, TITLE_PX / height, titles)
    data: list[dict[str, Any]] = []
    legend: set[str] = set()
    for row, ((kind, s), (unit_name, size)) in enumerate(zip(rows, units, strict=True), start=1):
        if kind == "categories" or (s.categories and not _categories_apart(s)):
            _add_categories(data, s, row, size, unit_name, legend)
        if kind == "level":
            _add_level_lines(data, s, row, size, unit_name, first=row == 1)
        layout[axis_key(axes_of(row)[1])].update(title={"text": unit_name}, rangemode="tozero")
    layout[axis_key(axes_of(len(rows))[0])].update(title={"text": "seconds since the run's first sample"})
    # the first row's title under the figure's
    layout.update(layout_of(title, height=int(height), hovermode="closest"), margin={"l": 60, "r": 20, "t": 80, "b": 50})
    return figure_of(data, layout)


# --- the allocator ----------------------------------------------------------------------------------------

_ALLOCATOR_ROWS = ("fragmentation (reserved − allocated)", "allocator retries (cumulative)",
                   "OOMs (cumulative) and the OOMs seen")


def allocator_figure(series: Sequence[AllocatorSeries], chosen: int | None = None) -> go.Figure:
    """Per rank over time: fragmentation, cudaMalloc retries, OOMs counted and each OOM seen."""
    title = "Allocator: fragmentation, retries and OOMs"
    drawn = [s for s in series if s.has_stats][:MAX_RANK_ROWS]
    if not drawn:
        return empty(title, "no allocator statistics: a CPU run records process RSS only")
    title += _how_many(len(drawn), max(chosen or 0, len(series)), "no allocator statistics")
    frag_unit, frag_size = unit(max((float(np.nanmax(s.fragmentation_bytes)) for s in drawn
                                     if (~np.isnan(s.fragmentation_bytes)).any()), default=0))
    layout = rows_layout((1.0, 1.0, 1.0), 0.1, [f"{_ALLOCATOR_ROWS[0]}, {frag_unit}", *_ALLOCATOR_ROWS[1:]])
    data: list[dict[str, Any]] = []
    for i, s in enumerate(drawn):
        colour = RANK_COLOURS[i % len(RANK_COLOURS)]
        rows: tuple[tuple[np.ndarray, float, str, str], ...] = (
            (s.fragmentation_bytes, frag_size, "fragmentation", frag_unit),
            (s.alloc_retries, 1, "retries", ""), (s.num_ooms, 1, "OOMs", ""))
        for row, (values, size, what, unit_name) in enumerate(rows, start=1):
            x, y = _line(s.t_s, values, size)
            xaxis, yaxis = axes_of(row)
            data.append({"type": "scatter", "x": x, "y": y, "name": f"rank {s.rank}", "legendgroup": f"rank{s.rank}",
                         "showlegend": row == 1, "mode": "lines", "line": {"color": colour, "shape": "hv"},
                         "hovertemplate": _hover(what, unit_name, s.rank),
                         "meta": {"kind": what, "rank": s.rank, "scale": size}, "xaxis": xaxis, "yaxis": yaxis})
        if s.oom_t_s:
            xaxis, yaxis = axes_of(3)
            data.append({"type": "scatter", "x": list(s.oom_t_s), "y": list(range(1, len(s.oom_t_s) + 1)),
                         "mode": "markers", "name": f"rank {s.rank}: OOM seen", "legendgroup": f"rank{s.rank}",
                         "marker": {"symbol": "x", "size": 11, "color": LEVEL_COLOURS["critical"],
                                    "line": {"color": colour, "width": 1}},
                         "hovertext": list(s.oom_texts), "hoverinfo": "text", "meta": {"kind": "oom", "rank": s.rank},
                         "xaxis": xaxis, "yaxis": yaxis})
    for row, axis_title in enumerate((frag_unit, "retries", "OOMs"), start=1):
        layout[axis_key(axes_of(row)[1])].update(rangemode="tozero", title={"text": axis_title})
    layout[axis_key(axes_of(3)[0])].update(title={"text": "seconds since the run's first sample"})
    layout.update(layout_of(title, height=620, hovermode="closest"))
    return figure_of(data, layout)


# --- ranks compared ------------------------------------------------------------------------------------------

def _imbalance_title(rows: Sequence[MemoryRow], unit_name: str, capacity_note: str) -> str:
    spread = peak_spread(rows)
    title = f"Peak memory per rank ({unit_name})"
    if spread is not None and len(rows) > 1:
        apart = ("the ranks peak within 1% of each other" if spread.spread < 0.01
                 else f"rank {spread.high_rank} peaks {spread.spread:.0%} higher than rank {spread.low_rank}")
        title += f": {apart}; median {short_bytes(spread.median_bytes)}"
    return title + capacity_note


def _segments(rows: Sequence[MemoryRow], value: Any, size: float) -> tuple[list[float | None], list[float | None]]:
    """A short level line over each rank's bar (x ± 0.45), gaps between: one trace for all ranks."""
    x: list[float | None] = []
    y: list[float | None] = []
    for r in rows:
        v = value(r)
        if v is not None:
            x += [r.rank - 0.45, r.rank + 0.45, None]
            y += [v / size, v / size, None]
    return x, y


def imbalance_figure(rows: Sequence[MemoryRow]) -> go.Figure:
    """Bars: each rank's peak, coloured by its OOM risk; lines: its capacity and the median of the
    peaks; diamonds: the forecast's predicted peak."""
    with_peak = [r for r in rows if r.peak_bytes is not None]
    if not with_peak:
        return empty("Peak memory per rank", "no memory sample yet")
    top = max(max(r.peak_bytes or 0, r.predicted_peak_bytes or 0) for r in with_peak)
    capacities = [r.capacity_bytes for r in with_peak if r.capacity_bytes]
    far = bool(capacities) and max(capacities) > CAPACITY_FAR_ABOVE * top
    unit_name, size = unit(top if far or not capacities else max(top, *capacities))
    note = f"; capacity {short_bytes(max(capacities))}, far above, not drawn" if far else ""
    data: list[dict[str, Any]] = []
    for level in ("critical", "warn", "ok", "none"):
        group = [r for r in with_peak if _RISK_LEVEL[r.risk] == level]
        if group:
            data.append({
                "type": "bar", "x": [r.rank for r in group], "y": [(r.peak_bytes or 0) / size for r in group],
                "name": _LEVEL_NAMES[level], "marker": {"color": LEVEL_COLOURS[level]},
                "hovertext": [f"rank {r.rank}: peak {r.texts['peak']}, predicted {r.texts['predicted peak']}, "
                              f"capacity {r.texts['capacity']}, headroom {r.texts['headroom']}" for r in group],
                "hoverinfo": "text", "meta": {"kind": "peak", "level": level, "scale": size}})
    x, y = _segments(with_peak, lambda r: r.predicted_peak_bytes, size)
    data.append({"type": "scatter", "x": x, "y": y, "mode": "lines", "name": "predicted peak", "hoverinfo": "skip",
                 "line": {"color": LINE_COLOURS["predicted"], "dash": "dot", "width": 2},
                 "meta": {"kind": "predicted", "scale": size}})
    if capacities and not far:
        x, y = _segments(with_peak, lambda r: r.capacity_bytes, size)
        data.append({"type": "scatter", "x": x, "y": y, "mode": "lines", "name": "capacity", "hoverinfo": "skip",
                     "line": {"color": LINE_COLOURS["capacity"], "dash": "dash", "width": 2},
                     "meta": {"kind": "capacity", "scale": size}})
    spread = peak_spread(with_peak)
    if spread is not None and len(with_peak) > 1:
        ends = [min(r.rank for r in with_peak) - 0.5, max(r.rank for r in with_peak) + 0.5]
        data.append({"type": "scatter", "x": ends, "y": [spread.median_bytes / size] * 2, "mode": "lines",
                     "name": "median peak", "line": {"color": LINE_COLOURS["median"], "width": 1.5},
                     "hovertemplate": f"median peak {short_bytes(spread.median_bytes)}<extra></extra>",
                     "meta": {"kind": "median", "scale": size}})
    layout = layout_of(_imbalance_title(with_peak, unit_name, note), height=340, barmode="overlay", bargap=0.15,
                       xaxis={"title": {"text": "rank"}, "tickmode": "auto" if len(with_peak) > 32 else "linear"},
                       yaxis={"title": {"text": unit_name}, "rangemode": "tozero"}, hovermode="closest")
    return figure_of(data, layout)
