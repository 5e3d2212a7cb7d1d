"""The drill-down on one rank, and the help."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Static

from zeromon.sources.fleet import FleetView, RankView
from zeromon.tui.rank_detail import (
    COLLECTIVE_COLUMNS,
    collective_rows,
    memory_lines,
    phase_timeline,
    rank_title,
)
from zeromon.tui.view_model import ms, pct, rank_key, rank_row, short_bytes

PHASE_STYLES = {"F": "bold blue", "B": "bold magenta", "O": "bold green", "·": "dim", "s": "dim cyan"}


def memory_text(rank: RankView) -> Group | Text:
    categories, totals = memory_lines(rank)
    if not categories and not totals:
        return Text("no memory sample yet", style="dim")
    parts: list[Text | Table] = []
    if categories:
        grid = Table.grid(padding=(0, 1))
        for justify in ("left", "right", "right", "left"):
            grid.add_column(justify=justify)  # type: ignore[arg-type]
        for line in categories:
            bar = "█" * round(12 * min(1.0, line.share or 0.0))
            grid.add_row(line.label, short_bytes(line.bytes), pct(line.share), Text(bar, style="cyan"))
        parts += [Text("by category", style="bold"), grid]
    else:
        parts.append(Text("by category: none reported yet (the agent walks the model every few steps)", style="dim"))
    # Totals two to a row: the drill-down fits an 80x24 terminal without scrolling past them.
    grid = Table.grid(padding=(0, 1))
    for _ in range(2):
        grid.add_column(style="dim")
        grid.add_column(min_width=8)
    pairs = list(totals)
    for i in range(0, len(pairs), 2):
        row = [*pairs[i], *(pairs[i + 1] if i + 1 < len(pairs) else ("", ""))]
        grid.add_row(*row)
    parts += [Text("totals", style="bold"), grid]
    return Group(*parts)


def timeline_text(rank: RankView) -> Text:
    rows = phase_timeline(rank)
    if not rows:
        return Text("no steps yet", style="dim")
    out = Text()
    for letter, phase in (("F", "forward"), ("B", "backward"), ("O", "optimizer"), ("·", "other")):
        out.append(letter, style=PHASE_STYLES[letter])
        out.append(f" {phase}  ", style="dim")
    out.append("(each bar spans its own step)", style="dim")
    for row in rows:
        out.append(f"\n{row.step:>7} │")
        for letter in row.cells:
            out.append(letter, style=PHASE_STYLES.get(letter, ""))
        out.append(f"│ {ms(row.step_s):>7} ms  exp {ms(row.exposed_s):>6} ms")
    return out


class RankScreen(Screen[None]):
    """Everything about one rank; it follows the live data until escape."""

    BINDINGS = [Binding("escape,backspace", "dismiss", "back")]

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self._collective_rows: tuple[tuple[str, ...], ...] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="rank-title")
        yield Static(id="rank-summary")
        # Narrow terminals: one scrolling column; wide ones (-wide): memory beside the rest.
        with VerticalScroll(id="rank-body"):
            yield Vertical(Static(id="rank-memory"), id="rank-memory-box")
            with Vertical(id="rank-right"):
                yield DataTable(id="rank-collectives", cursor_type="none", zebra_stripes=True)
                yield Vertical(Static(id="rank-timeline"), id="rank-timeline-box")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#rank-collectives", DataTable)
        for label in COLLECTIVE_COLUMNS:
            table.add_column(label, key=label)
        self.query_one("#rank-memory-box").border_title = "memory"
        table.border_title = "collectives by op and ZeRO meaning"
        self.query_one("#rank-timeline-box").border_title = "phase timeline"
        view = getattr(self.app, "view", None)
        if isinstance(view, FleetView):
            self.show(view)

    def show(self, view: FleetView) -> None:
        rank = next((r for r in view.ranks if rank_key(r) == self.key), None)
        if rank is None:
            self.query_one("#rank-title", Static).update(Text(f"{self.key}: no longer in the view", style="bold red"))
            return
        row = rank_row(rank)
        self.query_one("#rank-title", Static).update(Text(rank_title(rank), style="bold"))
        self.query_one("#rank-summary", Static).update(Text(
            f"step {row.step if row.step is not None else '-'} · {ms(row.step_s)} ms · overlap "
            f"{pct(row.overlap)} · exposed {ms(row.exposed_s)} ms ({pct(row.exposed_share)}) · "
            f"memory {short_bytes(row.used)} of {short_bytes(row.capacity)} · risk "
            f"{row.risk.value if row.risk is not None else '-'}"))
        self.query_one("#rank-memory", Static).update(memory_text(rank))
        rows = collective_rows(rank)
        if rows != self._collective_rows:
            table = self.query_one("#rank-collectives", DataTable)
            table.clear()
            table.add_rows(rows)
            self._collective_rows = rows
        self.query_one("#rank-timeline", Static).update(timeline_text(rank))


HELP = """\
[b]zeromon attach[/b]: the live view of a ZeRO / FSDP run

[b]keys[/b]
  ?      this help               q       quit (the training goes on)
  p      pause / resume          s       next sort order
  /      filter ranks            escape  clear the filter, or go back
  enter  drill into the rank     tab     next panel (ranks, findings)
  + -    replay speed            mouse   click a column header to sort

[b]filter[/b]: rank numbers (3, 0-7), stale, alive, ok, warn, crit, or
part of a host name; several terms show the ranks matching any.

[b]columns[/b]
  ▶ ○       the worst rank; a rank not answering (its last data stays)
  risk      OOM risk: ok, warn, crit (the agent's forecast)
  headroom  capacity minus the predicted peak (negative: will not fit)
  memory    █ used ▒ peak · free, of the capacity (allocator; RSS on CPU)
  overlap   overlapped / all communication time (HTA's overlap ratio)
  exp       exposed communication, not hidden by compute: ms, % of step
  busbw     bus bandwidth of the busiest collective (nccl-tests' busbw)
  state     alive, stale (no answer for that long), down (never answered)
sparklines: per step, the largest value over the ranks shown.

[dim]escape, q or ? closes this help[/dim]"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        yield VerticalScroll(Static(HELP), id="help-text")
