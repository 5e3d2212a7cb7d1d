"""A rank's recording read back, whichever form its file holds (JSON lines or compact segments): its
records by kind, its collectives as columns, and the lines it skipped."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any, overload

from zeromon.model.classes import frozen, mutable
from zeromon.model.events import (
    AgentStats,
    CollectiveEvent,
    DeviceSample,
    MemorySample,
    Notice,
    OomEvent,
    PhaseSpan,
    ProgressReport,
    Record,
    RunInfo,
    StepSummary,
)
from zeromon.model.jsonl import iter_jsonl_fields, open_recording, read_first_line, read_header
from zeromon.model.kinds import FIELDS_OF, FORMAT_VERSION, GETTERS, KIND_OF, encode_record, is_compact
from zeromon.model.rows import SkippedLines, collector_paused
from zeromon.model.schema import record_check
from zeromon.model.segment_batches import iter_compact_batched
from zeromon.model.segments import read_compact_header
from zeromon.model.step_records import StepRecords


@frozen
class CollectiveColumns:
    """A recording's collectives as one sequence per CollectiveEvent field, in file order.

    The analyses walk these instead of a million event objects: a loop over a few zipped columns
    costs no attribute look-up or method call per event. The values are the events' own objects.
    """

    seq: Sequence[int]
    rank: Sequence[int]
    step: Sequence[int]
    phase: Sequence[str]
    op: Sequence[str]
    api: Sequence[str]
    bytes_in: Sequence[int]
    bytes_out: Sequence[int]
    dtype: Sequence[str]
    group_size: Sequence[int]
    async_op: Sequence[bool]
    issue_ns: Sequence[int]
    complete_ns: Sequence[int | None]
    blocked_s: Sequence[float]
    timing: Sequence[str]
    meaning: Sequence[str]
    wait_ns: Sequence[int | None]
    issue_s: Sequence[float | None]

    def __len__(self) -> int:
        return len(self.seq)

    @classmethod
    def of(cls, events: Sequence[CollectiveEvent]) -> CollectiveColumns:
        if not events:
            return cls(*([] for _ in _COLLECTIVE_FIELDS))
        return cls(*(list(column) for column in zip(*map(GETTERS[CollectiveEvent], events), strict=True)))


_COLLECTIVE_FIELDS = FIELDS_OF[CollectiveEvent]
# The collectives' repeated strings: a million events name a handful of ops and phases, and one
# shared str per value saves ~60 bytes per field per event over one str per parsed line.
_INTERNED_COLUMNS = tuple(i for i, name in enumerate(_COLLECTIVE_FIELDS)
                          if name in ("phase", "op", "api", "dtype", "timing", "meaning"))


class CollectiveEvents(Sequence[CollectiveEvent]):
    """A read recording's collectives: columns, made into CollectiveEvent objects when first looked at.

    The analyses read the columns; a million frozen events cost ~1.3 s and ~150 MB to make, which
    only callers that ask for the events pay. Compares equal to a list of the same events.
    """

    __slots__ = ("_events", "columns")

    def __init__(self, columns: CollectiveColumns) -> None:
        self.columns = columns
        self._events: list[CollectiveEvent] | None = None

    def _list(self) -> list[CollectiveEvent]:
        if self._events is None:
            columns = (getattr(self.columns, name) for name in _COLLECTIVE_FIELDS)
            with collector_paused():
                self._events = list(map(CollectiveEvent, *columns))
        return self._events

    def __len__(self) -> int:
        return len(self.columns)

    @overload
    def __getitem__(self, index: int) -> CollectiveEvent: ...

    @overload
    def __getitem__(self, index: slice) -> list[CollectiveEvent]: ...

    def __getitem__(self, index: int | slice) -> CollectiveEvent | list[CollectiveEvent]:
        return self._list()[index]

    def __iter__(self) -> Iterator[CollectiveEvent]:
        return iter(self._list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CollectiveEvents):
            other = other._list()
        return self._list() == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, like the list it stands for

    def __repr__(self) -> str:
        return f"CollectiveEvents({len(self)} events)"



@mutable
class Recording:
    """One rank's recording, read back."""

    path: Path
    header: dict[str, Any]
    # read_recording gives a CollectiveEvents; a Recording made by hand may hold any sequence.
    collectives: Sequence[CollectiveEvent] = field(default_factory=list)
    phases: list[PhaseSpan] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    device: list[DeviceSample] = field(default_factory=list)
    ooms: list[OomEvent] = field(default_factory=list)
    # read_recording(steps_as_rows=True) gives a StepRecords (zeromon.model.step_records): rows, objects on demand.
    steps: Sequence[StepSummary] = field(default_factory=list)
    run_info: RunInfo | None = None  # the last one written: detection improves as the run goes
    notices: list[Notice] = field(default_factory=list)
    stats: AgentStats | None = None  # the last one written
    progress: list[ProgressReport] = field(default_factory=list)  # oldest first
    # Lines skipped, in file order: not JSON, cut short, longer than MAX_LINE_CHARS, or a record whose
    # values break its schema. line_errors says what was wrong with the last two kinds, for the first
    # LINE_ERRORS_KEPT of them ("collective.meaning is 7, not a string").
    corrupt_lines: list[int] = field(default_factory=list)
    line_errors: dict[int, str] = field(default_factory=dict)
    unknown_kinds: dict[str, int] = field(default_factory=dict)  # at most UNKNOWN_KINDS_KEPT names

    @property
    def rank(self) -> int:
        return int(self.header.get("rank", -1))

    def collective_columns(self) -> CollectiveColumns:
        """The collectives as columns: those read_recording built, or made from the events given."""
        if isinstance(self.collectives, CollectiveEvents):
            return self.collectives.columns
        return CollectiveColumns.of(self.collectives)



def read_file_header(path: Path) -> dict[str, Any]:
    """The header of a rank file of either form, checked (jsonl.read_header)."""
    if is_compact(path):
        return read_compact_header(path)
    with open_recording(path) as handle:
        return read_header(path, read_first_line(path, handle))


def iter_fields(path: Path, skipped: SkippedLines, unknown_kinds: dict[str, int] | None,
                checked_by_caller: type | None = None,
                summaries: list[list[Any]] | None = None) -> Iterator[tuple[type, list[Any], int]]:
    """(record type, field values, line number) for every line after the header of one rank file that
    holds a record of a known kind whose values fit its schema; the records of ``checked_by_caller``
    are not checked here (read_recording checks the collectives a column at a time). A compact (2.x)
    file gives its records' numbers (1, 2, ...) for line numbers, and may put step summaries' values
    into ``summaries`` (in order) instead of giving them."""
    if is_compact(path):
        return iter_compact_batched(path, skipped, unknown_kinds, checked_by_caller, summaries)
    return iter_jsonl_fields(path, skipped, unknown_kinds, checked_by_caller)


def iter_records(path: str | Path, corrupt_lines: list[int] | None = None,
                 unknown_kinds: dict[str, int] | None = None,
                 line_errors: dict[int, str] | None = None) -> Iterator[Record]:
    """Stream the records of one rank file, after checking its header.

    Line numbers of lines that cannot be decoded, or whose record breaks its schema, are appended
    to ``corrupt_lines``; what was wrong, where known, is put in ``line_errors``.
    """
    for cls, values, _ in iter_fields(Path(path), SkippedLines(corrupt_lines, line_errors), unknown_kinds):
        yield cls(*values)


# Collectives are gathered as rows and turned into columns this many at a time: the rows of a whole
# file would raise the peak by all of them as objects, and a chunk this small is still in the CPU's
# cache when its columns are checked and interned (much larger chunks read slower).
_CHUNK_ROWS = 2048


class _CollectiveChunks:
    """A recording's collectives, gathered as rows (``rows``: each a collective's values and, last, its line
    number) and turned into checked, interned columns a chunk at a time (``flush``)."""

    def __init__(self, skipped: SkippedLines) -> None:
        self.skipped = skipped
        self.rows: list[list[Any]] = []
        self.columns: list[list[Any]] = [[] for _ in _COLLECTIVE_FIELDS]
        self.width = len(_COLLECTIVE_FIELDS)
        self._interned: dict[str, str] = {}
        self._check = record_check(CollectiveEvent, KIND_OF[CollectiveEvent])
        # Checked a column at a time (a set of a column's types is far cheaper than a check a row); only a
        # chunk with a bad value is checked row by row. The string columns are checked as they are interned,
        # by the interned values' types (a handful).
        interned_str = {i for i in _INTERNED_COLUMNS if self._check.fields[i].accepts == {str}}
        self._column_types = [(i, f.accepts) for i, f in enumerate(self._check.fields)
                              if f.accepts is not None and i not in interned_str]

    def _intern(self, chunk: list[tuple[Any, ...]]) -> bool:
        """One shared str per value in the string columns; False where one holds something else."""
        interned = self._interned
        known = len(interned)
        try:
            for i in _INTERNED_COLUMNS:
                chunk[i] = tuple(map(interned.setdefault, chunk[i], chunk[i]))
        except TypeError:  # an unhashable value
            return False
        bad = [value for value in itertools.islice(interned, known, None) if type(value) is not str]
        for value in bad:
            del interned[value]
        return not bad

    def flush(self) -> None:
        """The rows gathered so far into the columns, the rows with a value their field does not take skipped."""
        rows, width = self.rows, self.width
        chunk = list(zip(*rows, strict=True))
        if not (all(set(map(type, chunk[i])) <= accepts for i, accepts in self._column_types) and self._intern(chunk)):
            kept = []
            for values in rows:
                problem = self._check.problem(values[:width])
                if problem is None:
                    kept.append(values)
                else:
                    self.skipped.add(values[width], problem)
            chunk = list(zip(*kept, strict=True)) or [() for _ in range(width + 1)]
            self._intern(chunk)
        for column, column_values in zip(self.columns, chunk, strict=False):  # the last, the line numbers, dropped
            column.extend(column_values)
        rows.clear()


def read_recording(path: str | Path, steps_as_rows: bool = False) -> Recording:
    """Read one rank file whole (its collectives as CollectiveEvents: columns, events on demand).

    Lines that are not records, or whose values break their schema (a string where the format has
    an integer), are skipped and named in ``corrupt_lines`` and ``line_errors``. Raises ZeromonError
    for a file that is not a recording. ``steps_as_rows``: the step summaries as a StepRecords, the
    rows read (what `zeromon report` asks for: a rank's thousands of summaries are not made into objects)."""
    path = Path(path)
    rec = Recording(path=path, header=read_file_header(path))
    skipped = SkippedLines(rec.corrupt_lines, rec.line_errors)
    steps: list[Any] = []
    sinks: dict[type, Callable[[Any], None]] = {
        PhaseSpan: rec.phases.append, MemorySample: rec.memory.append, DeviceSample: rec.device.append,
        OomEvent: rec.ooms.append, StepSummary: steps.append, Notice: rec.notices.append,
        ProgressReport: rec.progress.append,
    }
    collectives = _CollectiveChunks(skipped)
    rows, width = collectives.rows, collectives.width  # the loop appends to them directly: a million a file
    with collector_paused():
        fields = iter_fields(path, skipped, rec.unknown_kinds, CollectiveEvent, steps if steps_as_rows else None)
        for cls, values, lineno in fields:
            if cls is CollectiveEvent:
                if len(values) < width:  # the optional wait_ns, absent: its default is None
                    values.extend([None] * (width - len(values)))
                values.append(lineno)
                rows.append(values)
                if len(rows) >= _CHUNK_ROWS:
                    collectives.flush()
                continue
            if cls is StepSummary and steps_as_rows:
                steps.append(values)
                continue
            record = cls(*values)
            sink = sinks.get(cls)
            if sink is not None:
                sink(record)
            elif isinstance(record, RunInfo):
                rec.run_info = record
            elif isinstance(record, AgentStats):
                rec.stats = record
        if rows:
            collectives.flush()
    rec.collectives = CollectiveEvents(CollectiveColumns(*collectives.columns))
    rec.steps = StepRecords.of(steps) if steps_as_rows else steps
    if rec.line_errors:  # the collectives' are found a chunk at a time, after the lines that follow them
        rec.corrupt_lines.sort()
        rec.line_errors = dict(sorted(rec.line_errors.items()))
    return rec


def export_lines(path: Path, corrupt: list[int] | None = None,
                 errors: dict[int, str] | None = None) -> Iterator[bytes]:
    """Format 1.3's lines of a rank file of either form, each with its newline: the header the JSON-lines
    writer writes, then a line per record that reads back; what was skipped as corrupt is left out, its
    numbers put in ``corrupt`` and what was wrong in ``errors`` (iter_records)."""
    header = dict(read_file_header(path))
    header["version"] = FORMAT_VERSION
    header.pop("columns", None)
    header.pop("dictionary", None)
    yield json.dumps(header, separators=(",", ":")).encode() + b"\n"
    for record in iter_records(path, corrupt, line_errors=errors):
        yield encode_record(record).encode("utf-8", "surrogatepass") + b"\n"
