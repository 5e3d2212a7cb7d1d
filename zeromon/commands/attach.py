"""`zeromon attach [TARGET ...] [--run DIR] [--prometheus URL] [--replay DIR]`: the live TUI."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import TYPE_CHECKING

from zeromon.errors import ZeromonError
from zeromon.model.numbers import POLL_SECONDS, REPLAY_SPEED, flag

if TYPE_CHECKING:
    from zeromon.tui.app import Source

NAME = "attach"
HELP = "the live terminal view of a run: ranks, memory, overlap, findings (q quits, ? helps)"

_USAGE_HINT = ("zeromon attach   (the newest local run)   ·   zeromon attach --run runs/x   ·   "
               "zeromon attach 127.0.0.1:9470 127.0.0.1:9471   ·   zeromon attach --replay runs/x")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Watch a running ZeRO / FSDP job in the terminal: one row per rank (memory, headroom, OOM "
                          "risk, step time, overlap, exposed communication, bus bandwidth), sparklines over the "
                          "last steps, findings with their remedies, and a drill-down per rank (enter). Without "
                          "arguments it follows the newest local run (the user-level index, ZEROMON_REGISTRY). "
                          "When no agent answers it says where it looked and keeps looking.")
    parser.add_argument("targets", nargs="*", metavar="TARGET", help="host:port of agents (one per rank)")
    parser.add_argument("--run", metavar="RUN_DIR", help="the agents registered in this run folder (its endpoints/)")
    parser.add_argument("--prometheus", metavar="URL", help="read every rank through a Prometheus server's HTTP API")
    parser.add_argument("--token", help="the agents' bearer token (default: ZEROMON_TOKEN)")
    parser.add_argument("--replay", metavar="RUN_DIR", help="play a recorded run back (rank-*.jsonl)")
    parser.add_argument("--speed", metavar="X", type=flag("--speed", REPLAY_SPEED),
                        help=f"replay speed, 1 = real time (default 1; + and - change it; {REPLAY_SPEED.accepts})")
    parser.add_argument("--interval", metavar="S", type=flag("--interval", POLL_SECONDS), default=1.0,
                        help=f"seconds between polls of the agents (default 1; {POLL_SECONDS.accepts})")


def build_source(args: argparse.Namespace) -> Source:
    """The source the flags ask for; ZeromonError naming the flag for a bad combination."""
    if args.speed is not None and args.replay is None:
        raise ZeromonError("--speed applies to --replay only")
    from zeromon.sources.discovery import parse_target

    for target in args.targets:
        if os.path.isdir(target):
            raise ZeromonError(f"TARGET {target}: is a folder; give a run folder as --run {target}",
                               hint=_USAGE_HINT)
        parse_target(target, what="TARGET")
    if args.replay is not None:
        given = [flag for flag, value in (("TARGET", args.targets), ("--run", args.run),
                                          ("--prometheus", args.prometheus), ("--token", args.token)) if value]
        if given:
            raise ZeromonError(f"--replay plays a recording; it takes no {' or '.join(given)}", hint=_USAGE_HINT)
        speed = 1.0 if args.speed is None else args.speed
        if os.path.isfile(args.replay):
            parent = os.path.dirname(os.path.abspath(args.replay))
            raise ZeromonError(f"--replay {args.replay}: is a file; a replay plays a run folder (its rank-*.jsonl "
                               f"together)", hint=f"give the folder that holds it: --replay {parent}")
        if not os.path.isdir(args.replay):
            raise ZeromonError(f"--replay {args.replay}: no such folder",
                               hint="a run folder is the --out of `zeromon run`; it holds rank-*.jsonl")
        from zeromon.sources.replay import ReplaySource

        source: Source = ReplaySource(args.replay, speed=speed)
        return source
    if args.prometheus is not None and (args.targets or args.run):
        raise ZeromonError("--prometheus reads every rank from Prometheus; give no TARGET or --run", hint=_USAGE_HINT)
    if args.targets and args.run:
        raise ZeromonError("give host:port TARGETs or --run RUN_DIR, not both", hint=_USAGE_HINT)
    from zeromon.sources.live import LiveSource

    return LiveSource(targets=args.targets or None, run_dir=args.run, prometheus=args.prometheus, token=args.token,
                      interval_s=args.interval)


def require_terminal(what: str) -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ZeromonError(f"{what} draws in a terminal, and stdin or stdout is not one",
                           hint="for text that pipes, use `zeromon live` (one line per rank, --json too)")


def run(args: argparse.Namespace) -> int:
    source = build_source(args)  # bad flags: exit 2 before the screen is taken
    require_terminal("zeromon attach")
    from zeromon.sources.replay import final_view
    from zeromon.tui.app import ZeromonApp

    # With --run: once its ranks have exited, its recording has the final state.
    final = functools.partial(final_view, args.run) if args.run is not None else None
    ZeromonApp(source, refresh_s=min(0.5, args.interval), interval_s=args.interval, final_view=final).run()
    return 0
