"""The Parquet export's schema as plain data: one dataset per record kind of the recording format, and
``files`` (one row per rank file), each column with its type and unit. No pyarrow here: the writer
(zeromon.exporters.parquet) makes Arrow types of these words, and docs/parquet.md's tables are checked
against them (tests/test_parquet_export.py).

The columns are the record's fields in the recording format's order, with its units (times in
nanoseconds since the Unix epoch, sizes in bytes, durations in seconds), less ``rank``, which is the
partition (``rank=3`` in the path, as Hive, Spark, DuckDB and Polars read it), and after ``record``: the
record's place in its rank file, which orders a rank's records across kinds (the last ``run_info``
written is the one the report reads).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping

from zeromon.model.classes import frozen
from zeromon.model.kinds import KIND_OF

FORMAT_NAME = "zeromon-parquet"
# 1.0: the datasets of recording format 1.4. A new column is a minor version; a column renamed, retyped or
# dropped, a major one.
FORMAT_VERSION = "1.0"
METADATA_KEY = "zeromon"  # the key of each file's key-value metadata: a JSON object (file_metadata)
PARTITION = "rank"
RECORD = "record"

# The type words (Column.type): what docs/parquet.md says, and what the writer makes of each.
INT = "int64"
FLOAT = "float64"
BOOL = "bool"
TEXT = "string"
ENUM = "string (dictionary)"
JSON = "string (JSON)"
FLOAT_MAP = "map<string, float64>"
INT_MAP = "map<string, int64>"
INT_LIST = "list<int64>"
TEXT_BY_NUMBER = "map<int64, string>"

# The dataset of each record kind, by the recording format's kind tag.
DATASET_OF_KIND: dict[str, str] = {
    "collective": "collectives", "phase": "phases", "memory": "memory", "device": "device", "oom": "ooms",
    "step": "steps", "run_info": "run_info", "notice": "notices", "agent_stats": "agent_stats",
    "run_end": "run_ends", "progress": "progress",
}
FILES = "files"  # one row per rank file: its header and what the export skipped
# Strings that are text rather than one of a few values: not dictionary-encoded.
_FREE_TEXT = frozenset({"message", "detail", "write_error", "snapshot_path"})
_BYTES = frozenset({"bytes_in", "bytes_out", "comm_bytes", "peak_memory", "allocated", "reserved", "active",
                    "peak_allocated", "peak_reserved", "inactive_split", "capacity", "free", "rss", "mem_used",
                    "mem_total", "requested", "bytes_lost", "comm_bytes_by_op", "categories"})
_UNIT_SUFFIXES = (("_ns", "ns (Unix epoch)"), ("_bytes_s", "bytes/s"), ("_s", "s"), ("_pct", "%"), ("_w", "W"),
                  ("_c", "°C"))


@frozen
class Column:
    name: str
    type: str  # a type word above
    unit: str = ""  # "ns (Unix epoch)", "s", "bytes", ...; "" for a count, a number or a name
    nullable: bool = False


@frozen
class Dataset:
    name: str  # the folder: collectives/rank=3/part-0.parquet
    kind: str  # the recording format's kind tag ("collective"); "files" for the files dataset
    columns: tuple[Column, ...]

    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def unit_of(name: str) -> str:
    if name in _BYTES:
        return "bytes"
    return next((unit for suffix, unit in _UNIT_SUFFIXES if name.endswith(suffix)), "")


def _type_word(name: str, annotation: typing.Any) -> tuple[str, bool]:
    """(type word, nullable) of a record field's annotation."""
    nullable = False
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else typing.Any
    if typing.get_origin(annotation) in (Mapping, dict):
        value = typing.get_args(annotation)[1]
        word = FLOAT_MAP if value is float else INT_MAP if value is int else JSON
        return word, nullable
    words = {int: INT, float: FLOAT, bool: BOOL, str: TEXT if name in _FREE_TEXT else ENUM}
    return words.get(annotation, JSON), nullable


def _record_dataset(cls: type, kind: str) -> Dataset:
    hints = typing.get_type_hints(cls)
    columns = [Column(RECORD, INT)]
    for f in dataclasses.fields(cls):
        if f.name == PARTITION:
            continue
        word, nullable = _type_word(f.name, hints[f.name])
        columns.append(Column(f.name, word, unit_of(f.name), nullable))
    return Dataset(DATASET_OF_KIND[kind], kind, tuple(columns))


_FILES_COLUMNS = (
    Column("source", TEXT),  # the rank file's path, as given
    Column("form", ENUM),  # "compact" (rank-<r>.zmr, format 2.x) or "jsonl" (format 1.x)
    Column("recording_format", ENUM),  # the header's version: "2.1", "1.4"
    Column("attempt", INT, nullable=True),  # torchelastic's restart count when the rank started; null outside it
    Column("run_id", ENUM, nullable=True),
    Column("job", ENUM, nullable=True),
    Column("host", ENUM, nullable=True),
    Column("pid", INT, nullable=True),
    Column("world_size", INT, nullable=True),
    Column("created_unix_ns", INT, "ns (Unix epoch)", nullable=True),
    Column("flush_interval_s", FLOAT, "s", nullable=True),
    Column("end_record", BOOL, nullable=True),  # whether the agent ends the file with a run_end: none means killed
    Column("header", JSON),  # the whole header, but the compact form's layout (columns, dictionary)
    Column("records", INT),  # the records exported, every dataset together
    Column("skipped", INT_LIST),  # the records skipped as corrupt: line numbers (JSON lines), record numbers (compact)
    Column("skipped_reasons", TEXT_BY_NUMBER),  # what was wrong with some of them, by number
    Column("unknown_kinds", INT_MAP),  # records of kinds this zeromon does not know, counted by kind
)


@functools.cache
def datasets() -> tuple[Dataset, ...]:
    """Every dataset, the record kinds in the recording format's order, then ``files``."""
    return (*(_record_dataset(cls, kind) for cls, kind in KIND_OF.items()), Dataset(FILES, FILES, _FILES_COLUMNS))


def dataset(name: str) -> Dataset:
    return next(d for d in datasets() if d.name == name)


def file_metadata(data: Dataset, rank: int, source: str, recording_format: str) -> dict[str, typing.Any]:
    """The JSON object each file holds under METADATA_KEY: the schema's name and version, what the file
    is, and each column's type and unit."""
    return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "dataset": data.name, "record_kind": data.kind,
            "rank": rank, "source": source, "recording_format": recording_format,
            "partitioning": f"hive: {PARTITION}=<rank>",
            "columns": {c.name: {"type": c.type, "unit": c.unit} for c in data.columns}}
