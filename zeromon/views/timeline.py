"""The Communication page as plain data: one step's timeline on a few ranks (phases, collectives, and
the overlap, exposed and blocked intervals exactly as the step's overlap is computed), exposed
communication and overlap per step, and the bytes each step moved by ZeRO meaning.

The intervals come from zeromon.analysis.step_overlap.step_intervals fed with what step_overlaps
feeds it (the collectives' [issue, completion], the blocked intervals, zeromon's own spans, on the
GPU the stream's compute phases, the StepSummary's window), so the exposed time a timeline draws is
the recorded step's exposed_comm_s and `zeromon report`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from zeromon.analysis.intervals import Interval, total
from zeromon.analysis.step_overlap import (
    AGENT_PHASE,
    COMPUTE_PHASES,
    DEVICE_CLOCK,
    StepIntervals,
    step_intervals,
)
from zeromon.model.classes import frozen
from zeromon.model.codec import CollectiveColumns
from zeromon.model.columns import TableRecords
from zeromon.model.events import CollectiveEvent, PhaseSpan, StepSummary, steps_label
from zeromon.views.run_data import RankHistory, RunData


@frozen
class RankStep:
    """One rank's step as a timeline draws it."""

    rank: int
    summary: StepSummary
    phases: tuple[PhaseSpan, ...]  # the step's phases, in time order
    collectives: tuple[CollectiveEvent, ...]  # issued in the step, in issue order
    intervals: StepIntervals

    @property
    def exposed_s(self) -> float:
        return total(self.intervals.exposed) / 1e9

    @property
    def overlap_s(self) -> float:
        return total(self.intervals.overlap) / 1e9

    @property
    def blocked_s(self) -> float:
        return total(self.intervals.blocked) / 1e9


@frozen
class StepTimeline:
    step: int  # the recorded index (shown from 1)
    origin_ns: int | None  # the earliest drawn rank's step start: x = 0 (one host clock for all)
    ranks: tuple[RankStep, ...]
    missing: tuple[tuple[int, str], ...]  # (rank, why its band is not drawn)


def _summary(history: RankHistory, step: int) -> StepSummary | None:
    steps = history.steps
    if isinstance(steps, TableRecords):  # a recording's, stored by step: found by bisection, one record made
        table = steps.table
        i = table.upto(step) - 1
        return table.get(i) if i >= 0 and table.t_ns[i] == step else None
    return next((s for s in steps if s.step == step), None)


def _step_range(history: RankHistory) -> tuple[int, int] | None:
    """The history's first and last step index (a recording's from its stored keys: no record made,
    where a StepSummary a step, made again on every step change, would be slow on a long run)."""
    steps = history.steps
    if isinstance(steps, TableRecords):
        keys = steps.table.t_ns
        return (keys[0], keys[-1]) if len(keys) else None
    indices = [s.step for s in steps]
    return (min(indices), max(indices)) if indices else None


def _step_indices(records: Sequence[StepSummary] | Sequence[PhaseSpan]) -> set[int]:
    """The step indices of a history's steps or phase spans (a replay's tables read a column: no record made)."""
    if isinstance(records, TableRecords):
        indices = records.table.numbers("step")
        if indices is not None:
            return set(indices)
    return {r.step for r in records}


def _held(history: RankHistory) -> str:
    if not history.steps:
        return "no step yet"
    return steps_label(history.steps[0].step, history.steps[-1].step)


def _near_window(history: RankHistory, step: int, window: Interval) -> list[CollectiveEvent]:
    """The neighbouring steps' collectives that touch the step's window (one issued late in the
    previous step may complete inside this one)."""
    lo, hi = window
    return [c for s in (step - 1, step + 1) for c in history.step_collectives(s)
            if c.issue_ns < hi and max(c.complete_ns or 0, _blocked_end(c)) > lo]


def _blocked_end(c: CollectiveEvent) -> int:
    return max((b[1] for b in (c.blocked_interval_ns, c.issue_interval_ns) if b is not None), default=0)


def rank_step(history: RankHistory, step: int) -> RankStep | str:
    """The rank's step, or why it cannot be drawn (its history lacks the step or the step's phases)."""
    summary = _summary(history, step)
    if summary is None:
        where = "recorded" if history.complete else "held by this dashboard"
        return f"rank {history.rank}: step {step + 1} is not {where} ({_held(history)})"
    phases = tuple(sorted(history.step_phases(step), key=lambda p: p.start_ns))
    if not phases and not history.complete:
        return f"rank {history.rank}: the phases of step {step + 1} are no longer held (the agents keep recent ones)"
    own = history.step_collectives(step)
    window = (summary.start_ns, summary.end_ns)
    events = own + _near_window(history, step, window)
    comm = [(c.issue_ns, c.complete_ns) for c in events if c.complete_ns is not None]
    blocked = [b for c in events for b in (c.blocked_interval_ns, c.issue_interval_ns) if b is not None]
    agent = [(p.start_ns, p.end_ns) for p in phases if p.phase == AGENT_PHASE]
    on_stream = any(p.timing == DEVICE_CLOCK for p in phases)
    stream_compute = [(p.start_ns, p.end_ns) for p in phases if p.phase in COMPUTE_PHASES] if on_stream else None
    intervals = step_intervals(comm, blocked, window, agent=agent, stream_compute=stream_compute)
    return RankStep(rank=history.rank, summary=summary, phases=phases, collectives=tuple(own), intervals=intervals)


def step_timeline(histories: Mapping[int, RankHistory], ranks: Sequence[int], step: int) -> StepTimeline:
    drawn: list[RankStep] = []
    missing: list[tuple[int, str]] = []
    for rank in ranks:
        history = histories.get(rank)
        got = rank_step(history, step) if history is not None else f"rank {rank}: nothing recorded yet"
        if isinstance(got, str):
            missing.append((rank, got))
        else:
            drawn.append(got)
    origin = min((r.summary.start_ns for r in drawn), default=None)
    return StepTimeline(step=step, origin_ns=origin, ranks=tuple(drawn), missing=tuple(missing))


def step_choices(histories: Mapping[int, RankHistory], ranks: Sequence[int]) -> tuple[int, int] | None:
    """The first and last recorded step index of the chosen ranks."""
    ranges = [span for r in ranks if (h := histories.get(r)) is not None and (span := _step_range(h)) is not None]
    return (min(lo for lo, _ in ranges), max(hi for _, hi in ranges)) if ranges else None


def default_step(histories: Mapping[int, RankHistory], ranks: Sequence[int]) -> int | None:
    """A recording's median-duration step after the first on the first rank with steps (as `zeromon
    report --html` draws); live, the newest step every chosen rank has summarized with its phases held."""
    held = [h for r in ranks if (h := histories.get(r)) is not None and h.steps]
    if not held:
        return None
    first = held[0]
    if first.complete:
        steps = [s for s in first.steps if s.step >= 1] or list(first.steps)
        return sorted(steps, key=lambda s: s.duration_s)[len(steps) // 2].step
    common = set.intersection(*(_step_indices(h.steps) & _step_indices(h.phases) for h in held))
    return max(common) if common else first.steps[-1].step


# --- over the run ------------------------------------------------------------------------------------------

@frozen
class StepSeries:
    """A rank's exposed communication and overlap per step, in step order."""

    rank: int
    steps: tuple[int, ...]  # recorded indices (shown from 1)
    exposed_s: tuple[float | None, ...]
    overlap_ratio: tuple[float | None, ...]


def step_series(data: RunData, rank: int) -> StepSeries:
    """From the report's StepOverlaps on a recording (what `zeromon report` prints), else from the
    agents' StepSummaries."""
    report = next((r for r in data.report.ranks if r.rank == rank), None) if data.report else None
    if report is not None:
        return StepSeries(rank, tuple(s.step for s in report.steps), tuple(s.exposed_comm_s for s in report.steps),
                          tuple(s.overlap_ratio for s in report.steps))
    history = data.histories.get(rank)
    steps = history.steps if history is not None else ()
    return StepSeries(rank, tuple(s.step for s in steps), tuple(s.exposed_comm_s for s in steps),
                      tuple(s.overlap_ratio for s in steps))


@frozen
class StepBytes:
    """Bytes moved per step by ZeRO meaning (the larger of each collective's bytes in and out, as
    StepSummary.comm_bytes counts them)."""

    rank: int
    steps: tuple[int, ...]  # recorded indices, ascending
    by_meaning: Mapping[str, tuple[int, ...]]  # meaning -> bytes per step, aligned with steps


# One entry per rank's columns: the sums cost one pass over every collective,
# which a redraw for another step should not pay again.
_BYTES_CACHE: dict[int, tuple[CollectiveColumns, int | None, StepBytes]] = {}


def step_bytes(history: RankHistory) -> StepBytes:
    """Every step's bytes by meaning; of a partial (live) history, only the steps whose collectives
    are all held (their count is the step summary's)."""
    columns = history.collectives
    cached = _BYTES_CACHE.get(history.rank)
    if cached is not None and cached[0] is columns and cached[1] == history.until_ns and history.complete:
        return cached[2]
    sums: dict[str, dict[int, int]] = {}
    counts: dict[int, int] = {}
    if columns is not None:
        until = history.until_ns
        for step, meaning, bytes_in, bytes_out, issue in zip(columns.step, columns.meaning, columns.bytes_in,
                                                            columns.bytes_out, columns.issue_ns, strict=True):
            if step < 0 or (until is not None and issue > until):
                continue
            by_step = sums.setdefault(meaning, {})
            by_step[step] = by_step.get(step, 0) + max(bytes_in, bytes_out)
            counts[step] = counts.get(step, 0) + 1
    steps = sorted(counts)
    if not history.complete:
        expected = {s.step: s.collectives for s in history.steps}
        steps = [s for s in steps if expected.get(s) == counts[s]]
    out = StepBytes(history.rank, tuple(steps),
                    {m: tuple(by_step.get(s, 0) for s in steps) for m, by_step in sorted(sums.items())})
    if columns is not None and history.complete:
        _BYTES_CACHE[history.rank] = (columns, history.until_ns, out)
    return out

