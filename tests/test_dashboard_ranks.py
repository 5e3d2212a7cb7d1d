"""The Ranks page: step time as a rank × step heatmap, who waits for whom, memory against the median;
on a real FSDP2 recording, on a real run with a straggler and a memory imbalance (checked against
`zeromon report` through the CLI), and on hand-made histories (256 ranks, 10,000 steps, none)."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from zeromon.analysis.findings import Finding, finding_heading
from zeromon.model.codec import Recording, read_run
from zeromon.model.events import MemorySample, StepSummary
from zeromon.sources.fleet import FleetView, RankView
from zeromon.sources.live import STEPS_ASKED
from zeromon.views.fleet import fleet_findings
from zeromon.views.ranks import MAX_STEP_COLUMNS, binned, last_to_finish, memory_peaks, step_matrix, waits
from zeromon.views.run_data import RankHistory, RunData, recording_data
from zeromon_dashboard.figures.ranks import heatmap_figure, imbalance_figure, waits_figure
from zeromon_dashboard.pages import ranks as page
from zeromon_dashboard.state import PageState

from conftest import REPO, child_env, ranks_args, zeromon

T0_NS = 1_700_000_000_000_000_000
GIB = 2**30


def _texts(component: Any) -> list[str]:
    """Every string in a Dash component tree, in order."""
    if isinstance(component, str):
        return [component]
    if isinstance(component, list | tuple):
        return [t for c in component for t in _texts(c)]
    children = getattr(component, "children", None)
    return _texts(children) if children is not None else []


def _ids(component: Any) -> set[str]:
    found = {component.id} if isinstance(getattr(component, "id", None), str) else set()
    children = getattr(component, "children", None)
    if isinstance(children, list | tuple):
        for c in children:
            found |= _ids(c)
    elif children is not None and not isinstance(children, str):
        found |= _ids(children)
    return found


def _layout(data: RunData) -> Any:
    ctx = SimpleNamespace(rank_href=lambda page, rank: f"/{page}?ranks={rank}")  # what the page asks of its Context
    return page.layout(PageState(page="ranks"), data, ctx)  # type: ignore[arg-type]


# --- a real FSDP2 recording -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(fsdp2_run: Path) -> RunData:
    return recording_data(fsdp2_run)


@pytest.fixture(scope="module")
def recordings(fsdp2_run: Path) -> dict[int, Recording]:
    return {rec.rank: rec for rec in read_run(fsdp2_run)}


@pytest.mark.distributed
def test_heatmap_cells_are_each_ranks_recorded_step_durations(data: RunData,
                                                               recordings: dict[int, Recording]) -> None:
    fig = heatmap_figure(binned(step_matrix(data)))
    (heat,) = fig.data
    assert list(heat.y) == sorted(recordings)
    steps = sorted({s.step for rec in recordings.values() for s in rec.steps})
    assert len(steps) >= 8 and list(heat.x) == [s + 1 for s in steps]  # steps shown from 1
    assert data.report is not None
    reported = {(r.rank, s.step): s.exposed_comm_s for r in data.report.ranks for s in r.steps}
    for row, rank in enumerate(heat.y):
        by_step = {s.step: s for s in recordings[rank].steps}
        for col, step in enumerate(steps):
            summary = by_step[step]
            assert heat.z[row][col] == pytest.approx((summary.end_ns - summary.start_ns) / 1e6, rel=1e-6)
            # The hover's exposed time is the report's for that step.
            assert heat.customdata[row][col] == pytest.approx(reported[(rank, step)] * 1e3, rel=1e-5, abs=1e-6)
    assert "step %{x}" in heat.hovertemplate and "ms" in heat.hovertemplate
    assert fig.layout.meta["bin_size"] == 1 and "bins" not in fig.layout.title.text


@pytest.mark.distributed
def test_waits_are_the_reports_arrivals_over_the_steps_after_the_first(data: RunData) -> None:
    assert data.report is not None
    arrivals = {a.rank: a for a in data.report.imbalance.ranks}
    fig = waits_figure(waits(data))
    caused, waited = fig.data
    assert caused.name == "peers waited for it (s)" and waited.name == "it waited for peers (s)"
    assert list(caused.x) == sorted(arrivals)
    assert list(caused.y) == [arrivals[r].steady_caused_wait_s for r in caused.x]
    assert list(waited.y) == [arrivals[r].steady_waited_s for r in waited.x]
    # Every wait one rank causes another suffers: with two ranks, each one's is the other's.
    assert sum(caused.y) == pytest.approx(sum(waited.y))
    assert caused.y[0] == pytest.approx(waited.y[1]) and caused.y[1] == pytest.approx(waited.y[0])
    assert "live approximation" not in fig.layout.title.text
    assert f"{data.report.imbalance.steady_steps} steps" in fig.layout.title.text


@pytest.mark.distributed
def test_memory_bars_are_each_ranks_peak_level(data: RunData, recordings: dict[int, Recording]) -> None:
    expected = {rank: max(m.allocated if m.allocated is not None else m.rss for m in rec.memory)
                for rank, rec in recordings.items()}
    peaks = memory_peaks(data)
    assert peaks.peaks == expected and peaks.level == "RSS"  # gloo on CPU: the process's RSS
    fig = imbalance_figure(peaks)
    (bars,) = fig.data
    size = 2**20 if "MiB" in fig.layout.title.text else GIB
    assert [round(v * size) for v in bars.y] == [expected[r] for r in bars.x]
    (median_line,) = fig.layout.shapes
    assert median_line.y0 * size == pytest.approx(statistics.median(expected.values()))


@pytest.mark.distributed
def test_the_page_on_a_recording(data: RunData) -> None:
    tree = _layout(data)
    assert {"ranks-heatmap", "ranks-waits", "ranks-imbalance", "ranks-waits-findings",
            "ranks-imbalance-findings"} <= _ids(tree)
    assert "ranks-none" not in _ids(tree)
    # The fsdp2 run has no straggler, skew or imbalance finding: each section says so.
    kinds = {f.kind for f in data.findings}
    if not kinds & {"straggler", "step_skew"}:
        assert "ranks-waits-findings-list-none" in _ids(tree)
    if "memory_imbalance" not in kinds:
        assert "ranks-imbalance-findings-list-none" in _ids(tree)


# --- a real run with a straggler and a memory imbalance -------------------------------------------------

@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/scenarios/straggler.py: rank 1 is 0.1 s late to every step's all-reduces, rank 0 holds
    200 MiB more."""
    out = tmp_path_factory.mktemp("straggler") / "run"
    result = subprocess.run(
        ranks_args(2, REPO / "tests" / "scenarios" / "straggler.py", "--delay", "0.1", "--steps", "14"),
        env=child_env(ZEROMON_OUT=str(out)), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _finding_lines(block: Any) -> list[str]:
    """A findings list as the report prints it: '[sev] heading', 'evidence: ...', 'remedy: ...'."""
    lines = []
    for details in block.children:
        summary, body = details.children
        lines.append("".join(_texts(summary)))
        lines.extend("".join(_texts(item)) for item in body.children)
    return lines


@pytest.mark.distributed
def test_straggler_waits_and_findings_are_the_reports(straggler_run: Path) -> None:
    data = recording_data(straggler_run)
    report = json.loads(zeromon("report", str(straggler_run), "--json").stdout)
    text = zeromon("report", str(straggler_run)).stdout.splitlines()
    arrivals = {a["rank"]: a for a in report["imbalance"]["arrivals"]}
    caused, waited = waits_figure(waits(data)).data
    assert list(caused.y) == pytest.approx([arrivals[r]["steady_caused_wait_s"] for r in caused.x])
    assert list(waited.y) == pytest.approx([arrivals[r]["steady_waited_s"] for r in waited.x])
    assert caused.y[1] > 2 * caused.y[0]  # rank 1 makes rank 0 wait

    _, _, wait_block, imbalance, memory_block = page._draw(PageState(page="ranks"), data)
    wait_kinds = [f["kind"] for f in report["findings"] if f["kind"] in ("straggler", "step_skew")]
    assert "straggler" in wait_kinds and wait_block.id == "ranks-waits-findings-list"
    assert [d.to_plotly_json()["props"]["data-kind"] for d in wait_block.children] == wait_kinds
    assert memory_block.id == "ranks-imbalance-findings-list"
    # Worded as `zeromon report` words them, line for line.
    stripped = [line.strip() for line in text]
    for line in _finding_lines(wait_block) + _finding_lines(memory_block):
        assert line in stripped, line
    (memory_finding,) = [f for f in data.findings if f.kind == "memory_imbalance"]
    assert memory_finding.rank == 0
    (bars,) = imbalance.data
    assert list(bars.marker.color).count(bars.marker.color[0]) == 1  # rank 0 alone in the warning colour
    assert finding_heading(memory_finding) in "\n".join(text)


# --- hand-made histories ----------------------------------------------------------------------------------

def _summary(rank: int, step: int, start_ns: int, duration_ms: float, exposed_ms: float, blocked_ms: float) -> StepSummary:
    return StepSummary(rank=rank, step=step, start_ns=start_ns, end_ns=start_ns + int(duration_ms * 1e6),
                       phase_s={}, collectives=4, comm_bytes=2**20, comm_bytes_by_op={"all_reduce": 2**20},
                       comm_union_s=exposed_ms / 1e3 * 2, blocked_s=blocked_ms / 1e3, peak_memory=None,
                       comp_s=duration_ms / 1e3 / 2, overlap_s=exposed_ms / 1e3, exposed_comm_s=exposed_ms / 1e3)


def _memory(rank: int, allocated: int) -> MemorySample:
    return MemorySample(rank=rank, step=0, phase="optimizer", t_ns=T0_NS, device="cuda:0", allocated=allocated,
                        reserved=allocated, active=None, peak_allocated=allocated, peak_reserved=None,
                        inactive_split=None, num_alloc_retries=0, num_ooms=0, capacity=80 * GIB, free=None, rss=None)


def synthetic_run(ranks: int = 256, steps: int = 1000, slow_rank: int | None = 37, late_ms: float = 30.0,
                  extra_memory_rank: int | None = 0, slow_step: tuple[int, int, float] | None = None) -> RunData:
    """A live data-parallel run: every rank starts each step together; the others are blocked
    ``late_ms`` in collectives waiting for ``slow_rank``, whose steps end last (``late_ms`` / 2 after
    theirs); ``extra_memory_rank`` holds 4 GiB more; ``slow_step``: (rank, step, ms) one step that
    takes that long."""
    rng = random.Random(1)
    starts = T0_NS
    per_rank: dict[int, list[StepSummary]] = {r: [] for r in range(ranks)}
    for step in range(steps):
        longest = 0.0
        for rank in range(ranks):
            late = rank == slow_rank
            duration = 100.0 + rng.uniform(0, 5) + (late_ms / 2 if late else 0.0)
            if slow_step is not None and (rank, step) == slow_step[:2]:
                duration = slow_step[2]
            per_rank[rank].append(_summary(rank, step, starts, duration, exposed_ms=10.0 + rng.uniform(0, 2),
                                           blocked_ms=1.0 if late or slow_rank is None else late_ms))
            longest = max(longest, duration)
        starts += int(longest * 1e6) + 1_000_000
    views = tuple(RankView(rank=r, target=f"node{r // 8}:9100", alive=True, stale_s=0.1, error=None,
                           steps=tuple(per_rank[r][-STEPS_ASKED:]),  # what a live source keeps
                           memory=_memory(r, 20 * GIB + (4 * GIB if r == extra_memory_rank else 0)))
                  for r in range(ranks))
    histories = {r: RankHistory(rank=r, memory=(views[r].memory,) if views[r].memory else (), steps=per_rank[r])
                 for r in range(ranks)}
    fleet = FleetView(t_ns=starts, source="synthetic", ranks=views, looked_at=())
    findings = tuple(fleet_findings(views))
    return RunData(kind="live", source="synthetic", version=1, fleet=fleet, histories=histories, findings=findings)


@pytest.fixture(scope="module")
def big() -> RunData:
    return synthetic_run()


def test_256_ranks_by_1000_steps_are_drawn_whole_with_the_straggler_darkest(big: RunData) -> None:
    fig = heatmap_figure(binned(step_matrix(big)))
    (heat,) = fig.data
    z = np.asarray(heat.z)
    assert z.shape == (256, 1000) and not np.isnan(z).any()  # no binning under MAX_STEP_COLUMNS
    assert list(heat.y) == list(range(256)) and list(heat.x) == list(range(1, 1001))
    # The straggler's row is the slowest of every column.
    assert (z.argmax(axis=0) == 37).all()
    # Coloured so that it stands out: its cells in the upper half of the scale, a typical cell near the
    # pale end (the steps only jitter by 5 ms).
    def colour(ms: float) -> float:
        return (ms - heat.zmin) / (heat.zmax - heat.zmin)
    assert colour(z[37].min()) > 0.5 and colour(float(np.median(np.delete(z, 37, axis=0)))) < 0.2
    assert fig.layout.height <= 900  # 256 ranks fit a screen


def test_live_waits_count_who_finished_each_step_last(big: RunData) -> None:
    w = waits(big)
    assert not w.measured and w.compared == 1000
    assert {r.rank: r.late for r in w.ranks if r.late} == {37: 1000}
    fig = waits_figure(w)
    assert "live approximation" in fig.layout.title.text
    (bars,) = fig.data
    assert bars.y[37] == 1000 and sum(bars.y) == 1000
    # The live straggler finding (the TUI's), listed below it as `zeromon report`'s are.
    _, _, block, _, _ = page._draw(PageState(page="ranks"), big)
    (straggler,) = [f for f in big.findings if f.kind == "straggler"]
    assert straggler.rank == 37
    assert _finding_lines(block)[0] == f"[{straggler.severity.value}] {finding_heading(straggler)}"


def test_last_to_finish_skips_steps_a_rank_has_not_finished() -> None:
    run = synthetic_run(ranks=3, steps=5, slow_rank=2)
    histories = dict(run.histories)
    histories[0] = RankHistory(rank=0, steps=list(run.histories[0].steps)[:3])  # rank 0 is two steps behind
    w = last_to_finish(step_matrix(SimpleNamespace(histories=histories, report=None)))  # type: ignore[arg-type]
    assert w.compared == 3 and {r.rank: r.late for r in w.ranks} == {0: 0, 1: 0, 2: 3}


def test_live_memory_imbalance_is_drawn_against_the_median(big: RunData) -> None:
    peaks = memory_peaks(big)
    assert peaks.level == "allocated" and peaks.median == 20 * GIB and peaks.peaks[0] == 24 * GIB
    (finding,) = [f for f in big.findings if f.kind == "memory_imbalance"]
    fig = imbalance_figure(peaks, finding)
    (bars,) = fig.data
    assert fig.layout.title.text.endswith("(allocated, GiB)")
    assert bars.y[0] == 24 and set(bars.y[1:]) == {20}
    assert bars.customdata[0] == ["24.00 GiB", "+4.00 GiB (+20.0%) against the median"]
    assert bars.marker.color[0] != bars.marker.color[1]
    (median_line,) = fig.layout.shapes
    assert median_line.y0 == 20


def test_10000_steps_are_binned_by_the_slowest_step_of_each_bin() -> None:
    run = synthetic_run(ranks=8, steps=10_000, slow_rank=None, extra_memory_rank=None, slow_step=(3, 7777, 900.0))
    matrix = step_matrix(run)
    fig = heatmap_figure(binned(matrix))
    (heat,) = fig.data
    z, custom = np.asarray(heat.z), np.asarray(heat.customdata)
    assert z.shape == (8, MAX_STEP_COLUMNS) and fig.layout.meta["bin_size"] == 5
    assert "10000 steps in bins of 5" in fig.layout.title.text
    # Each cell is the max of its five steps, computed here independently.
    raw = matrix.step_ms.reshape(8, MAX_STEP_COLUMNS, 5)
    assert np.array_equal(z, raw.max(axis=2))
    assert np.array_equal(custom[..., 1], raw.argmax(axis=2) + np.arange(0, 10_000, 5)[None, :] + 1)
    # The slow step is visible: its cell shows it, and the hover names it (from 1).
    row, col = np.unravel_index(np.nanargmax(z), z.shape)
    assert (row, col) == (3, 7777 // 5) and z[row, col] == pytest.approx(900.0)
    assert custom[row, col, 1] == 7778
    assert list(heat.x[:2]) == [3.0, 8.0]  # steps 1-5 and 6-10, at their middles


def test_uneven_bins_and_gaps_keep_every_step() -> None:
    run = synthetic_run(ranks=2, steps=2003, slow_rank=None, extra_memory_rank=None, slow_step=(1, 2002, 500.0))
    histories = dict(run.histories)
    histories[0] = RankHistory(rank=0, steps=[s for s in run.histories[0].steps if s.step % 7])  # gaps
    matrix = binned(step_matrix(SimpleNamespace(histories=histories, report=None)))  # type: ignore[arg-type]
    assert matrix.bin_size == 2 and matrix.step_ms.shape == (2, 1002)
    assert matrix.last_steps[-1] == 2002 and matrix.step_ms[1, -1] == pytest.approx(500.0)
    assert matrix.shown_step is not None and matrix.shown_step[1, -1] == 2002
    assert np.nanmax(matrix.step_ms[0]) == pytest.approx(np.nanmax(step_matrix(
        SimpleNamespace(histories=histories, report=None)).step_ms[0]))  # type: ignore[arg-type]


def test_an_empty_run_says_why_everywhere() -> None:
    fleet = FleetView(t_ns=T0_NS, source="nothing yet", ranks=(), looked_at=())
    empty_run = RunData(kind="live", source="nothing yet", version=1, fleet=fleet)
    heat, waits_fig, wait_block, imbalance, memory_block = page._draw(PageState(page="ranks"), empty_run)
    assert "no rank has finished a step yet" in heat.layout.annotations[0].text
    assert "one rank" in waits_fig.layout.annotations[0].text
    assert "no memory sample yet" in imbalance.layout.annotations[0].text
    assert wait_block.id == "ranks-waits-findings-list-none" and memory_block.id == "ranks-imbalance-findings-list-none"
    assert "ranks-none" in _ids(_layout(empty_run))


def test_one_rank_has_no_peer_to_wait_for() -> None:
    run = synthetic_run(ranks=1, steps=20, slow_rank=None, extra_memory_rank=None)
    assert "no peer to wait for" in waits_figure(waits(run)).layout.annotations[0].text
    (heat,) = heatmap_figure(binned(step_matrix(run))).data
    assert np.asarray(heat.z).shape == (1, 20)


def test_a_clicked_cell_opens_the_step_it_shows() -> None:
    """Dash's clickData holds the cell's x and y (no customdata for a heatmap): a binned cell opens
    its bin's slowest step, the one its hover names."""
    few = binned(step_matrix(synthetic_run(ranks=2, steps=20, slow_rank=None, extra_memory_rank=None)))
    assert page.clicked_step({"x": 5, "y": 1, "z": 101.0}, few) == (1, 4)  # step 5 as shown
    assert page.clicked_step({"x": 5, "y": 7}, few) is None  # no rank 7
    assert page.clicked_step({"y": 1}, few) is None
    many = binned(step_matrix(synthetic_run(ranks=8, steps=10_000, slow_rank=None, extra_memory_rank=None,
                                            slow_step=(3, 7777, 900.0))))
    fig = heatmap_figure(many)
    col = 7777 // 5
    x = fig.data[0].x[col]
    assert page.clicked_step({"x": float(x), "y": 3}, many) == (3, 7777)
    assert fig.data[0].customdata[3][col][1] == 7778  # what the hover says, from 1


def test_findings_of_other_kinds_stay_off_the_page(big: RunData) -> None:
    other = Finding(kind="poor_overlap", severity=big.findings[0].severity, title="rank 3 exposes 40% of its step",
                    rank=3, evidence=(), remedies=())
    data = RunData(kind=big.kind, source=big.source, version=2, fleet=big.fleet, histories=big.histories,
                   findings=(*big.findings, other))
    _, _, wait_block, _, memory_block = page._draw(PageState(page="ranks"), data)
    shown = " ".join(_texts(wait_block) + _texts(memory_block))
    assert "exposes 40%" not in shown and "rank 37" in shown


def test_a_slow_first_step_takes_the_darkest_colour_without_washing_out_the_rest() -> None:
    run = synthetic_run(ranks=4, steps=50, slow_rank=2, late_ms=30.0, extra_memory_rank=None,
                        slow_step=(0, 0, 2000.0))
    fig = heatmap_figure(binned(step_matrix(run)))
    (heat,) = fig.data
    assert heat.zmax < 200 and np.asarray(heat.z)[0, 0] == pytest.approx(2000.0)  # clipped to the darkest
    assert "darkest" in heat.colorbar.title.text
    z = np.asarray(heat.z)[:, 1:]
    assert (z.argmax(axis=0) == 2).all() and (z[2] - heat.zmin).min() > 0.3 * (heat.zmax - heat.zmin)
