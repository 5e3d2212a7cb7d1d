"""`zeromon report` on a real recorded 2-rank FSDP2 run and on profiler traces, through the real CLI."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from bench.bench_analysis import write_recording

from zeromon.analysis.report import build_report
from zeromon.analysis.stragglers import analyze_imbalance
from zeromon.errors import ZeromonError
from zeromon.exporters.html_report import MEANING_COLOURS, PHASE_COLOURS
from zeromon.model import read_run
from zeromon.model.codec import Recording
from zeromon.model.events import phase_words
from zeromon.sources.run_analysis import analyse_run

from conftest import EXAMPLES, REPO, child_env, ranks_args, zeromon


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "run"
    result = zeromon("run", "--quiet", "--out", str(out), "--",
                     *ranks_args(2, EXAMPLES / "fsdp2_train.py", "--steps", "5", "--async-unshard"),
                     env=child_env(ZEROMON_MEMORY_EVERY="1"), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.mark.distributed
def test_json_report_of_a_recorded_run(run_dir: Path) -> None:
    result = zeromon("report", str(run_dir), "--json", "--peak-busbw", "10GB")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        assert rank["framework"] == "fsdp2" and rank["steps"] == 5
        assert 0 <= rank["comm_comp_overlap_pct"] <= 100
        assert 0 < rank["exposed_comm_s"] <= rank["median_step_s"]
        assert rank["oom"]["risk"] in ("ok", "warn", "critical")
        assert rank["peak_memory_bytes"] > 0 and rank["capacity_bytes"] > rank["peak_memory_bytes"]
        assert rank["busbw_bytes_per_s"]["all_gather"] > 0
        breakdown = rank["temporal_breakdown"]
        assert breakdown["idle_time_pctg"] + breakdown["compute_time_pctg"] + breakdown["non_compute_time_pctg"] \
            == pytest.approx(100.0, abs=0.5)
        steps = rank["per_step"]
        assert [s["step"] for s in steps] == [0, 1, 2, 3, 4]
        for s in steps:
            assert s["overlap_s"] <= s["comm_s"] + 1e-9
            assert s["exposed_comm_s"] == pytest.approx(s["comm_s"] - s["overlap_s"], abs=1e-6)
    ops = {b["op"] for b in report["bandwidth"]}
    assert {"all_gather", "reduce_scatter"} <= ops
    assert all(b["peak_share"] == pytest.approx(b["median_busbw_bytes_per_s"] / 10e9) for b in report["bandwidth"])
    assert isinstance(report["findings"], list)
    assert {a["rank"] for a in report["imbalance"]["arrivals"]} == {0, 1}


@pytest.mark.distributed
def test_text_and_html_report(run_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    result = zeromon("report", str(run_dir), "--html", str(page))
    assert result.returncode == 0, result.stderr
    assert "rank  framework" in result.stdout and "fsdp2" in result.stdout
    assert "exposed ms" in result.stdout
    text = result.stdout.splitlines()
    # The bandwidth table: by op, then size, each size a range of the bucket, each rate with its unit.
    start = text.index("bandwidth (nccl-tests busbw, median per op and message size):") + 1
    rows = [re.fullmatch(r"  (\S+) +(.+?) +n=\d+ +\d+ calls +([\d.]+) (\S+)", line)
            for line in text[start:text.index("", start)]]
    assert rows and all(rows), text[start:]
    ops_sizes = [(r[1], _bucket_lower_bound(r[2])) for r in rows if r]
    assert ops_sizes == sorted(ops_sizes) and "all_gather" in {op for op, _ in ops_sizes}
    assert all(r[4] in ("kB/s", "MB/s", "GB/s") and float(r[3]) > 0 for r in rows if r), rows
    assert ">=" not in " ".join(text)
    # Each finding names its rank once.
    findings = [line for line in text if line.startswith("  [")]
    assert findings and not [line for line in findings if re.search(r"\brank (\d+)\b.*\(rank \1\)$", line)]
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "plotly" in html.lower()
    for figure in ("zeromon-memory", "zeromon-timeline", "zeromon-overlap", "zeromon-bandwidth"):
        assert f'id="{figure}"' in html
    # On CPU the categories (KiB to MiB) are a sliver of the process RSS: they get a plot of their own,
    # and the capacity, far above, is named rather than drawn.
    assert "by category (" in html and "so drawn apart" in html
    assert "far above these levels, is not drawn" in html
    assert '"tickvals":[0,25,50,75,100]' in html  # the overlap axis: 0 to 100 %, its own ticks
    assert 'src="http' not in html, "self-contained: plotly.js is inlined, nothing is fetched"
    assert 1_000_000 < len(html) < 2_500_000  # plotly.js inlined packed: it is nearly all the page
    # Each finding once (the text's findings are not repeated below the list), no text in a block that scrolls.
    assert findings
    for line in findings:
        assert html.replace("&#x27;", "'").count(line.strip()) == 1, line
    assert "<pre>" in html and "white-space:pre-wrap" in html
    # One name per number: the exposed communication is "exposed ms" in report, summary and the page alike.
    summary = zeromon("summary", str(run_dir)).stdout
    for said in (result.stdout, summary, html):
        assert "exposed ms" in said and "blocked ms" not in said and "exposed ms/step" not in said
    # A CPU run says why its overlap is 0 %, where the overlap shows.
    assert "no GPU streams to overlap communication on" in result.stdout and \
        "no GPU streams to overlap communication on" in html


def _bucket_lower_bound(label: str) -> int:
    """Where a bucket's sizes start: '<= 1 KiB' 0, '4-16 KiB' 4096, '256 KiB-1 MiB' 262144."""
    if label.startswith("<="):
        return 0
    match = re.match(r"(\d+)(?: (\w+))?-\d+ (\w+)", label)
    assert match, label
    unit = match[2] or match[3]
    return int(match[1]) * 1024 ** (1 + ["KiB", "MiB", "GiB", "TiB"].index(unit))


def test_trace_report_json() -> None:
    result = zeromon("report", "--trace", str(REPO / "tests" / "data" / "kineto" / "a100-w2-rank0.json.gz"), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (rank,) = report["ranks"]
    assert rank["rank"] == 0 and 0 <= rank["comm_comp_overlap_pct"] <= 100
    assert set(rank["temporal_breakdown"]) >= {"idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"}


@pytest.mark.parametrize(("args", "message"), [
    ((), "give a RUN_DIR or --trace DIR"),
    (("runs/x", "--trace", "t"), "give a RUN_DIR or --trace DIR"),
    (("/nonexistent/run",), "/nonexistent/run: no such run folder"),
    (("/tmp", "--peak-busbw", "fast"), "--peak-busbw 'fast'"),
    (("/tmp", "--capacity=-3GB"), "--capacity '-3GB': must be more than 0 bytes"),
    (("/tmp", "--html", ""), "--html: give the file to write"),
    (("--trace", "t", "--capacity", "80GiB"), "--capacity is for recordings (RUN_DIR)"),
    (("--trace", "t", "--peak-busbw", "200GB"), "--peak-busbw is for recordings (RUN_DIR)"),
])
def test_bad_input(args: tuple[str, ...], message: str) -> None:
    result = zeromon("report", *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.distributed
def test_parallel_report_equals_the_in_process_one(run_dir: Path) -> None:
    """`zeromon report RUN_DIR` reads and analyses each rank in a worker process: the same report as
    build_report over the recordings read here, to the last bit, and through the CLI."""
    expected = build_report(read_run(run_dir), str(run_dir), peak_busbw=10e9).to_dict()
    assert expected["imbalance"]["arrivals"][0]["matched"] > 0 and expected["bandwidth"]
    for workers in (2, 1):
        assert analyse_run(run_dir, peak_busbw=10e9, workers=workers).to_dict() == expected
    result = zeromon("report", str(run_dir), "--json", "--peak-busbw", "10GB")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    ends = document.pop("ends")  # read from the files' ends by the command, beside the analysis
    assert [e["how"] for e in ends] == ["exit", "exit"] and not any(e["died"] or e["incomplete"] for e in ends)
    assert document.pop("first_died") is None and document.pop("restarts")["count"] == 0  # and from the folder
    assert document.pop("hang") is None  # no rank stalled
    assert document.pop("remedies_predicted")  # `zeromon whatif`'s, beside the analysis (tests/test_whatif.py)
    assert document == json.loads(json.dumps(expected, default=str))


def test_parallel_report_of_a_synthetic_recording(tmp_path: Path) -> None:
    write_recording(tmp_path, events=20_000, samples=200)
    expected = build_report(read_run(tmp_path), str(tmp_path), capacity_bytes=60 * 2**30).to_dict()
    arrivals = expected["imbalance"]["arrivals"]
    assert [a["matched"] for a in arrivals] == [10_000, 10_000]
    assert sum(a["last_arrivals"] for a in arrivals) == 10_000 and arrivals[0]["caused_wait_s"] > 0
    assert analyse_run(tmp_path, capacity_bytes=60 * 2**30, workers=2).to_dict() == expected


@pytest.mark.parametrize("encoder", ["orjson", "json"])
def test_the_json_report_is_written_a_rank_at_a_time_and_reads_as_the_whole_document(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoder: str) -> None:
    """`report --json` writes RunReport.json_chunks: what json.loads reads of it is to_dict() and the extra
    keys, one piece per rank (no document of every rank made at once), each step on a line of its own, its
    steps by orjson, or by json where orjson is not installed. A rank with no step and a folder name that
    JSON must escape are part of it."""
    if encoder == "json":
        monkeypatch.setattr("zeromon.model.kinds._orjson", False)  # as orjson_module finds no orjson
    run = tmp_path / 'a "run"\nfolder'
    write_recording(run, events=4_000, samples=20)
    recordings = read_run(run)
    stepless = Recording(path=run / "rank-2.jsonl", header={"rank": 2, "world_size": 3})
    report = build_report([*recordings, stepless], str(run))
    assert [len(r.steps) for r in report.ranks] == [20, 20, 0]
    extra = {"ends": [{"rank": 0, "how": "exit"}]}
    chunks = list(report.json_chunks(extra))
    text = "".join(chunks)
    assert len(chunks) == 2 + len(report.ranks)
    assert json.loads(text) == json.loads(json.dumps(report.to_dict() | extra, default=str))
    step_lines = [line for line in text.splitlines() if line.startswith('    {"step"')]
    assert len(step_lines) == 40
    assert [json.loads(line.rstrip(","))["step"] for line in step_lines] == [*range(20), *range(20)]
    assert '"per_step": []' in chunks[3]
    # Each step as its StepOverlap says it (read from the table's columns, no StepOverlap made).
    for rank, written in zip(report.ranks, json.loads(text)["ranks"], strict=True):
        assert written["per_step"] == [
            {"step": s.step, "step_s": s.step_s, "comm_s": s.comm_s, "comp_s": s.comp_s, "overlap_s": s.overlap_s,
             "exposed_comm_s": s.exposed_comm_s, "idle_s": s.idle_s, "blocked_s": s.blocked_s, "agent_s": s.agent_s,
             "comm_comp_overlap_pct": None if s.overlap_ratio is None else round(100.0 * s.overlap_ratio, 3)}
            for s in rank.steps]


def test_imbalance_does_not_depend_on_the_order_collectives_were_written(tmp_path: Path) -> None:
    write_recording(tmp_path, events=4_000, samples=20)
    recordings = read_run(tmp_path)
    shuffled = []
    for rec in recordings:
        collectives = list(rec.collectives)
        random.Random(rec.rank).shuffle(collectives)
        shuffled.append(Recording(path=rec.path, header=rec.header, collectives=collectives, memory=rec.memory,
                                  steps=rec.steps, run_info=rec.run_info))
    expected = analyze_imbalance(recordings)
    assert expected.ranks[0].matched == 2_000 and expected.ranks[0].waited_s > 0
    assert analyze_imbalance(shuffled) == expected


@pytest.mark.parametrize(("header", "message", "hint"), [
    ('{"format": "zeromon-recording", "version": "9.0", "rank": 1, "schemas": {}}',
     "rank-1.jsonl: recording format version 9.0 is not supported", "read it with the zeromon version"),
    ("{not json", "rank-1.jsonl:1: not a zeromon recording", "recordings are the rank-<r>.zmr (or .jsonl) files"),
], ids=["unknown-version", "not-json"])
def test_a_bad_rank_file_is_one_clear_error(tmp_path: Path, header: str, message: str, hint: str) -> None:
    write_recording(tmp_path, events=2_000, samples=20)
    (tmp_path / "rank-1.jsonl").write_text(header + "\n")
    for args in ((), ("--json",)):
        result = zeromon("report", str(tmp_path), *args)
        assert result.returncode == 2 and result.stdout == ""
        error, hint_line = result.stderr.splitlines()  # no traceback: the message and its hint
        assert error.startswith(f"zeromon: error: {tmp_path}/") and message in error
        assert hint_line.startswith("hint: ") and hint in hint_line
    # The parallel path reads the headers before it starts its workers: the same error, its hint with it.
    with pytest.raises(ZeromonError) as raised:
        analyse_run(tmp_path, workers=2)
    assert message in raised.value.message and raised.value.hint is not None and hint in raised.value.hint


def _plotly_figure(page: str, div_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The data and layout of one figure of a report page, as plotly received them."""
    start = re.search(rf'Plotly\.newPlot\(\s*"{div_id}",\s*', page)
    assert start is not None, div_id
    decoder = json.JSONDecoder()
    data, end = decoder.raw_decode(page, start.end())
    comma = re.compile(r",\s*").match(page, end)
    assert comma is not None
    layout, _ = decoder.raw_decode(page, comma.end())
    return data, layout


@pytest.mark.distributed
def test_html_colours_communication_by_meaning_and_numbers_steps_from_1(run_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert zeromon("report", str(run_dir), "--html", str(page)).returncode == 0
    html = page.read_text()
    data, layout = _plotly_figure(html, "zeromon-timeline")
    # One legend entry per phase and per ZeRO meaning, each in its own fixed colour; the two palettes apart.
    names = [trace["name"] for trace in data]
    assert len(names) == len(set(names))
    comm = {t["name"].removeprefix("comm: "): t["marker"]["color"] for t in data if t["name"].startswith("comm: ")}
    phases = {t["name"].removeprefix("phase: "): t["marker"]["color"] for t in data if t["name"].startswith("phase: ")}
    assert {"param_all_gather", "grad_reduce_scatter"} <= set(comm) and {"forward", "backward"} <= set(phases)
    by_words = {phase_words(p): colour for p, colour in PHASE_COLOURS.items()}  # "zeromon's own work", not "agent"
    assert comm == {m: MEANING_COLOURS[m] for m in comm} and phases == {p: by_words[p] for p in phases}
    assert "agent" not in phases
    assert not set(MEANING_COLOURS.values()) & set(PHASE_COLOURS.values())
    # Steps as training scripts count them: the timeline's step is the median one after the first, + 1.
    rank0 = read_run(run_dir)[0]
    later = sorted((s for s in rank0.steps if s.step >= 1), key=lambda s: s.duration_s)
    assert layout["title"]["text"].startswith(f"Rank 0, step {later[len(later) // 2].step + 1}:")
    overlap, _ = _plotly_figure(html, "zeromon-overlap")
    assert overlap[0]["x"] == [1, 2, 3, 4, 5]
    # The JSON keeps the recording's index, and says so.
    report = json.loads(zeromon("report", str(run_dir), "--json").stdout)
    assert [s["step"] for s in report["ranks"][0]["per_step"]] == [0, 1, 2, 3, 4]
    assert "step is the recording's step index, from 0" in report["definitions"]


@pytest.mark.distributed
def test_summary_and_report_show_the_same_step_times(run_dir: Path) -> None:
    summary = zeromon("summary", str(run_dir))
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    header = lines[1].split()
    assert header[:6] == ["rank", "framework", "strategy", "steps", "step", "ms"]
    report = json.loads(zeromon("report", str(run_dir), "--json").stdout)
    for rank, line in zip(report["ranks"], lines[2:4], strict=True):
        steady = sorted(s["step_s"] for s in rank["per_step"] if s["step"] >= 1)
        assert rank["median_step_s"] == pytest.approx((steady[1] + steady[2]) / 2)  # 4 steps after the first
        assert line.split()[4] == f"{rank['median_step_s'] * 1e3:.1f}", line
    assert "(step ms, exposed ms and bytes per step: medians over the steps after the first, as in `zeromon " \
           "report`; exposed = the step time communication cost)" in lines
    # The same exposed communication as the report's, under the same name.
    for rank, line in zip(report["ranks"], lines[2:4], strict=True):
        assert line.split()[5] == f"{rank['exposed_comm_s'] * 1e3:.1f}", line


@pytest.mark.distributed
def test_a_recording_without_samples_says_so(run_dir: Path, tmp_path: Path) -> None:
    """Rank files that hold only their header: no risk to show, figures that say why they are empty,
    and each finding of ranks with its ranks (both ranks' alike in one entry), in the text and in the page. The agent's header promises
    an end record, which these files lack: their ranks read as killed before their first step."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for rank in (0, 1):
        with (run_dir / f"rank-{rank}.jsonl").open() as source:
            (empty / f"rank-{rank}.jsonl").write_text(source.readline())
    page = tmp_path / "empty.html"
    result = zeromon("report", str(empty), "--html", str(page))
    assert result.returncode == 3, result.stderr
    assert "rank 1 died before its first step (no end record" in result.stdout
    rows = result.stdout.splitlines()[3:5]
    assert [row.split()[:3] for row in rows] == [["0", "-", "-"], ["1", "-", "-"]]
    assert all(row.split()[-2:] == ["-", "-"] for row in rows), rows  # risk and busbw
    html = page.read_text()
    for figure, message in (("zeromon-memory", "no memory samples in this recording"),
                            ("zeromon-timeline", "no steps in this recording"),
                            ("zeromon-overlap", "no steps in this recording"),
                            ("zeromon-bandwidth", "no collectives with a measured duration in this recording")):
        _, layout = _plotly_figure(html, figure)
        assert [a["text"] for a in layout["annotations"]] == [message], figure
    text_findings = [line.strip() for line in result.stdout.splitlines() if line.startswith("  [")]
    assert text_findings and all(re.search(r"\b(rank [01]|ranks 0-1)\b", line) for line in text_findings)
    for line in text_findings:
        assert f"<b>{line}</b>" in html.replace("&#x27;", "'"), line
