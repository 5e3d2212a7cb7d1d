"""The recorder's compact records: what a batch publishes in place of records, and how a reader makes them.

The recorder makes thousands of records a second, and a live client reads a few of them. So a batch (a pass's
synchronous collectives, its phase spans on the host) publishes its records as the columns it made them in
(``Unmade``), and a record's values alone (a tuple) where it has them: the record itself is made only when a
reader asks (``materialize``), which a run nobody watches never does (tests/bench/bench_recorder_cpu.py).

A record's values are told apart by their number: CollectiveEvent, PhaseSpan and MemorySample each have a
different number of fields (checked at import). The producer (zeromon_agent.recorder) and the readers
(zeromon_agent.live, zeromon_agent.serve) both import this module, and it imports neither: the format sits
below both (docs/development.md, "The agent's data flow").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from zeromon.model.events import CollectiveEvent, MemorySample, PhaseSpan, Record, record_maker

# The kinds a batch publishes unmade, by their number of fields (which tells them apart): a record's values
# alone, a tuple the collector untracks, rather than a record or a (maker, values) pair, one a collective.
_UNMADE: dict[int, tuple[type[Record], Callable[[tuple[Any, ...]], Record]]] = {
    len(dataclasses.fields(cls)): (cls, record_maker(cls)) for cls in (CollectiveEvent, PhaseSpan, MemorySample)}
if len(_UNMADE) != 3:
    raise TypeError("CollectiveEvent, PhaseSpan and MemorySample must differ in their number of fields (materialize)")


def materialize(entry: Any) -> Record:
    """A record the recorder published: as it is, or made now from its values where a batch left it unmade
    (a live client reads a few; the recorder publishes every one)."""
    if type(entry) is tuple:
        return _UNMADE[len(entry)][1](entry)
    return entry


def unmade_type(entry: tuple[Any, ...]) -> type[Record]:
    """The record type of values a batch left unmade (materialize would make one of it from them)."""
    return _UNMADE[len(entry)][0]


class Unmade:
    """``n`` records of one kind as columns (each a field's values, in the record's field order); their rows
    made once, at the first read (under the recorder's lock, as every read of RecentRecords is)."""

    __slots__ = ("_columns", "_rows", "n")

    def __init__(self, columns: Sequence[Sequence[Any]], n: int) -> None:
        self._columns: Sequence[Sequence[Any]] | None = columns
        self._rows: list[tuple[Any, ...]] | None = None
        self.n = n

    def rows(self) -> list[tuple[Any, ...]]:
        if self._rows is None:
            self._rows = list(zip(*self._columns or (), strict=True))
            self._columns = None
        return self._rows
