"""End to end: the real `zeromon dashboard` CLI, started as a user starts it, read in a real headless
chromium (Dash's own test browser, dash.testing), on real 2-rank gloo runs made by real CLI runs:

- the README's FSDP2 job (the session's ``fsdp2_run``): every page loads without a console error and
  draws what the recording holds; its exposed-communication banner warns at the least (gloo overlaps nothing);
- a run built to leak memory against a small capacity: the OOM banner warns and names the rank;
- a run that hides its all-reduce behind compute: both banners are ok;
- a live run followed while it trains, until it ends;
- the URL's state, the token and the path prefix, and the failure paths of the CLI.

Each page's screenshot is kept in ZEROMON_TEST_ARTIFACTS (default test-artifacts/dashboard/).
Runs are shared by module-scoped fixtures and kept short: the CI has 2 cores.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_browser import (
    Dashboard,
    browser_missing,
    browser_required,
    chromium,
    click_point,
    console,
    dropdown_values,
    figure,
    http_get,
    open_page,
    page_text,
    screenshot,
    severe,
    text_of,
    title,
    wait_until,
)

from zeromon.analysis.comm_advice import EXPOSED_SHARE_WARN
from zeromon.analysis.finding_groups import group_findings
from zeromon.views.overview import exposed_banner, oom_banner, rank_exposed_shares
from zeromon.views.run_data import RunData, recording_data

from conftest import FLEET_RANKS, REPO, child_env, free_port, ranks_args, zeromon

# selenium 4.2 calls urllib3's deprecated HTTPResponse.getheader on every command
pytestmark = pytest.mark.filterwarnings("ignore:HTTPResponse.getheader:DeprecationWarning")
# Skipped without a browser, except where one is required (the CI): there the `br` fixture fails.
needs_browser = pytest.mark.skipif(browser_missing() is not None and not browser_required(),
                                   reason=browser_missing() or "")
SCENARIOS = REPO / "tests" / "scenarios"
FSDP2_STEPS = 8  # conftest's fsdp2_run


# --- fixtures: the browser, the runs, the servers -------------------------------------------------------

@pytest.fixture(scope="module")
def br() -> Iterator[Any]:
    if browser_missing():
        pytest.fail(f"ZEROMON_REQUIRE_BROWSER is set: {browser_missing()}")
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard-logs")


@pytest.fixture(scope="module")
def fsdp2_data(fsdp2_run: Path) -> RunData:
    return recording_data(fsdp2_run)


@pytest.fixture(scope="module")
def fsdp2_dashboard(fsdp2_run: Path, logs: Path) -> Iterator[Dashboard]:
    with Dashboard(str(fsdp2_run), logs=logs) as server:
        yield server
    assert_no_traceback(server)


def assert_no_traceback(server: Dashboard) -> None:
    assert "Traceback" not in server.stderr, server.stderr[-4000:]


def assert_clean_console(br: Any, where: str) -> None:
    errors = severe(console(br))
    assert not errors, f"{where}: console errors:\n" + "\n".join(errors)
    assert "Traceback" not in page_text(br), where


def banner(br: Any, kind: str) -> dict[str, str]:
    """A banner's level, rank and text (read in one script: a live page redraws it)."""
    found = br.driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? "
        "{level: e.dataset.level, rank: e.dataset.rank, text: e.innerText} : null", f"banner-{kind}")
    assert found is not None, f"no #banner-{kind} in the page:\n{page_text(br)[:2000]}"
    return dict(found)


def run_info(br: Any) -> dict[str, str]:
    cells = br.driver.execute_script(
        "return Array.from(document.querySelectorAll('#run-info tr')).map(r => [r.querySelector('th').innerText,"
        " r.querySelector('td').innerText])")
    return {k.strip(): v.strip() for k, v in cells}


def grid_rows(br: Any, grid_id: str) -> list[dict[str, str]]:
    """The rows an AG Grid shows, column id -> cell text, in the order shown (pinned columns merged)."""
    rows = br.driver.execute_script("""
        const out = {};
        document.querySelectorAll('#' + CSS.escape(arguments[0]) + ' .ag-row').forEach(row => {
            const index = row.getAttribute('row-index');
            out[index] = out[index] || {};
            row.querySelectorAll('.ag-cell').forEach(c => { out[index][c.getAttribute('col-id')] = c.innerText; });
        });
        return Object.keys(out).sort((a, b) => a - b).map(k => out[k]);
    """, grid_id)
    return list(rows)


# --- 1. every page on the FSDP2 recording ----------------------------------------------------------------

@needs_browser
@pytest.mark.distributed
def test_overview_shows_the_recordings_banners_grid_run_and_findings(br: Any, fsdp2_dashboard: Dashboard,
                                                                     fsdp2_data: RunData, fsdp2_run: Path) -> None:
    open_page(br, fsdp2_dashboard.page(), graphs=("overview-grid-risk", "overview-grid-exposed"),
              elements=("run-info", "banner-oom", "banner-exposed"))
    screenshot(br, "overview")
    assert_clean_console(br, "overview")

    # The grids: one cell per recorded rank, labelled with its rank.
    for graph_id in ("overview-grid-risk", "overview-grid-exposed"):
        fig = figure(br, graph_id)
        assert [t["type"] for t in fig["data"]] == ["heatmap"]
        z = fig["data"][0]["z"]
        cells = [v for row in z for v in row if v is not None]
        assert len(cells) == 2, (graph_id, z)
        labels = [text.split("<br>")[0] for row in fig["data"][0]["text"] for text in row if text]
        assert labels == ["0", "1"]
    # The exposed grid's colour is each rank's median exposed share, as `zeromon report` computes it.
    assert fsdp2_data.report is not None
    shares = [r.median_exposed_share for r in sorted(fsdp2_data.report.ranks, key=lambda r: r.rank)]
    assert figure(br, "overview-grid-exposed")["data"][0]["z"][0] == pytest.approx(shares)

    info = run_info(br)
    assert info["world"] == "2" and info["steps"] == str(FSDP2_STEPS) and "FSDP2" in info["framework"]
    assert info["ranks"] == "2 recorded"

    # The findings, one entry per problem across ranks in the report's order, each with its kind and ranks.
    shown = [(e.get_attribute("data-kind"), e.get_attribute("data-ranks"))
             for e in br.find_elements("#findings-list details.finding")]
    assert shown == [(g.kind, g.ranks_text()) for g in group_findings(fsdp2_data.findings)]
    assert "poor_overlap" in {kind for kind, _ in shown}

    # The status line names the recording; the nav has every page a recording has (no Trace).
    assert f"recording {fsdp2_run}" in (text_of(br, "status") or "")
    assert [e.text for e in br.find_elements("#nav a")] == ["Overview", "Memory", "Communication", "Ranks",
                                                            "Hang", "Planner"]


@needs_browser
@pytest.mark.distributed
def test_communication_draws_the_recorded_step_on_both_ranks(br: Any, fsdp2_dashboard: Dashboard,
                                                             fsdp2_data: RunData) -> None:
    from zeromon.views.timeline import default_step

    open_page(br, fsdp2_dashboard.page("communication"),
              graphs=("comm-timeline", "comm-per-step", "comm-bandwidth", "comm-bytes"),
              elements=("comm-bandwidth-table",))
    screenshot(br, "communication")
    assert_clean_console(br, "communication")
    # Each figure's legend clear of its x-axis title, as drawn.
    for graph_id in ("comm-timeline", "comm-per-step"):
        legend, axis_title = (br.driver.execute_script(
            f"var e = document.querySelector('#{graph_id} {selector}'); "
            "if (!e) return null; var r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom];")
            for selector in (".legend", ".g-xtitle"))
        assert legend is not None and axis_title is not None, graph_id
        apart = (legend[2] <= axis_title[0] or axis_title[2] <= legend[0] or legend[3] <= axis_title[1]
                 or axis_title[3] <= legend[1])
        assert apart, (graph_id, legend, axis_title)
    order = tuple(int(v.split()[-1]) for v in dropdown_values(br, "communication-ranks"))
    assert sorted(order) == [0, 1]  # the default: the worst rank first, and the other one

    # The timeline: one band of three rows (compute, collectives, exposed) per chosen rank, for the
    # page's default step (the first chosen rank's median step); each band's collectives are the step's.
    step = default_step(fsdp2_data.histories, order)
    assert step is not None
    timeline = figure(br, "comm-timeline")
    assert timeline["layout"]["meta"]["step"] == step and title(timeline).startswith(f"Step {step + 1}:")
    rows = {y for t in timeline["data"] for y in t["y"]}
    for rank in (0, 1):
        history = fsdp2_data.histories[rank]
        n = len(history.step_collectives(step))
        assert n > 0
        band = {row for row in rows if row.startswith(f"rank {rank} · ")}
        assert len(band) == 3 and f"rank {rank} · compute" in band
        assert f"rank {rank} · collectives ({n})" in band
        summary = next(s for s in history.steps if s.step == step)
        assert summary.exposed_comm_s is not None
        assert timeline["layout"]["meta"]["exposed_ms"][str(rank)] == pytest.approx(summary.exposed_comm_s * 1e3,
                                                                                    rel=0.02, abs=0.05)
    assert len(rows) == 6
    names = {t["name"] for t in timeline["data"]}
    assert {"forward", "backward", "optimizer", "comm: param_all_gather", "comm: grad_reduce_scatter"} <= names

    # Over the run: exposed (ms) and overlap (%) per rank, one point per recorded step, shown from 1.
    per_step = figure(br, "comm-per-step")
    assert {t["name"] for t in per_step["data"]} >= {f"rank {r}: {w}" for r in (0, 1)
                                                      for w in ("exposed (ms)", "overlap (%)")}
    for trace in per_step["data"]:
        if trace["name"].endswith("exposed (ms)"):
            assert trace["x"] == list(range(1, FSDP2_STEPS + 1))

    # Bandwidth: the report's table, one grid row per (op, group, size bucket).
    assert fsdp2_data.report is not None
    table = grid_rows(br, "comm-bandwidth-table")
    assert len(table) == len(fsdp2_data.report.bandwidth)
    assert sorted(r["op"] for r in table) == sorted(r.op for r in fsdp2_data.report.bandwidth)
    # Bytes per step by ZeRO meaning: FSDP2 gathers parameters and reduce-scatters gradients.
    assert {"param_all_gather", "grad_reduce_scatter"} <= {t["name"] for t in figure(br, "comm-bytes")["data"]}


def _level_peak_bytes(data: RunData, rank: int) -> int:
    """A rank's highest memory level as recorded: allocated on a GPU, the process's RSS on CPU."""
    levels = [m.allocated if m.allocated is not None else m.rss for m in data.histories[rank].memory]
    return max(v for v in levels if v is not None)


def _traces_of(fig: dict[str, Any], kind: str, rank: int | None = None) -> list[dict[str, Any]]:
    return [t for t in fig["data"] if (t.get("meta") or {}).get("kind") == kind
            and (rank is None or t["meta"].get("rank") == rank)]


@needs_browser
@pytest.mark.distributed
def test_memory_draws_each_ranks_level_and_categories_as_recorded(br: Any, fsdp2_dashboard: Dashboard,
                                                                  fsdp2_data: RunData) -> None:
    open_page(br, fsdp2_dashboard.page("memory"), graphs=("memory-stack", "memory-allocator", "memory-imbalance"),
              elements=("memory-table",))
    screenshot(br, "memory")
    assert_clean_console(br, "memory")
    assert sorted(dropdown_values(br, "memory-ranks")) == ["rank 0", "rank 1"]

    stack = figure(br, "memory-stack")
    for rank in (0, 1):
        # The level line reaches the recorded peak (decimation keeps the highest point).
        (level,) = _traces_of(stack, "level", rank)
        drawn_peak = max(y for y in level["y"] if y is not None) * level["meta"]["scale"]
        assert drawn_peak == pytest.approx(_level_peak_bytes(fsdp2_data, rank), rel=1e-5)
        # The stacked categories are the ones the agent's walks recorded.
        recorded = {name for m in fsdp2_data.histories[rank].memory for name in (m.categories or {})}
        drawn = {t["meta"]["name"] for t in _traces_of(stack, "category", rank)}
        assert drawn and drawn <= recorded, (drawn, recorded)
        assert any(a["text"].startswith(f"rank {rank} ") for a in stack["layout"]["annotations"])

    # One table row per rank; the peaks side by side.
    table = grid_rows(br, "memory-table")
    assert sorted(r["rank"] for r in table) == ["0", "1"]
    imbalance = figure(br, "memory-imbalance")
    assert sorted(x for t in imbalance["data"] if t["type"] == "bar" for x in t["x"]) == [0, 1]
    # A CPU run has no allocator statistics, and the figure says so rather than drawing nothing.
    allocator = figure(br, "memory-allocator")
    assert not any(t.get("x") for t in allocator["data"])
    assert "allocator statistics" in " ".join(a["text"] for a in allocator["layout"]["annotations"])


@needs_browser
def test_trace_page_draws_the_trace_report_of_real_profiler_traces(br: Any, tmp_path: Path, logs: Path) -> None:
    """Real Kineto traces of two ranks of a 128-GPU NCCL job (tests/data/kineto: a CPU machine makes no
    GPU kernels); the page's numbers are `zeromon report --trace`'s."""
    from zeromon.views.run_data import trace_data

    folder = tmp_path / "traces"
    folder.mkdir()
    for rank in (0, 1):
        shutil.copy(REPO / "tests" / "data" / "kineto" / f"w128-sampled-rank{rank}.json.gz", folder)
    expected = sorted(trace_data(folder).traces, key=lambda r: r.rank)
    assert [r.rank for r in expected] == [0, 1]
    with Dashboard("--trace", str(folder), logs=logs) as server:
        open_page(br, server.page("trace"), graphs=("trace-breakdown", "trace-overlap", "trace-iterations"),
                  elements=("trace-table",))
        screenshot(br, "trace")
        assert_clean_console(br, "trace")
        assert [e.text for e in br.find_elements("#nav a")] == ["Planner", "Trace"]

        breakdown = figure(br, "trace-breakdown")
        assert [t["name"] for t in breakdown["data"]] == ["compute", "non-compute", "idle"]
        for trace, field in zip(breakdown["data"], ("compute_time", "non_compute_time", "idle_time"), strict=True):
            assert trace["y"] == ["rank 0", "rank 1"]
            assert trace["x"] == pytest.approx([getattr(r.total.breakdown, f"{field}_pctg") for r in expected])
        overlap = figure(br, "trace-overlap")
        exposed = next(t for t in overlap["data"] if t["name"] == "exposed comm (ms)")
        assert exposed["y"] == pytest.approx([r.total.exposed_comm_ns / 1e6 for r in expected])
        iterations = figure(br, "trace-iterations")
        if any(r.iterations for r in expected):
            assert {t["name"] for t in iterations["data"]} == {f"rank {r.rank}: {w}" for r in expected
                                                                for w in ("exposed comm (ms)", "overlap %")}
        else:
            assert "ProfilerStep" in " ".join(a["text"] for a in iterations["layout"]["annotations"])
        table = grid_rows(br, "trace-table")
        assert [r["rank"] for r in table] == ["0", "1"]
        assert [r["iterations"] for r in table] == [str(len(r.iterations)) for r in expected]
    assert_no_traceback(server)


@needs_browser
@pytest.mark.distributed
def test_ranks_draws_step_times_waits_and_peaks_and_a_cell_opens_its_step(br: Any, fsdp2_dashboard: Dashboard,
                                                                          fsdp2_data: RunData) -> None:
    open_page(br, fsdp2_dashboard.page("ranks"), graphs=("ranks-heatmap", "ranks-waits", "ranks-imbalance"))
    screenshot(br, "ranks")
    assert_clean_console(br, "ranks")

    # The heatmap: a row per rank, a column per step (from 1), each cell the recorded step's time.
    (heat,) = figure(br, "ranks-heatmap")["data"]
    assert heat["type"] == "heatmap" and heat["y"] == [0, 1] and heat["x"] == list(range(1, FSDP2_STEPS + 1))
    for row, rank in zip(heat["z"], (0, 1), strict=True):
        recorded = [(s.end_ns - s.start_ns) / 1e6 for s in fsdp2_data.histories[rank].steps]
        assert row == pytest.approx(recorded, rel=1e-5)
    # Who waits for whom: both ranks, measured at the recorded collectives.
    waits = figure(br, "ranks-waits")
    assert {t["name"] for t in waits["data"]} == {"peers waited for it (s)", "it waited for peers (s)"}
    assert all(t["x"] == [0, 1] for t in waits["data"])
    # Memory balance: each rank's peak, in the report's proportions.
    (bars,) = [t for t in figure(br, "ranks-imbalance")["data"] if t["type"] == "bar"]
    assert fsdp2_data.report is not None
    peaks = fsdp2_data.report.imbalance.peak_memory
    assert bars["x"] == [0, 1] and bars["y"][0] / bars["y"][1] == pytest.approx(peaks[0] / peaks[1], rel=1e-4)

    # A click on rank 1's step 3 opens that step on the Communication page, for rank 1.
    click_point(br, "ranks-heatmap", 3, 1)
    wait_until(lambda: "/communication?" in br.driver.current_url, 30, "the click to open the Communication page",
               lambda: br.driver.current_url)
    assert br.driver.current_url.endswith("/communication?ranks=1&step=3")
    wait_until(lambda: br.driver.execute_script(
        "const g = document.querySelector('#comm-timeline .js-plotly-plot'); return !!(g && g.data)"), 30,
        "the timeline of the clicked step")
    wait_until(lambda: figure(br, "comm-timeline")["layout"]["meta"]["step"] == 2, 30, "step 3's timeline")
    rows = {y for t in figure(br, "comm-timeline")["data"] for y in t["y"]}
    assert rows and all(row.startswith("rank 1 · ") for row in rows), rows
    assert_clean_console(br, "the Communication page opened from the Ranks heatmap")


# --- 3. the planner's form -----------------------------------------------------------------------------

def _type_into(br: Any, input_id: str, text: str) -> None:
    element = br.find_element(f"#{input_id}")
    br.clear_input(element)  # select all + backspace: React sees the change (WebElement.clear() it may not)
    element.send_keys(text)


def _planned(br: Any) -> tuple[str, str] | None:
    """(recommendation, error) once the page has answered the form: either is non-empty."""
    rec = text_of(br, "planner-recommendation-text") or ""
    error = text_of(br, "planner-error-text") or ""
    return (rec, error) if rec or error else None


@needs_browser
@pytest.mark.distributed
def test_the_planner_answers_the_form_as_zeromon_plan_does(br: Any, fsdp2_dashboard: Dashboard) -> None:
    open_page(br, fsdp2_dashboard.page("planner"), graphs=("planner-bars",), elements=("planner-submit",))
    assert_clean_console(br, "planner")
    _type_into(br, "planner-params", "1.5B")
    _type_into(br, "planner-gpu_memory", "24GiB")
    br.find_element("#planner-submit").click()
    wait_until(lambda: "gpu_memory=24GiB" in br.driver.current_url and "params=1.5B" in br.driver.current_url, 30,
               "the form in the URL", lambda: br.driver.current_url)
    wait_until(lambda: "1.50B parameters" in (text_of(br, "planner-heading") or ""), 30, "the plan of 1.5B",
               lambda: page_text(br)[-3000:])
    rec, error = wait_until(lambda: _planned(br), 30, "the recommendation")
    assert not error
    # The CLI's own answer for the same flags.
    cli = zeromon("plan", "--params", "1.5B", "--gpus-per-node", "8", "--nodes", "1", "--gpu-memory", "24GiB",
                  timeout=120)
    assert cli.returncode == 0, cli.stderr
    expected = next(line for line in cli.stdout.splitlines() if line.startswith("recommendation: "))
    assert rec.strip() == expected.strip()
    # The table and the bars: the CLI's rows, their GPU totals, the recommended one marked.
    lines = cli.stdout.splitlines()
    header = re.split(r"\s{2,}", next(line for line in lines if line.startswith("stage ")).strip())
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines if re.match(r"^[0-3] ", line)]
    assert [r["c0"] for r in grid_rows(br, "planner-table")] == [r[0] for r in rows] == ["0 (DDP)", "1", "2", "3"]
    (fits,) = [t for t in figure(br, "planner-bars")["data"] if (t.get("meta") or {}).get("kind") == "fits"]
    assert fits["x"] == ["stage 0 (DDP)", "stage 1", "stage 2", "stage 3"]
    totals = [r[header.index("GPU total")] for r in rows]
    assert [f"{b / 2**30:.2f} GiB" for b in fits["customdata"]] == totals
    recommended = [x for x, text in zip(fits["x"], fits["text"], strict=True) if "recommended" in text]
    stage = re.search(r"ZeRO-(\d)", expected)
    assert recommended == ([f"stage {stage.group(1)}"] if stage else ["stage 0 (DDP)"]), (recommended, expected)
    screenshot(br, "planner")
    assert_clean_console(br, "the planner's answer")


@needs_browser
@pytest.mark.distributed
def test_the_planner_predicts_a_change_from_the_run_as_zeromon_whatif_does(br: Any, fsdp2_dashboard: Dashboard,
                                                                          fsdp2_run: Path) -> None:
    open_page(br, fsdp2_dashboard.page("planner"), graphs=("planner-whatif-step",),
              elements=("planner-whatif-submit",))
    assert (br.find_element("#planner-whatif-changes").get_attribute("value")
            == "reshard_after_forward=false")  # an FSDP2 run's likely question, filled in
    br.find_element("#planner-whatif-submit").click()
    summary = wait_until(lambda: text_of(br, "planner-whatif-summary-text"), 60, "the prediction",
                         lambda: page_text(br)[-3000:])
    cli = zeromon("whatif", str(fsdp2_run), "reshard_after_forward=false", "--json", timeout=120)
    assert cli.returncode == 0, cli.stderr
    answer = json.loads(cli.stdout)
    assert summary.startswith("reshard_after_forward=false: a step ")
    step = {t["meta"]["part"]: t for t in figure(br, "planner-whatif-step")["data"]
            if (t.get("meta") or {}).get("kind") == "step"}
    assert step["compute"]["x"] == ["measured", "replay", "predicted"]
    # The same model on the same recording: the replay's and the prediction's parts are the CLI's.
    for part in ("compute", "transfer", "waiting"):
        assert step[part]["customdata"][1:] == pytest.approx([answer["replay"][f"{part}_s"],
                                                             answer["predicted"][f"{part}_s"]])
    memory = [t for t in figure(br, "planner-whatif-memory")["data"] if (t.get("meta") or {}).get("kind") == "category"]
    assert sum(t["customdata"][1] for t in memory) == answer["predicted"]["peak_tracked_bytes"]
    assert sum(t["customdata"][0] for t in memory) == answer["measured"]["peak_tracked_bytes"]
    screenshot(br, "planner-whatif")
    _type_into(br, "planner-whatif-changes", "zero_stage=3")
    br.find_element("#planner-whatif-submit").click()
    refusal = "zero_stage is DeepSpeed's; this run is fsdp2"
    wait_until(lambda: refusal in (text_of(br, "planner-whatif-summary-text") or ""), 60, "the refusal",
               lambda: page_text(br)[-3000:])
    assert_clean_console(br, "the planner's prediction")
    assert_no_traceback(fsdp2_dashboard)


@needs_browser
@pytest.mark.distributed
def test_the_planner_names_the_bad_flag_and_shows_no_traceback(br: Any, fsdp2_dashboard: Dashboard) -> None:
    open_page(br, fsdp2_dashboard.page("planner"), graphs=("planner-bars",), elements=("planner-submit",))
    _type_into(br, "planner-gpu_memory", "80")
    br.find_element("#planner-submit").click()
    _, error = wait_until(lambda: (p := _planned(br)) and p[1] and p, 30, "the planner's error",
                          lambda: page_text(br)[-3000:])
    assert "--gpu-memory" in error and "'80'" in error
    cli = zeromon("plan", "--params", "7.5B", "--gpu-memory", "80", timeout=120)
    assert cli.returncode == 2 and error.strip() in cli.stderr  # the CLI's sentence
    assert not (text_of(br, "planner-recommendation") or "").strip()
    screenshot(br, "planner-error")
    assert "Traceback" not in page_text(br)
    assert_clean_console(br, "the planner's error")
    assert_no_traceback(fsdp2_dashboard)


# --- 2. the banners on runs built for them -------------------------------------------------------------

@needs_browser
@pytest.mark.distributed
def test_exposed_banner_names_the_worst_rank_on_gloo_fsdp2(br: Any, fsdp2_dashboard: Dashboard,
                                                           fsdp2_data: RunData) -> None:
    open_page(br, fsdp2_dashboard.page(), elements=("banner-exposed", "banner-oom"))
    expected = exposed_banner(fsdp2_data)
    # gloo hides no communication: 32-41% of the step on a quiet machine (critical from 30%), less when
    # other work on the machine slows the compute more than the waits; a warning at the least.
    assert expected is not None and expected.level in ("warn", "critical")
    shown = banner(br, "exposed")
    assert shown["level"] == expected.level and shown["rank"] == str(expected.rank)
    assert shown["text"] == expected.text and f"rank {expected.rank}" in shown["text"]
    assert shown["text"].endswith(f"median of steps 2-{FSDP2_STEPS}")  # its window, the findings' own
    assert banner(br, "oom")["level"] == "ok"  # a few hundred MiB of the host's RAM share


@pytest.fixture(scope="module")
def leak_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/scenarios/oom_train.py keeping 16 MiB more alive each step, against a capacity of three
    times what a process with torch and a gloo group holds: ~tens of steps to capacity (warn at 1000)."""
    code = ("import os, torch, torch.distributed as dist\n"
            f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)\n"
            "print(int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE'))\n")
    baseline = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
                              timeout=120)
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    capacity = 3 * int(baseline.stdout.split()[-1])
    out = tmp_path_factory.mktemp("leak") / "run"
    result = zeromon("run", "--quiet", "--out", str(out), "--",
                     *ranks_args(2, SCENARIOS / "oom_train.py", "--leak-mb", "16", "--steps", "12"),
                     env=child_env(ZEROMON_CPU_CAPACITY=str(capacity)), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@needs_browser
@pytest.mark.distributed
def test_oom_banner_warns_on_a_leaking_run_and_names_the_rank(br: Any, leak_run: Path, logs: Path) -> None:
    data = recording_data(leak_run)
    expected = oom_banner(data)
    assert expected is not None and expected.level in ("warn", "critical")
    with Dashboard(str(leak_run), logs=logs) as server:
        open_page(br, server.page(), graphs=("overview-grid-risk",), elements=("banner-oom",))
        screenshot(br, "overview-leak")
        assert_clean_console(br, "overview of the leaking run")
        shown = banner(br, "oom")
        assert shown["level"] in ("warn", "critical")
        assert shown["level"] == expected.level and shown["rank"] == str(expected.rank)
        assert shown["rank"] in ("0", "1") and f"rank {shown['rank']}" in shown["text"]
        assert "steps to capacity" in shown["text"] or "already over capacity" in shown["text"]
        kinds = [e.get_attribute("data-kind") for e in br.find_elements("#findings-list details.finding")]
        assert "memory_growth" in kinds
    assert_no_traceback(server)


def _true_exposed_shares(run: Path) -> dict[int, float]:
    """Each rank's median exposed share of its step by the script's own stopwatch (truth-<rank>.json of
    tests/scenarios/overlap_truth.py), over the steps after the first as the report takes them; the
    step is the forward plus the time the thread was blocked on the collective."""
    shares = {}
    for path in sorted(run.glob("truth-*.json")):
        steps = [t for t in json.loads(path.read_text()) if t["step"] >= 1]
        shares[int(path.stem.split("-")[1])] = statistics.median(
            t["exposed_s"] / (t["forward_s"] + t["exposed_s"]) for t in steps)
    return shares


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/scenarios/overlap_truth.py --mode hidden: each step's all-reduce hidden behind a longer
    forward (as tests/test_overlap_ground_truth.py runs it). On 2 loaded cores gloo's threads can take
    even a small all-reduce past the forward's end, so that it is really exposed (a CI run: 11% of the
    step by the script's own stopwatch); up to three runs are made for one the truth calls hidden."""
    for attempt in range(3):
        out = tmp_path_factory.mktemp(f"hidden{attempt}")
        # A 2 MB all-reduce (not the mode's 16 MB) behind ~100 ms of forward.
        result = subprocess.run(ranks_args(2, SCENARIOS / "overlap_truth.py", "--mode", "hidden", "--steps", "5",
                                              "--numel", "500000", "--truth-dir", str(out)),
                                env=child_env(ZEROMON_OUT=str(out), ZEROMON_ASYNC_SAMPLE_EVERY="1"),
                                capture_output=True, text=True, timeout=300, cwd=REPO)
        assert result.returncode == 0, result.stderr[-3000:]
        if max(_true_exposed_shares(out).values()) < EXPOSED_SHARE_WARN / 2:
            break
    return out


@needs_browser
@pytest.mark.distributed
def test_both_banners_ok_on_a_run_that_hides_its_communication(br: Any, healthy_run: Path, logs: Path) -> None:
    truth = _true_exposed_shares(healthy_run)
    measured = rank_exposed_shares(recording_data(healthy_run))
    # What the dashboard shows is the truth, rank by rank (within 5 points of the step: the two clocks
    # are read a GIL hand-over apart).
    assert measured.keys() == truth.keys() and all(abs(measured[r] - truth[r]) <= 0.05 for r in truth), (measured, truth)
    with Dashboard(str(healthy_run), logs=logs) as server:
        open_page(br, server.page(), graphs=("overview-grid-exposed",), elements=("banner-oom", "banner-exposed"))
        screenshot(br, "overview-healthy")
        assert_clean_console(br, "overview of the healthy run")
        assert banner(br, "oom")["level"] == "ok", banner(br, "oom")
        worst = max(measured, key=lambda r: (measured[r], -r))
        shown = banner(br, "exposed")
        assert shown["rank"] == str(worst) and f"{measured[worst]:.0%}" in shown["text"], (shown, measured)
        kinds = [e.get_attribute("data-kind") for e in br.find_elements("#findings-list details.finding")]
        if max(truth.values()) < EXPOSED_SHARE_WARN / 2:  # the run hid its communication (the usual case)
            assert shown["level"] == "ok", (shown, truth)
            assert "poor_overlap" not in kinds, kinds
        assert "memory_growth" not in kinds, kinds
        if not kinds:  # "nothing stands out", and why the CPU run's overlap near 0 % is no fault
            assert "there are no GPU streams" in br.find_element("#findings-none").text
    assert_no_traceback(server)


# --- 4. a live page follows a run -------------------------------------------------------------------------

def _steps_shown(br: Any) -> int | None:
    """The newest step the Run table shows ('12', or '11–12' while the ranks differ)."""
    if not br.find_elements("#run-info"):
        return None
    numbers = [int(n) for n in re.findall(r"\d+", run_info(br).get("steps", ""))]
    return max(numbers) if numbers else None


@needs_browser
@pytest.mark.distributed
def test_a_live_page_follows_the_steps_and_says_when_the_run_ends(br: Any, tmp_path: Path) -> None:
    registry, run_dir, stop = tmp_path / "registry", tmp_path / "run", tmp_path / "STOP"
    log = tmp_path / "train.log"
    with log.open("wb") as out:  # a file, not a pipe: nobody reads it while the run trains
        train = subprocess.Popen(ranks_args(2, SCENARIOS / "live_train.py", "--stop-file", str(stop),
                                               "--max-seconds", "150", "--sleep", "0.1"),
                                 env=child_env(ZEROMON_OUT=str(run_dir), ZEROMON_REGISTRY=str(registry),
                                               ZEROMON_JOB="dash-live"),
                                 cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        # No arguments: the newest local run, found through the same user-level index as the agents.
        with Dashboard("--interval", "0.5", logs=tmp_path, env=child_env(ZEROMON_REGISTRY=str(registry))) as server:
            open_page(br, server.page(), elements=("overview-banners",))
            first = wait_until(lambda: _steps_shown(br), 150, "the Run table to show a step",
                               lambda: page_text(br)[-2000:] + server.stderr[-2000:])
            assert "dash-live" in run_info(br)["job"]
            # Each rank's endpoint is found and polled on its own: the first step shown may be one rank's
            # (seen once in CI: '1/2 ranks answering' at that moment); both answer while the run trains.
            wait_until(lambda: "2/2 ranks answering" in run_info(br)["ranks"], 30, "both ranks to answer",
                       lambda: str(run_info(br)) + server.stderr[-2000:])
            assert "live" in (text_of(br, "status") or "")
            wait_until(lambda: (s := _steps_shown(br)) is not None and s >= first + 3, 60,
                       f"the steps to grow past {first + 2}", lambda: page_text(br)[-2000:])
            wait_until(lambda: br.find_elements("#banner-exposed"), 30, "the exposed banner of a live run")
            screenshot(br, "overview-live")
            assert train.poll() is None
            stop.touch()
            assert train.wait(timeout=120) == 0, log.read_text(errors="replace")[-3000:]
            status = wait_until(lambda: "the run has ended" in (s := (text_of(br, "status") or "")) and s, 60,
                                "the page to say that the run ended", lambda: page_text(br)[-2000:])
            assert "its last data" in status
            last = _steps_shown(br)
            assert last is not None and last >= first + 3
            screenshot(br, "overview-live-ended")
            assert_clean_console(br, "the live overview")
        assert_no_traceback(server)
    finally:
        stop.touch()
        if train.poll() is None:
            try:
                train.wait(timeout=120)
            except subprocess.TimeoutExpired:
                train.kill()
                train.wait()


@needs_browser
@pytest.mark.distributed
def test_a_replay_fills_the_overview_step_by_step_until_its_end(br: Any, fsdp2_run: Path, logs: Path) -> None:
    """A replay is a live page whose source is a recording: the page moves on with it, and its counts
    (steps, findings) agree with what it lists."""
    from zeromon.sources.replay import ReplaySource

    duration_s = ReplaySource(fsdp2_run, speed=1.0).duration_ns / 1e9
    speed = max(duration_s / 10, 0.01)  # ~10 s of replay, whatever the recording's length
    with Dashboard("--replay", str(fsdp2_run), "--speed", f"{speed:.4g}", "--interval", "0.5", logs=logs) as server:
        open_page(br, server.page(), elements=("overview-banners",))
        seen: set[int] = set()

        def ended() -> bool:
            step = _steps_shown(br)
            if step is not None:
                seen.add(step)
            return "(ended)" in (text_of(br, "status") or "")

        wait_until(ended, 60, "the replay's end", lambda: page_text(br)[-2000:])
        wait_until(lambda: _steps_shown(br) == FSDP2_STEPS, 10, f"step {FSDP2_STEPS} in the Run table")
        assert len(seen) >= 3, f"the steps did not move on one by one: {sorted(seen)}"
        screenshot(br, "overview-replay-ended")
        heading = text_of(br, "overview-findings")
        listed = len(br.find_elements("#findings-list details.finding"))
        titles = br.driver.execute_script(
            "return Array.from(document.querySelectorAll('#page-overview h2')).map(h => h.innerText)")
        assert any(t.startswith(f"Findings ({listed}") for t in titles), (titles, heading)  # "(2 problems in 3 ..."
        assert_clean_console(br, "the overview of a replay")
    assert_no_traceback(server)



@needs_browser
@pytest.mark.distributed
def test_a_dashboard_started_before_its_runs_ranks_waits_for_them_and_shows_them_as_they_come(
        br: Any, tmp_path: Path) -> None:
    """`zeromon dashboard RUN_DIR` started beside `zeromon run --out RUN_DIR` (the README's two terminals), before
    the ranks exist: the page says which folder it waits for, then shows the ranks as they register."""
    run_dir, stop, log = tmp_path / "run", tmp_path / "STOP", tmp_path / "train.log"
    run_dir.mkdir()  # what `zeromon run --out` makes first
    with Dashboard(str(run_dir), "--interval", "0.5", logs=tmp_path) as server:
        open_page(br, server.page(), elements=("no-agent",))
        waiting = text_of(br, "no-agent") or ""
        assert f"Waiting for the ranks of {run_dir} to start" in waiting, waiting
        assert "waiting for the ranks of" in server.stderr
        with log.open("wb") as out:
            train = subprocess.Popen(ranks_args(2, SCENARIOS / "live_train.py", "--stop-file", str(stop),
                                                   "--max-seconds", "90", "--sleep", "0.1"),
                                     env=child_env(ZEROMON_OUT=str(run_dir)), cwd=REPO, stdout=out,
                                     stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: br.find_elements("#run-info") and "2/2 ranks answering" in run_info(br)["ranks"], 90,
                       "both ranks on the page", lambda: page_text(br)[-2000:] + server.stderr[-2000:])
            assert not br.find_elements("#no-agent")
            screenshot(br, "overview-waited")
        finally:
            stop.touch()
            assert train.wait(timeout=120) == 0, log.read_text(errors="replace")[-3000:]
        assert_clean_console(br, "the overview that waited for its run")
    assert_no_traceback(server)

@needs_browser
@pytest.mark.distributed
def test_at_256_ranks_the_findings_are_one_entry_per_problem_each_linking_its_worst_rank(
        br: Any, fleet256_run: Path, logs: Path) -> None:
    """A generated 256-rank run (conftest's fleet256_run: every rank's overlap poor, a straggler, a rank whose
    memory grows): the Overview lists each problem once, with its ranks, its spread and its worst rank, whose
    link opens that rank's page; the Ranks page's findings alike."""
    groups = group_findings(recording_data(fleet256_run).findings)
    assert sum(len(g.findings) for g in groups) > FLEET_RANKS > 10 > len(groups)
    entries_js = """return Array.from(document.querySelectorAll(arguments[0] + ' details.finding')).map(d => {
        const link = d.querySelector('a.rank-link'), worst = d.querySelector('li.worst');
        return {kind: d.dataset.kind, ranks: d.dataset.ranks, worst: d.dataset.worst,
                summary: d.querySelector('summary').innerText, worst_line: worst ? worst.innerText : null,
                link: link ? [link.innerText, link.getAttribute('href')] : null}; })"""
    with Dashboard(str(fleet256_run), logs=logs) as server:
        open_page(br, server.page(), graphs=("overview-grid-exposed",), elements=("findings-list",))
        screenshot(br, "overview-256-ranks")
        assert_clean_console(br, "the overview of 256 ranks")
        entries = br.driver.execute_script(entries_js, "#findings-list")
        assert [(e["kind"], e["ranks"], e["worst"], e["summary"]) for e in entries] == [
            (g.kind, g.ranks_text(), str(g.worst_rank), f"[{g.severity.value}] {g.title}") for g in groups]
        titles = br.driver.execute_script(
            "return Array.from(document.querySelectorAll('#page-overview h2')).map(h => h.innerText)")
        assert f"Findings ({len(groups)} problems in {sum(len(g.findings) for g in groups)} findings)" in titles
        for entry, group in zip(entries, groups, strict=True):  # every entry links its worst rank's page
            page = "communication" if group.kind in ("poor_overlap", "straggler", "step_skew") else "memory"
            assert entry["link"] == [f"rank {group.worst_rank}", f"/{page}?ranks={group.worst_rank}"], entry
            assert entry["worst_line"] == group.worst_words()
        overlap = next(g for g in groups if g.kind == "poor_overlap")
        assert len(overlap.ranks) >= FLEET_RANKS - 4
        assert re.fullmatch(r"ranks 0-255( but [\d, -]+)?", overlap.ranks_text()), overlap.ranks_text()
        assert re.search(r": \d+(-\d+)?% of step time is exposed communication$", overlap.title), overlap.title
        # The link opens the worst rank on its page (the page's own ranks control says it).
        br.find_element('#findings-list details[data-kind="poor_overlap"] a.rank-link').click()
        wait_until(lambda: br.driver.current_url.endswith(f"/communication?ranks={overlap.worst_rank}"), 30,
                   "the Communication page of the worst rank", lambda: br.driver.current_url)
        wait_until(lambda: dropdown_values(br, "communication-ranks") == [f"rank {overlap.worst_rank}"], 60,
                   "its ranks control naming it", lambda: page_text(br)[-2000:])
        # The Ranks page: its findings (the straggler's; the memory imbalance's) as entries too, linked alike.
        br.find_element("#nav-ranks").click()
        wait_until(lambda: br.find_elements("#ranks-waits-findings-list"), 60, "the Ranks page's findings",
                   lambda: page_text(br)[-2000:])
        waits = br.driver.execute_script(entries_js, "#ranks-waits-findings-list")
        expected = [g for g in groups if g.kind in ("straggler", "step_skew")]
        assert [(e["kind"], e["ranks"], e["summary"]) for e in waits] == [
            (g.kind, g.ranks_text(), f"[{g.severity.value}] {g.title}") for g in expected] and expected
        assert all(e["link"] == [f"rank {g.worst_rank}", f"/communication?ranks={g.worst_rank}"]
                   for e, g in zip(waits, expected, strict=True))
        assert_clean_console(br, "the Communication and Ranks pages of 256 ranks")
    assert_no_traceback(server)


# --- 5. the URL's state ----------------------------------------------------------------------------------

@needs_browser
@pytest.mark.distributed
def test_a_communication_link_opens_on_its_ranks_and_step(br: Any, fsdp2_dashboard: Dashboard) -> None:
    open_page(br, fsdp2_dashboard.page("communication?ranks=0,1&step=3"), graphs=("comm-timeline",))
    assert br.find_element("#communication-step").get_attribute("value") == "3"
    timeline = figure(br, "comm-timeline")
    assert timeline["layout"]["meta"]["step"] == 2 and title(timeline).startswith("Step 3:")
    assert sorted(dropdown_values(br, "communication-ranks")) == ["rank 0", "rank 1"]
    assert br.driver.current_url.endswith("/communication?ranks=0,1&step=3")  # the link stays as given
    assert_clean_console(br, "communication?ranks=0,1&step=3")


@needs_browser
@pytest.mark.distributed
def test_a_memory_link_opens_on_its_rank(br: Any, fsdp2_dashboard: Dashboard) -> None:
    open_page(br, fsdp2_dashboard.page("memory?ranks=1"), graphs=("memory-stack",))
    assert dropdown_values(br, "memory-ranks") == ["rank 1"]
    ranks = {t["meta"]["rank"] for t in figure(br, "memory-stack")["data"] if "rank" in (t.get("meta") or {})}
    assert ranks == {1}
    assert br.driver.current_url.endswith("/memory?ranks=1")
    assert_clean_console(br, "memory?ranks=1")


# --- 6. serving: a token, a path prefix --------------------------------------------------------------------

@needs_browser
@pytest.mark.distributed
def test_a_token_guards_the_page_and_the_browser_opens_it_once_with_the_token(br: Any, fsdp2_run: Path,
                                                                               logs: Path) -> None:
    with Dashboard(str(fsdp2_run), "--token", "s3cret", logs=logs) as server:
        status, body = http_get(server.page())
        assert status == 401 and "?token=" in body
        assert http_get(server.page("_dash-layout"))[0] == 401
        status, _ = http_get(server.page(), headers={"Authorization": "Bearer s3cret"})
        assert status == 200
        open_page(br, server.page("?token=s3cret"), graphs=("overview-grid-risk",), elements=("banner-exposed",))
        assert br.driver.current_url == server.page()  # the token went into a cookie, out of the URL
        assert br.driver.get_cookie("zeromon_token")["value"] == "s3cret"
        open_page(br, server.page("memory"), graphs=("memory-stack",))  # the cookie carries the next pages
        screenshot(br, "memory-with-token")
        assert_clean_console(br, "pages behind a token")
        br.driver.delete_all_cookies()
    assert_no_traceback(server)


@needs_browser
@pytest.mark.distributed
def test_a_path_prefix_serves_the_page_under_it(br: Any, fsdp2_run: Path, logs: Path) -> None:
    prefix = "/user/me/proxy/8050/"
    with Dashboard(str(fsdp2_run), "--path-prefix", prefix, logs=logs) as server:
        assert server.url.endswith(prefix)
        open_page(br, server.page(), graphs=("overview-grid-risk",), elements=("banner-exposed",))
        assert_clean_console(br, "the overview under a prefix")
        # The page's own requests (scripts, layout, callbacks) all carry the prefix.
        base = server.url.split(prefix)[0]
        requests = br.driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        own = [r for r in requests if r.startswith(base)]
        assert any("_dash-update-component" in r for r in own)
        assert own and all(r.startswith(base + prefix) for r in own), own
        # The nav's links keep the prefix, and a click goes there.
        hrefs = [a.get_attribute("href") for a in br.find_elements("#nav a")]
        assert hrefs and all(h.startswith(server.url) for h in hrefs), hrefs
        br.find_element("#nav-communication").click()
        wait_until(lambda: br.driver.execute_script(
            "const g = document.querySelector('#comm-timeline .js-plotly-plot'); return !!(g && g.data)"), 30,
            "the Communication page under the prefix")
        assert br.driver.current_url.startswith(base + prefix + "communication")
        screenshot(br, "communication-under-prefix")
        assert_clean_console(br, "the communication page under a prefix")
    assert_no_traceback(server)


# --- 7. the CLI's failure paths ---------------------------------------------------------------------------

def test_a_missing_run_folder_exits_2_with_a_message() -> None:
    result = zeromon("dashboard", "/no/such/dir", "--port", str(free_port()), timeout=120)
    assert result.returncode == 2
    assert "RUN_DIR /no/such/dir: no such run folder" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_trace_on_a_folder_without_traces_exits_2(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a trace")
    result = zeromon("dashboard", "--trace", str(tmp_path), "--port", str(free_port()), timeout=120)
    assert result.returncode == 2
    assert "no trace files" in result.stderr and str(tmp_path) in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@needs_browser
def test_an_unreachable_prometheus_shows_the_error_in_the_page(br: Any, logs: Path) -> None:
    closed = free_port()  # bound a moment ago, nothing listens there now
    with Dashboard("--prometheus", f"http://127.0.0.1:{closed}", "--interval", "0.5", logs=logs) as server:
        open_page(br, server.page(), elements=("overview-banners",))
        # "not polled yet" first, then the poll's answer.
        error = wait_until(lambda: "refused" in (e := text_of(br, "source-error-text") or "") and e, 30, "the connection's error in the page", lambda: page_text(br)[-2000:])
        assert f"127.0.0.1:{closed}" in error and "connection refused" in error
        screenshot(br, "overview-prometheus-down")
        assert "Traceback" not in page_text(br)
        assert_clean_console(br, "the page of an unreachable Prometheus")
    assert server.proc is not None and server.proc.returncode == 0  # Ctrl-C: a clean stop
    assert "connection refused" in server.stderr  # the terminal says what the page says
    assert_no_traceback(server)
