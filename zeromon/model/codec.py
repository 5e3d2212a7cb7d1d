"""The recording format: versioned JSON lines, one file per rank.

Line 1 is a header object that names the format, its version and, for every record kind, the
order of its fields. Every later line is a JSON array ``[kind, field1, field2, ...]``: a million
collectives stay a few hundred MB and parse in seconds, and the header keeps them self-describing.

Compatibility: a reader accepts any minor version of its major version (unknown kinds and extra
fields are skipped, missing fields read as None) and refuses another major version with a message
naming the file. Corrupt lines (a crash mid-write, a bad disk) are skipped and their line numbers
reported, never fatal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import gc
import itertools
import json
import operator
import os
import shlex
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, overload

from zeromon.errors import ZeromonError
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
    RunEnd,
    RunInfo,
    StepSummary,
)
from zeromon.model.schema import RecordCheck, record_check, show
from zeromon.model.units import rank_ranges

FORMAT_NAME = "zeromon-recording"
FORMAT_VERSION = "1.4"  # 1.1: PhaseSpan.timing; StepSummary.comp_s, overlap_s, exposed_comm_s
# 1.2: CollectiveEvent.issue_s; the "agent" phase; exposed communication as the training thread's blocked time
# 1.3: the "run_end" record (how the rank ended); AgentStats.records_lost, bytes_lost
# 1.4: the "progress" record (where a rank stalled, or was when a signal stopped it)
_MAJOR = FORMAT_VERSION.split(".")[0]

# The kind tag of each record type on the wire. Tags never change meaning within a major version.
KIND_OF: dict[type, str] = {
    CollectiveEvent: "collective",
    PhaseSpan: "phase",
    MemorySample: "memory",
    DeviceSample: "device",
    OomEvent: "oom",
    StepSummary: "step",
    RunInfo: "run_info",
    Notice: "notice",
    AgentStats: "agent_stats",
    RunEnd: "run_end",
    ProgressReport: "progress",
}
TYPE_OF: dict[str, type] = {kind: cls for cls, kind in KIND_OF.items()}
FIELDS_OF: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in KIND_OF
}
_GETTERS: dict[type, operator.attrgetter[Any]] = {cls: operator.attrgetter(*names) for cls, names in FIELDS_OF.items()}


def rank_file_name(rank: int, suffix: str = ".jsonl") -> str:
    """A rank's file name: rank-<r>.jsonl (format 1.x), or with suffix ".zmr" the compact form (2.x)."""
    return f"rank-{rank}{suffix}"


# The suffixes of rank files, the compact form first: a folder's rank files are the names that match
# these, and which format a file holds is read from its first bytes (is_compact), not from its name.
RANK_FILE_SUFFIXES = (".zmr", ".jsonl")
COMPACT_MAGIC = b"\x89ZMR\r\n\x1a\n"  # PNG's trick: a text-mode transfer or a 7-bit channel breaks it visibly


def rank_file_paths(folder: Path) -> list[Path]:
    """The rank-<r>.zmr and rank-<r>.jsonl files of a folder, sorted by name."""
    return sorted(path for suffix in RANK_FILE_SUFFIXES for path in folder.glob(f"rank-*{suffix}"))


def rank_file_path(folder: str | Path, rank: int) -> Path:
    """Where a rank's file is in a folder: its .zmr if there is one, else its .jsonl."""
    compact = Path(folder) / rank_file_name(rank, ".zmr")
    return compact if compact.exists() else Path(folder) / rank_file_name(rank)


def is_compact(path: Path) -> bool:
    """Whether a file holds the compact form (format 2.x), by its first bytes. False for a file that
    cannot be read: the JSON-lines reader says why."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(COMPACT_MAGIC)) == COMPACT_MAGIC
    except OSError:
        return False


def read_file_header(path: Path) -> dict[str, Any]:
    """The header of a rank file of either form, checked (read_header)."""
    if is_compact(path):
        from zeromon.model.segments import read_compact_header

        return read_compact_header(path)
    with _open_recording(path) as handle:
        return read_header(path, read_first_line(path, handle))


def _row(record: Record) -> list[Any]:
    """A record's line as values: its kind, then its fields in order."""
    return [KIND_OF[type(record)], *_GETTERS[type(record)](record)]


def encode_record(record: Record) -> str:
    """One line (without the newline) for a record."""
    return _dumps(_row(record))


# The kinds the agent writes by the hundred whose values are only numbers, strings, None and dicts of them:
# encode_line may write them with orjson.
_FAST_KINDS = frozenset({StepSummary, PhaseSpan, CollectiveEvent, MemorySample, AgentStats, DeviceSample})


def encode_line(record: Record) -> bytes:
    """encode_record's line as the compact writer keeps it in a segment (UTF-8, lone surrogates kept). The
    JSON-lines writer and ``zeromon export`` write json's own line, the bytes people grep.

    A step summary takes ~6 µs in json's encoder and ~0.5 µs in orjson's (a summary a step, on the agent's
    background thread: bench_recorder_cpu), so the kinds in _FAST_KINDS go through orjson where it is
    installed and the line it makes reads back as json's would: the same values, the floats in another
    spelling of the same shortest digits (``1e-9`` for ``1e-09``), other characters than ASCII as UTF-8
    rather than escaped. Where it could differ, json writes the line: a value orjson refuses (an integer past
    64 bits, a key that is not a string, a lone surrogate) and any line with a ``null`` in it (orjson writes
    NaN and infinities as null, which json writes as NaN and Infinity; a None, or the word in a string, takes
    the slower way to the same line). tests/test_codec.py holds them to the same values."""
    row = _row(record)
    if type(record) in _FAST_KINDS:
        orjson = _orjson if _orjson is not None else orjson_module()
        if orjson:
            try:
                line: bytes = orjson.dumps(row, default=json_default)
            except TypeError:  # orjson.JSONEncodeError: json says what it makes of the value
                pass
            else:
                if b"null" not in line:
                    return line
    return _dumps(row).encode("utf-8", "surrogatepass")


_orjson: Any = None  # the orjson module once looked for (orjson_module); False where it is not installed


def orjson_module() -> Any:
    """orjson, imported on first use (not with this module, which the agent imports into every training
    process); False without it (a dependency: a bare install writes with json)."""
    global _orjson
    if _orjson is None:
        try:
            import orjson
        except ImportError:
            _orjson = False
        else:
            _orjson = orjson
    return _orjson


def json_default(value: Any) -> Any:
    """Values json (and orjson) cannot encode by themselves."""
    # Enum members are str subclasses and serialize by value; this catches Mapping proxies and the
    # odd numpy scalar a user's config may carry into RunInfo.knobs.
    if hasattr(value, "items"):
        return dict(value.items())
    if hasattr(value, "item"):
        return value.item()
    return str(value)


_dumps = json.JSONEncoder(separators=(",", ":"), default=json_default).encode


def make_header(rank: int, **extra: Any) -> dict[str, Any]:
    header: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "rank": rank,
        "schemas": {KIND_OF[cls]: list(names) for cls, names in FIELDS_OF.items()},
    }
    header.update(extra)
    return header


# The bytes an end record may grow by when the records it covers are added to its counts.
_COUNTS_GROWTH = 64


class RecordingWriter:
    """Writes one rank's recording. Not thread-safe: the agent's recorder thread owns it.

    The constructor raises OSError when the file cannot be made (``open_or_lost`` does not). After
    that nothing raises: the first write that fails (a full disk, a read-only or removed folder, an
    I/O error), or a file found removed, ends the writing there. What was buffered since the last
    flush and everything after it is counted (``records_lost``, ``bytes_lost``; ``error`` says why),
    and ``close(end)`` tries once more to append the end record that says so.
    """

    def __init__(self, path: str | Path, rank: int, **header_extra: Any) -> None:
        self.path = Path(path)
        self.records_written = 0
        self.bytes_written = 0  # the file's size, header included, as written (ZEROMON_MAX_DISK counts it)
        self.records_lost = 0
        self.bytes_lost = 0
        self.error: str | None = None  # the first write error, said once by the agent
        self._created = False
        self._pending = (0, 0)  # (records, bytes) written to the buffer since the last good flush
        self._init_buffer()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] | None = open(self.path, "wb")  # noqa: SIM115
        self._created = True
        try:
            header = self._header_bytes(make_header(rank, **header_extra))
            self._file.write(header)
            self.bytes_written = len(header)
            self._file.flush()  # a reader of the running rank's file finds a recording, not an empty file
        except OSError as exc:
            self._fail(exc)

    @classmethod
    def open_or_lost(cls, path: str | Path, rank: int, **header_extra: Any) -> RecordingWriter:
        """A writer for ``path``; one that counts every record as lost (``error`` set) when the file
        cannot be made: a read-only or full file system, a path under a file."""
        try:
            return cls(path, rank, **header_extra)
        except OSError as exc:
            writer = cls.__new__(cls)
            writer.path, writer._file, writer._created, writer._pending = Path(path), None, False, (0, 0)
            writer.records_written = writer.bytes_written = writer.records_lost = writer.bytes_lost = 0
            writer.error = f"cannot create {path}: {exc.strerror or exc}"
            writer._init_buffer()
            return writer

    def _init_buffer(self) -> None:
        """What a writer that buffers its records (the compact form's) keeps between flushes."""

    def _header_bytes(self, header: dict[str, Any]) -> bytes:
        return json.dumps(header, separators=(",", ":")).encode() + b"\n"

    def _end_bytes(self, end: Record) -> bytes:
        """The end record, appended after a failure: on a line of its own, after a part-written one."""
        return b"\n" + encode_record(end).encode("utf-8", "surrogatepass") + b"\n"

    @property
    def failed(self) -> bool:
        return self.error is not None

    def _write_line(self, line: bytes) -> None:
        if self._file is None:
            self.records_lost += 1
            self.bytes_lost += len(line) + 1
            return
        try:
            self._file.write(line + b"\n")
        except (OSError, ValueError) as exc:  # ValueError: the file was closed under us
            self._pending = (self._pending[0] + 1, self._pending[1] + len(line) + 1)
            self._fail(exc)
            return
        self.records_written += 1
        self.bytes_written += len(line) + 1
        self._pending = (self._pending[0] + 1, self._pending[1] + len(line) + 1)

    def write(self, record: Record) -> None:
        try:
            line = encode_record(record).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError, OverflowError):  # a value json cannot write: that record only
            self.records_lost += 1
            return
        self._write_line(line)

    def flush(self) -> None:
        if self._file is None:
            return
        try:
            self._file.flush()
            # A removed file (its folder deleted mid-run) takes writes without a word: look.
            if os.fstat(self._file.fileno()).st_nlink == 0:
                raise FileNotFoundError(errno.ENOENT, "the file was removed while the run was writing it")
        except (OSError, ValueError) as exc:
            self._fail(exc)
            return
        self._pending = (0, 0)

    def _fail(self, exc: BaseException) -> None:
        """Stop writing: what the buffer held since the last good flush is lost (part of it may have
        reached the file, as a line the reader skips), and so is everything after."""
        if self.error is None:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.error = f"cannot write {self.path}: {reason}"
        records, nbytes = self._pending
        self.records_written -= records
        self.bytes_written -= nbytes
        self.records_lost += records
        self.bytes_lost += nbytes
        self._pending = (0, 0)
        handle, self._file = self._file, None
        if handle is not None:
            with contextlib.suppress(OSError, ValueError):
                handle.close()  # the flush inside fails again; the descriptor is closed all the same

    def close(self, end: Record | None = None) -> None:
        """Flush, write ``end`` (the end record) last, close. After a failure, ``end`` is appended to
        what the file holds, on a line of its own, if the file system takes it now."""
        if end is not None and self._file is not None:
            self.write(end)
        elif end is not None:
            self._append_after_failure(end)
        if self._file is not None:
            self.flush()
        if self._file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._file.close()
            self._file = None

    def _append_after_failure(self, end: Record) -> None:
        if not self._created:
            self.write(end)  # counted: there is no file to end
            return
        try:
            line = self._end_bytes(end)
        except (TypeError, ValueError):
            self.records_lost += 1
            return
        try:
            self._append(line)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                self.records_lost += 1
                return
            # A full disk: the end record is worth more than the last records before it, and it is written
            # over them, in place. Bytes the file already holds need no free block: room freed by
            # truncating first would go to whichever process of the run writes next (the other ranks
            # fill the same disk), and the end record would be lost after all.
            try:
                self._write_over_tail(end, len(line))
            except (OSError, TypeError, ValueError):
                self.records_lost += 1

    def _append(self, data: bytes) -> None:
        # No O_CREAT: a removed file stays removed (a new one would have no header).
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write")
        finally:
            os.close(fd)

    def _write_over_tail(self, end: Record, size: int) -> None:
        """Write ``end`` over the file's last records, from a record's start far enough before the end (never
        into the header), and end the file after it. The records it covers are counted as lost, in the
        end record too."""
        lost = (self.records_lost, self.bytes_lost)
        cut = self._tail_cut(size + _COUNTS_GROWTH)
        if isinstance(end, RunEnd):
            end = dataclasses.replace(end, records_lost=end.records_lost + self.records_lost - lost[0],
                                      bytes_lost=end.bytes_lost + self.bytes_lost - lost[1])
        data = self._end_bytes(end)
        fd = os.open(self.path, os.O_WRONLY)  # no O_CREAT, as _append
        try:
            if os.pwrite(fd, data, cut) != len(data):
                raise OSError(errno.ENOSPC, "short write")
            os.ftruncate(fd, cut + len(data))
        finally:
            os.close(fd)

    def _tail_cut(self, nbytes: int) -> int:
        """Where the file's last records start, at least ``nbytes`` before its end where the file holds
        that many after its header (else just after the header); the records from there are counted as
        lost."""
        with open(self.path, "rb") as handle:
            header_end = len(handle.readline())
            size = os.fstat(handle.fileno()).st_size
            start = max(header_end, size - nbytes - 4096)
            handle.seek(start)
            tail = handle.read()
        cut_at = tail.rfind(b"\n", 0, max(0, len(tail) - nbytes))
        cut = start + cut_at + 1 if cut_at >= 0 else header_end
        dropped = tail[cut - start:]
        self.records_lost += dropped.count(b"\n")
        self.bytes_lost += len(dropped)
        return cut


@dataclass(frozen=True, slots=True)
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
        return cls(*(list(column) for column in zip(*map(_GETTERS[CollectiveEvent], events), strict=True)))


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


@dataclass(slots=True)
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


def _required_fields(cls: type) -> int:
    return sum(1 for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a record's fields are in a row of one file's layout."""

    cls: type
    width: int  # the row slice [1:width] holds the fields in the dataclass's order ...
    required: int  # ... and makes a record when it holds at least this many
    indices: list[int | None] | None  # otherwise, each field's position in the row (None: absent)
    schema: RecordCheck  # what is wrong with a row's values ...
    checked: bool  # ... if it is checked here (not by the caller, a column at a time)


def _layout(kind: str, names: list[str], unchecked: type | None = None) -> _Layout | None:
    """How to read rows of a kind written with these field names; None for an unknown kind. The
    values of ``unchecked``'s records are not checked against its schema (their reader does it)."""
    cls = TYPE_OF.get(kind)
    if cls is None:
        return None
    position = {name: i + 1 for i, name in enumerate(names)}  # +1: row[0] is the kind tag
    wanted = FIELDS_OF[cls]
    indices: list[int | None] = [position.get(name) for name in wanted]
    same = indices == list(range(1, len(wanted) + 1))  # the common case: this version's own layout
    return _Layout(cls=cls, width=len(wanted) + 1, required=_required_fields(cls), indices=None if same else indices,
                   schema=record_check(cls, kind), checked=cls is not unchecked)


# A line longer than this is skipped unread, its number reported: no record comes near it (a RunInfo
# with a large config is a few kB), and parsing one costs ~15x its size in objects (a 50 MB line took
# 750 MB). A first line longer than this is no recording's header.
MAX_LINE_CHARS = 4 * 2**20
LINE_ERRORS_KEPT = 100  # lines whose reason Recording.line_errors keeps (corrupt_lines has them all)
UNKNOWN_KINDS_KEPT = 32  # names of unknown record kinds counted in Recording.unknown_kinds
_NOT_A_RECORDING = "recordings are the rank-<r>.zmr (or .jsonl) files that `zeromon run` writes"


def _open_recording(path: Path) -> IO[str]:
    try:
        return open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot open recording: {exc.strerror}") from None


def read_first_line(path: Path, handle: IO[str]) -> str:
    """The header line, at most MAX_LINE_CHARS read: an error naming the file when there is none."""
    first = handle.readline(MAX_LINE_CHARS)
    if not first:
        raise ZeromonError(f"{path}: the recording is empty (no header line)")
    if len(first) == MAX_LINE_CHARS and not first.endswith("\n"):
        raise ZeromonError(f"{path}:1: not a zeromon recording (its first line is longer than "
                           f"{MAX_LINE_CHARS:,} characters)", hint=_NOT_A_RECORDING)
    return first


def read_header(path: Path, first_line: str, major: str = _MAJOR) -> dict[str, Any]:
    try:
        header = json.loads(first_line)
    except (json.JSONDecodeError, RecursionError) as exc:
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deep"
        raise ZeromonError(f"{path}:1: not a zeromon recording (the header line is not JSON: {why})",
                           hint=_NOT_A_RECORDING) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise ZeromonError(f"{path}:1: not a zeromon recording (no '{FORMAT_NAME}' header)", hint=_NOT_A_RECORDING)
    version = str(header.get("version", ""))
    if version.split(".")[0] != major:
        raise ZeromonError(
            f"{path}: recording format version {_plain(version) or '(none)'} is not supported; "
            f"this zeromon reads version {major}.x in a {'compact' if major != _MAJOR else 'JSON-lines'} file",
            hint="read it with the zeromon version that wrote it, or upgrade zeromon",
        )
    schemas = header.get("schemas")
    if not isinstance(schemas, dict):
        raise ZeromonError(f"{path}:1: the recording header has no 'schemas' object")
    for kind, names in schemas.items():
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ZeromonError(f"{path}:1: the recording header's schema of {show(kind)} is {show(names)}, not a "
                               "list of field names")
    if "rank" in header and type(header["rank"]) is not int:
        raise ZeromonError(f"{path}:1: the recording header's rank is {show(header['rank'])}, not an integer")
    return header


def _plain(text: str) -> str:
    """A header's string as it is, or as JSON spells it where it would break the message's line."""
    return text if text.isprintable() and len(text) <= 40 else show(text)


def _fast_loads() -> Callable[[str], Any]:
    """orjson's loads, ~5x faster per line than json's, where it is installed. Imported here, by
    readers only: the agent's process imports this module to write and needs no more than the stdlib."""
    try:
        import orjson
    except ImportError:  # a dependency, but a bare install still reads, at json's pace
        return json.loads
    loads: Callable[[str], Any] = orjson.loads
    return loads


class _Skipped:
    """Where a reader puts the lines it skips: their numbers, and for some what was wrong."""

    __slots__ = ("errors", "lines")

    def __init__(self, lines: list[int] | None, errors: dict[int, str] | None) -> None:
        self.lines, self.errors = lines, errors

    def add(self, lineno: int, problem: str | None = None) -> None:
        if self.lines is not None:
            self.lines.append(lineno)
        if problem is not None and self.errors is not None and len(self.errors) < LINE_ERRORS_KEPT:
            self.errors[lineno] = problem


_TOO_LONG = f"longer than {MAX_LINE_CHARS:,} characters, not read"


def _iter_fields(path: Path, skipped: _Skipped, unknown_kinds: dict[str, int] | None,
                 checked_by_caller: type | None = None,
                 summaries: list[list[Any]] | None = None) -> Iterator[tuple[type, list[Any], int]]:
    """(record type, field values, line number) for every line after the header of one rank file that
    holds a record of a known kind whose values fit its schema; the records of ``checked_by_caller``
    are not checked here (read_recording checks the collectives a column at a time). A compact (2.x)
    file gives its records' numbers (1, 2, ...) for line numbers, and may put step summaries' values
    into ``summaries`` (in order) instead of giving them."""
    if is_compact(path):
        from zeromon.model.segment_batches import iter_compact_batched

        return iter_compact_batched(path, skipped, unknown_kinds, checked_by_caller, summaries)
    handle = _open_recording(path)
    try:
        header = read_header(path, read_first_line(path, handle))
    except BaseException:
        handle.close()
        raise
    return parse_rows(_numbered_lines(handle, skipped), layouts_of(header, checked_by_caller), skipped, unknown_kinds)


def layouts_of(header: dict[str, Any], checked_by_caller: type | None = None) -> dict[str, _Layout | None]:
    return {kind: _layout(kind, names, checked_by_caller) for kind, names in header["schemas"].items()}


def _numbered_lines(handle: IO[str], skipped: _Skipped) -> Iterator[tuple[int, str]]:
    """(line number, line) after the header; a line longer than MAX_LINE_CHARS is skipped unread."""
    with handle:
        readline = handle.readline
        for lineno, line in enumerate(iter(functools.partial(readline, MAX_LINE_CHARS), ""), start=2):
            if len(line) == MAX_LINE_CHARS and line[-1] != "\n":
                while (rest := readline(MAX_LINE_CHARS)) and rest[-1] != "\n":  # read past it, a piece at a time
                    pass
                skipped.add(lineno, _TOO_LONG)
                continue
            yield lineno, line


def parse_rows(lines: Iterable[tuple[int, str]], layouts: dict[str, _Layout | None], skipped: _Skipped,
               unknown_kinds: dict[str, int] | None) -> Iterator[tuple[type, list[Any], int]]:
    """(record type, field values, number) of each numbered JSON row of a known kind whose values fit
    its schema (``layouts``: the kinds of the file's header); the others are skipped and counted."""
    fast_loads = _fast_loads()
    # Per line: ~0.3 µs in orjson and as little as possible besides (a million lines per file).
    for lineno, line in lines:
        by_json = False
        try:
            try:
                row = fast_loads(line)
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


def iter_records(path: str | Path, corrupt_lines: list[int] | None = None,
                 unknown_kinds: dict[str, int] | None = None,
                 line_errors: dict[int, str] | None = None) -> Iterator[Record]:
    """Stream the records of one rank file, after checking its header.

    Line numbers of lines that cannot be decoded, or whose record breaks its schema, are appended
    to ``corrupt_lines``; what was wrong, where known, is put in ``line_errors``.
    """
    for cls, values, _ in _iter_fields(Path(path), _Skipped(corrupt_lines, line_errors), unknown_kinds):
        yield cls(*values)


# Collectives are gathered as rows and turned into columns this many at a time: the rows of a whole
# million-event file would cost ~200 MB more at the peak, and a chunk this small is still in the CPU's
# cache when its columns are checked and interned (50,000 rows a chunk read 30% slower).
_CHUNK_ROWS = 2048


def read_recording(path: str | Path, steps_as_rows: bool = False) -> Recording:
    """Read one rank file whole (its collectives as CollectiveEvents: columns, events on demand).

    Lines that are not records, or whose values break their schema (a string where the format has
    an integer), are skipped and named in ``corrupt_lines`` and ``line_errors``. Raises ZeromonError
    for a file that is not a recording. ``steps_as_rows``: the step summaries as a StepRecords, the
    rows read (what `zeromon report` asks for: 10,000 summaries a rank cost ~12 ms to make)."""
    path = Path(path)
    rec = Recording(path=path, header=read_file_header(path))
    skipped = _Skipped(rec.corrupt_lines, rec.line_errors)
    steps: list[Any] = []
    sinks: dict[type, Callable[[Any], None]] = {
        PhaseSpan: rec.phases.append,
        MemorySample: rec.memory.append,
        DeviceSample: rec.device.append,
        OomEvent: rec.ooms.append,
        StepSummary: steps.append,
        Notice: rec.notices.append,
        ProgressReport: rec.progress.append,
    }
    columns: list[list[Any]] = [[] for _ in _COLLECTIVE_FIELDS]
    interned: dict[str, str] = {}
    rows: list[list[Any]] = []  # each a collective's values and, last, its line number
    width = len(_COLLECTIVE_FIELDS)
    check = record_check(CollectiveEvent, KIND_OF[CollectiveEvent])
    # Checked a column at a time: the set of a column's types costs ~10 ns a value, each row's check
    # ~0.3 µs; only a chunk with a bad value is checked row by row. The string columns are checked
    # as they are interned, by the interned values' types (a handful): at no cost.
    interned_str = {i for i in _INTERNED_COLUMNS if check.fields[i].accepts == {str}}
    column_types = [(i, f.accepts) for i, f in enumerate(check.fields)
                    if f.accepts is not None and i not in interned_str]

    def intern(chunk: list[tuple[Any, ...]]) -> bool:
        """One shared str per value in the string columns; False where one holds something else."""
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

    def flush_rows() -> None:
        chunk = list(zip(*rows, strict=True))
        if not (all(set(map(type, chunk[i])) <= accepts for i, accepts in column_types) and intern(chunk)):
            kept = []
            for values in rows:
                problem = check.problem(values[:width])
                if problem is None:
                    kept.append(values)
                else:
                    skipped.add(values[width], problem)
            chunk = list(zip(*kept, strict=True)) or [() for _ in range(width + 1)]
            intern(chunk)
        for column, column_values in zip(columns, chunk, strict=False):  # the last, the line numbers, dropped
            column.extend(column_values)
        rows.clear()

    with collector_paused():
        fields = _iter_fields(path, skipped, rec.unknown_kinds, CollectiveEvent, steps if steps_as_rows else None)
        for cls, values, lineno in fields:
            if cls is CollectiveEvent:
                if len(values) < width:  # the optional wait_ns, absent: its default is None
                    values.extend([None] * (width - len(values)))
                values.append(lineno)
                rows.append(values)
                if len(rows) >= _CHUNK_ROWS:
                    flush_rows()
                continue
            if cls is StepSummary and steps_as_rows:
                steps.append(values)
                continue
            sink = sinks.get(cls)
            record = cls(*values)
            if sink is not None:
                sink(record)
            elif isinstance(record, RunInfo):
                rec.run_info = record
            elif isinstance(record, AgentStats):
                rec.stats = record
        if rows:
            flush_rows()
    rec.collectives = CollectiveEvents(CollectiveColumns(*columns))
    if steps_as_rows:
        from zeromon.model.step_records import StepRecords

        rec.steps = StepRecords.of(steps)
    else:
        rec.steps = steps
    if rec.line_errors:  # the collectives' are found a chunk at a time, after the lines that follow them
        rec.corrupt_lines.sort()
        rec.line_errors = dict(sorted(rec.line_errors.items()))
    return rec


def _rank_in_name(path: Path) -> int | None:
    """r of a file named rank-<r>.zmr or rank-<r>.jsonl; None for another name the folder's glob matched."""
    number = path.name.removeprefix("rank-").removesuffix(path.suffix)
    return int(number) if number.isdigit() else None


# A run: the folder its ranks recorded in (the --out of `zeromon run`), or its folders, one per node
# where each node's launcher wrote its own ranks to a disk of its own.
RunDirs = str | Path | Sequence[str | Path]


def run_folders(run: RunDirs) -> list[Path]:
    """The folders of a run, in the order given, each once (a folder named twice, by a glob and by
    name, is read once)."""
    if isinstance(run, (str, Path)):
        return [Path(run)]
    folders: dict[Path, Path] = {}
    for folder in map(Path, run):
        folders.setdefault(folder.resolve(), folder)
    return list(folders.values())


def run_name(run: RunDirs) -> str:
    """The run in a report's words: its folder, or its folders joined by '+'."""
    return " + ".join(map(str, run_folders(run)))


def run_headers(run: RunDirs) -> list[tuple[Path, dict[str, Any]]]:
    """Each rank file of a run's folder (or folders) with its header, checked to be one run's
    (check_one_run): an error naming the folder when it is not one or holds no rank file. Only the
    first line of each file is read."""
    headers = [item for folder in run_folders(run) for item in _folder_headers(folder)]
    check_one_run([(path, header, None) for path, header in headers], by_run_id=False)  # the readers compare it
    return headers


def _folder_headers(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    if run_dir.is_file():
        raise ZeromonError(f"{run_dir}: is a file; a run is the folder of rank-<r>.zmr (or .jsonl) files",
                           hint=f"pass the folder that holds it: {run_dir.parent}")
    if not run_dir.is_dir():
        raise ZeromonError(f"{run_dir}: no such run folder")
    files = rank_file_paths(run_dir)
    if not files:
        traces = [*run_dir.glob("*.json"), *run_dir.glob("*.json.gz")]  # PyTorch profiler traces, likely
        raise ZeromonError(
            f"{run_dir}: no rank-<r>.zmr (or .jsonl) recordings in this folder"
            + (f"; it holds {len(traces)} .json/.json.gz file{'s' if len(traces) != 1 else ''}, profiler "
               "traces?" if traces else ""),
            hint=f"for PyTorch profiler traces: zeromon report --trace {shlex.quote(str(run_dir))}" if traces
            else "record a run with `zeromon run --out DIR -- CMD ...`",
        )
    return [(path, read_file_header(path)) for path in files]


def missing_ranks_note(headers: Sequence[tuple[Path, dict[str, Any]]]) -> str | None:
    """What the run's headers say of ranks without a file, and where the others are: "rank 1 missing:
    world size 2, 1 rank found in node0 (rank 0); is a node's folder missing?"; None when none is
    missing or the headers give no world size (files of an older format or written by hand)."""
    worlds: list[int] = [h["world_size"] for _, h in headers if type(h.get("world_size")) is int]
    by_folder: dict[Path, list[int]] = {}
    for path, header in headers:
        if type(header.get("rank")) is int:
            by_folder.setdefault(path.parent, []).append(header["rank"])
    found = {rank for ranks in by_folder.values() for rank in ranks}
    missing = sorted(set(range(max(worlds))) - found) if worlds else []
    if not missing:
        return None
    where = " and ".join(f"{folder} ({rank_ranges(ranks)})" for folder, ranks in by_folder.items())
    return (f"{rank_ranges(missing)} missing: world size {max(worlds)}, {len(found)} rank"
            f"{'s' if len(found) != 1 else ''} found in {where}; is a node's folder missing?")


def rank_files(run: RunDirs) -> list[Path]:
    """The rank files of a run's folder (or folders), checked to be one run's (run_headers)."""
    return [path for path, _ in run_headers(run)]


# What makes rank files one run's: each a value in the header (written by the agent at start) or in
# the run's RunInfo. A value missing from a file (an older or hand-made one) is not compared.
# run_id: one value for every rank of a job, however many launchers (nodes) started them (the agent
# agrees on it through the job's rendezvous store: zeromon_agent.agent.shared_run_id). Compared after
# the others, over all files: "framework 'fsdp2' and 'none'" tells a user more than two random ids.
_IDENTITY = (("job", "job"), ("world_size", "world size"), ("framework", "framework"), ("run_id", "run id"))
_DIFFERENT_RUNS_HINT = ("a run folder holds the rank files of one run (the --out of one `zeromon run`): "
                        "move the other run's files to a folder of their own")
_DIFFERENT_RUNS_HINT_FOLDERS = ("give the folders of one run: each node's --out of the same job (one "
                                "`zeromon run` per node)")
_RANK_TWICE_HINT_FOLDERS = ("each node's folder holds its own ranks: was a folder given twice under two names, "
                            "or a rank file copied into another node's folder?")


def _identity(header: dict[str, Any], info: RunInfo | None) -> dict[str, Any]:
    values = {key: header.get(key) for key, _ in _IDENTITY}
    if info is not None:
        values["job"] = values["job"] or info.job
        values["world_size"] = values["world_size"] or info.world_size
        # "unknown": not yet detected (a rank that stopped early), so it tells runs apart by nothing.
        values["framework"] = info.framework if info.framework != "unknown" else None
    return values


def check_one_run(files: Sequence[tuple[Path, dict[str, Any], RunInfo | None]], by_run_id: bool = True) -> None:
    """Refuse rank files that are not one run's, naming them: a header's rank that is not the one
    in the file's name (a copied or renamed file), two files of one rank, or a job, world size,
    framework or run id that differs between files (two runs' files in one folder, or folders of two
    runs). Every analysis would otherwise match one run's collectives against another's and report
    stragglers that are not.

    ``files``: each file with its header and, where read, its RunInfo (None: the header alone); they may
    be in several folders (one per node), which the hints then speak of. ``by_run_id`` False: the run
    id is not compared (a check of the headers alone, before the RunInfo that may name a difference
    in the user's words)."""
    several = len({path.parent for path, _, _ in files}) > 1
    by_rank: dict[int, Path] = {}
    for path, header, _ in files:
        rank = header.get("rank")
        named = _rank_in_name(path)
        if named is not None and rank is not None and rank != named:
            raise ZeromonError(f"{path}: the header says rank {rank}, the file name rank {named}",
                               hint="a rank file keeps the name `zeromon run` gave it: was it copied or renamed?")
        if isinstance(rank, int):
            if rank in by_rank:
                raise ZeromonError(f"{by_rank[rank]} and {path} are both rank {rank}",
                                   hint=_RANK_TWICE_HINT_FOLDERS if several
                                   else "keep one recording per rank in a run folder (several runs mixed?)")
            by_rank[rank] = path
    identities = [(path, _identity(header, info)) for path, header, info in files]
    for key, label in _IDENTITY if by_run_id else _IDENTITY[:-1]:  # a key over all files, then the next
        first_seen: tuple[Path, Any] | None = None
        for path, values in identities:
            value = values[key]
            if value is None:
                continue
            if first_seen is None:
                first_seen = (path, value)
            elif first_seen[1] != value:
                raise ZeromonError(f"{first_seen[0]} and {path} are from different runs: {label} {first_seen[1]!r} "
                                   f"and {value!r}", hint=_DIFFERENT_RUNS_HINT_FOLDERS if several else _DIFFERENT_RUNS_HINT)


def read_run(run: RunDirs, progress: Callable[[int, int], None] | None = None) -> list[Recording]:
    """Read every rank file of a run's folder (or folders), ordered by rank; an error when they are not
    one run's. ``progress``: told (files read, files in all) as each is read."""
    from zeromon.model.rank_pool import map_rank_files

    recordings = map_rank_files(rank_files(run), read_recording, workers=1, progress=progress)  # in this process: kept here
    check_one_run([(r.path, r.header, r.run_info) for r in recordings])
    return sorted(recordings, key=lambda r: r.rank)
