"""The recorder's records let out of the garbage collector's lists (recorder/_batch.c's ``untrack``, called by
Outbox.release): what it untracks refers to nothing the collector tracks, so it can be in no reference cycle; what
could be stays tracked, and a cycle through it is still collected; and a real pass's records, once handed to the live
views, are untracked."""

from __future__ import annotations

import gc
import tempfile
import weakref
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_reader_properties import PROPERTIES

from zeromon.model.compiled import compiled
from zeromon.model.events import MemorySample, StepSummary
from zeromon.model.kinds import FIELDS_OF
from zeromon.model.segments import CompactWriter
from zeromon_agent.compact import Unmade
from zeromon_agent.hooks.state import (
    RAW_COLLECTIVE,
    RAW_MEMORY,
    RAW_PHASE,
    RAW_STEP_END,
    RAW_STEP_START,
    HotState,
)
from zeromon_agent.recorder import outbox
from zeromon_agent.recorder.loop import Recorder

_batch = compiled("zeromon_agent.recorder._batch", environment=False)
needs_c = pytest.mark.skipif(_batch is None, reason="the package was installed without its C modules (no C compiler "
                                                    "at its build)")


class Holder:
    """A user's object: the collector tracks it (it has a __dict__), and it may close a cycle."""


LEAF = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=3), st.none(), st.builds(Holder))
VALUE = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
                                                   st.dictionaries(st.text(max_size=2), inner, max_size=3)),
                     max_leaves=12)


def _reaches_tracked(obj: Any, seen: set[int]) -> bool:
    """Whether ``obj`` refers to an object the collector tracks, directly or through untracked ones (types aside:
    an instance's traverse visits its class)."""
    for ref in gc.get_referents(obj):
        if id(ref) in seen or isinstance(ref, type):
            continue
        seen.add(id(ref))
        if gc.is_tracked(ref) or _reaches_tracked(ref, seen):
            return True
    return False


def _holds_a_user_object(obj: Any) -> bool:
    if isinstance(obj, Holder):
        return True
    children = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return any(_holds_a_user_object(child) for child in children)


@needs_c
@PROPERTIES
@given(values=st.lists(VALUE, max_size=6), name_the_user_class=st.booleans())
def test_what_untrack_lets_go_of_refers_to_nothing_the_collector_tracks(values: list[Any],
                                                                        name_the_user_class: bool) -> None:
    """Whatever it is given, what it untracks reaches nothing tracked; a container that holds a user's object stays
    tracked, and so does a user's object itself unless its class is named."""
    tracked = [value for value in values if gc.is_tracked(value)]
    count = _batch.untrack(values, (Holder,) if name_the_user_class else ())
    untracked = [value for value in tracked if not gc.is_tracked(value)]
    assert count == len(untracked)
    for value in untracked:
        assert not _reaches_tracked(value, set())
    for value in tracked:
        if isinstance(value, Holder):
            assert gc.is_tracked(value) or name_the_user_class  # an instance may be given a cycle later
        elif _holds_a_user_object(value):  # a cycle could run through it: the collector keeps looking at it
            assert gc.is_tracked(value)


@needs_c
def test_the_recorder_s_records_are_untracked_two_levels_down_and_no_further() -> None:
    summary = StepSummary(rank=0, step=1, start_ns=1, end_ns=2, phase_s={"forward": 0.5}, collectives=1, comm_bytes=8,
                          comm_bytes_by_op={"all_reduce": 8}, comm_union_s=0.1, blocked_s=0.1, peak_memory=None,
                          comp_s=0.4, overlap_s=0.0, exposed_comm_s=0.1)
    sample = (0, 1, "forward", 5, "cpu", None, None, 3, {})  # a memory sample's values, its categories a dict
    batch = Unmade(([1, 2], ["all_reduce", "all_reduce"], [0.5, 0.25]), 2)  # a batch's columns
    deep = [[[[1]]]]  # three levels of lists below the object: past what untrack makes untracked first
    assert all(map(gc.is_tracked, (summary, sample, batch, deep)))
    assert _batch.untrack([summary, sample, batch, deep], (StepSummary,)) == 2  # Unmade is not named
    assert not any(map(gc.is_tracked, (summary, sample)))
    assert gc.is_tracked(batch) and all(map(gc.is_tracked, batch._columns))  # type: ignore[union-attr]
    assert _batch.untrack([batch], (StepSummary, Unmade)) == 1
    assert not any(map(gc.is_tracked, (batch, *batch._columns)))  # type: ignore[union-attr]
    assert gc.is_tracked(deep)
    assert batch.rows() == [(1, "all_reduce", 0.5), (2, "all_reduce", 0.25)]  # an untracked batch still reads
    with pytest.raises(TypeError):
        _batch.untrack(5, ())
    with pytest.raises(TypeError):
        _batch.untrack([], [Unmade])  # the classes as a tuple


@needs_c
def test_a_cycle_through_a_record_that_holds_a_user_object_is_still_collected() -> None:
    holder = Holder()
    record = (1, [2, holder])
    holder.record = record  # type: ignore[attr-defined]
    assert _batch.untrack([record], (Holder,)) == 0
    assert gc.is_tracked(record) and gc.is_tracked(record[1])
    gone = weakref.ref(holder)
    del holder, record
    gc.collect()
    assert gone() is None


_MEMORY_VALUES = FIELDS_OF[MemorySample][4:]  # what the agent's sample queues, in order (memory.watch)


def test_a_pass_s_records_handed_to_the_live_views_are_untracked_where_the_module_was_built() -> None:
    """A real drain of steps, phases, memory samples and synchronous collectives: what the live views keep of it
    (step summaries, memory samples' values, the batches' columns) is let out of the collector's lists; on an install
    without the C module it is kept as before, tracked."""
    with tempfile.TemporaryDirectory() as tmp:
        state = HotState()
        recorder = Recorder(state, 0, CompactWriter(Path(tmp) / "rank-0.zmr", 0), 5.0, clock_offset_ns=10**18)
        recorder.collectives._group_sizes[None] = 2
        seq = 0
        for step in range(4):
            t = step * 10**8
            state.control.append((RAW_STEP_START, step, t, None, "forward"))
            state.control.append((RAW_PHASE, "backward", t + 4 * 10**7, step, None))
            values = ("cpu", *(None,) * 8, 2**34, None, 2**28 + step, {})
            assert len(values) == len(_MEMORY_VALUES)
            state.control.append((RAW_MEMORY, "backward", step, t + 5 * 10**7, values))
            state.control.append((RAW_STEP_END, step, t + 9 * 10**7, None, True))
            for k in range(3):
                seq += 1
                t0 = t + 10**7 * (k + 1)
                state.raw.append((RAW_COLLECTIVE, seq, "all_reduce_x", "all_reduce", t0, t0 + 10**6, 4096, 4096,
                                  "float32", None, False, None, "backward", step, None, False, None))
        recorder._drain(final=False)
        live = recorder.live
        # The summaries, the samples' values, the records and batches recent (not made into rows: RecentRecords'
        # iteration would make them), and the lists the views keep them in.
        parts = [entries for entries, _ in live.recent._parts]
        kept = [*live.recent_steps, *live.memory_history, *(entry for entries in parts for entry in entries), *parts]
        assert len(live.recent_steps) == 4 and len(live.memory_history) == 4
        recorder.stop()
    if outbox._UNTRACK is None:
        assert all(map(gc.is_tracked, live.recent_steps))
    else:
        assert not any(map(gc.is_tracked, kept))
