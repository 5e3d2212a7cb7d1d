"""The hang verdict where users look, without a real hang: the plain-data view both front ends draw
(zeromon.views.hang), the TUI through Pilot, the dashboard's banner and Hang page as components, and the replay
of a recording whose ranks wrote progress reports. Reports are made by hand as in tests/test_hang_verdict.py;
the real hung runs, in a real terminal and a real browser, are in tests/test_hang_screens.py."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from test_hang_verdict import FORWARD, STALL, gather, report
from test_tui import FakeSource, fleet, run_app, screen_text, table_column, text_of
from textual.widgets import DataTable, Static

from zeromon.analysis.hang import STUCK, WAITING, HangVerdict, diagnose, last_report
from zeromon.model.codec import RecordingWriter, read_recording
from zeromon.model.events import Notice, ProgressReport, RunEnd, StepSummary
from zeromon.model.progress import STALLED, RankProgress, StackFrame
from zeromon.sources.fleet import FleetView
from zeromon.sources.replay import ReplaySource, final_view
from zeromon.tui.app import ZeromonApp
from zeromon.tui.screens import HangScreen
from zeromon.tui.widgets import RanksTable, VerdictBanner
from zeromon.views.fleet import RankFilter, rank_rows
from zeromon.views.hang import NO_REPORT, hang_view
from zeromon.views.run_data import RunData
from zeromon_dashboard.pages import hang as hang_page
from zeromon_dashboard.pages.overview import banners
from zeromon_dashboard.state import PageState

S = 10**9
HUNG = {0: report(0, 341, blocked=gather(341)), 1: report(1, 340, where=STALL)}  # rank 1 stuck, rank 0 waits
IDLE = {0: report(0, 341, where=FORWARD), 1: report(1, 341, where=FORWARD)}  # no progress, nobody waits
MOVING = {0: report(0, 341, idle_s=1.0), 1: report(1, 341, idle_s=1.0)}


def fleet_of(reports: dict[int, RankProgress | None], verdict: HangVerdict | None = None, **overrides: Any) -> FleetView:
    """test_tui's fleet of len(reports) ranks, each with its report, and the verdict over them (``diagnose``'s)."""
    view = fleet(len(reports), **overrides)
    ranks = tuple(dataclasses.replace(r, progress=reports[r.rank]) for r in view.ranks if r.rank is not None)
    return dataclasses.replace(view, ranks=ranks, hang=verdict if verdict is not None else diagnose(reports))


# --- the view both front ends draw ------------------------------------------------------------------------

def test_a_hung_job_has_a_critical_banner_with_the_cause_first() -> None:
    banner = hang_view(fleet_of(HUNG)).banner
    assert banner is not None and banner.level == "critical" and banner.label == "hung" and banner.culprits == (1,)
    assert banner.text.startswith("Hung: rank 1 has not reached all_gather #341 of the default group")
    assert "it is in data_loader_stall (data.py:17)" in banner.headline and "rank 0 waits in it" in banner.headline


def test_an_idle_job_has_a_warn_banner_that_says_it_is_not_hung() -> None:
    view = hang_view(fleet_of(IDLE))
    assert view.banner is not None and view.banner.level == "warn" and view.banner.label == "stalled"
    assert view.banner.headline.endswith("the job is slow or paused as a whole, not hung")
    assert {row.rank: (row.state, row.level) for row in view.rows} == {0: ("idle", "warn"), 1: ("idle", "warn")}


def test_a_job_that_moves_has_no_banner_and_says_so_with_its_threshold() -> None:
    view = hang_view(fleet_of(MOVING))
    assert view.banner is None
    assert view.status == "no hang: every rank made progress within its threshold (30 s)"
    assert [row.state for row in view.rows] == ["ok", "ok"]


def test_without_any_report_the_view_says_so_and_has_no_rows() -> None:
    view = hang_view(fleet(2))
    assert view.banner is None and view.rows == () and view.stacks == () and view.status == NO_REPORT


def test_each_rank_says_where_it_stands_for_how_long_and_whom_it_waits_for() -> None:
    waiting, stuck = hang_view(fleet_of(HUNG)).rows
    assert (waiting.rank, waiting.state, waiting.level, waiting.step, waiting.no_progress) == (0, "waiting", "warn",
                                                                                              "8", "60 s")
    assert waiting.where.startswith("in all_gather #341 of the default group (param_all_gather) since ")
    assert waiting.waits_for == "rank 1"
    assert (stuck.state, stuck.level, stuck.where, stuck.waits_for) == ("stuck", "critical",
                                                                        "in data_loader_stall (data.py:17)", "")
    assert stuck.cells == ("1", "stuck", "8", "60 s", "", "in data_loader_stall (data.py:17)")


def test_a_rank_without_a_report_says_why() -> None:
    verdict = diagnose({0: HUNG[0], 1: None}, dead={1: "its endpoint does not answer"})
    row = hang_view(fleet_of({0: HUNG[0], 1: None}, verdict)).rows[1]
    assert (row.state, row.level, row.where, row.no_progress, row.step) == (
        "dead", "critical", "its endpoint does not answer", "-", "-")


def test_identical_stacks_are_grouped_the_culprits_first_then_the_largest_innermost_frame_last() -> None:
    reports = {r: report(r, 341, blocked=gather(341), world=5) for r in (0, 2, 3)}
    reports[1] = report(1, 340, where=STALL, world=5)
    reports[4] = report(4, 341, blocked=gather(341), where=StackFrame("/job/model.py", 20, "backward"), world=5)
    view = hang_view(fleet_of(reports))
    assert [block.ranks for block in view.stacks] == [(1,), (0, 2, 3), (4,)]
    assert view.stacks[0].frames[-1] == 'File "/job/data.py", line 17, in data_loader_stall'
    assert view.stacks[1].title == "ranks 0, 2-3 (3): in forward (model.py:12)"
    assert view.stacks_title.startswith("the training threads' stacks when they made no progress")


def test_without_a_stall_the_stacks_are_where_the_ranks_stand_now() -> None:
    view = hang_view(fleet_of(MOVING))
    assert [block.ranks for block in view.stacks] == [(0, 1)]
    assert view.stacks_title.startswith("the training threads' stacks as last reported")


def test_the_ranks_table_shows_the_verdict_of_the_ranks_that_answer_and_filters_by_it() -> None:
    rows = rank_rows(fleet_of(HUNG))
    assert [(r.state, r.level) for r in rows] == [("waiting", "warn"), ("stuck", "critical")]
    assert [r.rank for r in rows if RankFilter("stuck").matches(r)] == [1]
    gone = rank_rows(fleet_of(HUNG, r1={"alive": False, "stale_s": 5.0}))  # its state is its staleness
    assert gone[1].state == "stale 5s" and gone[1].hang is None


# --- the TUI ------------------------------------------------------------------------------------------------

def test_a_hung_job_shows_a_red_banner_and_each_ranks_state_in_the_table() -> None:
    async def body(app: ZeromonApp, pilot: Any) -> None:
        banner = app.screen.query_one(VerdictBanner)
        assert banner.display and banner.has_class("-critical") and not banner.has_class("-warn")
        text = text_of(banner)
        assert text.startswith(" HUNG  rank 1 has not reached all_gather #341") and "data_loader_stall" in text
        table = app.screen.query_one(RanksTable)
        assert table_column(table, "state") == ["waiting", "stuck"]
        assert table.row_style("rank 1") == "bold red"
        assert "HUNG" in screen_text(app) and "h hang" in screen_text(app)  # drawn, and the key in the footer

    run_app(FakeSource(fleet_of(HUNG)), body=body)


def test_the_banner_follows_the_verdict_warn_when_idle_and_gone_when_the_job_moves() -> None:
    source = FakeSource(fleet_of(HUNG))

    async def body(app: ZeromonApp, pilot: Any) -> None:
        banner = app.screen.query_one(VerdictBanner)
        source.view = fleet_of(IDLE)
        app.refresh_view()
        await pilot.pause()
        assert banner.display and banner.has_class("-warn") and not banner.has_class("-critical")
        assert text_of(banner).startswith(" STALLED ")
        source.view = fleet_of(MOVING)
        app.refresh_view()
        await pilot.pause()
        assert not banner.display and app.hang is not None and app.hang.banner is None
        assert table_column(app.screen.query_one(RanksTable), "state") == ["alive", "alive"]

    run_app(source, body=body)


def test_h_shows_the_verdict_every_rank_and_the_stacks_and_follows_it_until_escape() -> None:
    source = FakeSource(fleet_of(HUNG))

    async def body(app: ZeromonApp, pilot: Any) -> None:
        await pilot.press("h")
        await pilot.pause()
        assert isinstance(app.screen, HangScreen)
        title = text_of(app.screen.query_one("#hang-title", Static))
        assert title.startswith(" HUNG  rank 1 has not reached all_gather #341")
        table = app.screen.query_one("#hang-ranks", DataTable)
        assert [str(table.get_row_at(i)[1]) for i in range(table.row_count)] == ["waiting", "stuck"]
        assert str(table.get_row_at(0)[4]) == "rank 1" and str(table.get_row_at(1)[5]).startswith("in data_loader")
        stacks = text_of(app.screen.query_one("#hang-stacks", Static))
        assert "rank 1: in data_loader_stall (data.py:17):" in stacks
        assert 'File "/job/data.py", line 17, in data_loader_stall' in stacks
        source.view = fleet_of(MOVING)  # the job moves on: the open screen says so at the next refresh
        app.refresh_view()
        await pilot.pause()
        assert text_of(app.screen.query_one("#hang-title", Static)).startswith("no hang: every rank made progress")
        assert [str(table.get_row_at(i)[1]) for i in range(table.row_count)] == ["ok", "ok"]
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HangScreen)

    run_app(source, body=body)


# --- the dashboard's components ---------------------------------------------------------------------------

def _props(component: Any) -> list[Any]:
    """Every component under ``component``, itself first."""
    out = [component]
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children] if children is not None else []:
        out.extend(_props(child))
    return out


def _text(component: Any) -> str:
    return " ".join(c for c in _props(component) if isinstance(c, str))


def test_the_overview_banner_comes_first_names_the_culprit_and_links_to_the_hang_page() -> None:
    data = RunData(kind="live", source="run x", version=1, fleet=fleet_of(HUNG))
    first = banners(data, hang_href="/p/hang")[0]
    assert first.id == "banner-hang" and "banner-critical" in first.className
    assert getattr(first, "data-rank") == "1" and getattr(first, "data-level") == "critical"
    assert _text(first).startswith("Hung: rank 1 has not reached all_gather #341")
    link = next(c for c in _props(first) if getattr(c, "id", None) == "banner-hang-link")
    assert link.href == "/p/hang"
    moving = RunData(kind="live", source="run x", version=1, fleet=fleet_of(MOVING))
    assert all(getattr(b, "id", None) != "banner-hang" for b in banners(moving))


def test_the_hang_page_draws_the_verdict_every_rank_and_the_stacks() -> None:
    data = RunData(kind="live", source="run x", version=1, fleet=fleet_of(HUNG))
    verdict, table, stacks_title, stacks = hang_page._draw(PageState(page="hang"), data)
    assert verdict.id == "hang-verdict" and _text(verdict).startswith("Hung: rank 1 has not reached")
    rows = [c for c in _props(table) if getattr(c, "data-state", None)]
    assert [(getattr(r, "data-rank"), getattr(r, "data-state"), r.className) for r in rows] == [
        ("0", "waiting", "hang-warn"), ("1", "stuck", "hang-critical")]
    assert stacks_title.startswith("The training threads' stacks when they made no progress")
    assert 'File "/job/data.py", line 17, in data_loader_stall' in _text(stacks)


# --- the replay of a recording with progress reports --------------------------------------------------------

T0 = 1_800_000_000 * S
STEP_END_S = 4.0  # both ranks' last step ends here (seconds into the run)


def _steps(rank: int) -> list[StepSummary]:
    return [StepSummary(rank=rank, step=i, start_ns=T0 + i * S, end_ns=T0 + (i + 1) * S, phase_s={}, collectives=10,
                        comm_bytes=0, comm_bytes_by_op={}, comm_union_s=0.0, blocked_s=0.0, peak_memory=None)
            for i in range(int(STEP_END_S))]


def _report(rank: int, reason: str, at_s: float, progress_s: float, blocked: bool) -> ProgressReport:
    """The report rank ``rank`` wrote at ``at_s`` (``reason``), with no progress since ``progress_s``: blocked in
    all_gather #41 since then, or in data_loader_stall after issuing 40 collectives."""
    base = report(rank, 41 if blocked else 40, blocked=gather(41) if blocked else None,
                  where=FORWARD if blocked else STALL, reason=reason, threshold_s=3.0)
    progress = T0 + int(progress_s * S)
    made = dataclasses.replace(base, t_ns=T0 + int(at_s * S), progress_ns=progress, step=4, blocked=dataclasses.replace(
        base.blocked, since_ns=progress) if base.blocked is not None else None)
    return ProgressReport(rank=rank, t_ns=made.t_ns, reason=reason, report=made.to_dict())


def hung_recording(folder: Path) -> Path:
    """A 2-rank run's recording: rank 1 stops in data_loader_stall after its 4th step, rank 0 waits in
    all_gather #41; both write their STALLED reports; rank 0 is stopped by SIGTERM at 20 s (its report and end
    record), rank 1 is killed at 10 s (its last record a notice, no end record, its process gone)."""
    for rank, blocked in ((0, True), (1, False)):
        writer = RecordingWriter(folder / f"rank-{rank}.jsonl", rank, end_record=True, host="elsewhere",
                                 pid=os.getpid(), world_size=2)
        for step in _steps(rank):
            writer.write(step)
        writer.write(_report(rank, STALLED, 7.5 if blocked else 7.0, 4.5 if blocked else 4.0, blocked))
        if blocked:
            writer.write(_report(0, "signal SIGTERM", 20.0, 4.5, blocked=True))
            writer.close(RunEnd(rank=0, t_ns=T0 + 20 * S, how="signal SIGTERM", last_step=3, records_lost=0,
                                bytes_lost=0))
        else:
            writer.write(Notice(rank=1, t_ns=T0 + 10 * S, level="info", source="test", message="still here"))
            writer.close()
    return folder


def test_a_replayed_rank_carries_its_newest_report_at_or_before_t_and_a_stall_runs_on(tmp_path: Path) -> None:
    source = ReplaySource(hung_recording(tmp_path))
    at = lambda s: source.view_at(int(s * S) - (source.start_ns - T0))  # noqa: E731 (seconds into the run)
    before = at(6.0)
    assert [r.progress for r in before.ranks] == [None, None] and before.hang is None
    first = at(7.2)  # rank 1 has reported, rank 0 not yet
    assert first.ranks[0].progress is None and first.ranks[1].progress is not None
    view = at(8.0)
    assert [r.progress.reason for r in view.ranks if r.progress is not None] == [STALLED, STALLED]
    assert view.ranks[1].progress is not None and round(view.ranks[1].progress.idle_s, 3) == 4.0  # 4 s to 8 s
    later = at(9.0)
    assert later.ranks[1].progress is not None and round(later.ranks[1].progress.idle_s, 3) == 5.0
    recorded = last_report(read_recording(tmp_path / "rank-1.jsonl").progress)
    assert recorded is not None and round(recorded.idle_s, 3) == 3.0  # what the file holds: at 7 s


def test_a_replay_names_the_stuck_rank_and_a_killed_rank_is_dead_once_its_recording_ends(tmp_path: Path) -> None:
    source = ReplaySource(hung_recording(tmp_path))
    at = lambda s: source.view_at(int(s * S) - (source.start_ns - T0))  # noqa: E731
    hang = at(8.0).hang
    assert hang is not None and hang.hung and hang.culprits == (1,)
    assert hang.of(1).state == STUCK and hang.of(0).state == WAITING and hang.of(0).waits_for == (1,)
    assert "it is in data_loader_stall (data.py:17)" in hang.lines[0]
    after = at(12.0).hang  # rank 1's file ended at 10 s without an end record
    assert after is not None and after.of(1).state == "dead" and after.lines[0].startswith("rank 1 is dead (killed")
    end = final_view(tmp_path)
    assert end.hang is not None and end.hang.of(1).state == "dead" and end.hang.of(0).state == WAITING
    assert end.ranks[0].progress is not None and end.ranks[0].progress.reason == "signal SIGTERM"


def test_a_frame_outside_the_program_is_not_where_it_stands() -> None:
    """The row says the innermost frame of the program's own code (RankProgress.where), not the stack's last."""
    library = StackFrame("/usr/lib/python3/threading.py", 320, "wait")
    stuck = dataclasses.replace(HUNG[1], stack=(*HUNG[1].stack, library))
    row = hang_view(fleet_of({0: HUNG[0], 1: stuck})).rows[1]
    assert row.where == "in data_loader_stall (data.py:17)"
