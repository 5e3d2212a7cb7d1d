"""The compact recording format (2.x): rank-<r>.zmr, a file of self-contained compressed segments.

Layout: the 8 bytes COMPACT_MAGIC, then segments. Each segment is a 16-byte frame (FRAME: the
marker ``ZS``, its kind (0: the header, 1: records), its compression (1: zlib), the payload's length,
its record count, a CRC-32 of the frame's first 12 bytes and the payload) and the zlib-compressed
payload. The first segment holds the header (the JSON object of format 1.x's first line, version
COMPACT_VERSION, plus ``columns``: how the collectives, phases and (from 2.1) memory samples are laid
out, which a reader follows: a 2.0 file's memory samples are JSON rows). A records segment's payload:

    SECTIONS (meta length, columns length) | meta JSON | order | columns | rows

``order`` has one byte per record in write order: 0 for the next JSON row, k for the next record of
the k-th columnar kind (``meta["n"]`` counts them, ``meta["tables"]`` holds their string tables);
``columns`` is what zeromon.model.columnar encodes; ``rows`` are the other records as format 1.3's
lines (the exact bytes the JSON-lines writer writes), newline-separated.

The agent appends one segment per flush (every ``flush_interval_s``) with one write, so a reader of a
running rank's file reads every complete segment and stops at a partial last one: a killed rank
loses at most its last flush interval. A damaged segment (its CRC, its zlib stream, its sections)
is skipped and its records counted as corrupt, naming its byte offset; the next good frame is found
by its marker and CRC. Stdlib only: the agent imports this module into every training process.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import struct
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from zeromon.errors import ZeromonError
from zeromon.model import columnar
from zeromon.model.classes import frozen
from zeromon.model.compiled import compiled
from zeromon.model.events import Record
from zeromon.model.jsonl import RecordingWriter, read_header
from zeromon.model.kinds import (
    COMPACT_MAGIC,
    FIELDS_OF,
    GETTERS,
    KIND_OF,
    TYPE_OF,
    encode_line,
)
from zeromon.model.rows import MAX_LINE_CHARS, SkippedLines, layout_of, layouts_of, parse_rows

COMPACT_VERSION = "2.1"  # 2.1: memory samples as columns (2.0 files read as they are)
FRAME = struct.Struct("<2sBBIII")  # marker, kind, compression, payload length, record count, CRC-32
MARKER = b"ZS"
KIND_HEADER, KIND_RECORDS = 0, 1
ZLIB = 1
SECTIONS = struct.Struct("<II")  # the meta JSON's length, the columns' length
# zlib level 1: the columns compress nearly as well at 1 as at 6 or 9 (tests/bench/bench_recording_size.py),
# and level 1 costs the recorder's thread less CPU, which comes first.
ZLIB_LEVEL = 1
# A segment holds at most this many records (a flush of a long-buffered drain is cut into several),
# and a reader refuses one that inflates past MAX_PAYLOAD_BYTES: a damaged length is no zlib bomb.
SEGMENT_RECORDS = 65536
MAX_PAYLOAD_BYTES = 256 * 2**20
_TOO_LONG = f"longer than {MAX_LINE_CHARS:,} characters, not read"
_NOT_COMPACT = "a compact recording is the rank-<r>.zmr file that the agent writes"


def _frame(kind: int, payload: bytes, count: int) -> bytes:
    head = FRAME.pack(MARKER, kind, ZLIB, len(payload), count, 0)[:12]
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


# The header's "columns": how each columnar kind is laid out (columnar.SPECS), for the reader to follow.
_COLUMNS = {KIND_OF[cls]: [list(entry) for entry in spec] for cls, spec in columnar.SPECS.items()}


def _dictionary() -> str:
    """zlib's preset dictionary of every records segment, written into the header ("dictionary"): the
    strings a segment repeats (its meta's keys and tables, the JSON rows' kinds), so that a segment of one
    short flush need not spell them out once more: it makes short segments smaller
    (tests/bench/bench_recording_size.py). The memory categories' names are left out: their columns do
    not spell them."""
    from zeromon.model.events import COLLECTIVE_OPS, PEAK_PHASES, Phase, Timing, ZeroMeaning

    phases = [p.value for p in Phase]
    memory_phases = [Phase.FORWARD.value, Phase.BACKWARD.value, Phase.OPTIMIZER.value, *sorted(PEAK_PHASES)]
    tables = {"collective": {"phase": phases, "op": list(COLLECTIVE_OPS), "dtype": ["float32", "bfloat16", "float16"],
                             "timing": [t.value for t in Timing], "meaning": [m.value for m in ZeroMeaning]},
              "phase": {"phase": phases, "timing": ["host", "cuda_event"]},
              "memory": {"phase": memory_phases, "device": ["cpu", "cuda:0"], "categories": [[]]}}
    rows = "".join(f'["{kind}",0,' for kind in KIND_OF.values() if kind not in _COLUMNS)
    meta = json.dumps({"n": dict.fromkeys(_COLUMNS, 1), "tables": tables}, separators=(",", ":"))
    return rows + meta


DICTIONARY = _dictionary()
_ZDICT = DICTIONARY.encode()


class _Buffered(NamedTuple):
    """A columnar kind's records since the last flush."""

    code: int  # its byte in a segment's order
    fits: Callable[[tuple[Any, ...]], bool]  # whether a record's values go into the columns exactly
    rows: list[tuple[Any, ...]]  # records written one at a time, as their values
    values: Callable[[Any], tuple[Any, ...]]  # a record's values in its fields' order
    # Or the records of batches as the columns their writer had them in (write_columns): encode takes them as
    # they are, and no row is made (a tuple a collective, and zip(*rows) at the flush to turn them back into
    # columns, with the garbage collector's share, all on the recorder's thread). A kind's
    # records of a segment are one or the other: a record that comes the other way turns the batches into
    # rows (_settle), so that they stay in the order written.
    chunks: list[Sequence[Sequence[Any]]]


_JOIN_COLUMNS = getattr(compiled("zeromon.model._planes"), "join_columns", None)  # _joined's join in C, or None

# Each columnar kind's code and fit check, made once: a check remembers the type signatures it found good,
# which a check made at every flush (5 a second) would look at field by field again.
_FITS = {cls: (code, columnar.fits(spec)) for code, (cls, spec) in enumerate(columnar.SPECS.items(), start=1)}
# And of a run of a kind's rows (write_rows): the first that does not fit.
_FIT_RUNS = {cls: columnar.fit_run(columnar.SPECS[cls], fits) for cls, (_, fits) in _FITS.items()}


class CompactWriter(RecordingWriter):
    """Writes one rank's recording in the compact form; RecordingWriter's API and promises (nothing
    raises after the constructor, losses counted). Records are kept until ``flush()``, which appends
    them as one segment: the collectives, phases and memory samples as columns, the rest as JSON rows."""

    def __init__(self, path: str | Path, rank: int, level: int = ZLIB_LEVEL, **header_extra: Any) -> None:
        self.level = level
        super().__init__(path, rank, **header_extra)

    def _init_buffer(self) -> None:
        self.level = getattr(self, "level", ZLIB_LEVEL)
        self._order = bytearray()
        self._rows: list[bytes] = []
        self._columns: dict[type, _Buffered] = {cls: _Buffered(code, fits, [], GETTERS[cls], [])
                                                 for cls, (code, fits) in _FITS.items()}

    def _header_bytes(self, header: dict[str, Any]) -> bytes:
        header["version"] = COMPACT_VERSION
        header["columns"] = _COLUMNS
        header["dictionary"] = DICTIONARY
        return COMPACT_MAGIC + _frame(KIND_HEADER, zlib.compress(json.dumps(header).encode(), self.level), 0)

    def _end_bytes(self, end: Record) -> bytes:
        return self._segment([encode_line(end)], bytearray(1), {})

    def write(self, record: Record) -> None:
        column = self._columns.get(type(record))
        if column is not None and self._file is not None:
            # Once a collective and more: a tuple's unpacking, not four attribute look-ups of a NamedTuple's.
            code, fits, rows, getter, chunks = column
            values = getter(record)
            if fits(values):
                if chunks:
                    _settle(rows, chunks)
                rows.append(values)
                order = self._order
                order.append(code)
                if len(order) >= SEGMENT_RECORDS:
                    self._write_segment()
                return
        try:
            line = encode_line(record)
        except (TypeError, ValueError, OverflowError):  # a value json cannot write: that record only
            self.records_lost += 1
            return
        if self._file is None:
            self.records_lost += 1
            self.bytes_lost += len(line) + 1
            return
        self._rows.append(line)
        order = self._order
        order.append(0)
        if len(order) >= SEGMENT_RECORDS:
            self._write_segment()

    def write_values(self, cls: type, values: tuple[Any, ...]) -> bool:
        """write(cls(*values)) for a columnar kind whose values, in its fields' order, the caller has
        already (the recorder's collectives: no attribute getter); False, nothing
        written, where they do not go into the columns: the caller writes the record."""
        code, fits, rows, _, chunks = self._columns[cls]
        if self._file is None or not fits(values):
            return False
        if chunks:
            _settle(rows, chunks)
        rows.append(values)
        order = self._order
        order.append(code)
        if len(order) >= SEGMENT_RECORDS:
            self._write_segment()
        return True

    def write_rows(self, cls: type, rows: Sequence[tuple[Any, ...]], make: Callable[[tuple[Any, ...]], Record]) -> None:
        """write_values of each of ``rows`` (a columnar kind's values, in order) in one call, a row that does not go
        into the columns written as ``make(row)``'s record (a JSON row, or counted lost where the file is gone):
        the recorder's memory samples of a run. A run of rows that fit is checked in one call (columnar.fit_run) and
        kept at once."""
        fit_run, start, n = _FIT_RUNS[cls], 0, len(rows)
        while start < n:
            code, fits, kept, _, chunks = self._columns[cls]  # new buffers where a segment was written
            if self._file is None or not fits(rows[start]):
                self.write(make(rows[start]))  # it may write the segment
                start += 1
                continue
            order = self._order
            end = fit_run(rows, start + 1, min(n, start + max(1, SEGMENT_RECORDS - len(order))))
            if chunks:  # batches of the kind before them: they become rows first, as write_values does
                _settle(kept, chunks)
            kept.extend(rows[start:end])
            order.extend(bytes((code,)) * (end - start))
            if len(order) >= SEGMENT_RECORDS:
                self._write_segment()
            start = end

    def write_columns(self, cls: type, columns: Sequence[Sequence[Any]], n: int) -> bool:
        """write_values of ``n`` records of a columnar kind given a field at a time (``columns``, in its fields'
        order, each of ``n`` values), of the types the columns take: the recorder's batches, whose fit check
        is made once for the batch, and whose rows are never made where they go into the file as they are.
        False, nothing written, where the file is gone: the caller writes the records (counted lost)."""
        if self._file is None:
            return False
        code, _, rows, _, chunks = self._columns[cls]
        if rows:  # records of this kind came one at a time before: these follow them as rows
            rows.extend(zip(*columns, strict=True))
        else:
            chunks.append(columns)
        self._order.extend(bytes((code,)) * n)
        if len(self._order) >= SEGMENT_RECORDS:
            self._write_segment()
        return True

    def _segment(self, rows: list[bytes], order: bytearray, columns: dict[type, list[tuple[Any, ...]]],
                 chunks: dict[type, list[Sequence[Sequence[Any]]]] | None = None) -> bytes:
        tables: dict[str, Any] = {}
        counts: dict[str, int] = {}
        encoded = []
        for code, (cls, spec) in enumerate(columnar.SPECS.items(), start=1):
            kept = columns.get(cls) or []
            batched = _joined(chunks.get(cls)) if chunks and not kept else None  # a kind's are one or the other
            n = len(batched[0]) if batched is not None else len(kept)
            if not n:
                continue
            try:
                data, tables[KIND_OF[cls]] = columnar.encode(spec, kept, batched)
            except OverflowError:  # deltas past 64 bits: this kind's records of the segment as JSON rows
                if batched is not None:  # their rows, made now
                    kept = list(zip(*batched, strict=True))
                rows, order = _as_rows(rows, order, code, cls, kept)
                continue
            counts[KIND_OF[cls]] = n
            encoded.append(data)
        meta = json.dumps({"n": counts, "tables": tables}, separators=(",", ":")).encode()
        cols = b"".join(encoded)
        payload = b"".join((SECTIONS.pack(len(meta), len(cols)), meta, order, cols, b"\n".join(rows)))
        deflater = zlib.compressobj(self.level, zdict=_ZDICT)
        return _frame(KIND_RECORDS, deflater.compress(payload) + deflater.flush(), len(order))

    def _write_segment(self) -> None:
        order, rows = self._order, self._rows
        columns = {cls: buffered.rows for cls, buffered in self._columns.items()}
        chunks = {cls: buffered.chunks for cls, buffered in self._columns.items()}
        self._init_buffer()
        if not order or self._file is None:
            return
        try:
            segment = self._segment(rows, order, columns, chunks)
        except Exception:  # noqa: BLE001 - a value the columns took and zlib did not: lose this segment, not the run
            self.records_lost += len(order)
            return
        self.records_written += len(order)
        self.bytes_written += len(segment)
        self._pending = (self._pending[0] + len(order), self._pending[1] + len(segment))
        try:
            self._file.write(segment)
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def flush(self) -> None:
        self._write_segment()
        super().flush()

    def _tail_cut(self, nbytes: int) -> int:
        """Where the file's last segments start, at least ``nbytes`` before its end (never into the header;
        the file's end when it holds no segment after it), the records from there counted as lost."""
        buf = self.path.read_bytes()
        size = len(buf)
        starts = [(frame.offset, frame.count) for frame in iter_frames(buf, len(COMPACT_MAGIC), verify=False)]
        if len(starts) < 2:
            return size
        keep = [i for i, (offset, _) in enumerate(starts) if offset <= size - nbytes and i > 0]
        first_cut = keep[-1] if keep else 1
        cut = starts[first_cut][0]
        self.records_lost += sum(count for _, count in starts[first_cut:])
        self.bytes_lost += size - cut
        return cut


def _settle(rows: list[tuple[Any, ...]], chunks: list[Sequence[Sequence[Any]]]) -> None:
    """A kind's batches (write_columns) turned into its rows, in order, before a record written one at a time."""
    for columns in chunks:
        rows.extend(zip(*columns, strict=True))
    chunks.clear()


def _joined(chunks: list[Sequence[Sequence[Any]]] | None) -> list[Sequence[Any]] | None:
    """A kind's batches (write_columns) as the columns of all their records, in order; None for none. One batch's
    fields as they are (columnar.encode reads them and changes none; the recorder makes each batch's fields
    lists, which encode compares field with field); several batches' joined a field at a time, into lists
    (_planes.c's join_columns, or itertools.chain). ValueError where a batch's fields are not of one length."""
    if not chunks:
        return None
    if len(chunks) == 1:
        return list(chunks[0])
    if _JOIN_COLUMNS is not None:
        joined: list[Sequence[Any]] = _JOIN_COLUMNS(chunks)
        return joined
    if any(len(field) != len(batch[0]) for batch in chunks for field in batch):
        raise ValueError("a batch's fields are not of one length")
    return [list(itertools.chain.from_iterable(field)) for field in zip(*chunks, strict=True)]


def _as_rows(rows: list[bytes], order: bytearray, code: int, cls: type,
             kept: list[tuple[Any, ...]]) -> tuple[list[bytes], bytearray]:
    """The segment's rows and order with the records of columnar kind ``code`` made JSON rows, in place."""
    mine, theirs = iter(kept), iter(rows)
    merged = [encode_line(cls(*next(mine))) if c == code else next(theirs)
              for c in order if c in (0, code)]
    return merged, bytearray(0 if c == code else c for c in order)


@frozen
class Frame:
    offset: int  # of the frame in the file
    kind: int
    count: int  # records, by the frame
    payload: bytes | None  # compressed; None: damaged (``why``), or not read (verify=False)
    why: str | None = None


def _check(buf: Any, pos: int) -> tuple[int, int, int, int] | None:
    """(kind, compression, length, count) of a whole frame with a good CRC at ``pos``; else None."""
    if len(buf) - pos < FRAME.size:
        return None
    marker, kind, method, length, count, crc = FRAME.unpack_from(buf, pos)
    end = pos + FRAME.size + length
    if marker != MARKER or end > len(buf):
        return None
    if zlib.crc32(buf[pos + FRAME.size:end], zlib.crc32(buf[pos:pos + 12])) != crc:
        return None
    return kind, method, length, count


def _next_frame(buf: Any, pos: int) -> int | None:
    """The offset of the next good frame at or after ``pos`` (its marker found, its CRC checked)."""
    while (pos := buf.find(MARKER, pos)) >= 0:
        if _check(buf, pos) is not None:
            return pos
        pos += 1
    return None


def iter_frames(buf: Any, pos: int, verify: bool = True) -> Iterator[Frame]:
    """The frames from ``pos`` on. A damaged one is given with ``why`` and the next good one found; a
    partial last one (a frame that runs past the end: being written, or cut by a crash) ends the walk.
    ``verify`` False: the lengths are trusted and no CRC checked (the walk of a file's own writer)."""
    size = len(buf)
    while size - pos >= FRAME.size:
        marker, kind, method, length, count, _ = FRAME.unpack_from(buf, pos)
        end = pos + FRAME.size + length
        if not verify and marker == MARKER:
            if end > size:
                return
            yield Frame(pos, kind, count, None)
            pos = end
            continue
        if verify and _check(buf, pos) is not None:
            yield Frame(pos, kind, count, bytes(buf[pos + FRAME.size:end]))
            pos = end
            continue
        following = _next_frame(buf, pos + 1)
        if following is None and marker == MARKER and end > size:
            return  # a partial last segment
        why = "its CRC does not match" if marker == MARKER and end <= size else "no segment frame there"
        # Its record count is believed where its marker is whole, or its length leads to the next good frame.
        trusted = marker == MARKER or following == end
        yield Frame(pos, kind, count if trusted and count <= SEGMENT_RECORDS else 0, None, why)
        if following is None:
            return
        pos = following


@contextmanager
def mapped(path: Path) -> Iterator[bytes]:
    """The file's bytes, read whole (~15 bytes a collective): not mapped, since a writer that cuts its
    file's tail (a full disk) would make a mapped reader's next look a SIGBUS."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot open recording: {exc.strerror}") from None
    yield data


def _inflate(payload: bytes, zdict: bytes = b"") -> bytes:
    inflater = zlib.decompressobj(zdict=zdict) if zdict else zlib.decompressobj()
    data = inflater.decompress(payload, MAX_PAYLOAD_BYTES)
    if inflater.unconsumed_tail:
        raise ValueError(f"it inflates past {MAX_PAYLOAD_BYTES:,} bytes")
    if not inflater.eof:
        raise ValueError("its zlib stream is cut short")
    return data


def header_of(path: Path, buf: Any) -> tuple[dict[str, Any], int]:
    """The checked header and the offset of the first records segment."""
    start = len(COMPACT_MAGIC)
    if len(buf) <= start:
        raise ZeromonError(f"{path}: the recording is empty (no header segment)")
    checked = _check(buf, start)
    if checked is None or checked[0] != KIND_HEADER:
        raise ZeromonError(f"{path}: not a zeromon recording (its header segment is damaged or cut short)",
                           hint=_NOT_COMPACT)
    end = start + FRAME.size + checked[2]
    try:
        text = _inflate(bytes(buf[start + FRAME.size:end])).decode("utf-8", "replace")
    except (zlib.error, ValueError) as exc:
        raise ZeromonError(f"{path}: not a zeromon recording (its header segment does not inflate: {exc})",
                           hint=_NOT_COMPACT) from None
    return read_header(path, text, major=COMPACT_VERSION.split(".")[0]), end


def read_compact_header(path: Path) -> dict[str, Any]:
    """The checked header, reading the header's segment only: `zeromon report` reads a header of every
    rank file, twice, before the files (read whole, a large run would be read twice over before its
    analysis)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(COMPACT_MAGIC) + FRAME.size)
            if len(head) == len(COMPACT_MAGIC) + FRAME.size:  # its length, at most the file's: a damaged one
                head += handle.read(min(FRAME.unpack_from(head, len(COMPACT_MAGIC))[3], os.fstat(handle.fileno()).st_size))
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot open recording: {exc.strerror}") from None
    return header_of(path, head)[0]


@frozen
class _Kind:
    """A columnar kind of one file's header."""

    name: str
    cls: type | None  # None: a kind this reader does not know (counted as unknown)
    spec: tuple[tuple[str, str, Any], ...] | None
    layout: Any  # rows.Layout: the schema its records are checked against


def dictionary_of(header: dict[str, Any]) -> bytes:
    """The records segments' preset zlib dictionary, as the header gives it."""
    dictionary = header.get("dictionary")
    return dictionary.encode("utf-8", "surrogatepass") if isinstance(dictionary, str) else b""


def kinds_of(header: dict[str, Any], checked_by_caller: type | None) -> list[_Kind]:
    raw = header.get("columns")
    kinds = []
    for name, spec_raw in (raw.items() if isinstance(raw, dict) else ()):
        cls, spec = TYPE_OF.get(name), columnar.spec_of(spec_raw)
        if cls is None or spec is None:
            kinds.append(_Kind(str(name), None, None, None))
        else:
            kinds.append(_Kind(name, cls, spec, layout_of(name, list(FIELDS_OF[cls]), checked_by_caller)))
    return kinds


def iter_compact_fields(path: Path, skipped: SkippedLines, unknown_kinds: dict[str, int] | None,
                        checked_by_caller: type | None = None) -> Iterator[tuple[type, list[Any], int]]:
    """recording.iter_fields for a compact file: (record type, values, record number) in write order."""
    with mapped(path) as buf:
        header, start = header_of(path, buf)
        layouts = layouts_of(header, checked_by_caller)
        kinds = kinds_of(header, checked_by_caller)
        number = 0
        for frame in iter_frames(buf, start):
            if frame.payload is None or frame.kind == KIND_RECORDS:
                number = yield from frame_fields(frame, dictionary_of(header), kinds, layouts, skipped, unknown_kinds, number)


def frame_fields(frame: Frame, zdict: bytes, kinds: list[_Kind], layouts: dict[str, Any], skipped: SkippedLines,
                 unknown_kinds: dict[str, int] | None, number: int) -> Generator[tuple[type, list[Any], int], None, int]:
    """iter_compact_fields of one records frame (damaged or not) whose records are numbered from
    ``number + 1``; returns the number of its last."""
    try:
        if frame.payload is None:
            raise ValueError(frame.why)
        segment = _segment_records(_inflate(frame.payload, zdict), kinds, frame.count)
    except (ValueError, zlib.error, struct.error, KeyError, IndexError, TypeError, RecursionError) as exc:
        damaged = frame.count if 0 < frame.count <= SEGMENT_RECORDS else 0
        what = (f"its {damaged:,} record{'s' if damaged != 1 else ''} skipped" if damaged
                else "its records skipped (how many is not known)")
        for i in range(max(1, damaged)):
            skipped.add(number + 1 + i, f"the segment at byte {frame.offset:,} is damaged ({exc}): "
                        f"{what}" if i == 0 else None)
        return number + max(1, damaged)
    yield from yield_segment(segment, kinds, layouts, skipped, unknown_kinds, number)
    return number + len(segment[0])


def _segment_records(payload: bytes, kinds: list[_Kind], count: int) -> tuple[bytes, list[Any], list[bytes]]:
    meta_len, cols_len = SECTIONS.unpack_from(payload)
    meta = json.loads(payload[SECTIONS.size:SECTIONS.size + meta_len])
    if not isinstance(meta, dict) or not isinstance(meta.get("n"), dict):
        raise ValueError("its meta is not an object")
    order_start = SECTIONS.size + meta_len
    order = payload[order_start:order_start + count]
    cols_start = order_start + count
    cols = memoryview(payload)[cols_start:cols_start + cols_len]
    rows_of: list[Any] = []
    pos = 0
    for kind in kinds:
        n = meta["n"].get(kind.name, 0)
        if type(n) is not int or n < 0:
            raise ValueError(f"its count of {kind.name} is {n!r}")
        if kind.cls is None or kind.spec is None or n == 0:
            if n:  # an unknown kind's columns: their width is not known, nor where the next kind's start
                raise ValueError(f"its {kind.name} columns are of a layout this zeromon does not read")
            rows_of.append([])
            continue
        decoded, pos = columnar.decode(kind.spec, cols, pos, n, meta.get("tables", {}).get(kind.name, {}))
        fields = [decoded.columns.get(name, [None] * n) for name in FIELDS_OF[kind.cls]]
        rows_of.append(list(zip(*fields, strict=True)))
    if len(order) != count or pos != cols_len:
        raise ValueError("its sections do not add up")
    rest = payload[cols_start + cols_len:]
    rows = rest.split(b"\n") if rest else []
    if order.count(0) != len(rows) or any(order.count(i + 1) != len(r) for i, r in enumerate(rows_of)
                                          if isinstance(r, list)):
        raise ValueError("its record order does not match its records")
    return order, rows_of, rows


def yield_segment(segment: tuple[bytes, list[Any], list[bytes]], kinds: list[_Kind], layouts: dict[str, Any],
                   skipped: SkippedLines, unknown_kinds: dict[str, int] | None,
                   number: int) -> Iterator[tuple[type, list[Any], int]]:
    order, rows_of, rows = segment
    numbered: list[tuple[int, str]] = []
    positions = [number + 1 + i for i, code in enumerate(order) if code == 0]
    for at, line in zip(positions, rows, strict=True):
        if len(line) >= MAX_LINE_CHARS:
            skipped.add(at, _TOO_LONG)
        else:
            numbered.append((at, line.decode("utf-8", "replace")))
    parsed = {at: item for item in parse_rows(numbered, layouts, skipped, unknown_kinds) for at in (item[2],)}
    taken = [0] * len(kinds)
    for i, code in enumerate(order):
        at = number + 1 + i
        if code == 0:
            item = parsed.get(at)
            if item is not None:
                yield item
            continue
        kind = kinds[code - 1]
        values = list(rows_of[code - 1][taken[code - 1]])
        taken[code - 1] += 1
        if kind.layout.checked and (problem := kind.layout.schema.problem(values)) is not None:
            skipped.add(at, problem)
            continue
        yield kind.cls, values, at  # type: ignore[misc]


def compact_tail_rows(path: Path) -> tuple[dict[str, Any], list[bytes]]:
    """The header and the JSON rows of the last good records segment (where a RunEnd is): the frames
    are walked by their lengths, without reading the segments before."""
    with mapped(path) as buf:
        header, start = header_of(path, buf)
        frames = [frame for frame in _walk_lengths(buf, start) if frame.kind == KIND_RECORDS]
        for frame in reversed(frames[-4:]):
            if _check(buf, frame.offset) is None:
                continue
            payload = bytes(buf[frame.offset + FRAME.size:frame.offset + FRAME.size + FRAME.unpack_from(buf, frame.offset)[3]])
            try:
                return header, _segment_records(_inflate(payload, dictionary_of(header)), kinds_of(header, None), frame.count)[2]
            except (ValueError, zlib.error, struct.error, KeyError, IndexError, TypeError, RecursionError):
                continue
    return header, []


def _walk_lengths(buf: bytes, pos: int) -> Iterator[Frame]:
    """iter_frames(verify=False), the whole frames with a marker kept as (offset, kind, count) only until
    the last few: a rank has thousands of frames, and a Frame each would be a cost the report pays for
    nothing."""
    last: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=8)
    size = len(buf)
    while size - pos >= FRAME.size:
        marker, kind, _, length, count, _ = FRAME.unpack_from(buf, pos)
        end = pos + FRAME.size + length
        if marker != MARKER or end > size:
            break
        if kind == KIND_RECORDS:
            last.append((pos, kind, count))
        pos = end
    yield from (Frame(offset, kind, count, None) for offset, kind, count in last)
    if size - pos >= FRAME.size and FRAME.unpack_from(buf, pos)[0] != MARKER:  # not a partial last one
        yield from iter_frames(buf, pos, verify=False)
