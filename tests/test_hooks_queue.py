"""The hooks' queue (zeromon_agent.hooks.state.Ring): the C ring (hooks/_ring.c, where setup.py built it) against
its Python path (DequeRing, a deque of tuples), operation for operation; and what the C ring holds of what it is
given, for the reference counts and the garbage collector."""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_reader_properties import PROPERTIES

from zeromon.model.compiled import compiled
from zeromon_agent.hooks.state import CONTROL_WIDTH, RAW_WIDTH, DequeRing, HotState

_ring = compiled("zeromon_agent.hooks._ring", environment=False)
needs_c = pytest.mark.skipif(_ring is None, reason="the package was installed without its C modules (no C compiler "
                                                   "at its build)")

# What a record's fields may be: shared objects, new ones, ints past 64 bits, containers.
FIELD = st.one_of(st.integers(), st.none(), st.booleans(), st.text(max_size=3), st.floats(allow_nan=False),
                  st.tuples(st.integers()), st.lists(st.integers(), max_size=2))
OPERATION = st.one_of(
    st.tuples(st.just("push"), st.lists(FIELD, max_size=7)),  # up to past the width, and none: refused
    st.tuples(st.just("append"), st.lists(FIELD, min_size=1, max_size=5)),
    st.tuples(st.just("extend"), st.lists(st.lists(FIELD, max_size=7).map(tuple), max_size=4)),
    st.tuples(st.just("take")),
    st.tuples(st.just("newest"), st.integers(-1, 8)),
    st.tuples(st.just("item"), st.integers(-8, 8)),
    st.tuples(st.just("clear")),
)


def _apply(ring: Any, operation: tuple[Any, ...]) -> Any:
    """What ``operation`` returns on ``ring``, and what the ring then holds and has counted."""
    name = operation[0]
    if name == "push":
        result: Any = ring.push(*operation[1])
    elif name == "append":
        result = ring.append(tuple(operation[1]))
    elif name == "extend":
        result = ring.extend(operation[1])
    elif name == "take":
        result = ring.take()
    elif name == "newest":
        result = ring.newest(operation[1])
    elif name == "item":
        try:
            result = ring[operation[1]]
        except IndexError:
            result = "IndexError"
    else:
        result = ring.clear()
    return result, len(ring), list(ring), ring.dropped, ring.refused


@needs_c
@PROPERTIES
@given(capacity=st.integers(1, 6), width=st.integers(1, 5), operations=st.lists(OPERATION, max_size=30),
       mark=st.integers(1, 6))
def test_the_c_ring_holds_what_the_deque_ring_holds(capacity: int, width: int, operations: list[tuple[Any, ...]],
                                                     mark: int) -> None:
    """Each operation's result, the records held (oldest first), the drops of a full ring (its oldest), the refusals
    (no field, or more than its width) and the calls of call_when's callback (each time a push brings the ring to
    its mark) are the same in both."""
    c_ring, deque_ring = _ring.Ring(capacity, width), DequeRing(capacity, width)
    calls = {"c": 0, "deque": 0}
    c_ring.call_when(mark, lambda: calls.__setitem__("c", calls["c"] + 1))
    deque_ring.call_when(mark, lambda: calls.__setitem__("deque", calls["deque"] + 1))
    for operation in operations:
        assert _apply(c_ring, operation) == _apply(deque_ring, operation), operation
        assert calls["c"] == calls["deque"], operation
    assert (c_ring.capacity, c_ring.width) == (deque_ring.capacity, deque_ring.width) == (capacity, width)


@needs_c
def test_the_c_ring_keeps_no_reference_it_does_not_hold() -> None:
    """Every path (push, a full ring's drop, a refusal, append, extend, take, newest, an item, clear, the ring let go
    of) leaves the reference counts of what it was given as they were once the ring and what it returned are gone."""
    field, other = object(), object()
    before = (sys.getrefcount(field), sys.getrefcount(other))
    ring = _ring.Ring(4, 3)
    for _ in range(1000):
        ring.push(field, other, field)  # past the capacity: the oldest dropped
        ring.push()  # refused
        ring.push(field, field, field, field)  # refused: past the width
    assert (len(ring), ring.dropped, ring.refused) == (4, 996, 2000)
    assert sys.getrefcount(field) - before[0] == 8 and sys.getrefcount(other) - before[1] == 4
    ring.append((other,))
    ring.extend([(field,), (other, other)])
    newest, item = ring.newest(10), ring[0]
    taken = ring.take()
    assert len(ring) == 0 and len(taken) == 4 and newest == taken[::-1] and item == taken[0]
    del newest, item, taken
    for _ in range(3):
        ring.push(field, other)
    ring.clear()
    ring.push(other, field)
    del ring
    assert (sys.getrefcount(field), sys.getrefcount(other)) == before


@needs_c
def test_the_c_ring_s_records_are_no_objects_for_the_garbage_collector() -> None:
    """A queued record is its fields in the ring's slots (the ring one object the collector tracks, whatever it
    holds); taken, a record is a tuple the collector does not track where none of its fields is tracked (what the
    collector would find at its first look), and tracked where one is."""
    ring = _ring.Ring(16, RAW_WIDTH)
    gc.collect()
    tracked_before = len(gc.get_objects())
    for seq in range(10):
        ring.push(0, seq, "all_reduce", 2**62 + seq, None, True)
    assert len(gc.get_objects()) == tracked_before  # no object a record
    ring.push(5, "forward", 3, 10**13, [])  # a field the collector tracks
    taken = ring.take()
    assert [gc.is_tracked(record) for record in taken] == [False] * 10 + [True]
    assert gc.is_tracked(taken)  # a list that holds a tracked record is the collector's to follow
    for seq in range(10):
        ring.push(0, seq, "all_reduce", 2**62 + seq, None, True)
    plain = ring.take()
    assert len(plain) == 10 and not gc.is_tracked(plain) and not gc.is_tracked(ring.newest(3))  # nothing to follow
    values, held = tuple([1, None, "cpu"]), (1, [])  # a memory sample's values (a tuple the hook made), one holding a list
    assert gc.is_tracked(values)  # as made
    ring.push(3, "forward", 0, 10**13, values)
    ring.push(3, "forward", 0, 10**13, held)
    sample, other = ring.take()
    assert not gc.is_tracked(sample) and not gc.is_tracked(values)  # untracked as the collector's first look would
    assert gc.is_tracked(other) and gc.is_tracked(held)


@needs_c
def test_a_cycle_through_a_taken_record_and_its_list_is_still_collected() -> None:
    """A record that holds a tracked object is tracked, and so is the list it is taken in: an object that holds that
    list (a cycle through the list, its record and back), once let go of, is freed by the collector (a list left
    untracked would hide the cycle from it)."""

    class Holder:
        taken: list[Any] | None = None

    ring = _ring.Ring(4, RAW_WIDTH)
    holder = Holder()
    ring.push(0, 1, holder)
    holder.taken = ring.take()
    freed = weakref.ref(holder)
    del holder
    gc.collect()
    assert freed() is None


def test_the_state_queues_on_the_ring_and_counts_its_drops() -> None:
    """HotState's queues are the C ring where it is built and not left out (ZEROMON_NO_COMPILED), else the deque's;
    their drops and refusals are the events it counts as dropped."""
    state = HotState(raw_capacity=2)
    ring = _ring.Ring if compiled("zeromon_agent.hooks._ring") is not None else DequeRing
    assert type(state.raw) is ring and type(state.control) is ring
    assert (state.raw.width, state.control.width) == (RAW_WIDTH, CONTROL_WIDTH)
    for seq in range(5):
        state.raw.push(0, seq)
    state.control.push(*range(CONTROL_WIDTH + 1))
    assert (state.dropped, state.control_dropped, [r[1] for r in state.raw]) == (3, 1, [3, 4])
    state.resize(8)
    assert (state.raw.capacity, [r[1] for r in state.raw]) == (8, [3, 4])


@needs_c
def test_a_field_s_destructor_may_push_while_the_ring_lets_go_of_it() -> None:
    """A dropped or cleared record's field whose destructor pushes onto the same ring (Python code run from the ring's
    own call) finds it whole: the records end as the deque's (which lets go of its oldest after appending)."""

    class PushesWhenFreed:
        def __init__(self, ring: Any) -> None:
            self.ring = ring

        def __del__(self) -> None:
            self.ring.push("pushed by a destructor")

    ends = []
    for make in (_ring.Ring, DequeRing):
        ring = make(2, 2)
        ring.push(PushesWhenFreed(ring))
        ring.push(1)
        ring.push(2)  # full: the first record goes, and its field's destructor pushes
        held = list(ring)
        ring.push(PushesWhenFreed(ring))
        ring.clear()  # what the destructor pushes meanwhile stays
        ends.append((held, ring.dropped, len(ring)))
    assert ends[0] == ends[1] == ([(2,), ("pushed by a destructor",)], 3, 1), ends


@needs_c
def test_a_collection_that_take_sets_off_may_run_a_push() -> None:
    """A take's allocations may start the garbage collector, whose finalizers run Python code (on a real run, another
    thread's push may come in then): the records taken are those queued at the call, and what is pushed meanwhile
    stays queued, whole."""
    ring = _ring.Ring(8, 2)

    class Cycle:  # garbage only the collector frees, which pushes as it goes
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            ring.push("pushed by a finalizer")

    for seq in range(5):
        ring.push(seq)
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            Cycle()
        gc.set_threshold(1)  # the take's first allocation collects them
        gc.enable()
        taken = ring.take()
        newest = ring.newest(8)
    finally:
        gc.set_threshold(*threshold)
        if not enabled:
            gc.disable()
    gc.collect()
    assert taken == [(seq,) for seq in range(5)]
    assert newest == list(ring) == [("pushed by a finalizer",)] * 3 and (ring.dropped, ring.refused) == (0, 0)


def test_a_ring_the_process_cannot_have_is_the_deque_s() -> None:
    """A raw queue past what the process may allocate at once (the C ring's slots are made at its size) is the deque's,
    which grows as it fills; what was queued moves into it."""
    state = HotState(raw_capacity=4)
    state.raw.push(0, 1)
    state.resize(2**45)  # 2**45 records x 17 references: no process has them
    assert type(state.raw) is DequeRing and state.raw.capacity == 2**45 and list(state.raw) == [(0, 1)]


@pytest.mark.parametrize("ring_type", [pytest.param("c", marks=needs_c), "deque"])
def test_a_ring_calls_its_reader_as_it_fills_to_the_mark_and_never_raises_its_error(ring_type: str) -> None:
    """call_when(size, callback): the callback on the pushing thread each time a push brings the ring to ``size``
    records (again after a take empties it; not while a full ring drops its oldest); an Exception the callback
    raises stays in the ring (the hook's push never raises), a KeyboardInterrupt goes to the training thread; None
    stops the calls."""
    ring = (_ring.Ring if ring_type == "c" else DequeRing)(4, 2)
    calls: list[int] = []
    ring.call_when(2, lambda: calls.append(len(ring)))
    for seq in range(6):
        ring.push(0, seq)
    assert calls == [2] and ring.dropped == 2
    ring.take()
    ring.extend([(0, 1), (0, 2), (0, 3)])
    assert calls == [2, 2]

    def fails() -> None:
        raise RuntimeError("release unlocked lock")

    ring.take()
    ring.call_when(1, fails)
    ring.push(0, 1)  # no error out of the push
    ring.take()
    ring.call_when(1, lambda: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        ring.push(0, 1)
    ring.take()
    ring.call_when(1, None)
    ring.push(0, 1)
    assert len(ring) == 1


def test_the_state_wakes_its_reader_as_a_queue_crowds_a_resized_ring_too() -> None:
    """HotState.call_when_crowded: the callback once the raw ring holds its share of its capacity (rounded up) or
    the control ring its records, and on a raw ring made anew by resize."""
    state = HotState(raw_capacity=8)
    woken: list[str] = []
    state.call_when_crowded(0.25, 3, lambda: woken.append("woken"))
    state.raw.push(0, 1)
    assert woken == []
    state.raw.push(0, 2)  # 2 of 8
    state.control.push(1, 1)
    state.control.push(1, 2)
    assert woken == ["woken"]
    state.control.push(1, 3)
    assert woken == ["woken"] * 2
    state.resize(20)  # 2 records moved in, 5 the mark
    for seq in range(3):
        state.raw.push(0, seq)
    assert woken == ["woken"] * 3
