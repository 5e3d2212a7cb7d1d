"""The main screen's widgets. Each takes plain data from zeromon.views (fleet, hang) and only styles and draws it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, OptionList, Sparkline, Static
from textual.widgets.option_list import Option

from zeromon.analysis.findings import Severity
from zeromon.analysis.step_overlap import CPU_OVERLAP_NOTE
from zeromon.tui.rank_table import RankTable
from zeromon.views.fleet import (
    COLUMNS,
    RISK_WORDS,
    FindingItem,
    Header,
    RankRow,
    Trends,
    ms,
    short_bytes,
)
from zeromon.views.hang import HangBanner, HangView

LEVEL_STYLES = {"critical": "bold red", "warn": "yellow", "stale": "dim", "ok": ""}
SEVERITY_STYLES = {Severity.CRITICAL: "bold red", Severity.WARN: "yellow", Severity.INFO: "cyan", Severity.OK: "green"}
WORST_STYLE = {"critical": "bold red", "warn": "bold yellow", "stale": "bold", "ok": "bold magenta"}


def severity_text(severity: Severity | None, text: str) -> Text:
    return Text(text, style=SEVERITY_STYLES.get(severity, "") if severity is not None else "")


class FleetHeader(Static):
    """What runs (job, framework, sharding, world, dtypes), how far (step, rate, uptime), how it fares
    (the worst OOM risk and overlap), a highlighted line for what needs attention (paused, errors),
    and a calm one when the run has ended (the job finished, the replay played through)."""

    _shape: tuple[int, ...] = ()

    def show(self, h: Header, status: Sequence[str] = (), alerts: Sequence[str] = (), ended: str | None = None) -> None:
        dot = (" · ", "dim")
        if h.known:
            line1 = Text.assemble((h.job, "bold"), dot, h.framework, dot, (h.strategy, "bold"), dot,
                                  ("world ", "dim"), h.world, dot, h.dtypes)
        else:
            line1 = Text.assemble(("zeromon ", "bold"), ("watching ", "dim"), h.source)
        line2 = Text.assemble(("step ", "dim"), (h.step, "bold"), dot, h.steps_per_s, (" steps/s", "dim"), dot,
                              ("up ", "dim"), h.uptime, dot, h.answering)
        for item in status:
            line2.append_text(Text.assemble(dot, item))
        overlap_severity = None if h.worst_overlap is None else (
            Severity.CRITICAL if h.worst_overlap < 0.2 else Severity.WARN if h.worst_overlap < 0.5 else Severity.OK)
        line3 = Text.assemble(("worst OOM risk ", "dim"), severity_text(h.worst_risk, h.worst_risk_text), dot,
                              ("worst overlap ", "dim"), severity_text(overlap_severity, h.worst_overlap_text))
        lines = [line1, line2, line3]
        if ended:
            lines.append(Text(ended, style="bold green"))
        if alerts:
            lines.append(Text(" · ".join(alerts), style="bold reverse"))
        # A new layout of the whole screen only when the header's height can change: a refresh
        # that only draws its own lines is a fraction of the cost.
        shape = (len(lines), self.size.width, *(line.cell_len // max(1, self.size.width) for line in lines))
        self.update(Text("\n").join(lines), layout=shape != self._shape)
        self._shape = shape


def banner_text(banner: HangBanner, hint: str = "") -> Text:
    """The verdict, its level first in capitals (it reads without colour), then the other lines."""
    out = Text.assemble((f" {banner.label.upper()} ", "bold reverse"), " ", (banner.headline, "bold"))
    for line in banner.more:
        out.append(f"\n{line}")
    if hint:
        out.append(f"  {hint}", style="dim")
    return out


class VerdictBanner(Static):
    """The hang verdict while the job makes no progress (red when hung, yellow when the job is only idle), hidden
    while it moves. It follows the app's ``hang`` (a reactive): it is drawn again only when the verdict changes."""

    def on_mount(self) -> None:
        self.watch(self.app, "hang", self.show)

    def show(self, hang: HangView | None) -> None:
        banner = hang.banner if hang is not None else None
        self.display = banner is not None
        self.set_class(banner is not None and banner.level == "critical", "-critical")
        self.set_class(banner is not None and banner.level == "warn", "-warn")
        if banner is not None:
            self.update(banner_text(banner, "(h: every rank and the stacks)"))


class RanksTable(RankTable):
    """One row per rank; the worst stands out by its mark (zeromon.views.fleet.WORST_MARK) and its colour."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(COLUMNS, fixed=1, **kwargs)

    def show(self, rows: Sequence[RankRow], worst_key: str | None, empty_text: str = "") -> None:
        """``empty_text``: what to say when there are no rows (a filter that matches none)."""
        self.empty_text = empty_text

        def content(index: int) -> tuple[tuple[str, ...], str]:
            row = rows[index]
            worst = row.key == worst_key
            return row.cells(worst), WORST_STYLE[row.level] if worst else LEVEL_STYLES[row.level]

        self.set_rows([r.key for r in rows], content)


class TrendsPanel(Horizontal):
    """Sparklines over the last steps: the fleet's peak memory, slowest step and most exposed communication.
    The titles are as wide as their sparklines (app.tcss): a new value redraws them without a layout."""

    def compose(self):  # type: ignore[no-untyped-def]
        for key, title in (("memory", "peak memory"), ("step", "step time"), ("exposed", "exposed comm")):
            with Vertical(classes="trend"):
                yield Label(title, id=f"{key}-label", classes="trend-label")
                yield Sparkline([], id=f"{key}-spark")

    def show(self, t: Trends) -> None:
        values = (("memory", "peak memory", t.peak_memory, short_bytes),
                  ("step", "step time", t.step_s, lambda v: f"{ms(v)} ms"),
                  ("exposed", "exposed comm", t.exposed_s, lambda v: f"{ms(v)} ms"))
        for key, title, series, fmt in values:
            now = fmt(series[-1]) if series else "-"
            self.query_one(f"#{key}-label", Label).update(Text.assemble((title, "bold"), f" {now}"), layout=False)
            self.query_one(f"#{key}-spark", Sparkline).data = list(series)


class FindingsPanel(OptionList):
    """Findings, one entry per problem across ranks, newest first, each with its worst rank's evidence and the
    remedies; enter (or a click) on an entry opens its worst rank (the app hears OptionList.OptionSelected)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(self._note(Text("no findings", style="dim")), **kwargs)
        self._shown: tuple[tuple[FindingItem, ...], bool, bool] | None = None
        self.items: tuple[FindingItem, ...] = ()  # as listed: option i is items[i]

    @staticmethod
    def _note(text: Text) -> Option:
        return Option(text, disabled=True)

    def on_focus(self) -> None:
        if self.highlighted is None and self.items:
            self.highlighted = 0  # enter opens something at once

    def show(self, items: Sequence[FindingItem], have_data: bool = True, cpu: bool = False) -> None:
        """``cpu``: the run trains on CPU, where a fine overlap is near 0 % (said with "look fine")."""
        if (tuple(items), have_data, cpu) == self._shown:
            return
        self._shown = (tuple(items), have_data, cpu)
        ranks = len({r for item in items for r in item.group.ranks})
        self.border_title = (f"findings ({len(items)}" + (f" on {ranks} rank{'s' if ranks != 1 else ''}" if ranks else "")
                             + ", newest first)")
        self.border_subtitle = "enter opens the worst rank" if any(i.rank_key for i in items) else ""
        before = [item.group.key for item in self.items]
        highlighted = before[self.highlighted] if self.highlighted is not None and self.highlighted < len(before) else None
        self.items = tuple(items)
        if not items:
            fine = "no findings: memory, overlap and balance look fine" + (f" ({CPU_OVERLAP_NOTE})" if cpu else "")
            self.set_options([self._note(Text(fine if have_data else "no findings yet: no rank has reported a step "
                                                                       "or memory sample", style="dim"))])
            return
        prompts = [_finding_prompt(item) for item in items]
        if [item.group.key for item in items] == before:  # the same problems, newer figures: the list stays put
            for i, prompt in enumerate(prompts):
                self.replace_option_prompt_at_index(i, prompt)
            return
        self.set_options([Option(prompt) for prompt in prompts])
        keys = [item.group.key for item in items]
        self.highlighted = keys.index(highlighted) if highlighted in keys else (0 if self.has_focus else None)


def _finding_prompt(item: FindingItem) -> Table:
    """An entry: its severity and title, the worst rank of several, the evidence and the remedies. A grid, so that
    wrapped evidence and remedies hang under their text, not under the marks."""
    group = item.group
    content = Table.grid(padding=(0, 1), expand=True)
    content.add_column(width=4, no_wrap=True)
    content.add_column(ratio=1)
    content.add_row(Text(RISK_WORDS.get(group.severity, group.severity.value), style=SEVERITY_STYLES[group.severity]),
                    Text(group.title, style="bold"))
    worst = group.worst_words()
    if worst is not None:
        content.add_row(Text("  ▸", style="bold"), Text(worst, style="bold"))
    for line in group.evidence:
        content.add_row(Text("  ·", style="dim"), Text(line))
    for line in group.remedies:
        content.add_row(Text("  →", style="green"), Text(line, style="green"))
    return content


class NoAgentPanel(Static):
    """Where it looked and how to start an agent; shown while no rank is known."""
