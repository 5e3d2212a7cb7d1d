"""The Communication page's figures: one step's timeline per rank, exposed communication and overlap
per step, bus bandwidth by op and message size, and bytes per step by ZeRO meaning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from tsdownsample import MinMaxLTTBDownsampler

from zeromon.analysis.bandwidth import BandwidthRow, bucket_label, format_rate
from zeromon.exporters.html_report import TimelineBars
from zeromon.model.events import CollectiveEvent, phase_words
from zeromon.views.fleet import short_bytes
from zeromon.views.timeline import RankStep, StepBytes, StepSeries, StepTimeline
from zeromon_dashboard.figures.style import (
    MEANING_COLOURS,
    OTHER_COLOURS,
    PHASE_COLOURS,
    base_layout,
    empty,
    unit,
)

POINTS_PER_TRACE = 2000  # a longer series is decimated (MinMaxLTTB keeps its peaks)
# What a timeline marks besides phases and collectives, in the band's third row.
MARK_COLOURS = {"overlap": "#31a354", "exposed": "#d62728", "blocked": "#636363"}
_PHASE_ORDER = ("forward", "backward", "optimizer", "other", "agent")
_ROW_PX = 26
_LEGEND_ROW_PX = 20


def _rows(rank: RankStep) -> tuple[str, str, str]:
    """The band's three rows: compute (and waits), collectives, overlap and exposed (its total)."""
    return (f"rank {rank.rank} · compute",
            f"rank {rank.rank} · collectives ({len(rank.collectives)})",
            f"rank {rank.rank} · exposed {rank.exposed_s * 1e3:.1f} ms")


def _collective_hover(c: CollectiveEvent, origin_ns: int) -> str:
    complete = c.complete_ns or c.issue_ns
    return (f"<b>{c.meaning}</b>: {c.op} ({c.api})<br>{short_bytes(c.bytes_in)} in, {short_bytes(c.bytes_out)} out, "
            f"{c.dtype}, group of {c.group_size}<br>issue→complete {(c.issue_ns - origin_ns) / 1e6:.2f}→"
            f"{(complete - origin_ns) / 1e6:.2f} ms ({(complete - c.issue_ns) / 1e6:.2f} ms, timing {c.timing})"
            f"<br>blocked {c.blocked_s * 1e3:.2f} ms{' (async)' if c.async_op else ''}")


def _interval_hover(kind: str, rank: int, start_ns: int, end_ns: int, origin_ns: int) -> str:
    return (f"rank {rank}: {kind} {(end_ns - start_ns) / 1e6:.2f} ms<br>{(start_ns - origin_ns) / 1e6:.2f}→"
            f"{(end_ns - origin_ns) / 1e6:.2f} ms")


def _band(rank: RankStep, origin: int, bars: dict[tuple[str, str], TimelineBars]) -> None:
    compute, comm, marks = _rows(rank)
    for p in rank.phases:
        bars.setdefault(("phase", p.phase), TimelineBars()).add(
            compute, p.start_ns - origin, p.end_ns - p.start_ns,
            _interval_hover(phase_words(p.phase), rank.rank, p.start_ns, p.end_ns, origin))
    for c in rank.collectives:
        if c.complete_ns is not None:
            bars.setdefault(("comm", c.meaning), TimelineBars()).add(comm, c.issue_ns - origin,
                                                                     c.complete_ns - c.issue_ns,
                                                                     _collective_hover(c, origin))
    intervals = rank.intervals
    for kind, row, spans in (("blocked", compute, intervals.blocked), ("overlap", marks, intervals.overlap),
                             ("exposed", marks, intervals.exposed)):
        for start, end in spans:
            bars.setdefault(("mark", kind), TimelineBars()).add(row, start - origin, end - start,
                                                                _interval_hover(kind, rank.rank, start, end, origin))


def _trace_order(key: tuple[str, str]) -> tuple[int, int, str]:
    kind, name = key
    order: Sequence[str] = {"phase": _PHASE_ORDER, "comm": tuple(MEANING_COLOURS), "mark": tuple(MARK_COLOURS)}[kind]
    return (("phase", "comm", "mark").index(kind), order.index(name) if name in order else len(order), name)


def _bar_trace(kind: str, name: str, bar: TimelineBars) -> go.Bar:
    colour = (PHASE_COLOURS.get(name, OTHER_COLOURS["phase"]) if kind == "phase" else
              MEANING_COLOURS.get(name, OTHER_COLOURS["comm"]) if kind == "comm" else MARK_COLOURS[name])
    label = {"phase": phase_words(name), "comm": f"comm: {name}", "mark": {"blocked": "blocked (waiting)", "overlap": "overlap",
                                                              "exposed": "exposed comm"}.get(name, name)}[kind]
    marker: dict[str, Any] = {"color": colour, "line": {"width": 0}}
    if kind == "mark" and name == "blocked":  # over the phases it cuts out of compute: hatched, half height
        marker.update(color="rgba(0,0,0,0)", pattern={"shape": "/", "fgcolor": colour, "size": 6, "solidity": 0.5},
                      line={"width": 1, "color": colour})
    # numpy arrays: plotly validates a list item by item (slow for thousands of bars), an array at once
    return go.Bar(y=np.array(bar.rows, dtype=object), x=np.array(bar.lengths_ms), base=np.array(bar.starts_ms),
                  orientation="h", name=label, marker=marker,
                  width=0.45 if (kind, name) == ("mark", "blocked") else 0.8, hovertext=np.array(bar.hovers, dtype=object),
                  hoverinfo="text", opacity=0.85 if kind == "comm" else 1.0, meta={"kind": kind, "name": name})


def timeline_figure(timeline: StepTimeline) -> go.Figure:
    """One band of three rows per rank; x in ms since the earliest drawn rank's step start (all
    ranks' clocks are the host's, so a wait on one rank lines up with the late peer it waited for)."""
    title = f"Step {timeline.step + 1}: computation, collectives, overlap and exposed communication"
    if not timeline.ranks or timeline.origin_ns is None:
        why = "; ".join(why for _, why in timeline.missing) or "no rank chosen"
        return empty(title, why)
    origin = timeline.origin_ns
    bars: dict[tuple[str, str], TimelineBars] = {}
    for rank in timeline.ranks:
        _band(rank, origin, bars)
    fig = go.Figure([_bar_trace(kind, name, bars[(kind, name)]) for kind, name in sorted(bars, key=_trace_order)])
    rows = [row for rank in timeline.ranks for row in _rows(rank)]
    notes = [why for _, why in timeline.missing]
    notes += [f"rank {r.rank}: step had no collectives" for r in timeline.ranks if not r.collectives]
    notes += [f"rank {r.rank}: {n} collective{'s' if n > 1 else ''} without an observed completion, not drawn"
              for r in timeline.ranks if (n := sum(c.complete_ns is None for c in r.collectives))]
    # The legend stands right of the plot, where no axis title is: below it, a paper-relative place ran into
    # the x-axis title whenever the tick labels or the rows changed the plot's height. The height leaves it
    # room for an entry a line.
    base_layout(fig, title + (f"<br><sup>{'; '.join(notes)}</sup>" if notes else ""),
                height=140 + max(_ROW_PX * len(rows), _LEGEND_ROW_PX * len(bars)))
    fig.update_layout(barmode="overlay", bargap=0.15, hovermode="closest",
                      xaxis={"title": "ms since the earliest chosen rank's step start", "rangemode": "tozero"},
                      yaxis={"categoryorder": "array", "categoryarray": rows, "autorange": "reversed",
                             "automargin": True},
                      legend={"x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top"},
                      meta={"step": timeline.step, "exposed_ms": {str(r.rank): r.exposed_s * 1e3 for r in timeline.ranks}})
    return fig


# --- over the run ------------------------------------------------------------------------------------------

def decimate(x: Sequence[float], y: Sequence[float | None], n_out: int = POINTS_PER_TRACE) -> tuple[list[float], list[float]]:
    """The points of (x, y) to draw: all of them up to n_out, else MinMaxLTTB's pick (peaks kept).
    Points without a value are left out (a step without communication has no overlap ratio)."""
    xs = [a for a, b in zip(x, y, strict=True) if b is not None]
    ys = [b for b in y if b is not None]
    if len(xs) <= n_out:
        return xs, ys
    x_arr, y_arr = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    index = MinMaxLTTBDownsampler().downsample(x_arr, y_arr, n_out=n_out)
    return x_arr[index].tolist(), y_arr[index].tolist()


def per_step_figure(series: Sequence[StepSeries], selected_step: int | None) -> go.Figure:
    """Exposed communication (ms, left axis) and overlap (%, right axis) per step, steps from 1."""
    title = "Exposed communication and overlap per step"
    if not any(s.steps for s in series):
        return empty(title, "no step summarized yet on the chosen ranks")
    fig = go.Figure()
    for s in series:
        numbers = [step + 1 for step in s.steps]
        x, y = decimate(numbers, [None if e is None else e * 1e3 for e in s.exposed_s])
        fig.add_trace(go.Scatter(x=x, y=y, name=f"rank {s.rank}: exposed (ms)", mode="lines+markers" if len(x) < 200
                                 else "lines", hovertemplate="step %{x}: exposed %{y:.2f} ms<extra>rank " + f"{s.rank}</extra>"))
        x, y = decimate(numbers, [None if r is None else 100 * r for r in s.overlap_ratio])
        fig.add_trace(go.Scatter(x=x, y=y, name=f"rank {s.rank}: overlap (%)", mode="lines", yaxis="y2",
                                 line={"dash": "dot"},
                                 hovertemplate="step %{x}: overlap %{y:.1f}%<extra>rank " + f"{s.rank}</extra>"))
    base_layout(fig, title, height=340)
    fig.update_layout(xaxis={"title": "step (from 1)"}, yaxis={"title": "exposed communication (ms)", "rangemode": "tozero"},
                      yaxis2={"title": "overlap (% of communication)", "overlaying": "y", "side": "right",
                              "range": [0, 105], "tickmode": "array", "tickvals": [0, 25, 50, 75, 100],
                              "showgrid": False, "zeroline": False},
                      legend={"x": 1.08, "xanchor": "left"}, hovermode="closest")
    if selected_step is not None:
        fig.add_vline(x=selected_step + 1, line={"color": "#555", "dash": "dash", "width": 1},
                      annotation_text=f"step {selected_step + 1}", annotation_position="top")
    return fig


def _bucket_middle(bucket: int) -> int:
    """Where a size bucket [b, 4b) sits on a log axis: 2b (512 for the one up to 1 KiB)."""
    return 2 * bucket if bucket else 512


def bandwidth_figure(rows: Sequence[BandwidthRow], peak_busbw: float | None) -> go.Figure:
    """Median busbw per op and message-size bucket (one line per op and group size), the peak as a line."""
    title = "Bus bandwidth by op and message size (nccl-tests busbw, median)"
    if not rows:
        return empty(title, "no collective with a measured duration yet")
    fig = go.Figure()
    for op, n in sorted({(r.op, r.group_size) for r in rows}):
        mine = sorted((r for r in rows if (r.op, r.group_size) == (op, n)), key=lambda r: r.size_bucket_bytes)
        fig.add_trace(go.Scatter(
            x=[_bucket_middle(r.size_bucket_bytes) for r in mine], y=[r.median_busbw / 1e9 for r in mine],
            mode="lines+markers", name=f"{op} (group of {n})", hoverinfo="text",
            hovertext=[f"{op}, group of {n}, {bucket_label(r.size_bucket_bytes)}: {r.count} calls<br>"
                       f"busbw {format_rate(r.median_busbw)} (p10 {format_rate(r.busbw_p10)}), algbw "
                       f"{format_rate(r.median_algbw)}" + (f"<br>{r.peak_share:.0%} of the peak" if r.peak_share
                                                             else "") for r in mine]))
    buckets = sorted({r.size_bucket_bytes for r in rows})
    base_layout(fig, title, height=360)
    fig.update_layout(xaxis={"title": "message size (nccl-tests S)", "type": "log", "tickmode": "array",
                             "tickvals": [_bucket_middle(b) for b in buckets],
                             "ticktext": [bucket_label(b) for b in buckets]},
                      yaxis={"title": "busbw (GB/s)", "rangemode": "tozero"})
    if peak_busbw:
        fig.add_hline(y=peak_busbw / 1e9, line={"color": "#d62728", "dash": "dash"},
                      annotation_text=f"peak {format_rate(peak_busbw)}", annotation_position="top left")
    return fig


def bytes_figure(sums: StepBytes | None) -> go.Figure:
    """Bytes per step, stacked by ZeRO meaning, for one rank."""
    if sums is None or not sums.steps:
        rank = f"rank {sums.rank}" if sums is not None else "the chosen rank"
        return empty("Bytes per step by ZeRO meaning", f"no collectives held for {rank}")
    title = f"Rank {sums.rank}: bytes per step by ZeRO meaning"
    largest = max(sum(v[i] for v in sums.by_meaning.values()) for i in range(len(sums.steps)))
    name, scale = unit(largest)
    numbers = [s + 1 for s in sums.steps]
    order = sorted(sums.by_meaning, key=lambda m: (list(MEANING_COLOURS).index(m) if m in MEANING_COLOURS else 99, m))
    fig = go.Figure([go.Bar(x=numbers, y=[b / scale for b in sums.by_meaning[m]], name=m,
                            marker_color=MEANING_COLOURS.get(m, OTHER_COLOURS["comm"]), customdata=sums.by_meaning[m],
                            hovertemplate=f"step %{{x}}: {m} %{{y:.3g}} {name} (%{{customdata}} bytes)<extra></extra>")
                     for m in order])
    base_layout(fig, title, height=320)
    fig.update_layout(barmode="stack", bargap=0.1, xaxis={"title": "step (from 1)"},
                      yaxis={"title": f"bytes moved ({name})", "rangemode": "tozero"})
    return fig
