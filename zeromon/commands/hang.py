"""`zeromon hang [RUN_DIR | TARGET ...]`: is the job hung, who holds it up, and where every rank's stack stands."""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from typing import TYPE_CHECKING, Any

from zeromon.commands.source_flags import NEWEST, RUN, TARGETS, add_source_arguments, read_sources, token_flag

if TYPE_CHECKING:
    from zeromon.analysis.hang import HangVerdict
    from zeromon.model.progress import RankProgress, StackFrame
    from zeromon.sources.fleet import FleetView

NAME = "hang"
HELP = "say whether a run is hung, which rank holds it up and where, with every rank's stack (once)"

# The exit statuses, as `zeromon live --once` gives them.
EXIT_OK, EXIT_NONE, EXIT_DIED = 0, 1, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Ask every rank's agent where it is in its collectives, once, and print the verdict: which rank holds the "
        "others up (stuck outside any collective, behind, dead, or issuing another collective than its group's "
        "majority), the collective the others wait in and since when, then each rank's state and the Python stacks "
        "of the training threads, identical stacks together. A rank is suspect after its threshold without progress "
        "(ZEROMON_HANG_AFTER, else the larger of 30 s and ten median steps; before the first step ends, "
        "ZEROMON_HANG_AFTER_SETUP, else the larger of 5 minutes and ZEROMON_HANG_AFTER). A run whose agents have "
        "ended is read from its recording (the reports its ranks wrote when they stalled or were stopped). Exit status: 4 when the "
        "job is hung, 3 when a rank died, 0 otherwise, 1 when no rank answered and nothing was recorded; 2 for bad "
        "input.")
    add_source_arguments(parser)
    parser.add_argument("--threads", action="store_true",
                        help="every thread's stack, not only the training thread's (live agents: /api/v1/stacks)")
    parser.add_argument("--json", action="store_true", help="one JSON object: the verdict and every rank's report")
    parser.add_argument("--token", type=token_flag, help="the agents' bearer token (default: ZEROMON_TOKEN)")


def run(args: argparse.Namespace) -> int:
    from zeromon.analysis.hang import EXIT_HUNG

    sources = read_sources(args, NAME, takes=(RUN, TARGETS, NEWEST), several=())
    view = _live_view(sources.targets, sources.run_dir, args.token)
    if view is not None and view.alive:
        verdict, reports = view.hang, {r.rank: r.progress for r in view.ranks if r.rank is not None}
        source = view.source
        threads = _threads(view, args.token) if args.threads else {}
    elif sources.run_dir is not None:
        verdict, reports = _recorded(sources.run_dir)
        source, threads = f"recording {sources.run_dir}", {}
    else:
        print(f"zeromon hang: no agent answered ({view.error if view is not None else 'no run found'})")
        return EXIT_NONE
    if args.json:
        print(json.dumps({"source": source, "hang": verdict.to_dict() if verdict is not None else None,
                          "ranks": {str(r): p.to_dict() if p is not None else None for r, p in reports.items()},
                          "threads": threads}, default=str))
    else:
        print(format_hang(source, verdict, reports, threads))
    if verdict is not None and verdict.hung:
        return EXIT_HUNG
    if view is not None and any(r.died for r in view.ranks):
        return EXIT_DIED
    return EXIT_OK if reports else EXIT_NONE


def _live_view(targets: tuple[str, ...], run_dir: str | None, token: str | None) -> FleetView | None:
    """One poll of the run's agents; None where the run folder registers none (its run has ended)."""
    from zeromon.sources.discovery import run_entries
    from zeromon.sources.live import LiveSource

    if run_dir is not None and not run_entries(run_dir):
        return None
    source = LiveSource(targets=list(targets) or None, run_dir=run_dir, token=token)
    try:
        return source.poll()  # one round, in this thread
    finally:
        source.stop()


def _recorded(run_dir: str) -> tuple[HangVerdict | None, dict[int, RankProgress | None]]:
    """The verdict over a run's recordings: each rank's newest progress report, the killed ranks dead."""
    from zeromon.analysis.hang import last_report, recorded_verdict
    from zeromon.analysis.rank_ends import CUT_OFF, rank_ends
    from zeromon.model.codec import read_run
    from zeromon.model.run_end import read_file_ends

    recordings = read_run(run_dir)
    reports = {rec.rank: last_report(rec.progress) for rec in recordings}
    ends = rank_ends(read_file_ends([rec.path for rec in recordings]), {})
    return recorded_verdict(reports, [e.rank for e in ends if e.state == CUT_OFF]), reports


def _threads(view: FleetView, token: str | None) -> dict[int, Any]:
    """Every live rank's threads (/api/v1/stacks), by rank; a rank that does not answer is left out."""
    out: dict[int, Any] = {}
    for r in view.ranks:
        if r.rank is None or not r.alive:
            continue
        request = urllib.request.Request(f"http://{r.target}/api/v1/stacks")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5) as answer:
                out[r.rank] = json.loads(answer.read()).get("threads", [])
        except (OSError, ValueError):
            continue
    return out


# --- text ---------------------------------------------------------------------------------------------

def format_hang(source: str, verdict: HangVerdict | None, reports: dict[int, RankProgress | None],
                threads: dict[int, Any]) -> str:
    """The verdict, a row per rank and the grouped stacks, in the words the TUI and the dashboard use
    (zeromon.views.hang); then every thread's stack where --threads asked for them."""
    from zeromon.views.hang import frame_line, hang_view_of

    view = hang_view_of(verdict, reports)
    lines = [f"zeromon hang: {source} · {len(reports)} rank(s) · {time.strftime('%H:%M:%S')}", view.status]
    if view.banner is not None:
        lines.extend("  " + line for line in view.banner.more)
    lines.append("")
    lines.append(f"{'rank':>4}  {'state':<8} {'in step':>7} {'no progress':>12}  where")
    for row in view.rows:
        waits = f", for {row.waits_for}" if row.waits_for else ""
        lines.append(f"{row.rank:>4}  {row.state:<8} {row.step:>7} {row.no_progress:>12}  {row.where}{waits}")
    if view.stacks:
        lines.append("")
        lines.append(view.stacks_title + ":")
        for block in view.stacks:
            lines.append(f"{block.title}:")
            lines.extend("  " + frame for frame in block.frames)
    for rank, rank_threads in sorted(threads.items()):
        lines.append("")
        lines.append(f"rank {rank}: every thread")
        for thread in rank_threads:
            lines.append(f"  thread {thread.get('thread')}" + (" (training)" if thread.get("training") else ""))
            lines.extend("    " + frame_line(f) for f in _frames(thread.get("stack", [])))
    return "\n".join(lines)


def _frames(raw: list[Any]) -> tuple[StackFrame, ...]:
    from zeromon.model.progress import StackFrame

    return tuple(StackFrame(str(f[0]), int(f[1]), str(f[2])) for f in raw if isinstance(f, list) and len(f) == 3)
