"""`zeromon dashboard [RUN_DIR | TARGET ...] [--run DIR] [--prometheus URL] [--replay DIR] [--trace DIR]`:
the Dash web dashboard."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from zeromon.errors import ZeromonError
from zeromon.model.numbers import BUS_BANDWIDTH, CAPACITY, PORT, REFRESH_SECONDS, REPLAY_SPEED, flag

NAME = "dashboard"
HELP = "the web dashboard of a run: OOM risk, exposed communication, memory, timelines, ranks, planner"

_USAGE_HINT = ("zeromon dashboard   (the newest local run)   ·   zeromon dashboard runs/x   ·   "
               "zeromon dashboard --replay runs/x   ·   zeromon dashboard --prometheus http://prom:9090   ·   "
               "zeromon dashboard --trace traces/")
DEFAULT_PORT = 8050
# Recent collectives kept per rank from live agents, for the step timeline: a few steps of a large
# FSDP model (~240 collectives a step); ~300 bytes each.
LIVE_COLLECTIVES_KEPT = 2048


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "A web dashboard for a ZeRO / FSDP job, in the browser: at first glance the worst OOM risk and the "
        "worst exposed communication with the rank they are on, a grid of every rank, and the findings with "
        "their remedies; then memory by category over time against capacity, one step's timeline of phases "
        "and collectives, overlap and bandwidth, step time per rank and step, and the ZeRO memory planner. "
        "Without arguments it follows the newest local run, as `zeromon attach` does. The page's URL keeps "
        "the page, ranks and step: paste it to a colleague.")
    parser.add_argument("sources", nargs="*", metavar="RUN_DIR | TARGET",
                        help="a run folder (its recording, read again while it grows), or host:port of agents")
    parser.add_argument("--run", metavar="RUN_DIR", help="the live agents registered in this run folder")
    parser.add_argument("--prometheus", metavar="URL", help="read every rank through a Prometheus server's HTTP API")
    parser.add_argument("--replay", metavar="RUN_DIR", help="play a recorded run back")
    parser.add_argument("--speed", metavar="X", type=flag("--speed", REPLAY_SPEED),
                        help=f"replay speed, 1 = real time (default 1; {REPLAY_SPEED.accepts})")
    parser.add_argument("--trace", metavar="DIR", help="PyTorch profiler (Kineto) traces: the Trace page")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; another one only with a token)")
    parser.add_argument("--port", type=flag("--port", PORT), default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0: any free)")
    parser.add_argument("--token", help="require this bearer token (default: ZEROMON_TOKEN); a browser opens "
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
    from zeromon.sources.discovery import parse_target
    from zeromon.views import run_data

    given = {flag: value for flag, value in (("RUN_DIR/TARGET", args.sources), ("--run", args.run),
                                               ("--prometheus", args.prometheus), ("--replay", args.replay),
                                               ("--trace", args.trace)) if value}
    if len(given) > 1:
        raise ZeromonError(f"give one source: {' and '.join(given)} were given", hint=_USAGE_HINT)
    if args.speed is not None and args.replay is None:
        raise ZeromonError("--speed applies to --replay only", hint=_USAGE_HINT)
    recording_only = [flag for flag, value in (("--capacity", args.capacity), ("--peak-busbw", args.peak_busbw))
                      if value is not None]
    folders = [s for s in args.sources if os.path.isdir(s)]
    if recording_only and not folders:
        raise ZeromonError(f"{recording_only[0]} applies to a recording (RUN_DIR)", hint=_USAGE_HINT)
    if args.trace is not None:
        if not os.path.exists(args.trace):
            raise ZeromonError(f"--trace {args.trace}: no such folder or file",
                               hint="a folder of PyTorch profiler traces (*.json, *.json.gz)")
        return run_data.StaticFeed(run_data.trace_data(args.trace)), f"traces in {args.trace}"
    if args.replay is not None:
        speed = 1.0 if args.speed is None else args.speed
        if not os.path.isdir(args.replay):
            raise ZeromonError(f"--replay {args.replay}: no such folder",
                               hint="a run folder is the --out of `zeromon run`; it holds rank-*.jsonl")
        return run_data.ReplayFeed(args.replay, speed=speed), f"replay of {args.replay}"
    if folders:
        if len(args.sources) > 1:
            raise ZeromonError(f"RUN_DIR {folders[0]}: give one run folder, or host:port targets, not both",
                               hint=_USAGE_HINT)
        run_dir = Path(folders[0])
        peak = args.peak_busbw
        feed = run_data.RecordingFeed(run_dir, peak_busbw=float(peak) if peak else None,
                                      capacity_bytes=args.capacity,
                                      alive=run_data.run_processes_alive(run_dir))
        return feed, f"recording {run_dir}"
    for target in args.sources:
        if ":" not in target:
            raise ZeromonError(f"RUN_DIR {target}: no such folder (nor a host:port target)", hint=_USAGE_HINT)
        parse_target(target, what="TARGET")
    from zeromon.sources.live import LiveSource

    source = LiveSource(targets=args.sources or None, run_dir=args.run, prometheus=args.prometheus,
                        token=os.environ.get("ZEROMON_TOKEN") or None, interval_s=args.interval,
                        keep_collectives=LIVE_COLLECTIVES_KEPT)
    final = None
    if args.run is not None:  # its recording holds the run's final state once every rank has ended
        run_dir = Path(args.run)

        def final() -> run_data.RunData:
            return run_data.recording_data(run_dir, workers=1)
    return (run_data.LiveFeed(source, interval_s=args.interval, on_error=_say_source_error, final=final),
            source.source)


def _calm_the_collector() -> None:
    """A full garbage collection walks every object the process holds: ~140 ms with a recording of
    a million records loaded, in the middle of a page's refresh (tests/bench/bench_dashboard.py saw
    one in every tenth live refresh). What exists once the data is loaded and the app built is frozen
    out of them, and they run a tenth as often: a refresh's garbage is young and dies young (as the
    TUI does, zeromon/tui/app.py)."""
    import gc

    gc.collect()
    gc.freeze()
    first, second, _ = gc.get_threshold()
    gc.set_threshold(first, second, 100)


def _say_source_error(error: str | None) -> None:
    """The terminal hears what the page shows: a dead Prometheus, no agent found, and when it clears."""
    if error is None:
        print("zeromon dashboard: the source answers again", file=sys.stderr, flush=True)
    else:
        print(f"zeromon dashboard: {error}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from zeromon.commands.run import _check_bind

    _check_bind(args.host, "--host")
    token = args.token if args.token is not None else os.environ.get("ZEROMON_TOKEN") or None
    if args.token is not None and not args.token.strip():
        raise ZeromonError("--token: empty; give the secret, or leave --token out")
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
