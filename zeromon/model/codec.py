"""The recording format, as one import: the names of its modules that the rest of zeromon and its users
read and write recordings with.

The format's modules import one way, from the bottom: ``kinds`` (the format's vocabulary: record kinds,
field orders, file names, a record's line), ``rows`` (a file's rows checked and counted), ``jsonl`` (the
JSON-lines form: writer, header, lines), ``segments`` and ``segment_batches`` (the compact form),
``step_records``, ``recording`` (a rank's recording read back, either form), ``rank_pool`` and
``run_files`` (a run's files). This module imports them and nothing imports it within the format
(pyproject.toml's import contracts hold both).
"""

from zeromon.model.jsonl import NOT_A_RECORDING, RecordingWriter, open_recording, read_first_line, read_header
from zeromon.model.kinds import (
    COMPACT_MAGIC,
    FIELDS_OF,
    FORMAT_MAJOR,
    FORMAT_NAME,
    FORMAT_VERSION,
    GETTERS,
    KIND_OF,
    RANK_FILE_SUFFIXES,
    TYPE_OF,
    encode_line,
    encode_record,
    is_compact,
    json_default,
    make_header,
    orjson_module,
    rank_file_name,
    record_row,
)
from zeromon.model.recording import (
    CollectiveColumns,
    CollectiveEvents,
    Recording,
    export_lines,
    iter_fields,
    iter_records,
    read_file_header,
    read_recording,
)
from zeromon.model.rows import (
    LINE_ERRORS_KEPT,
    MAX_LINE_CHARS,
    UNKNOWN_KINDS_KEPT,
    Layout,
    SkippedLines,
    collector_paused,
    count_unknown,
    layout_of,
    layouts_of,
    parse_rows,
)
from zeromon.model.run_files import (
    RunDirs,
    check_one_run,
    missing_ranks_note,
    rank_file_path,
    rank_file_paths,
    rank_files,
    read_run,
    run_folders,
    run_headers,
    run_name,
)

__all__ = [
    "COMPACT_MAGIC", "FIELDS_OF", "FORMAT_MAJOR", "FORMAT_NAME", "FORMAT_VERSION", "GETTERS", "KIND_OF",
    "LINE_ERRORS_KEPT", "MAX_LINE_CHARS", "NOT_A_RECORDING", "RANK_FILE_SUFFIXES", "TYPE_OF", "UNKNOWN_KINDS_KEPT",
    "CollectiveColumns", "CollectiveEvents", "Layout", "Recording", "RecordingWriter", "RunDirs", "SkippedLines",
    "check_one_run", "collector_paused", "count_unknown", "encode_line", "encode_record", "export_lines", "is_compact",
    "iter_fields", "iter_records", "json_default", "layout_of", "layouts_of", "make_header", "missing_ranks_note",
    "open_recording", "orjson_module", "parse_rows", "rank_file_name", "rank_file_path", "rank_file_paths",
    "rank_files", "read_file_header", "read_first_line", "read_header", "read_recording", "read_run", "record_row",
    "run_folders", "run_headers", "run_name",
]
