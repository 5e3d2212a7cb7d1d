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

import dataclasses
import gc
import json
import operator
import shlex
from collections.abc import Callable, Iterator, Sequence
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
    Record,
    RunInfo,
    StepSummary,
)

FORMAT_NAME = "zeromon-recording"
FORMAT_VERSION = "1.2"  # 1.1: PhaseSpan.timing; StepSummary.comp_s, overlap_s, exposed_comm_s
# 1.2: CollectiveEvent.issue_s; the "agent" phase; exposed communication as the training thread's blocked time
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
}
TYPE_OF: dict[str, type] = {kind: cls for cls, kind in KIND_OF.items()}
FIELDS_OF: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in KIND_OF
}
_GETTERS: dict[type, operator.attrgetter[Any]] = {cls: operator.attrgetter(*names) for cls, names in FIELDS_OF.items()}


def rank_file_name(rank: int) -> str:
    return f"rank-{rank}.jsonl"


def encode_record(record: Record) -> str:
    """One line (without the newline) for a record."""
    cls = type(record)
    return _dumps([KIND_OF[cls], *_GETTERS[cls](record)])


def _json_default(value: Any) -> Any:
    """Values json cannot encode by itself."""
    # Enum members are str subclasses and serialize by value; this catches Mapping proxies and the
    # odd numpy scalar a user's config may carry into RunInfo.knobs.
    if hasattr(value, "items"):
        return dict(value.items())
    if hasattr(value, "item"):
        return value.item()
    return str(value)


_dumps = json.JSONEncoder(separators=(",", ":"), default=_json_default).encode


def make_header(rank: int, **extra: Any) -> dict[str, Any]:
    header: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "rank": rank,
        "schemas": {KIND_OF[cls]: list(names) for cls, names in FIELDS_OF.items()},
    }
    header.update(extra)
    return header


class RecordingWriter:
    """Writes one rank's recording. Not thread-safe: the agent's writer thread owns it."""

    def __init__(self, path: str | Path, rank: int, **header_extra: Any) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self._file.write(json.dumps(make_header(rank, **header_extra), separators=(",", ":")) + "\n")
        self.records_written = 0

    def write(self, record: Record) -> None:
        if self._file is None:
            return
        self._file.write(encode_record(record) + "\n")
        self.records_written += 1

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None


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
    steps: list[StepSummary] = field(default_factory=list)
    run_info: RunInfo | None = None  # the last one written: detection improves as the run goes
    notices: list[Notice] = field(default_factory=list)
    stats: AgentStats | None = None  # the last one written
    corrupt_lines: list[int] = field(default_factory=list)
    unknown_kinds: dict[str, int] = field(default_factory=dict)

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


def _layout(kind: str, names: list[str]) -> _Layout | None:
    """How to read rows of a kind written with these field names; None for an unknown kind."""
    cls = TYPE_OF.get(kind)
    if cls is None:
        return None
    position = {name: i + 1 for i, name in enumerate(names)}  # +1: row[0] is the kind tag
    wanted = FIELDS_OF[cls]
    indices: list[int | None] = [position.get(name) for name in wanted]
    same = indices == list(range(1, len(wanted) + 1))  # the common case: this version's own layout
    return _Layout(cls=cls, width=len(wanted) + 1, required=_required_fields(cls), indices=None if same else indices)


def read_header(path: Path, first_line: str) -> dict[str, Any]:
    try:
        header = json.loads(first_line)
    except json.JSONDecodeError as exc:
        raise ZeromonError(
            f"{path}:1: not a zeromon recording (the header line is not JSON: {exc.msg})",
            hint="recordings are the rank-<r>.jsonl files that `zeromon run` writes",
        ) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise ZeromonError(
            f"{path}:1: not a zeromon recording (no '{FORMAT_NAME}' header)",
            hint="recordings are the rank-<r>.jsonl files that `zeromon run` writes",
        )
    version = str(header.get("version", ""))
    if version.split(".")[0] != _MAJOR:
        raise ZeromonError(
            f"{path}: recording format version {version or '(none)'} is not supported; "
            f"this zeromon reads version {_MAJOR}.x",
            hint="read it with the zeromon version that wrote it, or upgrade zeromon",
        )
    if not isinstance(header.get("schemas"), dict):
        raise ZeromonError(f"{path}:1: the recording header has no 'schemas' object")
    return header


def _fast_loads() -> Callable[[str], Any]:
    """orjson's loads, ~5x faster per line than json's, where it is installed. Imported here, by
    readers only: the agent's process imports this module to write and needs no more than the stdlib."""
    try:
        import orjson
    except ImportError:  # a dependency, but a bare install still reads, at json's pace
        return json.loads
    loads: Callable[[str], Any] = orjson.loads
    return loads


def _iter_fields(path: Path, corrupt_lines: list[int] | None,
                 unknown_kinds: dict[str, int] | None) -> Iterator[tuple[type, list[Any]]]:
    """(record type, field values) for every decodable line of one rank file, after its header."""
    try:
        handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot open recording: {exc.strerror}") from None
    with handle:
        first = handle.readline()
        if not first:
            raise ZeromonError(f"{path}: the recording is empty (no header line)")
        header = read_header(path, first)
        layouts = {kind: _layout(kind, names) for kind, names in header["schemas"].items()}
        fast_loads = _fast_loads()
        # Per line: ~0.3 µs in orjson and as little as possible besides (a million lines per file).
        for lineno, line in enumerate(handle, start=2):
            try:
                try:
                    row = fast_loads(line)
                except ValueError:  # NaN, integers past 64 bits, lone surrogates: what only json reads
                    row = json.loads(line)
                layout = layouts.get(row[0])
            except (ValueError, IndexError, KeyError, TypeError):
                if line.strip() and corrupt_lines is not None:
                    corrupt_lines.append(lineno)
                continue
            if layout is None:
                if unknown_kinds is not None:
                    unknown_kinds[str(row[0])] = unknown_kinds.get(str(row[0]), 0) + 1
                continue
            indices = layout.indices
            if indices is None:
                values = row[1:layout.width]
                if len(values) < layout.required:
                    if corrupt_lines is not None:
                        corrupt_lines.append(lineno)
                    continue
            else:
                values = [row[i] if i is not None and i < len(row) else None for i in indices]
            yield layout.cls, values


def iter_records(path: str | Path, corrupt_lines: list[int] | None = None,
                 unknown_kinds: dict[str, int] | None = None) -> Iterator[Record]:
    """Stream the records of one rank file, after checking its header.

    Line numbers of lines that cannot be decoded are appended to ``corrupt_lines``.
    """
    for cls, values in _iter_fields(Path(path), corrupt_lines, unknown_kinds):
        yield cls(*values)  # type: ignore[misc]


# Collectives are gathered as rows and turned into columns and events this many at a time: the rows
# of a whole million-event file would cost ~200 MB more at the peak.
_CHUNK_ROWS = 50_000


def read_recording(path: str | Path) -> Recording:
    """Read one rank file whole (its collectives as CollectiveEvents: columns, events on demand)."""
    path = Path(path)
    with open(path, encoding="utf-8", errors="replace") as handle:
        header = read_header(path, handle.readline() or "")
    rec = Recording(path=path, header=header)
    sinks: dict[type, Callable[[Any], None]] = {
        PhaseSpan: rec.phases.append,
        MemorySample: rec.memory.append,
        DeviceSample: rec.device.append,
        OomEvent: rec.ooms.append,
        StepSummary: rec.steps.append,
        Notice: rec.notices.append,
    }
    columns: list[list[Any]] = [[] for _ in _COLLECTIVE_FIELDS]
    interned: dict[str, str] = {}
    rows: list[list[Any]] = []

    def flush_rows() -> None:
        chunk = list(zip(*rows, strict=True))
        for i in _INTERNED_COLUMNS:
            try:
                chunk[i] = tuple(map(interned.setdefault, chunk[i], chunk[i]))
            except TypeError:  # an unhashable value where a string belongs: kept as it was
                pass
        for column, values in zip(columns, chunk, strict=True):
            column.extend(values)
        rows.clear()

    width = len(_COLLECTIVE_FIELDS)
    with collector_paused():
        for cls, values in _iter_fields(path, rec.corrupt_lines, rec.unknown_kinds):
            if cls is CollectiveEvent:
                if len(values) < width:  # the optional wait_ns, absent: its default is None
                    values.extend([None] * (width - len(values)))
                rows.append(values)
                if len(rows) >= _CHUNK_ROWS:
                    flush_rows()
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
    return rec


def _rank_in_name(path: Path) -> int | None:
    """r of a file named rank-<r>.jsonl; None for another name the folder's glob matched."""
    number = path.name.removeprefix("rank-").removesuffix(".jsonl")
    return int(number) if number.isdigit() else None


def run_headers(run_dir: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each rank file of a run folder with its header, checked to be one run's (check_one_run):
    an error naming the folder when it is not one or holds no rank file. Only the first line of
    each file is read."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        raise ZeromonError(f"{run_dir}: is a file; a run is the folder of rank-<r>.jsonl files",
                           hint=f"pass the folder that holds it: {run_dir.parent}")
    if not run_dir.is_dir():
        raise ZeromonError(f"{run_dir}: no such run folder")
    files = sorted(run_dir.glob("rank-*.jsonl"))
    if not files:
        traces = [*run_dir.glob("*.json"), *run_dir.glob("*.json.gz")]  # PyTorch profiler traces, likely
        raise ZeromonError(
            f"{run_dir}: no rank-<r>.jsonl recordings in this folder"
            + (f"; it holds {len(traces)} .json/.json.gz file{'s' if len(traces) != 1 else ''}, profiler "
               "traces?" if traces else ""),
            hint=f"for PyTorch profiler traces: zeromon report --trace {shlex.quote(str(run_dir))}" if traces
            else "record a run with `zeromon run --out DIR -- CMD ...`",
        )
    headers = []
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                first = handle.readline()
        except OSError as exc:
            raise ZeromonError(f"{path}: cannot open recording: {exc.strerror}") from None
        if not first:
            raise ZeromonError(f"{path}: the recording is empty (no header line)")
        headers.append((path, read_header(path, first)))
    check_one_run([(path, header, None) for path, header in headers])
    return headers


def rank_files(run_dir: str | Path) -> list[Path]:
    """The rank files of a run folder, checked to be one run's (run_headers)."""
    return [path for path, _ in run_headers(run_dir)]


# What makes rank files one run's: each a value in the header (written by the agent at start) or in
# the run's RunInfo. A value missing from a file (an older or hand-made one) is not compared.
_IDENTITY = (("job", "job"), ("world_size", "world size"), ("framework", "framework"))
_DIFFERENT_RUNS_HINT = ("a run folder holds the rank files of one run (the --out of one `zeromon run`): "
                        "move the other run's files to a folder of their own")


def _identity(header: dict[str, Any], info: RunInfo | None) -> dict[str, Any]:
    values = {key: header.get(key) for key, _ in _IDENTITY}
    if info is not None:
        values["job"] = values["job"] or info.job
        values["world_size"] = values["world_size"] or info.world_size
        # "unknown": not yet detected (a rank that stopped early), so it tells runs apart by nothing.
        values["framework"] = info.framework if info.framework != "unknown" else None
    return values


def check_one_run(files: Sequence[tuple[Path, dict[str, Any], RunInfo | None]]) -> None:
    """Refuse rank files that are not one run's, naming them: a header's rank that is not the one
    in the file's name (a copied or renamed file), two files of one rank, or a job, world size or
    framework that differs between files (two runs' files in one folder). Every analysis would
    otherwise match one run's collectives against another's and report stragglers that are not.

    ``files``: each file with its header and, where read, its RunInfo (None: the header alone)."""
    by_rank: dict[int, Path] = {}
    first_seen: dict[str, tuple[Path, Any]] = {}
    for path, header, info in files:
        rank = header.get("rank")
        named = _rank_in_name(path)
        if named is not None and rank is not None and rank != named:
            raise ZeromonError(f"{path}: the header says rank {rank}, the file name rank {named}",
                               hint="a rank file keeps the name `zeromon run` gave it: was it copied or renamed?")
        if isinstance(rank, int):
            if rank in by_rank:
                raise ZeromonError(f"{by_rank[rank]} and {path} are both rank {rank}",
                                   hint="keep one recording per rank in a run folder (several runs mixed?)")
            by_rank[rank] = path
        for key, value in _identity(header, info).items():
            if value is None:
                continue
            seen = first_seen.setdefault(key, (path, value))
            if seen[1] != value:
                label = dict(_IDENTITY)[key]
                raise ZeromonError(f"{seen[0]} and {path} are from different runs: {label} {seen[1]!r} and "
                                   f"{value!r}", hint=_DIFFERENT_RUNS_HINT)


def read_run(run_dir: str | Path) -> list[Recording]:
    """Read every rank file of a run folder, ordered by rank; an error when they are not one run's."""
    recordings = [read_recording(f) for f in rank_files(run_dir)]
    check_one_run([(r.path, r.header, r.run_info) for r in recordings])
    return sorted(recordings, key=lambda r: r.rank)
