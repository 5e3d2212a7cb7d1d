"""`zeromon live [RUN_DIR | TARGET ...] [--prometheus URL] [--replay DIR] [--once] [--json]`: the live agents, as text."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from zeromon.analysis.hang import EXIT_HUNG, OK, UNKNOWN, HangVerdict
from zeromon.analysis.rank_ends import EXIT_RANK_DIED
from zeromon.commands.source_flags import (
    NEWEST,
    PROMETHEUS,
    REPLAY,
    RUN,
    Sources,
    add_source_arguments,
    read_sources,
    say_missing_ranks,
    token_flag,
)
from zeromon.errors import ZeromonError
from zeromon.model.events import step_number
from zeromon.model.numbers import POLL_SECONDS, flag
from zeromon.model.units import format_bytes, rank_ranges

if TYPE_CHECKING:
    from zeromon.sources.fleet import FleetTotals, FleetView, RankView
    from zeromon.sources.live import LiveSource

NAME = "live"
HELP = "show the live agents of a run, one line per rank (plain text or --json; Ctrl-C ends)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Poll the agents' endpoints (or a Prometheus server) and print one line per rank: step, "
                          "step time, exposed communication, overlap, memory, headroom and OOM risk. Without "
                          "arguments it finds the newest local run by itself (the user-level index, "
                          "ZEROMON_REGISTRY), and waits for one when there is none yet. A rank that died says how "
                          "(\"rank 1 died at step 276 (no end record; ...)\"), and a hang names the rank that holds the others "
                          "up, the collective and where its stack stands (zeromon hang prints the stacks). Exit status "
                          "with --once (and at the end of a --replay): 3 when a rank died, 4 when the job is hung, else "
                          "0 when a rank answered, 1 when none did (or no run was found).")
    add_source_arguments(parser)
    parser.add_argument("--once", action="store_true", help="one poll, print, exit")
    parser.add_argument("--json", action="store_true", help="JSON: one object (--once) or one line per poll")
    parser.add_argument("--interval", metavar="S", type=flag("--interval", POLL_SECONDS), default=1.0,
                        help=f"seconds between polls (default 1; {POLL_SECONDS.accepts})")
    parser.add_argument("--token", type=token_flag, help="the agents' bearer token (default: ZEROMON_TOKEN)")


def run(args: argparse.Namespace) -> int:
    from zeromon.sources.discovery import newest_local_run, resolve_run_dir, run_endpoints_folder, run_entries
    from zeromon.sources.promql import check_prometheus

    sources = read_sources(args, NAME)  # the same checks as attach, targets, dashboard
    waiting = False  # no local run yet: the source looks for one every poll
    if sources.kind == REPLAY:
        if args.token:
            raise ZeromonError("zeromon live: --replay plays a recording; it takes no --token")
        return _replay(args, sources)
    if sources.kind == PROMETHEUS:
        assert sources.prometheus is not None
        check_prometheus(sources.prometheus)
    elif sources.kind == RUN or (sources.kind == NEWEST and newest_local_run() is not None):
        # Refused now when the run named has nothing to watch; without RUN_DIR the source then
        # follows the newest local run by itself (a run started later takes over).
        folder = resolve_run_dir(sources.run_dir, what="RUN_DIR")
        if not run_entries(folder):
            raise ZeromonError(f"RUN_DIR {folder}: no agent endpoints registered in {run_endpoints_folder(folder)}",
                               hint="agents register there while the run is going (ZEROMON_ENDPOINT=1, the default)")
    else:
        waiting = sources.kind == NEWEST
    from zeromon.sources.live import LiveSource

    source = LiveSource(targets=list(sources.targets) or None, run_dir=sources.run_dir,
                        prometheus=sources.prometheus, token=args.token, interval_s=args.interval)
    return _follow(source, args, waiting)


def _replay(args: argparse.Namespace, sources: Sources) -> int:
    """A recording as the live view saw it: played back at --speed (--once: its final state at once)."""
    from zeromon.commands.progress import Progress
    from zeromon.sources.replay import ReplaySource, final_view

    if args.once:
        with Progress("ranks read") as progress:
            view = final_view(sources.replay, progress, workers=None)
        say_missing_ranks(sources.replay)
        _print(view, args.json, clear=False)
        return once_status(view, live=False)
    with Progress("ranks read for the replay") as progress:
        source = ReplaySource(sources.replay, speed=sources.speed, progress=progress, workers=None)
    say_missing_ranks(sources.replay)
    clear = sys.stdout.isatty() and not args.json
    try:
        source.start()
        while not source.finished:
            _print(source.latest(), args.json, clear=clear)
            time.sleep(args.interval)
        view = source.view_at(source.duration_ns)  # the final view (final_view's) of the ranks already read
        _print(view, args.json, clear=clear)
        return once_status(view, live=False)
    except KeyboardInterrupt:
        return 0
    finally:
        source.stop()


def _follow(source: LiveSource, args: argparse.Namespace, waiting: bool) -> int:
    try:
        view = source.poll()  # the first view at once, not an interval later
        clear = sys.stdout.isatty() and not args.json and not args.once
        if not args.once:
            source.start()  # before the first print, after which a Ctrl-C is expected
        _print(view, args.json, clear=clear, waiting=waiting)
        if args.once:
            return once_status(view)
        while True:
            time.sleep(args.interval)
            _print(source.latest(), args.json, clear=clear, waiting=waiting)
    except KeyboardInterrupt:
        return 0
    finally:
        source.stop()


def once_status(view: FleetView, live: bool = True) -> int:
    """--once's exit status: 3 when a rank died (its line says how, as `zeromon run` and `summary` exit),
    4 when the job is hung (a rank waits in a collective for one that does not come), else 0 when a rank
    answered (a replay: when it has ranks), 1 when none did."""
    if any(r.died for r in view.ranks):
        return EXIT_RANK_DIED
    if view.hang is not None and view.hang.hung:
        return EXIT_HUNG
    if view.totals is not None:  # Prometheus's rules count every rank; the view holds the worst few (or none yet)
        return 0 if view.totals.ranks else 1
    return 0 if (view.alive if live else view.ranks) else 1


def _print(view: FleetView, as_json: bool, clear: bool, waiting: bool = False) -> None:
    if as_json:
        print(json.dumps(view_document(view), default=str, separators=(",", ":")), flush=True)
        return
    text = format_fleet(view, waiting)
    print(("\x1b[H\x1b[2J" if clear else "") + text, flush=True)


def view_document(view: FleetView) -> dict[str, Any]:
    """--json's object: the view, each rank's own findings under its rank; ``cross_rank_findings``, those no rank
    has of its own (a straggler, memory imbalance: as the TUI finds them from every rank's steps and peaks);
    ``finding_groups``, all of them one entry per problem across ranks (zeromon.analysis.finding_groups)."""
    from zeromon.analysis.finding_groups import group_findings
    from zeromon.views.fleet import cross_rank_findings

    across = cross_rank_findings(view.ranks)
    groups = group_findings([*(f for r in view.ranks for f in r.findings), *across])
    return view.to_dict() | {"cross_rank_findings": [f.to_dict() for f in across],
                             "finding_groups": [g.to_dict() for g in groups]}


def format_fleet(view: FleetView, waiting: bool = False) -> str:
    """The view as text; ``waiting``: no run was found when the command started (none of its ranks yet)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(view.t_ns / 1e9))
    if waiting and not view.ranks:
        from zeromon.model.registry import registry_dir

        return (f"zeromon live: waiting for a run · {stamp}\n"
                f"no agent in {registry_dir()} (the user-level index of local agents, ZEROMON_REGISTRY) yet: "
                "a run with the endpoint on (ZEROMON_ENDPOINT=1, the default) registers there as it starts")
    alive, ranks = (view.totals.ranks, view.totals.ranks_expected) if view.totals else (view.alive, len(view.ranks))
    lines = [f"zeromon live: {view.source} · {alive} of {ranks} rank(s) answering · {stamp}"]
    if view.totals is not None:
        lines.append(totals_line(view.totals))
    if view.error:
        lines.append(f"note: {view.error}")
    lines.extend(hang_lines(view.hang))
    header = (f"{'rank':>4}  {'state':<10} {'step':>6} {'step ms':>8} {'exposed ms':>10} {'exp %':>6} {'overlap':>7} "
              f"{'memory':>11} {'capacity':>11} {'headroom':>11} {'OOM':<8} {'dropped':>7}  target")
    lines.append(header)
    for r in view.ranks:
        lines.append(_rank_line(r, view.hang))
    lines.extend(status_lines(view))
    lines.extend(finding_lines(view))
    return "\n".join(lines)


def status_lines(view: FleetView) -> list[str]:
    """How the ranks that do not answer ended, the first to end first, as report and the views' banners say it:
    each death its own line ("rank 1 died first, at step 276 ..."), then one line per status across ranks
    ("ranks 0-255: the recording ended"; one rank's with its target, "rank 3 (host:9400): connection refused")."""
    from zeromon.analysis.finding_groups import RANK_PARTS_SHOWN

    died: list[str] = []
    by_status: dict[tuple[str, str | None], list[RankView]] = {}  # in the order of their first rank's end
    for r in sorted(view.ranks, key=lambda r: (not r.died, r.t_ns is None, r.t_ns or 0)):
        if r.died:
            died.append(r.died)
        elif r.error and not r.alive:  # a rank not known yet is told by its target alone
            by_status.setdefault((r.error, r.target if r.rank is None else None), []).append(r)
    lines = died
    for (status, _), ranks in by_status.items():
        if len(ranks) == 1:
            (r,) = ranks
            lines.append(f"rank {r.rank if r.rank is not None else '?'} ({r.target}): {status}")
        else:
            lines.append(f"{rank_ranges([r.rank for r in ranks if r.rank is not None], RANK_PARTS_SHOWN)}: {status}")
    return lines


def finding_lines(view: FleetView) -> list[str]:
    """The warn and critical findings, one line per problem across ranks, with those no rank has of its own (a
    straggler, memory imbalance, as the TUI finds them): "critical: ranks 0-255 but 17: 72-80% of step time is
    exposed communication (worst: rank 3 (80%))" (zeromon.analysis.finding_groups)."""
    from zeromon.analysis.finding_groups import group_findings
    from zeromon.views.fleet import fleet_findings

    lines = []
    for group in group_findings(f for f in fleet_findings(view.ranks) if f.severity.rank >= 2):
        worst = group.worst_figure
        named = (f" (worst: rank {group.worst_rank}{f' ({worst})' if worst is not None else ''})"
                 if len(group.ranks) > 1 else "")
        lines.append(f"{group.severity.value}: {group.title}{named}")
    return lines


def totals_line(t: FleetTotals) -> str:
    """The whole job in one line, from Prometheus's recording rules (the table below shows its worst ranks)."""
    risks = ", ".join(f"{t.risk_ranks.get(level, 0)} {level}" for level in ("critical", "warn", "ok"))
    headroom = format_bytes(t.headroom_min_bytes)
    if t.headroom_min_ratio is not None:
        headroom += f" ({t.headroom_min_ratio:.1%} of capacity)"
    exposed = " ".join(f"{'p' + str(round(float(q) * 100)) if q != 'max' else 'max'} {t.exposed_share[q]:.0%}"
                       for q in ("0.5", "0.9", "0.99", "max") if q in t.exposed_share) or "-"
    median, slowest = t.step_s.get("0.5"), t.step_s.get("max")
    step = (f"median {median * 1e3:.1f} ms, max {slowest * 1e3:.1f} ms" if median is not None and slowest is not None
            else "-") + (f" (skew {t.step_skew:+.0%})" if t.step_skew is not None else "")
    return (f"job: OOM risk: {risks} · least headroom {headroom} · "
            f"exposed share {exposed} · step time {step}")


def hang_lines(hang: HangVerdict | None) -> list[str]:
    """The hang verdict, cause first: "critical: hung: rank 1 has not reached ..." (none while the job moves)."""
    if hang is None or not hang.lines:
        return []
    label = "critical: hung: " if hang.hung else "warn: stalled: "
    return [label + hang.lines[0], *("  " + line for line in hang.lines[1:])]


def _rank_line(r: RankView, hang: HangVerdict | None = None) -> str:
    fmt = format_bytes
    state = "alive" if r.alive else "died" if r.died else "ended" if r.ended else (
        "down" if r.stale_s is None else f"stale {r.stale_s:.0f}s")
    verdict = hang.of(r.rank) if hang is not None and r.rank is not None and r.alive else None
    if verdict is not None and verdict.state not in (OK, UNKNOWN):
        state = verdict.state
    last = r.last_step
    step = str(step_number(last.step)) if last else "-"  # as the script logs it, as the TUI shows it
    step_ms = f"{last.duration_s * 1e3:.1f}" if last else "-"
    exposed = last.exposed_comm_s if last else None
    exposed_ms = f"{exposed * 1e3:.1f}" if exposed is not None else "-"
    share = f"{exposed / last.duration_s:.0%}" if last and exposed is not None and last.duration_s > 0 else "-"
    ratio = last.overlap_ratio if last else None
    overlap = f"{ratio:.0%}" if ratio is not None else "-"
    m = r.memory
    level = (m.allocated if m.allocated is not None else m.rss) if m is not None else None
    capacity = m.capacity if m is not None else None
    headroom = r.oom.headroom_bytes if r.oom is not None else None
    risk = r.oom.risk.value if r.oom is not None else "-"
    dropped = str(r.stats.events_dropped) if r.stats is not None else "-"
    rank = str(r.rank) if r.rank is not None else "?"
    return (f"{rank:>4}  {state:<10} {step:>6} {step_ms:>8} {exposed_ms:>10} {share:>6} {overlap:>7} "
            f"{fmt(level):>11} {fmt(capacity):>11} {fmt(headroom):>11} {risk:<8} {dropped:>7}  {r.target}")
