"""`zeromon targets [RUN_DIR] [--write FILE]`: the Prometheus file_sd target list of a run's agents."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from zeromon.commands.source_flags import NEWEST, RUN, add_source_arguments, read_sources
from zeromon.errors import ZeromonError
from zeromon.model.numbers import POLL_SECONDS, flag

NAME = "targets"
HELP = "print the Prometheus file_sd targets of a run's agents (--write FILE keeps a file up to date)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)  # a RUN_DIR (or the newest local run); the other sources are refused
    parser.add_argument("--write", metavar="FILE",
                        help="write the list to FILE (atomically) and rewrite it whenever it changes, until "
                             "interrupted; point a file_sd_configs entry of Prometheus at FILE")
    parser.add_argument("--interval", metavar="S", type=flag("--interval", POLL_SECONDS),
                        help=f"with --write: seconds between looks at the registry (default 2; {POLL_SECONDS.accepts})")


def run(args: argparse.Namespace) -> int:
    from zeromon.sources.discovery import file_sd_text, resolve_run_dir, run_endpoints_folder, run_entries

    # Prometheus's targets are a run's agents: the other sources name no run (targets given are the
    # list already; Prometheus and a replay scrape nothing).
    sources = read_sources(args, NAME, takes=(RUN, NEWEST))
    if args.interval is not None:
        if args.write is None:  # printing once has nothing to repeat
            raise ZeromonError("zeromon targets: --interval goes with --write FILE (it sets how often FILE is "
                               "brought up to date)", hint="zeromon targets RUN_DIR --write FILE --interval 5")
    if args.write is None:
        run_dir = resolve_run_dir(sources.run_dir)
        problems: list[str] = []
        entries = run_entries(run_dir, problems)
        for problem in problems:
            print(f"zeromon: warning: skipped {problem}", file=sys.stderr)
        if not entries:
            raise ZeromonError(f"RUN_DIR {run_dir}: no agent endpoints registered in {run_endpoints_folder(run_dir)}",
                               hint="agents register there while the run is going, with the endpoint on "
                                    "(ZEROMON_ENDPOINT=1, the default)")
        sys.stdout.write(file_sd_text(entries))
        return 0
    return _keep_writing(Path(args.write), sources.run_dir, args.interval if args.interval is not None else 2.0)


def _keep_writing(path: Path, run_dir_arg: str | None, interval_s: float) -> int:
    """Rewrite ``path`` whenever the target list changes, until interrupted.

    Without RUN_DIR it follows the newest local run (discovery.run_to_follow): a run that starts later
    takes over; a run that ended stays (its targets then fail their scrapes, which Prometheus shows as
    up == 0) unless an older run is still going, which then takes over.
    """
    from zeromon.sources.discovery import (
        file_sd_text,
        local_runs,
        resolve_run_dir,
        run_entries,
        run_to_follow,
        write_atomically,
    )

    if not path.parent.is_dir():
        raise ZeromonError(f"--write {path}: the folder {path.parent} does not exist")
    run_dir: Path | None = resolve_run_dir(run_dir_arg) if run_dir_arg is not None else None
    followed_start_ns = -1
    written: str | None = None
    try:
        while True:
            if run_dir_arg is None:
                follow = run_to_follow(local_runs(), run_dir, followed_start_ns)
                if follow is not None:
                    followed_start_ns, run_dir = follow.start_ns, Path(follow.run_dir)
            entries = run_entries(run_dir) if run_dir is not None else []
            text = file_sd_text(entries)
            if text != written:
                try:
                    write_atomically(path, text)
                except OSError as exc:
                    raise ZeromonError(f"--write {path}: cannot write: {exc.strerror or exc}") from None
                written = text
                where = f"run {run_dir}" if run_dir is not None else "no local run yet"
                print(f"zeromon: wrote {len(entries)} target(s) ({where}) to {path}", file=sys.stderr, flush=True)
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0
