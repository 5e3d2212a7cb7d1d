"""The Trace page (`zeromon dashboard --trace DIR`): its table, notes and figures say what `zeromon
report --trace DIR` says, checked through the real CLI on real multi-GPU Kineto traces
(tests/data/kineto, from HolisticTraceAnalysis' test data)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from zeromon.sources.fleet import FleetView
from zeromon.views.run_data import RunData, trace_data
from zeromon_dashboard.figures.trace import trace_page_figures
from zeromon_dashboard.pages import trace as page
from zeromon_dashboard.state import PageState

from conftest import REPO, zeromon

TRACES = REPO / "tests" / "data" / "kineto"
GROUPS = {  # one folder each, as `zeromon report --trace` reads one
    "a100-w2": ["a100-w2-rank0.json.gz"],
    "w128": ["w128-sampled-rank0.json.gz", "w128-sampled-rank1.json.gz"],
}
pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"real traces not found in {TRACES}")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("traces")
    out = {}
    for group, files in GROUPS.items():
        out[group] = root / group
        out[group].mkdir()
        for name in files:
            shutil.copy(TRACES / name, out[group] / name)
    return out


@pytest.fixture(scope="module")
def reports(folders: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """`zeromon report --trace DIR --json` and its text, through the real CLI."""
    out = {}
    for group, folder in folders.items():
        as_json = zeromon("report", "--trace", str(folder), "--json")
        as_text = zeromon("report", "--trace", str(folder))
        assert as_json.returncode == 0 and as_text.returncode == 0, as_json.stderr + as_text.stderr
        out[group] = {"json": json.loads(as_json.stdout), "text": as_text.stdout.splitlines()}
    return out


@pytest.fixture(scope="module")
def datas(folders: dict[str, Path]) -> dict[str, RunData]:
    return {group: trace_data(folder) for group, folder in folders.items()}


def _ids(component: Any) -> set[str]:
    found = {component.id} if isinstance(getattr(component, "id", None), str) else set()
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and not isinstance(child, str):
            found |= _ids(child)
    return found


def _find(component: Any, element_id: str) -> Any:
    if getattr(component, "id", None) == element_id:
        return component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and not isinstance(child, str) and (hit := _find(child, element_id)) is not None:
            return hit
    return None


def _layout(data: RunData) -> Any:
    return page.layout(PageState(page="trace"), data, SimpleNamespace())  # type: ignore[arg-type]


@pytest.mark.parametrize("group", list(GROUPS))
def test_the_table_holds_the_reports_numbers(group: str, datas: dict[str, RunData],
                                             reports: dict[str, dict[str, Any]]) -> None:
    ranks = reports[group]["json"]["ranks"]
    records = page.table_records(datas[group].traces)
    assert [r["rank"] for r in records] == [r["rank"] for r in ranks] and records
    for row, rank in zip(records, ranks, strict=True):
        tb = rank["temporal_breakdown"]
        assert row["iterations"] == len(rank["iterations"]) > 0
        assert row["overlap_pct"] == rank["comm_comp_overlap_pct"]
        assert row["exposed_ms_per_iteration"] == pytest.approx(rank["median_iteration_exposed_comm_s"] * 1e3)
        assert row["exposed_ms_total"] == pytest.approx(rank["exposed_comm_s"] * 1e3)
        assert (row["idle_pct"], row["compute_pct"], row["non_compute_pct"]) == (
            tb["idle_time_pctg"], tb["compute_time_pctg"], tb["non_compute_time_pctg"])


@pytest.mark.parametrize("group", list(GROUPS))
def test_the_tables_columns_and_notes_are_the_text_reports(group: str, datas: dict[str, RunData],
                                                           reports: dict[str, dict[str, Any]]) -> None:
    text = reports[group]["text"]
    header = " ".join(c["headerName"] for c in page.COLUMNS)
    assert header == " ".join(text[2].split())  # the text table's header, its spacing aside
    notes = [p.children for p in page.notes(datas[group].traces).children]
    assert notes == [line for line in text if line.startswith(("(", "note:"))]
    assert any("ProfilerStep" in n for n in notes) and any("of a world of" in n for n in notes)
    # The text shows the rows' numbers as the grid's formatters do (one decimal, '%' on shares).
    for row, line in zip(page.table_records(datas[group].traces), text[3:], strict=False):
        cells = line.split()
        assert cells[2] == f"{row['overlap_pct']:.1f}%" and cells[4] == f"{row['exposed_ms_total']:.1f}"


def test_the_text_report_is_unchanged(reports: dict[str, dict[str, Any]], folders: dict[str, Path]) -> None:
    """`zeromon report --trace` prints the rows the page shows (zeromon.views.trace), byte for byte as before."""
    assert reports["a100-w2"]["text"] == [
        f"zeromon report: traces in {folders['a100-w2']}",
        "",
        "rank iterations  overlap exposed ms/iter exposed ms total    idle  compute non-compute",
        "   0          2    14.3%            10.4             20.8   77.8%    17.3%        5.0%",
        "(exposed ms/iter: median over the profiled iterations; total: over the whole trace)",
        "(overlap and temporal breakdown over the whole trace, as Holistic Trace Analysis defines them)",
        "note: the last profiler step (ProfilerStep#6) and what it launched are left out, as Holistic Trace "
        "Analysis does (the profiler may stop in the middle of it)",
        "note: 1 of a world of 2 ranks (rank 0); the others' traces are not among those read"]


@pytest.mark.parametrize("group", list(GROUPS))
def test_the_figures_draw_the_reports_numbers(group: str, datas: dict[str, RunData],
                                              reports: dict[str, dict[str, Any]]) -> None:
    ranks = reports[group]["json"]["ranks"]
    labels = [f"rank {r['rank']}" for r in ranks]
    figs = trace_page_figures(datas[group].traces)
    assert set(figs) == {"trace-breakdown", "trace-overlap", "trace-iterations"}
    breakdown = {t.name: t for t in figs["trace-breakdown"].data}
    for name, field in (("compute", "compute_time"), ("non-compute", "non_compute_time"), ("idle", "idle_time")):
        assert list(breakdown[name].y) == labels
        assert list(breakdown[name].x) == [r["temporal_breakdown"][f"{field}_pctg"] for r in ranks]
    # The three shares of a rank's kernel time add up (HTA rounds each to 0.01).
    for i in range(len(ranks)):
        assert sum(breakdown[n].x[i] for n in breakdown) == pytest.approx(100, abs=0.02)
    exposed, overlap = figs["trace-overlap"].data
    assert list(exposed.x) == labels and list(overlap.x) == labels
    assert list(exposed.y) == pytest.approx([r["exposed_comm_s"] * 1e3 for r in ranks])
    assert list(overlap.y) == [r["comm_comp_overlap_pct"] for r in ranks]
    per_iteration = {t.name: t for t in figs["trace-iterations"].data}
    for r in ranks:
        iterations = r["iterations"]
        line = per_iteration[f"rank {r['rank']}: exposed comm (ms)"]
        assert list(line.x) == [it["iteration"] for it in iterations]
        assert list(line.y) == pytest.approx([it["exposed_comm_s"] * 1e3 for it in iterations])
        assert list(per_iteration[f"rank {r['rank']}: overlap %"].y) == [it["comm_comp_overlap_pct"]
                                                                         for it in iterations]
    for fig in figs.values():
        assert "ms" in fig.data[0].hovertemplate or "%" in fig.data[0].hovertemplate


def test_the_page_holds_the_table_its_notes_and_the_figures(datas: dict[str, RunData]) -> None:
    data = datas["w128"]
    tree = _layout(data)
    assert {"page-trace", "trace-table", "trace-notes", "trace-breakdown", "trace-overlap",
            "trace-iterations", "trace-summary"} <= _ids(tree)
    grid = _find(tree, "trace-table")
    assert grid.rowData == page.table_records(data.traces) and len(grid.rowData) == 2
    assert "2 ranks of a world of 128" in _find(tree, "trace-summary").children
    # 128 ranks' bars would not fit the breakdown's default height: it grows with the ranks read.
    assert _find(tree, "trace-breakdown").figure.layout.height >= 240


def test_traces_without_iterations_say_so(datas: dict[str, RunData]) -> None:
    traces = tuple(dataclasses.replace(t, iterations=()) for t in datas["w128"].traces)
    figs = trace_page_figures(traces)
    assert "no ProfilerStep iterations" in figs["trace-iterations"].layout.annotations[0].text
    assert figs["trace-breakdown"].data  # the whole trace's figures are still drawn
    assert all(r["exposed_ms_per_iteration"] is None for r in page.table_records(traces))


def test_no_trace_read_says_what_to_do() -> None:
    fleet = FleetView(t_ns=0, source="traces in x", ranks=(), looked_at=())
    tree = _layout(RunData(kind="trace", source="traces in x", version=1, fleet=fleet))
    assert "trace-none" in _ids(tree) and "trace-table" not in _ids(tree)
    assert all("no trace read" in f.layout.annotations[0].text for f in trace_page_figures(()).values())
