"""The Memory page reads a finished recording's samples straight from their stored columns (no
MemorySample made per sample); a live or replayed history's are objects. Both paths must give the same
series: checked on random histories (hypothesis), with the values a recording can hold: no allocator
(CPU), None among the numbers, walks and activation-only samples, int and float categories, a
category mapping of something else, out-of-order times."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeromon.model.columns import ColumnTable, TableRecords
from zeromon.model.events import MEMORY_CATEGORIES, MemorySample
from zeromon.views.memory import allocator_series, memory_series, sample_columns
from zeromon.views.run_data import RankHistory

NAMES = (*MEMORY_CATEGORIES, "zz_extra")
maybe_int = st.none() | st.integers(min_value=0, max_value=2**50)
number = st.integers(min_value=0, max_value=2**40) | st.floats(min_value=0, max_value=2**40, allow_nan=False)


@st.composite
def categories(draw: st.DrawFn) -> dict[str, int | float]:
    kind = draw(st.sampled_from(["none", "activations", "walk", "floats"]))
    if kind == "none":
        return {}
    if kind == "activations":
        return {"activations": draw(st.integers(min_value=0, max_value=2**40))}
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
    values = st.floats(min_value=0, max_value=2**40, allow_nan=False) if kind == "floats" else number
    return {name: draw(values) for name in names}


@st.composite
def samples(draw: st.DrawFn) -> list[MemorySample]:
    n = draw(st.integers(min_value=1, max_value=40))
    on_gpu = draw(st.booleans())
    times = draw(st.lists(st.integers(min_value=0, max_value=10**12), min_size=n, max_size=n, unique=True))
    out = []
    for i, t in enumerate(times):
        out.append(MemorySample(
            rank=3, step=i, phase="forward", t_ns=t, device=draw(st.sampled_from(["cuda:0", "cpu"])),
            allocated=draw(maybe_int) if on_gpu else None, reserved=draw(maybe_int) if on_gpu else None,
            active=None, peak_allocated=None, peak_reserved=None, inactive_split=None,
            num_alloc_retries=draw(maybe_int) if on_gpu else None, num_ooms=draw(maybe_int) if on_gpu else None,
            capacity=draw(maybe_int), free=None, rss=draw(maybe_int), categories=draw(categories())))
    return out


def _same(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples())
def test_stored_columns_and_objects_give_the_same_series(made: list[MemorySample]) -> None:
    objects = RankHistory(rank=3, memory=tuple(made))
    stored = RankHistory(rank=3, memory=TableRecords(ColumnTable(MemorySample, made, "t_ns")))
    origin = min(m.t_ns for m in made)
    a, b = memory_series(objects, origin), memory_series(stored, origin)
    assert (a.device, a.level_name, a.level_peak_bytes, a.stacked_peak_bytes, a.capacity_bytes) == (
        b.device, b.level_name, b.level_peak_bytes, b.stacked_peak_bytes, b.capacity_bytes)
    for x, y in ((a.t_s, b.t_s), (a.level_bytes, b.level_bytes), (a.walk_t_s, b.walk_t_s)):
        _same(x, y)
    assert [name for name, _ in a.categories] == [name for name, _ in b.categories]
    for (_, x), (_, y) in zip(a.categories, b.categories, strict=True):
        _same(x, y)
    p, q = allocator_series(objects, origin), allocator_series(stored, origin)
    for x, y in ((p.t_s, q.t_s), (p.alloc_retries, q.alloc_retries),
                 (p.fragmentation_bytes, q.fragmentation_bytes), (p.num_ooms, q.num_ooms)):
        _same(x, y)


def test_the_columns_hold_what_the_samples_say() -> None:
    """Against the samples themselves: the walks (some category but the activations) and their values,
    0 where a walk lacks a category; the level's None left out; the last capacity given."""
    def sample(t: int, categories: dict[str, int], rss: int | None, capacity: int | None) -> MemorySample:
        return MemorySample(rank=0, step=t, phase="optimizer", t_ns=t, device="cpu", allocated=None, reserved=None,
                            active=None, peak_allocated=None, peak_reserved=None, inactive_split=None,
                            num_alloc_retries=None, num_ooms=None, capacity=capacity, free=None, rss=rss,
                            categories=categories)

    made = [sample(10, {"activations": 5}, 100, 1000), sample(20, {"sharded_params": 7, "activations": 1}, None, None),
            sample(30, {"optimizer_state": 9.5}, 300, 2000), sample(40, {}, 400, None)]  # type: ignore[dict-item]
    for memory in (tuple(made), TableRecords(ColumnTable(MemorySample, made, "t_ns"))):
        history = RankHistory(rank=0, memory=memory)
        columns = sample_columns(history)
        assert columns.names == ("sharded_params", "optimizer_state", "activations")
        assert columns.walk_t_ns.tolist() == [20, 30]
        assert columns.walks.tolist() == [[7, 0], [0, 9.5], [1, 0]]
        series = memory_series(history, 10)
        assert series.level_name == "RSS" and series.level_bytes.tolist() == [100, 300, 400]
        assert series.t_s.tolist() == [0, 20e-9, 30e-9]
        assert series.walk_t_s.tolist() == [10e-9, 20e-9, 30e-9]  # the last walk held to the last sample
        assert series.capacity_bytes == 2000 and series.stacked_peak_bytes == 9  # int(9.5)
