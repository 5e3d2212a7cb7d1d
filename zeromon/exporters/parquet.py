"""`zeromon export --format parquet`: a run's recording as Parquet, one dataset per record kind, partitioned
by rank as Hive lays out tables (``OUT/collectives/rank=3/part-0.parquet``), for DuckDB, Polars, Spark and
the warehouses that load Parquet. The schema is zeromon.exporters.parquet_schema's; docs/parquet.md says
what each column is and writes `zeromon report`'s headline figures as queries over it.

Streaming: each rank file is read a record at a time (a compact segment's batch at most) and each kind's
rows are written as a row group every BATCH_ROWS rows, so that a worker holds one batch a kind whatever
the run's size; the ranks go to worker processes as `zeromon report`'s do (zeromon.model.rank_pool). The
export is written into a folder of its own inside OUT and its datasets moved into place at the end:
an export that fails, or is stopped, leaves nothing half-written in OUT.

pyarrow is an optional dependency (``zeromon[parquet]``), imported by the functions that write.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from types import ModuleType
from typing import Any

from zeromon.errors import ZeromonError
from zeromon.exporters import parquet_schema as schema
from zeromon.model.attempts import ATTEMPT_KEY, ATTEMPTS_DIR, earlier_attempts, rank_of_file
from zeromon.model.classes import frozen
from zeromon.model.codec import (
    FIELDS_OF,
    KIND_OF,
    RunDirs,
    is_compact,
    iter_fields,
    rank_file_paths,
    read_file_header,
    run_headers,
)
from zeromon.model.rank_pool import OnProgress, map_rank_files
from zeromon.model.rows import SkippedLines, collector_paused

INSTALL = "pip install 'zeromon[parquet]'"
BATCH_ROWS = 65_536  # rows of one kind gathered before they are written as a row group: ~50 MB of collectives
COMPRESSION = "zstd"
PART = "part-0.parquet"
_WORK_DIR = ".zeromon-export-partial"  # inside OUT while the export is written
_LAYOUT_KEYS = ("schemas", "columns", "dictionary")  # a header's layout of the records, not what the rank is


def pyarrow_modules() -> tuple[ModuleType, ModuleType]:
    """(pyarrow, pyarrow.parquet), or a ZeromonError with the line that installs them."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ZeromonError("--format parquet needs pyarrow, which is not installed", hint=INSTALL) from None
    return pyarrow, pyarrow.parquet


@functools.cache
def arrow_type(pa: ModuleType, word: str) -> Any:
    return {
        schema.INT: pa.int64(), schema.FLOAT: pa.float64(), schema.BOOL: pa.bool_(), schema.TEXT: pa.string(),
        schema.ENUM: pa.dictionary(pa.int32(), pa.string()), schema.JSON: pa.string(),
        schema.FLOAT_MAP: pa.map_(pa.string(), pa.float64()), schema.INT_MAP: pa.map_(pa.string(), pa.int64()),
        schema.INT_LIST: pa.list_(pa.int64()), schema.TEXT_BY_NUMBER: pa.map_(pa.int64(), pa.string()),
    }[word]


def arrow_schema(pa: ModuleType, data: schema.Dataset, metadata: dict[str, Any]) -> Any:
    """The dataset's Arrow schema, each column's unit in its field's metadata and ``metadata`` (file_metadata)
    under the file's METADATA_KEY."""
    fields = [pa.field(c.name, arrow_type(pa, c.type), nullable=c.nullable,
                       metadata={"unit": c.unit} if c.unit else None) for c in data.columns]
    return pa.schema(fields, metadata={schema.METADATA_KEY: json.dumps(metadata)})


@frozen
class RankExport:
    """What the export of one rank file wrote and skipped: small, sent back from its worker."""

    rank: int
    source: str
    rows: dict[str, int]  # by dataset, those with rows
    skipped: list[int] = field(default_factory=list)  # records skipped as corrupt (or too large for int64)
    reasons: dict[int, str] = field(default_factory=dict)


@frozen
class RunExport:
    out: Path
    ranks: tuple[RankExport, ...]  # the last attempt's (the run folder's own rank files), by rank
    attempts: dict[int, tuple[RankExport, ...]]  # earlier attempts kept in RUN/attempts/<n>, exported to OUT/attempts/<n>


@frozen
class _Kind:
    """How one record type's values become a dataset's row: the field positions kept (all but rank) and the
    defaults of trailing fields an older file's rows lack."""

    data: schema.Dataset
    kept: tuple[int, ...]
    defaults: tuple[Any, ...]


@functools.cache
def _kinds() -> dict[type, _Kind]:
    out = {}
    for cls, kind in KIND_OF.items():
        fields = dataclasses.fields(cls)
        defaults = tuple(f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                         for f in fields)
        kept = tuple(i for i, name in enumerate(FIELDS_OF[cls]) if name != schema.PARTITION)
        out[cls] = _Kind(schema.dataset(schema.DATASET_OF_KIND[kind]), kept, defaults)
    return out


class _RankWriter:
    """One rank's datasets as they are written: each kind's rows gathered, then written as a row group."""

    def __init__(self, root: Path, rank: int, source: str, header: dict[str, Any]) -> None:
        self.pa, self.pq = pyarrow_modules()
        self.root, self.rank, self.source = root, rank, source
        self.recording_format = str(header.get("version", ""))
        self.rows: dict[type, list[list[Any]]] = {cls: [] for cls in KIND_OF}
        self.writers: dict[str, Any] = {}
        self.counts: dict[str, int] = {}
        self.skipped = SkippedLines([], {})

    def add(self, cls: type, values: list[Any], number: int) -> None:
        values.append(number)
        rows = self.rows[cls]
        rows.append(values)
        if len(rows) >= BATCH_ROWS:
            self.flush(cls)

    def flush(self, cls: type) -> None:
        rows = self.rows[cls]
        if not rows:
            return
        kind = _kinds()[cls]
        width = len(kind.defaults)
        for row in rows:
            if len(row) <= width:  # an older file's row lacks trailing fields: their defaults, before its number
                row[-1:-1] = kind.defaults[len(row) - 1:]
        try:
            batch = self._batch(kind, rows)
        except (OverflowError, self.pa.ArrowInvalid):  # an integer past int64 (the format takes up to 2**64)
            batch = self._batch(kind, self._fitting(kind, rows))
        self.write(kind.data, batch)
        rows.clear()

    def _batch(self, kind: _Kind, rows: list[list[Any]]) -> Any:
        columns = list(zip(*rows, strict=True))
        values = [columns[-1], *(columns[i] for i in kind.kept)]
        arrays = [self.array(column.type, data) for column, data in zip(kind.data.columns, values, strict=True)]
        return self.pa.RecordBatch.from_arrays(arrays, schema=self.file_schema(kind.data))

    def array(self, word: str, values: tuple[Any, ...]) -> Any:
        if word == schema.JSON:
            values = tuple(json.dumps(value, separators=(",", ":"), default=str) for value in values)
        return self.pa.array(values, type=arrow_type(self.pa, word))

    def _fitting(self, kind: _Kind, rows: list[list[Any]]) -> list[list[Any]]:
        """The rows whose integers fit int64; the others skipped and said, as the readers skip a corrupt record."""
        ints = [(i, column) for i, column in zip(kind.kept, kind.data.columns[1:], strict=True)
                if column.type in (schema.INT, schema.INT_MAP)]
        kept = []
        for row in rows:
            bad = next((column.name for i, column in ints if not _fits(row[i])), None)
            if bad is None:
                kept.append(row)
            else:
                self.skipped.add(row[-1], f"{kind.data.kind}.{bad} does not fit a 64-bit signed integer")
        return kept

    def file_schema(self, data: schema.Dataset) -> Any:
        metadata = schema.file_metadata(data, self.rank, self.source, self.recording_format)
        return arrow_schema(self.pa, data, metadata)

    def write(self, data: schema.Dataset, batch: Any) -> None:
        try:
            writer = self.writers.get(data.name)
            if writer is None:
                folder = self.root / data.name / f"{schema.PARTITION}={self.rank}"
                folder.mkdir(parents=True, exist_ok=True)
                writer = self.writers[data.name] = self.pq.ParquetWriter(folder / PART, batch.schema,
                                                                         compression=COMPRESSION)
            writer.write_batch(batch)
        except OSError as exc:  # a full disk, a folder removed: said as --out's, not as the rank file's
            raise WriteError(f"{data.name} of rank {self.rank}: {exc.strerror or exc}") from None
        self.counts[data.name] = self.counts.get(data.name, 0) + batch.num_rows

    def flush_all(self) -> None:
        for cls in self.rows:
            self.flush(cls)

    def close(self) -> None:
        """Every file closed (its footer written), the first that fails said after."""
        writers, self.writers = self.writers, {}
        failed = None
        for name, writer in writers.items():
            try:
                writer.close()
            except OSError as exc:
                failed = failed or WriteError(f"{name} of rank {self.rank}: {exc.strerror or exc}")
        if failed is not None:
            raise failed


def _fits(value: Any) -> bool:
    if isinstance(value, dict):
        return all(map(_fits, value.values()))
    return type(value) is not int or -(2**63) <= value < 2**63


class WriteError(OSError):
    """Writing the export failed (export_run says it as --out's); any other OSError of a worker is its rank file's."""


def export_rank_file(path: Path, root: Path) -> RankExport:
    """One rank file's records into ``root``'s datasets (and its row of ``files``); a worker's part."""
    try:
        return _export_rank_file(path, root)
    except WriteError:
        raise
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _export_rank_file(path: Path, root: Path) -> RankExport:
    header = read_file_header(path)
    rank = header["rank"] if type(header.get("rank")) is int else rank_of_file(path)
    if rank < 0:
        raise ZeromonError(f"{path}: no rank in its header or its name (rank-<r>.zmr)")
    writer = _RankWriter(root, rank, str(path), header)
    unknown: dict[str, int] = {}
    add = writer.add
    try:
        with collector_paused():
            for cls, values, number in iter_fields(path, writer.skipped, unknown):
                add(cls, values, number)
            writer.flush_all()
        skipped = sorted(writer.skipped.lines or [])
        reasons = dict(sorted((writer.skipped.errors or {}).items()))
        rows = dict(writer.counts)
        writer.write(schema.dataset(schema.FILES), _file_row(writer, path, header, skipped, reasons, unknown))
    finally:
        writer.close()
    return RankExport(rank, str(path), rows, skipped, reasons)


def _file_row(writer: _RankWriter, path: Path, header: dict[str, Any], skipped: list[int],
              reasons: dict[int, str], unknown: dict[str, int]) -> Any:
    """The rank file's row of ``files``: its header, and what was exported and skipped."""
    data = schema.dataset(schema.FILES)

    def typed(key: str, kind: type) -> Any:
        value = header.get(key)
        return value if type(value) is kind or (kind is float and type(value) is int) else None

    row = {
        "source": str(path), "form": "compact" if is_compact(path) else "jsonl",
        "recording_format": writer.recording_format, "attempt": typed(ATTEMPT_KEY, int),
        "run_id": typed("run_id", str), "job": typed("job", str), "host": typed("host", str),
        "pid": typed("pid", int), "world_size": typed("world_size", int),
        "created_unix_ns": typed("created_unix_ns", int), "flush_interval_s": typed("flush_interval_s", float),
        "end_record": typed("end_record", bool),
        "header": {k: v for k, v in header.items() if k not in _LAYOUT_KEYS},
        "records": sum(writer.counts.values()), "skipped": skipped, "skipped_reasons": list(reasons.items()),
        "unknown_kinds": list(unknown.items()),
    }
    arrays = [writer.array(c.type, (row[c.name],)) for c in data.columns]
    return writer.pa.RecordBatch.from_arrays(arrays, schema=writer.file_schema(data))


def _empty_files(root: Path, rank: int) -> None:
    """A file of no rows for each dataset no rank had records of, so that a query over it reads as empty
    rather than failing for want of files."""
    pa, pq = pyarrow_modules()
    for data in schema.datasets():
        if not (root / data.name).exists():
            folder = root / data.name / f"{schema.PARTITION}={rank}"
            folder.mkdir(parents=True)
            table_schema = arrow_schema(pa, data, schema.file_metadata(data, rank, "", ""))
            pq.write_table(table_schema.empty_table(), folder / PART, compression=COMPRESSION)


def target_names(out: Path, with_attempts: bool) -> list[Path]:
    """What an export writes in OUT: a folder per dataset, and attempts/ for a restarted run's earlier attempts."""
    return [out / d.name for d in schema.datasets()] + ([out / ATTEMPTS_DIR] if with_attempts else [])


def export_run(run: RunDirs, out: Path, workers: int | None = None, progress: OnProgress | None = None) -> RunExport:
    """Every rank file of the run (its folders: run_headers) into OUT's datasets, and each earlier attempt a
    restarted run keeps (RUN/attempts/<n>) into OUT/attempts/<n>'s. Refuses, before writing anything, an OUT
    that already holds one of the folders it would write (nothing is overwritten)."""
    if importlib.util.find_spec("pyarrow") is None:
        pyarrow_modules()  # its error, with the install line; imported here, it would be before the workers fork
    files = [path for path, _ in run_headers(run)]  # the headers checked, not held (~26 KB each, compact)
    attempts = earlier_attempts(run)
    existing = [path for path in target_names(out, bool(attempts)) if path.exists()]
    if existing:
        raise ZeromonError(f"--out {out}: {existing[0]} exists (nothing is overwritten)",
                           hint="give an empty or new folder")
    work = out / _WORK_DIR
    plan = [(work, files)]
    plan += [(work / ATTEMPTS_DIR / str(a.number),
              sorted((p for f in a.folders for p in rank_file_paths(f)), key=rank_of_file)) for a in attempts]
    total = sum(len(files) for _, files in plan)
    made, finished = not out.exists(), False
    done: list[tuple[RankExport, ...]] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        if work.exists():  # left by an export that was killed
            shutil.rmtree(work)
        for root, files in plan:
            exported = map_rank_files(files, functools.partial(export_rank_file, root=root), workers,
                                      _offset(progress, sum(map(len, done)), total), doing="exporting")
            done.append(tuple(sorted(exported, key=lambda r: r.rank)))
        for (root, _), ranks in zip(plan, done, strict=True):  # pyarrow in this process once no worker is to fork
            _empty_files(root, ranks[0].rank)
        for path in target_names(out, bool(attempts)):
            os.replace(work / path.name, path)
        finished = True
    except OSError as exc:
        raise ZeromonError(f"--out {out}: cannot write: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if made and not finished:  # an export that did not finish leaves no folder it made
            shutil.rmtree(out, ignore_errors=True)
    return RunExport(out, done[0], {a.number: ranks for a, ranks in zip(attempts, done[1:], strict=True)})


def _offset(progress: OnProgress | None, before: int, total: int) -> Callable[[int, int], None] | None:
    """``progress`` told of one pass of several as of the whole: (before + done, total)."""
    if progress is None:
        return None
    return lambda done, _: progress(before + done, total)
