"""How a rank's recording ended, from the end of its file: the agent's last record, a RunEnd (format
1.3), or none when the process was killed or the file could not be written to its end.

Only the tail of the file is read (TAIL_BYTES; of a compact file, its last segment, found by walking
the segments' frames): the end record is the last line written, and the summary and the report need
it without reading a million collectives twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen
from zeromon.model.events import RunEnd
from zeromon.model.jsonl import read_header
from zeromon.model.kinds import KIND_OF, is_compact
from zeromon.model.recording import Recording
from zeromon.model.rows import MAX_LINE_CHARS
from zeromon.model.schema import record_check
from zeromon.model.segments import compact_tail_rows

TAIL_BYTES = 64 * 1024
_KIND = KIND_OF[RunEnd]
_FIELDS = tuple(f.name for f in dataclasses.fields(RunEnd))
_CHECK = record_check(RunEnd, _KIND)
# The header key by which a writer promises an end record (the agent does, from format 1.3): a file
# without the key (older, or written by other tools) that has none was not cut off.
PROMISE_KEY = "end_record"


@frozen
class FileEnd:
    """What the end of one rank file says."""

    rank: int
    end: RunEnd | None  # the end record; None: none at the end of the file
    expected: bool  # its writer promised one (PROMISE_KEY): its absence means it was cut off
    host: str | None  # from the header: where the rank ran
    pid: int | None
    running: bool | None  # its process still runs (this host only; None: not known)
    flush_interval_s: float | None  # how much of its end a killed rank may have lost
    # Without an end record, what the file's tail says of when the rank was last heard of: the latest time
    # and step among the records there (of a compact file, those its last segment holds as rows).
    last_record_ns: int | None = None
    last_step_in_tail: int | None = None


def _end_of(lines: list[bytes], names: list[str]) -> RunEnd | None:
    """The RunEnd among the last lines (after it, at most a part-written line), fields by the header's names."""
    for line in reversed(lines[-8:]):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # a cut line, or one nested past the parser's depth
            continue
        if not isinstance(row, list) or not row or row[0] != _KIND:
            continue
        values = dict(zip(names, row[1:], strict=False))
        fields: dict[str, Any] = {name: values.get(name) for name in _FIELDS}
        if _CHECK.problem(list(fields.values())) is not None:
            return None  # an end record of the wrong types says nothing to trust
        try:
            return RunEnd(**fields)
        except TypeError:
            return None
    return None


# The fields that hold a time, in the records that have one (every kind but run_info).
_TIME_FIELDS = ("t_ns", "end_ns", "complete_ns", "issue_ns", "start_ns")
_STEP_KIND = "step"


def _last_heard(lines: list[bytes], schemas: dict[str, Any]) -> tuple[int | None, int | None]:
    """The latest time and the latest step summarized among the tail's records (None: none there)."""
    last_ns: int | None = None
    last_step: int | None = None
    for line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(row, list) or not row or not isinstance(names := schemas.get(row[0]), list):
            continue
        values = dict(zip(names, row[1:], strict=False))
        times = [v for name in _TIME_FIELDS if type(v := values.get(name)) is int]
        if times:
            last_ns = max(last_ns or 0, *times)
        step = values.get("step")
        if row[0] == _STEP_KIND and type(step) is int:
            last_step = max(step, last_step if last_step is not None else step)
    return last_ns, last_step


def _process_running(host: Any, pid: Any) -> bool | None:
    if not isinstance(pid, int) or not isinstance(host, str) or pid <= 0:
        return None
    if host != os.uname().nodename:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def read_file_end(path: str | Path) -> FileEnd:
    """The end of one rank file. Raises OSError when it cannot be read, ZeromonError for a bad header."""
    path = Path(path)
    if is_compact(path):
        header, lines = compact_tail_rows(path)
        return _file_end(header, lines)
    with open(path, "rb") as handle:
        first = handle.readline(MAX_LINE_CHARS).decode("utf-8", "replace")
        header = read_header(path, first)
        size = os.fstat(handle.fileno()).st_size
        start = max(handle.tell(), size - TAIL_BYTES)
        handle.seek(start)
        lines = [line for line in handle.read().split(b"\n") if line.strip()]
    return _file_end(header, lines)


def _file_end(header: dict[str, Any], lines: list[bytes]) -> FileEnd:
    schemas = header.get("schemas", {})
    names = schemas.get(_KIND)
    end = _end_of(lines, names) if isinstance(names, list) else None
    flush = header.get("flush_interval_s")
    # Only a file without an end record needs its tail read for times: the end record has its own.
    last_ns, last_step = _last_heard(lines, schemas) if end is None else (None, None)
    return FileEnd(rank=int(header.get("rank", -1)), end=end, expected=header.get(PROMISE_KEY) is True,
                   host=header.get("host"), pid=header.get("pid"),
                   running=_process_running(header.get("host"), header.get("pid")) if end is None else False,
                   flush_interval_s=float(flush) if isinstance(flush, (int, float)) else None,
                   last_record_ns=last_ns, last_step_in_tail=last_step)


def recording_end(recording: Recording) -> FileEnd | None:
    """read_file_end of a read recording's file; None where it cannot be read (read_file_ends leaves it out).
    What `zeromon report` keeps of each rank beside its analysis (zeromon.sources.run_analysis): each
    worker reads the end of the file it has just read, so that the report's process does not read every
    rank's end again, one after another, after the analyses."""
    try:
        return read_file_end(recording.path)
    except (OSError, ValueError, ZeromonError):
        return None


def read_file_ends(paths: list[Path]) -> list[FileEnd]:
    """The ends of a run's rank files; a file that cannot be read is left out (its reader says why)."""
    ends = []
    for path in paths:
        try:
            ends.append(read_file_end(path))
        except (OSError, ValueError, ZeromonError):
            continue
    return ends
