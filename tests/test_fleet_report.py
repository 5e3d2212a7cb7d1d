"""`zeromon report` at fleet scale: a run generated from a real 2-rank recording (tests/bench/gen_fleet_run.py)
reads as one run and its summarised text names the stragglers and the growing-memory rank first; the
columnar paths (StepTable, the step-time matrix) give the numbers the per-object code gives."""

from __future__ import annotations

import dataclasses
import html
import io
import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromon.analysis.recording_summary import summarize_recording, summarize_run
from zeromon.analysis.step_overlap import StepOverlap, overlap_of_summary, step_overlaps
from zeromon.analysis.step_skew import step_times_across_ranks, step_times_python
from zeromon.analysis.step_table import StepTable, step_table, summary_columns
from zeromon.analysis.stragglers import _step_arrays, rank_arrivals
from zeromon.commands.progress import Progress
from zeromon.model.codec import read_run
from zeromon.model.events import StepSummary
from zeromon.model.rank_pool import map_rank_files
from zeromon.model.units import parse_rank_ranges

from conftest import FLEET_RANKS, REPO, zeromon

sys.path.insert(0, str(REPO / "tests" / "bench"))
import gen_fleet_run  # noqa: E402

RANKS, STEPS = 24, 200  # past the 16 ranks a report shows one by one


@pytest.fixture(scope="module")
def fleet_run(fsdp2_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fleet") / "run"
    gen_fleet_run.generate(fsdp2_run, out, RANKS, STEPS, workers=1)
    return out


def _table_ranks(text: str) -> list[int]:
    """The ranks of the per-rank table's lines, in order."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("rank  framework"))
    ranks = []
    for line in lines[start + 1:]:
        head = line.split()
        if not head or not head[0].isdigit():
            break
        ranks.append(int(head[0]))
    return ranks


def test_a_generated_fleet_reads_as_one_run_and_its_report_names_the_stragglers_and_growing_rank_first(
        fleet_run: Path) -> None:
    roles = gen_fleet_run.fleet_roles(RANKS)
    recordings = read_run(fleet_run)  # refuses files of different runs
    assert [r.rank for r in recordings] == list(range(RANKS))
    assert {r.run_info.world_size for r in recordings if r.run_info} == {RANKS}
    assert {r.header["run_id"] for r in recordings} == {recordings[0].header["run_id"]}
    assert all(len(r.steps) == STEPS for r in recordings)
    kept = {c.step for c in recordings[0].collectives}
    assert kept == {s for s in range(STEPS) if gen_fleet_run.is_detail_step(s, STEPS)}

    result = zeromon("report", str(fleet_run))
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert f"({RANKS} of {RANKS} ranks)" in text
    shown = _table_ranks(text)
    assert len(shown) == 16 and shown[0] == roles.growing_memory
    assert f"… and {RANKS - 16} more ranks within" in text
    assert set(shown[1:3]) == set(roles.stragglers)  # furthest from the median exposed share after the risk
    stragglers = text[text.index("\nstragglers ("):].splitlines()[2:4]
    assert {int(line.split()[1].rstrip(":")) for line in stragglers} == set(roles.stragglers)
    # The straggler's finding leads with what the others lost, and their exposed communication with it
    # (alone, "] the other ranks waited ..."; one entry with the second straggler's at one severity, "] ranks 8,
    # 17: the other ranks waited for them, 8-17% of their step time", the first straggler its worst rank).
    first = roles.stragglers[0]
    assert re.search(rf"\] the other ranks waited [\d.]+ m?s for rank {first}, \d+% of their step time", text) or \
        re.search(rf"\] ranks {min(roles.stragglers)}, {max(roles.stragglers)}: the other ranks waited for them, "
                  rf"[\d-]+% of their step time\n +worst: rank {first} \(\d+%\)", text), text
    assert re.search(r"remedy: part of it is waiting for ranks? [\d, ]*" + str(first), text), text
    # The poor-overlap findings of (nearly) every rank: an entry per severity and cause (waiting for a straggler
    # or not), each rank in one, (nearly) every rank in the first.
    entries = [parse_rank_ranges(ranks) for ranks in
               re.findall(r"\] (ranks? [^:]+): [\d-]+% of step time is exposed communication", text)]
    assert 1 <= len(entries) <= 4 and len(entries[0]) >= RANKS - 4, entries
    assert len({r for ranks in entries for r in ranks}) == sum(map(len, entries)) >= RANKS - 2

    every = zeromon("report", "--all-ranks", str(fleet_run))
    assert _table_ranks(every.stdout) == list(range(RANKS))
    assert every.stdout.count("of step time is exposed communication") >= RANKS - 2
    document = json.loads(zeromon("report", "--json", str(fleet_run)).stdout)
    assert [r["rank"] for r in document["ranks"]] == list(range(RANKS))
    assert all(len(r["per_step"]) == STEPS for r in document["ranks"])


def test_a_step_without_detail_takes_the_overlap_its_summary_carries(fleet_run: Path) -> None:
    rec = read_run(fleet_run)[3]
    table = step_table(rec)
    by_step = {s.step: s for s in rec.steps}
    alone = [s for s in range(STEPS) if not gen_fleet_run.is_detail_step(s, STEPS)]
    assert alone and all(table[s] == overlap_of_summary(by_step[s]) for s in alone)
    assert table[alone[0]].exposed_comm_s > 0.01  # the peers' wait, not an empty window's zero
    detail = [s for s in range(STEPS) if gen_fleet_run.is_detail_step(s, STEPS)]
    from_events = {o.step: o for o in step_overlaps(rec, [by_step[s] for s in detail])}
    assert all(table[s] == from_events[s] for s in detail)


def test_the_columns_give_the_per_object_numbers_on_a_real_recording(fsdp2_run: Path) -> None:
    recordings = read_run(fsdp2_run)
    for rec in recordings:
        objects = step_overlaps(rec)
        table = step_table(rec)
        assert list(table) == list(objects) and table == objects
        steady = [s for s in objects if s.step >= 1]
        for name in ("step_s", "exposed_comm_s", "blocked_s"):
            assert table.steady_median(name) == statistics.median(getattr(s, name) for s in steady)
        assert table.steady_median("exposed_share") == statistics.median(s.exposed_share for s in steady)
        assert table.steady_sum("exposed_comm_s") == sum(s.exposed_comm_s for s in steady)
    parts = [rank_arrivals(rec) for rec in recordings]
    arrays = [_step_arrays(p) for p in parts]
    ranks = [p.rank for p in parts]
    assert step_times_across_ranks(ranks, arrays, 1) == step_times_python(ranks, arrays, 1)


_seconds = st.floats(min_value=0.0, max_value=5.0, allow_nan=False)


@st.composite
def _summaries(draw: st.DrawFn) -> list[StepSummary]:
    out, t = [], 1_000_000_000
    for step in range(draw(st.integers(1, 30))):
        length = draw(st.integers(0, 10**9))
        comm, comp, overlap = draw(_seconds), draw(_seconds), draw(_seconds)
        agent = draw(st.one_of(st.none(), _seconds))
        out.append(StepSummary(rank=0, step=step, start_ns=t, end_ns=t + length,
                               phase_s={} if agent is None else {"agent": agent}, collectives=0, comm_bytes=0,
                               comm_bytes_by_op={}, comm_union_s=comm, blocked_s=draw(_seconds), peak_memory=None,
                               comp_s=comp, overlap_s=overlap, exposed_comm_s=draw(_seconds)))
        t += length
    return out


@settings(max_examples=150, deadline=None)
@given(_summaries())
def test_the_summary_columns_are_the_per_summary_arithmetic(summaries: list[StepSummary]) -> None:
    steps, values = summary_columns(summaries)
    table = StepTable(0, steps, values)
    reference = [overlap_of_summary(s) for s in summaries]
    assert list(table) == reference
    steady = [o for o in reference if o is not None and o.step >= 1] or [o for o in reference if o is not None]
    shares = [o.exposed_share for o in steady if o.exposed_share is not None]
    ratios = [o.overlap_ratio for o in steady if o.overlap_ratio is not None]
    assert table.steady_median("exposed_share") == (statistics.median(shares) if shares else None)
    assert table.steady_median("overlap_ratio") == (statistics.median(ratios) if ratios else None)
    assert table.steady_median("idle_s") == statistics.median(o.idle_s for o in steady)
    assert table.steady_sum("step_s") == sum(o.step_s for o in steady)


@st.composite
def _fleet_steps(draw: st.DrawFn) -> tuple[list[int], list[tuple[list[int], list[float], list[int] | None]]]:
    n = draw(st.integers(1, 6))
    durations = st.sampled_from([0.0, 0.1, 0.1, 0.2, 0.25, 1.0])  # ties, zeros: the order of maxima matters
    arrays = []
    for _ in range(n):
        steps = draw(st.lists(st.integers(0, 12), min_size=0, max_size=12, unique=draw(st.booleans())))
        seconds = [draw(durations) for _ in steps]
        detail = draw(st.one_of(st.none(), st.lists(st.integers(0, 1), min_size=len(steps), max_size=len(steps))))
        arrays.append((steps, seconds, detail))
    return list(range(n)), arrays


@settings(max_examples=300, deadline=None)
@given(_fleet_steps(), st.integers(0, 1))
def test_the_step_time_matrix_is_the_per_value_reference(
        fleet: tuple[list[int], list[tuple[list[int], list[float], list[int] | None]]], first_step: int) -> None:
    ranks, arrays = fleet
    fast, slow = step_times_across_ranks(ranks, arrays, first_step), step_times_python(ranks, arrays, first_step)
    assert fast == slow
    assert list(fast.slowest) == list(slow.slowest)  # the JSON's order too


def test_progress_says_nothing_for_quick_work_and_a_line_a_while_without_a_terminal() -> None:
    quiet = io.StringIO()
    with Progress("ranks read and analysed", stream=quiet) as progress:
        progress(1, 2)
    assert quiet.getvalue() == ""
    log = io.StringIO()
    with Progress("ranks read and analysed", stream=log, show_after_s=0.0, line_every_s=3600.0) as progress:
        for done in range(1, 5):
            progress(done, 4)
    assert log.getvalue().splitlines() == [line for line in log.getvalue().splitlines() if line.startswith("zeromon: ")]
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == [
        "zeromon: 1 of 4 ranks read and analysed", "zeromon: 4 of 4 ranks read and analysed"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_on_a_terminal() -> None:
    screen = _Terminal()
    with Progress("ranks read and analysed", stream=screen, show_after_s=0.0) as progress:
        progress(3, 8)
    assert "ranks read and analysed" in screen.getvalue() and "3/8" in screen.getvalue()


def test_a_step_table_is_the_sequence_it_stands_for() -> None:
    rows = [StepOverlap(rank=2, step=i, step_s=0.1 * i, comm_s=0.05, comp_s=0.04, overlap_s=0.01,
                        exposed_comm_s=0.04, idle_s=0.0, blocked_s=0.04, agent_s=0.001) for i in range(5)]
    table = StepTable.of(2, rows)
    assert table[-1] == rows[-1] and table[1:3] == rows[1:3] and len(table) == 5 and table.last_step == 4
    assert np.array_equal(table.column("step_s"), [0.1 * i for i in range(5)])
    with pytest.raises(IndexError):
        table[5]


def test_summary_of_a_fleet_shows_the_ranks_furthest_from_the_median_first_and_the_rest_in_a_line(
        fleet_run: Path) -> None:
    roles = gen_fleet_run.fleet_roles(RANKS)
    result = zeromon("summary", str(fleet_run))
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert f"({RANKS} of {RANKS} ranks recorded)" in text
    shown = _table_ranks(text)
    # The growing rank's peak memory, then the stragglers' time blocked (a late rank waits less: its peers wait for
    # it). The first (late in 3 steps of 4) is off its peers' median by most of its delay, which is at least the
    # spread of the source's blocked time: every peer's blocked time in those steps is past all of the source's.
    # The second (late in 1 of 4) is off by anything from nothing to more than the first, as that spread lets
    # its few late steps move its median. The other ranks differ by their jitter and memory offsets only. The
    # report's arrival analysis names both (the test above).
    assert len(shown) == 16 and shown[0] == roles.growing_memory
    assert shown[1] in roles.stragglers and roles.stragglers[0] in shown[1:3], (shown, roles)
    rest = next(line for line in text.splitlines() if line.startswith("… and "))
    assert rest.startswith(f"… and {RANKS - 16} more ranks") and "--all-ranks" in rest
    every = zeromon("summary", "--all-ranks", str(fleet_run))
    assert every.returncode == 0 and _table_ranks(every.stdout) == list(range(RANKS))
    assert "… and " not in every.stdout


def test_summarize_run_reads_each_rank_in_a_worker_and_tells_its_progress(fleet_run: Path) -> None:
    """The workers' summaries (step summaries read as columns) are those of the recordings read whole here
    (as objects), in rank order, and the progress is told once a rank."""
    told: list[tuple[int, int]] = []
    in_workers = summarize_run(fleet_run, workers=2, progress=lambda done, total: told.append((done, total)))
    here = summarize_run(fleet_run, workers=1)
    assert in_workers == here
    assert list(in_workers.ranks) == [summarize_recording(rec) for rec in read_run(fleet_run)]
    assert told == [(done, RANKS) for done in range(1, RANKS + 1)]
    # Each rank's end read by the worker that read it: every rank ended cleanly, through its last step.
    assert [(end.rank, end.state, end.recorded_through) for end in in_workers.ends] == [
        (rank, "clean", STEPS - 1) for rank in range(RANKS)]


def test_a_replay_and_the_dashboards_load_tell_their_progress(fleet_run: Path, tmp_path: Path) -> None:
    from zeromon.sources.replay import ReplaySource
    from zeromon.views.run_data import ReplayFeed, recording_data

    told: list[tuple[int, int]] = []
    ReplaySource(fleet_run, progress=lambda done, total: told.append((done, total)))
    assert told == [(done, RANKS) for done in range(1, RANKS + 1)]
    told.clear()
    ReplayFeed(fleet_run, progress=lambda done, total: told.append((done, total)))
    assert told == [(done, 2 * RANKS) for done in range(1, 2 * RANKS + 1)]
    # The dashboard's recording is read by a forked loader process: its progress is told there, on the
    # stderr it shares (here a file, a line each time), one read a rank (its analysis, its history and its
    # part of the final view, all made by the worker that read it).
    log = tmp_path / "progress.log"
    with open(log, "w") as stream:
        data = recording_data(fleet_run, progress=Progress("rank reads", stream=stream, show_after_s=0.0,
                                                           line_every_s=0.0))
    assert len(data.histories) == RANKS
    told_there = [int(line.split()[1]) for line in log.read_text().splitlines()]
    assert told_there == list(range(1, RANKS + 1)), log.read_text()[-2000:]
    source = ReplaySource(fleet_run)
    assert data.fleet.ranks == tuple(dataclasses.replace(rank, ended=True)
                                     for rank in source.view_at(source.duration_ns).ranks)


def test_the_html_page_of_a_fleet_draws_the_ranks_the_text_shows_first(fleet_run: Path, tmp_path: Path) -> None:
    """`zeromon report --html` of many ranks: the text as without --html, and figures of the 16 ranks it shows
    first (each read again for its figures), not of every rank."""
    roles = gen_fleet_run.fleet_roles(RANKS)
    page = tmp_path / "fleet.html"
    result = zeromon("report", "--html", str(page), str(fleet_run))
    assert result.returncode == 0, result.stderr[-2000:]
    shown = _table_ranks(result.stdout)
    assert shown == _table_ranks(zeromon("report", str(fleet_run)).stdout)
    text = page.read_text()
    assert "the figures draw the 16 ranks furthest from the median rank" in text
    drawn = {int(rank) for rank in re.findall(r"rank (\d+): exposed comm \(ms\)", text)}
    assert drawn == set(shown) and roles.growing_memory in drawn and set(roles.stragglers) <= drawn


def test_at_256_ranks_report_and_live_list_one_entry_per_problem(fleet256_run: Path, tmp_path: Path) -> None:
    """The same grouping (zeromon.analysis.finding_groups) in `zeromon report`'s text, --json and --html and in
    `zeromon live`'s lines and --json: each finding in one entry, an entry per kind, severity and remedies, with its
    ranks, the spread of its figure, its worst rank."""
    page = tmp_path / "fleet256.html"
    result = zeromon("report", "--html", str(page), str(fleet256_run))
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(zeromon("report", "--json", str(fleet256_run)).stdout)
    findings, groups = document["findings"], document["finding_groups"]
    assert len(findings) > FLEET_RANKS and sum(g["findings"] for g in groups) == len(findings)
    for g in groups:  # each entry is the findings of its kind, severity and remedies on its ranks
        mine = [f for f in findings if f["rank"] in g["ranks"] and (f["kind"], f["severity"], f["remedies"]) ==
                (g["kind"], g["severity"], g["remedies"])]
        assert len(mine) == g["findings"] and sorted(f["rank"] for f in mine) == g["ranks"]
        assert parse_rank_ranges(g["ranks_text"]) == tuple(g["ranks"])
        if g["figure"] is not None:
            values = {f["rank"]: f["metrics"][g["figure"]["metric"]] for f in mine}
            assert (g["figure"]["low"], g["figure"]["high"]) == (min(values.values()), max(values.values()))
            assert values[g["worst_rank"]] == max(values.values())
    keys = [(g["kind"], g["severity"], tuple(g["remedies"])) for g in groups]
    assert len(keys) == len(set(keys))  # no two entries that could have been one
    (overlap, *_) = [g for g in groups if g["kind"] == "poor_overlap"]
    assert len(overlap["ranks"]) >= FLEET_RANKS - 4 and overlap["title"].startswith(overlap["ranks_text"] + ": ")
    assert re.fullmatch(r"ranks [\d, -]+(but [\d, -]+)?: \d+(-\d+)?% of step time is exposed communication",
                        overlap["title"]), overlap["title"]

    text = result.stdout.splitlines()
    for g in groups:  # the text: one heading an entry, its worst rank under it where it has several
        at = text.index(f"  [{g['severity']}] {g['title']}")
        if len(g["ranks"]) > 1:
            assert text[at + 1] == f"      worst: rank {g['worst_rank']} ({g['worst_figure']}); the evidence is " \
                                   f"rank {g['worst_rank']}'s"
    assert sum("of step time is exposed communication" in line for line in text) == \
        sum(g["kind"] == "poor_overlap" for g in groups)
    said = html.unescape(page.read_text())
    for g in groups:  # the page: an item an entry, its rank count with it
        assert said.count(f"[{g['severity']}] {g['title']}<") == 1
        assert f'data-kind="{g["kind"]}" data-ranks="{len(g["ranks"])}"' in said

    live = zeromon("live", "--replay", str(fleet256_run), "--once")
    assert live.returncode == 0, live.stderr[-2000:]
    live_document = json.loads(zeromon("live", "--replay", str(fleet256_run), "--once", "--json").stdout)
    live_groups, across = live_document["finding_groups"], live_document["cross_rank_findings"]
    # Live has each rank's own findings and, as the TUI, those found from every rank's steps and peaks (the
    # straggler and memory imbalance: cross_rank_findings); not the report's remedy of waiting for the straggler,
    # which comes from every rank's collectives. The same grouping of them all.
    roles = gen_fleet_run.fleet_roles(FLEET_RANKS)
    assert {(f["kind"], f["rank"]) for f in across} == {("straggler", roles.stragglers[0]),
                                                        ("memory_imbalance", roles.growing_memory)}
    assert sum(g["findings"] for g in live_groups) == \
        sum(len(r["findings"]) for r in live_document["ranks"]) + len(across)
    for kind, rank in (("straggler", roles.stragglers[0]), ("memory_imbalance", roles.growing_memory)):
        (group,) = [g for g in live_groups if g["kind"] == kind]
        assert group["ranks"] == [rank] and group["severity"] in ("warn", "critical")
    shown = [g for g in live_groups if g["severity"] in ("warn", "critical")]
    lines = [line for line in live.stdout.splitlines() if line.startswith(("warn: ", "critical: "))]
    assert len(lines) == len(shown) < 10
    for g in shown:
        worst = f" (worst: rank {g['worst_rank']} ({g['worst_figure']}))" if len(g["ranks"]) > 1 else ""
        assert f"{g['severity']}: {g['title']}{worst}" in lines
    (live_overlap, *_) = [g for g in live_groups if g["kind"] == "poor_overlap"]
    assert len(live_overlap["ranks"]) >= FLEET_RANKS - 4 and live_overlap["worst_rank"] in live_overlap["ranks"]


def test_a_256_rank_replay_says_how_its_ranks_ended_in_one_line_per_status(fleet256_run: Path) -> None:
    """`zeromon live --replay --once` of 256 ranks that all reached the end of their recordings: one line says
    so for all of them, where each rank had its own; the table keeps a row per rank."""
    live = zeromon("live", "--replay", str(fleet256_run), "--once")
    assert live.returncode == 0, live.stderr[-2000:]
    lines = live.stdout.splitlines()
    ended = [line for line in lines if line.endswith("the recording ended")]
    assert ended == [f"ranks 0-{FLEET_RANKS - 1}: the recording ended"]
    rows = [line.split() for line in lines if line.endswith(".zmr")]
    assert len(rows) == FLEET_RANKS  # a row a rank, its target last
    assert {row[1] for row in rows} == {"ended"}  # each rank's final state, not "stale 0s"


def _name_and_size(path: Path) -> tuple[str, int]:
    return path.name, path.stat().st_size


class _Leave:
    """An on_result that notes each result and leaves its name only."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __call__(self, result: tuple[str, int]) -> tuple[str, int]:
        self.seen.append(result)
        return result[0], 0


def test_map_rank_files_keeps_what_on_result_leaves_in_the_files_order(fleet_run: Path) -> None:
    """Results come back as workers finish; ``on_result`` sees each once, and its value is kept, in the files'
    order (the dashboard's loader sends each history on and keeps nothing of it)."""
    files = sorted(fleet_run.glob("rank-*"), key=lambda p: int(p.stem.split("-")[1]))
    for workers in (1, 2):
        leave = _Leave()
        kept = map_rank_files(files, _name_and_size, workers=workers, on_result=leave)
        assert kept == [(path.name, 0) for path in files]
        assert sorted(leave.seen) == sorted(_name_and_size(path) for path in files)
