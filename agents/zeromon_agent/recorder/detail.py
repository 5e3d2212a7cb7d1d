"""A bounded recording (``ZEROMON_MAX_DISK``): which steps keep their per-collective detail.

Every step's summary (a few hundred bytes) is written for the whole run. The detail (each collective,
phase span and memory sample: most of a recording's bytes) is written as it comes while the file is
small; as the file fills its budget it is thinned, step by step:

    file size / ZEROMON_MAX_DISK   detail kept for
    below 20%                      every step (short runs that fit keep everything)
    20% to 30%                     every 10th step, steps that stand out, the last steps
    30% to 40%                     every 100th step, steps that stand out (at most 1 in 10), the last steps
    40% to 50%                     every 1000th step, steps that stand out (at most 1 in 100), the last steps
    50% to 100%                    none: the rest of the budget is the summaries' (~300 bytes a step)
    100% less END_ROOM             nothing more but how the rank ends: the file stays under the budget

A step stands out when its step time is over 1.5 x the median of the last 64 steps, its exposed
communication share is 10 points over theirs, or its peak memory is a new high (the OOM forecast's
trend rising). Thinned, a step's detail waits in memory until its summary decides (bounded:
``_MAX_HELD`` records; beyond, the step's detail is dropped and counted); the last ``LAST_STEPS``
steps' dropped detail is written when the rank ends cleanly. Each change of level writes a Notice that
says, from which step, what is kept; the file's size is looked at once per flush, so a level can be
passed by one flush interval's writing. A crash loses what the writer had not flushed (one flush
interval) and, when thinned, the detail of the steps not yet decided. The levels follow the file's
size once per flush; the budget itself is checked at every record (``admit``), against what the writer
counts it has written.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable

from zeromon.model.events import Record, StepSummary
from zeromon.model.numbers import KIB, MIB, format_size

# (share of the budget from which a level applies, keep every Nth step (None: none), least steps between
# two outliers kept)
LEVELS: tuple[tuple[float, int | None, int], ...] = (
    (0.0, 1, 0), (0.2, 10, 1), (0.3, 100, 10), (0.4, 1000, 100), (0.5, None, 0))
LAST_STEPS = 8
_WINDOW = 64  # the steps an outlier is measured against
_MIN_HISTORY = 8  # steps seen before anything can stand out
_SLOW = 1.5  # a step this many times the median step time stands out
_EXPOSED_POINTS = 0.10  # an exposed share this much over the median share stands out
_MAX_HELD = 65536  # detail records held for undecided steps; the rest is dropped and counted
_DECIDED_KEPT = 4096  # steps decided 'kept' remembered for detail that comes late (a later wait)
END_ROOM = 16 * 1024  # the budget's end kept for how the rank ends (notices, agent stats, the end record)


class DetailKeeper:
    """Decides which steps' detail goes to the file. Owned by the recorder's thread (not thread-safe).

    ``write`` writes a record; ``size`` gives the bytes written so far (None when unknown); ``notice``
    says a change of level in the recording."""

    def __init__(self, write: Callable[[Record], None], max_bytes: int | None,
                 size: Callable[[], int | None], notice: Callable[[str], None]) -> None:
        self._write = write
        self.max_bytes = max_bytes
        self._size = size
        self._notice = notice
        self.level = 0
        self.full = False  # the file reached max_bytes: nothing more is written but the end
        self.steps_kept = 0  # steps whose detail was written, once thinned
        self.steps_thinned = 0  # steps whose detail was dropped
        self.records_dropped = 0
        self.thinned_from: int | None = None  # the first step decided under a thinned level
        self._held: dict[int, list[Record]] = {}
        self._held_count = 0
        self._overflowed: set[int] = set()
        self._kept_steps: collections.deque[int] = collections.deque(maxlen=_DECIDED_KEPT)
        self._kept_set: set[int] = set()
        self._last: collections.deque[list[Record]] = collections.deque(maxlen=LAST_STEPS)
        self._durations: collections.deque[float] = collections.deque(maxlen=_WINDOW)
        self._shares: collections.deque[float] = collections.deque(maxlen=_WINDOW)
        self._peak: int | None = None
        self._last_outlier = -(10**18)
        self._decided_through = -1

    def detail(self, record: Record, step: int) -> None:
        """A collective or a phase span of ``step``: written now, or held until its step decides."""
        if not self.level:  # not thinned
            self._write(record)
            return
        if step <= self._decided_through:  # late detail of a decided step
            if step in self._kept_set:
                self._write(record)
            else:
                self.records_dropped += 1
            return
        if self._held_count >= _MAX_HELD:
            self._overflowed.add(step)
            self.records_dropped += 1
            return
        self._held.setdefault(step, []).append(record)
        self._held_count += 1

    def step_done(self, summary: StepSummary) -> None:
        """Before ``summary`` is written: the step's held detail is written or dropped; then the level the
        file's size calls for, for the steps after it (a JSON-lines file grows record by record: between
        two flushes, a second apart, a run of short steps may write much of the budget)."""
        if self.level:
            self._decide(summary)
        else:
            # Nothing thinned: the step's detail went to the file as it came (``detail`` holds none before the
            # first level, and levels only rise); the step only joins the history that thinning will judge by.
            self._join_history(summary)
            if summary.step > self._decided_through:
                self._decided_through = summary.step
        if self.max_bytes is not None and not self.full:
            self.check_size()

    def _decide(self, summary: StepSummary) -> None:
        """A step's detail, thinned: written if the level keeps its step (every Nth, or one that stands out),
        else dropped (the last LAST_STEPS steps' kept aside for a clean end)."""
        step = summary.step
        keep = self._stands_out(summary)
        self._decided_through = max(self._decided_through, step)
        held = self._held.pop(step, None)
        if held is not None:
            self._held_count -= len(held)
        every, gap = LEVELS[self.level][1], LEVELS[self.level][2]
        regular = every is not None and step % every == 0
        outlier = keep and every is not None and step - self._last_outlier >= gap
        if (regular or outlier) and step not in self._overflowed:
            if outlier and not regular:
                self._last_outlier = step
            for record in held or ():
                self._write(record)
            self.steps_kept += 1
            if len(self._kept_steps) == self._kept_steps.maxlen:
                self._kept_set.discard(self._kept_steps[0])
            self._kept_steps.append(step)
            self._kept_set.add(step)
        else:
            self.steps_thinned += 1
            self.records_dropped += len(held or ())
            if held:
                self._last.append(held)
        self._overflowed.discard(step)

    def _stands_out(self, summary: StepSummary) -> bool:
        """Step time, exposed share or peak memory out of line with the steps before it; then the step joins
        their history."""
        out = False
        if len(self._durations) >= _MIN_HISTORY:
            duration = summary.duration_s
            out = duration > _SLOW * statistics.median(self._durations)
            if summary.exposed_comm_s is not None and duration > 0 and self._shares:
                out = out or summary.exposed_comm_s / duration > statistics.median(self._shares) + _EXPOSED_POINTS
            if summary.peak_memory is not None and self._peak is not None:
                out = out or summary.peak_memory > self._peak
        self._join_history(summary)
        return out

    def _join_history(self, summary: StepSummary) -> None:
        """The step's time, exposed share and peak memory into the history its successors are judged by (while
        nothing is thinned, all a step's summary does here: two medians of 64 steps a step would be a cost for an
        answer nobody reads)."""
        duration = summary.duration_s
        self._durations.append(duration)
        exposed, peak = summary.exposed_comm_s, summary.peak_memory
        if exposed is not None and duration > 0:
            self._shares.append(exposed / duration)
        if peak is not None:
            self._peak = max(self._peak or 0, peak)

    def admit(self, count: int = 1) -> bool:
        """Whether ``count`` more records may be written (False past the budget, and counted). The file grows
        a segment at a time, so the answer holds for each of them as for the first."""
        if self.max_bytes is None:
            return True
        if not self.full:
            size = self._size()
            if size is None or size < self.max_bytes - END_ROOM:
                return True
            self.full = True
            self._notice(f"the recording holds {_size(size)}, all of ZEROMON_MAX_DISK="
                         f"{format_size(self.max_bytes)} but the room for its end, at step "
                         f"{self._decided_through}: nothing more is written but how the rank ends (every "
                         "step's summary until here; raise ZEROMON_MAX_DISK to keep more)")
        self.records_dropped += count
        return False

    def check_size(self) -> None:
        """After a flush and each step's decision: move to the level the file's size calls for (levels only rise)."""
        if self.max_bytes is None:
            return
        size = self._size()
        if size is None:
            return
        share = size / self.max_bytes
        level = self.level
        while level + 1 < len(LEVELS) and share >= LEVELS[level + 1][0]:
            level += 1
        if level == self.level:
            return
        self.level = level
        first = self._decided_through + 1
        if self.thinned_from is None:
            self.thinned_from = first
        self._notice(self._level_words(first, size))

    def _level_words(self, first: int, size: int) -> str:
        _, every, gap = LEVELS[self.level]
        budget = f"ZEROMON_MAX_DISK={format_size(self.max_bytes or 0)}"
        if every is None:
            kept = "no per-collective detail is kept (the rest of the budget is the step summaries')"
        else:
            outliers = "steps that stand out (step time, exposed share, peak memory)"
            if gap > 1:
                outliers += f", at most 1 in {gap}"
            kept = (f"per-collective detail is kept for every {every}th step, {outliers}, and the last "
                    f"{LAST_STEPS} steps")
        return (f"the recording holds {_size(size)}, {size / (self.max_bytes or 1):.0%} of {budget}: "
                f"from step {first} on, {kept}; every step's summary is kept")

    def close(self) -> str | None:
        """At a clean end: write the last steps' dropped detail; the sentence that says what was kept
        (None when nothing was thinned)."""
        for held in [*self._last, *(self._held[step] for step in sorted(self._held))]:  # then unended steps'
            for record in held:
                self._write(record)
        self._last.clear()
        self._held.clear()
        self._held_count = 0
        if self.thinned_from is None:
            return None
        return (f"bounded recording: from step {self.thinned_from} on, per-collective detail kept for "
                f"{self.steps_kept:,} steps and dropped for {self.steps_thinned:,} "
                f"({self.records_dropped:,} records; the last {LAST_STEPS} steps' written at the end); "
                "every step's summary is kept")


def _size(n: int) -> str:
    """A file's size in words: '812 KiB', '3.4 MiB'."""
    return f"{n / KIB:.0f} KiB" if n < MIB else f"{n / MIB:.1f} MiB"
