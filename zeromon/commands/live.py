"""`zeromon live [TARGET ... | RUN_DIR] [--prometheus URL] [--once] [--json]`: the live agents, as text."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING

from zeromon.errors import ZeromonError
from zeromon.model.events import step_number
from zeromon.model.numbers import POLL_SECONDS, flag
from zeromon.model.units import format_bytes

if TYPE_CHECKING:
    from zeromon.sources.fleet import FleetView, RankView

NAME = "live"
HELP = "show the live agents of a run, one line per rank (plain text or --json; Ctrl-C ends)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Poll the agents' endpoints (or a Prometheus server) and print one line per rank: step, "
                          "step time, exposed communication, overlap, memory, headroom and OOM risk. Without "
                          "arguments it finds the newest local run by itself (the user-level index, "
                          "ZEROMON_REGISTRY), and waits for one when there is none yet. Exit status with --once: "
                          "0 when a rank answered, 1 when none did (or no run was found).")
    parser.add_argument("where", nargs="*", metavar="TARGET|RUN_DIR",
                        help="host:port of agents, or one run folder (its endpoints/ lists the ranks)")
    parser.add_argument("--prometheus", metavar="URL", help="read through a Prometheus server's HTTP API instead")
    parser.add_argument("--once", action="store_true", help="one poll, print, exit")
    parser.add_argument("--json", action="store_true", help="JSON: one object (--once) or one line per poll")
    parser.add_argument("--interval", metavar="S", type=flag("--interval", POLL_SECONDS), default=1.0,
                        help=f"seconds between polls (default 1; {POLL_SECONDS.accepts})")
    parser.add_argument("--token", help="the agents' bearer token (default: ZEROMON_TOKEN)")


_WHERE_HINT = "a run folder is the --out of `zeromon run`; a target is host:port, e.g. 127.0.0.1:9470"


def _split_where(where: list[str]) -> tuple[list[str], str | None]:
    """Targets and a run folder from the positional arguments (a folder that exists is a run folder)."""
    from zeromon.sources.discovery import parse_target

    folders, targets = [], []
    for w in where:
        if os.path.isdir(w):
            folders.append(w)
        elif os.path.exists(w):
            raise ZeromonError(f"RUN_DIR {w}: a file, not a run folder; give the folder it is in "
                               f"({os.path.dirname(os.path.abspath(w))})")
        elif "://" not in w and ("/" in w.rstrip("/") or w.startswith((".", "~"))):  # a path: no host:port has "/"
            raise ZeromonError(f"RUN_DIR {w}: no such run folder", hint=_WHERE_HINT)
        elif ":" not in w:
            raise ZeromonError(f"{w!r}: neither a run folder (none has that name) nor a host:port target",
                               hint=_WHERE_HINT)
        else:
            targets.append(w)
    if len(folders) > 1:
        raise ZeromonError(f"zeromon live: give one RUN_DIR, not {len(folders)} ({' '.join(folders)})",
                           hint="one `zeromon live RUN_DIR` per run")
    if folders and targets:
        raise ZeromonError("zeromon live: give host:port targets or one RUN_DIR, not both",
                           hint="zeromon live runs/demo   or   zeromon live 127.0.0.1:9470 127.0.0.1:9471")
    for target in targets:
        parse_target(target, what="TARGET")
    return targets, folders[0] if folders else None


def run(args: argparse.Namespace) -> int:
    from zeromon.sources.discovery import newest_local_run, resolve_run_dir, run_endpoints_folder, run_entries
    from zeromon.sources.live import LiveSource
    from zeromon.sources.promql import check_prometheus

    targets, run_dir = _split_where(args.where)
    waiting = False  # no local run yet: the source looks for one every poll
    if args.prometheus is not None:
        if targets or run_dir:
            raise ZeromonError("zeromon live: --prometheus reads every rank from Prometheus; give no TARGET or RUN_DIR")
        check_prometheus(args.prometheus)
    elif not targets and (run_dir is not None or newest_local_run() is not None):
        # Refused now when the run named has nothing to watch; without RUN_DIR the source then
        # follows the newest local run by itself (a run started later takes over).
        folder = resolve_run_dir(run_dir, what="RUN_DIR")
        if not run_entries(folder):
            raise ZeromonError(f"RUN_DIR {folder}: no agent endpoints registered in {run_endpoints_folder(folder)}",
                               hint="agents register there while the run is going (ZEROMON_ENDPOINT=1, the default)")
    else:
        waiting = not targets
    source = LiveSource(targets=targets or None, run_dir=run_dir, prometheus=args.prometheus, token=args.token,
                        interval_s=args.interval)
    try:
        view = source.poll()  # the first view at once, not an interval later
        clear = sys.stdout.isatty() and not args.json and not args.once
        if not args.once:
            source.start()  # before the first print, after which a Ctrl-C is expected
        _print(view, args.json, clear=clear, waiting=waiting)
        if args.once:
            return 0 if view.alive else 1
        while True:
            time.sleep(args.interval)
            _print(source.latest(), args.json, clear=clear, waiting=waiting)
    except KeyboardInterrupt:
        return 0
    finally:
        source.stop()


def _print(view: FleetView, as_json: bool, clear: bool, waiting: bool = False) -> None:
    if as_json:
        print(json.dumps(view.to_dict(), default=str, separators=(",", ":")), flush=True)
        return
    text = format_fleet(view, waiting)
    print(("\x1b[H\x1b[2J" if clear else "") + text, flush=True)


def format_fleet(view: FleetView, waiting: bool = False) -> str:
    """The view as text; ``waiting``: no run was found when the command started (none of its ranks yet)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(view.t_ns / 1e9))
    if waiting and not view.ranks:
        from zeromon.model.registry import registry_dir

        return (f"zeromon live: waiting for a run · {stamp}\n"
                f"no agent in {registry_dir()} (the user-level index of local agents, ZEROMON_REGISTRY) yet: "
                "a run with the endpoint on (ZEROMON_ENDPOINT=1, the default) registers there as it starts")
    lines = [f"zeromon live: {view.source} · {view.alive} of {len(view.ranks)} rank(s) answering · {stamp}"]
    if view.error:
        lines.append(f"note: {view.error}")
    header = (f"{'rank':>4}  {'state':<10} {'step':>6} {'step ms':>8} {'exposed ms':>10} {'exp %':>6} {'overlap':>7} "
              f"{'memory':>11} {'capacity':>11} {'headroom':>11} {'OOM':<8} {'dropped':>7}  target")
    lines.append(header)
    for r in view.ranks:
        lines.append(_rank_line(r))
    for r in view.ranks:
        if r.error and not r.alive:
            lines.append(f"rank {r.rank if r.rank is not None else '?'} ({r.target}): {r.error}")
    for r in view.ranks:
        for f in r.findings:
            if f.severity.rank >= 2:  # warn and critical
                where = "" if f.title.startswith("rank ") else f"rank {r.rank}: "
                lines.append(f"{f.severity.value}: {where}{f.title}")
    return "\n".join(lines)


def _rank_line(r: RankView) -> str:
    fmt = format_bytes
    state = "alive" if r.alive else ("down" if r.stale_s is None else f"stale {r.stale_s:.0f}s")
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
