"""Running totals since the agent started, behind the live metrics: collectives by op and ZeRO
meaning (calls, bytes, a duration histogram, time blocked), recent bus bandwidth by op, steps (a
duration histogram) and OOMs. The recorder's thread updates them and the endpoint reads them, both
under the recorder's lock.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterator, Sequence
from dataclasses import field
from typing import Any

from zeromon.model.classes import mutable
from zeromon.model.compiled import compiled
from zeromon.model.events import CollectiveEvent, StepSummary

# Histogram bounds (seconds) of the live metrics: collective durations and step durations.
DURATION_BUCKETS: tuple[float, ...] = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
                                       0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STEP_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BUSBW_WINDOW = 256  # recent bus-bandwidth samples kept per op


@mutable
class CollectiveTotals:
    """Running totals of one (op, meaning) since the agent started, for the live metrics."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0  # sum of measured durations
    timed_calls: int = 0  # calls with a measured duration (the histogram's count)
    blocked_s: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))  # not cumulative


@mutable
class StepTotals:
    count: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(STEP_BUCKETS) + 1))  # not cumulative


# The count in C (live/_totals.c, where setup.py built it; None: the Python loop, _count_rows, which gives the same).
_COUNT = getattr(compiled("zeromon_agent.live._totals"), "count", None)


def _new_window() -> collections.deque[float]:
    return collections.deque(maxlen=BUSBW_WINDOW)


# Collectives handed over but not yet counted: counted when the totals are read (a scrape) or when
# this many wait (a bound on their memory), in one loop rather than a method call each as they come.
_UNCOUNTED_MAX = 4096

# What the totals take of a collective: (op, meaning, bytes, time blocked, duration or None, busbw or None).
Counted = tuple[str, str, int, float, "float | None", "float | None"]
# A batch of them as columns, in that order (the recorder's batch of synchronous collectives: no tuple a
# collective, which would live until counted, in the garbage collector's way).
CountedColumns = list[Sequence[Any]]


def counted(event: CollectiveEvent, duration_s: float | None, busbw: float | None) -> Counted:
    """What the totals take of ``event``, measured ``duration_s`` long at ``busbw`` bytes/s (None: not)."""
    return (event.op, event.meaning, max(event.bytes_in, event.bytes_out), event.thread_blocked_s, duration_s,
            busbw)


class LiveTotals:
    """The totals; the collectives among them are counted lazily (``count_collectives``): a rank nobody
    scrapes counts them once per _UNCOUNTED_MAX, in bulk. Every read of ``collectives`` or ``busbw``
    counts what waits first, so a reader sees every collective handed over (under the recorder's lock)."""

    def __init__(self) -> None:
        self._collectives: dict[tuple[str, str], CollectiveTotals] = {}  # by (op, meaning)
        self._busbw: dict[str, collections.deque[float]] = {}  # recent samples (bytes/s) by op
        self._uncounted: list[Counted | CountedColumns] = []  # in the order they came
        self._uncounted_rows = 0
        self.steps = StepTotals()
        self.ooms = 0

    @property
    def collectives(self) -> dict[tuple[str, str], CollectiveTotals]:
        self._count_uncounted()
        return self._collectives

    @property
    def busbw(self) -> dict[str, collections.deque[float]]:
        self._count_uncounted()
        return self._busbw

    def count_collectives(self, batch: list[Counted | CountedColumns]) -> None:
        """Collectives (``counted``'s tuples, or columns of them), counted by the next read at the latest."""
        self._uncounted.extend(batch)
        self._uncounted_rows += sum(len(item[0]) if type(item) is list else 1 for item in batch)
        if self._uncounted_rows >= _UNCOUNTED_MAX:
            self._count_uncounted()

    def count_collective(self, event: CollectiveEvent, duration_s: float | None, busbw: float | None) -> None:
        self._uncounted.append(counted(event, duration_s, busbw))
        self._count_uncounted()

    def _count_uncounted(self) -> None:
        uncounted = self._uncounted
        if not uncounted:
            return
        self._uncounted, self._uncounted_rows = [], 0
        if _COUNT is not None and _COUNT(uncounted, self._collectives, self._busbw, CollectiveTotals, _new_window,
                                         DURATION_BUCKETS):
            return
        self._count_rows(uncounted)

    def _count_rows(self, uncounted: list[Counted | CountedColumns]) -> None:
        """The Python path of _totals.c's count: each collective of ``uncounted`` into its totals, in order."""
        collectives, windows, bisect_left = self._collectives, self._busbw, bisect.bisect_left
        for op, meaning, nbytes, blocked_s, duration_s, busbw in _rows(uncounted):
            totals = collectives.get((op, meaning))
            if totals is None:
                totals = collectives[(op, meaning)] = CollectiveTotals()
            totals.calls += 1
            totals.bytes += nbytes
            totals.blocked_s += blocked_s
            if duration_s is not None:
                totals.timed_calls += 1
                totals.seconds += duration_s
                totals.buckets[bisect_left(DURATION_BUCKETS, duration_s)] += 1
            if busbw is not None:
                window = windows.get(op)
                if window is None:
                    window = windows[op] = _new_window()
                window.append(busbw)

    def count_steps(self, summaries: Sequence[StepSummary]) -> None:
        """A pass's step summaries into the step totals, in order (the seconds added one at a time, as one call a
        step would: the same float)."""
        totals, bisect_left = self.steps, bisect.bisect_left
        buckets, seconds = totals.buckets, totals.seconds
        for summary in summaries:
            duration_s = summary.duration_s
            seconds += duration_s
            buckets[bisect_left(STEP_BUCKETS, duration_s)] += 1
        totals.seconds = seconds
        totals.count += len(summaries)


def _rows(uncounted: list[Counted | CountedColumns]) -> Iterator[Counted]:
    """Each collective of ``uncounted`` in order, a batch's columns a row at a time."""
    for item in uncounted:
        if isinstance(item, list):
            yield from zip(*item, strict=True)
        else:
            yield item
