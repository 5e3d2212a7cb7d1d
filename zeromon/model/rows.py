"""Reading a recording's records as rows: where each field is in one file's layout, the rows' values
checked against their schema, and the lines skipped counted with what was wrong. Both forms' readers
(jsonl, segments) parse their rows here.
"""

from __future__ import annotations

import dataclasses
import gc
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from zeromon.model.classes import frozen
from zeromon.model.kinds import FIELDS_OF, TYPE_OF
from zeromon.model.schema import RecordCheck, record_check

# A line longer than this is skipped unread, its number reported: no record comes near it (a RunInfo
# with a large config is a few kB), and parsing one costs many times its size in objects. A first line
# longer than this is no recording's header.
MAX_LINE_CHARS = 4 * 2**20
LINE_ERRORS_KEPT = 100  # lines whose reason Recording.line_errors keeps (corrupt_lines has them all)
UNKNOWN_KINDS_KEPT = 32  # names of unknown record kinds counted in Recording.unknown_kinds


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of objects are made and none is garbage:
    each generational collection would rescan them all (it tripled the time to make the events;
    the analysis of a million events, likewise). Used by the reader and by zeromon.analysis.report."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()



def required_fields(cls: type) -> int:
    return sum(1 for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


@frozen
class Layout:
    """Where a record's fields are in a row of one file's layout."""

    cls: type
    width: int  # the row slice [1:width] holds the fields in the dataclass's order ...
    required: int  # ... and makes a record when it holds at least this many
    indices: list[int | None] | None  # otherwise, each field's position in the row (None: absent)
    schema: RecordCheck  # what is wrong with a row's values ...
    checked: bool  # ... if it is checked here (not by the caller, a column at a time)


def layout_of(kind: str, names: list[str], unchecked: type | None = None) -> Layout | None:
    """How to read rows of a kind written with these field names; None for an unknown kind. The
    values of ``unchecked``'s records are not checked against its schema (their reader does it)."""
    cls = TYPE_OF.get(kind)
    if cls is None:
        return None
    position = {name: i + 1 for i, name in enumerate(names)}  # +1: row[0] is the kind tag
    wanted = FIELDS_OF[cls]
    indices: list[int | None] = [position.get(name) for name in wanted]
    same = indices == list(range(1, len(wanted) + 1))  # the common case: this version's own layout
    return Layout(cls=cls, width=len(wanted) + 1, required=required_fields(cls), indices=None if same else indices,
                   schema=record_check(cls, kind), checked=cls is not unchecked)



def fast_loads() -> Callable[[str], Any]:
    """orjson's loads, several times faster per line than json's, where it is installed. Imported here, by
    readers only: the agent's process imports this module to write and needs no more than the stdlib."""
    try:
        import orjson
    except ImportError:  # a dependency, but a bare install still reads, at json's pace
        return json.loads
    loads: Callable[[str], Any] = orjson.loads
    return loads


class SkippedLines:
    """Where a reader puts the lines it skips: their numbers, and for some what was wrong."""

    __slots__ = ("errors", "lines")

    def __init__(self, lines: list[int] | None, errors: dict[int, str] | None) -> None:
        self.lines, self.errors = lines, errors

    def add(self, lineno: int, problem: str | None = None) -> None:
        if self.lines is not None:
            self.lines.append(lineno)
        if problem is not None and self.errors is not None and len(self.errors) < LINE_ERRORS_KEPT:
            self.errors[lineno] = problem



def layouts_of(header: dict[str, Any], checked_by_caller: type | None = None) -> dict[str, Layout | None]:
    return {kind: layout_of(kind, names, checked_by_caller) for kind, names in header["schemas"].items()}


def parse_rows(lines: Iterable[tuple[int, str]], layouts: dict[str, Layout | None], skipped: SkippedLines,
               unknown_kinds: dict[str, int] | None) -> Iterator[tuple[type, list[Any], int]]:
    """(record type, field values, number) of each numbered JSON row of a known kind whose values fit
    its schema (``layouts``: the kinds of the file's header); the others are skipped and counted."""
    loads = fast_loads()
    # Per line: orjson's parse and as little as possible besides (a file can hold millions of lines).
    for lineno, line in lines:
        by_json = False
        try:
            try:
                row = loads(line)
            except ValueError:  # NaN, lone surrogates: what only json reads
                row = json.loads(line)
                by_json = True
            layout = layouts.get(row[0])  # a JSON string's first letter, an object's KeyError: ...
        except (ValueError, IndexError, KeyError, TypeError, RecursionError):  # RecursionError: [[[[...
            if line.strip():
                skipped.add(lineno)
            continue
        if layout is None:
            if type(row) is not list:  # ... corrupt, not an unknown kind
                skipped.add(lineno)
                continue
            if unknown_kinds is not None:
                count_unknown(unknown_kinds, row[0])
            continue
        indices = layout.indices
        if indices is None:
            values = row[1:layout.width]
            if len(values) < layout.required:
                skipped.add(lineno, f"{row[0]} has {len(values)} fields, not at least {layout.required}")
                continue
        else:
            values = [row[i] if i is not None and i < len(row) else None for i in indices]
        if by_json and (problem := layout.schema.fix_non_finite(values)) is not None \
                or layout.checked and (problem := layout.schema.problem(values)) is not None:
            skipped.add(lineno, problem)
            continue
        yield layout.cls, values, lineno


def count_unknown(unknown_kinds: dict[str, int], kind: Any) -> None:
    name = str(kind)[:64]
    if name in unknown_kinds or len(unknown_kinds) < UNKNOWN_KINDS_KEPT:
        unknown_kinds[name] = unknown_kinds.get(name, 0) + 1
