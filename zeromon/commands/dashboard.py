"""`zeromon dashboard [RUN_DIR ... | TARGET ...] [--prometheus URL] [--replay DIR ...] [--trace DIR]`:
the Dash web dashboard."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from zeromon.commands.source_flags import (
    REPLAY,
    RUN,
    add_source_arguments,
    read_sources,
    say_missing_ranks,
    token_flag,
)
from zeromon.errors import ZeromonError
from zeromon.model.numbers import BUS_BANDWIDTH, CAPACITY, PORT, REFRESH_SECONDS, flag

NAME = "dashboard"
HELP = "the web dashboard of a run: OOM risk, exposed communication, memory, timelines, ranks, planner"

_USAGE_HINT = ("zeromon dashboard   (the newest local run)   ·   zeromon dashboard runs/x   ·   "
               "zeromon dashboard node0 node1   ·   zeromon dashboard --replay runs/x   ·   zeromon dashboard --prometheus http://prom:9090   ·   "
               "zeromon dashboard --trace traces/")
DEFAULT_PORT = 8050
# Recent collectives kept per rank from live agents, for the step timeline: a few steps of a large
# FSDP model (hundreds of collectives a step), a few hundred bytes each.
LIVE_COLLECTIVES_KEPT = 2048


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "A web dashboard for a ZeRO / FSDP job, in the browser: at first glance the worst OOM risk and the "
        "worst exposed communication with the rank they are on, a grid of every rank, and the findings with "
        "their remedies; then memory by category over time against capacity, one step's timeline of phases "
        "and collectives, overlap and bandwidth, step time per rank and step, and the ZeRO memory planner. "
        "Without arguments it follows the newest local run, as `zeromon attach` does. The page's URL keeps "
        "the page, ranks and step: paste it to a colleague.")
    add_source_arguments(parser)  # a RUN_DIR here is its recording, read again while the run writes it
    parser.add_argument("--trace", metavar="DIR", help="PyTorch profiler (Kineto) traces: the Trace page")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; another one only with a token)")
    parser.add_argument("--port", type=flag("--port", PORT), default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0: any free)")
    parser.add_argument("--token", type=token_flag, help="require this bearer token (default: ZEROMON_TOKEN); a browser opens "
                        "the page once with ?token=...")
    parser.add_argument("--path-prefix", default="/", metavar="PATH",
                        help="serve under this path, behind a reverse proxy or JupyterHub's (e.g. /user/me/proxy/8050/)")
    parser.add_argument("--interval", metavar="S", type=flag("--interval", REFRESH_SECONDS), default=1.0,
                        help=f"seconds between refreshes of a live page (default 1; {REFRESH_SECONDS.accepts}: each "
                             "refresh redraws the page in every open browser)")
    parser.add_argument("--capacity", metavar="SIZE", type=flag("--capacity", CAPACITY),
                        help="memory capacity per rank to forecast against (recordings), e.g. 80GiB")
    parser.add_argument("--peak-busbw", metavar="RATE", type=flag("--peak-busbw", BUS_BANDWIDTH),
                        help="the link's peak bus bandwidth, e.g. 200GB/s (recordings)")
    parser.add_argument("--debug", action="store_true", help="Dash's debug mode (tracebacks in the browser: "
                        "never on a shared address)")


def build_feed(args: argparse.Namespace) -> tuple[Any, str]:
    """The feed the flags ask for and what it watches, in words; ZeromonError naming the flag."""
    from zeromon.commands.progress import Progress
    from zeromon.model.codec import rank_file_paths, run_name
    from zeromon.views import run_data

    # The same checks as attach, live, targets; a recording may be several folders (one per node).
    sources = read_sources(args, NAME, others={"--trace": args.trace}, several=(RUN, REPLAY))
    recording_only = [flag for flag, value in (("--capacity", args.capacity), ("--peak-busbw", args.peak_busbw))
                      if value is not None]
    if recording_only and sources.kind != RUN:
        raise ZeromonError(f"{recording_only[0]} applies to a recording (RUN_DIR)", hint=_USAGE_HINT)
    if args.trace is not None:
        if not os.path.exists(args.trace):
            raise ZeromonError(f"--trace {args.trace}: no such folder or file",
                               hint="a folder of PyTorch profiler traces (*.json, *.json.gz)")
        return run_data.StaticFeed(run_data.trace_data(args.trace)), f"traces in {args.trace}"
    if sources.kind == REPLAY:
        with Progress("reads of the rank files for the replay (two a rank)") as progress:
            replay = run_data.ReplayFeed(sources.replay, speed=sources.speed, progress=progress, workers=None)
        say_missing_ranks(sources.replay)
        return replay, f"replay of {run_name(sources.replay)}"
    run_dirs = tuple(sources.run_dirs) if sources.kind == RUN else ()
    if run_dirs and (len(run_dirs) > 1 or (rank_file_paths(Path(run_dirs[0])) and not _starting(Path(run_dirs[0])))):
        peak = args.peak_busbw
        with Progress("ranks read and analysed") as progress:
            feed = run_data.RecordingFeed(run_dirs, peak_busbw=float(peak) if peak else None,
                                          capacity_bytes=args.capacity,
                                          alive=run_data.run_processes_alive(run_dirs), progress=progress)
        if len(run_dirs) > 1:  # one folder may be a run just starting: its ranks come as they start
            say_missing_ranks(run_dirs)
        return feed, f"recording {run_name(run_dirs)}"
    # One folder without recordings yet, or targets, or Prometheus: live agents.
    run_dir = Path(run_dirs[0]) if run_dirs else None
    from zeromon.sources.discovery import run_entries
    from zeromon.sources.live import LiveSource

    final = None
    if run_dir is not None:
        # A run that has not written a recording yet (its ranks are starting): its registered agents,
        # live, and its recording's final state once every rank has ended.
        if not run_entries(run_dir):
            if not _may_be_a_run(run_dir):
                raise ZeromonError(f"RUN_DIR {run_dir}: not a run folder: no rank-<r>.zmr (or .jsonl) recordings, no "
                                   "agent endpoints, and files zeromon does not write",
                                   hint="a run folder is the --out of `zeromon run`; its ranks write there as they start")
            # A run whose ranks have not started (the dashboard started beside `zeromon run`): the page says so
            # (zeromon.views.fleet.no_agent_text) and shows each rank as it registers.
            print(f"zeromon dashboard: waiting for the ranks of {run_dir} to start (they register as they create "
                  "their process group)", file=sys.stderr)
        if recording_only:
            raise ZeromonError(f"{recording_only[0]} applies to a recording, and {run_dir} holds none yet",
                               hint=_USAGE_HINT)

        def final() -> run_data.RunData:
            assert run_dir is not None
            return run_data.recording_data(run_dir, workers=1)
    source = LiveSource(targets=list(sources.targets) or None, run_dir=run_dir, prometheus=sources.prometheus,
                        token=os.environ.get("ZEROMON_TOKEN") or None, interval_s=args.interval,
                        keep_collectives=LIVE_COLLECTIVES_KEPT)
    return (run_data.LiveFeed(source, interval_s=args.interval, on_error=_say_source_error, final=final),
            source.source)


def _may_be_a_run(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but what `zeromon run` writes in a run folder (its run's files, runs set
    aside, hidden files; nothing at all: it has just made it)."""
    import fnmatch

    from zeromon.commands.run import RUN_FILES

    patterns = (*RUN_FILES, "previous-*", ".*")
    try:
        return all(any(fnmatch.fnmatchcase(entry.name, p) for p in patterns) for entry in folder.iterdir())
    except OSError:
        return False


def _starting(run_dir: Path) -> bool:
    """A run whose ranks have started (their endpoints registered, their processes alive) but whose files
    hold no record yet (the agent writes at its first pass): watched live until it has."""
    from zeromon.model.codec import iter_records, rank_file_paths
    from zeromon.sources.discovery import run_entries
    from zeromon.views.run_data import run_processes_alive

    if not run_entries(run_dir) or not run_processes_alive(run_dir)():
        return False
    for path in rank_file_paths(run_dir):
        try:
            if next(iter(iter_records(path)), None) is not None:
                return False
        except (ZeromonError, OSError, ValueError):
            return False  # the recording's reader says what is wrong
    return True


def _calm_the_collector() -> None:
    """A full garbage collection walks every object the process holds, long with a large recording loaded, and
    lands in the middle of a page's refresh (tests/bench/bench_dashboard.py). What exists once the data is
    loaded and the app built is frozen out of them, and they run a tenth as often: a refresh's garbage is
    young and dies young (as the TUI does, zeromon/tui/app.py)."""
    import gc

    gc.collect()
    gc.freeze()
    first, second, _ = gc.get_threshold()
    gc.set_threshold(first, second, 100)


def _one_malloc_arena() -> None:
    """One glibc malloc arena for the whole process (mallopt M_ARENA_MAX = 1). The server answers each request
    on a thread of its own, and glibc gives threads arenas of their own (up to 8 per core): what a page's
    drawing frees in one stays there, scattered over them, and the process holds more after its pages than
    with one arena (tests/bench/bench_dashboard.py). The price is a lock the GIL mostly takes already. Nothing
    where there is no glibc."""
    import ctypes
    import ctypes.util

    m_arena_max = -8  # glibc's malloc.h
    try:
        name = ctypes.util.find_library("c")
        mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
        if mallopt is not None:
            mallopt(m_arena_max, 1)
    except OSError:
        pass


def _say_source_error(error: str | None) -> None:
    """The terminal hears what the page shows: a dead Prometheus, no agent found, and when it clears."""
    if error is None:
        print("zeromon dashboard: the source answers again", file=sys.stderr, flush=True)
    else:
        print(f"zeromon dashboard: {error}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from zeromon.commands.addresses import check_bind

    _one_malloc_arena()  # before any thread starts

    check_bind(args.host, "--host")
    token = args.token if args.token is not None else os.environ.get("ZEROMON_TOKEN") or None
    from zeromon_dashboard.server import describe_bind_error, loopback, make_server

    local = loopback(args.host)
    if args.debug and not local:
        raise ZeromonError(f"--debug on --host {args.host}: debug mode shows tracebacks and source to whoever "
                           "reaches the page; use it on 127.0.0.1 only")
    feed, what = build_feed(args)  # bad flags and unreadable runs: exit 2 before anything listens
    from zeromon_dashboard.app import create_app

    app = create_app(feed, prefix=args.path_prefix, refresh_s=args.interval, allow_model_import=local)
    _calm_the_collector()
    if args.debug:
        app.enable_dev_tools(debug=True)
    try:
        server = make_server(app, args.host, args.port, args.path_prefix, token)
    except OSError as exc:
        feed.stop()
        raise ZeromonError(describe_bind_error(args.host, args.port, exc)) from None
    if not local and not token:
        print(f"zeromon: warning: the dashboard listens on {args.host} without a token: whoever reaches this "
              "machine can read the run (set ZEROMON_TOKEN or --token)", file=sys.stderr)
    host = f"[{args.host}]" if ":" in args.host else args.host
    prefix = "/" + args.path_prefix.strip("/") + "/" if args.path_prefix.strip("/") else "/"
    print(f"zeromon dashboard: http://{host}:{server.server_port}{prefix} ({what}; Ctrl-C stops)", flush=True)
    feed.start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        feed.stop()
    return 0
