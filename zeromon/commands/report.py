"""`zeromon report RUN_DIR ... | --trace DIR [--json] [--html FILE]`: the offline analysis."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zeromon.analysis.hang import ended_lines
from zeromon.analysis.rank_ends import CUT_OFF, RankEnd, end_lines, end_order, exit_status, rank_ends
from zeromon.errors import ZeromonError
from zeromon.model.numbers import BUS_BANDWIDTH, CAPACITY, flag
from zeromon.model.units import format_bytes

if TYPE_CHECKING:
    from zeromon.analysis.finding_groups import FindingGroup
    from zeromon.analysis.findings import Finding
    from zeromon.analysis.report import RankReport, RunReport
    from zeromon.analysis.restarts import Restarts
    from zeromon.analysis.trace_overlap import RankTraceOverlap
    from zeromon.model.codec import RunDirs
    from zeromon.model.run_end import FileEnd
    from zeromon.sources.whatif_remedies import RemedyPrediction
    from zeromon.views.report_summary import RanksShown

NAME = "report"
HELP = "analyse a recorded run (or PyTorch profiler traces): overlap, OOM risk, bandwidth, stragglers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("The whole offline analysis of a zeromon recording (a folder of rank-<r>.zmr or .jsonl files) or of "
                          "PyTorch profiler (Kineto) traces: per-rank table and findings to stdout, then how the "
                          "ranks ended (the first to die first) and a restarted run's earlier attempts (kept in "
                          "RUN_DIR/attempts/<n>, each a run folder), --json for "
                          "machines, --html FILE for a self-contained page with figures. Exit status 3 (after "
                          "printing everything) when a rank of the recording died or its recording is incomplete; "
                          "2 for bad input.")
    parser.add_argument("run_dir", nargs="*", metavar="RUN_DIR",
                        help="a run folder written by `zeromon run`, or several folders of one run (each node's "
                             "--out, or a quoted glob such as 'runs/job/node*'): read as one run")
    parser.add_argument("--trace", metavar="DIR", help="a folder (or file) of PyTorch profiler traces instead")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text (every rank)")
    parser.add_argument("--all-ranks", action="store_true",
                        help="a line for every rank and every finding; without it the text lists one entry per "
                             "problem across ranks (\"ranks 0-255 but 17: 72-80%% of step time is exposed "
                             "communication\", its worst rank, remedies once) and past 16 ranks shows the worst "
                             "ranks first and summarises the rest")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with figures")
    # "200GB", "200GB/s", "25GiB/s": bytes per second; a bare "200" is surely a missing unit.
    parser.add_argument("--peak-busbw", metavar="RATE", type=flag("--peak-busbw", BUS_BANDWIDTH),
                        help="the link's peak bus bandwidth per second, e.g. 200GB/s (reports the achieved share; "
                             f"recordings only; {BUS_BANDWIDTH.accepts})")
    parser.add_argument("--capacity", metavar="SIZE", type=flag("--capacity", CAPACITY),
                        help=f"memory capacity per rank to forecast against (recordings only; {CAPACITY.accepts})")


def run(args: argparse.Namespace) -> int:
    if bool(args.run_dir) == bool(args.trace):
        raise ZeromonError("zeromon report: give a RUN_DIR or --trace DIR (one of them)",
                           hint="zeromon report runs/x   or   zeromon report --trace profiler_traces/")
    if args.html is not None and not args.html.strip():
        raise ZeromonError("--html: give the file to write, e.g. --html report.html")
    if args.trace:
        # Refused, not ignored: a user who passes them expects numbers the trace analysis has not.
        if args.peak_busbw is not None:
            raise ZeromonError("--peak-busbw is for recordings (RUN_DIR): the trace analysis has no bandwidth table")
        if args.capacity is not None:
            raise ZeromonError("--capacity is for recordings (RUN_DIR): the trace analysis has no memory forecast")
        return _trace_report(args)
    return _run_report(args)


def _write_html(path: str, page: str) -> None:
    try:
        Path(path).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ZeromonError(f"--html {path}: cannot write: {exc.strerror}") from None


def _run_report(args: argparse.Namespace) -> int:
    from zeromon.commands.source_flags import run_folder_words, say_missing_ranks

    peak, capacity = args.peak_busbw, args.capacity
    peak_busbw = float(peak) if peak else None
    run = run_folder_words(args.run_dir, "RUN_DIR")
    say_missing_ranks(run)  # the folders checked to be one run's; a node's folder left out, named
    from zeromon.analysis.hang import recorded_verdict
    from zeromon.commands.progress import Progress
    from zeromon.sources.run_analysis import analyse_and_keep, rank_ending

    with Progress("ranks read and analysed") as progress:
        # Each rank's end and last progress report read by the worker that read the rank.
        report, kept = analyse_and_keep(run, rank_ending, peak_busbw=peak_busbw, capacity_bytes=capacity,
                                        progress=progress)
    file_ends = [end for _, end, _ in kept if end is not None]
    text = format_run_report(report, args.all_ranks)
    if args.html:
        from zeromon.exporters.html_report import render_html
        from zeromon.model.rank_pool import read_rank_file

        # The page plots the recordings themselves: those of the ranks the text shows first, read again here
        # (16 at most: a large run's ranks would not fit one process, nor their lines a figure).
        plotted = _plotted_ranks(report)
        _write_html(args.html, render_html(report, [read_rank_file(Path(r.file)) for r in plotted],
                                                "\n".join(report_notes(report))))
    ends = _rank_ends(report, file_ends)
    restarts = _restarts(run, report)
    from zeromon.sources.whatif_remedies import remedy_predictions

    predictions = remedy_predictions(run, report.findings, len(report.ranks))
    capacity_bytes = capacity or next((r.capacity for r in report.ranks if r.capacity), None)
    hang = recorded_verdict({rank: last for rank, _, last in kept}, [e.rank for e in ends if e.state == CUT_OFF])
    if args.json:
        ended = [dataclasses.asdict(e) | {"died": e.died, "incomplete": e.incomplete} for e in ends]
        first = end_order(ends).first
        sys.stdout.writelines(report.json_chunks({  # a rank at a time
            "ends": ended, "first_died": first.rank if first is not None else None, "restarts": restarts.to_dict(),
            "hang": hang.to_dict() if hang is not None else None,
            "remedies_predicted": [p.to_dict(capacity_bytes) for p in predictions]}))
    else:
        if restarts.note is not None:
            print(restarts.note)
        print(text)
        if predictions:
            print("\n".join(remedy_lines(predictions, capacity_bytes)))
        lines = ended_lines(hang) + end_lines(ends)
        if lines:
            print("\nhow the ranks ended:")
            print("\n".join(f"  {line}" for line in lines))
        restart_lines = restarts.lines("the report above is")
        if restart_lines:
            print("\n" + "\n".join(restart_lines))
        if args.html:
            print(f"\nwrote {args.html}")
    return exit_status(ends)  # 3: a rank died or its recording is incomplete (said above)


def _plotted_ranks(report: RunReport) -> list[RankReport]:
    """The ranks an HTML page draws: every rank up to RANKS_SHOWN, else the ranks the text shows first (the
    furthest from the median rank, furthest first)."""
    from zeromon.views.report_summary import RANKS_SHOWN, summarise_ranks

    if len(report.ranks) <= RANKS_SHOWN:
        return list(report.ranks)
    return list(summarise_ranks(report).shown)


def _rank_ends(report: RunReport, file_ends: list[FileEnd] | None = None) -> tuple[RankEnd, ...]:
    """How the ranks ended, from their files' ends (read here where not given, in rank order)."""
    from zeromon.analysis.report import last_step
    from zeromon.model.run_end import read_file_ends

    through = {r.rank: last_step(r) for r in report.ranks}
    if file_ends is None:
        file_ends = read_file_ends([Path(r.file) for r in report.ranks])
    return rank_ends(file_ends, through, report.world_size)


def _restarts(run: RunDirs, report: RunReport) -> Restarts:
    """The run's restarts: the earlier attempts its folders keep (their files' ends only are read)."""
    from zeromon.analysis.report import last_step
    from zeromon.analysis.restarts import restarts
    from zeromon.model.attempts import read_attempts
    from zeromon.model.events import step_number

    steps = [step for r in report.ranks if (step := last_step(r)) is not None]
    return restarts(read_attempts(run), step_number(max(steps)) if steps else None)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.0f}%"


def _span(values: Iterable[Any], show: Callable[[Any], str] = str) -> str:
    """'82' or '82-84': the range of a per-rank value."""
    seen = sorted(values)
    lo, hi = show(seen[0]), show(seen[-1])
    return lo if lo == hi else f"{lo}-{hi}"


def _risk(r: RankReport) -> str:
    """The OOM risk; '-' where there was nothing to forecast (no memory samples, no OOM recorded)."""
    from zeromon.views.report_summary import risk_of

    risk = risk_of(r)
    return "-" if risk is None else risk.value


# The bandwidth rows printed: those that move the most bytes (--json has them all).
BANDWIDTH_ROWS_SHOWN = 16


def format_run_report(report: RunReport, all_ranks: bool = False) -> str:
    """The report's text: a line per rank up to RANKS_SHOWN ranks (or ``all_ranks``), past that the worst ranks
    first and the rest summarised (zeromon.views.report_summary); the findings one entry per problem across
    ranks (zeromon.analysis.finding_groups), or with ``all_ranks`` each finding."""
    from zeromon.views.report_summary import RANKS_SHOWN, summarise_ranks

    summarised = not all_ranks and len(report.ranks) > RANKS_SHOWN
    summary = summarise_ranks(report) if summarised else None
    lines = [f"zeromon report: {report.run_dir} ({len(report.ranks)} of {report.world_size} ranks)", ""]
    if summary is not None:
        lines.append(f"the {len(summary.shown)} ranks furthest from the median rank (OOM risk first; --all-ranks "
                     "for every rank):")
    lines.append(f"{'rank':>4}  {'framework':<9} {'strategy':<13} {'steps':>5} {'step ms':>8} {'exposed ms':>10} "
                 f"{'exposed %':>9} {'overlap':>7} {'peak mem':>11} {'capacity':>11} {'risk':<8} busbw")
    lines.extend(_rank_line(r) for r in (summary.shown if summary is not None else report.ranks))
    if summary is not None and summary.rest:
        lines.append(_rest_line(summary))
    lines.extend(report_notes(report))
    if summary is not None:
        lines.extend(_straggler_lines(summary))
    if not all_ranks:
        lines.extend(_grouped_finding_lines(report))
    else:
        lines += ["", f"findings ({len(report.findings)}):" if report.findings else "findings: none"]
        for f in report.findings:
            lines.extend(_finding_lines(f))
    return "\n".join(lines)


def remedy_lines(predictions: Sequence[RemedyPrediction], capacity: int | None) -> list[str]:
    """A line per remedy that `zeromon whatif` answers: its predicted step and peak, or why there is none."""
    from zeromon.views.whatif import capacity_words, delta_words

    lines = ["", "remedies predicted from this run (`zeromon whatif RUN_DIR CHANGE` for the whole answer):"]
    for p in predictions:
        if p.answer is None:
            lines.append(f"  remedy: {p.change}: not predicted: {p.refused}")
            continue
        answer = p.answer
        step = ("step -" if answer.step_delta_s is None or answer.step_change_pct is None
                else f"predicted {answer.step_delta_s * 1e3:+.1f} ms a step ({answer.step_change_pct:+.0f}%)")
        memory = "" if answer.peak_delta_bytes is None else f", {delta_words(answer.peak_delta_bytes)} peak"
        fits = capacity_words(answer.left_bytes(capacity))
        memory += f", {fits}" if fits else ""
        if answer.samples_factor != 1.0 and answer.per_sample_change_pct is not None:
            step += f", {answer.per_sample_change_pct:+.0f}% a sample"
        error = answer.replay_error_pct
        lines.append(f"  remedy: {p.change}: {step}{memory}"
                     + ("" if error is None else f" (the model's replay of the run: {error:+.1f}%)"))
    return lines


def report_notes(report: RunReport) -> list[str]:
    """What the report says between its rank table and its findings: what the columns mean, the warm-up and
    teardown, corrupt lines and the bandwidth table (the text's, and the HTML page's under its table)."""
    from zeromon.analysis.recording_summary import corrupt_lines_note

    lines: list[str] = []
    lines.append("(medians per step over the steps after the first; exposed = the step time communication "
                 "cost: the training thread's time blocked in collectives and waits (on GPU, communication not "
                 "hidden behind the stream's compute), and its share of the step)")
    if report.ranks and all(r.oom.device == "cpu" for r in report.ranks):
        from zeromon.analysis.step_overlap import CPU_OVERLAP_NOTE

        lines.append(CPU_OVERLAP_NOTE)
    lines.extend(_device_timing_lines(report))
    warm = [r.warmup for r in report.ranks if r.warmup.collectives]
    if warm:
        lines.append(f"warm-up before the first step (in no step's numbers): {_span(w.collectives for w in warm)} "
                     f"collectives, {_span((w.bytes for w in warm), format_bytes)}, "
                     f"{_span((w.blocked_s * 1e3 for w in warm), lambda v: f'{v:.1f}')} ms blocked per rank")
    after = [r.teardown for r in report.ranks if r.teardown.collectives]
    if after:
        lines.append(f"teardown after the last step (in no step's numbers): {_span(w.collectives for w in after)} "
                     f"collectives, {_span((w.bytes for w in after), format_bytes)}, "
                     f"{_span((w.blocked_s * 1e3 for w in after), lambda v: f'{v:.1f}')} ms blocked per rank")
    lines.extend(corrupt_lines_note(r.file, r.corrupt_lines, errors=r.line_errors)
                 for r in report.ranks if r.corrupt_lines)
    lines.extend(_bandwidth_lines(report))
    return lines


def _device_timing_lines(report: RunReport) -> list[str]:
    """Where a GPU run timed only some steps' communication on the device: which, and what the others lack."""
    from zeromon.analysis.report import device_timed_steps

    counts = [(device_timed_steps(r), len(r.steps)) for r in report.ranks]
    if all(timed == steps for timed, steps in counts):
        return []
    said = _span(timed for timed, _ in counts) + " of " + _span(steps for _, steps in counts)
    return [f"communication timed on the device: {said} steps per rank (the first two, then 1 in "
            "ZEROMON_DEVICE_TIMING_EVERY, and no fewer than 1 in 8 before step 256; =1 times every step); the "
            "others' collectives are recorded as launched, with no duration, and their steps are left out of the "
            "communication medians and findings"]


def _rank_line(r: RankReport) -> str:
    from zeromon.analysis.bandwidth import format_rate

    busbw = ", ".join(f"{op} {format_rate(bw)}" for op, bw in sorted(r.busbw_by_op.items())) or "-"
    return (f"{r.rank:>4}  {r.framework:<9} {r.strategy:<13} {len(r.steps):>5} {_ms(r.median_step_s):>8} "
            f"{_ms(r.median_exposed_comm_s):>10} {_pct(r.median_exposed_share):>9} "
            f"{_pct(r.median_overlap_ratio):>7} {format_bytes(r.peak_memory):>11} "
            f"{format_bytes(r.capacity):>11} {_risk(r):<8} {busbw}")


def _rest_line(summary: RanksShown) -> str:
    """'… and 1,008 more ranks within 0.4% of the median step time (122.8 ms) and 1.2 points of the
    median exposed share (55%); OOM risk ok'."""
    spread = summary.spread
    within = []
    if spread.step_within is not None and spread.median_step_s is not None:
        within.append(f"{100 * spread.step_within:.1f}% of the median step time ({_ms(spread.median_step_s)} ms)")
    if spread.exposed_within is not None and spread.median_exposed_share is not None:
        within.append(f"{100 * spread.exposed_within:.1f} points of the median exposed share "
                      f"({_pct(spread.median_exposed_share)})")
    risks = ", ".join(f"{n:,} {name}" if len(spread.risks) > 1 else name for name, n in spread.risks.items())
    return (f"… and {summary.rest:,} more ranks" + (f" within {' and '.join(within)}" if within else "")
            + (f"; OOM risk {risks}" if risks else ""))


def _straggler_lines(summary: RanksShown) -> list[str]:
    if not summary.stragglers:
        return ["", "stragglers: no rank made its peers wait (over the steps after the first)"]
    lines = ["", "stragglers (the ranks whose late arrival at collectives made their peers wait, most first; over "
                 "the steps after the first):"]
    for a in summary.stragglers:
        last = f"{a.steady_last_arrivals / a.steady_matched:.0%}" if a.steady_matched else "-"
        lines.append(f"  rank {a.rank:>5}: peers waited {a.steady_caused_wait_s:.3f} s for it; last at {last} of "
                     f"collectives; waited for the most in {a.steps_most_waited_for} steps")
    if summary.stragglers_rest:
        lines.append(f"  … and {summary.stragglers_rest:,} more ranks made their peers wait less")
    return lines


def _grouped_finding_lines(report: RunReport) -> list[str]:
    """The findings as one entry per problem across ranks (zeromon.analysis.finding_groups)."""
    from zeromon.analysis.finding_groups import group_findings

    groups = group_findings(report.findings)
    if not groups:
        return ["", "findings: none"]
    count = (f"{len(groups):,}" if len(groups) == len(report.findings) else
             f"{len(groups):,} problem{'s' if len(groups) != 1 else ''} in {len(report.findings):,} findings; "
             "--all-ranks or --json lists each")
    lines = ["", f"findings ({count}):"]
    for group in groups:
        lines.extend(finding_lines(group))
    return lines


def finding_lines(group: FindingGroup) -> list[str]:
    """An entry of the findings: '[severity] title', the worst rank of several, the evidence, the remedies."""
    lines = [f"  [{group.severity.value}] {group.title}"]
    worst = group.worst_words()
    if worst is not None:
        lines.append(f"      {worst}")
    lines.extend(f"      evidence: {e}" for e in group.evidence)
    lines.extend(f"      remedy: {r}" for r in group.remedies)
    return lines


def _finding_lines(f: Finding) -> list[str]:
    from zeromon.analysis.findings import finding_heading

    lines = [f"  [{f.severity.value}] {finding_heading(f)}"]
    lines.extend(f"      evidence: {e}" for e in f.evidence)
    lines.extend(f"      remedy: {r}" for r in f.remedies)
    return lines


def _bandwidth_lines(report: RunReport) -> list[str]:
    from zeromon.analysis.bandwidth import bucket_label, format_rate, format_share

    if not report.bandwidth:
        return []
    heaviest = sorted(report.bandwidth, key=lambda b: -b.total_bytes)[:BANDWIDTH_ROWS_SHOWN]
    shown = [b for b in report.bandwidth if b in heaviest]  # in the table's order: op, then size
    lines = ["", "bandwidth (nccl-tests busbw, median per op and message size):"]
    for b in shown:
        share = f"  {format_share(b.peak_share)} of peak" if b.peak_share is not None else ""
        lines.append(f"  {b.op:<15} {bucket_label(b.size_bucket_bytes):<14} n={b.group_size:<4} "
                     f"{b.count:>6} calls  {format_rate(b.median_busbw):>11}{share}")
    if len(shown) < len(report.bandwidth):
        lines.append(f"  ({len(report.bandwidth) - len(shown)} rows that move fewer bytes: --json has them)")
    return lines


def _trace_report(args: argparse.Namespace) -> int:
    from zeromon.analysis.trace_overlap import analyze_traces, trace_report_of
    from zeromon.sources.kineto import load_traces

    results = analyze_traces(load_traces(Path(args.trace)))
    text = format_trace_report(results, str(args.trace))
    if args.html:
        from zeromon.exporters.html_report import render_trace_html

        _write_html(args.html, render_trace_html(results, str(args.trace), text))
    if args.json:
        json.dump(trace_report_of(results), sys.stdout, indent=1, default=str)
        print()
        return 0
    print(text)
    if args.html:
        print(f"\nwrote {args.html}")
    return 0


def format_trace_report(results: Sequence[RankTraceOverlap], source: str) -> str:
    from zeromon.views.trace import TABLE_LEGEND, trace_notes, trace_rows

    lines = [f"zeromon report: traces in {source}", "",
             f"{'rank':>4} {'iterations':>10} {'overlap':>8} {'exposed ms/iter':>15} {'exposed ms total':>16} "
             f"{'idle':>7} {'compute':>8} {'non-compute':>11}"]
    for row in trace_rows(results):
        overlap = row.overlap_pct
        lines.append(f"{row.rank:>4} {row.iterations:>10} {'-' if overlap is None else f'{overlap:.1f}%':>8} "
                     f"{_ms_text(row.exposed_ms_per_iteration):>15} {_ms_text(row.exposed_ms_total):>16} "
                     f"{_share(row.idle_pct):>7} {_share(row.compute_pct):>8} {_share(row.non_compute_pct):>11}")
    lines.extend(TABLE_LEGEND)
    lines.extend(trace_notes(results))
    return "\n".join(lines)


def _ms_text(milliseconds: float | None) -> str:
    return "-" if milliseconds is None else f"{milliseconds:.1f}"


def _share(pctg: float | None) -> str:
    return "-" if pctg is None else f"{pctg:.1f}%"
