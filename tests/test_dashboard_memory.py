"""The Memory page: memory over time stacked by category (each walk held until the next, the last to the
rank's last sample), the level, the capacity and the forecast's predicted peak; one table row per rank
with the forecast `zeromon report` makes; the peaks of all ranks against the median; the allocator's
counters. On a real FSDP2 recording (CPU: RSS, no allocator) and on hand-made GPU-like histories with
allocator statistics and long series (decimated, their peaks kept)."""

from __future__ import annotations

import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from zeromon.analysis.findings import Severity
from zeromon.analysis.oom import OomForecast
from zeromon.model.codec import Recording, read_run
from zeromon.model.events import MemorySample, OomEvent
from zeromon.sources.fleet import FleetView, RankView
from zeromon.views.fleet import short_bytes
from zeromon.views.memory import memory_rows, memory_series, origin_ns
from zeromon.views.run_data import RankHistory, RunData, StaticFeed, recording_data
from zeromon_dashboard.figures.memory import (
    MAX_RANK_ROWS,
    POINTS_PER_TRACE,
    decimated,
    imbalance_figure,
    stack_figure,
)
from zeromon_dashboard.figures.style import LEVEL_COLOURS
from zeromon_dashboard.pages import memory as page
from zeromon_dashboard.state import PageState, parse_state

GIB = 1 << 30
MIB = 1 << 20


def _traces(fig: Any, kind: str, rank: int | None = None) -> list[Any]:
    return [t for t in fig.data if (t.meta or {}).get("kind") == kind
            and (rank is None or (t.meta or {}).get("rank") == rank)]


def _bytes(trace: Any) -> list[float | None]:
    """A trace's y back in bytes (the figure draws each row in its own unit); None: a gap."""
    return [None if v is None else v * trace.meta["scale"] for v in trace.y]


def _titles(fig: Any) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def _ids(component: Any) -> set[str]:
    found = {component.id} if getattr(component, "id", None) else set()
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and hasattr(child, "to_plotly_json"):
            found |= _ids(child)
    return found


# --- a real recording ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(fsdp2_run: Path) -> RunData:
    return recording_data(fsdp2_run)


@pytest.fixture(scope="module")
def recordings(fsdp2_run: Path) -> dict[int, Recording]:
    return {rec.rank: rec for rec in read_run(fsdp2_run)}


def _first_ns(recordings: dict[int, Recording]) -> int:
    return min(m.t_ns for rec in recordings.values() for m in rec.memory)


@pytest.mark.distributed
def test_the_stack_is_each_walk_held_until_the_next_and_the_last_to_the_ranks_last_sample(
        data: RunData, recordings: dict[int, Recording]) -> None:
    origin = _first_ns(recordings)
    fig = page._draw(parse_state("/memory", "?ranks=0,1"), data)[0]
    for rank, rec in recordings.items():
        samples = sorted(rec.memory, key=lambda m: m.t_ns)
        walks = [m for m in samples if any(k != "activations" for k in m.categories)]
        assert len(walks) >= 2 and samples[-1].t_ns > walks[-1].t_ns
        stacked = _traces(fig, "category", rank)
        assert {t.meta["name"] for t in stacked} == {k for m in walks for k in m.categories}
        expected_x = [(m.t_ns - origin) / 1e9 for m in walks] + [(samples[-1].t_ns - origin) / 1e9]
        expected_sums = [sum(m.categories.values()) for m in walks] + [sum(walks[-1].categories.values())]
        for trace in stacked:
            assert list(trace.x) == pytest.approx(expected_x)
            assert trace.line.shape == "hv" and trace.stackgroup == f"rank{rank}"
        sums = [sum(column) for column in zip(*(_bytes(t) for t in stacked), strict=True)]
        assert sums == pytest.approx(expected_sums)


@pytest.mark.distributed
def test_on_cpu_the_level_is_rss_and_the_categories_a_sliver_drawn_apart(data: RunData,
                                                                        recordings: dict[int, Recording]) -> None:
    assert data.report is not None
    fig = page._draw(parse_state("/memory", "?ranks=0,1"), data)[0]
    for rank, rec in recordings.items():
        samples = sorted(rec.memory, key=lambda m: m.t_ns)
        rss = [m.rss for m in samples if m.rss is not None]
        (level,) = _traces(fig, "level", rank)
        assert _bytes(level) == pytest.approx(rss)
        forecast = next(r.oom for r in data.report.ranks if r.rank == rank)
        (predicted,) = _traces(fig, "predicted", rank)
        assert _bytes(predicted) == pytest.approx([forecast.predicted_peak_bytes] * 2)
        biggest_walk = max(sum(m.categories.values()) for m in samples if m.walked)
        assert biggest_walk < 0.05 * max(rss)  # what the recording holds: the reason they are apart
        assert any(t.startswith(f"rank {rank} by category") and "drawn apart" in t for t in _titles(fig))
        capacity = samples[-1].capacity
        assert capacity is not None and capacity > 4 * max(rss)  # host RAM: said, not drawn
        assert not _traces(fig, "capacity", rank)
        assert any(t.startswith(f"rank {rank} (cpu): RSS") and f"capacity {short_bytes(capacity)}, far above" in t
                   for t in _titles(fig))


@pytest.mark.distributed
def test_the_table_has_a_row_per_rank_with_the_reports_forecast(data: RunData,
                                                               recordings: dict[int, Recording]) -> None:
    assert data.report is not None
    records = page._draw(PageState(page="memory"), data)[1]
    assert [r["rank"] for r in records] == sorted(recordings)
    for record in records:
        rec = recordings[record["rank"]]
        samples = sorted(rec.memory, key=lambda m: m.t_ns)
        forecast = next(r.oom for r in data.report.ranks if r.rank == record["rank"])
        assert record["current"] == samples[-1].rss
        assert record["peak"] == max(m.rss for m in samples if m.rss is not None)
        assert record["predicted"] == forecast.predicted_peak_bytes
        assert record["headroom"] == forecast.headroom_bytes
        assert record["headroom_text"] == short_bytes(forecast.headroom_bytes)
        assert record["growth"] == forecast.growth_bytes_per_step
        assert record["risk_text"] == forecast.risk.value
        assert record["capacity"] == samples[-1].capacity
        # CPU: no allocator, so no retries, OOMs or fragmentation
        assert (record["retries"], record["ooms"], record["fragmentation"]) == (None, None, None)
        assert record["retries_text"] == record["fragmentation_text"] == "-"


@pytest.mark.distributed
def test_the_imbalance_bars_are_each_ranks_peak_against_the_median(data: RunData,
                                                                  recordings: dict[int, Recording]) -> None:
    fig = page._draw(PageState(page="memory"), data)[2]
    peaks = {rank: max(m.rss for m in rec.memory if m.rss is not None) for rank, rec in recordings.items()}
    drawn = {x: y for t in _traces(fig, "peak") for x, y in zip(t.x, _bytes(t), strict=True)}
    assert drawn == pytest.approx(peaks)
    (median,) = _traces(fig, "median")
    assert _bytes(median) == pytest.approx([statistics.median(peaks.values())] * 2)
    assert all(t.marker.color == LEVEL_COLOURS["ok"] for t in _traces(fig, "peak"))  # the forecasts say ok


@pytest.mark.distributed
def test_a_cpu_run_has_no_allocator_statistics_and_says_so(data: RunData) -> None:
    fig = page._draw(PageState(page="memory"), data)[3]
    assert fig.layout.annotations[0].text == "no allocator statistics: a CPU run records process RSS only"


@pytest.mark.distributed
def test_the_page_holds_its_controls_figures_and_table(data: RunData) -> None:
    ctx: Any = SimpleNamespace(feed=StaticFeed(data))
    tree = page.layout(parse_state("/memory", "?ranks=1"), data, ctx)
    assert {"memory-ranks", "memory-stack", "memory-table", "memory-imbalance", "memory-allocator"} <= _ids(tree)
    fig = page._draw(parse_state("/memory", "?ranks=1"), data)[0]
    assert {t.meta["rank"] for t in fig.data} == {1}
    assert len(page._fallback(RuntimeError("boom"))) == len(page.OUTPUTS)


# --- made by hand: GPU-like, long ---------------------------------------------------------------------

CAPACITY = 80 * GIB
T0 = 1_700_000_000 * 10**9
SPIKE = (0, 17_321, 75 * GIB)  # rank, sample, allocated: the one peak decimation must keep
OOM_RANK = 3


def _sample(rank: int, i: int, allocated: int, reserved: int, walk: bool) -> MemorySample:
    activations = max(0, allocated - 17 * GIB)
    categories = ({"sharded_params": 5 * GIB, "unsharded_params": 2 * GIB, "optimizer_state": 10 * GIB,
                   "activations": activations} if walk else {"activations": activations})
    return MemorySample(rank=rank, step=i // 3, phase=("forward", "backward", "optimizer")[i % 3],
                        t_ns=T0 + i * 10_000_000 + rank * 1000, device=f"cuda:{rank}", allocated=allocated,
                        reserved=reserved, active=allocated, peak_allocated=None, peak_reserved=None,
                        inactive_split=None, num_alloc_retries=i // 5000,
                        num_ooms=int(rank == OOM_RANK and i >= 20_000), capacity=CAPACITY, free=None,
                        rss=3 * GIB, categories=categories)


def _gpu_history(rank: int, n: int, walk_every: int) -> RankHistory:
    rng = np.random.default_rng(rank)
    allocated = (30 * GIB + rank * GIB + (np.arange(n) % 3) * 8 * GIB
                 + rng.integers(0, 512 * MIB, n)).astype(np.int64)
    if rank == SPIKE[0] and n > SPIKE[1]:
        allocated[SPIKE[1]] = SPIKE[2]
    fragmentation = (GIB + (np.arange(n) % 97) * 10 * MIB).astype(np.int64)
    memory = tuple(_sample(rank, i, int(a), int(a + f), i % walk_every == 0)
                   for i, (a, f) in enumerate(zip(allocated.tolist(), fragmentation.tolist(), strict=True)))
    ooms = (OomEvent(rank=rank, step=6_666, phase="backward", t_ns=T0 + 20_000 * 10_000_000, device=f"cuda:{rank}",
                     allocated=79 * GIB, requested=2 * GIB, free=100 * MIB, snapshot_path=None),) \
        if rank == OOM_RANK else ()
    return RankHistory(rank=rank, memory=memory, ooms=ooms)


def _forecast(history: RankHistory) -> OomForecast:
    levels = [m.allocated or 0 for m in history.memory]
    predicted = max(levels) + 2 * GIB
    return OomForecast(rank=history.rank, risk=Severity.CRITICAL if history.rank == OOM_RANK else Severity.OK,
                       capacity_bytes=CAPACITY, current_bytes=levels[-1], peak_bytes=max(levels),
                       headroom_bytes=CAPACITY - predicted, predicted_peak_bytes=predicted,
                       growth_bytes_per_step=1e6, steps_to_capacity=1234.0, device=f"cuda:{history.rank}")


def _live(histories: dict[int, RankHistory]) -> RunData:
    """What a live feed holds: no report, the forecasts on the fleet's ranks."""
    ranks = tuple(RankView(rank=r, target=f"127.0.0.1:{9000 + r}", alive=True, stale_s=0.0, error=None,
                           memory=h.memory[-1] if h.memory else None, oom=_forecast(h) if h.memory else None)
                  for r, h in sorted(histories.items()))
    return RunData(kind="live", source="hand-made", version=1,
                   fleet=FleetView(t_ns=T0, source="hand-made", ranks=ranks, looked_at=()), histories=histories)


@pytest.fixture(scope="module")
def long_run() -> RunData:
    return _live({r: _gpu_history(r, 30_000, walk_every=7) for r in range(8)})


def test_decimation_keeps_every_trace_under_the_point_budget_and_the_peak(long_run: RunData) -> None:
    stack, records, imbalance, allocator = page._draw(parse_state("/memory", "?ranks=0-7"), long_run)
    for fig in (stack, allocator):
        assert all(len(t.x) <= POINTS_PER_TRACE for t in fig.data)
    for fig in (stack, allocator):
        assert f"({MAX_RANK_ROWS} of the 8 chosen ranks: at most {MAX_RANK_ROWS} are drawn)" in fig.layout.title.text
    assert {t.meta["rank"] for t in stack.data} == set(range(MAX_RANK_ROWS))
    for rank in range(MAX_RANK_ROWS):
        history = long_run.histories[rank]
        (level,) = _traces(stack, "level", rank)
        assert max(_bytes(level)) == pytest.approx(max(m.allocated or 0 for m in history.memory))
        stacked = _traces(stack, "category", rank)
        sums = [sum(column) for column in zip(*(_bytes(t) for t in stacked), strict=True)]
        assert max(sums) == pytest.approx(max(sum(m.categories.values()) for m in history.memory if m.walked))
        (fragmentation,) = _traces(allocator, "fragmentation", rank)
        assert max(_bytes(fragmentation)) == pytest.approx(max(m.fragmentation or 0 for m in history.memory))
        (retries,) = _traces(allocator, "retries", rank)
        assert retries.y[-1] == history.memory[-1].num_alloc_retries
    assert max(_bytes(_traces(stack, "level", 0)[0])) == pytest.approx(SPIKE[2])


def test_on_gpu_the_categories_stack_under_the_allocated_line_with_the_capacity(long_run: RunData) -> None:
    stack = page._draw(parse_state("/memory", "?ranks=1"), long_run)[0]
    assert not any("drawn apart" in t for t in _titles(stack))
    (capacity,) = _traces(stack, "capacity", 1)
    assert _bytes(capacity) == [CAPACITY, CAPACITY]
    (predicted,) = _traces(stack, "predicted", 1)  # a live run: the fleet's forecast
    assert long_run.fleet.ranks[1].oom is not None
    assert _bytes(predicted) == [long_run.fleet.ranks[1].oom.predicted_peak_bytes] * 2
    assert "capacity in ~1234 steps" in _titles(stack)[0]
    stacked = _traces(stack, "category", 1)
    assert [t.meta["name"] for t in stacked] == ["sharded_params", "unsharded_params", "optimizer_state", "activations"]
    assert all(t.yaxis == "y" for t in stacked)  # one axis with the level


def test_the_allocator_marks_each_oom_seen_and_counts_them(long_run: RunData) -> None:
    allocator = page._draw(parse_state("/memory", f"?ranks={OOM_RANK}"), long_run)[3]
    (marks,) = _traces(allocator, "oom")
    assert list(marks.x) == pytest.approx([200.0])  # seconds since the run's first sample
    assert marks.hovertext[0].startswith("OOM in step 6667 (backward)")  # steps shown from 1
    (ooms,) = _traces(allocator, "OOMs", OOM_RANK)
    assert ooms.y[0] == 0 and ooms.y[-1] == 1


def test_the_table_and_bars_show_every_rank_coloured_by_risk(long_run: RunData) -> None:
    records = page._draw(parse_state("/memory", "?ranks=0"), long_run)[1]
    assert [r["rank"] for r in records] == list(range(8))
    critical = next(r for r in records if r["rank"] == OOM_RANK)
    assert critical["risk_text"] == "critical" and critical["ooms"] == 1 and critical["steps_to_capacity"] == 1234.0
    last = long_run.histories[0].memory[-1]
    assert records[0]["fragmentation"] == last.fragmentation and records[0]["retries"] == last.num_alloc_retries
    bars = imbalance_figure(memory_rows(long_run))
    by_level = {t.meta["level"]: list(t.x) for t in _traces(bars, "peak")}
    assert by_level == {"critical": [OOM_RANK], "ok": [r for r in range(8) if r != OOM_RANK]}
    (capacity,) = _traces(bars, "capacity")
    assert {v for v in _bytes(capacity) if v is not None} == {CAPACITY}


def test_decimated_keeps_the_largest_and_smallest_point_in_time_order() -> None:
    rng = np.random.default_rng(0)
    x = np.arange(100_000, dtype=np.float64)
    y = rng.normal(0, 1, x.size)
    y[54_321], y[12_345] = 50.0, -50.0
    index = decimated(x, y, 2000)
    assert len(index) <= 2000 and {54_321, 12_345} <= set(index.tolist())
    assert (np.diff(index) > 0).all()
    assert decimated(x[:10], y[:10], 2000).tolist() == list(range(10))


def test_nothing_to_draw_says_why() -> None:
    empty_run = _live({})
    stack, records, imbalance, allocator = page._draw(PageState(page="memory"), empty_run)
    assert stack.layout.annotations[0].text == "no memory sample yet on the chosen ranks"
    assert imbalance.layout.annotations[0].text == "no memory sample yet"
    assert "no allocator statistics" in allocator.layout.annotations[0].text
    assert records == []
    ctx: Any = SimpleNamespace(feed=StaticFeed(empty_run))
    assert "memory-none" in _ids(page.layout(PageState(page="memory"), empty_run, ctx))


def test_a_rank_without_walks_draws_its_level_alone() -> None:
    history = RankHistory(rank=0, memory=tuple(_sample(0, i, 40 * GIB, 41 * GIB, walk=False) for i in range(5)))
    series = memory_series(history, origin_ns({0: history}) or 0)
    assert series.categories == () and len(series.walk_t_s) == 0
    fig = stack_figure([series])
    assert not _traces(fig, "category") and _bytes(_traces(fig, "level", 0)[0]) == [40 * GIB] * 5


def test_a_chosen_rank_without_samples_is_said_not_drawn() -> None:
    run = _live({0: _gpu_history(0, 50, walk_every=7), 1: RankHistory(rank=1)})
    stack, records, imbalance, allocator = page._draw(parse_state("/memory", "?ranks=0,1"), run)
    assert {t.meta["rank"] for t in stack.data} == {0}
    assert "(1 of the 2 chosen ranks: the others have no memory sample yet)" in stack.layout.title.text
    assert records[1]["rank"] == 1 and records[1]["current"] is None and records[1]["current_text"] == "-"
    assert [x for t in _traces(imbalance, "peak") for x in t.x] == [0]


def test_hundreds_of_ranks_each_get_a_bar_and_a_table_row() -> None:
    run = _live({r: _gpu_history(r, 6, walk_every=3) for r in range(256)})
    stack, records, imbalance, _ = page._draw(PageState(page="memory"), run)
    assert len(records) == 256 and len({t.meta["rank"] for t in stack.data}) == 2  # the default: two ranks
    peaks = {x: y for t in _traces(imbalance, "peak") for x, y in zip(t.x, _bytes(t), strict=True)}
    assert peaks == pytest.approx({r: max(m.allocated or 0 for m in run.histories[r].memory) for r in range(256)})
