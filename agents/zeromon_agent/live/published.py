"""What the recorder has published, for live clients: the endpoint's snapshot and metrics, in-process readers.

The recorder's thread hands over what a drain pass published in one hold of the lock (release), not one per
record; other threads copy the views under the same lock (live.view.LiveData) and make a record left unmade
only when they read it (materialize).
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any

from zeromon.model.events import DeviceSample, MemorySample, Notice, Record, RunInfo, StepSummary
from zeromon_agent.compact import materialize
from zeromon_agent.live.recent import RecentRecords
from zeromon_agent.live.totals import Counted, CountedColumns, LiveTotals


class LiveViews:
    """The live views of one recorder, each read and written under ``lock``."""

    def __init__(self, recent_events: int = 4096) -> None:
        self.lock = threading.Lock()
        # What was published, oldest first, a record unmade where a batch left it so (recent_records); the newest
        # is numbered ``cursor``, each before it one less (no (cursor, record) pair made a record)
        self.recent = RecentRecords(recent_events)
        self.cursor = 0
        self.recent_steps: collections.deque[StepSummary] = collections.deque(maxlen=512)
        self.latest_memory: MemorySample | None = None
        self.latest_device: DeviceSample | None = None
        self.run_info: RunInfo | None = None
        self.notices: list[Notice] = []
        # MemorySamples, or their values where the drain left them unmade: memory_samples()
        self.memory_history: collections.deque[Any] = collections.deque(maxlen=2048)
        self._memory_unmade = 0  # how many of memory_history's newest came since memory_samples() made them
        self.totals = LiveTotals()

    def release(self, records: list[Any], count: int, collectives: list[Counted | CountedColumns],
                steps: list[StepSummary], memory: list[Any]) -> None:
        """A pass's ``records`` (``count`` of them: an Unmade entry holds several), numbered in order, the running
        totals counted, the latest samples kept."""
        with self.lock:
            self.recent.extend(records, count)  # unmade too
            self.cursor += count
            self.totals.count_collectives(collectives)  # counted when read (a scrape), or in bulk
            if steps:
                self.recent_steps.extend(steps)
                self.totals.count_steps(steps)
            if memory:
                latest = materialize(memory[-1])
                self.latest_memory = latest if isinstance(latest, MemorySample) else None
                self.memory_history.extend(memory)  # unmade too: memory_samples()
                self._memory_unmade = min(self._memory_unmade + len(memory), len(self.memory_history))

    def recent_records(self) -> list[tuple[int, Record]]:
        """(cursor, record) of the records published last, each made now where a batch left it unmade."""
        with self.lock:
            entries, cursor = tuple(self.recent), self.cursor
        return list(zip(range(cursor - len(entries) + 1, cursor + 1), map(materialize, entries), strict=True))

    def memory_samples(self) -> list[MemorySample]:
        """memory_history's samples, each made once (under the lock): a run nobody reads makes none; a reader's
        call makes those that came since the last (the newest), not the whole history again."""
        with self.lock:
            history, unmade = self.memory_history, self._memory_unmade
            if unmade:
                newest = [history.pop() for _ in range(unmade)]
                history.extend(map(materialize, reversed(newest)))
                self._memory_unmade = 0
            return list(history)

    def add_notice(self, record: Notice) -> None:
        with self.lock:
            self.notices.append(record)

    def set_run_info(self, info: RunInfo) -> None:
        with self.lock:
            self.run_info = info

    def set_device(self, sample: DeviceSample) -> None:
        with self.lock:
            self.latest_device = sample

    def count_oom(self) -> None:
        with self.lock:
            self.totals.ooms += 1

    def step_durations(self, last: int) -> list[float]:
        """The durations of the newest ``last`` steps summarized, newest first."""
        with self.lock:
            return [summary.duration_s for summary in itertools.islice(reversed(self.recent_steps), last)]
