"""`zeromon run [--out DIR] -- CMD ...`: run a training command with the agent in every rank."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from zeromon.errors import ZeromonError

NAME = "run"
HELP = "run a training command with the agent injected into every rank"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run CMD with zeromon's agent in every Python process it starts; each rank that "
                          "creates a process group records to DIR/rank-<r>.jsonl. Example: zeromon run --out "
                          "runs/x -- torchrun --nproc-per-node 2 examples/fsdp2_train.py")
    parser.add_argument("--out", metavar="DIR", help="run folder (default: zeromon-runs/<time>)")
    parser.add_argument("--job", metavar="NAME", help="job name recorded with the run (default: the script name)")
    parser.add_argument("--quiet", action="store_true", help="no summary when the command ends")
    parser.add_argument("--bind", metavar="ADDR",
                        help="address the ranks' endpoints listen on (default 127.0.0.1; sets ZEROMON_BIND). "
                        "Another address is reachable from other machines: set ZEROMON_TOKEN too")
    parser.add_argument("--port", metavar="N",
                        help="base port of the ranks' endpoints: each listens on N + its local rank, else the next "
                        "free port (default 9470; 0: any free port; sets ZEROMON_PORT)")
    parser.add_argument("--tui", action="store_true",
                        help="watch the run in the live TUI (zeromon attach) while it trains; the command's output "
                        "goes to DIR/launcher.log. Quitting the TUI leaves the command running: zeromon run "
                        "waits for it and exits with its exit status")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")


def run(args: argparse.Namespace) -> int:
    return cmd_run(args)


def _package_roots() -> list[str]:
    """Folders that make zeromon and zeromon_agent importable in the child processes."""
    import zeromon
    import zeromon_agent

    roots = []
    for module in (zeromon, zeromon_agent):
        root = str(Path(module.__file__ or "").resolve().parent.parent)
        if root not in roots:
            roots.append(root)
    return roots


def cmd_run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ZeromonError("zeromon run: no command given",
                           hint="usage: zeromon run [--out DIR] -- CMD ..., e.g. zeromon run -- "
                           "torchrun --nproc-per-node 2 examples/fsdp2_train.py")
    # Refuse bad ZEROMON_* settings here, naming the variable, rather than in every rank.
    from zeromon_agent.config import load_config

    load_config()
    endpoint_env = {}
    for flag, var, value in (("--bind", "ZEROMON_BIND", args.bind), ("--port", "ZEROMON_PORT", args.port)):
        if value is None:
            continue
        try:
            load_config({var: value})
        except ZeromonError as exc:
            raise ZeromonError(exc.message.replace(f"{var}=", f"{flag} ").replace(var, flag),
                               hint=(exc.hint or "").replace(var, flag)) from None
        endpoint_env[var] = value
    bind = endpoint_env.get("ZEROMON_BIND", os.environ.get("ZEROMON_BIND", "127.0.0.1"))
    if not _loopback(bind) and not os.environ.get("ZEROMON_TOKEN"):
        print(f"zeromon: warning: the endpoints listen on {bind} without ZEROMON_TOKEN: whoever reaches this "
              "machine can read the metrics and snapshots", file=sys.stderr)
    if args.tui:
        from zeromon.commands.attach import require_terminal

        require_terminal("zeromon run --tui")
    out = Path(args.out) if args.out else Path("zeromon-runs") / time.strftime("%Y%m%d-%H%M%S")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ZeromonError(f"--out {out}: cannot create the run folder: {exc.strerror}") from None
    import zeromon_agent.bootstrap

    site_dir = str(Path(zeromon_agent.bootstrap.__file__).resolve().parent / "site")
    env = dict(os.environ)
    paths = [site_dir, *_package_roots()]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["ZEROMON_OUT"] = str(out.resolve())
    env.setdefault("ZEROMON_ENABLE", "1")
    if args.job:
        env["ZEROMON_JOB"] = args.job
    env.update(endpoint_env)

    log = (out / "launcher.log").open("ab") if args.tui else None
    try:
        if log is None:
            child = subprocess.Popen(cmd, env=env)
        else:  # the TUI owns the terminal: the command's output goes to the log, and it reads no keys
            child = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    except FileNotFoundError:
        raise ZeromonError(f"zeromon run: command not found: {cmd[0]}") from None
    except PermissionError:
        raise ZeromonError(f"zeromon run: permission denied: {cmd[0]}") from None
    finally:
        if log is not None:
            log.close()  # the child has its own descriptor
    if args.tui:
        _watch(child, out)

    def forward(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not args.quiet:
        _print_run_summary(out)
    return code if code >= 0 else 128 - code


def _loopback(address: str) -> bool:
    import ipaddress

    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _watch(child: subprocess.Popen[bytes], out: Path) -> None:
    """The TUI on the run's folder until the user quits it; the command goes on either way."""
    from zeromon.sources.live import LiveSource
    from zeromon.tui.app import ZeromonApp

    log = out / "launcher.log"

    def status() -> tuple[str, bool]:
        code = child.poll()
        if code is None:
            return f"job running (pid {child.pid}, output: launcher.log)", False
        return f"the job ended with exit status {code} (output in {log}); q quits", True

    try:
        ZeromonApp(LiveSource(run_dir=out), status=status).run()
    except Exception as exc:  # the TUI failing must not take the job with it
        print(f"zeromon: the TUI stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
    if child.poll() is None:
        print(f"zeromon: the job goes on (pid {child.pid}, output in {log}); waiting for it to end "
              "(Ctrl-C stops it)", file=sys.stderr)


def _print_run_summary(out: Path) -> None:
    files = sorted(out.glob("rank-*.jsonl"))
    if not files:
        print(f"zeromon: no rank recorded in {out} (did the command create a torch.distributed process "
              "group? is ZEROMON_ENABLE=0 set?)", file=sys.stderr)
        return
    try:
        from zeromon.analysis.recording_summary import format_summary, summarize_run

        print(format_summary(summarize_run(out)), file=sys.stderr)
    except ZeromonError as exc:
        print(f"zeromon: {exc}", file=sys.stderr)


