"""`zeromon demo [--scenario S] [--dashboard | --no-tui]`: a real 2-rank training with a known problem,
watched by zeromon, so that a newcomer sees what it finds before building a broken run of their own.

The training (zeromon/demo/train.py and the ranks' training.py, shipped in the package) runs under
`zeromon run`'s own code (its parser and cmd_run: the agent injected in every rank, the recording, the
summary), on CPU with gloo, whatever the machine has.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from zeromon.demo import DEFAULT_STEPS, RANKS, SCENARIOS, TRAIN_SCRIPT, Scenario
from zeromon.errors import ZeromonError
from zeromon.model.numbers import PORT, Count, flag

NAME = "demo"
HELP = "watch a real 2-rank training with a known problem (leak, exposed, straggler) in the TUI"
STEPS = Count(1, 100_000)
DASHBOARD_PORT = 8050  # `zeromon dashboard`'s default
EXIT_NOT_FOUND = 1  # the scenario's finding did not appear (healthy: a warning did)
RANKS_LOOKED_FOR_S = 0.2  # how often the run folder is looked at for the first rank
DASHBOARD_STOP_S = 10.0  # its server stops at SIGINT at once; past this it is killed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = ", ".join(f"{s.name} ({s.expect.split(':')[0]})" for s in SCENARIOS.values())
    parser.description = (
        f"Run a real {RANKS}-rank PyTorch FSDP2 training on CPU (gloo) under zeromon's agent, as `zeromon run` "
        "would, and watch it in the live TUI; --dashboard serves it in the browser instead, --no-tui prints the "
        f"findings at the end. Each scenario builds in one problem and shows the finding zeromon raises for it: "
        f"{names}. The training ends after --steps steps (~20 s after 5-10 s of start); the TUI then shows "
        "the ended run until q, the dashboard until Ctrl-C. Ctrl-C stops the training at the end of a step "
        "(in the TUI: q, then Ctrl-C). The recording stays in --out (default zeromon-runs/demo-<scenario>-<time>) "
        "for `zeromon report`.")
    parser.add_argument("--scenario", choices=list(SCENARIOS), default="healthy",
                        help="the problem built into the training (default healthy: none)")
    parser.add_argument("--steps", metavar="N", type=flag("--steps", STEPS), default=DEFAULT_STEPS,
                        help=f"training steps (default {DEFAULT_STEPS}; {STEPS.accepts})")
    parser.add_argument("--out", metavar="DIR", help="run folder (default: zeromon-runs/demo-<scenario>-<time>)")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--dashboard", action="store_true",
                      help="serve the web dashboard on the run (127.0.0.1) instead of the TUI, until Ctrl-C")
    view.add_argument("--no-tui", action="store_true",
                      help="no TUI: train, print the findings, exit 0 when the scenario's finding appeared "
                           f"(healthy: when no warning did), {EXIT_NOT_FOUND} when not")
    parser.add_argument("--port", metavar="N", type=flag("--port", PORT),
                        help=f"the dashboard's port with --dashboard (default {DASHBOARD_PORT}; {PORT.accepts})")


def run(args: argparse.Namespace) -> int:
    scenario = SCENARIOS[args.scenario]
    if args.port is not None and not args.dashboard:
        raise ZeromonError("--port is the dashboard's: it applies with --dashboard only",
                           hint="zeromon demo --dashboard --port N")
    tui = not (args.no_tui or args.dashboard)
    if tui and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ZeromonError("zeromon demo draws its TUI in a terminal, and stdin or stdout is not one",
                           hint="zeromon demo --no-tui trains and prints the findings; --dashboard serves them "
                                "in a browser")
    out = Path(args.out) if args.out else Path("zeromon-runs") / f"demo-{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    _say_intro(scenario, args.steps, tui, args.dashboard)
    with _environment(_ranks_env(scenario)):
        if args.dashboard:  # the verdict is printed while the dashboard serves, before Ctrl-C
            return _train_with_dashboard(scenario, out, args.steps,
                                         DASHBOARD_PORT if args.port is None else args.port)
        code = _train(scenario, out, args.steps, tui=tui)
    if code != 0:
        return code
    return _verdict(scenario, out)


def _say_intro(scenario: Scenario, steps: int, tui: bool, dashboard: bool) -> None:
    say(f"scenario {scenario.name}: {scenario.training}")
    say(f"expect: {scenario.expect}")
    if scenario.note:
        say(f"note: {scenario.note}")
    where = "in the TUI (q quits once you have read it)" if tui else \
        "in the dashboard (Ctrl-C stops it)" if dashboard else "here when it ends"
    say(f"{RANKS} ranks on CPU (gloo), {steps} steps; starting torch takes a few seconds; the findings show "
        f"{where}; Ctrl-C stops the training")


def say(line: str) -> None:
    print(f"zeromon demo: {line}", file=sys.stderr, flush=True)


def _ranks_env(scenario: Scenario) -> dict[str, str]:
    return {
        # CPU whatever the machine has, so that every machine shows the same thing (with a GPU visible
        # the agent would forecast the GPU's memory, which this training does not use).
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",  # one thread a rank keeps the demo light on a few cores
        # glibc keeps freed memory resident once its mmap threshold adapts upward, and RSS (the level on
        # CPU) then creeps a little every step for a while, which the forecast rightly calls slow growth; a
        # fixed threshold makes RSS follow the live tensors, as a GPU allocator's count does.
        "MALLOC_MMAP_THRESHOLD_": "131072",
        **scenario.env,
    }


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with ``values`` set, as `zeromon run` hands its environment to the job; restored after
    (tests call the CLI in-process)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _training_command(scenario: Scenario, steps: int) -> list[str]:
    return [sys.executable, str(TRAIN_SCRIPT), "--scenario", scenario.name, "--steps", str(steps),
            "--ranks", str(RANKS)]


def _train(scenario: Scenario, out: Path, steps: int, tui: bool) -> int:
    """The training under `zeromon run`'s own parser and code: the agent in every rank, the recording in
    ``out``, with --tui the TUI until q (the training's output then goes to out/launcher.log)."""
    from zeromon.commands import run as run_command

    parser = argparse.ArgumentParser(prog="zeromon run")
    run_command.add_arguments(parser)
    argv = ["--out", str(out), "--job", f"demo-{scenario.name}", *(["--tui"] if tui else []),
            "--", *_training_command(scenario, steps)]
    return int(run_command.cmd_run(parser.parse_args(argv)))


def _train_with_dashboard(scenario: Scenario, out: Path, steps: int, port: int) -> int:
    """`zeromon dashboard OUT` (the real command, in a child process) from the moment the ranks have
    registered (a run folder with neither agents nor a recording is refused: the dashboard needs
    something to follow) while the training runs, and after it ends, on its final state, until Ctrl-C.
    Ctrl-C ends it with exit code 0, also while the verdict is still being made (it is then not printed,
    and never made a second time: an import that Ctrl-C cut short cannot be repeated in one process)."""
    _check_port_free(port)  # said before a minute of training, not after
    out.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_dashboard_once_ranks_start, args=(out, port, started, stop),
                               name="zeromon-demo-dashboard", daemon=True)
    watcher.start()
    try:
        code = _train(scenario, out, steps, tui=False)
        stop.set()
        watcher.join()
        if code != 0:
            return code
        if not started:  # the ranks ended before they registered: the recording is all there is
            started.append(_start_dashboard(out, port))
        say("the training ended; the dashboard shows its final state until Ctrl-C")
        _verdict(scenario, out)
        started[0].wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        stop.set()
        watcher.join()
        for process in started:
            _stop(process)


def _check_port_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ZeromonError(f"--port {port}: 127.0.0.1:{port} cannot be bound ({exc.strerror})",
                               hint="another program listens there: zeromon demo --dashboard --port N") from None


def _start_dashboard(out: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "zeromon", "dashboard", str(out), "--host", "127.0.0.1",
                             "--port", str(port)])


def _dashboard_once_ranks_start(out: Path, port: int, started: list[subprocess.Popen[bytes]],
                                stop: threading.Event) -> None:
    """Starts the dashboard as soon as a rank has registered its endpoint or written its recording."""
    from zeromon.model.codec import rank_file_paths
    from zeromon.sources.discovery import run_entries

    while not stop.wait(RANKS_LOOKED_FOR_S):
        if run_entries(out) or rank_file_paths(out):
            started.append(_start_dashboard(out, port))
            return


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=DASHBOARD_STOP_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _verdict(scenario: Scenario, out: Path) -> int:
    """The recording's findings, as `zeromon report` makes them, and whether the scenario's showed."""
    from zeromon.analysis.finding_groups import group_findings
    from zeromon.sources.run_analysis import analyse_run

    report = analyse_run(out, workers=1)
    shown = group_findings(f for f in report.findings if f.severity.value != "info")  # one entry per problem
    print(f"findings of {out} ({len(shown)} warning{'s' if len(shown) != 1 else ''} or worse):")
    for group in shown:
        print(f"  [{group.severity.value}] {group.title}")
    found = group_findings(scenario.found(report.findings))
    if scenario.passed(report.findings):
        what = "no warning, as expected" if not scenario.kinds else f"zeromon found it: {found[0].title}"
        print(f"demo {scenario.name}: {what}")
        code = 0
    else:
        what = "a warning appeared in a healthy run" if not scenario.kinds else \
            f"the expected finding ({scenario.expect.split(':')[0]}) did not appear"
        print(f"demo {scenario.name}: {what}; a machine much busier than usual can do this, try again or with "
              "more --steps")
        code = EXIT_NOT_FOUND
    if scenario.note:
        print(f"note: {scenario.note}")
    print(f"the recording: {out}  ·  read it again: zeromon report {out}  ·  zeromon attach --replay {out}")
    sys.stdout.flush()
    return code
