"""The recorder's cheaper paths give what the plain ones gave: a record built by record_maker is the
dataclass's own; seconds is round(ns / 1e9, 9); a column's planes are the 8-byte values cut into
planes; and the collectives a real Recorder writes, publishes and counts are the events the keyword
constructor, round() and the one-lock-per-record publishing made before."""

from __future__ import annotations

import bisect
import collections
import contextlib
import copy
import dataclasses
import functools
import gc
import itertools
import math
import operator
import os
import random
import shutil
import sys
import tempfile
import time
import types
import weakref
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from test_reader_properties import INT64, PROPERTIES
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

from zeromon.analysis.bandwidth import event_bandwidth
from zeromon.model import column_arrays, columnar, segments
from zeromon.model.classes import mutable
from zeromon.model.codec import encode_record, iter_records
from zeromon.model.columnar import (
    _LIMITS,
    SPECS,
    _as_ns,
    _codes,
    _planes,
    _repeated,
    decode,
    encode,
)
from zeromon.model.compiled import MODULES, compiled
from zeromon.model.events import (
    MEMORY_CATEGORIES,
    CollectiveEvent,
    MemorySample,
    PhaseSpan,
    StepSummary,
    default_maker,
    record_maker,
)
from zeromon.model.kinds import FIELDS_OF
from zeromon.model.segments import CompactWriter, _joined
from zeromon_agent.compact import Unmade, materialize
from zeromon_agent.hooks.cuda import CudaTimer
from zeromon_agent.hooks.state import (
    RAW_AGENT,
    RAW_COLLECTIVE,
    RAW_DONE,
    RAW_MEMORY,
    RAW_PHASE,
    RAW_SEEN_DONE,
    RAW_STEP_END,
    RAW_STEP_START,
    RAW_WAIT,
    UNTIMED,
    HotState,
)
from zeromon_agent.live import totals as live_totals
from zeromon_agent.live.recent import RecentRecords
from zeromon_agent.live.totals import BUSBW_WINDOW, DURATION_BUCKETS, CollectiveTotals, LiveTotals
from zeromon_agent.live.totals import counted as live_counted
from zeromon_agent.memory.watch import MEMORY_VALUES
from zeromon_agent.recorder import collective_records, loop, step_acc, step_book
from zeromon_agent.recorder.loop import Recorder
from zeromon_agent.recorder.step_acc import Mark, StepAcc, meaning_of, new_acc, seconds

_any_value = (st.none() | st.booleans() | st.integers(*INT64) | st.floats(allow_nan=False) | st.text(max_size=8)
              | st.sampled_from(["forward", "all_gather", "sync"]))


def _record_makers(cls: type) -> list[Any]:
    """record_maker(cls) as the install makes it (in C where it built _planes.c) and in Python."""
    with mock.patch.dict(os.environ, {"ZEROMON_NO_COMPILED": "1"}):
        in_python = record_maker(cls)
    return [record_maker(cls), in_python]


@PROPERTIES
@given(cls=st.sampled_from([CollectiveEvent, PhaseSpan, StepSummary, MemorySample]), data=st.data())
def test_a_record_made_by_record_maker_is_the_one_its_constructor_makes(cls: type, data: st.DataObject) -> None:
    values = tuple(data.draw(_any_value) for _ in dataclasses.fields(cls))
    for made, plain in ((make(values), cls(*values)) for make in _record_makers(cls)):
        _same_record(made, plain, values)
    _same_record(_record_makers(cls)[0](list(values)), cls(*values), values)  # any sequence of the values


def _same_record(made: Any, plain: Any, values: tuple[Any, ...]) -> None:
    cls = type(plain)
    assert type(made) is cls
    assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain)
    assert dataclasses.astuple(made) == values
    assert encode_record(made) == encode_record(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.rank = 1  # type: ignore[misc]


def test_default_maker_makes_what_the_constructor_makes_with_no_argument() -> None:
    """default_maker(cls)() (its slots set in one C call where the package built it) is cls(): equal, each list or
    dict its own, another factory called each time; a class it cannot make so is made by cls itself."""
    @mutable
    class Odd:
        n: int = 3
        tags: list[str] = dataclasses.field(default_factory=list)
        by: dict[str, int] = dataclasses.field(default_factory=dict)
        made: list[int] = dataclasses.field(default_factory=lambda: [1, 2])
        label: str | None = None

    for cls in (StepAcc, Odd):
        make = default_maker(cls)
        first, second = make(), make()
        assert type(first) is cls and first == cls() == second
        assert dataclasses.astuple(first) == dataclasses.astuple(cls())
        lists = [f.name for f in dataclasses.fields(cls) if f.default_factory is not dataclasses.MISSING]
        assert lists and all(getattr(first, name) is not getattr(second, name) for name in lists)
    assert default_maker(Odd)().made == [1, 2]

    @mutable
    class Required:
        n: int

    @mutable
    class Checked:
        n: int = 0

        def __post_init__(self) -> None:
            self.n += 1

    assert default_maker(Required) is Required and default_maker(Checked) is Checked
    with mock.patch.dict(os.environ, {"ZEROMON_NO_COMPILED": "1"}):
        assert default_maker(StepAcc) is StepAcc


class _Held:
    """An object the collector follows, of a class whose instances a weak reference can watch."""

    record: Any = None


def test_a_record_made_in_c_of_values_the_collector_does_not_follow_is_not_tracked() -> None:
    """_planes.c's make_record: a frozen record of numbers, strings and dicts of them (a step's summary) is out of the
    collector's lists as made, as the live views' untrack would leave it; one that holds something the collector
    follows stays tracked, and a cycle through it is still collected."""
    make = _record_makers(StepSummary)[0]
    if not isinstance(make, functools.partial):
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    values = [0, 3, 10, 20, {"forward": 1e-8}, 2, 8, {"all_gather": 8}, 1e-8, 0.0, None, 1e-8, 0.0, 1e-8]
    assert not gc.is_tracked(make(values))
    held = _Held()
    values[7] = {"all_gather": held}  # a dict the collector follows: it holds an object
    record = make(values)
    assert gc.is_tracked(record)
    held.record = record  # a cycle: the record, its dict, the object, the record
    alive = weakref.ref(held)
    del record, held, values
    gc.collect()
    assert alive() is None


def test_record_maker_takes_only_frozen_slotted_dataclasses_without_post_init_and_all_their_values() -> None:
    @dataclasses.dataclass(slots=True)
    class Mutable:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            assert self.a >= 0

    for cls in (Mutable, Checked):
        with pytest.raises(TypeError, match="record_maker takes"):
            record_maker(cls)
    for make in _record_makers(PhaseSpan):
        with pytest.raises(TypeError, match="PhaseSpan takes 6 values"):
            make((0, 1, "forward"))
    make_record = getattr(compiled("zeromon.model._planes"), "make_record", None)
    if make_record is not None:  # the C maker sets only plain object slots of the class it makes
        for slot in (CollectiveEvent.rank, PhaseSpan.duration_s, PhaseSpan.__init__):
            with pytest.raises(TypeError, match="not a plain object slot"):
                make_record(PhaseSpan, (slot,) * 6, (0,) * 6)


@PROPERTIES
@given(ns=st.integers(*INT64) | st.integers(-10**16, 10**16) | st.integers(-10**10, 10**10)
       | st.sampled_from([2**22 * 10**9 + d for d in (-1, 0, 1)] + [0, 1, -1]))
def test_seconds_is_ns_rounded_to_nine_decimals(ns: int) -> None:
    assert seconds(ns) == round(ns / 1e9, 9)


def _planes_cut_from_eight_bytes(values: Sequence[int]) -> bytes:
    """The planes as the compact writer first wrote them: 8-byte values, the low ``width`` planes kept."""
    packed = array("q", values)
    if sys.byteorder != "little":
        packed.byteswap()
    low, high = (min(packed), max(packed)) if packed else (0, 0)
    width = next(w for w, limit in _LIMITS if -limit <= low and high < limit)
    data = packed.tobytes()
    return bytes((width,)) + b"".join(data[i::8] for i in range(width))


@PROPERTIES
@given(values=st.lists(st.integers(*INT64) | st.integers(-200, 200) | st.integers(-(2**31), 2**31), max_size=40))
def test_a_column_s_planes_are_the_eight_byte_values_cut_into_planes(values: list[int]) -> None:
    assert _planes(values) == _planes_cut_from_eight_bytes(values)


@PROPERTIES
@given(value=st.integers(*INT64) | st.integers(-200, 200) | st.integers(-(2**31), 2**31), n=st.integers(1, 12))
def test_a_column_of_one_value_is_that_value_s_planes(value: int, n: int) -> None:
    assert _repeated(value, n) == _planes([value] + [0] * (n - 1))


@pytest.mark.parametrize("column", [[0, 2**63], [-(2**63) - 1]])
def test_a_column_past_64_bits_is_refused_as_before(column: list[int]) -> None:
    with pytest.raises(OverflowError):
        _planes(column)
    with pytest.raises(OverflowError):
        _repeated(column[-1], 2)


_OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")
_PHASES = ("forward", "backward", "optimizer", "setup")
_raw_collective = st.tuples(st.sampled_from(_OPS), st.sampled_from(_PHASES), st.integers(0, 2**40),
                            st.integers(0, 2**33), st.integers(0, 2**20), st.integers(0, 2**20),
                            st.sampled_from([None, "float32", "torch.bfloat16"]), st.integers(0, 2))


def _plain_event(rank: int, offset: int, seq: int, raw: tuple[Any, ...]) -> CollectiveEvent:
    """A synchronous collective as _finalize built it before record_maker and _seconds."""
    op, phase, t0, length, b_in, b_out, dtype, step = raw
    t1 = t0 + length
    return CollectiveEvent(
        seq=seq, rank=rank, step=step, phase=phase, op=op, api=f"{op}_x", bytes_in=b_in, bytes_out=b_out,
        dtype="" if dtype is None else str(dtype).replace("torch.", ""), group_size=-1, async_op=False,
        issue_ns=t0 + offset, complete_ns=t1 + offset, blocked_s=round((t1 - t0) / 1e9, 9), timing="sync",
        meaning=meaning_of(op, phase, max(b_in, b_out)), wait_ns=t0 + offset, issue_s=round((t1 - t0) / 1e9, 9))


@PROPERTIES
@given(raws=st.lists(_raw_collective, min_size=1, max_size=40))
def test_the_collectives_a_recorder_writes_and_publishes_are_the_plain_path_s(raws: list[tuple[Any, ...]]) -> None:
    raws = sorted(raws, key=operator.itemgetter(7))  # issued step by step
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-3.zmr"
        state = HotState()
        recorder = Recorder(state, 3, CompactWriter(path, 3), 0.2)
        recorder.collectives._group_sizes[None] = -1  # no process group in this process: its size is unknown
        for seq, (op, phase, t0, length, b_in, b_out, dtype, step) in enumerate(raws, start=1):
            state.raw.append((RAW_COLLECTIVE, seq, f"{op}_x", op, t0, t0 + length, b_in, b_out, dtype, None, False,
                              None, phase, step, None, False, None))
        for step in range(3):
            state.control.append((RAW_STEP_START, step, step, None, "forward"))
            state.control.append((RAW_STEP_END, step, 2**41, None, True))
        recorder.stop()
        expected = [_plain_event(3, recorder.clock_offset_ns, seq, raw) for seq, raw in enumerate(raws, start=1)]
        assert [r for r in iter_records(path) if isinstance(r, CollectiveEvent)] == expected
        published = [(cursor, r) for cursor, r in recorder.live.recent_records() if isinstance(r, CollectiveEvent)]
        assert [r for _, r in published] == expected
        assert [cursor for cursor, _ in recorder.live.recent_records()] == list(range(1, recorder.live.cursor + 1))
        totals = LiveTotals()
        for event in expected:
            duration = event.duration_s
            bandwidth = event_bandwidth(event) if duration else None
            totals.count_collective(event, duration, bandwidth[1] if bandwidth is not None else None)
        assert recorder.live.totals.collectives == totals.collectives
        assert {op: list(v) for op, v in recorder.live.totals.busbw.items()} == {op: list(v) for op, v in totals.busbw.items()}


def _plain_encode(spec: Sequence[Sequence[Any]], rows: Sequence[tuple[Any, ...]]) -> tuple[bytes, dict[str, list[Any]]]:
    """columnar.encode as it was before its per-column fast paths: every column through _planes."""
    n = len(rows)
    columns = list(zip(*rows, strict=True))
    ints: dict[str, Sequence[int]] = {}
    tables: dict[str, list[Any]] = {}
    out: list[bytes] = []
    for (name, how, base), column in zip(spec, columns, strict=True):
        if how == "str":
            codes, tables[name] = _codes(column)
            out.append(_planes(codes))
            continue
        if how == "map":  # the key orders as codes, then every value less the previous one of its key
            codes, orders = _codes([tuple(mapping) for mapping in column])
            tables[name] = [[base.index(key) for key in order] for order in orders]
            out.append(_planes(codes))
            entries = [(key, value) for mapping in column for key, value in mapping.items()]
            out.append(_planes([value - next((v for k, v in reversed(entries[:i]) if k == key), 0)
                                for i, (key, value) in enumerate(entries)]))
            continue
        if how.endswith("?"):
            out.append(_planes([v is None for v in column]))
        values = ints[name] = _as_ns(how, column)
        if base == "prev":
            coded: Sequence[int] = [values[0], *map(operator.sub, values[1:], values[:-1])] if n else []
        elif base is None:
            coded = values
        elif len(base) == 1:
            coded = list(map(operator.sub, values, ints[base[0]]))
        else:
            coded = list(map(operator.sub, values, map(operator.sub, ints[base[0]], ints[base[1]])))
        out.append(_planes(coded))
    return b"".join(out), tables


# Integers near and past 64 bits besides: a column whose values or differences wrap in 64-bit arrays is coded
# in Python's integers (its code may still fit), or refused with OverflowError, as the general path does.
_WIDE = st.integers(-(2**63), 2**63 - 1) | st.sampled_from([-(2**63), 2**63 - 1, 2**62, -(2**62), 2**63, -(2**63) - 1])
_column_values = {
    "int": st.integers(-(2**40), 2**40) | st.integers(0, 3) | _WIDE, "int?": st.none() | st.integers(-(2**40), 2**40),
    "ns": st.integers(0, 10**15).map(lambda ns: ns / 1e9), "ns?": st.none() | st.integers(0, 10**12).map(lambda ns: ns / 1e9),
    "bool": st.booleans(), "str": st.none() | st.sampled_from(_OPS) | st.integers(0, 300).map(str),
    "map": st.dictionaries(st.sampled_from(MEMORY_CATEGORIES), st.integers(-(2**40), 2**40), max_size=11)}
# A handful of distinct values per column, as a real segment has: a nullable field null in every row (an
# allocator's on CPU), a map empty or of one key order.
_few_values = {"str": st.sampled_from([None, "forward"]), "int?": st.none(),
               "map": st.sampled_from([(), ("sharded_params", "activations")]).flatmap(
                   lambda keys: st.fixed_dictionaries({key: st.integers(0, 2**30) for key in keys}))}


# The coders of a segment's integer and string columns: the package's C build (zeromon/model/_planes.c) and numpy's,
# where it was not built (column_arrays.COMPILED None).
CODERS = ("compiled", "numpy")


@contextlib.contextmanager
def coded_by(coder: str) -> Iterator[None]:
    """columnar.encode with ``coder``'s columns; the compiled one skips the test where the package was built without it."""
    if coder == "compiled" and column_arrays._compiled is None:
        pytest.skip("the package was installed without its C coder (no C compiler at its build)")
    with mock.patch.object(column_arrays, "COMPILED", column_arrays._compiled if coder == "compiled" else None):
        yield


def test_the_c_modules_are_built_where_a_c_compiler_is() -> None:
    """The install (`pip install -e .`, .ci/run's) builds the optional extension wherever a compiler is, as here: a
    build that failed unseen would leave every flush on numpy's slower path."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: the package installs without its C coder")
    assert column_arrays._compiled is not None, "zeromon.model._planes was not built: reinstall (pip install -e .)"
    for name in MODULES:
        assert compiled(name, environment=False) is not None, f"{name} was not built: reinstall (pip install -e .)"
    assert os.environ.get("ZEROMON_NO_COMPILED") or column_arrays.COMPILED is column_arrays._compiled


@PROPERTIES
@pytest.mark.parametrize("coder", CODERS)
@given(cls=st.sampled_from(sorted(SPECS, key=lambda cls: cls.__name__)), data=st.data(), n=st.integers(1, 40))
def test_a_segment_s_columns_are_the_general_path_s_bytes(coder: str, cls: type, data: st.DataObject, n: int) -> None:
    with coded_by(coder):
        _a_segment_s_columns_are_the_general_path_s_bytes(cls, data, n)


def _a_segment_s_columns_are_the_general_path_s_bytes(cls: type, data: st.DataObject, n: int) -> None:
    spec = SPECS[cls]
    few = data.draw(st.booleans())
    # Columns that hold their base field's values (a synchronous collective's issue_s, its blocked_s), where
    # the two are numbers of one kind: in every row, or in all rows but the last.
    names = [name for name, _, _ in spec]
    hows = dict(zip(names, (how for _, how, _ in spec), strict=True))
    mirrored = data.draw(st.sets(st.sampled_from([
        name for name, how, base in spec if isinstance(base, list) and len(base) == 1 and how[:2] == hows[base[0]][:2]])))
    all_rows = data.draw(st.booleans())
    rows = []
    for i in range(n):
        row = [data.draw(_few_values[how] if few and how in _few_values else _column_values[how])
               for _, how, _ in spec]
        for name, _, base in spec:
            if name in mirrored and (all_rows or i < n - 1):
                row[names.index(name)] = row[names.index(base[0])]
        rows.append(tuple(row))
    expected = _outcome(_plain_encode, spec, rows)
    assert _outcome(encode, spec, rows) == expected
    # The same rows as the columns of the batches a recorder wrote them in (write_columns).
    cut = data.draw(st.integers(0, n))
    chunks = [list(zip(*part, strict=True)) for part in (rows[:cut], rows[cut:]) if part]
    assert _outcome(encode, spec, [], _joined(chunks)) == expected


def _outcome(encoder: Any, *args: Any) -> Any:
    """What an encoder gives, or that it refused the values as past 64 bits."""
    try:
        return encoder(*args)
    except OverflowError:
        return "OverflowError"


def test_a_segment_of_batches_and_single_records_reads_back_in_the_order_written(tmp_path: Path) -> None:
    """A kind's batches (write_columns) and its records written one at a time, in any order, read back in the
    order written: whichever came first, the others follow it as rows (the segment holds one or the other)."""
    spans = [(0, step, "forward", 10 * step, 10 * step + 5, "host") for step in range(8)]

    def batch(writer: CompactWriter, part: list[tuple[Any, ...]]) -> None:
        assert writer.write_columns(PhaseSpan, list(zip(*part, strict=True)), len(part))

    for ways in ("bbb", "bsb", "sbs", "ssb"):
        path = tmp_path / f"rank-0-{ways}.zmr"
        writer = CompactWriter(path, 0)
        for way, part in zip(ways, (spans[:2], spans[2:3], spans[3:]), strict=True):
            if way == "b":
                batch(writer, part)
            else:
                for span in part:
                    assert writer.write_values(PhaseSpan, span)
        writer.flush()
        batch(writer, spans[:1])  # the next segment's
        writer.close()
        assert [r for r in iter_records(path) if isinstance(r, PhaseSpan)] == [PhaseSpan(*span) for span in spans + spans[:1]]


_field_value = st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.none() | st.text(max_size=3)


@PROPERTIES
@given(batches=st.lists(st.lists(st.lists(_field_value, max_size=5), min_size=3, max_size=3), max_size=5),
       as_tuples=st.booleans(), spoil=st.sampled_from([None, "a field shorter", "a field fewer", "a field not a list"]))
def test_a_kind_s_batches_are_joined_in_c_as_in_python(batches: list[list[list[Any]]], as_tuples: bool,
                                                     spoil: str | None) -> None:
    """segments._joined of several batches (each its fields, as write_columns had them): _planes.c's join_columns
    gives Python's lists, value for value and object for object, and refuses what Python refuses (fields of
    two lengths in a batch, batches of other fields) with the same error; one batch is kept as it is."""
    batches = [[field[:len(batch[0])] + [0] * (len(batch[0]) - len(field)) for field in batch] for batch in batches]
    chunks: list[Any] = [[tuple(field) for field in batch] if as_tuples else batch for batch in batches]
    if spoil is not None and chunks:
        if spoil == "a field shorter":
            chunks[-1] = [*chunks[-1][:2], [*chunks[-1][2], 1]]
        elif spoil == "a field fewer":
            chunks[-1] = chunks[-1][:2]
        else:
            chunks[-1] = [*chunks[-1][:2], "abc"]
    outcomes = []
    for join in (segments._JOIN_COLUMNS, None):
        with mock.patch.object(segments, "_JOIN_COLUMNS", join):
            try:
                outcomes.append(segments._joined(chunks))
            except (ValueError, TypeError) as exc:
                outcomes.append(type(exc))
    assert segments._JOIN_COLUMNS is not None or os.environ.get("ZEROMON_NO_COMPILED")
    c_way, python_way = outcomes
    if spoil == "a field not a list" and len(chunks) > 1:
        assert c_way is TypeError  # Python's chain takes a string's letters; nothing the agent writes
        return
    assert c_way == python_way and (c_way is None) == (not chunks)
    if isinstance(c_way, list) and len(chunks) > 1:
        assert all(type(field) is list for field in c_way)
        assert all(a is b for c, p in zip(c_way, python_way, strict=True) for a, b in zip(c, p, strict=True))
    if len(chunks) == 1:
        assert c_way == list(chunks[0]) and all(a is b for a, b in zip(c_way, chunks[0], strict=True))


@pytest.mark.parametrize("in_c", [True, False])
def test_a_run_of_rows_is_written_as_each_one_s_values_would_be(in_c: bool, tmp_path: Path) -> None:
    """write_rows (a run of a kind's values in one call, its fit checked in C where _planes.c was built, or a row at
    a time) and write_values of each, the writer writing the record of one that does not go into the columns: the
    same file, across batches before them (of their kind too) and a segment's end among them."""
    def sample(t: int, categories: dict[str, Any]) -> tuple[Any, ...]:
        return (0, 3, "forward", t, "cpu", *[None] * 10, 2**20 + t, categories)

    rows = [sample(2, {"not a category": 1}), sample(1, {}), sample(3, {"sharded_params": 4096}), sample(4, {}),
            sample(5, {"buffers": 7}), sample(6, {"not a category": 2}), sample(7, {"buffers": 1}),
            sample(8, {"buffers": True})]  # a bool is not a count: JSON writes it true
    assert [columnar.fits(columnar.SPECS[MemorySample])(row) for row in rows] == [False, True, True, True, True, False,
                                                                                  True, False]
    before = sample(0, {})
    files = []
    for way in ("rows", "values"):
        path = tmp_path / f"rank-0-{way}.zmr"
        writer = CompactWriter(path, 0)
        writer.write_columns(PhaseSpan, list(zip((0, 3, "forward", 0, 1, "host"), strict=True)), 1)
        writer.write_columns(MemorySample, list(zip(before, strict=True)), 1)  # a batch of their kind before them
        with mock.patch.object(columnar, "_ROWS_FIT", columnar._ROWS_FIT if in_c else None):
            fit_run = columnar.fit_run(columnar.SPECS[MemorySample], segments._FITS[MemorySample][1])
        with mock.patch.object(segments, "SEGMENT_RECORDS", 5), \
                mock.patch.dict(segments._FIT_RUNS, {MemorySample: fit_run}):  # a segment ends among them
            if way == "rows":
                writer.write_rows(MemorySample, rows, lambda row: MemorySample(*row))
            else:
                for row in rows:
                    if not writer.write_values(MemorySample, row):
                        writer.write(MemorySample(*row))
        writer.close()
        files.append(path.read_bytes())
        assert [(r.t_ns, r.categories) for r in iter_records(path) if isinstance(r, MemorySample)] == \
            [(row[3], row[-1]) for row in [before, *rows[:-1]]]  # the reader skips a count that is true, as corrupt
    assert files[0] == files[1]


def test_a_batch_the_columns_cannot_hold_is_written_as_json_rows_and_reads_back(tmp_path: Path) -> None:
    """A batch whose deltas pass 64 bits (encode's OverflowError) is written as its records' JSON rows, as
    records written one at a time are: nothing is lost, the segment's other kinds stay columns."""
    spans = [(0, 1, "forward", -(2**62), 15, "host"), (0, 1, "backward", 2**62 + 2**61, 2**62 + 2**61 + 5, "host")]
    path = tmp_path / "rank-0.zmr"
    writer = CompactWriter(path, 0)
    assert writer.write_columns(PhaseSpan, list(zip(*spans, strict=True)), 2)
    writer.write(MemorySample(0, 1, "forward", 12, "cpu", *[None] * 10, 2**20))
    writer.close()
    records = [r for r in iter_records(path) if isinstance(r, (PhaseSpan, MemorySample))]
    assert records[:2] == [PhaseSpan(*span) for span in spans] and isinstance(records[2], MemorySample)
    assert writer.records_lost == 0


@pytest.mark.parametrize("coder", CODERS)
def test_a_map_column_of_more_than_128_key_orders_has_two_byte_codes_and_reads_back(coder: str) -> None:
    spec = SPECS[MemorySample]
    orders = [order for size in (2, 3) for order in itertools.permutations(MEMORY_CATEGORIES[:6], size)]
    rows = [(0, i, "forward", i, "cpu", *[None] * 11, dict.fromkeys(order, i)) for i, order in enumerate(orders)]
    assert len(orders) > 2**7
    with coded_by(coder):
        data, tables = encode(spec, rows)
    assert (data, tables) == _plain_encode(spec, rows)
    decoded, end = decode(spec, data, 0, len(rows), tables)
    assert end == len(data)
    assert [list(mapping.items()) for mapping in decoded.columns["categories"]] == [list(row[-1].items()) for row in rows]


@pytest.mark.parametrize("coder", CODERS)
def test_a_string_column_of_more_than_128_values_has_two_byte_codes_as_before(coder: str) -> None:
    spec = SPECS[PhaseSpan]
    rows = [(0, i, f"phase-{i}", i, i + 1, "host") for i in range(300)]
    with coded_by(coder):
        assert encode(spec, rows) == _plain_encode(spec, rows)


@PROPERTIES
@given(runs=st.lists(st.tuples(st.integers(*INT64) | st.integers(-300, 300) | st.none(), st.integers(1, 4)),
                     min_size=1, max_size=12),
       seconds=st.booleans(), base=st.sampled_from([0, 1, 2]))
def test_an_integer_column_of_runs_of_one_object_is_coded_as_of_distinct_objects(
        runs: list[tuple[int | None, int]], seconds: bool, base: int) -> None:
    """_planes.c's int_column takes a row that holds the row before's object (a rank, a step, a size queued as one
    object) at that row's value: the values and planes of the same column made of distinct objects, or the same
    error, None among them and seconds too."""
    if column_arrays._compiled is None:
        pytest.skip("the package was installed without its C coder (no C compiler at its build)")
    int_column = column_arrays._compiled.int_column
    made = [None if v is None else (v % 10**6) / 1e3 if seconds else v for v, _ in runs]
    shared = [value for value, (_, n) in zip(made, runs, strict=True) for _ in range(n)]
    distinct = [None if v is None else float(repr(v)) if seconds else int(str(v)) for v in shared]
    other, _ = int_column([1] * len(shared), False, False, 0, None, None)  # a base column for base 2
    outcomes = [_outcome(int_column, column, seconds, True, base, other if base == 2 else None, None)
                for column in (shared, distinct)]
    assert outcomes[0] == outcomes[1]
    if None in shared:
        with pytest.raises(TypeError):  # a None in a column that takes none, the run's too
            int_column(shared, seconds, False, base, other if base == 2 else None, None)


@pytest.mark.parametrize("column", [[], [None], [0, None, False, 0.0, "", None], (None, None, 3), [float("nan"), 2**70]])
def test_a_column_s_nulls_are_counted_in_c_as_count_counts_them(column: Sequence[Any]) -> None:
    """_planes.c's nones, by identity, gives list.count(None) for the values a column holds (zeros, false, empty
    strings, NaN and big integers are not None), and columnar._nulls the same without it."""
    if columnar._NONES is None:
        pytest.skip("the package was installed without its C coder (no C compiler at its build)")
    assert columnar._NONES(column) == column.count(None)
    with mock.patch.object(columnar, "_NONES", None):
        assert columnar._nulls(column) == column.count(None)


@pytest.mark.parametrize("coder", CODERS)
@pytest.mark.parametrize("values", [40, 200])
def test_a_string_column_of_runs_of_one_object_is_coded_as_every_value_looked_up(coder: str, values: int) -> None:
    """Rows that hold the same string object as the row before (a run of one phase, as the hooks queue it) take the
    code of that row (_planes.c's str_column looks it up once a run, and finds one of the table's first eight by
    identity): the general path's bytes, with runs at the column's start, between new values and at its end, under 128
    values and past it, and an equal string that is another object."""
    spec = SPECS[PhaseSpan]
    names = [f"phase-{i}" for i in range(values)]
    column = [names[0]] * 3 + [name for i, name in enumerate(names) for _ in range(1 + i % 3)] + [names[1]] * 4 + \
        [names[-1], names[0], names[0], "".join(names[2]), names[5]]  # an equal string that is another object
    rows = [(0, i, name, i, i + 1, "host") for i, name in enumerate(column)]
    with coded_by(coder):
        assert encode(spec, rows) == _plain_encode(spec, rows)
    if coder == "compiled":
        table, planes = column_arrays._compiled.str_column(column)
        assert table == names and (planes is None) == (values > 128)
        if planes is not None:
            assert list(planes[1:]) == [names.index(name) for name in column]


@pytest.mark.parametrize("coder", CODERS)
@pytest.mark.parametrize("column", [[0, 2**63], [-(2**63) - 1, 0], [-(2**63), 2**63 - 1], [2**63 - 1, -(2**63)]])
def test_a_column_past_64_bits_is_coded_in_python_s_integers_or_refused_by_either_coder(
        coder: str, column: list[int]) -> None:
    """A value past 64 bits, or a difference that wraps, in a "prev" column and in one less another field: the
    coder's 64-bit loop gives way to Python's integers, whose code may fit (or is refused: OverflowError)."""
    spec = SPECS[PhaseSpan]
    rows = [(0, 1, "forward", start, start, "host") for start in column]
    with coded_by(coder):
        assert _outcome(encode, spec, rows) == _outcome(_plain_encode, spec, rows)


# Integers at each edge of CPython 3.11's 30-bit digits (one, two, three of them) and of 64 bits, either sign.
_DIGIT_EDGES = sorted({sign * (2**bits + d) for bits in (0, 30, 60, 63, 90) for d in (-1, 0, 1) for sign in (1, -1)})


@pytest.mark.parametrize("coder", CODERS)
@pytest.mark.parametrize("value", _DIGIT_EDGES)
def test_an_integer_at_a_digit_s_edge_is_coded_as_python_s_integers_code_it(coder: str, value: int) -> None:
    """zeromon/model/_int64.h reads an int of up to three 30-bit digits from its digits (past them, or at 2^63, through
    PyLong_AsLongLongAndOverflow): a column of the value alone, after a zero, and beside its negation (each a
    "prev" column's code and a code less another field) is what Python's integers make of it, or refused as past
    64 bits by both."""
    spec = SPECS[PhaseSpan]
    for column in ([value], [0, value], [value, -value], [value, 0]):
        rows = [(0, 1, "forward", start, end, "host") for start, end in zip(column, reversed(column), strict=True)]
        with coded_by(coder):
            assert _outcome(encode, spec, rows) == _outcome(_plain_encode, spec, rows), (value, column)


@PROPERTIES
@given(passes=st.lists(st.lists(st.integers(0, 40), max_size=6), max_size=12), maxlen=st.integers(16, 64))
def test_recent_records_hold_what_a_deque_of_the_rows_would(passes: list[list[int]], maxlen: int) -> None:
    """RecentRecords, published a pass at a time (records one by one, batches as Unmade columns: 0 is a single
    record, k > 0 a batch of k), iterates and counts as a deque(maxlen) of every record in order."""
    recent, plain = RecentRecords(maxlen), collections.deque(maxlen=maxlen)
    made = 0
    for sizes in passes:
        entries: list[Any] = []
        count = 0
        for size in sizes:
            rows = [(made + i, "x") for i in range(max(size, 1))]
            made += len(rows)
            entries.append(Unmade(list(zip(*rows, strict=True)), size) if size else rows[0])
            count += len(rows)
            plain.extend(rows)
        recent.extend(entries, count)
        assert list(recent) == list(plain) and len(recent) == len(plain)
    assert list(recent) == list(plain)  # read twice: the rows made once


def _record_all(raws: list[tuple[Any, ...]], path: str, offset: int, tmp: Path) -> tuple[list[Any], Recorder]:
    """A Recorder fed synchronous collectives in steps 0-2 (and a late one of a summarized step), by
    ``path``: "batch" (finalize_sync_batch, a column at a time), "sync" (finalize_sync, one at a time)
    or "plain" (_finalize); the records it wrote, but those stamped with the wall clock."""
    path_ = tmp / f"{path}.zmr"
    state = HotState()
    recorder = Recorder(state, 3, CompactWriter(path_, 3), 0.2, clock_offset_ns=offset)
    recorder.collectives._group_sizes[None] = 2  # a group of two: busbw has a bus factor
    if path.startswith("batch"):  # the path is taken, not left for the item-by-item one
        batch = recorder.collectives.finalize_sync_batch
        taken: list[bool] = []
        recorder.collectives.finalize_sync_batch = lambda items: taken.append(batch(items)) or taken[-1]  # type: ignore[method-assign]
    else:
        recorder.collectives.finalize_sync_batch = lambda items: False  # type: ignore[method-assign]
    if path == "plain":
        recorder.collectives.finalize_sync = lambda item: False  # type: ignore[method-assign]
    for step in range(3):
        state.control.append((RAW_STEP_START, step, step * 2**38, None, "forward"))
        state.control.append((RAW_STEP_END, step, (step + 1) * 2**38, None, True))
    for seq, (op, phase, t0, length, b_in, b_out, dtype, step) in enumerate(raws, start=1):
        state.raw.append((RAW_COLLECTIVE, seq, f"{op}_x", op, step * 2**38 + t0 % 2**37, step * 2**38 + t0 % 2**37 + length,
                          b_in, b_out, dtype, None, False, None, phase, step, None, False, None))
    recorder._drain(final=False)  # the steps are summarized: the next one's collective is late
    assert not path.startswith("batch") or (taken and all(taken))
    state.raw.append((RAW_COLLECTIVE, len(raws) + 1, "all_reduce_x", "all_reduce", 5, 9, 4, 4, None, None, False, None,
                      "backward", 0, None, False, None))
    recorder.stop()
    wall_clock = ("AgentStats", "RunEnd", "Notice")
    return [r for r in iter_records(path_) if type(r).__name__ not in wall_clock], recorder


@PROPERTIES
@given(raws=st.lists(_raw_collective, min_size=1, max_size=40))
def test_the_synchronous_fast_path_records_summarizes_and_counts_what_the_general_path_does(
        raws: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plain, plain_recorder = _record_all(raws, "plain", 10**18, Path(tmp))
        for path in ("sync", "batch", "batch in Python"):
            in_python = path == "batch in Python"
            with mock.patch.object(collective_records, "_BATCHER", None if in_python else collective_records._BATCHER), \
                    mock.patch.object(collective_records, "_COUNT_OPS", None if in_python
                                      else collective_records._COUNT_OPS), \
                    mock.patch.object(collective_records, "_ACCOUNT_SYNC", None if in_python
                                      else collective_records._ACCOUNT_SYNC):
                fast, fast_recorder = _record_all(raws, path, 10**18, Path(tmp))
            assert [encode_record(r) for r in fast] == [encode_record(r) for r in plain], path
            assert any(isinstance(r, StepSummary) and r.collectives for r in fast)
            assert [r for _, r in fast_recorder.live.recent_records()] == [r for _, r in plain_recorder.live.recent_records()]
            assert fast_recorder.live.totals.collectives == plain_recorder.live.totals.collectives
            assert {op: list(v) for op, v in fast_recorder.live.totals.busbw.items()} == \
                {op: list(v) for op, v in plain_recorder.live.totals.busbw.items()}
            assert fast_recorder.events_finalized == plain_recorder.events_finalized == len(raws) + 1



# Raw synchronous collectives for finalize_sync_batch's two ways of making their columns: the hooks' usual values,
# and in half the batches one field of one collective that the batch path may not take (a time or size of another
# type, a call that ends before it starts or lasts too long, a time past 64 bits with the offset, a group that
# cannot be hashed, a phase that is not a string).
_batch_raw = st.tuples(st.sampled_from(_OPS), st.sampled_from(_PHASES), st.integers(0, 2**40), st.integers(0, 2**33),
                       st.integers(0, 2**20), st.integers(0, 2**20), st.sampled_from([None, "float32", "torch.bfloat16"]),
                       st.integers(0, 2), st.sampled_from([None, "group-a", ("group", 2)]))
_ODD = {1: [7, None], 2: [2**63 - 1, -(2**63), 2**64, 1.5, True, None], 3: [-1, 2**50, 2**62, 2**63],
        4: [-5, 2**70, 2.0, True], 7: [True, None, 1.0], 8: [["unhashable"], {}]}
_spoil = st.none() | st.tuples(st.integers(0, 11), st.sampled_from(sorted(_ODD))).flatmap(
    lambda where: st.tuples(st.just(where[0]), st.just(where[1]), st.sampled_from(_ODD[where[1]])))


@PROPERTIES
@given(raws=st.lists(_batch_raw, min_size=1, max_size=12), spoil=_spoil, offset=st.sampled_from([0, 10**18, 2**62]))
def test_a_batch_s_columns_are_made_in_c_as_in_python(raws: list[tuple[Any, ...]], spoil: tuple[int, int, Any] | None,
                                                      offset: int) -> None:
    """finalize_sync_batch's columns (CollectiveRecords._sync_columns) by the C module and by its Python path: the
    same values, or neither takes the batch, or C alone refuses one whose times pass 64 bits (its collectives then
    take finalize_sync, one by one: the same records, test_the_synchronous_fast_path_records_...)."""
    if collective_records._BATCHER is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    if spoil is not None:
        index, field, value = spoil
        row = list(raws[index % len(raws)])
        row[field] = value
        raws[index % len(raws)] = tuple(row)
    state = HotState()
    records = Recorder(state, 0, None, 0.2, clock_offset_ns=offset).collectives
    records._group_sizes.update({None: 2, "group-a": 4})
    items = []
    for seq, (op, phase, t0, length, b_in, b_out, dtype, step, group) in enumerate(raws, start=1):
        t1 = t0 + length if type(t0) is int and type(length) is int else t0
        items.append((RAW_COLLECTIVE, seq, f"{op}_x", op, t0, t1, b_in, b_out, dtype, group, False, None, phase,
                      step, None, False, None))
    in_c = records._sync_columns(items)
    with mock.patch.object(collective_records, "_BATCHER", None):
        in_python = records._sync_columns(items)
    if in_python is None:
        assert in_c is None
        return
    if in_c is None:  # C refuses times past 64 bits, offset added, which Python's integers take: finalize_sync's then
        assert any(not -(2**63) <= t + offset < 2**63 - 1 for item in items for t in item[4:6])
        return
    for made_in_c, made_in_python in zip(in_c, in_python, strict=True):
        assert list(made_in_c) == list(made_in_python)
        assert list(map(type, made_in_c)) == list(map(type, made_in_python))


@PROPERTIES
@given(keys=st.lists(st.tuples(st.sampled_from(_OPS[:2]), st.sampled_from(_PHASES[:2]), st.sampled_from([512, 2**20, 2**40]),
                               st.sampled_from([512, 2**20]), st.sampled_from(["float32", None]),
                               st.sampled_from(["group-a", ("group", 2), None])), min_size=1, max_size=10),
       repeats=st.lists(st.integers(1, 3), min_size=10, max_size=10))
def test_a_batch_s_calls_of_one_key_after_another_take_its_shape_as_python_does(
        keys: list[tuple[Any, ...]], repeats: list[int]) -> None:
    """Calls whose key (op, phase, bytes, dtype, group, caller) equals the call's before them take that call's shape
    in _batch.c (no key made): with each field a fresh object of the same value (sizes and strings made again, a
    group tuple made again), and keys that differ in one field only, the columns are Python's."""
    if collective_records._BATCHER is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")

    def fresh(value: Any) -> Any:  # an equal value, another object
        if isinstance(value, int):
            return int(str(value))
        if isinstance(value, str):
            return "".join(list(value))
        return tuple(value) if isinstance(value, tuple) else value

    items, t = [], 1000
    for (op, phase, b_in, b_out, dtype, group), times in zip(keys, repeats, strict=False):
        for n in range(times + 1):  # then one that differs in its bytes out alone
            t += 50
            items.append((RAW_COLLECTIVE, len(items) + 1, fresh(f"{op}_x"), fresh(op), t, t + 20, fresh(b_in),
                          fresh(b_out * (2 if n == times else 1)), fresh(dtype), fresh(group), False, None,
                          fresh(phase), 1, None, False, fresh("caller")))
    records = Recorder(HotState(), 0, None, 0.2, clock_offset_ns=10**18).collectives
    records._group_sizes.update({None: 2, "group-a": 4, ("group", 2): 8})
    in_c = records._sync_columns(items)
    with mock.patch.object(collective_records, "_BATCHER", None):
        in_python = records._sync_columns(items)
    assert in_c is not None and in_python is not None
    for made_in_c, made_in_python in zip(in_c, in_python, strict=True):
        assert list(made_in_c) == list(made_in_python)
        assert list(map(type, made_in_c)) == list(map(type, made_in_python))


def test_a_batch_s_columns_are_made_out_of_the_collector_s_lists_unless_they_hold_what_it_tracks() -> None:
    """The columns _batch.c makes (a synchronous batch's, a pass's rows') are not tracked by the garbage collector
    where every value in them is untracked (numbers, strings, None: a young collection then walks none of them, and
    the release's untrack finds them done); a column that holds a tracked object (a timing of a str subclass with a
    __dict__) stays tracked, and the tuple that holds it, and the columns are the same values either way."""
    if collective_records._BATCHER is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")

    class Timing(str):
        pass

    records = Recorder(HotState(), 0, None, 0.2, clock_offset_ns=10**18).collectives
    records._group_sizes[None] = 2
    items = [(RAW_COLLECTIVE, seq, "all_reduce_x", "all_reduce", 1000 * seq, 1000 * seq + 50, 4096, 4096, "float32",
              None, False, None, "backward", 1, None, False, None) for seq in range(1, 6)]
    columns = records._sync_columns(items)
    assert columns is not None and not gc.is_tracked(columns) and not any(map(gc.is_tracked, columns))
    for timing in ("wait", Timing("wait")):
        rows = [(raw, 50, raw[4] + 10, ("float32", 2, "grad_all_reduce", 4096, 1.0, 4096), raw[5], timing)
                for raw in items]
        made = records._row_columns(rows, False)
        assert gc.is_tracked(timing) == (type(timing) is Timing)
        tracked = [gc.is_tracked(column) for column in made]
        if type(timing) is Timing:
            assert gc.is_tracked(made) and tracked.count(True) == 1  # the timing's column alone
        else:
            assert not gc.is_tracked(made) and not any(tracked)
        with mock.patch.object(collective_records, "_BATCHER", None):
            assert [list(c) for c in records._row_columns(rows, False)] == [list(c) for c in made]


@PROPERTIES
@given(steps=st.lists(st.integers(0, 6), min_size=1, max_size=8), emitted=st.integers(-1, 4),
       spoil=st.none() | st.tuples(st.integers(0, 7), st.sampled_from([(0, RAW_WAIT), (10, True), (10, 1), (10, 0),
                                                                      (10, None), (14, "event"), (13, -1)])))
def test_whether_a_queue_is_all_synchronous_host_collectives_is_told_in_c_as_in_python(
        steps: list[int], emitted: int, spoil: tuple[int, tuple[int, Any]] | None) -> None:
    """Recorder._all_sync (a pass's queue, every record a synchronous host collective of a step not yet summarized)
    by _batch.c's all_sync and by its Python path: the same answer for queues of either kind, any async truth, a CUDA
    event or none, steps before and after the last summarized."""
    if loop._ALL_SYNC is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    recorder = Recorder(HotState(), 0, None, 0.2)
    recorder.steps.emitted_through = emitted
    items = [(RAW_COLLECTIVE, seq, "all_reduce_x", "all_reduce", 10 * seq, 10 * seq + 5, 8, 8, "float32", None, False,
              None, "backward", step, None, False, None) for seq, step in enumerate(steps, start=1)]
    if spoil is not None:  # one record of another kind, async, on a GPU's stream or of a summarized step
        index, (field, value) = spoil
        row = list(items[index % len(items)])
        row[field] = value
        items[index % len(items)] = tuple(row)
    in_c = recorder._all_sync(items)
    with mock.patch.object(loop, "_ALL_SYNC", None):
        in_python = recorder._all_sync(items)
    assert in_c is in_python


_TIMINGS = ("launch", "bound", "wait", "callback", "sync")
_row = st.tuples(st.integers(0, 2**40), st.integers(0, 2**33), st.booleans(), st.integers(0, 2**33), st.integers(0, 2**33),
                 st.sampled_from(_TIMINGS), st.none() | st.integers(-(2**20), 2**34), st.sampled_from([None, 0.5, 1.0, 2]),
                 st.integers(-1, 2**30) | st.sampled_from([0, 2**53 + 1, 2**60 + 3, 2**63 - 1, 2**70]), st.integers(0, 4))


@PROPERTIES
@given(rows=st.lists(_row, min_size=1, max_size=12), offset=st.sampled_from([0, 10**18, 2**63 - 2**41, 2**63 - 2**38]))
def test_a_pass_s_rows_are_made_columns_in_c_as_in_python(rows: list[tuple[Any, ...]], offset: int) -> None:
    """finalize_pass's rows (an async collective at its wait, a GPU's launch; CollectiveRecords._row_columns) made
    columns by the C module and by its Python path: the same values of the same types (C hands a row set whose
    times pass 64 bits, offset added, to the Python path)."""
    if collective_records._BATCHER is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    records = Recorder(HotState(), 0, None, 0.2, clock_offset_ns=offset).collectives
    made = []
    for seq, (t0, length, is_async, wait, blocked_ns, timing, after, factor, size, step) in enumerate(rows, start=1):
        raw = (RAW_COLLECTIVE, seq, "all_reduce_x", "all_reduce", t0, t0 + length, size, size, "float32", None,
               is_async, None, "backward", step, None, False, None)
        completion = None if timing == "launch" and after is None else t0 + (after or 0)
        made.append((raw, blocked_ns, wait, ("float32", 2, "grad_all_reduce", size, factor, size), completion, timing))
    launches = any(row[5] == "launch" for row in made)
    in_c = records._row_columns(made, launches)
    with mock.patch.object(collective_records, "_BATCHER", None):
        in_python = records._row_columns(made, launches)
    assert len(in_c) == len(in_python)
    for made_in_c, made_in_python in zip(in_c, in_python, strict=True):
        assert list(made_in_c) == list(made_in_python)
        assert list(map(type, made_in_c)) == list(map(type, made_in_python))


def _summaries_of(calls: list[tuple[int, int]], agent: list[tuple[int, int]], window: tuple[int, int],
                  path: str, tmp: Path) -> list[StepSummary]:
    """The summaries a Recorder makes of one step (``window``, perf_counter ns) of synchronous collectives
    (``calls``: [t0, t1]) and agent spans, by ``path`` ("batch": finalize_sync_batch, else _finalize)."""
    state = HotState()
    recorder = Recorder(state, 0, CompactWriter(tmp / f"{path}.zmr", 0), 0.2, clock_offset_ns=10**18)
    recorder.collectives._group_sizes[None] = 2
    if not path.startswith("batch"):
        recorder.collectives.finalize_sync_batch = lambda items: False  # type: ignore[method-assign]
        recorder.collectives.finalize_sync = lambda item: False  # type: ignore[method-assign]
    state.control.append((RAW_STEP_START, 0, window[0], None, "forward"))
    state.control.extend((RAW_AGENT, 0, a0, a1, "forward") for a0, a1 in sorted(agent))
    state.control.append((RAW_STEP_END, 0, window[1], None, True))
    state.raw.extend((RAW_COLLECTIVE, seq, "all_gather_x", "all_gather", t0, t1, 4096, 8192, "float32", None, False,
                      None, "forward", 0, None, False, None) for seq, (t0, t1) in enumerate(calls, start=1))
    recorder.stop()
    return [r for r in iter_records(tmp / f"{path}.zmr") if isinstance(r, StepSummary)]


@PROPERTIES
@given(gaps=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=30),
       agent=st.lists(st.tuples(st.integers(0, 1200), st.integers(0, 30)), max_size=4),
       margins=st.tuples(st.integers(-30, 30), st.integers(-30, 30)), back=st.integers(0, 3))
def test_a_step_of_calls_one_after_another_is_summarized_from_its_columns_as_from_its_intervals(
        gaps: list[tuple[int, int]], agent: list[tuple[int, int]], margins: tuple[int, int], back: int) -> None:
    """A thread's synchronous calls, one after another: the batch's step is summarized from its columns (the
    sums of _sequential_overlap_ns, or all of summarize's values in C: _batch.c's summarize_host) where they lie
    inside the window and clear of the agent's spans, and the numbers are the plain path's wherever they do not (a
    window that cuts a call, an agent span across one, a call that starts before the previous one ended: ``back``)."""
    calls, t = [], 10_000
    for gap, length in gaps:
        t += gap
        calls.append((t, t + length))
        t += length
    overlapping = len(calls) > 1 and calls[-2][1] - calls[-2][0] > back > 0
    if overlapping:  # the last call starts inside the one before it
        calls[-1] = (calls[-2][1] - back, calls[-1][1])
    spans = [(10_000 + offset, 10_000 + offset + length) for offset, length in agent]
    window = (calls[0][0] + margins[0], max(calls[-1][1] + margins[1], calls[0][0] + margins[0] + 1))
    taken: list[bool] = []
    in_c: list[bool] = []
    sequential, summarize_host = step_acc._sequential_overlap_ns, step_acc._SUMMARIZE_HOST

    def watched(*args: Any) -> Any:
        taken.append(sequential(*args) is not None)
        return sequential(*args)

    def watched_in_c(*args: Any) -> Any:
        in_c.append(summarize_host(*args) is not None)
        return summarize_host(*args)

    with tempfile.TemporaryDirectory() as tmp:
        plain = _summaries_of(calls, spans, window, "plain", Path(tmp))
        with mock.patch.object(step_acc, "_SUMMARIZE_HOST", watched_in_c if summarize_host is not None else None):
            batch = _summaries_of(calls, spans, window, "batch", Path(tmp))
        with mock.patch.object(step_acc, "_sequential_overlap_ns", watched), \
                mock.patch.object(step_acc, "_SUMMARIZE_HOST", None):
            python = _summaries_of(calls, spans, window, "batch-python", Path(tmp))
    assert [encode_record(r) for r in batch] == [encode_record(r) for r in plain] == [encode_record(r) for r in python]
    assert len(batch) == 1 and batch[0].exposed_comm_s is not None
    clear = all(a1 <= a0 or not any(c0 < a1 and a0 < c1 for c0, c1 in calls) for a0, a1 in spans)
    inside = window[0] <= calls[0][0] and calls[-1][1] <= window[1]
    assert taken == [clear and inside and not overlapping]
    assert summarize_host is None or in_c == taken


_ANY_VALUE = st.one_of(st.integers(), st.none(), st.booleans(), st.floats(0, 10), st.text(max_size=2),
                      st.dictionaries(st.sampled_from(["activations", "parameters", "nope"]), st.integers() | st.floats()))
_FITTING = {"int": st.integers(), "int?": st.integers() | st.none(), "ns": st.integers(0, 10**9).map(lambda v: v / 1e9),
            "ns?": st.none() | st.integers(0, 10**9).map(lambda v: v / 1e9), "bool": st.booleans(),
            "str": st.text(max_size=2) | st.none(), "map": st.dictionaries(st.sampled_from(["activations", "parameters"]),
                                                                          st.integers(0, 2**40))}


@PROPERTIES
@given(kind=st.sampled_from(sorted(SPECS, key=lambda cls: cls.__name__)), data=st.data(), as_list=st.booleans())
def test_a_record_s_fit_check_in_c_answers_as_python_s(kind: type, data: st.DataObject, as_list: bool) -> None:
    """columnar.fits with its type check in C (_planes.c's types_fit) and without: the same answer for any values,
    of the spec's length or not, the types each field takes or others (a bool for an int, an int for a float); and
    columnar.fit_run (rows_fit in C) and its loop of that check: the same first refused row of a run."""
    spec = SPECS[kind]
    width = data.draw(st.sampled_from([len(spec), len(spec), len(spec) - 1, len(spec) + 1]))
    # Each field mostly of a type it takes (so that whole records fit as often as not), else anything.
    values = tuple(data.draw(_FITTING[how] if i < len(spec) and data.draw(st.integers(0, 9)) else _ANY_VALUE)
                   for i, how in enumerate([how for _, how, _ in spec] + ["int"] * (width - len(spec)))
                   if i < width)
    given_values: Any = list(values) if as_list else values  # a list takes the Python path in either
    with mock.patch.object(columnar, "_TYPES_FIT", None):
        python = columnar.fits(spec)(given_values)
    assert columnar.fits(spec)(given_values) == python
    # A run of rows (fit_run: rows_fit in C for a spec with no seconds column): where the first refused one is
    rows = [given_values] * data.draw(st.integers(0, 2)) + data.draw(st.lists(st.sampled_from([values, *rows_around(
        spec, data)]), max_size=4))
    start, stop = data.draw(st.integers(0, len(rows))), data.draw(st.integers(0, len(rows)))
    with mock.patch.object(columnar, "_ROWS_FIT", None):
        python_run = columnar.fit_run(spec, columnar.fits(spec))(rows, start, stop)
    assert columnar.fit_run(spec, columnar.fits(spec))(rows, start, stop) == python_run
    if columnar._TYPES_FIT is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")


def rows_around(spec: Sequence[Sequence[Any]], data: st.DataObject) -> list[tuple[Any, ...]]:
    """Two rows of the spec's types, but a map's values (an int, a bool, a float; a key of its names or not)."""
    rows = []
    for _ in range(2):
        row = [data.draw(_FITTING[how]) for _, how, _ in spec]
        for i, (_, how, base) in enumerate(spec):
            if how == "map":
                row[i] = data.draw(st.dictionaries(st.sampled_from([*base[:2], "nope"]),
                                                   st.integers(0, 9) | st.booleans() | st.floats(0, 1), max_size=3))
        rows.append(tuple(row))
    return rows


_NS = st.integers(0, 400) | st.sampled_from([2**63 - 1, 2**63, -(2**63) - 1, 10**19])  # and past 64 bits


@PROPERTIES
@given(calls=st.lists(st.tuples(_NS, _NS, _NS), min_size=1, max_size=8),
       agent=st.lists(st.tuples(_NS, _NS), max_size=4), window=st.tuples(_NS, _NS), sort=st.booleans())
def test_a_sequential_step_s_sums_in_c_are_python_s(calls: list[tuple[int, int, int]], agent: list[tuple[int, int]],
                                                    window: tuple[int, int], sort: bool) -> None:
    """_batch.c's sequential_overlap against _sequential_overlap_ns's Python: None (not one after another) or the same
    integers for the same columns, the calls in order or not, the agent's spans anywhere; where a value or a sum
    passes 64 bits, False, and the Python function answers."""
    c_sums = getattr(compiled("zeromon_agent.recorder._batch", environment=False), "sequential_overlap", None)
    if c_sums is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    if sort:
        calls = sorted((min(c), *sorted(c)[1:]) for c in calls)
    acc = step_acc.StepAcc(run_issue=[c[0] for c in calls], run_complete=[c[2] for c in calls],
                           run_end=[c[1] for c in calls], agent=list(agent))
    with mock.patch.object(step_acc, "_SEQUENTIAL", None):
        python = step_acc._sequential_overlap_ns(acc, *window)
    made = c_sums(acc.run_issue, acc.run_complete, acc.run_end, acc.agent, *window)
    fits = all(-(2**63) <= v < 2**63 for v in (*itertools.chain(*calls, *agent), *window))
    assert made == python or made is False and (not fits or python is not None)


@PROPERTIES
@pytest.mark.parametrize("case", ["sequential", "cut", "untimed", "unknown", "on_stream", "interval", "blocked"])
@given(gaps=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=12),
       agent=st.lists(st.tuples(st.integers(0, 900), st.integers(0, 30)), max_size=2),
       margins=st.tuples(st.integers(-20, 0), st.integers(0, 20)),
       phases=st.dictionaries(st.sampled_from(["forward", "backward", "agent", "optimizer"]),
                              st.integers(0, 10**6) | st.sampled_from([2**53 + 1, 2**63 + 5, 10**19 + 7])),
       by_op=st.dictionaries(st.sampled_from(["all_gather", "reduce_scatter"]), st.integers(0, 2**40)),
       blocked_s=st.floats(0, 1e6), peak=st.none() | st.integers(0, 2**40))
def test_a_step_s_summary_values_in_c_are_python_s(
        case: str, gaps: list[tuple[int, int, int]], agent: list[tuple[int, int]], margins: tuple[int, int],
        phases: dict[str, int], by_op: dict[str, int], blocked_s: float, peak: int | None) -> None:
    """step_acc.summarize with _batch.c's summarize_host (a step of calls one after another on the host, every one in
    its batched columns: all of its values in C) and without: the same summary for any accumulator, those of the
    other cases (a GPU step not timed on the device, its overlap unknown, compute on a stream, intervals or blocked
    ones outside the columns) left to Python."""
    if step_acc._SUMMARIZE_HOST is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    untimed, unknown, on_stream, with_interval, with_blocked = (case == other for other in (
        "untimed", "unknown", "on_stream", "interval", "blocked"))
    issue, complete, ends, t = [], [], [], 10_000
    for gap, length, blocked in gaps:
        t += gap
        issue.append(t)
        complete.append(t + length)
        ends.append(t + min(blocked, length))
        t += length
    acc = StepAcc(collectives=len(issue), comm_bytes=sum(by_op.values()), by_op=dict(by_op), phase_ns=dict(phases),
                  blocked_s=blocked_s, peak_memory=peak, device_untimed=untimed, overlap_known=not unknown,
                  on_stream=on_stream, compute=[(10_000, 10_010)] if on_stream else [],
                  agent=[(10_000 + a, 10_000 + a + length) for a, length in agent], run_issue=issue,
                  run_complete=complete, run_end=ends, run_blocked=[(e - i) / 1e9 for i, e in zip(issue, ends, strict=True)])
    if case == "cut":  # a window that starts after the first call's issue and ends before the last's completion
        margins = (margins[1], margins[0])
    window = (issue[0] + margins[0], max(complete[-1] + margins[1], issue[0] + margins[0] + 1))
    if with_interval or with_blocked:  # one across the whole window, outside the columns: the sums are not the unions
        (acc.intervals if with_interval else acc.blocked).append((window[0] - 5, window[1] + 5))
    summaries = []
    for way in (step_acc._SUMMARIZE_HOST, None):
        with mock.patch.object(step_acc, "_SUMMARIZE_HOST", way):
            summaries.append(step_acc.summarize(copy.deepcopy(acc), 3, 7, *window))
    with_c, python = summaries
    assert with_c == python and encode_record(with_c) == encode_record(python)
    assert list(with_c.phase_s) == list(phases) and with_c.comm_bytes_by_op is not acc.by_op
    if case == "sequential" and window[0] <= issue[0] and complete[-1] <= window[1] and not agent:
        assert step_acc._SUMMARIZE_HOST(acc, 3, 7, *window) is not None  # the case it takes, taken
        assert with_c.blocked_s == round(blocked_s, 9)


def test_a_step_s_time_blocked_is_rounded_in_c_as_python_rounds_it_near_its_ties() -> None:
    """summarize_host's blocked_s is round(blocked_s, 9) where its product with 1e9 is far from a half-integer (an
    integer's division), and Python's own round nearer (a value a few ulps from k.5 ns, past 2^52 ns, infinite):
    the same float, its sign too, over ties drawn at every scale a step's time blocked takes."""
    if step_acc._SUMMARIZE_HOST is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    randoms = random.Random(44)
    values = [0.0, -0.0, -1e-12, 5e-10, 1.5e-9, 2.5e-9, 1e7, 4.5e6, 2**52 / 1e9, math.inf, 1e-320, 0.1, 0.3]
    for scale in (1, 10**3, 10**6, 10**9, 10**12, 10**15):
        for _ in range(40):
            k = randoms.randrange(scale)
            tie = (k + 0.5) / 1e9
            values += [tie, randoms.random() * scale / 1e9]
            for way in (math.inf, -math.inf):
                near = tie
                for _ in range(8):
                    near = math.nextafter(near, way)
                    values.append(near)
    acc = StepAcc(collectives=1, run_issue=[10], run_complete=[20], run_end=[15], run_blocked=[5e-9])
    rounded = []
    for value in values:
        acc.blocked_s = value
        made = step_acc._SUMMARIZE_HOST(acc, 0, 1, 0, 100)
        rounded.append(made[9])
    expected = [round(value, 9) for value in values]
    assert [(r, math.copysign(1, r)) for r in rounded] == [(e, math.copysign(1, e)) for e in expected]


def test_a_step_s_fields_are_read_at_their_slots_only_where_the_class_reads_them_so() -> None:
    """summarize_host and account_sync read a StepAcc's fields at their slots (found once a class); a class whose
    field is a property over the slot, or that reads attributes its own way, is read by name (its values, not the
    slot's), alternating with StepAcc; an unset slot raises AttributeError as getattr does."""
    if step_acc._SUMMARIZE_HOST is None or collective_records._ACCOUNT_SYNC is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")

    class Shadowed(StepAcc):
        __slots__ = ()

        @property
        def blocked_s(self) -> float:  # type: ignore[override]
            return 0.25

        @blocked_s.setter
        def blocked_s(self, value: float) -> None:
            StepAcc.__dict__["blocked_s"].__set__(self, value)  # the slot below the property

    class Looked(StepAcc):
        __slots__ = ()

        def __getattribute__(self, name: str) -> Any:
            return 0.5 if name == "blocked_s" else super().__getattribute__(name)

    def made(cls: type) -> StepAcc:
        return cls(collectives=1, run_issue=[10], run_complete=[20], run_end=[15], run_blocked=[5e-9], blocked_s=1.0)

    for cls, blocked in [(StepAcc, 1.0), (Shadowed, 0.25), (StepAcc, 1.0), (Looked, 0.5), (StepAcc, 1.0)] * 2:
        assert step_acc._SUMMARIZE_HOST(made(cls), 0, 1, 0, 100)[9] == blocked
    unset = made(StepAcc)
    del unset.phase_ns
    with pytest.raises(AttributeError):
        step_acc._SUMMARIZE_HOST(unset, 0, 1, 0, 100)
    accs: dict[int, Any] = {}
    for cls in (StepAcc, Looked, StepAcc):
        accs.clear()
        row = collective_records._ACCOUNT_SYNC([1], ["all_reduce"], [4096], [10], [20], [5e-9], [15], accs,
                                               lambda cls=cls: made(cls), 4096)
        assert row == 1 and accs[1].collectives == 2 and accs[1].comm_bytes == 4096
        assert object.__getattribute__(accs[1], "blocked_s") == (1.0 if cls is StepAcc else 0.5) + 5e-9


def test_a_step_of_more_collectives_than_it_keeps_intervals_of_is_folded_as_one_by_one() -> None:
    """Past MAX_STEP_INTERVALS a step's intervals are folded as they come: the batch path gives the same
    summary as the plain one (overlapping calls out of issue order included) in batches of 256."""
    raws = [("all_gather" if i % 3 else "reduce_scatter", "backward", (i * 7919) % 50_000 * 1000, 1 + i % 5 * 900,
             2**20, 2**18, "float32", 0) for i in range(4200)]
    with tempfile.TemporaryDirectory() as tmp:
        plain, _ = _record_all(raws, "plain", 10**18, Path(tmp))
        batch, _ = _record_all(raws, "batch", 10**18, Path(tmp))
    summaries = [r for r in batch if isinstance(r, StepSummary)]
    assert summaries and summaries[0].collectives == 4200
    assert [encode_record(r) for r in batch] == [encode_record(r) for r in plain]

@pytest.mark.parametrize("near", ["intervals", "blocked", "neither"])
def test_a_batch_s_steps_are_accounted_in_c_as_in_python_up_to_a_run_that_folds(near: str) -> None:
    """finalize_sync_batch's step accounting in C (account_sync) and in Python (_account_sync_run of each run): the
    same accumulators, where a later step's run would pass MAX_STEP_INTERVALS (its intervals folded, or its blocked
    ones dropped: the C loop leaves that run and those after it to Python's) and where none would."""
    steps = [4] * 3 + [5] * 4 + [6] * 2
    items = [(RAW_COLLECTIVE, seq, "all_reduce_x", "all_reduce" if seq % 2 else "all_gather", 10**6 * seq,
              10**6 * seq + (500 + 7 * seq if seq % 4 else 0), 2**20 + seq, 2**20, "float32", None, False, None,
              "backward", step, None, False, None) for seq, step in enumerate(steps, start=1)]  # some not blocked
    accs = []
    for way in (collective_records._ACCOUNT_SYNC, None):
        recorder = Recorder(HotState(), 0, None, 5.0, clock_offset_ns=10**9)
        collectives = recorder.collectives
        collectives._group_sizes[None] = 2
        acc = recorder.steps.acc(5)  # a step with intervals and blocked ones from earlier passes
        acc.intervals, acc.blocked, acc.blocked_s = [(1, 2)] * 3, [(1, 2)] * 2, 0.25
        if near == "intervals":
            acc.intervals = [(1, 2)] * (step_acc.MAX_STEP_INTERVALS - 3)
        elif near == "blocked":
            acc.blocked = [(1, 2)] * (step_acc.MAX_STEP_INTERVALS - 2)  # and three of its four blocked
        with mock.patch.object(collective_records, "_ACCOUNT_SYNC", way):
            assert collectives.finalize_sync_batch(items)
        accs.append({step: dataclasses.astuple(acc) for step, acc in recorder.steps.accs.items()})
        recorder.stop()
    with_c, python = accs
    assert with_c == python
    assert sorted(python) == [4, 5, 6]
    names = [f.name for f in dataclasses.fields(StepAcc)]
    assert python[5][names.index("overlap_known")] is (near == "neither")  # folded, or its blocked ones dropped
    assert [python[step][names.index("collectives")] for step in (4, 5, 6)] == [3, 4, 2]


class _Op(str):
    """An op of a str subclass that a dict keeps apart from the plain str of its characters."""

    def __hash__(self) -> int:
        return hash(("op", str(self)))

    def __eq__(self, other: object) -> bool:
        return type(other) is _Op and str.__eq__(self, other)


@PROPERTIES
@given(ops=st.lists(st.sampled_from(["all_gather", "reduce_scatter", "all_reduce", *(f"op{i}" for i in range(8))])
                    | st.sampled_from(["all_gather", "reduce_scatter"]).map(lambda op: "".join(op)), max_size=40),
       sizes=st.lists(st.integers(0, 2**40), min_size=40, max_size=40),
       known=st.dictionaries(st.sampled_from(["all_gather", "reduce_scatter", "op7"]), st.integers(0, 2**40)),
       odd=st.sampled_from([None, None, None, "subclass", "bool", "float size", "past 64 bits", "sum past 64 bits",
                            "negative", "float known", "known past 64 bits"]))
@example(ops=["all_gather", "reduce_scatter", "all_reduce", *(f"op{i}" for i in range(8)), "op7", "all_gather"],
         sizes=list(range(1, 41)), known={}, odd=None)  # eleven ops in one run: more than C sums
@example(ops=["all_gather"] * 3, sizes=[1] * 40, known={}, odd="float known")
@example(ops=["all_gather"] * 3, sizes=[1] * 40, known={}, odd="subclass")  # two keys a dict keeps apart
@example(ops=["all_gather"], sizes=[1] * 40, known={}, odd="bool")  # one by one: 0 + True is the int 1
def test_a_run_s_bytes_by_op_are_counted_in_c_as_one_by_one(ops: list[str], sizes: list[Any], known: dict[str, Any],
                                                            odd: str | None) -> None:
    """count_ops (_batch.c's add_ops: a run's bytes summed by op in 64 bits, each op's sum added once, where every
    value lets it; else one by one) against Python's ``by_op[op] = by_op.get(op, 0) + size`` in order: the same
    values, the same keys in the same order, the same total, for runs of up to eleven ops, equal ops that are other
    objects, and one value of another type or past 64 bits (``odd``)."""
    batch = compiled("zeromon_agent.recorder._batch")
    if batch is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    nbytes: list[Any] = sizes[:len(ops)]
    spoil = {"subclass": lambda: ops.__setitem__(-1, _Op(ops[-1])), "bool": lambda: nbytes.__setitem__(0, True),
             "float size": lambda: nbytes.__setitem__(0, float(nbytes[0])),
             "past 64 bits": lambda: nbytes.__setitem__(-1, 2**64 + 3),
             "sum past 64 bits": lambda: nbytes.__setitem__(0, 2**63 - 1),
             "negative": lambda: nbytes.__setitem__(0, -(2**63))}
    if odd in spoil and ops:
        spoil[odd]()
    elif odd == "float known":
        known["all_gather"] = 2.0**53  # where each addition rounds
    elif odd == "known past 64 bits":
        known["reduce_scatter"] = 2**64 - 1
    expected = dict(known)
    for op, size in zip(ops, nbytes, strict=True):
        expected[op] = expected.get(op, 0) + size
    by_op = dict(known)
    assert batch.count_ops(by_op, ops, nbytes) == sum(nbytes)
    assert list(by_op.items()) == list(expected.items())
    assert [type(v) for v in by_op.values()] == [type(v) for v in expected.values()]


@PROPERTIES
@given(raws=st.lists(_raw_collective, max_size=60), cuts=st.lists(st.integers(0, 60), max_size=5),
       durations=st.lists(st.none() | st.floats(0, 1e3), min_size=60, max_size=60))
def test_collectives_counted_in_bulk_when_read_are_the_ones_counted_one_by_one(
        raws: list[tuple[Any, ...]], cuts: list[int], durations: list[float | None]) -> None:
    events = [_plain_event(0, 0, seq, raw) for seq, raw in enumerate(raws, start=1)]
    counted = [(event, duration, None if duration is None else duration * 7.0) for event, duration
               in zip(events, durations, strict=False)]
    in_bulk = LiveTotals()
    bounds = [0, *sorted(cuts), len(counted)]
    for start, stop in zip(bounds, bounds[1:], strict=False):
        in_bulk.count_collectives([live_counted(*entry) for entry in counted[start:stop]])
    # What the totals counted one record at a time before (LiveTotals.count_collective at 73de7b7).
    expected: dict[tuple[str, str], CollectiveTotals] = {}
    windows: dict[str, list[float]] = {}
    for event, duration, busbw in counted:
        totals = expected.setdefault((event.op, event.meaning), CollectiveTotals())
        totals.calls += 1
        totals.bytes += max(event.bytes_in, event.bytes_out)
        totals.blocked_s += event.thread_blocked_s
        if duration is not None:
            totals.timed_calls += 1
            totals.seconds += duration
            totals.buckets[bisect.bisect_left(DURATION_BUCKETS, duration)] += 1
        if busbw is not None:
            windows.setdefault(event.op, []).append(busbw)
    assert in_bulk.collectives == expected
    assert {op: list(v) for op, v in in_bulk.busbw.items()} == {op: v[-BUSBW_WINDOW:] for op, v in windows.items()}



_counted_row = st.tuples(st.sampled_from(["all_gather", "all_reduce"]), st.sampled_from(["param_all_gather", "unknown"]),
                         st.integers(0, 2**40), st.floats(0, 10), st.integers(0, 2**40), st.none() | st.floats(0.5, 2))


@PROPERTIES
@given(rows=st.lists(_counted_row, max_size=700), cuts=st.lists(st.integers(0, 700), max_size=6),
       as_columns=st.lists(st.booleans(), min_size=7, max_size=7))
def test_a_batch_s_columns_counted_in_bulk_are_its_rows_counted_one_by_one(
        rows: list[tuple[Any, ...]], cuts: list[int], as_columns: list[bool]) -> None:
    """The recorder's batches hand the totals columns; counted among rows, past a busbw window's length,
    they add what their rows add, in order."""
    in_bulk, one_by_one = LiveTotals(), LiveTotals()
    bounds = [0, *sorted(cuts), len(rows)]
    for index, (start, stop) in enumerate(zip(bounds, bounds[1:], strict=False)):
        part = rows[start:stop]
        counted = [(op, meaning, nbytes, blocked, blocked,
                    size / blocked * factor if blocked > 0 and factor is not None and size > 0 else None)
                   for op, meaning, nbytes, blocked, size, factor in part]
        for row in counted:
            one_by_one.count_collectives([row])
        if as_columns[index] and part:
            ops, meanings, nbytes, blocked, _, busbw = zip(*counted, strict=True)
            in_bulk.count_collectives([[ops, meanings, nbytes, blocked, blocked, busbw]])
        else:
            in_bulk.count_collectives(counted)
    assert in_bulk.collectives == one_by_one.collectives
    assert list(in_bulk.collectives) == list(one_by_one.collectives)  # first seen first
    assert {op: list(v) for op, v in in_bulk.busbw.items()} == {op: list(v) for op, v in one_by_one.busbw.items()}


_FLOAT = st.floats(-1e3, 1e9, allow_nan=False)
_any_counted_row = st.tuples(
    st.sampled_from(["all_gather", "reduce_scatter"]) | st.text(max_size=2) | st.none(),  # a str of its own, not one
    st.sampled_from(["param_all_gather", "unknown"]),
    st.integers(0, 2**40) | st.sampled_from([2**63 - 1, 2**63, -1, True]),  # past 64 bits, a bool: the Python loop
    _FLOAT | st.integers(0, 3),  # an int time blocked: the Python loop
    st.none() | _FLOAT | st.sampled_from([1e-6, 1e-5, 5e-5, 0.01, 1e9]),  # a bucket's bound exactly
    st.none() | _FLOAT)


@PROPERTIES
@given(before=st.lists(_counted_row, max_size=40), parts=st.lists(st.tuples(st.lists(_any_counted_row, max_size=120),
                                                                            st.booleans(), st.booleans()), max_size=5))
def test_the_live_totals_counted_in_c_are_python_s(before: list[tuple[Any, ...]],
                                                   parts: list[tuple[list[tuple[Any, ...]], bool, bool]]) -> None:
    """live/_totals.c's count against LiveTotals' Python loop, on totals that already hold some: the same totals (the
    floats summed in the same order, bit for bit), the same keys and windows in the same order; where a row is not
    of the types it takes (an op not a str, a byte count past 64 bits or a bool, an int time), False and nothing
    changed, the Python loop counting them all."""
    c_count = getattr(compiled("zeromon_agent.live._totals", environment=False), "count", None)
    if c_count is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    prior = [(op, meaning, nbytes, blocked, blocked, None if factor is None else nbytes * factor)
             for op, meaning, nbytes, blocked, _, factor in before]
    ways = {}
    for way in ("c", "python"):
        totals = LiveTotals()
        with mock.patch.object(live_totals, "_COUNT", c_count if way == "c" else None):
            totals.count_collectives(list(prior))
            totals.collectives  # noqa: B018 - counted now
            for rows, as_columns, as_tuples in parts:
                if as_columns and rows:
                    columns = [list(column) if not as_tuples else column for column in zip(*rows, strict=True)]
                    totals.count_collectives([columns])
                else:
                    totals.count_collectives(list(rows))
            counted = totals.collectives
            ways[way] = ([(key, dataclasses.astuple(value)) for key, value in counted.items()],
                         [(op, list(window)) for op, window in totals.busbw.items()])
    assert ways["c"] == ways["python"]


def test_the_live_totals_of_more_keys_than_c_holds_are_counted_by_python() -> None:
    """Past _totals.c's 64 keys in one count, the Python loop counts them, and nothing is counted twice."""
    rows = [(f"op{i}", "unknown", 10, 0.5, 0.001, 2.0) for i in range(100)]
    with_c, without = LiveTotals(), LiveTotals()
    with_c.count_collectives(list(rows))
    with mock.patch.object(live_totals, "_COUNT", None):
        without.count_collectives(list(rows))
        expected = without.collectives
    assert with_c.collectives == expected and len(expected) == 100
    assert all(t.calls == 1 for t in with_c.collectives.values())


_memory_value = st.none() | st.integers(0, 2**50)


@PROPERTIES
@given(values=st.lists(_memory_value, min_size=11, max_size=11), walked=st.booleans(),
       categories=st.dictionaries(st.sampled_from(["parameters", "activations", "other"]), st.integers(0, 2**40)))
def test_a_memory_sample_made_with_its_slots_set_is_the_constructor_s(values: list[int | None], walked: bool,
                                                                      categories: dict[str, int]) -> None:
    names = ("allocated", "reserved", "active", "peak_allocated", "peak_reserved", "inactive_split",
             "num_alloc_retries", "num_ooms", "capacity", "free", "rss")
    fields: dict[str, Any] = {"device": "cpu", **dict(zip(names, values, strict=True))}
    if walked:
        fields["categories"] = categories
    # What the agent's memory watch queues: the values in MEMORY_VALUES' order, MemorySample's after its first four.
    assert MEMORY_VALUES == FIELDS_OF[MemorySample][4:]
    as_values = tuple(fields.get(name, {}) if name == "categories" else fields[name] for name in MEMORY_VALUES)
    state = HotState()
    recorder = Recorder(state, 2, None, 0.2)
    state.control.append((RAW_MEMORY, "forward", 4, 1000, fields))
    state.control.append((RAW_MEMORY, "optimizer", 4, 1500, as_values))
    state.control.append((RAW_MEMORY, "backward", 4, 2000, {**fields, "unknown_field": 1}))  # refused, as before
    with pytest.raises(TypeError):
        recorder._drain(final=True)
    made = [r for _, r in recorder.live.recent_records()] or list(map(materialize, recorder.out.records))
    expected = [MemorySample(rank=2, step=4, phase=phase, t_ns=t + recorder.clock_offset_ns, **fields)
                for phase, t in (("forward", 1000), ("optimizer", 1500))]
    assert made == expected
    assert list(map(encode_record, made)) == list(map(encode_record, expected))


_phase_change = st.tuples(st.sampled_from(["forward", "backward", "optimizer", "forward_peak", "agent-work", "step-end",
                                           "memory", "explicit-step"]),
                          st.integers(0, 5000))  # a gap of 0: a span of no length, not written
_MEMORY_VALUES = FIELDS_OF[MemorySample][4:]  # a sample's values as the agent queues them (memory.watch)


def _record_phases(changes: list[tuple[str, int]], cuts: set[int], batch: bool, tmp: Path) -> tuple[list[Any], Recorder]:
    """A Recorder (no GPU) fed phase changes, zeromon's own spans, memory samples (their peaks each step's, but in
    a peak phase) and step ends (implicit, or an explicit end and start), drained at ``cuts``: its host spans made
    as tuples and finished a column at a time (``batch``), or made as Mark and Span objects (the handlers a GPU's
    phases take) and finished one at a time (StepBook.finish_span, as before)."""
    state = HotState()
    tmp.mkdir(exist_ok=True)
    path = tmp / f"phases-{batch}.zmr"
    recorder = Recorder(state, 1, CompactWriter(path, 1), 0.2, clock_offset_ns=10**18)
    if not batch:
        for handler in ("on_phase", "on_agent", "on_step_start", "on_step_end"):
            delattr(recorder.steps, handler)  # the host's handlers (_use_host_phases) give way to the class's
        recorder.steps.host_phases, recorder.steps.closed = False, collections.deque()  # and no run of them in C

        def one_at_a_time(spans: list[Any]) -> None:
            for span in spans:
                recorder.steps.finish_span(span, span.start.perf + 10**18, span.end.perf + 10**18, "host")
        recorder.steps.finish_host_spans = one_at_a_time  # type: ignore[method-assign]
    t, step, phase = 1000, 0, "forward"
    state.control.append((RAW_STEP_START, 0, t, None, "forward"))
    for index, (change, gap) in enumerate(changes):
        t += gap
        if change == "step-end":
            state.control.append((RAW_STEP_END, step, t, None, False))
            step += 1
        elif change == "explicit-step":  # zeromon_agent.step(): its end, and the next one's start a gap later
            state.control.append((RAW_STEP_END, step, t, None, True))
            step += 1
            t += gap // 3
            state.control.append((RAW_STEP_START, step, t, None, phase))
        elif change == "memory":  # its levels by the gap: none, the process's only, or the allocator's too
            allocated, rss = ((None, None), (None, 2**20 + t), (2**30 - t, 2**20 + t))[gap % 3]
            values: list[Any] = [None] * len(_MEMORY_VALUES)
            values[_MEMORY_VALUES.index("device")] = "cpu"  # a sample of none is not read back: the reader says so
            values[_MEMORY_VALUES.index("allocated")], values[_MEMORY_VALUES.index("rss")] = allocated, rss
            state.control.append((RAW_MEMORY, phase, step, t, (*values[:-1], {})))
        elif change == "agent-work":
            state.control.append((RAW_AGENT, step, t, t + gap // 2 + 1, phase))
            t += gap // 2 + 1
        else:
            phase = change
            state.control.append((RAW_PHASE, change, t, step, None))
        if index in cuts:
            recorder._drain(final=False)
    recorder.stop()
    wall_clock = ("AgentStats", "RunEnd", "Notice")
    return [r for r in iter_records(path) if type(r).__name__ not in wall_clock], recorder


@PROPERTIES
@given(changes=st.lists(_phase_change, min_size=1, max_size=60), cuts=st.sets(st.integers(0, 60), max_size=4))
def test_host_phase_spans_finished_a_column_at_a_time_are_the_ones_finished_one_by_one(
        changes: list[tuple[str, int]], cuts: set[int]) -> None:
    """The host's boundaries (plain tuples, finished a column at a time, a run of phase changes, agent spans and
    memory samples and the spans' columns and step accounting in C where _batch.c was built, and by the host handlers
    and Recorder._on_memory a record at a time and finish_host_spans' loops where not) against the handlers a GPU's boundaries take (Marks and Spans, finished one at a time): the same
    records (the steps' peaks among them), the same live views."""
    with tempfile.TemporaryDirectory() as tmp:
        batch, batch_recorder = _record_phases(changes, cuts, True, Path(tmp))
        plain, plain_recorder = _record_phases(changes, cuts, False, Path(tmp))
        with mock.patch.object(loop, "_HOST_PHASES", None), mock.patch.object(step_book, "_HOST_SPANS", None):
            handlers, _ = _record_phases(changes, cuts, True, Path(tmp) / "python")
    assert [encode_record(r) for r in batch] == [encode_record(r) for r in plain] == \
        [encode_record(r) for r in handlers]
    assert [r for _, r in batch_recorder.live.recent_records()] == [r for _, r in plain_recorder.live.recent_records()]
    if any(change == "step-end" for change, _ in changes):
        assert any(isinstance(r, StepSummary) for r in batch)
    if any(change not in ("step-end", "memory") and gap > 0 for change, gap in changes):  # a phase of some length closed
        assert any(isinstance(r, PhaseSpan) for r in batch)
    assert sum(isinstance(r, MemorySample) for r in batch) == sum(change == "memory" for change, _ in changes)


def test_host_phases_spans_and_phase_are_made_out_of_the_collector_s_walk() -> None:
    """_host.c's host_phases makes each closed span and the current phase a tuple of names, steps and times, and each
    memory sample's values a tuple: untracked as made (what a young collection would do at its first look), and tracked
    where an item is (a step queued as an object the collector follows stays visible to it; a category's value that is
    a list)."""
    host = compiled("zeromon_agent.recorder._host")
    if host is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    for step, tracked in ((3, False), ([3], True)):
        items = [(RAW_PHASE, "forward", 10, step, None), (RAW_AGENT, step, 20, 25, "forward"),
                 (RAW_PHASE, "backward", 40, step, None)]
        spans: list[Any] = []
        ran, current = host.host_phases(items, 0, 3, None, spans, "agent", RAW_PHASE, RAW_AGENT, None, None)
        assert ran == 3 and [span[:2] for span in spans] == [("forward", step), ("agent", step), ("forward", step)]
        assert current == ("backward", 40, step)
        assert [gc.is_tracked(span) for span in spans] == [tracked] * 3 and gc.is_tracked(current) == tracked
    # and each memory sample's values, the same way: untracked where its categories and values hold nothing tracked
    fields = (("cpu", *(None,) * 8, 2**30, None, 2**20, {}), ("cpu", *(None,) * 8, 2**30, None, 2**20, {"x": []}))
    samples: list[Any] = []
    memory = (RAW_MEMORY, samples, {}, 0, 10**9, len(fields[0]), -1, frozenset(), 1, 11)
    items = [(RAW_MEMORY, "forward", 3, 100 + i, values) for i, values in enumerate(fields)]
    ran, _ = host.host_phases(items, 0, 2, None, [], "agent", RAW_PHASE, RAW_AGENT, memory, None)
    assert ran == 2 and [sample[3] for sample in samples] == [10**9 + 100, 10**9 + 101]
    assert [gc.is_tracked(sample) for sample in samples] == [False, True]


@pytest.mark.parametrize(("late", "held"), [(0, None), (2**63, None), (0, "int"), (0, "float"), (0, "many phases")])
def test_host_spans_account_the_steps_not_summarized_as_python_does(late: int, held: str | None) -> None:
    """finish_host_spans' accounting in C (host_spans) and in Python: a summarized step's spans make no accumulator,
    the others add each phase's time in order (C: a run's sum a phase, added once, where the values let it), the
    agent's spans and the earliest start to theirs; a span past 64 bits (``late``) is left to the Python loops whole.
    ``held``: the step's times by phase from an earlier pass (an int; a float, to which each addition rounds), or a run
    of more phases than C sums at once."""
    spans = [("forward", 5, 100, 200), ("backward", 5, 200, 260), ("forward", 6, 300, 350), ("agent", 6, 350, 360),
             ("backward", 6, 360, 500), ("forward", 6, 500, 520 + late), ("agent", 7, 90, 95), ("other", 7, 80, 90)]
    if held == "many phases":
        spans[5:5] = [(f"phase{i}", 6, 500, 501 + i) for i in range(8)]
    elif held == "float":  # 2**53 + 140, then + 1 twice: each addition rounds back to it, their sum would not
        spans[5:5] = [("backward", 6, 500, 501), ("backward", 6, 501, 502)]
    books = []
    for way in (step_book._HOST_SPANS, None):
        recorder = Recorder(HotState(), 0, None, 5.0, clock_offset_ns=10**9)
        book = recorder.steps
        book.emitted_through = 5
        book.acc(6).start_ns = 10**9 + 320  # a step's start from an earlier record, later than its first span's
        if held is not None:
            book.acc(6).phase_ns = {"backward": 2.0**53 if held == "float" else 2**40, "idle": 7}
        with mock.patch.object(step_book, "_HOST_SPANS", way):
            book.finish_host_spans(list(spans))
        books.append(book)
        recorder.stop()
    with_c, python = ({step: (acc.phase_ns, acc.agent, acc.start_ns) for step, acc in book.accs.items()}
                      for book in books)
    assert with_c == python
    assert [list(acc[0].items()) for acc in with_c.values()] == [list(acc[0].items()) for acc in python.values()]
    assert [type(v) for v in with_c[6][0].values()] == [type(v) for v in python[6][0].values()]
    assert list(python) == [6, 7]
    if held is None:
        assert list(python[6][0]) == ["forward", "agent", "backward"]
        assert python[6] == ({"forward": 70 + late, "agent": 10, "backward": 140}, [(10**9 + 350, 10**9 + 360)],
                             10**9 + 300)
    elif held == "float":
        assert python[6][0]["backward"] == 2.0**53 + 140 and list(python[6][0]) == ["backward", "idle", "forward", "agent"]
    assert python[7] == ({"agent": 5, "other": 10}, [(10**9 + 90, 10**9 + 95)], 10**9 + 80)


@pytest.mark.parametrize("in_c", [True, False])
def test_a_step_s_peak_is_its_highest_sample_but_those_of_its_peak_phases(in_c: bool, tmp_path: Path) -> None:
    """The samples of a run host_phases takes (in C) and those _on_memory takes one at a time: a step's peak is the
    allocator's level where a sample has it, else the process's, highest of the samples but a peak phase's."""
    changes = [("memory", 1), ("forward_peak", 10), ("memory", 2), ("backward", 10), ("memory", 5), ("memory", 3),
               ("step-end", 10), ("memory", 3), ("step-end", 10)]
    with mock.patch.object(loop, "_HOST_PHASES", loop._HOST_PHASES if in_c else None), \
            mock.patch.object(step_book, "_HOST_SPANS", step_book._HOST_SPANS if in_c else None):
        records, recorder = _record_phases(changes, set(), True, tmp_path)
    # The samples' t and levels (_record_phases: by the gap): 1001 the process's, 1013 the allocator's in a peak
    # phase (the highest, not the step's), 1028 the allocator's, 1031 none; the next step's 1044 none
    peaks = {r.step: r.peak_memory for r in records if isinstance(r, StepSummary)}
    assert peaks == {0: 2**30 - 1028, 1: None}
    samples = [r for r in records if isinstance(r, MemorySample)]
    assert [(s.phase, s.t_ns - 10**18) for s in samples] == [("forward", 1001), ("forward_peak", 1013),
                                                             ("backward", 1028), ("backward", 1031), ("backward", 1044)]
    assert len([r for _, r in recorder.live.recent_records() if isinstance(r, MemorySample)]) == 5


@pytest.mark.parametrize("explicit", [False, True])
def test_a_run_s_step_boundaries_set_the_marks_the_host_handlers_do(explicit: bool) -> None:
    """A pass's step ends and starts taken in the C run (host_phases) and by the host handlers one at a time: each
    step's accumulator (made at its first boundary) gets the same start and end Marks, an end the time it was seen;
    the same spans closed (none for a gap the next step's start finds inside that step) and the same current phase,
    an implicit end opening the next step's."""
    items = [(RAW_STEP_START, 3, 100, None, "forward"), (RAW_PHASE, "backward", 150, 3, None),
             (RAW_STEP_END, 3, 200, None, explicit), (RAW_STEP_START, 4, 200 if explicit else 230, None, "forward"),
             (RAW_PHASE, "backward", 260, 4, None), (RAW_STEP_END, 4, 300, None, explicit),
             (RAW_STEP_END, 5, 300, None, explicit)]  # no phase of its own: at the same time, it closes none
    ways = []
    for way in (loop._HOST_PHASES, None):
        recorder = Recorder(HotState(), 0, None, 5.0, clock_offset_ns=0)
        with mock.patch.object(loop, "_HOST_PHASES", way):
            before = time.perf_counter_ns()
            recorder._dispatch(items)
        book = recorder.steps
        assert all(before <= acc.ended_at_perf <= time.perf_counter_ns() for acc in book.accs.values())
        ways.append([(step, acc.start and (acc.start.perf, acc.start.event, acc.start.unix), acc.end.perf)
                     for step, acc in book.accs.items()] + [list(book.closed), book.current])
        recorder.stop()
    with_c, python = ways
    assert with_c == python
    assert python[:3] == [(3, (100, None, None), 200), (4, (200 if explicit else 230, None, None), 300), (5, None, 300)]
    assert python[3] == [("forward", 3, 100, 150), ("backward", 3, 150, 200), ("forward", 4, 200 if explicit else 230, 260),
                         ("backward", 4, 260, 300)]
    assert python[4] == (None if explicit else ("backward", 300, 6))


class _StandInEvent:
    """A CUDA event that is never recorded here: a recorder on a GPU holds a CudaTimer over them."""

    def __init__(self, enable_timing: bool = False) -> None:
        pass


def _record_pass(raws: list[tuple[Any, ...]], path: str, tmp: Path, early: int | None = None,
                 gpu: bool = True) -> tuple[list[Any], Recorder]:
    """A Recorder fed collectives, sync and async, each async one's wait in its own step or the next, then a late
    one of a summarized step. On a GPU (``gpu``: a CudaTimer), of steps not timed on the device (UNTIMED) on an
    NCCL group ("nccl") or a gloo one ("gloo"), or timed on the host ("host": a gloo group's in a timed step);
    without, all on the host. A host one's wait found it done or not, it may have had a completion callback
    (sampled), and a callback's or a phase change's record may come before its wait. By ``path``: "batch"
    (finalize_pass, a column at a time) or "plain" (the general path: _finalize).
    ``early``: the seq of an async one with a wait in a pass before its call too (the general path pairs it with
    that one). The records it wrote, but those stamped with the wall clock."""
    file = tmp / f"{path}.zmr"
    state = HotState()
    timer = CudaTimer(types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_StandInEvent)), pool_size=1) if gpu \
        else None
    recorder = Recorder(state, 3, CompactWriter(file, 3), 0.2, cuda_timer=timer, clock_offset_ns=10**18)
    collectives = recorder.collectives
    collectives._group_sizes.update({None: 2, "gloo": 2})
    collectives._group_hosts.update({None: False, "gloo": True})  # NCCL's collectives are the GPU's, gloo's the host's
    finalized: list[int] = []
    if path.startswith("batch"):  # the path is taken, not left for the item-by-item one
        rows = collectives._finalize_rows
        collectives._finalize_rows = lambda batch: finalized.append(len(batch)) or rows(batch)  # type: ignore[method-assign]
    else:
        collectives.finalize_pass = lambda items, dispatch: dispatch(items)  # type: ignore[method-assign]
    if early is not None:
        state.raw.append((RAW_WAIT, early, 2**40, 2**40 + 5, False, None, None, raws[early - 1][7]))
        recorder._drain(final=False)
    for step in range(4):
        state.control.append((RAW_STEP_START, step, step * 2**38, None, "forward"))
        state.control.append((RAW_STEP_END, step, (step + 1) * 2**38, None, True))
    waits, works = [], []
    done: torch.futures.Future[None] = torch.futures.Future()
    done.set_result(None)
    for seq, (op, phase, t0, length, b_in, b_out, dtype, step, is_async, wait_later, blocked, where, done_before,
              sampled, extra) in enumerate(raws, 1):
        where = where if gpu else "host"
        t0 = step * 2**38 + t0 % 2**37
        work = None
        host = where == "host"
        if is_async:  # named by its id, as the hot path names it (a host one's Work held in HotState.works)
            works.append(_create_work_from_future(done))
            work = id(works[-1])
            if host:
                state.works[seq] = works[-1]
        if host and is_async and extra == "done first":  # a callback that ran as it was registered
            state.raw.append((RAW_DONE, seq, t0 + length))
        state.raw.append((RAW_COLLECTIVE, seq, f"{op}_x", op, t0, t0 + length, b_in, b_out, dtype,
                          None if where == "nccl" else "gloo", is_async, work, phase, step, None if host else UNTIMED,
                          host and is_async and sampled, None))
        if is_async:
            if not host:
                timer.untimed_waits.add(seq)  # type: ignore[union-attr]
            wait_step = step + wait_later
            w0 = wait_step * 2**38 + (t0 + length + blocked // 3) % 2**37  # a gap between the call and its wait
            if host and extra in ("done", "seen"):  # a completion callback's or a phase change's, before the wait
                waits.append((RAW_DONE if extra == "done" else RAW_SEEN_DONE, seq, t0 + length + 1))
            waits.append((RAW_WAIT, seq, w0, w0 + blocked, host and done_before, None, None, wait_step))
            if host and extra == "done last":  # the callback's record after the wait's
                waits.append((RAW_DONE, seq, w0 + blocked + 1))
        if seq % 3 == 0 and waits:  # a wait among the calls after it
            state.raw.append(waits.pop(0))
    state.raw.extend(waits)
    recorder._drain(final=False)  # the steps are summarized: the next one's collective is late
    # A host one's callback record is the columns' where it was asked for (sampled) and came in the pass; with a
    # phase change's record, or one not sampled with a callback's, the general path's.
    takes = any(gpu and where == "nccl" and (not is_async or not later)
                or is_async and not later and (where == "host" or not gpu)
                and extra in ((None, "done last") if not sampled else ("done", "done first", "done last"))
                for *_, is_async, later, _, where, _, sampled, extra in raws)
    assert path == "plain" or bool(finalized) == takes
    state.raw.append((RAW_COLLECTIVE, len(raws) + 1, "all_reduce_x", "all_reduce", 5, 9, 4, 4, None, None, False,
                      None, "backward", 0, UNTIMED if gpu else None, False, None))
    recorder.stop()
    assert timer is None or not timer.untimed_waits
    wall_clock = ("AgentStats", "RunEnd", "Notice")
    return [r for r in iter_records(file) if type(r).__name__ not in wall_clock], recorder


_raw_pass = st.tuples(st.sampled_from(_OPS), st.sampled_from(_PHASES), st.integers(0, 2**36),
                      st.integers(0, 2**33), st.integers(0, 2**20), st.integers(0, 2**20),
                      st.sampled_from([None, "float32", "torch.bfloat16"]), st.integers(0, 2), st.booleans(),
                      st.sampled_from([0, 0, 0, 1]), st.integers(0, 2**33), st.sampled_from(["nccl", "gloo", "host"]),
                      st.booleans(), st.sampled_from([False, False, True]), st.sampled_from([None, None, "done", "seen", "done first", "done last"]))


@PROPERTIES
@given(raws=st.lists(_raw_pass, min_size=1, max_size=40), gpu=st.booleans())
def test_a_pass_finalized_in_columns_records_summarizes_and_counts_what_the_general_path_does(
        raws: list[tuple[Any, ...]], gpu: bool) -> None:
    raws = sorted(raws, key=operator.itemgetter(7))  # issued step by step
    with tempfile.TemporaryDirectory() as tmp:
        plain, plain_recorder = _record_pass(raws, "plain", Path(tmp), gpu=gpu)
        fast, fast_recorder = _record_pass(raws, "batch", Path(tmp), gpu=gpu)
        assert [encode_record(r) for r in fast] == [encode_record(r) for r in plain]
        assert any(isinstance(r, StepSummary) and r.collectives for r in fast)
        assert [r for _, r in fast_recorder.live.recent_records()] == \
            [r for _, r in plain_recorder.live.recent_records()]
        assert fast_recorder.live.totals.collectives == plain_recorder.live.totals.collectives
        assert {op: list(v) for op, v in fast_recorder.live.totals.busbw.items()} == \
            {op: list(v) for op, v in plain_recorder.live.totals.busbw.items()}
        assert fast_recorder.events_finalized == plain_recorder.events_finalized == len(raws) + 1


def test_a_pass_of_more_collectives_than_one_batch_takes_is_finalized_as_one_by_one(tmp_path: Path) -> None:
    where = {100: "gloo", 701: "gloo", **{i: "host" for i in range(450, 456)}}
    raws = [(_OPS[i % 4], _PHASES[i % 3], 1000 * i, 50 + i, 4096, 4096 * (1 + i % 2), "float32", i // 300,
             i % 2 == 1, 0, 7 * i, where.get(i, "nccl"), i % 3 == 0, False, None) for i in range(900)]
    for early in (None, 302):  # and with one async call waited on in a pass before it too
        plain, _ = _record_pass(raws, "plain", tmp_path, early)
        batch, _ = _record_pass(raws, "batch", tmp_path, early)
        assert [encode_record(r) for r in batch] == [encode_record(r) for r in plain]
        assert sum(isinstance(r, CollectiveEvent) for r in batch) == 901
    assert {r.timing for r in batch if isinstance(r, CollectiveEvent)} >= {"launch", "bound", "wait"}


def test_a_step_of_more_async_host_collectives_than_it_keeps_intervals_of_is_folded_as_one_by_one(
        tmp_path: Path) -> None:
    # The columns (StepAcc.col_*) take a step's async collectives until MAX_STEP_INTERVALS; past it they go into
    # the lists a row at a time, folded as the general path folds them.
    raws = [(_OPS[i % 4], _PHASES[i % 3], 1000 * i, 50 + i, 4096, 4096, "float32", 0, True, 0, 7 * i, "host",
             i % 3 == 0, False, None) for i in range(step_acc.MAX_STEP_INTERVALS + 400)]
    plain, _ = _record_pass(raws, "plain", tmp_path, gpu=False)
    batch, _ = _record_pass(raws, "batch", tmp_path, gpu=False)
    assert [encode_record(r) for r in batch] == [encode_record(r) for r in plain]
    summary = next(r for r in batch if isinstance(r, StepSummary) and r.step == 0)
    assert summary.collectives == len(raws) and summary.exposed_comm_s is None  # folded: the overlap not known


def test_the_c_modules_keep_no_reference_to_what_they_are_given_or_make() -> None:
    """The C modules run in every rank for the whole training: a reference kept on every call (of a value they pass
    through, or of what they made on a path that gives up) would grow the process without end. After a thousand
    calls of each, on the paths that make columns, refuse a batch and raise, the values given are held as often as
    before."""
    if collective_records._BATCHER is None or column_arrays._compiled is None:
        pytest.skip("the package was installed without its C modules (no C compiler at its build)")
    batch, planes = collective_records._BATCHER, column_arrays._compiled
    api, group, factor = "all_reduce_" + "x" * 8, ("group", object()), 0.75
    shape = ("float32", 2, "grad_all_reduce", 4096, factor, 4096)
    items = [(RAW_COLLECTIVE, seq, api, "all_reduce", 1000 + seq * 10, 1005 + seq * 10, 4096, 4096, "float32", group,
              False, None, "backward", seq // 8, None, False, api) for seq in range(64)]
    refused = [*items[:4], (*items[4][:5], 0, *items[4][6:])]  # a call that ends before it starts
    rows = [(raw, 5, raw[4], shape, None if seq % 3 == 0 else raw[5] + 3, "launch" if seq % 3 == 0 else "wait")
            for seq, raw in enumerate(items)]
    column = [10**12 + i for i in range(64)]
    # A run of host records with step boundaries, a batch's step accounting, a sequential step's summary, a run's fit
    host = compiled("zeromon_agent.recorder._host")
    step_items = [(RAW_PHASE, api, 5, 1, None), (RAW_STEP_END, 1, 9, None, False), (RAW_STEP_START, 2, 12, None, api),
                  (RAW_STEP_END, 2, 20, None, True)]
    bounds = (RAW_STEP_START, RAW_STEP_END, {}, new_acc, Mark, time.perf_counter_ns)
    steps = [1] * 32 + [2] * 32
    accounted = (steps, [api] * 64, [4096] * 64, column, [c + 5 for c in column], [5e-9] * 64, [c + 5 for c in column])
    summed = StepAcc(run_issue=column[:8], run_complete=[c + 1 for c in column[:8]], run_end=column[:8],
                     phase_ns={api: 10**9 + 7}, by_op={api: 4096}, blocked_s=factor)
    spec = SPECS[MemorySample]
    accepted, maps = tuple(columnar._TYPES[how] for _, how, _ in spec), ((16, frozenset({api})),)
    sample_rows = [(0, 1, api, 5, "cpu", *[None] * 11, {api: 3})] * 8 + [(0, 1, api, 5, "cpu", *[None] * 11, {api: True})]
    watched = (api, group, factor, shape, items[0], column[0], step_items[0], sample_rows[0])
    before = [sys.getrefcount(value) for value in watched]
    for _ in range(1000):
        assert host.host_phases(step_items, 0, 4, None, [], "agent", RAW_PHASE, RAW_AGENT, None, bounds)[0] == 4
        bounds[2].clear()
        assert batch.account_sync(*accounted, {}, new_acc, 4096) == 64
        assert batch.all_sync(items, RAW_COLLECTIVE, -1) is True and batch.all_sync(items, RAW_COLLECTIVE, 10) is False
        assert batch.account_sync(*accounted, {}, new_acc, 16) == 0  # a run that folds: left to Python
        assert batch.summarize_host(summed, 0, 1, column[0], column[0] + 10**6) is not None
        assert planes.rows_fit(sample_rows, 0, 9, accepted, maps) == 8
        made = batch.sync_columns(items, {}, lambda *key: shape, 10**18, 2**50)
        assert made is not None and batch.sync_columns(refused, {}, lambda *key: shape, 10**18, 2**50) is None
        assert batch.async_columns(rows, 10**18, True, frozenset({"wait"})) is not None
        values, _ = planes.int_column(column, False, False, 1, None, None)
        planes.int_column(column, False, False, 2, values, None)
        with pytest.raises(OverflowError):
            planes.int_column([*column, 2**64], False, False, 0, None, None)
        planes.str_column([api, None, api])
        assert planes.nones([api, None, factor]) == 1
        assert planes.join_columns([[[api, factor], column[:2]], [(group,), column[2:3]]]) == \
            [[api, factor, group], column[:3]]
        with pytest.raises(ValueError):
            planes.join_columns([[[api, factor], column[:2]], [(group,), column[2:4]]])
    del made, values
    assert [sys.getrefcount(value) for value in watched] == before
