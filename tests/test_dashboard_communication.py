"""The Communication page: one step's timeline (its exposed time is the recorded step's, its bars the
step's collectives), exposed communication and overlap per step, bandwidth against the peak, bytes
per step by ZeRO meaning; on a real FSDP2 recording and on hand-made histories."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from zeromon.analysis.bandwidth import bandwidth_table
from zeromon.analysis.step_overlap import overlap_in_step
from zeromon.model.codec import CollectiveColumns, Recording, read_run
from zeromon.model.events import CollectiveEvent, PhaseSpan, StepSummary
from zeromon.sources.fleet import FleetView
from zeromon.views.run_data import RankHistory, RunData, StaticFeed, recording_data
from zeromon.views.timeline import default_step, step_bytes, step_series, step_timeline
from zeromon_dashboard.figures.communication import (
    bandwidth_figure,
    bytes_figure,
    decimate,
    per_step_figure,
    timeline_figure,
)
from zeromon_dashboard.figures.style import MEANING_COLOURS
from zeromon_dashboard.pages import communication as page
from zeromon_dashboard.state import PageState, parse_state

MS = 1_000_000  # ns


def _bars(fig: Any, kind: str, name: str | None = None) -> list[tuple[str, float, float, str]]:
    """(row, start ms, length ms, hover) of every bar of the traces of ``kind`` (and ``name``)."""
    out = []
    for trace in fig.data:
        meta = trace.meta or {}
        if meta.get("kind") == kind and (name is None or meta.get("name") == name):
            out.extend(zip(trace.y, trace.base, trace.x, trace.hovertext, strict=True))
    return out


def _row_total_ms(fig: Any, kind: str, name: str, rank: int) -> float:
    return sum(length for row, _, length, _ in _bars(fig, kind, name) if row.startswith(f"rank {rank} "))


# --- a real recording -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(fsdp2_run: Path) -> RunData:
    return recording_data(fsdp2_run)


@pytest.fixture(scope="module")
def recordings(fsdp2_run: Path) -> dict[int, Recording]:
    return {rec.rank: rec for rec in read_run(fsdp2_run)}


@pytest.mark.distributed
def test_the_exposed_time_drawn_is_each_steps_recorded_exposed_comm(data: RunData,
                                                                     recordings: dict[int, Recording]) -> None:
    assert data.report is not None
    reported = {(s.rank, s.step): s.exposed_comm_s for r in data.report.ranks for s in r.steps}
    steps = sorted({s.step for rec in recordings.values() for s in rec.steps})
    assert len(steps) >= 8
    for step in steps:
        timeline = step_timeline(data.histories, sorted(recordings), step)
        assert not timeline.missing and len(timeline.ranks) == len(recordings)
        fig = timeline_figure(timeline)
        rows = list(fig.layout.yaxis.categoryarray)
        for rank_step in timeline.ranks:
            summary = next(s for s in recordings[rank_step.rank].steps if s.step == step)
            assert summary.exposed_comm_s is not None and summary.exposed_comm_s > 0
            # The agent's live number, the report's, the intervals' and the red bars' are one number.
            assert rank_step.exposed_s == pytest.approx(summary.exposed_comm_s, abs=2e-9)
            assert rank_step.exposed_s == pytest.approx(reported[(rank_step.rank, step)], abs=2e-9)
            drawn_ms = _row_total_ms(fig, "mark", "exposed", rank_step.rank)
            assert drawn_ms == pytest.approx(summary.exposed_comm_s * 1e3, abs=1e-5)
            assert f"rank {rank_step.rank} · exposed {summary.exposed_comm_s * 1e3:.1f} ms" in rows


@pytest.mark.distributed
def test_the_timeline_draws_each_collective_of_the_step_by_meaning(data: RunData,
                                                                   recordings: dict[int, Recording]) -> None:
    step = default_step(data.histories, (0, 1))
    assert step is not None
    fig = timeline_figure(step_timeline(data.histories, (0, 1), step))
    origin = min(s.start_ns for rec in recordings.values() for s in rec.steps if s.step == step)
    for rank, rec in recordings.items():
        expected = sorted((c.meaning, (c.issue_ns - origin) / 1e6, (c.complete_ns - c.issue_ns) / 1e6)
                           for c in rec.collectives if c.step == step and c.complete_ns is not None)
        assert expected, "the FSDP2 step gathers parameters and reduce-scatters gradients"
        drawn = sorted((trace.meta["name"], base, length) for trace in fig.data if trace.meta["kind"] == "comm"
                       for row, base, length in zip(trace.y, trace.base, trace.x, strict=True)
                       if row.startswith(f"rank {rank} · collectives"))
        assert [m for m, _, _ in drawn] == [m for m, _, _ in expected]
        assert [v for _, b, n in drawn for v in (b, n)] == pytest.approx([v for _, b, n in expected for v in (b, n)])
        assert f"rank {rank} · collectives ({len(expected)})" in fig.layout.yaxis.categoryarray
    for trace in fig.data:
        if trace.meta["kind"] == "comm":
            assert trace.marker.color == MEANING_COLOURS[trace.meta["name"]]
            assert all("issue→complete" in h and "blocked" in h and "float32" in h for h in trace.hovertext)
    assert {t.meta["name"] for t in fig.data if t.meta["kind"] == "comm"} == {"param_all_gather",
                                                                              "grad_reduce_scatter"}
    # Every phase of the step is drawn: the rest of the step (other) and zeromon's own time (agent)
    # beside the forward, backward and optimizer.
    phases = {t.meta["name"] for t in fig.data if t.meta["kind"] == "phase"}
    assert {"forward", "backward", "optimizer", "other"} <= phases <= {"forward", "backward", "optimizer", "other",
                                                                         "agent"}
    # The waits are drawn: these collectives are synchronous, so the training thread blocked in each.
    assert _bars(fig, "mark", "blocked")
    # Both ranks on one clock: the earliest step start is x = 0.
    assert min(base for _, base, _, _ in _bars(fig, "phase")) >= 0


@pytest.mark.distributed
def test_bytes_per_step_by_meaning_are_the_recordings_sums(data: RunData, recordings: dict[int, Recording]) -> None:
    rec = recordings[0]
    expected: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for c in rec.collectives:
        if c.step >= 0:
            expected[c.meaning][c.step] += max(c.bytes_in, c.bytes_out)
    sums = step_bytes(data.histories[0])
    assert {m: dict(zip(sums.steps, v, strict=True)) for m, v in sums.by_meaning.items()} == \
        {m: dict(v) for m, v in expected.items()}
    for summary in rec.steps:  # the agent counts the same bytes in its step summaries
        assert sum(v[sums.steps.index(summary.step)] for v in sums.by_meaning.values()) == summary.comm_bytes
    fig = bytes_figure(sums)
    assert fig.layout.barmode == "stack"
    for trace in fig.data:
        assert list(trace.x) == [s + 1 for s in sums.steps]  # steps from 1
        assert list(trace.customdata) == [expected[trace.name][s] for s in sums.steps]


@pytest.mark.distributed
def test_the_default_step_is_the_median_step_after_the_first(data: RunData, recordings: dict[int, Recording]) -> None:
    later = [s for s in recordings[1].steps if s.step >= 1]
    median = sorted(later, key=lambda s: s.duration_s)[len(later) // 2]
    assert default_step(data.histories, (1, 0)) == median.step
    state = PageState(page="communication", ranks=(1, 0))
    assert page.shown_step(state, data) == median.step
    assert page.shown_step(state.with_(step=2), data) == 2


@pytest.mark.distributed
def test_exposed_and_overlap_per_step_follow_the_report(data: RunData) -> None:
    assert data.report is not None
    series = [step_series(data, r) for r in (0, 1)]
    fig = per_step_figure(series, 3)
    for rank_report in data.report.ranks:
        exposed = next(t for t in fig.data if t.name == f"rank {rank_report.rank}: exposed (ms)")
        assert list(exposed.x) == [s.step + 1 for s in rank_report.steps]
        assert list(exposed.y) == pytest.approx([s.exposed_comm_s * 1e3 for s in rank_report.steps])
        overlap = next(t for t in fig.data if t.name == f"rank {rank_report.rank}: overlap (%)")
        assert overlap.yaxis == "y2"
    assert [s.x0 for s in fig.layout.shapes] == [4]  # the chosen step, shown from 1


@pytest.mark.distributed
def test_bandwidth_against_the_peak_given(fsdp2_run: Path) -> None:
    data = recording_data(fsdp2_run, peak_busbw=200e9)
    assert data.report is not None
    peak = page.peak_of(data, StaticFeed(data))
    assert peak == pytest.approx(200e9)
    rows = page.bandwidth_rows(data, peak)
    assert rows == data.report.bandwidth and rows
    fig = bandwidth_figure(rows, peak)
    assert [s.y0 for s in fig.layout.shapes] == pytest.approx([200.0])  # GB/s
    assert {t.name for t in fig.data} == {f"{r.op} (group of {r.group_size})" for r in rows}
    records = page.table_records(rows)
    assert [r["busbw_gbs"] for r in records] == [round(r.median_busbw / 1e9, 3) for r in rows]
    assert [r["peak_pct"] for r in records] == [round(100 * r.median_busbw / 200e9, 1) for r in rows]
    assert bandwidth_figure(rows, None).layout.shapes == ()


@pytest.mark.distributed
def test_live_bandwidth_is_the_table_of_the_collectives_held(data: RunData, recordings: dict[int, Recording]) -> None:
    live = RunData(kind="live", source="t", version=1, fleet=data.fleet, histories=data.histories)
    events = [c for rec in recordings.values() for c in rec.collectives]
    assert page.bandwidth_rows(live, None) == bandwidth_table(events)


def _ids(component: Any) -> set[str]:
    found = {component.id} if isinstance(getattr(component, "id", None), str) else set()
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and hasattr(child, "to_plotly_json"):
            found |= _ids(child)
    return found


@pytest.mark.distributed
def test_the_page_holds_its_figures_controls_and_table(data: RunData) -> None:
    ctx: Any = SimpleNamespace(feed=StaticFeed(data))
    tree = page.layout(parse_state("/communication", "?ranks=0&step=4"), data, ctx)
    assert {"comm-timeline", "comm-per-step", "comm-bandwidth", "comm-bandwidth-table", "comm-bytes",
            "communication-step", "communication-ranks"} <= _ids(tree)
    state = parse_state("/communication", "?ranks=0")
    default = page.shown_step(state, data)
    assert default is not None
    other = 2 if default != 1 else 3  # shown from 1
    assert page.step_search(state, other, data) == f"?ranks=0&step={other}"
    assert page.step_search(state, default + 1, data) is None  # the default: the URL stays without a step
    assert page.step_search(state.with_(step=5), default + 1, data) == f"?ranks=0&step={default + 1}"
    assert page.step_search(state, None, data) is None and page.step_search(state, 0, data) is None
    drawn = page._draw(parse_state("/communication", "?ranks=0&step=4"), data, None)
    assert drawn[0].layout.title.text.startswith("Step 4:")
    assert drawn[5] == 4 and drawn[6] == max(s.step for s in data.histories[0].steps) + 1


# --- made by hand --------------------------------------------------------------------------------------

def _summary(rank: int, step: int, start_ms: int, end_ms: int, collectives: int = 0) -> StepSummary:
    return StepSummary(rank=rank, step=step, start_ns=start_ms * MS, end_ns=end_ms * MS, phase_s={},
                       collectives=collectives, comm_bytes=0, comm_bytes_by_op={}, comm_union_s=0.0, blocked_s=0.0,
                       peak_memory=None)


def _collective(rank: int, step: int, issue_ms: int, complete_ms: int, wait_ms: int | None, blocked_ms: int,
                meaning: str = "param_all_gather", seq: int = 0) -> CollectiveEvent:
    return CollectiveEvent(seq=seq, rank=rank, step=step, phase="forward", op="all_gather", api="all_gather_into_tensor",
                           bytes_in=1 << 20, bytes_out=2 << 20, dtype="bfloat16", group_size=2, async_op=True,
                           issue_ns=issue_ms * MS, complete_ns=complete_ms * MS, blocked_s=blocked_ms / 1e3,
                           timing="wait", meaning=meaning, wait_ns=None if wait_ms is None else wait_ms * MS)


def _run(kind: str, histories: dict[int, RankHistory]) -> RunData:
    fleet = FleetView(t_ns=0, source="hand-made", ranks=(), looked_at=())
    return RunData(kind=kind, source="hand-made", version=1, fleet=fleet, histories=histories)


def test_an_async_collective_is_shaded_where_hidden_and_red_where_exposed() -> None:
    # forward 0-100 ms, backward 100-180 ms; an all_gather in flight 50-150 ms, waited for from 120 ms.
    phases = (PhaseSpan(0, 0, "forward", 0, 100 * MS), PhaseSpan(0, 0, "backward", 100 * MS, 180 * MS))
    gather = _collective(0, 0, 50, 150, wait_ms=120, blocked_ms=30)
    history = RankHistory(rank=0, steps=(_summary(0, 0, 0, 200, 1),), phases=phases,
                          collectives=CollectiveColumns.of([gather]), complete=True)
    timeline = step_timeline({0: history}, (0,), 0)
    agent = overlap_in_step([(50 * MS, 150 * MS)], [(120 * MS, 150 * MS)], (0, 200 * MS))
    assert timeline.ranks[0].exposed_s == pytest.approx(agent.exposed_comm_s) == pytest.approx(0.030)
    fig = timeline_figure(timeline)
    assert [(b, n) for _, b, n, _ in _bars(fig, "mark", "overlap")] == [(50.0, 70.0)]
    assert [(b, n) for _, b, n, _ in _bars(fig, "mark", "exposed")] == [(120.0, 30.0)]
    blocked = _bars(fig, "mark", "blocked")
    assert [(row, b, n) for row, b, n, _ in blocked] == [("rank 0 · compute", 120.0, 30.0)]
    assert "rank 0 · exposed 30.0 ms" in fig.layout.yaxis.categoryarray


def test_a_step_without_collectives_draws_its_phases_and_no_exposed_time() -> None:
    phases = (PhaseSpan(0, 0, "forward", 0, 40 * MS), PhaseSpan(0, 0, "optimizer", 40 * MS, 50 * MS))
    history = RankHistory(rank=0, steps=(_summary(0, 0, 0, 50),), phases=phases,
                          collectives=CollectiveColumns.of([]), complete=True)
    data = _run("recording", {0: history})
    fig = timeline_figure(step_timeline(data.histories, (0,), 0))
    assert not _bars(fig, "comm") and not _bars(fig, "mark")
    assert [(row, b, n) for row, b, n, _ in _bars(fig, "phase")] == [("rank 0 · compute", 0.0, 40.0),
                                                                       ("rank 0 · compute", 40.0, 10.0)]
    assert "rank 0 · exposed 0.0 ms" in fig.layout.yaxis.categoryarray
    assert "rank 0: step had no collectives" in fig.layout.title.text
    assert "no collectives held" in bytes_figure(step_bytes(history)).layout.annotations[0].text


def _live_history(rank: int, steps: range, phase_steps: range) -> RankHistory:
    return RankHistory(rank=rank, steps=tuple(_summary(rank, s, 100 * s, 100 * s + 90) for s in steps),
                       phases=tuple(PhaseSpan(rank, s, "forward", 100 * s * MS, (100 * s + 90) * MS)
                                    for s in phase_steps), collectives=CollectiveColumns.of([]))


def test_a_live_history_without_the_chosen_step_says_so() -> None:
    data = _run("live", {0: _live_history(0, range(5, 10), range(8, 10)),
                         1: _live_history(1, range(5, 9), range(7, 9))})
    assert default_step(data.histories, (0, 1)) == 8  # the newest step both ranks finished, phases held
    gone = step_timeline(data.histories, (0, 1), 2)
    assert not gone.ranks
    fig = timeline_figure(gone)
    assert "rank 0: step 3 is not held by this dashboard (steps 6-10)" in fig.layout.annotations[0].text
    partly = step_timeline(data.histories, (0, 1), 9)  # rank 1 has not finished step 10
    assert [r.rank for r in partly.ranks] == [0] and partly.missing[0][0] == 1
    assert "rank 1: step 10 is not held" in timeline_figure(partly).layout.title.text
    no_phases = step_timeline(data.histories, (0,), 6)
    assert "phases of step 7 are no longer held" in no_phases.missing[0][1]
    drawn = page._draw(parse_state("/communication", "?ranks=0,1&step=3"), data, None)
    assert "step 3 is not held" in drawn[0].layout.annotations[0].text


def test_a_live_history_keeps_only_the_steps_whose_collectives_are_all_held() -> None:
    events = [_collective(0, 4, 401, 402, None, 0, seq=0)] + [
        _collective(0, 5, 501 + i, 502 + i, None, 0, "grad_reduce_scatter", seq=1 + i) for i in range(2)]
    steps = (_summary(0, 4, 400, 490, collectives=3), _summary(0, 5, 500, 590, collectives=2))
    history = RankHistory(rank=0, steps=steps, collectives=CollectiveColumns.of(events))
    sums = step_bytes(history)  # step 5 (shown 6) is whole; two of step 4's three are no longer held
    assert sums.steps == (5,) and sums.by_meaning["grad_reduce_scatter"] == (2 * (2 << 20),)


def test_long_series_are_decimated_with_their_peaks() -> None:
    x = list(range(1, 10_001))
    y: list[float | None] = [float(i % 97) for i in x]
    y[5000] = 1000.0
    y[10] = None
    xs, ys = decimate(x, y)
    assert len(xs) <= 2000 and 1000.0 in ys and 11 not in xs
    series = per_step_figure([step_series(_run("live", {0: RankHistory(0, steps=tuple(
        _summary(0, s, s, s + 1) for s in range(10_000)))}), 0)], None)
    assert all(len(t.x) <= 2000 for t in series.data)


def test_nothing_to_draw_says_why() -> None:
    data = _run("live", {})
    drawn = page._draw(PageState(page="communication"), data, None)
    assert "no step summarized yet" in drawn[0].layout.annotations[0].text
    assert "no collective with a measured duration" in drawn[2].layout.annotations[0].text
    assert drawn[3] == [] and drawn[5] is None


def test_the_median_picks_a_step_after_the_first() -> None:
    durations = [500, 10, 30, 20]  # the first step (setup) is the longest: never the default
    steps, start = [], 0
    for i, d in enumerate(durations):
        steps.append(_summary(0, i, start, start + d))
        start += d
    history = RankHistory(rank=0, steps=tuple(steps), complete=True)
    assert default_step({0: history}, (0,)) == 3  # 20 ms: the median of 10, 20, 30
