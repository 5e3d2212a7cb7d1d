"""The recording format: round trip, versioning, corrupt lines."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromon.errors import ZeromonError
from zeromon.model import (
    AgentStats,
    CollectiveEvent,
    MemorySample,
    PhaseSpan,
    Recording,
    RecordingWriter,
    RunInfo,
    StepSummary,
    iter_records,
    kinds,
    read_recording,
    read_run,
)
from zeromon.model.codec import check_one_run, rank_files


def _collective(seq: int) -> CollectiveEvent:
    return CollectiveEvent(seq=seq, rank=1, step=3, phase="backward", op="reduce_scatter",
                           api="reduce_scatter_single", bytes_in=4096, bytes_out=2048, dtype="bfloat16",
                           group_size=2, async_op=False, issue_ns=1_000, complete_ns=5_000, blocked_s=4e-6,
                           timing="sync", meaning="grad_reduce_scatter")


def _write_sample(path: Path) -> list[object]:
    records: list[object] = [
        RunInfo(rank=1, local_rank=1, world_size=2, host="h", pid=7, job="j", framework="fsdp2",
                framework_version="2.13.0", torch_version="2.13.0", backend="gloo", device="cpu", zero_stage=None,
                fsdp_strategy="FULL_SHARD", param_dtype="bfloat16", reduce_dtype="float32", optimizer="AdamW",
                knobs={"reshard_after_forward": True}),
        _collective(1),
        _collective(2),
        PhaseSpan(rank=1, step=3, phase="forward", start_ns=10, end_ns=20),
        MemorySample(rank=1, step=3, phase="forward", t_ns=15, device="cpu", allocated=None, reserved=None,
                     active=None, peak_allocated=None, peak_reserved=None, inactive_split=None,
                     num_alloc_retries=None, num_ooms=None, capacity=10**9, free=None, rss=5 * 10**8,
                     categories={"sharded_params": 100, "activations": 7}),
        StepSummary(rank=1, step=3, start_ns=0, end_ns=2_000_000_000, phase_s={"forward": 0.5}, collectives=2,
                    comm_bytes=8192, comm_bytes_by_op={"reduce_scatter": 8192}, comm_union_s=0.1, blocked_s=0.1,
                    peak_memory=5 * 10**8),
        AgentStats(rank=1, t_ns=99, events_recorded=2, events_dropped=0, hook_errors=0, cpu_time_s=0.01),
    ]
    writer = RecordingWriter(path, rank=1, job="j")
    for record in records:
        writer.write(record)  # type: ignore[arg-type]
    writer.close()
    return records


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "rank-1.jsonl"
    written = _write_sample(path)
    rec = read_recording(path)
    assert rec.rank == 1
    assert rec.collectives == [written[1], written[2]]
    assert rec.phases == [written[3]]
    assert rec.memory == [written[4]]
    assert rec.memory[0].categories["activations"] == 7
    assert rec.steps[0].duration_s == pytest.approx(2.0)
    assert rec.run_info == written[0]
    assert rec.stats == written[6]
    assert rec.corrupt_lines == []


def test_corrupt_lines_are_skipped_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "rank-1.jsonl"
    _write_sample(path)
    lines = path.read_text().splitlines()
    lines.insert(2, '["collective", 1, 2')  # a write cut short
    lines.insert(4, "not json at all")
    lines.append('["collective", "too", "few"]')
    path.write_text("\n".join(lines) + "\n")
    rec = read_recording(path)
    assert len(rec.collectives) == 2
    assert rec.corrupt_lines == [3, 5, len(lines)]


def test_unknown_major_version_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    _write_sample(path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["version"] = "2.0"
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(ZeromonError) as info:
        read_recording(path)
    assert str(path) in info.value.message
    assert "2.0" in info.value.message


def test_newer_minor_version_with_extra_field_and_kind_is_read(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    _write_sample(path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["version"] = "1.7"
    header["schemas"]["collective"].append("future_field")
    header["schemas"]["future_kind"] = ["a"]
    rows = [json.loads(line) for line in lines[1:]]
    for row in rows:
        if row[0] == "collective":
            row.append("extra")
    rows.append(["future_kind", 1])
    path.write_text("\n".join([json.dumps(header), *map(json.dumps, rows)]) + "\n")
    rec = read_recording(path)
    assert len(rec.collectives) == 2 and rec.collectives[0].bytes_in == 4096
    assert rec.unknown_kinds == {"future_kind": 1}


def test_not_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    path.write_text('{"hello": 1}\n')
    with pytest.raises(ZeromonError, match="not a zeromon recording"):
        read_recording(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ZeromonError, match=re.escape("no rank-<r>.zmr (or .jsonl)")):
        read_run(empty)
    with pytest.raises(ZeromonError, match="no such run folder"):
        read_run(tmp_path / "missing")


def test_read_recording_agrees_with_iter_records_on_a_damaged_file(tmp_path: Path) -> None:
    """read_recording's columnar path and the record-by-record stream read a damaged file alike."""
    path = tmp_path / "rank-1.jsonl"
    _write_sample(path)
    lines = path.read_text().splitlines()
    # After collective 1 (line 3): one without the optional wait_ns, one with a NaN blocked_s (orjson
    # refuses it, the json fallback reads it, the schema refuses it: no analysis can use it), one with
    # too few fields, a blank line, a row that is no array.
    short = json.loads(lines[2])[:-1]
    nan_row = json.loads(lines[2])
    nan_row[1], nan_row[14] = 7, float("nan")
    lines[3:3] = [json.dumps(short), json.dumps(nan_row), '["collective", 1, 2, 3]', "", '{"a": 1}']
    path.write_text("\n".join(lines) + "\n")

    corrupt: list[int] = []
    errors: dict[int, str] = {}
    streamed = [r for r in iter_records(path, corrupt, line_errors=errors) if isinstance(r, CollectiveEvent)]
    rec = read_recording(path)
    assert rec.corrupt_lines == corrupt == [5, 6, 8]
    assert rec.line_errors == errors == {5: "collective.blocked_s is NaN, not a finite number",
                                         6: "collective has 3 fields, not at least 16"}
    assert [e.seq for e in rec.collectives] == [e.seq for e in streamed] == [1, 1, 2]
    assert rec.collectives[1] == _collective(1)  # wait_ns absent: its default, None
    assert list(rec.collectives) == streamed

    columns = rec.collective_columns()
    assert len(columns) == 3
    for name in ("seq", "step", "op", "bytes_in", "issue_ns", "complete_ns", "timing", "wait_ns"):
        assert list(getattr(columns, name)) == [getattr(e, name) for e in streamed], name
    # A Recording made by hand gets the same columns from its events.
    by_hand = Recording(path=path, header=rec.header, collectives=streamed)
    assert list(by_hand.collective_columns().issue_ns) == list(columns.issue_ns)
    assert by_hand.collective_columns().op == list(columns.op)


# --- a run folder holds one run ------------------------------------------------------------------


def _write_rank(folder: Path, rank: int, job: str = "train", framework: str = "fsdp2", world_size: int = 2,
                name: str | None = None) -> Path:
    path = folder / (name or f"rank-{rank}.jsonl")
    writer = RecordingWriter(path, rank=rank, job=job, world_size=world_size)
    writer.write(RunInfo(rank=rank, local_rank=rank, world_size=world_size, host="h", pid=7, job=job,
                         framework=framework, framework_version=None, torch_version="2.13.0", backend="gloo",
                         device="cpu", zero_stage=None, fsdp_strategy=None, param_dtype=None, reduce_dtype=None,
                         optimizer=None))
    writer.write(_collective(1))
    writer.close()
    return path


def test_one_runs_rank_files_are_read(tmp_path: Path) -> None:
    for rank in (1, 0):
        _write_rank(tmp_path, rank)
    # "unknown": a rank that stopped before its framework was detected differs from no one.
    _write_rank(tmp_path, 2, framework="unknown")
    assert [r.rank for r in read_run(tmp_path)] == [0, 1, 2]
    assert rank_files(tmp_path) == [tmp_path / f"rank-{r}.jsonl" for r in (0, 1, 2)]


@pytest.mark.parametrize(("make", "message", "hint"), [
    (lambda d: (_write_rank(d, 0), _write_rank(d, 0, name="rank-1.jsonl")),  # cp rank-0.jsonl rank-1.jsonl
     "rank-1.jsonl: the header says rank 0, the file name rank 1", "copied or renamed"),
    (lambda d: (_write_rank(d, 0), _write_rank(d, 0, name="rank-0-old.jsonl")),
     "rank-0-old.jsonl and {d}/rank-0.jsonl are both rank 0", "keep one recording per rank"),
    (lambda d: (_write_rank(d, 0), _write_rank(d, 1, job="other")),
     "rank-0.jsonl and {d}/rank-1.jsonl are from different runs: job 'train' and 'other'", "one run"),
    (lambda d: (_write_rank(d, 0), _write_rank(d, 1, world_size=4)),
     "are from different runs: world size 2 and 4", "one run"),
], ids=["renamed", "two-of-one-rank", "another-job", "another-world-size"])
def test_rank_files_of_several_runs_are_refused_from_their_headers(tmp_path: Path, make: Any, message: str,
                                                                    hint: str) -> None:
    make(tmp_path)
    for read in (rank_files, read_run):
        with pytest.raises(ZeromonError) as info:
            read(tmp_path)
        assert message.format(d=tmp_path) in info.value.message
        assert info.value.hint is not None and hint in info.value.hint


def test_another_framework_is_refused_once_the_run_info_is_read(tmp_path: Path) -> None:
    _write_rank(tmp_path, 0, framework="fsdp2")
    _write_rank(tmp_path, 1, framework="deepspeed")
    assert len(rank_files(tmp_path)) == 2  # the headers alone agree
    with pytest.raises(ZeromonError, match="from different runs: framework 'fsdp2' and 'deepspeed'"):
        read_run(tmp_path)
    with pytest.raises(ZeromonError, match="framework 'fsdp2' and 'deepspeed'"):
        check_one_run([(r.path, r.header, r.run_info) for r in map(read_recording, rank_files(tmp_path))])


def test_a_rank_file_given_as_the_run_folder_names_its_folder(tmp_path: Path) -> None:
    path = _write_rank(tmp_path, 0)
    with pytest.raises(ZeromonError) as info:
        read_run(path)
    assert info.value.message == f"{path}: is a file; a run is the folder of rank-<r>.zmr (or .jsonl) files"
    assert info.value.hint == f"pass the folder that holds it: {tmp_path}"


# --- encode_line: orjson for the agent's many small records, json's values -----------------------------------
_line_values = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()  # NaN, infinities too
                | st.text(max_size=6) | st.sampled_from(["null", "\udc80", "é", "forward"])
                | st.dictionaries(st.text(max_size=4) | st.integers(0, 3), st.integers(-(2**65), 2**65)
                                  | st.floats(), max_size=3))
# What the agent writes: numbers that fit, strings, dicts of them (the lines orjson makes).
_plain_values = (st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6)
                 | st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False),
                                   max_size=3))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(cls=st.sampled_from(sorted(kinds._FAST_KINDS, key=lambda cls: cls.__name__)), data=st.data())
def test_a_line_made_with_orjson_reads_back_as_json_s_line_does(cls: type, data: st.DataObject) -> None:
    """Whatever the values (a NaN, an integer past 64 bits, a key that is not a string, a lone surrogate):
    encode_line's line reads back to json's values, byte for byte once read and written again by json."""
    values = data.draw(st.sampled_from([_plain_values, _line_values]))
    record = cls(*(data.draw(values) for _ in dataclasses.fields(cls)))
    line = kinds.encode_line(record)
    expected = kinds.encode_record(record)
    assert json.dumps(json.loads(line.decode("utf-8", "surrogatepass"))) == json.dumps(json.loads(expected))


def test_a_step_summary_s_line_is_orjson_s_and_without_it_json_s(monkeypatch: pytest.MonkeyPatch) -> None:
    import orjson

    summary = StepSummary(rank=0, step=5, start_ns=10**18, end_ns=10**18 + 48_000_000,
                          phase_s={"forward": 0.017578, "agent": 9.6363e-05}, collectives=11, comm_bytes=2_357_504,
                          comm_bytes_by_op={"all_gather": 1_478_656}, comm_union_s=0.02, blocked_s=0.02,
                          peak_memory=361_656_320, comp_s=0.028, overlap_s=1e-09, exposed_comm_s=0.02)
    line = kinds.encode_line(summary)
    assert line == orjson.dumps(["step", *dataclasses.astuple(summary)]) and b"1e-9" in line  # orjson's spelling
    assert json.loads(line) == json.loads(kinds.encode_record(summary))
    monkeypatch.setattr(kinds, "_orjson", False)  # orjson not installed
    assert kinds.encode_line(summary) == kinds.encode_record(summary).encode()
    # A line with a null in it is json's, orjson or not: orjson writes a NaN as null.
    monkeypatch.setattr(kinds, "_orjson", None)
    unknown = dataclasses.replace(summary, comp_s=None, overlap_s=float("nan"))
    assert kinds.encode_line(unknown) == kinds.encode_record(unknown).encode() and b"NaN" in kinds.encode_line(unknown)
