"""host_overlap_ns, the agent's numbers-only overlap of a step on the host, gives overlap_in_step's
integers for any intervals: de-duplicated, overlapping, empty, outside or across the window; union_of_columns, its
unions in numpy's loops (the recorder's steps of async collectives), gives union_in's and union_length's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_reader_properties import PROPERTIES

from zeromon.analysis.intervals import Interval, union_length, union_of_columns
from zeromon.analysis.step_overlap import host_overlap_ns, overlap_in_step, union_in

_t = st.integers(-50, 250)
_interval = st.tuples(_t, _t).map(lambda p: (p[0], p[0] + abs(p[1] - p[0])) if p[0] % 3 else p)
_intervals = st.lists(_interval, max_size=12)


def _as_ns(seconds: float) -> int:
    return round(seconds * 1e9)


@PROPERTIES
@given(comm=_intervals, blocked=_intervals, agent=_intervals, lo=st.integers(0, 100), length=st.integers(1, 150),
       shared=st.booleans())
def test_host_overlap_ns_is_overlap_in_step_on_the_host(comm: list[Interval], blocked: list[Interval],
                                                        agent: list[Interval], lo: int, length: int,
                                                        shared: bool) -> None:
    if shared:  # synchronous collectives: each one's [issue, completion] is its blocked interval
        blocked = blocked + comm
    scale = 1_000_003  # ns apart, so that the seconds overlap_in_step gives read back exactly
    comm, blocked, agent = ([(s * scale, e * scale) for s, e in xs] for xs in (comm, blocked, agent))
    window = (lo * scale, (lo + length) * scale)
    plain = overlap_in_step(comm, blocked, window, agent=agent)
    comp_ns, overlap_ns, exposed_ns = host_overlap_ns(comm, blocked, window, agent)
    assert (comp_ns, overlap_ns, exposed_ns) == (_as_ns(plain.comp_s), _as_ns(plain.overlap_s),
                                                 _as_ns(plain.exposed_comm_s))
    assert (comp_ns / 1e9, overlap_ns / 1e9, exposed_ns / 1e9) == (plain.comp_s, plain.overlap_s, plain.exposed_comm_s)


@PROPERTIES
@given(intervals=st.lists(_interval, max_size=40), lo=st.integers(-60, 100), length=st.integers(1, 300),
       offset=st.sampled_from([0, 1_764_000_000_000_000_000]))
def test_union_of_columns_is_union_in_and_union_length(intervals: list[Interval], lo: int, length: int,
                                                      offset: int) -> None:
    # offset: Unix nanoseconds of today, where the recorder's intervals lie (int64, no overflow)
    intervals = [(s + offset, e + offset) for s, e in intervals]
    starts, ends = [s for s, _ in intervals], [e for _, e in intervals]
    assert union_of_columns(starts, ends) == union_length(intervals)
    lo += offset
    assert union_of_columns(starts, ends, lo, lo + length) == union_in(intervals, lo, lo + length)


def test_a_window_with_blocked_agent_and_overlapping_collectives() -> None:
    # comm [10, 40) and [30, 60); blocked [20, 35); agent [50, 55); window [0, 100)
    comp, overlap, exposed = host_overlap_ns([(10, 40), (30, 60)], [(20, 35)], (0, 100), [(50, 55)])
    assert (comp, overlap, exposed) == (100 - 15 - 5, 50 - 15 - 5, 15)
