"""The records a recorder published last, kept for live clients (ZEROMON_RECENT_EVENTS of them).

A batch of the recorder (a pass's synchronous collectives, its phase spans on the host) publishes its
records as the columns it made them in (Unmade), and their rows (each record's values, which
``materialize`` makes a record of) are made only when a live client reads them: a run nobody watches
makes none (a tuple a collective, with the garbage collector's share, of the recorder's CPU:
tests/bench/bench_recorder_cpu.py).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from zeromon_agent.compact import Unmade


class RecentRecords:
    """The newest ``maxlen`` records published, oldest first, as a deque(maxlen) of them would hold them: each
    a record, a record's values (materialize), or Unmade records counted one each. Published a pass's list at
    a time (``extend``); a list wholly older than the newest ``maxlen`` is let go."""

    __slots__ = ("_count", "_parts", "maxlen")

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._parts: collections.deque[tuple[list[Any], int]] = collections.deque()
        self._count = 0  # records in _parts

    def extend(self, entries: list[Any], count: int) -> None:
        """``entries``: records, values or Unmade, ``count`` records in all."""
        if not count:
            return
        self._parts.append((entries, count))
        self._count += count
        parts = self._parts
        while self._count - parts[0][1] >= self.maxlen:
            self._count -= parts.popleft()[1]

    def __len__(self) -> int:
        return min(self._count, self.maxlen)

    def __iter__(self) -> Iterator[Any]:
        skip = max(0, self._count - self.maxlen)  # the oldest list's records older than the newest maxlen
        for entries, count in tuple(self._parts):
            if skip >= count:
                skip -= count
                continue
            for entry in entries:
                if type(entry) is Unmade:
                    if skip >= entry.n:
                        skip -= entry.n
                        continue
                    rows = entry.rows()
                    yield from rows[skip:] if skip else rows
                    skip = 0
                elif skip:
                    skip -= 1
                else:
                    yield entry
