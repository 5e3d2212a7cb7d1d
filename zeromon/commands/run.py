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

    try:
        child = subprocess.Popen(cmd, env=env)
    except FileNotFoundError:
        raise ZeromonError(f"zeromon run: command not found: {cmd[0]}") from None
    except PermissionError:
        raise ZeromonError(f"zeromon run: permission denied: {cmd[0]}") from None

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


