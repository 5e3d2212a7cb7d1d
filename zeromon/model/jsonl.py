"""The JSON-lines form of a recording (format 1.x, rank-<r>.jsonl): its writer, and the reading of its
header and lines.

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
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from zeromon.errors import ZeromonError
from zeromon.model.events import Record, RunEnd
from zeromon.model.kinds import FORMAT_MAJOR, FORMAT_NAME, encode_record, make_header
from zeromon.model.rows import MAX_LINE_CHARS, SkippedLines, layouts_of, parse_rows
from zeromon.model.schema import show

NOT_A_RECORDING = "recordings are the rank-<r>.zmr (or .jsonl) files that `zeromon run` writes"

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
            lost = (self.records_lost, self.bytes_lost)
            self.write(end)
            self.flush()
            if self._file is None:  # the disk filled at this last flush, and the end record went with it
                end = _counted(end, self.records_lost - lost[0] - 1, self.bytes_lost - lost[1], self.error)
                self.records_lost -= 1  # the end record itself is written after all, below
                self._append_after_failure(end)
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
        end = _counted(end, self.records_lost - lost[0], self.bytes_lost - lost[1], self.error)
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



def open_recording(path: Path) -> IO[str]:
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
                           f"{MAX_LINE_CHARS:,} characters)", hint=NOT_A_RECORDING)
    return first


def read_header(path: Path, first_line: str, major: str = FORMAT_MAJOR) -> dict[str, Any]:
    try:
        header = json.loads(first_line)
    except (json.JSONDecodeError, RecursionError) as exc:
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deep"
        raise ZeromonError(f"{path}:1: not a zeromon recording (the header line is not JSON: {why})",
                           hint=NOT_A_RECORDING) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise ZeromonError(f"{path}:1: not a zeromon recording (no '{FORMAT_NAME}' header)", hint=NOT_A_RECORDING)
    version = str(header.get("version", ""))
    if version.split(".")[0] != major:
        raise ZeromonError(
            f"{path}: recording format version {_plain(version) or '(none)'} is not supported; "
            f"this zeromon reads version {major}.x in a {'compact' if major != FORMAT_MAJOR else 'JSON-lines'} file",
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



_TOO_LONG = f"longer than {MAX_LINE_CHARS:,} characters, not read"


def iter_jsonl_fields(path: Path, skipped: SkippedLines, unknown_kinds: dict[str, int] | None,
                      checked_by_caller: type | None = None) -> Iterator[tuple[type, list[Any], int]]:
    """recording.iter_fields for a JSON-lines file: (record type, values, line number) of each line after
    the header that holds a record of a known kind whose values fit its schema."""
    handle = open_recording(path)
    try:
        header = read_header(path, read_first_line(path, handle))
    except BaseException:
        handle.close()
        raise
    return parse_rows(_numbered_lines(handle, skipped), layouts_of(header, checked_by_caller), skipped, unknown_kinds)


def _numbered_lines(handle: IO[str], skipped: SkippedLines) -> Iterator[tuple[int, str]]:
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


def _counted(end: Record, records: int, nbytes: int, error: str | None) -> Record:
    """A RunEnd that counts ``records`` and ``nbytes`` more as lost, and says why the writing stopped (the end
    records the agent makes before closing know nothing of what closing itself lost); other records as they are."""
    if not isinstance(end, RunEnd):
        return end
    return dataclasses.replace(end, records_lost=end.records_lost + max(0, records),
                               bytes_lost=end.bytes_lost + max(0, nbytes), write_error=end.write_error or error)
