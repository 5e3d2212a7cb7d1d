"""`zeromon attach`: the Textual application.

The source collects in its own threads (LiveSource's poll pool, a replay's clock); the app only
asks it for ``latest()`` on a timer (a copy of references under a lock, no I/O) and redraws what
changed. Any object with ``start()``, ``stop()`` and ``latest() -> FleetView`` is a source; one with
a ``paused`` attribute is paused with the view, one with ``speed`` gets the +/- keys, one whose
``finished`` is true (a replay played through) has ended.

When the run ends (the job of `zeromon run --tui` exits, a replay finishes, every rank's process
has exited) the screen says so and keeps the last data; under `zeromon run --tui` it then reads the
run's final state from the recording (the agents are gone by then, and the last poll is up to an
interval old).

The hang verdict (zeromon.views.hang) is the app's reactive ``hang``: the banner and the hang screen (``h``)
watch it and draw again only when it changes. What the keys set (``paused``, ``sort``, ``rank_filter``) is
reactive too: its watchers draw the screen, whichever key, header click or input changed it.
"""

from __future__ import annotations

import dataclasses
import gc
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Container, Vertical
from textual.css.query import NoMatches
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Footer, Input, OptionList

from zeromon.sources.fleet import FleetView
from zeromon.tui.rank_table import RankTable
from zeromon.tui.screens import HangScreen, HelpScreen, RankScreen
from zeromon.tui.widgets import (
    FindingsPanel,
    FleetHeader,
    NoAgentPanel,
    RanksTable,
    TrendsPanel,
    VerdictBanner,
)
from zeromon.views.fleet import (
    SORT_NAMES,
    SORT_OF_COLUMN,
    FindingItem,
    FindingsLog,
    JobStatus,
    RankFilter,
    RankRow,
    RunClock,
    fleet_findings,
    header,
    no_agent_text,
    on_cpu,
    rank_key,
    rank_rows,
    run_ended,
    sort_rows,
    trends,
    worst_row,
)
from zeromon.views.hang import HangView, hang_view

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def _calm_the_collector() -> None:
    """Full garbage collections walk Textual's render caches and every view held, long enough with
    many ranks to freeze the screen when one lands in a refresh. What exists after start-up (modules,
    the loaded replay) is frozen out of them, and they run a tenth as often (the default, 10,
    made 100): the TUI's garbage is young and dies young."""
    gc.collect()
    gc.freeze()
    first, second, _ = gc.get_threshold()
    gc.set_threshold(first, second, 100)


class Source(Protocol):
    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def latest(self) -> FleetView: ...


class MainScreen(Screen[None]):
    """Header, ranks, sparklines and findings."""

    # The app's keys again, first, so that the footer lists them in this order.
    BINDINGS = [
        Binding("question_mark", "app.help", "help"),
        Binding("q", "app.quit", "quit"),
        Binding("p", "app.pause", "pause"),
        Binding("s", "app.cycle_sort", "sort"),
        Binding("slash", "app.filter", "filter"),
        Binding("h", "app.hang", "hang"),
        Binding("tab", "app.focus_next", "panels"),
        Binding("escape", "app.clear_filter", "clear filter", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield FleetHeader(id="header")
        yield VerdictBanner(id="hang-banner")
        yield NoAgentPanel(id="no-agent")
        with Container(id="body"):
            yield RanksTable(id="ranks")
            with Vertical(id="side"):
                yield TrendsPanel(id="trends")
                yield FindingsPanel(id="findings")
        yield Input(placeholder="ranks: 3  0-7  stale  warn  critical  host…  (enter keeps, escape clears)",
                    id="filter")
        yield Footer()


class ZeromonApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "zeromon"
    ENABLE_COMMAND_PALETTE = False
    # Wide terminals put the sparklines and findings beside the table instead of under it.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (150, "-wide")]
    hang: var[HangView | None] = var(None)  # the view's hang verdict, as shown (the banner, the hang screen)
    # What the keys change; the screen is drawn again by their watchers, whichever key or widget set them.
    paused: var[bool] = var(False, init=False)
    sort: var[str] = var("rank", init=False)
    rank_filter: var[RankFilter] = var(RankFilter(""), init=False)
    BINDINGS = [
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
        Binding("p", "pause", "pause"),
        Binding("h", "hang", "hang"),
        Binding("plus,equals_sign", "speed(1)", "faster"),
        Binding("minus", "speed(-1)", "slower"),
    ]

    def __init__(self, source: Source, refresh_s: float = 0.5, interval_s: float = 1.0,
                 job: Callable[[], JobStatus] | None = None,
                 final_view: Callable[[], FleetView] | None = None) -> None:
        """``refresh_s``: how often the screen reads the source; ``interval_s``: how often the source
        polls (for the "still looking" message); ``job``: the state of the command `zeromon run --tui`
        runs; ``final_view``: the run's final state, asked once (on a worker thread) when that job has
        ended, or, without a job, when every rank has ended."""
        super().__init__()
        self.source = source
        self.refresh_s = refresh_s
        self.interval_s = interval_s
        self.job = job
        self.final_view = final_view
        self.job_status: JobStatus | None = None  # as job() last said
        self.final: FleetView | None = None  # final_view()'s answer: shown instead of the source's views
        self.final_error: str | None = None  # why final_view() gave none
        self._final_asked = False
        self.view: FleetView | None = None
        self.rows: list[RankRow] = []  # as shown: filtered and sorted
        self.findings: tuple[FindingItem, ...] = ()
        self.source_error: str | None = None  # latest() raised: shown, and the next tick tries again
        self.analysis_every_s = 1.0  # findings and sparklines: redone at most this often
        self._last_done: dict[str, tuple[float, object]] = {}
        self._ticks = 0  # refreshes so far
        self._heavy_tick = -1  # the tick that last redid a fleet-wide computation on time
        self._clock = RunClock()
        self._findings_log = FindingsLog()
        self._main = MainScreen()

    # -- lifecycle

    async def on_mount(self) -> None:
        await self.push_screen(self._main)
        try:
            self.source.start()
        except Exception as exc:  # shown in the header; latest() may still answer (or say why not)
            self.source_error = f"the source did not start: {type(exc).__name__}: {exc}"
        _calm_the_collector()
        self.refresh_view()
        self.set_interval(self.refresh_s, self.refresh_view)

    def on_unmount(self) -> None:
        self.source.stop()

    # -- data in

    def refresh_view(self) -> None:
        """One tick: the newest view from the source, drawn (nothing while paused)."""
        if self.paused:
            return
        if self.job is not None:
            self.job_status = self.job()
            if self.job_status.exit_code is not None and self.final_view is not None and not self._final_asked:
                self._final_asked = True
                self.run_worker(self._read_final_view, thread=True, exit_on_error=False)
        if self.final is not None:
            view = self.final
        else:
            try:
                view = self.source.latest()
            except Exception as exc:  # a source's bug must not end the screen; it shows, the next tick retries
                self.source_error = f"the source failed: {type(exc).__name__}: {exc}"
                if self.view is None:
                    self.view = FleetView(0, "?", (), (), error=self.source_error)
                self.draw()
                return
        self.source_error = None
        if self.job is None and self.final_view is not None and not self._final_asked and run_ended(view):
            self._final_asked = True  # attach --run: the ranks are gone, the recording has the rest
            self.run_worker(self._read_final_view, thread=True, exit_on_error=False)
        if self.run_over() is not None:
            if not view.ranks and self.view is not None and self.view.ranks:
                view = self.view  # the run's last data stays, not a "no agent" screen
            view = _as_ended(view)
        self.view = view
        self.hang = hang_view(view)
        self._ticks += 1
        if self._due("findings", (len(view.ranks), view.alive)):
            self.findings = self._findings_log.update(fleet_findings(view.ranks), view.t_ns)
        self.draw()

    def _read_final_view(self) -> None:
        """On a worker thread (reading a recording takes a moment): final_view(), handed to the UI thread."""
        assert self.final_view is not None
        view: FleetView | None = None
        error = None
        try:
            view = self.final_view()
        except Exception as exc:  # no recording, or an unreadable one: the last polled data stays
            error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        if view is not None and not view.ranks:
            view, error = None, "it holds no rank"
        try:
            self.call_from_thread(self._got_final_view, view, error)
        except RuntimeError:  # the app has closed meanwhile
            pass

    def _got_final_view(self, view: FleetView | None, error: str | None) -> None:
        self.final, self.final_error = view, error
        self.refresh_view()

    def run_over(self) -> str | None:
        """Why the run is over, once it is: its job ended, the replay played through (None before)."""
        if self.job_status is not None and self.job_status.exit_code is not None:
            return "job"
        if getattr(self.source, "finished", False) is True:
            return "replay"
        return None

    def _due(self, what: str, shape: object) -> bool:
        """Whether to redo a fleet-wide computation (findings, sparklines: a few ms each for 256 ranks)
        now: at once when what it is computed over changes, else at most every analysis_every_s and
        one of them per tick (spread over ticks, no refresh pays for all of them)."""
        now = time.monotonic()
        last = self._last_done.get(what)
        if last is not None and last[1] == shape:
            if now - last[0] < self.analysis_every_s or self._heavy_tick == self._ticks:
                return False
            self._heavy_tick = self._ticks
        self._last_done[what] = (now, shape)
        return True

    def draw(self) -> None:
        view = self.view
        if view is None:
            return
        if isinstance(self.screen, RankScreen):
            self.screen.show(view)
            return
        if self.screen is not self._main:
            return  # help is open: the main screen is drawn when it closes
        main = self._main
        try:
            fleet_header = main.query_one(FleetHeader)
        except NoMatches:  # the app is closing and a refresh came between: its widgets are already gone
            return
        rows = rank_rows(view)
        shown = sort_rows([r for r in rows if self.rank_filter.matches(r)], self.sort)
        self.rows = shown
        uptime, exact = self._clock.observe(view)
        status, alerts, ended = self.notes(view)
        fleet_header.show(header(view, rows, uptime, exact), status, alerts, ended)
        no_agent = not view.ranks
        main.query_one(NoAgentPanel).display = no_agent
        main.query_one("#body").display = not no_agent
        if no_agent:
            main.query_one(NoAgentPanel).update(no_agent_text(view, self.interval_s, self.job_status))
            return
        table = main.query_one(RanksTable)
        if main.focused is None:  # the table was hidden behind the "no agent" panel: keys go to it now
            table.focus()
        worst = worst_row(rows)
        wanted = self.rank_filter.text.strip()
        table.show(shown, worst.key if worst is not None else None,
                   f"no rank matches {wanted!r} (escape clears the filter)" if wanted and not shown else "")
        if self._due("trends", (self.rank_filter.text, len(view.ranks))):
            keys = {r.key for r in shown}
            main.query_one(TrendsPanel).show(trends(r for r in view.ranks if rank_key(r) in keys))
        main.query_one(FindingsPanel).show(self.findings, any(r.steps or r.memory for r in view.ranks),
                                             cpu=on_cpu(view.ranks))

    def notes(self, view: FleetView) -> tuple[list[str], list[str], str | None]:
        """(the view's settings, for the header's second line; what needs attention, highlighted; that
        the run has ended and what the screen shows of it, or None while it goes on)."""
        status = [f"sort {self.sort}"]
        if self.rank_filter.text.strip():
            status.append(f"filter {self.rank_filter.text.strip()}: {len(self.rows)} of {len(view.ranks)}")
        speed = getattr(self.source, "speed", None)
        if isinstance(speed, int | float):
            status.append(f"replay ×{speed:g}")
        alerts = []
        if self.paused:
            alerts.append("PAUSED (p resumes)")
        if self.source_error:
            alerts.append(self.source_error)
        elif view.error and view.ranks:
            alerts.append(view.error)
        job = self.job_status
        ended: str | None = None
        if job is not None and job.exit_code is None:
            status.append(f"job running (pid {job.pid}, output: {Path(job.log).name})")
        if job is not None and job.exit_code is not None:
            if self.final is not None:
                shown = "showing its final state"
            elif self.final_view is not None and self.final_error is None:
                shown = "reading its final state from the recording…"
            else:
                unread = f" (its recording: {self.final_error})" if self.final_error else ""
                shown = f"showing the last data polled{unread}"
            if job.exit_code == 0:
                ended = f"job finished (exit 0) — {shown}; q quits"
            else:
                alerts.append(f"job ended with {_exit_text(job.exit_code)} — {shown}; its output: {job.log}; "
                              "q quits")
        elif self.run_over() == "replay":
            ended = "replay finished — showing the recording's final state; q quits"
        elif run_ended(view):
            shown = ("showing its final state (from the recording)" if self.final is not None
                     else "showing the last data polled")
            ended = f"run ended: every rank has ended — {shown}"
        elif view.ranks and not view.alive:
            why = next((r.error for r in view.ranks if r.error), None)
            alerts.append(f"no rank answers{f' ({why})' if why else ''}; still looking")
        return status, alerts, ended

    # -- keys

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(), callback=lambda _: self.draw())

    def action_hang(self) -> None:
        if not isinstance(self.screen, HangScreen):
            self.push_screen(HangScreen(), callback=lambda _: self.draw())

    def action_pause(self) -> None:
        self.paused = not self.paused

    def watch_paused(self, paused: bool) -> None:
        if hasattr(self.source, "paused"):  # a replay stops its clock with the screen
            self.source.paused = paused
        self.draw()

    def action_cycle_sort(self) -> None:
        self.sort = SORT_NAMES[(SORT_NAMES.index(self.sort) + 1) % len(SORT_NAMES)]

    def watch_sort(self) -> None:
        self.draw()

    def watch_rank_filter(self) -> None:
        self.draw()

    def action_filter(self) -> None:
        field = self._main.query_one("#filter", Input)
        field.display = True
        self.set_focus(field)  # now, not after the keys already typed (focus() would wait its turn)

    def action_clear_filter(self) -> None:
        field = self._main.query_one("#filter", Input)
        if not field.display and not self.rank_filter.text:
            return
        field.value = ""
        field.display = False
        self.rank_filter = RankFilter("")
        self._main.query_one(RanksTable).focus()

    def action_speed(self, direction: int) -> None:
        speed = getattr(self.source, "speed", None)
        if not isinstance(speed, int | float):
            return
        faster = [s for s in SPEEDS if s > speed]
        slower = [s for s in SPEEDS if s < speed]
        if direction > 0 and faster:
            self.source.speed = faster[0]  # type: ignore[attr-defined]
        elif direction < 0 and slower:
            self.source.speed = slower[-1]  # type: ignore[attr-defined]
        self.draw()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "speed":  # only a replay has a speed
            return isinstance(getattr(self.source, "speed", None), int | float)
        return True

    # -- widgets' messages

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.rank_filter = RankFilter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            event.input.display = bool(event.value.strip())
            self._main.query_one(RanksTable).focus()

    def on_rank_table_row_selected(self, event: RankTable.RowSelected) -> None:
        if self.view is not None:
            self.push_screen(RankScreen(event.key), callback=lambda _: self.draw())

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """An entry of the findings chosen: its worst rank's screen (the rank of a one-rank entry)."""
        panel = event.option_list
        if not isinstance(panel, FindingsPanel) or self.view is None or event.option_index >= len(panel.items):
            return
        key = panel.items[event.option_index].rank_key
        if key is not None and any(rank_key(r) == key for r in self.view.ranks):
            self.push_screen(RankScreen(key), callback=lambda _: self.draw())

    def on_rank_table_header_selected(self, event: RankTable.HeaderSelected) -> None:
        sort = SORT_OF_COLUMN.get(event.column_key)
        if sort is not None:
            self.sort = sort


def _as_ended(view: FleetView) -> FleetView:
    """The view with every rank that does not answer marked ended: the run is over, its data final."""
    if all(r.alive or r.ended for r in view.ranks):
        return view
    return dataclasses.replace(view, ranks=tuple(r if r.alive or r.ended else dataclasses.replace(r, ended=True)
                                                 for r in view.ranks))


def _exit_text(code: int) -> str:
    """'exit status 3', or 'signal 9 (SIGKILL)' for a negative Popen return code."""
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"signal {-code}"
