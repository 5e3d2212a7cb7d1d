"""The recording's vocabulary: its format's name and version, the kind tag and field order of each
record type on the wire, the rank files' names, and a record's line.

The bottom of the recording format: the JSON-lines form (jsonl), the compact form (segments), a
recording read back (recording) and a run's files (run_files) are built on it, never the other way.
Stdlib only: the agent imports it into every training process.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from pathlib import Path
from typing import Any

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

FORMAT_NAME = "zeromon-recording"
FORMAT_VERSION = "1.4"  # 1.1: PhaseSpan.timing; StepSummary.comp_s, overlap_s, exposed_comm_s
# 1.2: CollectiveEvent.issue_s; the "agent" phase; exposed communication as the training thread's blocked time
# 1.3: the "run_end" record (how the rank ended); AgentStats.records_lost, bytes_lost
# 1.4: the "progress" record (where a rank stalled, or was when a signal stopped it)
FORMAT_MAJOR = FORMAT_VERSION.split(".")[0]

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
# A getter of each type's fields in wire order: one C call gives a record's values.
GETTERS: dict[type, operator.attrgetter[Any]] = {cls: operator.attrgetter(*names) for cls, names in FIELDS_OF.items()}


def rank_file_name(rank: int, suffix: str = ".jsonl") -> str:
    """A rank's file name: rank-<r>.jsonl (format 1.x), or with suffix ".zmr" the compact form (2.x)."""
    return f"rank-{rank}{suffix}"


# The suffixes of rank files, the compact form first: a folder's rank files are the names that match
# these, and which format a file holds is read from its first bytes (is_compact), not from its name.
RANK_FILE_SUFFIXES = (".zmr", ".jsonl")
COMPACT_MAGIC = b"\x89ZMR\r\n\x1a\n"  # PNG's trick: a text-mode transfer or a 7-bit channel breaks it visibly

def is_compact(path: Path) -> bool:
    """Whether a file holds the compact form (format 2.x), by its first bytes. False for a file that
    cannot be read: the JSON-lines reader says why."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(COMPACT_MAGIC)) == COMPACT_MAGIC
    except OSError:
        return False



def record_row(record: Record) -> list[Any]:
    """A record's line as values: its kind, then its fields in order."""
    return [KIND_OF[type(record)], *GETTERS[type(record)](record)]


def encode_record(record: Record) -> str:
    """One line (without the newline) for a record."""
    return _dumps(record_row(record))


# The kinds the agent writes by the hundred whose values are only numbers, strings, None and dicts of them:
# encode_line may write them with orjson.
_FAST_KINDS = frozenset({StepSummary, PhaseSpan, CollectiveEvent, MemorySample, AgentStats, DeviceSample})


def encode_line(record: Record) -> bytes:
    """encode_record's line as the compact writer keeps it in a segment (UTF-8, lone surrogates kept). The
    JSON-lines writer and ``zeromon export`` write json's own line, the bytes people grep.

    json's encoder takes an order of magnitude longer than orjson's on a step summary (a summary a step, on
    the agent's background thread: tests/bench/bench_recorder_cpu.py), so the kinds in _FAST_KINDS go through
    orjson where it is installed and the line it makes reads back as json's would: the same values, the floats
    in another spelling of the same shortest digits (``1e-9`` for ``1e-09``), other characters than ASCII as
    UTF-8 rather than escaped. Where it could differ, json writes the line: a value orjson refuses (an integer
    past 64 bits, a key that is not a string, a lone surrogate) and any line with a ``null`` in it (orjson
    writes NaN and infinities as null, which json writes as NaN and Infinity; a None, or the word in a string,
    takes the slower way to the same line). tests/test_codec.py holds them to the same values."""
    row = record_row(record)
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
