"""`zeromon report --html FILE`: one self-contained page (plotly.js inlined, packed) with the report's figures.

For a recording: memory over time by category, the communication/computation timeline of one step,
overlap and exposed communication per step, and bus bandwidth by op and message size. For profiler
traces (`--trace`): each rank's temporal breakdown and overlap, and exposed communication per
iteration.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Sequence
from typing import Any

from zeromon.analysis.bandwidth import bucket_label, format_rate
from zeromon.analysis.finding_groups import FindingGroup, group_findings
from zeromon.analysis.findings import Severity
from zeromon.analysis.report import RankReport, RunReport
from zeromon.analysis.trace_overlap import RankTraceOverlap
from zeromon.model.codec import Recording
from zeromon.model.events import phase_words
from zeromon.model.units import format_bytes

# Categories far below the level they are part of (process RSS on CPU: a small model's parameters in
# the whole process's memory) would be a flat line at zero on its axis: they get a plot of their own below it.
SMALL_CATEGORIES_SHARE = 0.05


def _unit(largest_bytes: float) -> tuple[str, int]:
    """The binary unit that shows values up to ``largest_bytes`` with a few digits."""
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest_bytes >= size:
            return name, size
    return "B", 1


def _memory_figure(report: RunReport, recordings: Sequence[Recording], t0: int) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    first = recordings[0]
    levels = []  # per rank: (label, [(t_ns, bytes)])
    for rec in recordings:
        points = [(m.t_ns, level) for m in rec.memory
                  if (level := m.allocated if m.allocated is not None else m.rss) is not None]
        label = "allocated" if any(m.allocated is not None for m in rec.memory) else "RSS"
        levels.append((f"rank {rec.rank}: {label}", points))
    walked = [m for m in first.memory if len(m.categories) > 1]
    names = sorted({k for m in walked for k in m.categories})
    # A category walk costs time, so the agent walks now and then: each walk holds until the next,
    # and the last one to the rank's last sample, where the level line ends too.
    times = [m.t_ns for m in walked]
    values = {name: [m.categories.get(name, 0) for m in walked] for name in names}
    if walked and first.memory[-1].t_ns > times[-1]:
        times.append(first.memory[-1].t_ns)
        for name in names:
            values[name].append(values[name][-1])
    stacked_peak = max((sum(column) for column in zip(*values.values(), strict=True)), default=0)
    level_peak = max((v for _, points in levels for _, v in points), default=0)
    apart = bool(names) and stacked_peak < SMALL_CATEGORIES_SHARE * level_peak
    level_unit, level_size = _unit(level_peak)
    cat_unit, cat_size = _unit(stacked_peak) if apart else (level_unit, level_size)

    if apart:
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.55, 0.45], vertical_spacing=0.12,
                            subplot_titles=("level per rank",
                                            f"rank {first.rank} by category ({cat_unit}; under "
                                            f"{SMALL_CATEGORIES_SHARE:.0%} of the level, so drawn apart)"))
        where: dict[str, int] = {"row": 2, "col": 1}
        level_where: dict[str, int] = {"row": 1, "col": 1}
    else:
        fig = go.Figure()
        where = level_where = {}
    for name in names:
        fig.add_trace(go.Scatter(x=[(t - t0) / 1e9 for t in times], y=[v / cat_size for v in values[name]],
                                 name=f"rank {first.rank}: {name}", stackgroup="categories", mode="lines",
                                 line={"shape": "hv"}), **where)
    for label, points in levels:
        fig.add_trace(go.Scatter(x=[(t - t0) / 1e9 for t, _ in points], y=[v / level_size for _, v in points],
                                 name=label, mode="lines", line={"dash": "dot"}), **level_where)

    capacity = report.ranks[0].capacity if report.ranks else None
    peak = max((r.peak_memory or 0 for r in report.ranks), default=0)
    title = f"Memory over time ({level_unit})"
    if capacity and peak >= capacity / 4:
        fig.add_hline(y=capacity / level_size, line_dash="dash", annotation_text="capacity", **level_where)
    elif capacity:  # a line far above the data would flatten it: say it instead
        title += f"; capacity {format_bytes(capacity)} per rank, far above these levels, is not drawn"
    fig.update_layout(title=title)
    if not names and not any(points for _, points in levels):
        fig.update_layout(title="Memory over time")
        _say_empty(fig, "no memory samples in this recording")
        return fig
    fig.update_xaxes(title_text="seconds", **where)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text=level_unit, **level_where)
    if apart:
        fig.update_yaxes(title_text=cat_unit, **where)
    return fig


# The timeline's colours say what a bar is, the same in every report: phases in light tints,
# communication by ZeRO meaning in strong colours of other hues.
PHASE_COLOURS = {"setup": "#d9d9d9", "forward": "#c6dbef", "backward": "#c7e9c0", "optimizer": "#fdd0a2",
                 "other": "#f0f0f0", "agent": "#bcbddc"}
MEANING_COLOURS = {"param_all_gather": "#6a3d9a", "grad_reduce_scatter": "#e7298a", "grad_all_reduce": "#8c510a",
                   "param_broadcast": "#01665e", "unknown": "#525252"}
OTHER_COLOURS = {"phase": "#f0f0f0", "comm": "#252525"}
# HTA's temporal breakdown: compute, non-compute (exposed communication, copies) in the exposed red, idle.
BREAKDOWN_COLOURS = {"compute": "#74c476", "non-compute": "#d62728", "idle": "#d9d9d9"}
_PHASE_ORDER = ("setup", "forward", "backward", "optimizer")
_MEANING_ORDER = tuple(MEANING_COLOURS)


def _legend_order(kind: str, name: str) -> tuple[int, int, str]:
    """Phases in step order, then the collectives' meanings in a fixed order."""
    order = _PHASE_ORDER if kind == "phase" else _MEANING_ORDER
    return (kind != "phase", order.index(name) if name in order else len(order), name)


class TimelineBars:
    """The bars of one timeline trace: row, start and length (ns from the step's start), hover text
    (this report's timeline and the dashboard's)."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.starts_ms: list[float] = []
        self.lengths_ms: list[float] = []
        self.hovers: list[str] = []

    def add(self, row: str, start_ns: int, length_ns: int, hover: str) -> None:
        self.rows.append(row)
        self.starts_ms.append(start_ns / 1e6)
        self.lengths_ms.append(length_ns / 1e6)
        self.hovers.append(hover)


def _say_empty(fig: Any, message: str) -> None:
    """A figure without data says why, instead of empty axes."""
    fig.add_annotation(text=message, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                       font={"size": 16, "color": "#555"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)


def _percent_axis(title: str) -> dict[str, Any]:
    """A right-hand 0-100 % axis over another: its own ticks (not the left axis' grid) and room above 100."""
    return {"title": title, "overlaying": "y", "side": "right", "range": [0, 105], "tickmode": "array",
            "tickvals": [0, 25, 50, 75, 100], "showgrid": False, "zeroline": False}


# The legend's place beside a right-hand axis: past its tick labels and title.
_LEGEND_PAST_RIGHT_AXIS = {"x": 1.1, "xanchor": "left"}


def _figures(report: RunReport, recordings: Sequence[Recording]) -> list[tuple[str, Any]]:
    import plotly.graph_objects as go

    figures: list[tuple[str, Any]] = []
    first = recordings[0]
    t0 = min((m.t_ns for rec in recordings for m in rec.memory), default=0)
    figures.append(("memory", _memory_figure(report, recordings, t0)))

    # One step's timeline: phases and collectives of the first rank's median step.
    steps = [s for s in first.steps if s.step >= 1] or list(first.steps)
    if steps:
        durations = sorted(steps, key=lambda s: s.duration_s)
        step = durations[len(durations) // 2]
        lo = step.start_ns
        timeline = go.Figure()
        # One trace (one legend entry, one colour) per phase, then per ZeRO meaning of the collectives.
        bars: dict[tuple[str, str], TimelineBars] = {}
        for span in first.phases:
            if span.step == step.step and span.phase != "other":
                bars.setdefault(("phase", span.phase), TimelineBars()).add(
                    "compute (phases)", span.start_ns - lo, span.end_ns - span.start_ns, phase_words(span.phase))
        c = first.collective_columns()  # only the step's events are looked at, by index
        for i in [i for i, s in enumerate(c.step) if s == step.step and c.complete_ns[i] is not None]:
            issue, complete = c.issue_ns[i], c.complete_ns[i] or 0
            bars.setdefault(("comm", c.meaning[i]), TimelineBars()).add(
                f"comm: {c.op[i]}", issue - lo, complete - issue,
                f"{c.meaning[i]}: {c.api[i]} {format_bytes(max(c.bytes_in[i], c.bytes_out[i]))} {c.timing[i]}")
        for (kind, name), bar in sorted(bars.items(), key=lambda item: _legend_order(*item[0])):
            colour = (PHASE_COLOURS if kind == "phase" else MEANING_COLOURS).get(name, OTHER_COLOURS[kind])
            timeline.add_trace(go.Bar(y=bar.rows, x=bar.lengths_ms, base=bar.starts_ms, orientation="h",
                                      name=f"{kind}: {phase_words(name)}", marker_color=colour, hovertext=bar.hovers))
        timeline.update_layout(title=f"Rank {first.rank}, step {step.step + 1}: communication and computation (ms)",
                               barmode="overlay", xaxis_title="ms since the step began")
        if not bars:
            _say_empty(timeline, "no phases or completed collectives recorded in this step")
        figures.append(("timeline", timeline))
    else:
        timeline = go.Figure()
        timeline.update_layout(title=f"Rank {first.rank}: communication and computation of a step")
        _say_empty(timeline, "no steps in this recording")
        figures.append(("timeline", timeline))

    # Overlap per step.
    # Overlap per step, steps numbered from 1 as training scripts log them (the JSON keeps the index).
    overlap = go.Figure()
    drawn = {rec.rank for rec in recordings}
    for rank in (r for r in report.ranks if r.rank in drawn):
        numbers = [s.step + 1 for s in rank.steps]
        overlap.add_trace(go.Scatter(x=numbers, y=[s.exposed_comm_s * 1e3 for s in rank.steps],
                                     name=f"rank {rank.rank}: exposed comm (ms)", mode="lines+markers"))
        overlap.add_trace(go.Scatter(x=numbers,
                                     y=[100 * r if (r := s.overlap_ratio) is not None else None for s in rank.steps],
                                     name=f"rank {rank.rank}: overlap %", mode="lines", yaxis="y2"))
    overlap.update_layout(title="Exposed communication and overlap per step", xaxis_title="step (from 1)",
                          yaxis={"title": "exposed ms", "rangemode": "tozero"}, yaxis2=_percent_axis("overlap %"),
                          legend=_LEGEND_PAST_RIGHT_AXIS)
    if not any(rank.steps for rank in report.ranks):
        _say_empty(overlap, "no steps in this recording")
    figures.append(("overlap", overlap))

    # Bandwidth by op and size: each bucket [b, 4b) drawn at its middle (2b on the log axis).
    bandwidth = go.Figure()
    buckets = sorted({b.size_bucket_bytes for b in report.bandwidth})
    for op in sorted({b.op for b in report.bandwidth}):
        rows = sorted((b for b in report.bandwidth if b.op == op), key=lambda b: b.size_bucket_bytes)
        bandwidth.add_trace(go.Scatter(x=[_bucket_middle(b.size_bucket_bytes) for b in rows],
                                       y=[b.median_busbw / 1e9 for b in rows], name=op, mode="lines+markers",
                                       hovertext=[f"{bucket_label(b.size_bucket_bytes)}: {b.count} calls, "
                                                  f"{format_rate(b.median_busbw)}" for b in rows]))
    bandwidth.update_layout(title="Bus bandwidth by op and message size (nccl-tests busbw)",
                            xaxis={"title": "message size", "type": "log", "tickmode": "array",
                                   "tickvals": [_bucket_middle(b) for b in buckets],
                                   "ticktext": [bucket_label(b) for b in buckets]},
                            yaxis={"title": "GB/s", "rangemode": "tozero"})
    if not report.bandwidth:
        _say_empty(bandwidth, "no collectives with a measured duration in this recording")
    figures.append(("bandwidth", bandwidth))
    return figures


def _bucket_middle(bucket: int) -> int:
    """Where a size bucket [b, 4b) sits on a log axis: 2b (512 for the one up to 1 KiB)."""
    return 2 * bucket if bucket else 512


def trace_figures(results: Sequence[RankTraceOverlap]) -> list[tuple[str, Any]]:
    """The trace analysis' figures, named: each rank's temporal breakdown, its overlap and exposed
    communication, and (where the traces have ProfilerStep iterations) both per iteration. This page
    and the dashboard's Trace page draw these."""
    import plotly.graph_objects as go

    figures: list[tuple[str, Any]] = []
    labels = [f"rank {r.rank}" for r in results]

    # Temporal breakdown per rank, as HTA draws it: shares of the kernel time.
    breakdown = go.Figure()
    for name, field in (("compute", "compute_time"), ("non-compute", "non_compute_time"), ("idle", "idle_time")):
        parts = [r.total.breakdown for r in results]
        breakdown.add_trace(go.Bar(y=labels, x=[getattr(b, f"{field}_pctg") for b in parts], name=name,
                                   orientation="h", marker_color=BREAKDOWN_COLOURS[name],
                                   hovertext=[f"{getattr(b, f'{field}_ns') / 1e6:.1f} ms" for b in parts],
                                   hovertemplate=f"%{{y}}: {name} %{{x:.2f}}% of kernel time "
                                                 "(%{hovertext})<extra></extra>"))
    breakdown.update_layout(title="Temporal breakdown per rank (% of GPU kernel time, whole trace)",
                            barmode="stack", xaxis={"title": "% of kernel time", "range": [0, 100]},
                            yaxis={"autorange": "reversed"})
    figures.append(("trace-breakdown", breakdown))

    # Overlap and exposed communication per rank, over the whole trace.
    per_rank = go.Figure()
    per_rank.add_trace(go.Bar(x=labels, y=[r.total.exposed_comm_ns / 1e6 for r in results], name="exposed comm (ms)",
                              offsetgroup="exposed", hovertemplate="%{x}: exposed comm %{y:.1f} ms<extra></extra>"))
    per_rank.add_trace(go.Bar(x=labels, y=[r.total.comm_comp_overlap_pct for r in results], name="overlap %",
                              yaxis="y2", offsetgroup="overlap", hovertemplate="%{x}: overlap %{y:.2f}%<extra></extra>"))
    per_rank.update_layout(title="Exposed communication and overlap per rank (whole trace)",
                           yaxis={"title": "exposed ms", "rangemode": "tozero"}, yaxis2=_percent_axis("overlap %"),
                           legend=_LEGEND_PAST_RIGHT_AXIS)
    figures.append(("trace-overlap", per_rank))

    # Per iteration, where the trace has ProfilerStep iterations.
    if any(r.iterations for r in results):
        iterations = go.Figure()
        for r in results:
            x = [it.iteration for it in r.iterations]
            iterations.add_trace(go.Scatter(x=x, y=[it.exposed_comm_ns / 1e6 for it in r.iterations],
                                            name=f"rank {r.rank}: exposed comm (ms)", mode="lines+markers",
                                            hovertemplate=f"rank {r.rank}, iteration %{{x}}: exposed comm "
                                                          "%{y:.2f} ms<extra></extra>"))
            iterations.add_trace(go.Scatter(x=x, y=[it.comm_comp_overlap_pct for it in r.iterations],
                                            name=f"rank {r.rank}: overlap %", mode="lines+markers", yaxis="y2",
                                            line={"dash": "dot"},
                                            hovertemplate=f"rank {r.rank}, iteration %{{x}}: overlap "
                                                          "%{y:.2f}%<extra></extra>"))
        numbers = sorted({it.iteration for r in results for it in r.iterations if it.iteration is not None})
        ticks = {"tickmode": "array", "tickvals": numbers} if len(numbers) <= 20 else {"tickformat": "d"}
        iterations.update_layout(title="Exposed communication and overlap per iteration",
                                 xaxis={"title": "iteration (ProfilerStep#)", **ticks},
                                 yaxis={"title": "exposed ms", "rangemode": "tozero"},
                                 yaxis2=_percent_axis("overlap %"), legend=_LEGEND_PAST_RIGHT_AXIS)
        figures.append(("trace-iterations", iterations))
    return figures


def _findings_html(groups: Sequence[FindingGroup], tabled: set[int]) -> str:
    """One item per problem across ranks (finding_groups), its worst rank linked to its row of the table
    where the table has it (``tabled``)."""
    def worst(group: FindingGroup) -> str:
        words = group.worst_words()
        if words is None or group.worst_rank is None:
            return ""
        name = f"rank {group.worst_rank}"
        link = f'<a href="#rank-{group.worst_rank}">{name}</a>' if group.worst_rank in tabled else name
        return f'<li class="worst">{html.escape(words).replace(name, link, 1)}</li>'

    return "".join(
        f'<li data-kind="{html.escape(g.kind)}" data-ranks="{len(g.ranks)}">'
        f"<b>[{html.escape(g.severity.value)}] {html.escape(g.title)}</b><ul>" + worst(g)
        + "".join(f"<li>{html.escape(e)}</li>" for e in g.evidence)
        + ("<li>remedies: " + "; ".join(html.escape(r) for r in g.remedies) + "</li>" if g.remedies else "")
        + "</ul></li>"
        for g in groups) or "<li>none</li>"


def _packed_plotlyjs() -> str:
    """plotly.js gzipped and in base64: the page unpacks it in the browser (DecompressionStream), offline,
    at ~2/5 of its size; plotly.js is nearly all of a report page's weight."""
    import base64
    import gzip

    from plotly.offline import get_plotlyjs

    global _packed
    if _packed is None:
        _packed = base64.b64encode(gzip.compress(get_plotlyjs().encode(), 6, mtime=0)).decode("ascii")
    return _packed


_packed: str | None = None
# The figures' scripts run as the page is read, before plotly.js is unpacked: a stand-in Plotly notes
# their calls, and the real one makes them once it has run.
_LOADER = """<script type="text/javascript">
(function () {
  var calls = [];
  window.Plotly = {newPlot: function () { calls.push(arguments); return Promise.resolve(); }};
  function say(text) { document.getElementById("zeromon-plotly").textContent = text; }
  if (!window.DecompressionStream) {
    say("This browser cannot unpack the page's figures (DecompressionStream: Chrome 80, Firefox 113, " +
        "Safari 16.4 or later); the text above is the whole report.");
    return;
  }
  var bytes = Uint8Array.from(atob("%s"), function (c) { return c.charCodeAt(0); });
  var js = new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text();
  var ready = new Promise(function (done) {
    if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", done); } else { done(); }
  });
  Promise.all([js, ready]).then(function (got) {
    var script = document.createElement("script");
    script.textContent = got[0];
    document.head.appendChild(script);
    calls.forEach(function (call) { window.Plotly.newPlot.apply(window.Plotly, call); });
  }).catch(function (error) { say("The page's figures could not be drawn: " + error); });
})();
</script>"""


def _page(source: str, subtitle: str, sections: str, figures: list[tuple[str, Any]]) -> str:
    parts = [fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"zeromon-{name}") for name, fig in figures]
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>zeromon report: {html.escape(source)}</title>
{_LOADER % _packed_plotlyjs()}
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}
pre{{background:#f4f4f4;padding:1em;white-space:pre-wrap;overflow-wrap:anywhere}}
table{{border-collapse:collapse;font-size:0.9em}} th,td{{padding:0.2em 0.6em;text-align:right;vertical-align:top}}
th{{border-bottom:1px solid #999}} td.text,th.text{{text-align:left}}</style>
</head><body>
<h1>zeromon report</h1><p>{html.escape(source)}: {html.escape(subtitle)}</p>
{sections}
<p id="zeromon-plotly"></p>
{''.join(parts)}
</body></html>
"""


_RANK_COLUMNS = ("rank", "framework", "strategy", "steps", "step ms", "exposed ms", "exposed %", "overlap",
                 "peak mem", "capacity", "risk", "busbw")
_TEXT_COLUMNS = {"framework", "strategy", "risk", "busbw"}


def _rank_cells(r: RankReport) -> tuple[str, ...]:
    """A rank's row as the text report's table has it (zeromon.commands.report's columns)."""
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1e3:.1f}"

    def share(ratio: float | None) -> str:
        return "-" if ratio is None else f"{100 * ratio:.0f}%"

    busbw = ", ".join(f"{op} {format_rate(bw)}" for op, bw in sorted(r.busbw_by_op.items())) or "-"
    risk = "-" if r.peak_memory is None and r.oom.risk is Severity.OK else r.oom.risk.value  # nothing forecast
    return (str(r.rank), r.framework, r.strategy, str(len(r.steps)), ms(r.median_step_s), ms(r.median_exposed_comm_s),
            share(r.median_exposed_share), share(r.median_overlap_ratio), format_bytes(r.peak_memory),
            format_bytes(r.capacity), risk, busbw)


def _rank_table(ranks: Sequence[RankReport]) -> str:
    head = "".join(f'<th class="text">{name}</th>' if name in _TEXT_COLUMNS else f"<th>{name}</th>"
                   for name in _RANK_COLUMNS)
    rows = "".join(f'<tr id="rank-{r.rank}">' + "".join(f'<td class="text">{html.escape(cell)}</td>' if name in _TEXT_COLUMNS
                                    else f"<td>{html.escape(cell)}</td>"
                                    for name, cell in zip(_RANK_COLUMNS, _rank_cells(r), strict=True)) + "</tr>"
                   for r in ranks)
    return f"<table><tr>{head}</tr>{rows}</table>"


def render_html(report: RunReport, recordings: Sequence[Recording], notes: str) -> str:
    """The page of `zeromon report --html`: the findings, one entry per problem across ranks; a table of the
    ranks the figures draw (every rank's, or, of a run of many, those the text shows first), ``notes`` (the
    text report's lines between its table and its findings) and the figures of ``recordings``."""
    step_ms = [r.median_step_s for r in report.ranks if r.median_step_s is not None]
    subtitle = f"{len(report.ranks)} ranks" + (f", median step {statistics.median(step_ms) * 1e3:.1f} ms"
                                                if step_ms else "")
    if len(recordings) < len(report.ranks):
        subtitle += (f"; the figures draw the {len(recordings)} ranks furthest from the median rank "
                     f"({', '.join(str(rec.rank) for rec in recordings)})")
    by_rank = {r.rank: r for r in report.ranks}
    tabled = [by_rank[rec.rank] for rec in recordings if rec.rank in by_rank]
    findings = _findings_html(group_findings(report.findings), {r.rank for r in tabled})
    sections = (f"<h2>Findings</h2><ul>{findings}</ul>\n"
                f"<h2>Per rank</h2>{_rank_table(tabled)}"
                f"<pre>{html.escape(notes)}</pre>")
    return _page(report.run_dir, subtitle, sections, _figures(report, recordings))


def render_trace_html(results: Sequence[RankTraceOverlap], source: str, text_summary: str) -> str:
    """The page of `zeromon report --trace DIR --html FILE`."""
    subtitle = f"PyTorch profiler traces of {len(results)} rank{'s' if len(results) != 1 else ''}"
    sections = (f"<h2>Per rank</h2><pre>{html.escape(text_summary)}</pre>\n"
                "<p>Overlap and temporal breakdown as Holistic Trace Analysis defines them, over GPU kernels.</p>")
    return _page(source, subtitle, sections, trace_figures(results))
