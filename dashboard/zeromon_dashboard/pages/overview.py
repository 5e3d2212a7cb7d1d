"""Overview: a hang (who holds the job up, and where) and the worst OOM risk and the worst exposed
communication as banners, the rank grid coloured by each, the run's identity, and the findings with their
evidence and remedies as `zeromon report` words them: one entry per problem across ranks, its worst rank a link
to that rank's Communication or Memory page."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dash import dcc, html

from zeromon.analysis.finding_groups import group_findings
from zeromon.analysis.findings import Finding
from zeromon.analysis.step_overlap import CPU_OVERLAP_NOTE
from zeromon.views.fleet import RunClock, finding_page, header, no_agent_text, on_cpu, rank_rows
from zeromon.views.hang import hang_banner
from zeromon.views.overview import (
    Banner,
    died_banners,
    exposed_banner,
    incomplete_banners,
    oom_banner,
    rank_cells,
)
from zeromon.views.run_data import RunData
from zeromon_dashboard.context import Context, failure_text
from zeromon_dashboard.figures.overview import rank_grid
from zeromon_dashboard.figures.style import empty
from zeromon_dashboard.pages.common import data_attrs, drawn_store, graph, message, register_redraw, section
from zeromon_dashboard.state import PageState

if TYPE_CHECKING:
    from dash import Dash

PAGE = "overview"


def hang_block(data: RunData, hang_href: str) -> list[Any]:
    """The hang verdict's banner, first (a hung job's other numbers no longer move), with a link to the Hang
    page; none while the job makes progress."""
    banner = hang_banner(data.fleet.hang)
    if banner is None:
        return []
    lines = [html.Div([banner.text, " ", dcc.Link("every rank and the stacks", href=hang_href, id="banner-hang-link")]),
             *(html.Div(line) for line in banner.more)]
    return [html.Div(lines, className=f"banner banner-{banner.level}", id="banner-hang",
                     **data_attrs(level=banner.level, rank=str(banner.culprits[0]) if banner.culprits else ""))]


def banners(data: RunData, interval_s: float = 1.0, hang_href: str = "/hang") -> list[Any]:
    if data.kind == "live" and not data.fleet.ranks:  # nothing found: where it looked and what to do
        return [html.Pre(no_agent_text(data.fleet, interval_s).replace("q quits.", ""), className="message",
                         id="no-agent")]
    rows = rank_rows(data.fleet)
    shown: list[Banner | None] = [*died_banners(data), *incomplete_banners(data), oom_banner(data, rows),
                                  exposed_banner(data)]
    out = hang_block(data, hang_href) + [
        html.Div(b.text, className=f"banner banner-{b.level}",
                 id=f"banner-{b.kind}" + (f"-{b.rank}" if b.kind in ("died", "incomplete") else ""),
                 **data_attrs(level=b.level, rank=str(b.rank)))
        for b in shown if b is not None]
    if not out:
        out.append(message("No memory samples or steps yet: the banners appear with the first step.",
                           element_id="banner-none"))
    return out


def run_info(data: RunData) -> html.Table:
    rows = rank_rows(data.fleet)
    uptime, exact = RunClock().observe(data.fleet)
    h = header(data.fleet, rows, uptime, exact)
    pairs = [("job", h.job), ("framework", h.framework), ("strategy", h.strategy), ("world", h.world),
             ("dtypes", h.dtypes), ("steps", h.step), ("steps/s", h.steps_per_s), ("uptime", h.uptime),
             ("ranks", h.answering if data.kind in ("live", "replay") else f"{len(data.histories)} recorded")]
    return html.Table([html.Tr([html.Th(k), html.Td(v)]) for k, v in pairs], className="run-info", id="run-info")


def findings_list(findings: Sequence[Finding], cpu: bool = False,
                  rank_href: Callable[[str, int], str] | None = None) -> Any:
    """The findings, one entry per problem across ranks (zeromon.analysis.finding_groups), worded as `zeromon
    report` words them; ``rank_href(page, rank)``: the link of a rank's page, which each entry's worst rank
    links to (finding_page: Communication or Memory). ``cpu``: the run trains on CPU, where a fine overlap is
    near 0 % (said with "nothing stands out")."""
    if not findings:
        return message("No findings: nothing stands out in memory, overlap or rank balance."
                       + (f" Note: {CPU_OVERLAP_NOTE}." if cpu else ""), "ok", element_id="findings-none")
    items = []
    for group in group_findings(findings):
        href = rank_href(finding_page(group.kind), group.worst_rank) \
            if rank_href is not None and group.worst_rank is not None else None
        worst = group.worst_words()
        body = ([html.Li(_linked(worst, group.worst_rank, href), className="worst")] if worst is not None else [])
        body += [html.Li(f"evidence: {e}") for e in group.evidence] + [html.Li(f"remedy: {r}") for r in group.remedies]
        heading = _linked(group.title, group.worst_rank, href if worst is None else None)
        items.append(html.Details([
            html.Summary([html.Span(f"[{group.severity.value}]", className=f"sev sev-{group.severity.value}"), " ",
                          *heading]),
            html.Ul(body)], open=group.severity.rank >= 2, className="finding",
            **data_attrs(kind=group.kind, ranks=group.ranks_text(), worst=str(group.worst_rank))))
    return html.Div(items, id="findings-list")


def _linked(text: str, rank: int | None, href: str | None) -> list[Any]:
    """``text`` with its first "rank <rank>" a link to ``href`` (the text reads the same)."""
    found = re.search(rf"\brank {rank}\b", text) if rank is not None and href is not None else None
    if found is None or href is None:
        return [text]
    link = dcc.Link(found.group(), href=href, className="rank-link")
    return [part for part in (text[:found.start()], link, text[found.end():]) if not isinstance(part, str) or part]


def findings_title(findings: Sequence[Finding]) -> str:
    """'Findings (3)', or with several ranks' findings in one entry 'Findings (3 problems in 260 findings)'."""
    groups = len(group_findings(findings))
    return f"Findings ({groups})" if groups == len(findings) else \
        f"Findings ({groups} problem{'s' if groups != 1 else ''} in {len(findings):,} findings)"


def _draw(state: PageState, data: RunData, interval_s: float = 1.0, hang_href: str = "/hang",
          rank_href: Callable[[str, int], str] | None = None) -> tuple[Any, ...]:
    cells = rank_cells(data)
    return (banners(data, interval_s, hang_href), rank_grid(cells, "risk"), rank_grid(cells, "exposed"), run_info(data),
            findings_title(data.findings),
            findings_list(data.findings, cpu=on_cpu(data.fleet.ranks), rank_href=rank_href))


def _fallback(exc: Exception) -> tuple[Any, ...]:
    text = failure_text(exc)
    return (message(text, "error"), empty("OOM risk per rank", text), empty("Exposed communication per rank", text),
            "", "Findings", "")


OUTPUTS = (("overview-banners", "children"), ("overview-grid-risk", "figure"), ("overview-grid-exposed", "figure"),
           ("overview-info", "children"), ("overview-findings-title", "children"), ("overview-findings", "children"))


def layout(state: PageState, data: RunData, ctx: Context) -> Any:
    banners_, risk, exposed, info, title, findings = _draw(state, data, ctx.refresh_s, ctx.href("hang"),
                                                         ctx.rank_href)
    return html.Div([
        drawn_store(PAGE, data, state),
        html.Div(banners_, id="overview-banners", className="banners"),
        html.Div([graph("overview-grid-risk", risk), graph("overview-grid-exposed", exposed)], className="grids"),
        html.Div([section("Run", html.Div(info, id="overview-info")),
                  section(title, html.Div(findings, id="overview-findings"), title_id="overview-findings-title")],
                 className="columns"),
    ], id="page-overview")


def register(app: Dash, ctx: Context) -> None:
    register_redraw(app, ctx, PAGE, OUTPUTS,
                    lambda state, data: _draw(state, data, ctx.refresh_s, ctx.href("hang"), ctx.rank_href), _fallback)
