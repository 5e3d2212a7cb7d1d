"""Overlap and exposed communication per rank and step, from zeromon's own recordings.

Communication is each collective's [issue, completion] interval. Computation is the training
thread's time in the forward, backward and optimizer phases, minus the intervals it spent blocked
in collectives (a synchronous call, or ``Work.wait()``): a blocked thread computes nothing. Both are
clipped to the step's window [first phase start, optimizer step end], and the overlap follows HTA's
definition (``zeromon.analysis.overlap``).

On CPU with gloo these are host intervals: collectives run on gloo's threads while the training
thread computes, so an async collective really overlaps. On GPU the agent marks the phase boundaries
and the collectives with CUDA events on the current stream, so every interval is GPU time: a phase
is when the stream ran its work, and "blocked" is when the stream waited for a collective
(PhaseSpan.timing and CollectiveEvent.timing say which clock each interval is on).
Collectives whose completion was never observed (timing ``unknown``) are left out.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from zeromon.analysis.intervals import Interval, clip, intersect, merge, subtract, total
from zeromon.analysis.overlap import Overlap, overlap_of_merged
from zeromon.model.codec import Recording

COMPUTE_PHASES = frozenset({"forward", "backward", "optimizer"})


@dataclass(frozen=True, slots=True)
class StepOverlap:
    rank: int
    step: int
    step_s: float
    comm_s: float
    comp_s: float
    overlap_s: float
    exposed_comm_s: float
    idle_s: float
    blocked_s: float  # time the training thread was blocked in collectives within the step

    @property
    def overlap_ratio(self) -> float | None:
        return self.overlap_s / self.comm_s if self.comm_s > 0 else None

    @property
    def exposed_share(self) -> float | None:
        return self.exposed_comm_s / self.step_s if self.step_s > 0 else None


def step_overlaps(rec: Recording) -> tuple[StepOverlap, ...]:
    """One StepOverlap per summarized step of one rank's recording, in step order."""
    compute_by_step: dict[int, list[Interval]] = defaultdict(list)
    for span in rec.phases:
        if span.step >= 0 and span.phase in COMPUTE_PHASES:
            compute_by_step[span.step].append((span.start_ns, span.end_ns))
    # One pass over two columns each: a recording holds up to a million collectives.
    columns = rec.collective_columns()
    comm_u = merge([(issue, complete) for issue, complete in zip(columns.issue_ns, columns.complete_ns, strict=True)
                    if complete is not None and complete > issue])
    # CollectiveEvent.blocked_interval_ns, for every event at once.
    blocked_u = merge([(wait, wait + int(blocked * 1e9))
                       for wait, blocked in zip(columns.wait_ns, columns.blocked_s, strict=True)
                       if wait is not None and blocked > 0])
    out = []
    for summary in sorted(rec.steps, key=lambda s: s.step):
        window = summary.start_ns, summary.end_ns
        blocked_in_step = _within(blocked_u, window)
        result = _overlap(_within(comm_u, window), compute_by_step.get(summary.step, ()), blocked_in_step, window)
        out.append(StepOverlap(
            rank=rec.rank, step=summary.step, step_s=result.window_s, comm_s=result.comm_s,
            comp_s=result.comp_s, overlap_s=result.overlap_s, exposed_comm_s=result.exposed_comm_s,
            idle_s=result.idle_s, blocked_s=total(blocked_in_step) / 1e9,
        ))
    return tuple(out)


def overlap_in_step(comm: Iterable[Interval], compute: Iterable[Interval], blocked: Iterable[Interval],
                    window: Interval) -> Overlap:
    """One step's overlap from its raw intervals: what the agent computes live as each step ends."""
    return _overlap(clip(merge(comm), window), compute, clip(merge(blocked), window), window)


def _overlap(comm_in_window: list[Interval], compute: Iterable[Interval], blocked_in_window: list[Interval],
             window: Interval) -> Overlap:
    """Computation is the compute phases minus the blocked time; both unions clipped to the window."""
    comp = clip(subtract(merge(compute), blocked_in_window), window)
    return overlap_of_merged(comm_in_window, comp, window)


def _within(merged: list[Interval], window: Interval) -> list[Interval]:
    """The disjoint intervals that touch the window, clipped to it (two binary searches: only the
    first and the last can stick out)."""
    lo, hi = window
    i = bisect.bisect_left(merged, (lo,))
    if i > 0 and merged[i - 1][1] > lo:
        i -= 1
    out = merged[i:bisect.bisect_left(merged, (hi,), lo=i)]
    if out:
        if out[0][0] < lo:
            out[0] = (lo, out[0][1])
        if out[-1][1] > hi:
            out[-1] = (out[-1][0], hi)
    return out


@dataclass(frozen=True, slots=True)
class StepIntervals:
    """One step's intervals (ns) as its overlap is computed: what a timeline draws."""

    window: Interval
    comm: tuple[Interval, ...]  # union of the collectives, clipped to the window
    comp: tuple[Interval, ...]  # the compute phases minus the blocked time, clipped
    overlap: tuple[Interval, ...]  # communication hidden behind computation
    exposed: tuple[Interval, ...]  # communication not hidden: comm minus comp
    blocked: tuple[Interval, ...]  # the training thread blocked in collectives (waits, sync calls)


def step_intervals(comm: Iterable[Interval], compute: Iterable[Interval], blocked: Iterable[Interval],
                   window: Interval) -> StepIntervals:
    """The intervals behind overlap_in_step's numbers: total(exposed) / 1e9 is its exposed_comm_s."""
    comm_u = clip(merge(comm), window)
    blocked_u = clip(merge(blocked), window)
    comp = clip(subtract(merge(compute), blocked_u), window)
    return StepIntervals(window=window, comm=tuple(comm_u), comp=tuple(comp),
                         overlap=tuple(intersect(comm_u, comp)), exposed=tuple(subtract(comm_u, comp)),
                         blocked=tuple(blocked_u))
