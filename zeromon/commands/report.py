"""`zeromon report RUN_DIR | --trace DIR [--json] [--html FILE]`: the offline analysis."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zeromon.errors import ZeromonError
from zeromon.model.units import format_bytes, parse_memory_size

if TYPE_CHECKING:
    from zeromon.analysis.report import RankAnalysis, RunReport

NAME = "report"
HELP = "analyse a recorded run (or PyTorch profiler traces): overlap, OOM risk, bandwidth, stragglers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("The whole offline analysis of a zeromon recording (a folder of rank-<r>.jsonl) or of "
                          "PyTorch profiler (Kineto) traces: per-rank table and findings to stdout, --json for "
                          "machines, --html FILE for a self-contained page with figures.")
    parser.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run folder written by `zeromon run`")
    parser.add_argument("--trace", metavar="DIR", help="a folder (or file) of PyTorch profiler traces instead")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with figures")
    parser.add_argument("--peak-busbw", metavar="RATE",
                        help="the link's peak bus bandwidth per second, e.g. 200GB (reports the achieved share)")
    parser.add_argument("--capacity", metavar="SIZE", help="memory capacity per rank to forecast against, e.g. 80GiB")


def _capacity_flag(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_memory_size(value, "--capacity")
    except ValueError as exc:
        message = str(exc) if str(exc).startswith("--capacity") else f"--capacity {value!r}: {exc}"
        raise ZeromonError(message) from None


def _rate_flag(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        # "200GB", "200GB/s", "25GiB/s": bytes per second; a bare "200" is surely a missing unit.
        return parse_memory_size(value.strip().removesuffix("/s"), "--peak-busbw")
    except ValueError:
        raise ZeromonError(f"--peak-busbw {value!r}: not a bus bandwidth",
                           hint="bytes per second with a unit, e.g. --peak-busbw 200GB/s or 25GiB/s") from None


def run(args: argparse.Namespace) -> int:
    if bool(args.run_dir) == bool(args.trace):
        raise ZeromonError("zeromon report: give a RUN_DIR or --trace DIR (one of them)",
                           hint="zeromon report runs/x   or   zeromon report --trace profiler_traces/")
    if args.trace:
        return _trace_report(args)
    return _run_report(args)


def _run_report(args: argparse.Namespace) -> int:
    peak = _rate_flag(args.peak_busbw)
    capacity = _capacity_flag(args.capacity)
    peak_busbw = float(peak) if peak else None
    if args.html:  # the page plots the recordings themselves: read (and analyse) them in this process
        from zeromon.analysis.report import build_report
        from zeromon.exporters.html_report import render_html
        from zeromon.model.codec import read_run

        recordings = read_run(Path(args.run_dir))
        report = build_report(recordings, str(args.run_dir), peak_busbw=peak_busbw, capacity_bytes=capacity)
        text = format_run_report(report)
        try:
            Path(args.html).write_text(render_html(report, recordings, text), encoding="utf-8")
        except OSError as exc:
            raise ZeromonError(f"--html {args.html}: cannot write: {exc.strerror}") from None
    else:
        report = analyse_run(Path(args.run_dir), peak_busbw=peak_busbw, capacity_bytes=capacity)
        text = format_run_report(report)
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=1, default=str)
        print()
    else:
        print(text)
        if args.html:
            print(f"\nwrote {args.html}")
    return 0


def analyse_run(run_dir: Path, peak_busbw: float | None = None, capacity_bytes: int | None = None,
                workers: int | None = None) -> RunReport:
    """build_report(read_run(run_dir)), faster: each rank file is read and analysed in a worker
    process, ``workers`` at once (default: one per CPU, at most one per rank; 1: all in this
    process), and only the ranks' analyses come back, to be combined here. A rank of half a million
    collectives takes ~2.5 s of one core to read and analyse, and sends back ~20 MB."""
    from zeromon.analysis.report import combine_report
    from zeromon.model.codec import rank_files

    files = rank_files(run_dir)
    workers = min(len(files), workers or _usable_cpus())
    if workers <= 1:
        ranks = [_analyse_file(path, capacity_bytes) for path in files]
    else:
        ranks = _analyse_in_processes(files, capacity_bytes, workers)
    ranks.sort(key=lambda r: r.report.rank)  # as read_run orders the recordings
    return combine_report(ranks, str(run_dir), peak_busbw)


def _analyse_in_processes(files: list[Path], capacity_bytes: int | None, workers: int) -> list[RankAnalysis]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from zeromon.model.codec import collector_paused

    # fork: the workers start at once, zeromon imported. forkserver and spawn re-run the caller's
    # __main__ script in every worker (and fail where it is not a file: `python -`); their one
    # advantage, safety for a caller with threads, does not apply to this single-threaded command.
    try:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    except (OSError, ValueError, NotImplementedError):  # no fork or no semaphores (some sandboxes)
        return [_analyse_file(path, capacity_bytes) for path in files]
    with pool:
        futures = [pool.submit(_analyse_file, path, capacity_bytes) for path in files]
        try:
            # The collector paused while the pool's thread unpickles the analyses (~2M objects a rank).
            # A worker's ZeromonError (a bad file) comes back pickled, message and hint, and is raised here.
            with collector_paused():
                return [future.result() for future in futures]
        except BrokenProcessPool:
            raise ZeromonError(f"{files[0].parent}: a worker process analysing the rank files died (killed, or "
                               "out of memory)",
                               hint="analyse fewer ranks at once: move some rank-<r>.jsonl to a folder of their "
                                    "own") from None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may run on, in a container too
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _analyse_file(path: Path, capacity_bytes: int | None) -> RankAnalysis:
    from zeromon.analysis.report import analyze_rank
    from zeromon.model.codec import read_recording

    try:
        recording = read_recording(path)
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot read recording: {exc.strerror}") from None
    return analyze_rank(recording, capacity_bytes)



def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.0f}%"


def format_run_report(report: Any) -> str:
    lines = [f"zeromon report: {report.run_dir} ({len(report.ranks)} of {report.world_size} ranks)", ""]
    lines.append(f"{'rank':>4}  {'framework':<9} {'strategy':<13} {'steps':>5} {'step ms':>8} {'exposed ms':>10} "
                 f"{'exposed':>7} {'overlap':>7} {'peak mem':>11} {'capacity':>11} {'risk':<8} busbw")
    for r in report.ranks:
        busbw = ", ".join(f"{op} {bw / 1e9:.2f} GB/s" for op, bw in sorted(r.busbw_by_op.items())) or "-"
        lines.append(f"{r.rank:>4}  {r.framework:<9} {r.strategy:<13} {len(r.steps):>5} {_ms(r.median_step_s):>8} "
                     f"{_ms(r.median_exposed_comm_s):>10} {_pct(r.median_exposed_share):>7} "
                     f"{_pct(r.median_overlap_ratio):>7} {format_bytes(r.peak_memory):>11} "
                     f"{format_bytes(r.capacity):>11} {r.oom.risk.value:<8} {busbw}")
    lines.append("(medians over the steps after the first; exposed = communication not hidden behind compute)")
    if report.bandwidth:
        lines += ["", "bandwidth (nccl-tests busbw, median per op and message size):"]
        for b in report.bandwidth[:12]:
            share = f"  {b.peak_share:.0%} of peak" if b.peak_share is not None else ""
            lines.append(f"  {b.op:<15} {'>= ' + format_bytes(b.size_bucket_bytes):<14} n={b.group_size:<4} "
                         f"{b.count:>6} calls  {b.median_busbw / 1e9:8.3f} GB/s{share}")
    lines += ["", f"findings ({len(report.findings)}):" if report.findings else "findings: none"]
    for f in report.findings:
        where = f"rank {f.rank}" if f.rank is not None else "job"
        lines.append(f"  [{f.severity.value}] {f.title} ({where})")
        lines.extend(f"      evidence: {e}" for e in f.evidence)
        lines.extend(f"      remedy: {r}" for r in f.remedies)
    return "\n".join(lines)


def _trace_report(args: argparse.Namespace) -> int:
    from zeromon.analysis.trace_overlap import trace_report_from
    from zeromon.sources.kineto import load_traces

    if args.html:
        raise ZeromonError("--html is for recordings; with --trace use --json or the text table")
    result = trace_report_from(load_traces(Path(args.trace)))
    if args.json:
        json.dump(result, sys.stdout, indent=1, default=str)
        print()
        return 0
    lines = [f"zeromon report: traces in {args.trace}", "",
             f"{'rank':>4} {'iterations':>10} {'overlap':>8} {'exposed ms':>10} {'idle':>7} {'compute':>8} "
             f"{'non-compute':>11}"]
    for r in result["ranks"]:
        tb = r.get("temporal_breakdown", {})
        overlap = r.get("comm_comp_overlap_pct")
        lines.append(f"{r['rank']:>4} {len(r.get('iterations', [])):>10} "
                     f"{'-' if overlap is None else f'{overlap:.1f}%':>8} {_ms(r.get('exposed_comm_s')):>10} "
                     f"{tb.get('idle_time_pctg', 0):>6.1f}% {tb.get('compute_time_pctg', 0):>7.1f}% "
                     f"{tb.get('non_compute_time_pctg', 0):>10.1f}%")
    lines.append("(overlap and temporal breakdown as Holistic Trace Analysis defines them)")
    print("\n".join(lines))
    return 0
