"""`zeromon report --html FILE`: one self-contained page (plotly.js inlined) with the report's figures.

Figures: memory over time by category, the communication/computation timeline of one step,
overlap and exposed communication per step, and bus bandwidth by op and message size.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Sequence
from typing import Any

from zeromon.analysis.report import RunReport
from zeromon.model.codec import Recording
from zeromon.model.units import format_bytes

_MB = 2**20


def _figures(report: RunReport, recordings: Sequence[Recording]) -> list[tuple[str, Any]]:
    import plotly.graph_objects as go

    figures: list[tuple[str, Any]] = []
    first = recordings[0]
    t0 = min((m.t_ns for rec in recordings for m in rec.memory), default=0)

    # Memory over time: categories of the first rank (stacked) and every rank's level.
    mem = go.Figure()
    sampled = [m for m in first.memory if len(m.categories) > 1]
    names = sorted({k for m in sampled for k in m.categories})
    for name in names:
        mem.add_trace(go.Scatter(x=[(m.t_ns - t0) / 1e9 for m in sampled],
                                 y=[m.categories.get(name, 0) / _MB for m in sampled],
                                 name=f"rank {first.rank}: {name}", stackgroup="categories", mode="lines"))
    for rec in recordings:
        points = [(m.t_ns, level) for m in rec.memory
                  if (level := m.allocated if m.allocated is not None else m.rss) is not None]
        label = "allocated" if any(m.allocated is not None for m in rec.memory) else "RSS"
        mem.add_trace(go.Scatter(x=[(t - t0) / 1e9 for t, _ in points], y=[v / _MB for _, v in points],
                                 name=f"rank {rec.rank}: {label}", mode="lines", line={"dash": "dot"}))
    capacity = report.ranks[0].capacity if report.ranks else None
    peak = max((r.peak_memory or 0 for r in report.ranks), default=0)
    title = "Memory over time (MiB)"
    if capacity and peak >= capacity / 4:
        mem.add_hline(y=capacity / _MB, line_dash="dash", annotation_text="capacity")
    elif capacity:  # a line far above the data would flatten it: say it instead
        title += f"; capacity {format_bytes(capacity)} per rank, above the plot"
    mem.update_layout(title=title, xaxis_title="seconds", yaxis_title="MiB")
    figures.append(("memory", mem))

    # One step's timeline: phases and collectives of the first rank's median step.
    steps = [s for s in first.steps if s.step >= 1] or list(first.steps)
    if steps:
        durations = sorted(steps, key=lambda s: s.duration_s)
        step = durations[len(durations) // 2]
        lo = step.start_ns
        timeline = go.Figure()
        for span in first.phases:
            if span.step == step.step and span.phase != "other":
                timeline.add_trace(go.Bar(y=["compute (phases)"], x=[(span.end_ns - span.start_ns) / 1e6],
                                          base=[(span.start_ns - lo) / 1e6], orientation="h", name=span.phase,
                                          hovertext=span.phase))
        c = first.collective_columns()  # only the step's events are looked at, by index
        for i in [i for i, s in enumerate(c.step) if s == step.step and c.complete_ns[i] is not None]:
            issue, complete = c.issue_ns[i], c.complete_ns[i] or 0
            timeline.add_trace(go.Bar(y=[f"comm: {c.op[i]}"], x=[(complete - issue) / 1e6],
                                      base=[(issue - lo) / 1e6], orientation="h", name=c.meaning[i], showlegend=False,
                                      hovertext=f"{c.api[i]} {format_bytes(max(c.bytes_in[i], c.bytes_out[i]))}"
                                                f" {c.timing[i]}"))
        timeline.update_layout(title=f"Rank {first.rank}, step {step.step}: communication and computation (ms)",
                               barmode="overlay", xaxis_title="ms since the step began")
        figures.append(("timeline", timeline))

    # Overlap per step.
    overlap = go.Figure()
    for rank in report.ranks:
        overlap.add_trace(go.Scatter(x=[s.step for s in rank.steps], y=[s.exposed_comm_s * 1e3 for s in rank.steps],
                                     name=f"rank {rank.rank}: exposed comm (ms)", mode="lines+markers"))
        overlap.add_trace(go.Scatter(x=[s.step for s in rank.steps],
                                     y=[100 * r if (r := s.overlap_ratio) is not None else None for s in rank.steps],
                                     name=f"rank {rank.rank}: overlap %", mode="lines", yaxis="y2"))
    overlap.update_layout(title="Exposed communication and overlap per step", xaxis_title="step",
                          yaxis={"title": "exposed ms"},
                          yaxis2={"title": "overlap %", "overlaying": "y", "side": "right", "range": [0, 100]})
    figures.append(("overlap", overlap))

    # Bandwidth by op and size.
    bandwidth = go.Figure()
    for op in sorted({b.op for b in report.bandwidth}):
        rows = sorted((b for b in report.bandwidth if b.op == op), key=lambda b: b.size_bucket_bytes)
        bandwidth.add_trace(go.Scatter(x=[max(b.size_bucket_bytes, 1024) for b in rows],
                                       y=[b.median_busbw / 1e9 for b in rows], name=op, mode="lines+markers",
                                       hovertext=[f"{b.count} calls" for b in rows]))
    bandwidth.update_layout(title="Bus bandwidth by op and message size (nccl-tests busbw)",
                            xaxis={"title": "message size (bytes, bucket lower bound)", "type": "log"},
                            yaxis_title="GB/s")
    figures.append(("bandwidth", bandwidth))
    return figures


def render_html(report: RunReport, recordings: Sequence[Recording], text_summary: str) -> str:
    from plotly.offline import get_plotlyjs

    parts = [fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"zeromon-{name}")
             for name, fig in _figures(report, recordings)]
    findings = "".join(
        f"<li><b>[{html.escape(f.severity.value)}] {html.escape(f.title)}</b><ul>"
        + "".join(f"<li>{html.escape(e)}</li>" for e in f.evidence)
        + ("<li>remedies: " + "; ".join(html.escape(r) for r in f.remedies) + "</li>" if f.remedies else "")
        + "</ul></li>"
        for f in report.findings) or "<li>none</li>"
    step_ms = [r.median_step_s for r in report.ranks if r.median_step_s is not None]
    subtitle = f"{len(report.ranks)} ranks" + (f", median step {statistics.median(step_ms) * 1e3:.1f} ms"
                                                if step_ms else "")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>zeromon report: {html.escape(report.run_dir)}</title>
<script type="text/javascript">{get_plotlyjs()}</script>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}} pre{{background:#f4f4f4;padding:1em;overflow:auto}}</style>
</head><body>
<h1>zeromon report</h1><p>{html.escape(report.run_dir)}: {html.escape(subtitle)}</p>
<h2>Findings</h2><ul>{findings}</ul>
<h2>Per rank</h2><pre>{html.escape(text_summary)}</pre>
{''.join(parts)}
</body></html>
"""
