"""The hang verdict as the TUI and the dashboard show it, as plain data: a banner (the verdict in words, cause
first), a row per rank (its state, where it stands, whom it waits for) and the ranks' stacks, identical ones
together.

FleetView in (its ``hang``, zeromon.analysis.hang's verdict, and each rank's ``progress`` report), HangView out;
the words are `zeromon live`'s and `zeromon hang`'s, so that a rank is said to be in the same place everywhere.
"""

from __future__ import annotations

from zeromon.analysis.hang import (
    BEHIND,
    DEAD,
    DESYNC,
    IDLE,
    OK,
    STUCK,
    UNKNOWN,
    WAITING,
    HangVerdict,
    RankVerdict,
    StackGroup,
    clock,
    collective_words,
    group_stacks,
    seconds_words,
)
from zeromon.model.classes import frozen
from zeromon.model.events import step_number
from zeromon.model.progress import RankProgress, StackFrame
from zeromon.model.units import rank_ranges
from zeromon.sources.fleet import FleetView

HOLDING_UP = (STUCK, DEAD, DESYNC, BEHIND)  # the states of a rank that holds its peers up
HANG_STATES = (*HOLDING_UP, WAITING, IDLE)  # the states the ranks tables show instead of "alive"
NO_REPORT = ("no rank has reported where it is in its collectives (a live agent reports on every poll; a "
             "recording's ranks when they stall, go on after a stall, or are stopped by a signal)")

# The per-rank table's columns: (key, label); the longest last.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("rank", "rank"), ("state", "state"), ("step", "in step"), ("no_progress", "no progress"),
    ("waits_for", "waits for"), ("where", "where"),
)


@frozen
class HangBanner:
    """The verdict in words, while the job makes no progress: "critical" when hung, "warn" when only stalled."""

    level: str  # "critical" or "warn"
    label: str  # "hung" or "stalled"
    headline: str  # the cause: "rank 1 has not reached all_gather #5 of the default group ..."
    more: tuple[str, ...]  # the verdict's other lines
    culprits: tuple[int, ...]  # the ranks that hold the others up, the surest first

    @property
    def text(self) -> str:
        """"Hung: rank 1 has not reached ...": `zeromon live`'s line, headed as the dashboard's banners are."""
        return f"{self.label.capitalize()}: {self.headline}"


@frozen
class HangRow:
    """One rank in the verdict's table; cells as text, in COLUMNS order."""

    rank: int
    state: str  # zeromon.analysis.hang's: ok, waiting, stuck, behind, desync, dead, idle, unknown
    level: str  # "critical": it holds its peers up; "warn": it waits, or the job is idle; "ok"
    step: str  # the step it is in, counted from 1 as training logs count; "-" unknown
    no_progress: str  # "42 s"; "-" without a report
    where: str  # "in all_gather #5 of the default group (param_all_gather) since 06:31:20", "in f (x.py:17)"
    waits_for: str  # "rank 1"; "" when it waits for nobody

    @property
    def cells(self) -> tuple[str, ...]:
        return (str(self.rank), self.state, self.step, self.no_progress, self.waits_for, self.where)


@frozen
class StackBlock:
    """Ranks whose training threads stand at the same stack."""

    ranks: tuple[int, ...]
    title: str  # "ranks 0, 2-3 (3): in forward (model.py:12)"
    frames: tuple[str, ...]  # 'File "/job/train.py", line 40, in main', the innermost last


@frozen
class HangView:
    """What the front ends show of the verdict at one moment."""

    banner: HangBanner | None  # None while the job makes progress
    status: str  # one line that says the state when there is no banner ("no hang: ...")
    rows: tuple[HangRow, ...]  # by rank; none where no rank reported
    stacks: tuple[StackBlock, ...]  # those of the ranks that hold the others up first, then the largest group first
    stacks_title: str  # what the stacks are: at the stall, or now


def hang_banner(verdict: HangVerdict | None) -> HangBanner | None:
    """The banner of a verdict that has something to say; None while the job makes progress."""
    if verdict is None or not verdict.lines or verdict.severity is None:
        return None
    return HangBanner(level=verdict.severity, label="hung" if verdict.hung else "stalled",
                      headline=verdict.lines[0], more=tuple(verdict.lines[1:]), culprits=verdict.culprits)


def row_level(verdict: RankVerdict, hung: bool) -> str:
    """A rank's colour: critical when it holds its peers up (a silent rank only while the job is hung)."""
    if verdict.state in HOLDING_UP or (verdict.state == UNKNOWN and hung):
        return "critical"
    return "warn" if verdict.state in (WAITING, IDLE) else "ok"


def hang_states(verdict: HangVerdict | None) -> dict[int, tuple[str, str]]:
    """(state, level) of each rank the verdict says more of than ok: what the ranks tables show in their state
    column, as `zeromon live`'s does."""
    if verdict is None:
        return {}
    return {r.rank: (r.state, row_level(r, verdict.hung)) for r in verdict.ranks if r.state not in (OK, UNKNOWN)}


def _where(report: RankProgress | None, verdict: RankVerdict | None) -> str:
    """Where a rank stands, in `zeromon hang`'s words: the collective it is blocked in, else its own code's frame."""
    if report is None:
        return verdict.detail if verdict is not None and verdict.detail else "no report"
    if report.blocked is not None:
        call = report.blocked.call
        group = report.group(call.group)
        label = group.label if group is not None else f"group {call.group}"
        return f"in {collective_words(call, label)} since {clock(report.blocked.since_ns)}"
    if report.where is not None:
        return f"in {report.where.function} ({report.where.where})"
    return "-"


def hang_row(rank: int, report: RankProgress | None, verdict: RankVerdict | None, hung: bool = False) -> HangRow:
    state = verdict.state if verdict is not None else OK
    level = row_level(verdict, hung) if verdict is not None else "ok"
    step = str(step_number(report.step)) if report is not None and report.step >= 0 else "-"
    idle = seconds_words(report.idle_s) if report is not None else "-"
    waits = rank_ranges(verdict.waits_for) if verdict is not None and verdict.waits_for else ""
    return HangRow(rank=rank, state=state, level=level, step=step, no_progress=idle, where=_where(report, verdict),
                   waits_for=waits)


def frame_line(frame: StackFrame) -> str:
    """A frame as Python's tracebacks write it."""
    return f'File "{frame.file}", line {frame.line}, in {frame.function}'


def stack_block(group: StackGroup) -> StackBlock:
    where = f": in {group.where.function} ({group.where.where})" if group.where is not None else ""
    count = f" ({len(group.ranks)})" if len(group.ranks) > 1 else ""
    return StackBlock(ranks=group.ranks, title=f"{rank_ranges(group.ranks)}{count}{where}",
                      frames=tuple(frame_line(f) for f in group.stack))


def reports_of(view: FleetView) -> dict[int, RankProgress | None]:
    """Each rank's newest progress report, by rank (None: it reported none)."""
    return {r.rank: r.progress for r in view.ranks if r.rank is not None}


def _status(verdict: HangVerdict | None, reported: bool) -> str:
    if verdict is not None and verdict.lines:
        return ("critical: hung: " if verdict.hung else "warn: stalled: ") + verdict.lines[0]
    if verdict is not None:
        return f"no hang: every rank made progress within its threshold ({seconds_words(verdict.threshold_s)})"
    return "no hang reported: no rank has reported a stall" if reported else NO_REPORT


def hang_view(view: FleetView) -> HangView:
    """The verdict of ``view`` (FleetView.hang) with each rank's row and the grouped stacks (hang_view_of)."""
    return hang_view_of(view.hang, reports_of(view))


def hang_view_of(verdict: HangVerdict | None, reports: dict[int, RankProgress | None]) -> HangView:
    """A verdict with each rank's row and the grouped stacks: those of the stall where the verdict has them, else
    where the ranks' reports stand now; a culprit's stack first (on a small screen the first stack is the one
    seen), the others largest group first."""
    reported = {rank: r for rank, r in reports.items() if r is not None}
    if verdict is None and not reported:
        return HangView(banner=None, status=NO_REPORT, rows=(), stacks=(), stacks_title="")
    hung = verdict is not None and verdict.hung
    ranks = sorted(set(reports) | ({r.rank for r in verdict.ranks} if verdict is not None else set()))
    rows = tuple(hang_row(rank, reports.get(rank), verdict.of(rank) if verdict is not None else None, hung)
                 for rank in ranks)
    at_stall = verdict is not None and bool(verdict.stacks)
    groups = verdict.stacks if verdict is not None and at_stall else group_stacks(reported)
    culprits = set(verdict.culprits) if verdict is not None and verdict.lines else set()
    groups = tuple(sorted(groups, key=lambda g: not culprits & set(g.ranks)))  # the cause first, as in the verdict
    title = ("the training threads' stacks when they made no progress, identical ones together (innermost last)"
             if at_stall else "the training threads' stacks as last reported, identical ones together (innermost last)")
    return HangView(banner=hang_banner(verdict), status=_status(verdict, bool(reported)), rows=rows,
                    stacks=tuple(stack_block(g) for g in groups if g.stack), stacks_title=title)

