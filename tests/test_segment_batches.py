"""The report's fast reading of a compact file gives what the per-segment reader gives: the batched walk
(zeromon.model.segment_batches) the same records, numbers and reasons as segments.iter_compact_fields,
whatever the records, the flushes and the damage; the summaries as rows (StepRecords) the same
summaries and the same analysis as the objects."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_compact_format import _KEPT, HEADER, _write, records
from test_reader_properties import PROPERTIES

from zeromon.analysis.report import analyze_rank
from zeromon.errors import ZeromonError
from zeromon.model import segment_batches
from zeromon.model.codec import COMPACT_MAGIC, SkippedLines, read_recording
from zeromon.model.events import CollectiveEvent, Record, StepSummary
from zeromon.model.segment_batches import iter_compact_batched
from zeromon.model.segments import FRAME, CompactWriter, iter_compact_fields
from zeromon.model.step_records import StepRecords, step_column


def _walk(reader: Any, path: Path, checked_by_caller: type | None) -> tuple[Any, ...]:
    lines: list[int] = []
    errors: dict[int, str] = {}
    unknown: dict[str, int] = {}
    fields = list(reader(path, SkippedLines(lines, errors), unknown, checked_by_caller))
    return fields, lines, errors, unknown


def _damage(path: Path, flips: list[tuple[float, int]], cut: float | None) -> None:
    """Bits flipped and the end cut, past the header's segment (whose damage is an error in both)."""
    data = bytearray(path.read_bytes())
    start = len(COMPACT_MAGIC) + FRAME.size + FRAME.unpack_from(data, len(COMPACT_MAGIC))[3]
    if len(data) <= start:
        return
    for where, bit in flips:
        data[start + int(where * (len(data) - start - 1))] ^= 1 << bit
    if cut is not None:
        data = data[:start + int(cut * (len(data) - start))]
    path.write_bytes(bytes(data))


@PROPERTIES
@given(recs=st.lists(records() | st.builds(lambda s: StepSummary(0, s, s, s + 1, {"agent": 0.5}, 1, 2, {"x": 3},
                                                                  0.1, 0.2, None, 0.0, 0.0, 0.1),
                                           st.integers(0, 50)), max_size=60),
       flush_after=st.sets(st.integers(0, 60)),
       flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 7)), max_size=2),
       cut=st.none() | st.floats(0, 1), batch_rows=st.sampled_from([1, 3, 4096]))
def test_the_batched_walk_gives_what_the_per_segment_walk_gives(recs: list[Record], flush_after: set[int],
                                                              flips: list[tuple[float, int]], cut: float | None,
                                                              batch_rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0.zmr"
        _write(CompactWriter(path, 0, **HEADER), recs, flush_after)
        _damage(path, flips, cut)
        with mock.patch.object(segment_batches, "BATCH_ROWS", batch_rows):
            for checked_by_caller in (None, CollectiveEvent):
                assert _walk(iter_compact_batched, path, checked_by_caller) == \
                    _walk(iter_compact_fields, path, checked_by_caller)
            # The summaries put straight into read_recording's rows: the same recording.
            try:
                objects = read_recording(path)
            except ZeromonError as exc:  # the header's segment cut short
                objects_error = str(exc)
                with pytest.raises(ZeromonError) as raised:
                    read_recording(path, steps_as_rows=True)
                assert str(raised.value) == objects_error
                return
            rows = read_recording(path, steps_as_rows=True)
            kept = (*_KEPT, "corrupt_lines", "line_errors")
            assert {name: getattr(rows, name) for name in kept} == {name: getattr(objects, name) for name in kept}


def test_without_orjson_the_batched_walk_is_the_per_segment_walk(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.zmr"
    steps = [StepSummary(0, s, s, s + 1, {}, 1, 2, {}, 0.1, 0.2, None) for s in range(5)]
    _write(CompactWriter(path, 0, **HEADER), steps, {1, 3})
    with mock.patch.object(segment_batches, "_loads", return_value=None), \
            mock.patch.object(segment_batches, "iter_compact_fields", wraps=iter_compact_fields) as per_segment:
        assert _walk(iter_compact_batched, path, None) == _walk(iter_compact_fields, path, None)
    assert per_segment.called


def test_the_summaries_as_rows_are_the_summaries_and_analyse_alike(fsdp2_run: Path) -> None:
    for path in sorted(fsdp2_run.glob("rank-*")):
        objects, rows = read_recording(path), read_recording(path, steps_as_rows=True)
        assert isinstance(rows.steps, StepRecords) and not isinstance(objects.steps, StepRecords)
        assert rows.steps == objects.steps and list(rows.steps) == list(objects.steps)
        assert rows.steps[2] == objects.steps[2] and rows.steps[-1] == objects.steps[-1]
        for name in ("step", "start_ns", "phase_s", "exposed_comm_s"):
            assert list(step_column(rows.steps, name)) == [getattr(s, name) for s in objects.steps]
        one, two = analyze_rank(objects), analyze_rank(rows)
        assert (two.report, two.findings, two.arrivals, two.samples) == (one.report, one.findings, one.arrivals,
                                                                          one.samples)


def test_rows_of_an_older_format_take_the_missing_fields_defaults() -> None:
    rows = StepRecords.of([[0, 1, 10, 20, {}, 1, 2, {}, 0.1, 0.2, None]])  # format 1.0: no overlap fields
    assert rows[0] == StepSummary(0, 1, 10, 20, {}, 1, 2, {}, 0.1, 0.2, None)
    assert list(step_column(rows, "exposed_comm_s")) == [None]
