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
import json
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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
FORMAT_VERSION = "1.0"
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


@dataclass(slots=True)
class Recording:
    """One rank's recording, read back."""

    path: Path
    header: dict[str, Any]
    collectives: list[CollectiveEvent] = field(default_factory=list)
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


def _decoder_for(kind: str, names: list[str]) -> Callable[[list[Any]], Record] | None:
    cls = TYPE_OF.get(kind)
    if cls is None:
        return None
    position = {name: i + 1 for i, name in enumerate(names)}  # +1: row[0] is the kind tag
    wanted = FIELDS_OF[cls]
    indices = [position.get(name) for name in wanted]
    if indices == list(range(1, len(wanted) + 1)):  # the common case: this version's own layout

        def decode_same(row: list[Any]) -> Record:
            return cls(*row[1 : len(wanted) + 1])  # type: ignore[no-any-return]

        return decode_same

    def decode_mapped(row: list[Any]) -> Record:
        return cls(*[row[i] if i is not None and i < len(row) else None for i in indices])  # type: ignore[no-any-return]

    return decode_mapped


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


def iter_records(path: str | Path, corrupt_lines: list[int] | None = None,
                 unknown_kinds: dict[str, int] | None = None) -> Iterator[Record]:
    """Stream the records of one rank file, after checking its header.

    Line numbers of lines that cannot be decoded are appended to ``corrupt_lines``.
    """
    path = Path(path)
    try:
        handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot open recording: {exc.strerror}") from None
    with handle:
        first = handle.readline()
        if not first:
            raise ZeromonError(f"{path}: the recording is empty (no header line)")
        header = read_header(path, first)
        decoders = {kind: _decoder_for(kind, names) for kind, names in header["schemas"].items()}
        loads = json.loads
        for lineno, line in enumerate(handle, start=2):
            try:
                row = loads(line)
                decoder = decoders.get(row[0])
            except (ValueError, IndexError, KeyError, TypeError):
                if line.strip() and corrupt_lines is not None:
                    corrupt_lines.append(lineno)
                continue
            if decoder is None:
                if unknown_kinds is not None:
                    unknown_kinds[str(row[0])] = unknown_kinds.get(str(row[0]), 0) + 1
                continue
            try:
                yield decoder(row)
            except TypeError:
                if corrupt_lines is not None:
                    corrupt_lines.append(lineno)


def read_recording(path: str | Path) -> Recording:
    """Read one rank file whole."""
    path = Path(path)
    with open(path, encoding="utf-8", errors="replace") as handle:
        header = read_header(path, handle.readline() or "")
    rec = Recording(path=path, header=header)
    sinks: dict[type, Callable[[Any], None]] = {
        CollectiveEvent: rec.collectives.append,
        PhaseSpan: rec.phases.append,
        MemorySample: rec.memory.append,
        DeviceSample: rec.device.append,
        OomEvent: rec.ooms.append,
        StepSummary: rec.steps.append,
        Notice: rec.notices.append,
    }
    for record in iter_records(path, rec.corrupt_lines, rec.unknown_kinds):
        sink = sinks.get(type(record))
        if sink is not None:
            sink(record)
        elif isinstance(record, RunInfo):
            rec.run_info = record
        elif isinstance(record, AgentStats):
            rec.stats = record
    return rec


def read_run(run_dir: str | Path) -> list[Recording]:
    """Read every rank file of a run folder, ordered by rank."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ZeromonError(f"{run_dir}: no such run folder")
    files = sorted(run_dir.glob("rank-*.jsonl"))
    if not files:
        raise ZeromonError(
            f"{run_dir}: no rank-<r>.jsonl recordings in this folder",
            hint="record a run with `zeromon run --out DIR -- CMD ...`",
        )
    recordings = [read_recording(f) for f in files]
    return sorted(recordings, key=lambda r: r.rank)
