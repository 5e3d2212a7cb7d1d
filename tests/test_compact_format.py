"""The compact recording format (2.0, rank-<r>.zmr): what it reads back is what format 1.3's JSON lines
give, whatever the records; a reader of a file being written stops at its partial last segment; a
damaged segment is skipped and counted, naming its byte offset; `zeromon export` gives the JSON-lines
writer's bytes; and the agent writes it by default, which `summary` and `report` read."""

from __future__ import annotations

import collections
import json
import os
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_reader_properties import INT64, KINDS, PROPERTIES, _checked, _valid_value, _wrong_value

from zeromon.cli import main
from zeromon.model.codec import (
    COMPACT_MAGIC,
    FORMAT_VERSION,
    Recording,
    RecordingWriter,
    iter_records,
    read_file_header,
    read_recording,
    read_run,
    run_headers,
)
from zeromon.model.columnar import SPECS
from zeromon.model.events import (
    MEMORY_CATEGORIES,
    CollectiveEvent,
    MemorySample,
    PhaseSpan,
    Record,
    RunEnd,
    StepSummary,
)
from zeromon.model.recording import export_lines
from zeromon.model.run_end import read_file_end
from zeromon.model.schema import FieldType, field_types
from zeromon.model.segments import (
    COMPACT_VERSION,
    FRAME,
    KIND_RECORDS,
    SECTIONS,
    CompactWriter,
    _frame,
    _inflate,
    dictionary_of,
    header_of,
    iter_frames,
)
from zeromon_agent.context.config import load_config

from conftest import EXAMPLES, child_env, ranks_args, zeromon

HEADER = {"job": "j", "world_size": 2, "end_record": True, "flush_interval_s": 0.2}
FORMAT_2_0 = Path(__file__).parent / "data" / "compact-2.0"
_KEPT = ("collectives", "phases", "memory", "device", "ooms", "steps", "notices", "run_info", "stats",
         "unknown_kinds")


_int_value = st.integers(*INT64) | st.integers(0, 2**62) | st.sampled_from([-(2**63), 2**63 - 1, 0])
# A memory sample's categories: MEMORY_CATEGORIES' names in any order (the agent's is its walk's), or now and
# then a name, or a value, that the columns do not take.
_categories = st.dictionaries(st.sampled_from(MEMORY_CATEGORIES), _int_value | st.integers(0, 2**34), max_size=11) \
    | st.dictionaries(st.sampled_from(MEMORY_CATEGORIES) | st.text(max_size=8),
                      _int_value | st.booleans() | st.none() | st.just(0.5), max_size=3)


def _column_value(t: type) -> st.SearchStrategy[Any]:
    """Values the columns take (seconds in whole nanoseconds), near the 64-bit edges too, and NaN."""
    return {int: _int_value, float: st.integers(-10**15, 10**15).map(lambda k: k / 1e9) | st.just(float("nan")),
            bool: st.booleans(), str: st.text(max_size=8) | st.sampled_from(["forward", "all_gather"]),
            type(None): st.none(), dict: _categories}[t]


def _columnar_value(f: FieldType) -> st.SearchStrategy[Any]:
    assert f.accepts is not None
    return st.one_of(*(_column_value(t) for t in sorted(f.accepts, key=str)))


@st.composite
def records(draw: st.DrawFn) -> Record:
    """Any record of any kind: a collective, phase or memory sample mostly of values the columns take;
    sometimes a value of a type its schema refuses (the readers skip the record, in both forms alike)."""
    cls, kind = draw(st.sampled_from(KINDS + [(CollectiveEvent, "collective"), (PhaseSpan, "phase"),
                                              (MemorySample, "memory")] * 3))
    fields = field_types(cls, kind)
    columnar = cls in SPECS and draw(st.integers(0, 3)) > 0
    values = [draw(_columnar_value(f) if columnar else _valid_value(f)) for f in fields]
    if draw(st.integers(0, 11)) == 0:
        i = draw(st.sampled_from(_checked(cls)))
        values[i] = draw(_wrong_value(fields[i]))
    return cls(*values)  # type: ignore[no-any-return]


def _write(writer: RecordingWriter, recs: Sequence[Record], flush_after: set[int]) -> RecordingWriter:
    for i, rec in enumerate(recs):
        writer.write(rec)
        if i in flush_after:
            writer.flush()
    writer.close()
    return writer


def _kept(rec: Recording) -> dict[str, Any]:
    return {name: getattr(rec, name) for name in _KEPT}


@PROPERTIES
@given(recs=st.lists(records(), max_size=30), flush_after=st.sets(st.integers(0, 30)))
def test_any_records_read_back_from_the_compact_form_as_from_json_lines(recs: list[Record], flush_after: set[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lines, compact = Path(tmp) / "rank-0.jsonl", Path(tmp) / "rank-0.zmr"
        one = _write(RecordingWriter(lines, 0, **HEADER), recs, flush_after)
        two = _write(CompactWriter(compact, 0, **HEADER), recs, flush_after)
        assert (two.records_lost, two.error) == (one.records_lost, one.error)
        skipped: tuple[list[int], list[int]] = ([], [])
        why: tuple[dict[int, str], dict[int, str]] = ({}, {})
        streamed = [list(iter_records(path, skipped[i], line_errors=why[i])) for i, path in enumerate((lines, compact))]
        assert streamed[1] == streamed[0]
        # A JSON line's number is its record's number + 1 (the header is line 1); the reasons are the same.
        assert [n + 1 for n in skipped[1]] == skipped[0]
        assert {n + 1: text for n, text in why[1].items()} == why[0]
        read = read_recording(lines), read_recording(compact)
        assert _kept(read[1]) == _kept(read[0])
        assert [n + 1 for n in read[1].corrupt_lines] == read[0].corrupt_lines
        exported = b"".join(export_lines(compact))
        assert exported == b"".join(export_lines(lines))
        if streamed[0] == recs:  # every record read back as written: export gives the JSON-lines writer's bytes
            assert exported == lines.read_bytes()


def _columnar_counts(path: Path) -> collections.Counter[str]:
    """The records a file holds as columns, by kind: its records segments' meta ("n")."""
    data = path.read_bytes()
    header, start = header_of(path, data)
    counts: collections.Counter[str] = collections.Counter()
    for frame in iter_frames(data, start):
        if frame.kind == KIND_RECORDS and frame.payload is not None:
            payload = _inflate(frame.payload, dictionary_of(header))
            meta_length, _ = SECTIONS.unpack_from(payload)
            counts.update(json.loads(payload[SECTIONS.size:SECTIONS.size + meta_length])["n"])
    return counts


_MEMORY_PHASES = ("forward", "backward", "optimizer", "forward_peak", "backward_peak")
_bytes = st.integers(0, 2**40) | st.sampled_from([0, 2**63 - 1])  # any two differ by less than 2**63


@st.composite
def memory_samples(draw: st.DrawFn) -> MemorySample:
    """Memory samples as the agent takes them, on CPU (no allocator: nulls) or a GPU, with or without the
    categories walked: MEMORY_CATEGORIES' names in any order, as a walk finds them."""
    gpu = draw(st.booleans())
    allocator = [draw(st.none() | _bytes) if gpu else None for _ in range(8)]
    return MemorySample(draw(st.integers(0, 4096)), draw(st.integers(-1, 10**6)),
                        draw(st.sampled_from(_MEMORY_PHASES) | st.text(max_size=6)), draw(st.integers(0, 2**62)),
                        draw(st.sampled_from(["cuda:0", "cuda:7"]) if gpu else st.just("cpu")), *allocator,
                        draw(st.none() | _bytes), draw(st.none() | _bytes) if gpu else None, draw(st.none() | _bytes),
                        draw(st.dictionaries(st.sampled_from(MEMORY_CATEGORIES), _bytes, max_size=11)))


@PROPERTIES
@given(samples=st.lists(memory_samples(), min_size=1, max_size=30), flush_after=st.sets(st.integers(0, 30)))
def test_memory_samples_are_written_as_columns_and_read_back_as_written(samples: list[MemorySample],
                                                                       flush_after: set[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lines, compact = Path(tmp) / "rank-0.jsonl", Path(tmp) / "rank-0.zmr"
        _write(RecordingWriter(lines, 0, **HEADER), samples, flush_after)
        _write(CompactWriter(compact, 0, **HEADER), samples, flush_after)
        assert _columnar_counts(compact)["memory"] == len(samples)
        read = list(iter_records(compact))
        assert read == samples and read_recording(compact).memory == samples
        assert [list(r.categories) for r in read] == [list(s.categories) for s in samples]  # in the walk's order
        assert b"".join(export_lines(compact)) == lines.read_bytes()


def _memory(step: int, categories: dict[str, int]) -> MemorySample:
    return MemorySample(0, step, "forward", 1_795_469_875_420_896_450 + step, "cpu", None, None, None, None, None,
                        None, None, None, 12_638_251_008, None, 352_342_016, categories)


def test_a_memory_sample_the_columns_cannot_hold_exactly_is_written_as_its_json_row(tmp_path: Path) -> None:
    fitting = [_memory(0, {"sharded_params": 439424, "activations": 7664196}), _memory(1, {})]
    odd = [_memory(2, {"parameters": 5}),  # a name outside MEMORY_CATEGORIES
           _memory(3, collections.OrderedDict(activations=2))]  # a dict of another type
    # An integer past 64 bits: the segment's memory samples all rows (the readers skip this one as corrupt).
    past_64_bits = [_memory(4, {"activations": 2**64}), _memory(5, {"activations": 1})]
    samples = [fitting[0], *odd, fitting[1], *past_64_bits]
    lines, compact = tmp_path / "rank-0.jsonl", tmp_path / "rank-0.zmr"
    _write(RecordingWriter(lines, 0, **HEADER), samples, {3})
    _write(CompactWriter(compact, 0, **HEADER), samples, {3})
    assert _columnar_counts(compact)["memory"] == 2
    assert read_recording(compact).memory == read_recording(lines).memory == [fitting[0], *odd, fitting[1],
                                                                              past_64_bits[1]]
    assert read_recording(compact).corrupt_lines == [5]
    assert b"".join(export_lines(compact)) == b"".join(export_lines(lines))


def test_a_damaged_table_of_category_orders_is_a_damaged_segment(tmp_path: Path) -> None:
    """A records segment whose meta names a category outside the header's names (written under a good CRC:
    the damage of a writer, not of the disk) is skipped and counted like any damaged segment."""
    path = tmp_path / "rank-0.zmr"
    _write(CompactWriter(path, 0, **HEADER), [_memory(0, {"activations": 1}), _memory(1, {})], set())
    data = path.read_bytes()
    header, start = header_of(path, data)
    frame = next(frame for frame in iter_frames(data, start) if frame.kind == KIND_RECORDS)
    assert frame.payload is not None
    payload = _inflate(frame.payload, dictionary_of(header))
    meta_length, columns_length = SECTIONS.unpack_from(payload)
    meta = json.loads(payload[SECTIONS.size:SECTIONS.size + meta_length])
    assert meta["tables"]["memory"]["categories"] == [[MEMORY_CATEGORIES.index("activations")], []]
    meta["tables"]["memory"]["categories"] = [[len(MEMORY_CATEGORIES)], []]
    raw = json.dumps(meta, separators=(",", ":")).encode()
    rest = payload[SECTIONS.size + meta_length:]
    deflater = zlib.compressobj(6, zdict=dictionary_of(header))
    damaged = deflater.compress(SECTIONS.pack(len(raw), columns_length) + raw + rest) + deflater.flush()
    path.write_bytes(data[:frame.offset] + _frame(KIND_RECORDS, damaged, frame.count))
    rec = read_recording(path)
    assert rec.memory == [] and rec.corrupt_lines == [1, 2]
    assert rec.line_errors[1] == (f"the segment at byte {frame.offset:,} is damaged (the table of key orders of the "
                                  "column categories is damaged): its 2 records skipped")


def test_a_format_2_0_file_reads_back_as_the_json_lines_of_its_records() -> None:
    """Written by the 2.0 writer (tests/data/compact-2.0/README.md): memory samples as JSON rows, and a
    header whose columns are the collectives' and phases' only."""
    compact, lines = FORMAT_2_0 / "rank-0.zmr", FORMAT_2_0 / "rank-0.jsonl"
    header = read_file_header(compact)
    assert header["version"] == "2.0" and list(header["columns"]) == ["collective", "phase"]
    assert list(iter_records(compact)) == list(iter_records(lines))
    read = read_recording(compact)
    assert _kept(read) == _kept(read_recording(lines)) and read.corrupt_lines == []
    assert len(read.memory) == 11 and any(sample.categories for sample in read.memory)
    exported, recorded = b"".join(export_lines(compact)).splitlines(), lines.read_bytes().splitlines()
    assert exported[1:] == recorded[1:]  # the records, line for line
    # The header is this version's, whose schemas hold the recorded ones (and kinds added since).
    new_header, old_header = json.loads(exported[0]), json.loads(recorded[0])
    assert new_header.pop("version") == FORMAT_VERSION and old_header.pop("version") == "1.3"
    new_schemas, old_schemas = new_header.pop("schemas"), old_header.pop("schemas")
    assert new_header == old_header and {k: new_schemas[k] for k in old_schemas} == old_schemas


def _collective(seq: int) -> CollectiveEvent:
    t = 1_795_450_674_144_893_355 + seq * 3_000_000
    return CollectiveEvent(seq=seq, rank=0, step=seq // 4, phase="forward", op="all_gather", api="all_gather_single",
                           bytes_in=99968, bytes_out=199936, dtype="float32", group_size=2, async_op=False,
                           issue_ns=t, complete_ns=t + 378_525, blocked_s=0.000378525, timing="sync",
                           meaning="param_all_gather", wait_ns=t, issue_s=0.000378525)


def _step(step: int) -> StepSummary:
    return StepSummary(rank=0, step=step, start_ns=1_795_450_674_000_000_000 + step, end_ns=1_795_450_675_000_000_000,
                       phase_s={"forward": 0.5}, collectives=4, comm_bytes=1024, comm_bytes_by_op={"all_gather": 1024},
                       comm_union_s=0.1, blocked_s=0.1, peak_memory=1, comp_s=0.5, overlap_s=0.0, exposed_comm_s=0.1)


def _segments(path: Path) -> list[tuple[int, int]]:
    """(offset, end) of each records segment of a file, by their frames."""
    data = path.read_bytes()
    pos = len(COMPACT_MAGIC)
    spans = []
    while pos < len(data):
        _, kind, _, length, _, _ = FRAME.unpack_from(data, pos)
        if kind == 1:
            spans.append((pos, pos + FRAME.size + length))
        pos += FRAME.size + length
    return spans


def _three_segments(path: Path, rank: int = 0) -> list[Record]:
    """A file of three segments of 4 collectives, a memory sample and a step each, closed with a RunEnd."""
    writer = CompactWriter(path, rank, **HEADER)
    written: list[Record] = []
    for group in range(3):
        sample = _memory(group, {"sharded_params": 439424, "activations": 7664196 + group} if group % 2 else {})
        for rec in (*map(_collective, range(group * 4, group * 4 + 4)), sample, _step(group)):
            writer.write(rec)
            written.append(rec)
        writer.flush()
    end = RunEnd(rank=0, t_ns=1, how="exit", last_step=2, records_lost=0, bytes_lost=0)
    writer.close(end)
    return [*written, end]


def test_a_file_being_written_reads_to_its_last_whole_segment(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.zmr"
    writer = CompactWriter(path, 0, **HEADER)
    first = [*map(_collective, range(5)), _memory(0, {"activations": 1}), _step(0)]
    for rec in first:
        writer.write(rec)
    assert list(iter_records(path)) == []  # not flushed yet: nothing to read, nothing wrong
    writer.flush()
    assert list(iter_records(path)) == first  # read while the writer holds the file open
    assert read_file_end(path).end is None and read_file_end(path).expected
    for rec in (*map(_collective, range(5, 9)), _memory(1, {"sharded_params": 2, "activations": 3})):
        writer.write(rec)
    writer.flush()
    whole = path.read_bytes()
    start, end = _segments(path)[-1]
    cut = tmp_path / "cut" / "rank-0.zmr"
    cut.parent.mkdir()
    for size in [*range(start, end, 13), end - 1]:  # the second segment part-written, at any byte
        cut.write_bytes(whole[:size])
        skipped: list[int] = []
        assert list(iter_records(cut, skipped)) == first and skipped == []
        assert read_recording(cut).corrupt_lines == []
    writer.close(RunEnd(rank=0, t_ns=2, how="exit", last_step=0, records_lost=0, bytes_lost=0))
    assert read_file_end(path).end == RunEnd(rank=0, t_ns=2, how="exit", last_step=0, records_lost=0, bytes_lost=0)


def _damaged(path: Path, how: str) -> int:
    """Damage the middle segment of a _three_segments file; its offset."""
    data = bytearray(path.read_bytes())
    start, end = _segments(path)[1]
    if how == "payload":
        data[start + FRAME.size + 5] ^= 0xFF
    elif how == "frame":
        data[start:start + 2] = b"XX"
    else:  # not zlib, under a good CRC: damage done before the frame was made
        garbage = bytes(end - start - FRAME.size)
        head = bytes(data[start:start + 12])
        data[start + FRAME.size:end] = garbage
        data[start + 12:start + 16] = struct.pack("<I", zlib.crc32(garbage, zlib.crc32(head)))
    path.write_bytes(bytes(data))
    return start


@pytest.mark.parametrize(("how", "why"), [("payload", "its CRC does not match"),
                                          ("frame", "no segment frame there"),
                                          ("zlib", "Error -3 while decompressing")])
def test_a_damaged_segment_is_skipped_and_counted_naming_its_offset(tmp_path: Path, how: str, why: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "rank-0.zmr"
    written = _three_segments(path)
    offset = _damaged(path, how)
    rec = read_recording(path)
    assert rec.collectives == written[:4] + written[12:16] and rec.memory == [written[4], written[16]]
    assert rec.steps == [written[5], written[17]] and read_file_end(path).end == written[-1]
    assert rec.corrupt_lines == [7, 8, 9, 10, 11, 12]  # the middle segment's 6 records
    message = rec.line_errors[7]
    assert message.startswith(f"the segment at byte {offset:,} is damaged (") and why in message
    assert message.endswith("its 6 records skipped")
    assert main(["summary", str(tmp_path)]) == 0
    assert (f"rank-0.zmr: 6 corrupt records skipped (records 7, 8, 9, 10, 11 and 1 more; record 7: the segment "
            f"at byte {offset:,} is damaged") in capsys.readouterr().out


def test_json_lines_and_compact_rank_files_read_as_one_run(tmp_path: Path) -> None:
    RecordingWriter(tmp_path / "rank-0.jsonl", 0, **HEADER).close()
    _three_segments(tmp_path / "rank-1.zmr", rank=1)
    assert [p.name for p, _ in run_headers(tmp_path)] == ["rank-0.jsonl", "rank-1.zmr"]
    assert [h["version"] for _, h in run_headers(tmp_path)] == [FORMAT_VERSION, COMPACT_VERSION]
    run = read_run(tmp_path)
    assert [len(r.collectives) for r in run] == [0, 12]
    (tmp_path / "rank-1.jsonl").write_bytes(b"".join(export_lines(tmp_path / "rank-1.zmr")))
    assert main(["summary", str(tmp_path)]) == 2  # rank 1 twice: refused, naming both files


def test_the_compact_writer_never_raises_and_counts_what_it_lost(tmp_path: Path) -> None:
    (tmp_path / "a-file").touch()
    blocked = CompactWriter.open_or_lost(tmp_path / "a-file" / "rank-0.zmr", 0)  # a path under a file
    assert blocked.error is not None and "cannot create" in blocked.error
    blocked.write(_collective(0))
    blocked.close(RunEnd(rank=0, t_ns=1, how="exit", last_step=None, records_lost=1, bytes_lost=0))
    assert blocked.records_lost == 2 and blocked.bytes_lost > 0
    path = tmp_path / "rank-0.zmr"
    writer = CompactWriter(path, 0, **HEADER)
    for seq in range(3):
        writer.write(_collective(seq))
    writer.flush()
    assert writer._file is not None
    writer._file.close()  # the file closed under the writer: its next flush fails
    writer.write(_collective(3))
    writer.flush()
    writer.write(_collective(4))
    assert writer.error is not None and (writer.records_written, writer.records_lost) == (3, 2)
    end = RunEnd(rank=0, t_ns=1, how="exit", last_step=0, records_lost=2, bytes_lost=writer.bytes_lost)
    writer.close(end)  # appended after the failure, as a segment of its own
    assert read_recording(path).collectives == list(map(_collective, range(3)))
    assert read_file_end(path).end == end


def test_a_bad_zeromon_format_is_a_notice_and_the_default() -> None:
    notices: list[str] = []
    assert load_config({"ZEROMON_FORMAT": "parquet"}, notices=notices).record_format == "compact"
    assert notices == ["ZEROMON_FORMAT='parquet': must be compact or jsonl (zeromon uses the default, compact, "
                       "instead)"]
    assert load_config({"ZEROMON_FORMAT": " JSONL "}).record_format == "jsonl"


def test_export_refuses_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _three_segments(tmp_path / "run" / "rank-0.zmr")
    for args, said in (([str(tmp_path / "missing")], "no such run folder"),
                       ([str(tmp_path / "run"), "--out", str(tmp_path / "run")], "the run's own folder"),
                       ([str(tmp_path / "run" / "rank-0.zmr")], "is a file")):
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err
        assert said in err and err.startswith("zeromon: error: ") and "Traceback" not in err
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "rank-0.jsonl").write_text("kept\n")
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 2
    assert "exists (nothing is overwritten)" in capsys.readouterr().err
    assert (tmp_path / "out" / "rank-0.jsonl").read_text() == "kept\n"


def test_the_agent_writes_the_compact_form_that_summary_report_and_export_read(tmp_path: Path) -> None:
    """A real 2-rank FSDP2 run on gloo under `zeromon run`, with the agent's default form."""
    out = tmp_path / "run"
    done = zeromon("run", "--out", str(out), "--", *ranks_args(2, EXAMPLES / "fsdp2_train.py", "--steps", "3"),
                   env=child_env(ZEROMON_FORMAT=""))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.glob("rank-*")) == ["rank-0.zmr", "rank-1.zmr"]
    assert all(p.read_bytes().startswith(COMPACT_MAGIC) for p in out.glob("rank-*"))
    summary = zeromon("summary", str(out))
    assert summary.returncode == 0, summary.stderr
    assert "(2 of 2 ranks recorded)" in summary.stdout and "fsdp2" in summary.stdout
    report = zeromon("report", str(out), "--json")
    assert report.returncode == 0, report.stderr
    assert [r["steps"] for r in json.loads(report.stdout)["ranks"]] == [3, 3]
    exported = tmp_path / "exported"
    assert zeromon("export", str(out), "--out", str(exported)).returncode == 0
    for rank in (0, 1):
        compact, lines = read_recording(out / f"rank-{rank}.zmr"), read_recording(exported / f"rank-{rank}.jsonl")
        assert _kept(lines) == _kept(compact) and len(compact.collectives) > 0 and compact.corrupt_lines == []
        # The agent's memory samples, its categories in the order of its walk, all go into the columns.
        assert any(sample.categories for sample in compact.memory)
        assert _columnar_counts(out / f"rank-{rank}.zmr")["memory"] == len(compact.memory)
        assert lines.header["version"] == FORMAT_VERSION and read_file_end(out / f"rank-{rank}.zmr").end is not None
        # ~15-50 bytes a collective (tests/bench/RESULTS.md): far under the JSON lines' size
        assert (out / f"rank-{rank}.zmr").stat().st_size * 3 < (exported / f"rank-{rank}.jsonl").stat().st_size
    grep = subprocess.run(["grep", "-c", '^\\["collective"'], input=zeromon("export", str(out)).stdout,
                          capture_output=True, text=True, check=False)
    assert int(grep.stdout) == sum(len(read_recording(p).collectives) for p in out.glob("rank-*.zmr"))


def test_a_full_disk_makes_room_for_the_end_record_by_whole_segments(tmp_path: Path) -> None:
    """Where a full disk's writer writes its end record over the file's last records (RecordingWriter's
    _tail_cut, the compact form's own): at a segment's start, the records it covers counted as lost."""
    path = tmp_path / "rank-0.zmr"
    written = _three_segments(path)
    writer = CompactWriter.open_or_lost(tmp_path / "other.zmr", 0)
    writer.path = path
    last_start = _segments(path)[-1][0]
    cut = writer._tail_cut(path.stat().st_size - last_start)  # room for what the last segment (the RunEnd) took
    assert cut == last_start and writer.records_lost == 1
    os.truncate(path, cut)
    assert list(iter_records(path)) == written[:-1]
