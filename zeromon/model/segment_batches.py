"""The compact form (2.x) read a batch of segments at a time: what `zeromon report` reads of a long run.

The agent writes a segment per flush (1 s by default), so a long run's rank file has thousands of segments,
nearly all of them a few step summaries as JSON rows and nothing else. segments.iter_compact_fields reads each
segment on its own (a Frame, its meta parsed, each row parsed and checked alone), a cost per segment that
makes such a file slower to read than its JSON-lines form would be. Here the rows of consecutive row-only
segments are parsed by one orjson call and each kind's values checked a column at a time (the set of a field's
types against what its schema accepts, not a check per row). Every other segment (one with columns, a damaged
one) and any batch with something unusual in it (a row that does not parse alone, another layout, a value its
schema refuses) is read as iter_compact_fields reads it: the same (record type, values, number) come out in
the same order (tests/test_segment_batches.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from zeromon.model.events import StepSummary
from zeromon.model.rows import MAX_LINE_CHARS, SkippedLines, layouts_of
from zeromon.model.segments import (
    FRAME,
    KIND_RECORDS,
    MARKER,
    MAX_PAYLOAD_BYTES,
    SECTIONS,
    Frame,
    dictionary_of,
    frame_fields,
    header_of,
    iter_compact_fields,
    iter_frames,
    kinds_of,
    mapped,
    yield_segment,
)

# How a segment without columns starts: the sections' lengths and its meta, as the writer spells them.
_NO_COLUMNS_META = b'{"n":{},"tables":{}}'
_ROWS_ONLY = SECTIONS.pack(len(_NO_COLUMNS_META), 0) + _NO_COLUMNS_META
# Rows parsed at once: a few megabytes of JSON, its objects freed before the next batch's.
BATCH_ROWS = 4096

Fields = tuple[type, list[Any], int]


def _loads() -> Callable[[bytes], Any] | None:
    try:
        import orjson
    except ImportError:  # json's loads would read NaN that orjson refuses: the per-row reader instead
        return None
    loads: Callable[[bytes], Any] = orjson.loads
    return loads


def iter_compact_batched(path: Path, skipped: SkippedLines, unknown_kinds: dict[str, int] | None,
                         checked_by_caller: type | None = None,
                         summaries: list[list[Any]] | None = None) -> Iterator[Fields]:
    """segments.iter_compact_fields, faster on files of many small row-only segments. ``summaries``: where
    the values of the step summaries of those segments go, in order, instead of being given one by one
    (read_recording's rows, which then are not passed up one by one); the other summaries are given."""
    loads = _loads()
    if loads is None:
        yield from iter_compact_fields(path, skipped, unknown_kinds, checked_by_caller)
        return
    with mapped(path) as buf:
        header, start = header_of(path, buf)
        layouts = layouts_of(header, checked_by_caller)
        kinds = kinds_of(header, checked_by_caller)
        zdict = dictionary_of(header)
        batch = _Batch(loads, layouts, len(kinds), skipped, unknown_kinds, summaries)
        pos, number, size = start, 0, len(buf)
        # The good frames, as iter_frames gives them, walked here (no Frame made for each, and a rank has
        # thousands); from the first that is not whole or whose CRC fails (a crash's cut, a damaged file),
        # iter_frames's walk finds the next.
        while size - pos >= FRAME.size:
            marker, kind, _, length, count, crc = FRAME.unpack_from(buf, pos)
            end = pos + FRAME.size + length
            payload = buf[pos + FRAME.size:end]
            if marker != MARKER or end > size or zlib.crc32(payload, zlib.crc32(buf[pos:pos + 12])) != crc:
                break
            offset, pos = pos, end
            if kind != KIND_RECORDS:
                continue
            rows = _rows_only(payload, count, zdict)
            if rows is not None:
                batch.segments.append((number, count, rows))
                batch.rows += count
                number += count
                if batch.rows >= BATCH_ROWS:
                    yield from batch.take()
                continue
            yield from batch.take()
            frame = Frame(offset, kind, count, payload)
            number = yield from frame_fields(frame, zdict, kinds, layouts, skipped, unknown_kinds, number)
        yield from batch.take()
        for frame in iter_frames(buf, pos):
            if frame.payload is None or frame.kind == KIND_RECORDS:
                number = yield from frame_fields(frame, zdict, kinds, layouts, skipped, unknown_kinds, number)


def _rows_only(payload: bytes, count: int, zdict: bytes) -> bytes | None:
    """The JSON rows of a good segment that holds nothing else, newline-separated; None for any other
    (columns, no records, a row too long to read, a damaged one): segments._segment_records's checks,
    as few calls as they take (a rank has thousands of segments)."""
    inflater = zlib.decompressobj(zdict=zdict) if zdict else zlib.decompressobj()
    try:
        data = inflater.decompress(payload, MAX_PAYLOAD_BYTES)
    except zlib.error:
        return None
    # The sections' lengths and meta of a segment without columns; its order all JSON rows (zero bytes).
    if inflater.unconsumed_tail or not inflater.eof or count <= 0 or not data.startswith(_ROWS_ONLY) \
            or data.count(0, len(_ROWS_ONLY), len(_ROWS_ONLY) + count) != count:
        return None
    rows = data[len(_ROWS_ONLY) + count:]
    if len(rows) >= MAX_LINE_CHARS or rows.count(b"\n") != count - 1:
        return None
    return rows


class _Batch:
    """Row-only segments waiting to be parsed together."""

    def __init__(self, loads: Callable[[bytes], Any], layouts: dict[str, Any], n_kinds: int, skipped: SkippedLines,
                 unknown_kinds: dict[str, int] | None, summaries: list[list[Any]] | None) -> None:
        self.loads, self.layouts, self.n_kinds = loads, layouts, n_kinds
        self.skipped, self.unknown_kinds, self.summaries = skipped, unknown_kinds, summaries
        self.segments: list[tuple[int, int, bytes]] = []  # (number before its first record, records, rows)
        self.rows = 0

    def take(self) -> Iterator[Fields]:
        """The fields of the segments added, in order (the summaries' into ``summaries`` where given); the
        batch is empty after."""
        segments, total = self.segments, self.rows
        if not segments:
            return
        self.segments, self.rows = [], 0
        parsed = self._parse(segments, total)
        if parsed is None:  # as iter_compact_fields reads them, a segment at a time
            for number, count, rows in segments:
                yield from yield_segment((bytes(count), [[] for _ in range(self.n_kinds)], rows.split(b"\n")),
                                          [], self.layouts, self.skipped, self.unknown_kinds, number)
            return
        kinds, by_kind = parsed
        summaries = self.summaries
        if summaries is not None and len(by_kind) == 1 and by_kind[kinds[0]][0] is StepSummary:
            summaries.extend(by_kind[kinds[0]][1])  # the common batch: summaries only, no record given
            return
        numbers = chain.from_iterable(range(number + 1, number + count + 1) for number, count, _ in segments)
        values = {kind: iter(kind_values) for kind, (_, kind_values) in by_kind.items()}
        for kind, number in zip(kinds, numbers, strict=True):
            cls = by_kind[kind][0]
            if cls is StepSummary and summaries is not None:
                summaries.append(next(values[kind]))
            else:
                yield cls, next(values[kind]), number

    def _parse(self, segments: list[tuple[int, int, bytes]],
               total: int) -> tuple[list[Any], dict[Any, tuple[type, list[list[Any]]]]] | None:
        """Each row's kind, and each kind's type and values (in order), or None where a row is not what
        the batch takes."""
        try:
            rows = self.loads(b"[" + b",".join(rows.replace(b"\n", b",") for _, _, rows in segments) + b"]")
        except (ValueError, RecursionError):  # a row orjson does not parse, in the array or alone
            return None
        # Equal counts: each row one element (a row of two, "1,2", is balanced by none, as "" does not parse).
        if len(rows) != total:
            return None
        rows_of: dict[Any, list[list[Any]]] = {}
        try:
            kinds = [row[0] for row in rows]
            for kind, row in zip(kinds, rows, strict=True):
                rows_of.setdefault(kind, []).append(row)
        except (TypeError, KeyError, IndexError):  # not an array, or an empty one: corrupt
            return None
        by_kind: dict[Any, tuple[type, list[list[Any]]]] = {}
        for kind, kind_rows in rows_of.items():
            layout = self.layouts.get(kind) if isinstance(kind, str) else None
            if layout is None or layout.indices is not None:  # unknown kinds, other layouts: counted row by row
                return None
            width = layout.width
            sliced = [row[1:width] for row in kind_rows]
            if not _fit(sliced, layout):
                return None
            by_kind[kind] = (layout.cls, sliced)
        return kinds, by_kind


def _fit(rows: Sequence[list[Any]], layout: Any) -> bool:
    """Whether every row has the fields its layout requires and values its schema accepts, checked a
    field at a time: RecordCheck.problem's verdict on each row, for a fraction of its cost a value."""
    lengths = set(map(len, rows))
    if len(lengths) != 1 or min(lengths) < layout.required:
        return False
    if not layout.checked:
        return True
    columns = list(zip(*rows, strict=True))
    for column, field in zip(columns, layout.schema.fields, strict=False):
        if field.accepts is not None and not set(map(type, column)) <= field.accepts:
            return False
        if field.values is not None and not set(map(type, chain.from_iterable(map(dict.values, column)))) \
                <= field.values:
            return False
    return True
