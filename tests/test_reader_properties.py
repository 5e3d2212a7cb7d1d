"""The recording reader under any input (hypothesis): a Recording with the bad lines named, or one
ZeromonError for a file that is no recording; never another exception, a hang or unbounded memory.

The records are generated from the event model's own annotations (zeromon.model.schema), so a kind
added to codec.KIND_OF is covered without changes here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeromon.analysis.recording_summary import (
    RunSummary,
    corrupt_lines_note,
    format_summary,
    summarize_recording,
)
from zeromon.analysis.report import build_report, rank_report
from zeromon.analysis.step_overlap import blocked_intervals
from zeromon.cli import main
from zeromon.errors import ZeromonError
from zeromon.model import codec, rows
from zeromon.model.codec import KIND_OF, Recording, iter_records, make_header, read_recording, run_headers
from zeromon.model.events import (
    CollectiveEvent,
    DeviceSample,
    MemorySample,
    Notice,
    OomEvent,
    PhaseSpan,
    StepSummary,
)
from zeromon.model.schema import FieldType, field_types

from conftest import child_env

# Derandomized, so that CI sees the same examples every run; ZEROMON_PROPERTY_EXAMPLES=2000 explores more.
PROPERTIES = settings(max_examples=int(os.environ.get("ZEROMON_PROPERTY_EXAMPLES", "60")), deadline=None,
                      derandomize=True, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
KINDS = sorted(KIND_OF.items(), key=lambda item: item[1])
# The kinds a Recording keeps every record of (of the others, the last).
LISTED = (CollectiveEvent, PhaseSpan, MemorySample, DeviceSample, OomEvent, StepSummary, Notice)
INT64 = (-(2**63), 2**63 - 1)

_text = st.text(max_size=12)
_json_scalars = st.none() | st.booleans() | st.integers(*INT64) | st.floats(allow_nan=False, allow_infinity=False) \
    | _text
_json = st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_text, inner, max_size=3), max_leaves=8)


def _of_type(t: type) -> st.SearchStrategy[Any]:
    return {int: st.integers(*INT64), float: st.floats(allow_nan=False, allow_infinity=False) | st.integers(-9, 9),
            bool: st.booleans(), str: _text, type(None): st.none(), list: st.lists(_json_scalars, max_size=3),
            dict: st.dictionaries(_text, _json, max_size=3)}[t]


def _valid_value(f: FieldType) -> st.SearchStrategy[Any]:
    if f.accepts is None:
        return _json
    if f.values is not None:  # a Mapping: its values checked too
        return st.dictionaries(_text, st.one_of(*(_of_type(t) for t in f.values)), max_size=4)
    return st.one_of(*(_of_type(t) for t in sorted(f.accepts, key=str)))


def _wrong_value(f: FieldType) -> st.SearchStrategy[Any]:
    """A value of a JSON type the field does not accept."""
    assert f.accepts is not None
    wrong = [_of_type(t) for t in (int, str, bool, type(None), list, dict) if t not in f.accepts]
    if float not in f.accepts:
        wrong.append(st.floats(allow_nan=False, allow_infinity=False))  # 0.0, not 0
    return st.one_of(*wrong)


def _checked(cls: type) -> list[int]:
    return [i for i, f in enumerate(field_types(cls, KIND_OF[cls])) if f.accepts is not None]


@dataclass(frozen=True)
class Line:
    text: str | bytes
    kind: str  # "record", "wrong", "corrupt", "unknown", "blank"
    record: tuple[type, tuple[Any, ...]] | None = None
    field: str = ""  # for "wrong": "collective.meaning"


@st.composite
def record_lines(draw: st.DrawFn) -> Line:
    cls, kind = draw(st.sampled_from(KINDS))
    fields = field_types(cls, kind)
    values = [draw(_valid_value(f)) for f in fields]
    return Line(json.dumps([kind, *values]), "record", (cls, tuple(values)))


@st.composite
def wrong_lines(draw: st.DrawFn) -> Line:
    cls, kind = draw(st.sampled_from(KINDS))
    fields = field_types(cls, kind)
    values = [draw(_valid_value(f)) for f in fields]
    i = draw(st.sampled_from(_checked(cls)))
    values[i] = draw(_wrong_value(fields[i]))
    return Line(json.dumps([kind, *values]), "wrong", field=fields[i].name)


@st.composite
def corrupt_lines(draw: st.DrawFn) -> Line:
    """Lines that are no record: cut short, not JSON, JSON that is no array, bytes that are not UTF-8."""
    whole = draw(record_lines()).text
    assert isinstance(whole, str)
    text = draw(st.sampled_from([
        whole[:draw(st.integers(1, len(whole) - 1))],  # a killed writer's last line: no prefix of [...] is JSON
        "\ufffd" + whole,
        "[" * 5000 + "]" * 5000,  # deeper than either JSON parser goes
        "{\"kind\": 1}", "5", "null", "\"collective\"", "[]", "not json at all",
    ]))
    if draw(st.booleans()):
        return Line(b"\xff\xfe" + text.encode(), "corrupt")  # not UTF-8: read as U+FFFD, still no record
    return Line(text, "corrupt")


_line = st.one_of(record_lines(), wrong_lines(), corrupt_lines(),
                  st.builds(lambda name, v: Line(json.dumps([name, v]), "unknown"),
                            st.sampled_from(["future_kind", "z"]), _json),
                  st.just(Line("", "blank")))


def _write(path: Path, lines: list[Line], header: dict[str, Any] | None = None) -> None:
    with open(path, "wb") as f:
        f.write(json.dumps(header or make_header(0)).encode() + b"\n")
        for line in lines:
            f.write((line.text if isinstance(line.text, bytes) else line.text.encode("utf-8", "surrogatepass"))
                    + b"\n")


def _records_of(rec: Recording) -> list[tuple[type, tuple[Any, ...]]]:
    """Every record read, in field order, collectives as their columns' rows."""
    columns = rec.collective_columns()
    names = codec.FIELDS_OF[CollectiveEvent]
    rows = [(CollectiveEvent, values) for values in zip(*(getattr(columns, n) for n in names), strict=True)]
    return rows + [(type(r), tuple(getattr(r, n) for n in codec.FIELDS_OF[type(r)]))
                   for r in [*rec.phases, *rec.memory, *rec.device, *rec.ooms, *rec.steps, *rec.notices]]


@PROPERTIES
@given(st.lists(_line, max_size=40))
def test_every_line_is_read_or_named(tmp_path_factory: pytest.TempPathFactory, lines: list[Line]) -> None:
    path = tmp_path_factory.mktemp("rec") / "rank-0.jsonl"
    _write(path, lines)
    rec = read_recording(path)
    numbered = list(enumerate(lines, start=2))
    assert rec.corrupt_lines == [n for n, line in numbered if line.kind in ("wrong", "corrupt")]
    for n, line in numbered:
        if line.kind == "wrong":
            assert rec.line_errors[n].startswith(f"{line.field} is ")  # names the field
    assert sum(rec.unknown_kinds.values()) == sum(line.kind == "unknown" for line in lines)
    # Every good record is read, with its values (the kinds kept whole; RunInfo and AgentStats: the last).
    expected = [line.record for line in lines if line.record is not None]
    kept_whole = [r for r in expected if r[0] in LISTED]
    assert sorted(map(repr, _records_of(rec))) == sorted(map(repr, kept_whole))
    assert list(iter_records(path)) == [cls(*values) for cls, values in expected]


@PROPERTIES
@given(st.lists(_line, max_size=25))
def test_summary_and_report_of_any_recording_say_what_was_skipped(tmp_path_factory: pytest.TempPathFactory,
                                                                  lines: list[Line]) -> None:
    path = tmp_path_factory.mktemp("rec") / "rank-0.jsonl"
    _write(path, lines)
    rec = read_recording(path)
    summary = summarize_recording(rec)
    report = rank_report(rec)
    if rec.corrupt_lines:
        note = corrupt_lines_note(summary.file, summary.corrupt_lines, errors=summary.line_errors)
        assert note.startswith("rank-0.jsonl: ") and str(rec.corrupt_lines[0]) in note
        assert report.corrupt_lines == summary.corrupt_lines


# Values that meet: a handful of steps, ranks and times, the format's own words, and extremes, so that
# the analyses match collectives to steps and phases as in a run, with nonsense among them.
_VOCABULARY = ["forward", "backward", "optimizer", "other", "agent", "setup", "all_gather", "reduce_scatter",
               "all_reduce", "param_all_gather", "grad_reduce_scatter", "sync", "wait", "bound", "callback",
               "cuda_event", "host", "activations", "sharded_params", "cpu", "fsdp2", "deepspeed", ""]
_MEETING = {int: st.sampled_from([-1, 0, 1, 2, 3, 1000, 10**9, 2**62, 2**63 - 1, -(2**63)]),
            float: st.sampled_from([0.0, 1e-9, 0.5, 1.0, -1.0, 1e15, 5e-324]),  # 1e300 s: see the README
            str: st.sampled_from(_VOCABULARY), bool: st.booleans(), type(None): st.none()}


@st.composite
def meeting_lines(draw: st.DrawFn) -> Line:
    cls, kind = draw(st.sampled_from(KINDS))
    values = []
    for f in field_types(cls, kind):
        if f.values is not None:
            value: Any = draw(st.dictionaries(st.sampled_from(_VOCABULARY), st.one_of(
                *(_MEETING[t] for t in sorted(f.values, key=str))), max_size=3))
        elif f.accepts is None or not f.accepts <= _MEETING.keys():
            value = draw(_valid_value(f))
        else:
            value = draw(st.one_of(*(_MEETING[t] for t in sorted(f.accepts, key=str))))
        values.append(value)
    return Line(json.dumps([kind, *values]), "record", (cls, tuple(values)))


@PROPERTIES
@given(st.lists(meeting_lines() | _line, max_size=40))
def test_every_consumer_of_any_recording_gives_a_result_or_a_zeromon_error(
        tmp_path_factory: pytest.TempPathFactory, lines: list[Line]) -> None:
    """summary, report (text, JSON), the replay's views and the CLI, in this process: values of the right
    types but any size or sense (a step of -7, a group of 0 ranks, an end before its start)."""
    from zeromon.analysis.recording_summary import summarize_run
    from zeromon.commands.report import format_run_report
    from zeromon.sources.replay import ReplaySource, final_view
    from zeromon.sources.run_analysis import analyse_run

    folder = tmp_path_factory.mktemp("run")
    _write(folder / "rank-0.jsonl", lines)
    format_summary(summarize_run(folder))
    report = analyse_run(folder, workers=1)
    format_run_report(report)
    json.dumps(report.to_dict(), default=str)
    try:
        final_view(folder)
        source = ReplaySource(folder)
    except ZeromonError as exc:
        assert "no records to play back" in exc.message
    else:
        for position in (0, source.duration_ns // 2, source.duration_ns):
            source.view_at(position)


@PROPERTIES
@given(first=st.one_of(st.binary(max_size=60), _json.map(lambda v: json.dumps(v).encode()),
                       st.builds(lambda h: json.dumps(h).encode(), st.fixed_dictionaries(
                           {"format": st.sampled_from(["zeromon-recording", "other"]),
                            "version": st.sampled_from(["1.0", "1.9", "2.0", "", 1]),
                            "rank": _json_scalars, "schemas": _json}))),
       rest=st.lists(_line, max_size=5))
def test_any_first_line_reads_or_is_refused_with_a_zeromon_error(tmp_path_factory: pytest.TempPathFactory,
                                                                 first: bytes, rest: list[Line]) -> None:
    folder = tmp_path_factory.mktemp("rec")
    path = folder / "rank-0.jsonl"
    path.write_bytes(first + b"\n" + b"\n".join(
        line.text if isinstance(line.text, bytes) else line.text.encode() for line in rest))
    for read in (read_recording, lambda p: list(iter_records(p)), lambda p: run_headers(p.parent)):
        try:
            read(path)
        except ZeromonError as exc:
            assert str(path) in exc.message or str(folder) in exc.message  # names the file
            assert "\n" not in exc.message


def test_a_wrong_type_names_the_line_the_field_and_the_value(tmp_path: Path) -> None:
    good = json.loads(codec.encode_record(CollectiveEvent(
        seq=1, rank=0, step=0, phase="forward", op="all_gather", api="all_gather_into_tensor", bytes_in=1,
        bytes_out=2, dtype="bfloat16", group_size=2, async_op=False, issue_ns=10, complete_ns=20, blocked_s=1e-8,
        timing="sync", meaning="param_all_gather", wait_ns=10)))
    meaning = codec.FIELDS_OF[CollectiveEvent].index("meaning") + 1
    size = codec.FIELDS_OF[CollectiveEvent].index("bytes_in") + 1
    lines = [good, good[:meaning] + [7] + good[meaning + 1:], good[:size] + ["big"] + good[size + 1:], good]
    _write(tmp_path / "rank-0.jsonl", [Line(json.dumps(row), "") for row in lines])
    rec = read_recording(tmp_path / "rank-0.jsonl")
    assert len(rec.collectives) == 2 and rec.corrupt_lines == [3, 4]
    assert rec.line_errors == {3: "collective.meaning is 7, not a string",
                               4: 'collective.bytes_in is "big", not an integer'}
    summary = format_summary(RunSummary(run_dir="r", world_size=1, ranks=(summarize_recording(rec),)))
    assert "rank-0.jsonl: 2 corrupt lines skipped (lines 3, 4; line 3: collective.meaning is 7, not a string)" \
        in summary
    assert build_report([rec], "r").to_dict()["ranks"][0]["line_errors"] == {
        "3": "collective.meaning is 7, not a string", "4": 'collective.bytes_in is "big", not an integer'}


def test_a_line_longer_than_the_bound_is_skipped_unparsed_in_bounded_memory(tmp_path: Path) -> None:
    """A 50 MB valid-JSON line took 750 MB to parse; it is skipped by its length, read a piece at a time."""
    path = tmp_path / "rank-0.jsonl"
    note = json.dumps(["notice", 0, 1, "info", "agent", "fine"])
    with open(path, "w") as f:
        f.write(json.dumps(make_header(0)) + "\n" + note + "\n")
        f.write('["notice",0,1,"info","agent","' + "x" * (50 * 2**20) + '"]\n')
        f.write(note + "\n")
    tracemalloc.start()
    try:
        rec = read_recording(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rec.corrupt_lines == [3] and len(rec.notices) == 2
    assert rec.line_errors[3] == f"longer than {codec.MAX_LINE_CHARS:,} characters, not read"
    assert peak < 6 * codec.MAX_LINE_CHARS  # one piece of the line (a str of 1-4 bytes a character), not 50 MB


def test_a_header_longer_than_the_bound_is_not_a_recording(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    path.write_text('{"format": "zeromon-recording", "pad": "' + "x" * codec.MAX_LINE_CHARS + '"}\n')
    with pytest.raises(ZeromonError, match=r"rank-0.jsonl:1: not a zeromon recording \(its first line is longer"):
        read_recording(path)
    with pytest.raises(ZeromonError, match="its first line is longer"):
        run_headers(tmp_path)


@pytest.mark.parametrize("header_change, message", [
    ({"schemas": {"collective": 7}}, "schema of \"collective\" is 7, not a list of field names"),
    ({"schemas": {"phase": [["rank"]]}}, "not a list of field names"),
    ({"rank": "0"}, 'the recording header\'s rank is "0", not an integer'),
    ({"rank": None}, "the recording header's rank is null, not an integer"),
])
def test_a_header_of_wrong_types_is_refused_naming_the_file(tmp_path: Path, header_change: dict[str, Any],
                                                             message: str) -> None:
    path = tmp_path / "rank-0.jsonl"
    _write(path, [], make_header(0) | header_change)
    with pytest.raises(ZeromonError, match=rf"rank-0.jsonl:1: .*{re.escape(message)}"):
        read_recording(path)


def test_unknown_kinds_and_reasons_are_kept_under_a_bound(tmp_path: Path) -> None:
    lines = [Line(json.dumps([f"kind{i}", 1]), "unknown") for i in range(codec.UNKNOWN_KINDS_KEPT + 10)]
    path = tmp_path / "rank-0.jsonl"
    _write(path, lines + [Line('["phase", "x", 0, "forward", 1, 2]', "wrong")] * 5)
    with mock.patch.object(rows, "LINE_ERRORS_KEPT", 3):  # read where SkippedLines counts
        rec = read_recording(path)
    assert len(rec.unknown_kinds) == codec.UNKNOWN_KINDS_KEPT
    assert len(rec.corrupt_lines) == 5 and len(rec.line_errors) == 3  # every line counted, 3 reasons kept


def test_non_utf8_bytes_in_a_string_are_replaced_and_the_record_kept(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    _write(path, [Line(b'["notice",0,1,"warning","hooks","bad \xff byte"]', "record")])
    (notice,) = read_recording(path).notices
    assert notice.message == "bad \ufffd byte"


def test_numbers_a_reader_cannot_use_are_null_where_a_field_may_be_and_refused_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    memory = ["memory", 0, 1, "forward", 5, "cpu", *[None] * 11]
    _write(path, [Line(json.dumps(memory[:6] + [float("nan")] + memory[7:] + [{}]), "record"),  # allocated: NaN
                  Line('["notice",0,' + str(2**64) + ',"info","agent","m"]', "wrong"),  # orjson: a float
                  Line('["notice",0,' + str(2**70) + ',"info","agent","\\udc00 NaN"]', "wrong"),  # json's
                  Line('["agent_stats",0,1,2,3,4,NaN]', "wrong"),
                  Line(json.dumps(memory + [{"activations": float("inf")}]), "wrong")])
    rec = read_recording(path)
    assert rec.memory[0].allocated is None
    assert rec.corrupt_lines == [3, 4, 5, 6]
    assert rec.line_errors == {3: "notice.t_ns is 1.8446744073709552e+19, not an integer",
                               4: f"notice.t_ns is {2**70}, not a 64-bit integer",
                               5: "agent_stats.cpu_time_s is NaN, not a finite number",
                               6: 'memory.categories["activations"] is Infinity, not a finite number'}


# The command line: a bad recording is a note in the output, a file that is no recording one error
# line (and its hint), exit 2; never a traceback.

def _zeromon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zeromon", *args], capture_output=True, text=True, timeout=120,
                          env=child_env())


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks whose recordings hold a line of each kind with a wrong type, corrupt lines and a long one."""
    folder = tmp_path_factory.mktemp("bad_run")
    for rank in (0, 1):
        lines = [Line(json.dumps(["run_info", rank, rank, 2, "h", 1, "job", "fsdp2", None, None, None, "cpu", None,
                                  "FULL_SHARD", None, None, None, {}]), "record")]
        for cls, kind in KINDS:
            fields = field_types(cls, kind)
            for i in _checked(cls)[:3]:
                values: list[Any] = [0 if f.accepts and int in f.accepts else "x" for f in fields]
                values[i] = {"a": 1} if fields[i].accepts != frozenset({dict}) else 7
                lines.append(Line(json.dumps([kind, *values]), "wrong"))
        lines += [Line('["step", 0, 0, 1, 2', "corrupt"), Line("x" * (codec.MAX_LINE_CHARS + 10), "corrupt")]
        header = make_header(rank, job="job", world_size=2)
        _write(folder / f"rank-{rank}.jsonl", lines, header)
    return folder


def test_summary_and_report_of_bad_lines_print_the_note_and_no_traceback(bad_run: Path) -> None:
    for command in (["summary", str(bad_run)], ["report", str(bad_run)], ["report", str(bad_run), "--json"]):
        proc = _zeromon(*command)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode in (0, 3), (command, proc.stderr)  # 3: the ranks' ends are missing (cut off)
        if "--json" in command:
            ranks = json.loads(proc.stdout)["ranks"]
            assert all(r["corrupt_lines"] and r["line_errors"] for r in ranks)
        else:
            assert "rank-1.jsonl: " in proc.stdout and "corrupt lines skipped" in proc.stdout, proc.stdout
            assert " is {\"a\": 1}, not " in proc.stdout


def test_replay_of_bad_lines_loads(bad_run: Path) -> None:
    from zeromon.sources.replay import load_tracks

    try:
        load_tracks(bad_run)
    except ZeromonError as exc:  # no record left to play: said in one line
        assert "no records to play back" in exc.message


@pytest.mark.parametrize("content", [b"", b"\x1f\x8b\x08\x00 gzip, not a recording", b'{"format": "zeromon-recording"'
                                     b', "version": "1.2", "schemas": {"collective": 5}}\n'])
def test_a_file_that_is_no_recording_is_one_error_line_and_exit_2(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "rank-0.jsonl").write_bytes(content)
    for command in ("summary", "report"):
        proc = _zeromon(command, str(tmp_path))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        first, *rest = proc.stderr.splitlines()
        assert first.startswith("zeromon: error: ") and "rank-0.jsonl" in first
        assert all(line.startswith("hint: ") for line in rest)


def test_huge_valid_durations_are_read_and_analysed_without_overflow(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A valid JSON number is not always a usable one: issue_s and blocked_s of 1e300 (a damaged value,
    finite) made int(seconds * 1e9) overflow in the interval helpers; they are taken as a week at most."""
    run = tmp_path / "run"
    run.mkdir()
    s = 10**9
    records = [
        PhaseSpan(rank=0, step=0, phase="forward", start_ns=0, end_ns=2 * s),
        CollectiveEvent(seq=0, rank=0, step=0, phase="forward", op="all_reduce", api="all_reduce", bytes_in=8,
                        bytes_out=8, dtype="float32", group_size=2, async_op=True, issue_ns=s // 2,
                        complete_ns=s, blocked_s=1e300, timing="wait", meaning="grads", wait_ns=s, issue_s=1e300),
        CollectiveEvent(seq=1, rank=0, step=-1, phase="other", op="all_reduce", api="all_reduce", bytes_in=8,
                        bytes_out=8, dtype="float32", group_size=2, async_op=False, issue_ns=0,
                        complete_ns=None, blocked_s=1.7e308, timing="sync", meaning="other", wait_ns=0,
                        issue_s=1.7e308),
        StepSummary(rank=0, step=0, start_ns=0, end_ns=2 * s, phase_s={"forward": 2.0}, collectives=1, comm_bytes=8,
                    comm_bytes_by_op={"all_reduce": 8}, comm_union_s=1e300, blocked_s=1e300, peak_memory=None),
    ]
    (run / "rank-0.jsonl").write_text("\n".join([json.dumps(make_header(0)), *map(codec.encode_record, records)])
                                      + "\n")
    rec = read_recording(run / "rank-0.jsonl")
    assert len(rec.collective_columns().seq) == 2
    week_ns = int(7 * 86400 * 1e9)
    assert max(end - start for start, end in blocked_intervals(rec.collective_columns())) == week_ns
    for command in ("summary", "report"):
        assert main([command, str(run)]) in (0, 3), command  # 3: no end record, said
        out, err = capsys.readouterr()
        assert "Traceback" not in err and "rank" in out, err


def test_a_replay_says_which_lines_it_skipped_as_summary_does(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The replay (TUI alerts, the dashboard's banner, `live --replay`'s note) names the skipped lines, in
    the words of `zeromon summary`, instead of playing the rest as if nothing were missing."""
    from zeromon.sources.replay import final_view

    run = tmp_path / "run"
    run.mkdir()
    s = 10**9
    good = [PhaseSpan(rank=0, step=0, phase="forward", start_ns=0, end_ns=s),
            StepSummary(rank=0, step=0, start_ns=0, end_ns=2 * s, phase_s={"forward": 1.0}, collectives=0,
                        comm_bytes=0, comm_bytes_by_op={}, comm_union_s=0.0, blocked_s=0.0, peak_memory=None)]
    lines = [json.dumps(make_header(0)), codec.encode_record(good[0]), '["phase", 0, 1, "forw', '["step", "zero"]',
             codec.encode_record(good[1])]
    (run / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    view = final_view(run)
    assert view.error is not None and view.error.startswith("rank-0.jsonl: 2 corrupt lines skipped (lines 3, 4;")
    assert view.ranks and view.ranks[0].last_step is not None  # the rest plays
    assert main(["live", "--once", "--replay", str(run)]) in (0, 3)
    assert f"note: {view.error}" in capsys.readouterr().out
