"""What `zeromon report` and `zeromon summary` make of the folders users hand them: several runs' rank
files in one folder, corrupt lines, a rank file instead of its folder, profiler traces with --html."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zeromon.errors import ZeromonError
from zeromon.model import read_run
from zeromon.sources.run_analysis import analyse_run

from conftest import REPO, ranks_args, zeromon

A100_TRACE = REPO / "tests" / "data" / "kineto" / "a100-w2-rank0.json.gz"

# fsdp2_run: conftest's, the session's one FSDP2 run (these tests read it and copy it, never change it).


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory, fsdp2_run: Path) -> Path:
    """Another run, of plain torch.distributed, under the FSDP2 run's job name and world size: only
    the framework its RunInfo names tells the two apart."""
    out = tmp_path_factory.mktemp("inputs") / "plain"
    job = json.loads((fsdp2_run / "rank-0.jsonl").open().readline())["job"]
    result = zeromon("run", "--quiet", "--job", job, "--out", str(out), "--",
                     *ranks_args(2, REPO / "tests" / "scenarios" / "straggler.py", "--steps", "2",
                                    "--extra-mb", "0"), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _refused(folder: Path, message: str) -> None:
    """Every reader of a run folder refuses it, with one line naming the files and a hint."""
    for args in (("report", str(folder)), ("report", str(folder), "--json"), ("summary", str(folder)),
                 ("report", str(folder), "--html", str(folder.parent / "page.html"))):
        result = zeromon(*args)
        assert result.returncode == 2 and result.stdout == "", args
        error, hint = result.stderr.splitlines()
        assert error.startswith("zeromon: error: ") and message in error, (args, error)
        assert hint.startswith("hint: "), args
    with pytest.raises(ZeromonError, match=message):
        read_run(folder)
    for workers in (1, 2):  # the parallel path checks what its workers read, in this process
        with pytest.raises(ZeromonError, match=message):
            analyse_run(folder, workers=workers)


@pytest.mark.distributed
def test_rank_files_of_two_runs_are_refused(fsdp2_run: Path, plain_run: Path, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(fsdp2_run / "rank-0.jsonl", mixed)
    shutil.copy(plain_run / "rank-1.jsonl", mixed)
    _refused(mixed, f"{mixed}/rank-0.jsonl and {mixed}/rank-1.jsonl are from different runs: "
                    "framework 'fsdp2' and 'none'")

    copied = tmp_path / "copied"  # cp rank-0.jsonl rank-1.jsonl: rank 0 twice
    copied.mkdir()
    shutil.copy(fsdp2_run / "rank-0.jsonl", copied / "rank-0.jsonl")
    shutil.copy(fsdp2_run / "rank-0.jsonl", copied / "rank-1.jsonl")
    _refused(copied, f"{copied}/rank-1.jsonl: the header says rank 0, the file name rank 1")

    kept = tmp_path / "kept"  # a backup beside the file it backs up
    shutil.copytree(fsdp2_run, kept)
    shutil.copy(kept / "rank-1.jsonl", kept / "rank-1-old.jsonl")
    _refused(kept, "rank-1.jsonl are both rank 1")


@pytest.mark.distributed
def test_corrupt_lines_are_reported_with_their_numbers(fsdp2_run: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged"
    shutil.copytree(fsdp2_run, damaged)
    path = damaged / "rank-1.jsonl"
    lines = path.read_text().splitlines()
    bad = [10, 20, 30, 40, 50, 60, 70]
    for lineno in bad:
        lines.insert(lineno - 1, '["collective", 1, 2')  # a write cut short
    lines[-1] = lines[-1][: len(lines[-1]) // 2]  # the crash mid-write of the last line
    bad.append(len(lines))
    path.write_text("\n".join(lines) + "\n")

    note = "rank-1.jsonl: 8 corrupt lines skipped (lines 10, 20, 30, 40, 50 and 3 more"
    report = zeromon("report", str(damaged))
    # The line cut short was the rank's end record: the report says the rank was cut off, exit 3.
    assert report.returncode == 3, report.stderr
    assert any(line.startswith(note) for line in report.stdout.splitlines()), report.stdout
    assert "rank-0.jsonl" not in report.stdout and "rank 1 died" in report.stdout
    as_json = zeromon("report", str(damaged), "--json")
    ranks = json.loads(as_json.stdout)["ranks"]
    assert [r["corrupt_lines"] for r in ranks] == [[], bad]
    assert ranks[1]["file"] == str(path)
    summary = zeromon("summary", str(damaged))
    assert summary.returncode == 3, summary.stderr
    assert any(line.startswith(note) for line in summary.stdout.splitlines()), summary.stdout
    assert "corrupt lines\n" not in summary.stdout

    lines = path.read_text().splitlines()  # one corrupt line only
    del lines[9:70:10]
    path.write_text("\n".join(lines) + "\n")
    assert f"rank-1.jsonl: 1 corrupt line skipped (line {len(lines)})" in zeromon("summary", str(damaged)).stdout


@pytest.mark.distributed
def test_a_rank_file_is_not_a_run_folder(fsdp2_run: Path) -> None:
    for command in ("report", "summary"):
        result = zeromon(command, str(fsdp2_run / "rank-0.jsonl"))
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            f"zeromon: error: {fsdp2_run}/rank-0.jsonl: is a file; a run is the folder of rank-<r>.zmr (or .jsonl) files",
            f"hint: pass the folder that holds it: {fsdp2_run}"]


def test_trace_report_html_and_units(tmp_path: Path) -> None:
    page = tmp_path / "trace.html"
    result = zeromon("report", "--trace", str(A100_TRACE), "--html", str(page))
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[2].split()
    assert header[:5] == ["rank", "iterations", "overlap", "exposed", "ms/iter"]
    assert f"wrote {page}" in result.stdout
    # What the table leaves out is said: HTA's dropped last step, and the ranks with no trace here.
    assert "note: the last profiler step (ProfilerStep#6) and what it launched are left out, as Holistic Trace " \
           "Analysis does (the profiler may stop in the middle of it)" in result.stdout.splitlines()
    assert "note: 1 of a world of 2 ranks (rank 0); the others' traces are not among those read" \
           in result.stdout.splitlines()
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and 'src="http' not in html
    for figure in ("zeromon-trace-breakdown", "zeromon-trace-overlap", "zeromon-trace-iterations"):
        assert f'id="{figure}"' in html
    # The JSON in seconds, as a recording's report: HTA's microseconds / 1e6.
    (rank,) = json.loads(zeromon("report", "--trace", str(A100_TRACE), "--json").stdout)["ranks"]
    assert rank["temporal_breakdown"]["kernel_time_s"] == pytest.approx(0.435586)
    assert not [key for key in rank["temporal_breakdown"] if key.endswith("_us")]
    assert rank["median_iteration_exposed_comm_s"] < rank["exposed_comm_s"]


@pytest.mark.parametrize(("args", "message"), [
    (("--peak-busbw", "200GB"), "zeromon: error: --peak-busbw is for recordings (RUN_DIR): the trace analysis has "
                                "no bandwidth table"),
    (("--capacity", "80GiB"), "zeromon: error: --capacity is for recordings (RUN_DIR): the trace analysis has no "
                              "memory forecast"),
    (("--html", ""), "zeromon: error: --html: give the file to write, e.g. --html report.html"),
])
def test_flags_a_trace_has_no_use_for_are_refused(args: tuple[str, ...], message: str) -> None:
    result = zeromon("report", "--trace", str(A100_TRACE), *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [message]


def test_summary_help_says_what_it_shows() -> None:
    result = zeromon("summary", "--help")
    assert result.returncode == 0
    assert "A first look at a recorded run" in result.stdout
    assert "a run folder written by `zeromon run --out RUN_DIR`" in " ".join(result.stdout.split())


def test_a_folder_of_profiler_traces_given_as_a_run_points_to_trace(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(A100_TRACE, traces)
    for command in ("report", "summary"):
        result = zeromon(command, str(traces))
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.splitlines() == [
            f"zeromon: error: {traces}: no rank-<r>.zmr (or .jsonl) recordings in this folder; it holds 1 .json/.json.gz "
            "file, profiler traces?",
            f"hint: for PyTorch profiler traces: zeromon report --trace {traces}"]
    # A folder with neither: the hint is to record a run.
    empty = tmp_path / "empty"
    empty.mkdir()
    result = zeromon("report", str(empty))
    assert result.returncode == 2
    assert result.stderr.splitlines()[1] == "hint: record a run with `zeromon run --out DIR -- CMD ...`"
