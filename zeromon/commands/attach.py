"""`zeromon attach [RUN_DIR | TARGET ...] [--prometheus URL] [--replay DIR ...]`: the live TUI."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import TYPE_CHECKING

from zeromon.commands.source_flags import (
    REPLAY,
    Sources,
    add_source_arguments,
    read_sources,
    say_missing_ranks,
    token_flag,
)
from zeromon.errors import ZeromonError
from zeromon.model.numbers import POLL_SECONDS, flag

if TYPE_CHECKING:
    from zeromon.tui.app import Source

NAME = "attach"
HELP = "the live terminal view of a run: ranks, memory, overlap, findings (q quits, ? helps)"

_USAGE_HINT = ("zeromon attach   (the newest local run)   ·   zeromon attach runs/x   ·   "
               "zeromon attach 127.0.0.1:9470 127.0.0.1:9471   ·   zeromon attach --replay runs/x   ·   "
               "zeromon attach --replay node0 node1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Watch a running ZeRO / FSDP job in the terminal: one row per rank (memory, headroom, OOM "
                          "risk, step time, overlap, exposed communication, bus bandwidth), sparklines over the "
                          "last steps, findings with their remedies, and a drill-down per rank (enter). Without "
                          "arguments it follows the newest local run (the user-level index, ZEROMON_REGISTRY). "
                          "When no agent answers it says where it looked and keeps looking.")
    add_source_arguments(parser)
    parser.add_argument("--token", type=token_flag, help="the agents' bearer token (default: ZEROMON_TOKEN)")
    parser.add_argument("--interval", metavar="S", type=flag("--interval", POLL_SECONDS), default=1.0,
                        help=f"seconds between polls of the agents (default 1; {POLL_SECONDS.accepts})")


def build_source(args: argparse.Namespace, sources: Sources) -> Source:
    """The source the flags ask for; ZeromonError naming the flag."""
    if sources.kind == REPLAY:
        if args.token:
            raise ZeromonError("zeromon attach: --replay plays a recording; it takes no --token", hint=_USAGE_HINT)
        from zeromon.commands.progress import Progress
        from zeromon.sources.replay import ReplaySource

        with Progress("ranks read for the replay") as progress:  # before the screen is taken
            source: Source = ReplaySource(sources.replay, speed=sources.speed, progress=progress,
                                          workers=None)  # no thread here yet: the readers may fork
        say_missing_ranks(sources.replay)  # before the screen is taken: it stays above the app's
        return source
    from zeromon.sources.live import LiveSource

    return LiveSource(targets=list(sources.targets) or None, run_dir=sources.run_dir, prometheus=sources.prometheus,
                      token=args.token, interval_s=args.interval)


def require_terminal(what: str) -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ZeromonError(f"{what} draws in a terminal, and stdin or stdout is not one",
                           hint="for text that pipes, use `zeromon live` (one line per rank, --json too)")


def run(args: argparse.Namespace) -> int:
    sources = read_sources(args, NAME)  # the same checks as live, targets, dashboard
    source = build_source(args, sources)  # bad flags: exit 2 before the screen is taken
    require_terminal("zeromon attach")
    from zeromon.sources.replay import final_view
    from zeromon.tui.app import ZeromonApp

    # With --run: once its ranks have exited, its recording has the final state.
    final = functools.partial(final_view, sources.run_dir) if sources.run_dir is not None else None
    ZeromonApp(source, refresh_s=min(0.5, args.interval), interval_s=args.interval, final_view=final).run()
    return 0
