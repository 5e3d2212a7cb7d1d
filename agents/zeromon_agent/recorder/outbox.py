"""Where the recorder's records go: the rank's recording now, live clients at the end of the pass.

A drain pass writes each record as it makes it (through the DetailKeeper, which ZEROMON_MAX_DISK may have
thinning a step's detail) and collects it for live clients, who get the pass's records in one hold of their
lock (``release``), not one a record. The lists are appended to by the drain's loops, which bind them once:
they stay the same objects for the recorder's life, and ``release`` empties them.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from typing import Any

from zeromon.model.compiled import compiled
from zeromon.model.events import Record
from zeromon.model.jsonl import RecordingWriter
from zeromon_agent.compact import Unmade
from zeromon_agent.live.published import LiveViews
from zeromon_agent.live.totals import Counted, CountedColumns
from zeromon_agent.recorder.detail import DetailKeeper

# The records handed to live clients let out of the garbage collector's lists (_batch.c's untrack), or None; the
# classes whose instances it may untrack: the records' (frozen), and a batch's columns.
_UNTRACKABLE = (*typing.get_args(Record), Unmade)
_UNTRACK = getattr(compiled("zeromon_agent.recorder._batch"), "untrack", None)


class Outbox:
    """The recording (``writer``, None: nothing is written) and the live views (``live``) a recorder feeds."""

    def __init__(self, writer: RecordingWriter | None, live: LiveViews, max_disk: int | None,
                 on_thinned: Callable[[str], None]) -> None:
        self.writer = writer
        self.live = live
        self.write_values = getattr(writer, "write_values", None)  # the compact writer's
        self.write_rows = getattr(writer, "write_rows", None)  # its write_values of a run of rows
        # ZEROMON_MAX_DISK: which steps' collectives and phase spans go to the file.
        self.keeper = DetailKeeper(self.write, max_disk if writer is not None else None,
                                   lambda: writer.bytes_written if writer is not None else None, on_thinned)
        # Published this pass, handed to live clients at its end (release):
        self.records: list[Any] = []  # records, or the values of one left unmade (materialize), or Unmade
        self.extra = 0  # the records of the Unmade entries beyond one each
        self.collectives: list[Counted | CountedColumns] = []  # what the live totals count
        self.steps: list[Any] = []  # StepSummary
        self.memory: list[Any] = []  # MemorySample, or its values

    def write(self, record: Record) -> None:
        """To the recording, unless past ZEROMON_MAX_DISK (then counted, not written)."""
        writer, keeper = self.writer, self.keeper
        if writer is not None and (keeper.max_bytes is None or keeper.admit()):  # no budget: no call to say so
            writer.write(record)

    def write_detail(self, cls: type, values: tuple[Any, ...], record: Record, step: int) -> None:
        """keeper.detail(record, step) (a step's detail, which ZEROMON_MAX_DISK may thin), with the
        record's values handed to the compact writer as they are while nothing is thinned."""
        keeper, writer = self.keeper, self.writer
        if keeper.level:  # thinned: the keeper holds it until its step decides
            keeper.detail(record, step)
        elif writer is not None and keeper.admit() and not (self.write_values is not None
                                                            and self.write_values(cls, values)):
            writer.write(record)

    def publish(self, record: Record, detail_of: int | None = None) -> None:
        """Write ``record`` (``detail_of``: a step's detail, which ZEROMON_MAX_DISK may thin) and queue it for
        live clients."""
        if detail_of is None:
            self.write(record)
        else:
            self.keeper.detail(record, detail_of)
        self.records.append(record)

    def publish_unmade(self, columns: tuple[Sequence[Any], ...], n: int) -> None:
        """Queue a batch's ``n`` records for live clients as its columns: their rows are made when one reads
        them (RecentRecords)."""
        self.records.append(Unmade(columns, n))
        self.extra += n - 1  # release counts the records: an Unmade entry is n of them

    def release(self) -> None:
        """Hand live clients what was published since the last release, in one hold of their lock: each record
        numbered in order, the running totals counted, the latest samples kept."""
        records = self.records
        if not records:
            return
        count, self.extra = len(records) + self.extra, 0
        if _UNTRACK is not None:  # what the views keep for seconds to minutes, out of every collection's walk
            _UNTRACK(records, _UNTRACKABLE)  # the steps' and memory's are among them
            _UNTRACK(self.collectives, ())
        handed = (records.copy(), self.collectives.copy(), self.steps.copy(), self.memory.copy())
        if _UNTRACK is not None:
            _UNTRACK(handed, ())  # the lists the views keep, now of untracked records
        for published in (records, self.collectives, self.steps, self.memory):
            published.clear()
        self.live.release(handed[0], count, *handed[1:])
