"""The drill-down on one rank, the hang verdict, and the help."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Static

from zeromon.sources.fleet import FleetView, RankView
from zeromon.tui.widgets import banner_text
from zeromon.views.fleet import ms, pct, rank_key, rank_row, short_bytes, step_number
from zeromon.views.hang import COLUMNS as HANG_COLUMNS
from zeromon.views.hang import HangView
from zeromon.views.rank_detail import (
    COLLECTIVE_COLUMNS,
    NARROW_COLLECTIVE_COLUMNS,
    TIMELINE_MIN_WIDTH,
    TIMELINE_WIDTH,
    collective_rows,
    memory_lines,
    phase_timeline,
    rank_title,
    table_width,
)

PHASE_STYLES = {"F": "bold blue", "B": "bold magenta", "O": "bold green", "·": "dim", "s": "dim cyan"}


def memory_text(rank: RankView) -> Group | Text:
    categories, totals = memory_lines(rank)
    if not categories and not totals:
        return Text("no memory sample yet", style="dim")
    parts: list[Text | Table] = []
    if categories:
        grid = Table.grid(padding=(0, 1))
        for justify in ("left", "right", "right", "left"):
            grid.add_column(justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for line in categories:
            bar = "█" * round(12 * min(1.0, line.share or 0.0))
            grid.add_row(line.label, short_bytes(line.bytes), pct(line.share), Text(bar, style="cyan"))
        parts += [Text("by category", style="bold"), grid]
    else:
        parts.append(Text("by category: none reported yet (the agent walks the model every few steps)", style="dim"))
    # Totals two to a row: the drill-down fits an 80x24 terminal without scrolling past them.
    grid = Table.grid(padding=(0, 1))
    for _ in range(2):
        grid.add_column(style="dim", no_wrap=True)  # a label cut is better than one broken over two lines
        grid.add_column(min_width=7)
    pairs = list(totals)
    for i in range(0, len(pairs), 2):
        row = [*pairs[i], *(pairs[i + 1] if i + 1 < len(pairs) else ("", ""))]
        grid.add_row(*row)
    parts += [Text("totals", style="bold"), grid]
    return Group(*parts)


# What a timeline row holds besides its bar: "{step:>7} │" and "│ {ms:>7} ms  exp {ms:>6} ms".
_TIMELINE_ROW_TEXT = 9 + 27


def timeline_text(rank: RankView, width: int | None = None) -> Text:
    """The last steps' phases, each bar as wide as ``width`` (the panel's, in cells) leaves."""
    bar = TIMELINE_WIDTH if not width else max(TIMELINE_MIN_WIDTH, width - _TIMELINE_ROW_TEXT)
    rows = phase_timeline(rank, width=bar)
    if not rows:
        return Text("no steps yet", style="dim")
    out = Text()
    for letter, phase in (("F", "forward"), ("B", "backward"), ("O", "optimizer"), ("·", "other")):
        out.append(letter, style=PHASE_STYLES[letter])
        out.append(f" {phase}  ", style="dim")
    out.append("(each bar spans its own step)", style="dim")
    for row in rows:
        out.append(f"\n{step_number(row.step):>7} │")
        for letter in row.cells:
            out.append(letter, style=PHASE_STYLES.get(letter, ""))
        out.append(f"│ {ms(row.step_s):>7} ms  exp {ms(row.exposed_s):>6} ms")
    return out


class PhaseTimeline(Static):
    """The phase bars, drawn as wide as the panel: again whenever its width changes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rank: RankView | None = None

    def show(self, rank: RankView) -> None:
        self.rank = rank
        self.update(timeline_text(rank, self.content_size.width))

    def on_resize(self, event: events.Resize) -> None:
        if self.rank is not None:
            self.update(timeline_text(self.rank, event.size.width))


class CollectivesTable(DataTable[str]):
    """The rank's collectives; narrower columns (NARROW_COLLECTIVE_COLUMNS) when the full ones would
    not fit, so that the exposed share always shows."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="none", zebra_stripes=True, **kwargs)
        self.rank: RankView | None = None
        self._shown: tuple[tuple[str, ...], tuple[tuple[str, ...], ...]] | None = None

    def show(self, rank: RankView) -> None:
        self.rank = rank
        rows = collective_rows(rank)
        columns: tuple[str, ...] = COLLECTIVE_COLUMNS
        width = self.content_size.width or self.app.size.width - 4  # not laid out yet: the screen's, less borders
        if table_width(columns, rows) > width:
            columns, rows = NARROW_COLLECTIVE_COLUMNS, collective_rows(rank, narrow=True)
        if (columns, rows) == self._shown:
            return
        if self._shown is None or self._shown[0] != columns:
            self.clear(columns=True)
            for label in columns:
                self.add_column(label, key=label)
        else:
            self.clear()
        self.add_rows(rows)
        self._shown = (columns, rows)

    def on_resize(self, event: events.Resize) -> None:
        if self.rank is not None:
            self.show(self.rank)


class RankScreen(Screen[None]):
    """Everything about one rank; it follows the live data until escape."""

    BINDINGS = [Binding("escape,backspace", "dismiss", "back")]

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self._ready = False  # mounted: pushed, a refresh can come before its widgets are (on_mount draws then)

    def compose(self) -> ComposeResult:
        yield Static(id="rank-title")
        yield Static(id="rank-summary")
        # Narrow terminals: one scrolling column; wide ones (-wide): memory beside the rest.
        with VerticalScroll(id="rank-body"):
            yield Vertical(Static(id="rank-memory"), id="rank-memory-box")
            with Vertical(id="rank-right"):
                yield CollectivesTable(id="rank-collectives")
                yield Vertical(PhaseTimeline(id="rank-timeline"), id="rank-timeline-box")
        yield Footer()

    def on_mount(self) -> None:
        self._ready = True
        self.query_one("#rank-memory-box").border_title = "memory"
        self.query_one(CollectivesTable).border_title = "collectives by op and ZeRO meaning (busbw in GB/s)"
        self.query_one("#rank-timeline-box").border_title = "phase timeline"
        view = getattr(self.app, "view", None)
        if isinstance(view, FleetView):
            self.show(view)

    def show(self, view: FleetView) -> None:
        if not self._ready:
            return
        rank = next((r for r in view.ranks if rank_key(r) == self.key), None)
        if rank is None:
            self.query_one("#rank-title", Static).update(Text(f"{self.key}: no longer in the view", style="bold red"))
            return
        row = rank_row(rank)
        self.query_one("#rank-title", Static).update(Text(rank_title(rank), style="bold"))
        self.query_one("#rank-summary", Static).update(Text(
            f"step {row.steps_done if row.steps_done is not None else '-'} · {ms(row.step_s)} ms · overlap "
            f"{pct(row.overlap)} · exposed {ms(row.exposed_s)} ms ({pct(row.exposed_share)}) · "
            f"memory {short_bytes(row.used)} of {short_bytes(row.capacity)} · risk "
            f"{row.risk.value if row.risk is not None else '-'}"))
        self.query_one("#rank-memory", Static).update(memory_text(rank))
        self.query_one(CollectivesTable).show(rank)
        self.query_one(PhaseTimeline).show(rank)


HANG_LEVEL_STYLES = {"critical": "bold red", "warn": "yellow", "ok": ""}


def hang_title(hang: HangView | None) -> Text:
    if hang is None or hang.banner is None:
        return Text(hang.status if hang is not None else "no verdict yet", style="bold green")
    return banner_text(hang.banner)


def stacks_text(hang: HangView) -> Text:
    if not hang.stacks:
        return Text("no stack reported", style="dim")
    out = Text(hang.stacks_title, style="bold")
    for block in hang.stacks:
        out.append(f"\n{block.title}:", style="bold")
        for frame in block.frames:
            out.append(f"\n  {frame}")
    return out


class HangScreen(Screen[None]):
    """The hang verdict (`zeromon hang`'s): the cause, every rank's state and where it stands, and the training
    threads' stacks, identical ones together. It follows the app's ``hang`` (a reactive) until escape."""

    BINDINGS = [Binding("escape,backspace,h", "dismiss", "back")]

    def compose(self) -> ComposeResult:
        yield Static(id="hang-title")
        with VerticalScroll(id="hang-body"):
            yield DataTable(id="hang-ranks", cursor_type="none", zebra_stripes=True)
            yield Static(id="hang-stacks")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#hang-ranks", DataTable)
        table.border_title = "every rank (no progress: since its last collective or step)"
        for key, label in HANG_COLUMNS:
            table.add_column(label, key=key)
        self.watch(self.app, "hang", self.show)

    def show(self, hang: HangView | None) -> None:
        self.query_one("#hang-title", Static).update(hang_title(hang))
        table = self.query_one("#hang-ranks", DataTable)
        table.clear()
        for row in hang.rows if hang is not None else ():
            style = HANG_LEVEL_STYLES[row.level]
            table.add_row(*(Text(cell, style=style) for cell in row.cells), key=str(row.rank))
        self.query_one("#hang-stacks", Static).update(
            stacks_text(hang) if hang is not None else Text("no stack reported", style="dim"))


HELP = """\
[b]zeromon attach[/b]: the live view of a ZeRO / FSDP run

[b]keys[/b]
  ?      this help               q       quit (the training goes on)
  p      pause / resume          s       next sort order
  /      filter ranks            escape  clear the filter, or go back
  enter  drill into the rank     tab     next panel (ranks, findings)
         (in the findings: the entry's worst rank)
  h      the hang verdict: every rank's state, the stacks
  + -    replay speed            mouse   click a column header to sort

[b]filter[/b]: rank numbers (3, 0-7), stale, alive, ended, ok, warn, crit,
a hang state (stuck, waiting, ...) or part of a host name; several
terms show the ranks matching any.

[b]columns[/b]
  ▶ ○       the worst rank; a rank not answering (its last data stays)
  risk      OOM risk: ok, warn, crit (the agent's forecast)
  headroom  capacity minus the predicted peak (negative: will not fit)
  memory    █ used ▒ peak · free, of capacity (allocator; RSS on CPU)
  overlap   overlapped / all communication time (HTA's overlap ratio)
  exp       exposed communication, not hidden by compute: ms, % step
  busbw     busiest collective's bus bandwidth (nccl-tests' busbw)
  state     alive, stale (no answer for that long), down (never
            answered), ended (its process exited: its last data);
            from the hang verdict: stuck, behind, desync, dead (they
            hold the others up), waiting (for them), idle
  step      steps done, counted from 1 as training logs count them
sparklines: per step, the largest value over the ranks shown.

[dim]escape, q or ? closes this help[/dim]"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        yield VerticalScroll(Static(HELP), id="help-text")
