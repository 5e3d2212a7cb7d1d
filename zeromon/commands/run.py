"""`zeromon run [--out DIR] -- CMD ...`: run a training command with the agent in every rank."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zeromon.analysis.rank_ends import EXIT_RANK_DIED
from zeromon.commands.addresses import check_bind
from zeromon.errors import ZeromonError
from zeromon.model.attempts import ATTEMPTS_DIR
from zeromon.model.codec import rank_file_paths
from zeromon.model.registry import ENDPOINTS_DIR, pid_alive, read_entries

NAME = "run"
HELP = "run a training command with the agent injected into every rank"
LOG_TAIL_LINES = 15  # of a failed job's output, shown after the TUI closes (the rest is in launcher.log)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run CMD with zeromon's agent in every Python process it starts; each rank that "
                          "creates a process group records to DIR/rank-<r>.zmr (ZEROMON_FORMAT=jsonl: .jsonl). Example: zeromon run --out "
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
    endpoint_env = _endpoint_env(args, cmd)
    if args.tui:
        from zeromon.commands.attach import require_terminal

        require_terminal("zeromon run --tui")
    out = Path(args.out) if args.out else Path("zeromon-runs") / time.strftime("%Y%m%d-%H%M%S")
    made = _make_run_folder(out, "--out" if args.out else "the run folder")
    try:
        _set_aside_previous_run(out)
        child = _start(cmd, out, args, endpoint_env)
    except BaseException:
        _remove_made(made)  # a command that did not start leaves no empty run folder behind
        raise
    if args.tui:
        _watch(child, out)

    def forward(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if not args.tui:
            _load_summary()
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.tui and code != 0:
        _print_job_failure(out / "launcher.log", code)  # its output went to the log, not the terminal
    died = _print_run_summary(out, quiet=args.quiet, quiet_when_empty=args.tui and code != 0)
    if code == 0 and died:
        return EXIT_RANK_DIED  # the command says all is well, and a rank died: a script should notice
    return code if code >= 0 else 128 - code


def _make_run_folder(out: Path, flag: str) -> list[Path]:
    """Create ``out`` (and its missing parents) and check that files can be made in it; the folders
    made, innermost first. ZeromonError naming ``flag`` when it cannot be made or written: the ranks
    would record nothing."""
    made = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ZeromonError(f"{flag} {out}: cannot create the run folder: {exc.strerror or exc}") from None
    try:
        probe = tempfile.NamedTemporaryFile(dir=out, prefix=".zeromon-probe-")  # noqa: SIM115
        probe.close()
    except OSError as exc:
        _remove_made(made)
        raise ZeromonError(f"{flag} {out}: cannot write in the run folder: {exc.strerror or exc}",
                           hint="give a folder the ranks can write their recordings in") from None
    return made


def _remove_made(made: list[Path]) -> None:
    """Remove the folders _make_run_folder made, if they are still empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            return


def _start(cmd: list[str], out: Path, args: argparse.Namespace,
           endpoint_env: dict[str, str]) -> subprocess.Popen[bytes]:
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

    log_path = out / "launcher.log"
    log = log_path.open("ab") if args.tui else None
    try:
        if log is None:
            return subprocess.Popen(cmd, env=env)
        # the TUI owns the terminal: the command's output goes to the log, and it reads no keys
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    except (FileNotFoundError, PermissionError) as exc:
        if log is not None and log.tell() == 0:
            log.close()
            log_path.unlink(missing_ok=True)  # made for a command that never ran
        what = "command not found" if isinstance(exc, FileNotFoundError) else "permission denied"
        raise ZeromonError(f"zeromon run: {what}: {cmd[0]}") from None
    finally:
        if log is not None:
            log.close()  # the child has its own descriptor


def _print_job_failure(log: Path, code: int) -> None:
    how = f"exit status {code}" if code >= 0 else f"signal {-code}"
    print(f"zeromon: the job ended with {how}; its output is in {log}", file=sys.stderr)
    try:
        tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return
    if tail:
        print("zeromon: its last line:" if len(tail) == 1 else f"zeromon: its last {len(tail)} lines:",
              file=sys.stderr)
        for line in tail:
            print(f"  | {line}", file=sys.stderr)


def _endpoint_env(args: argparse.Namespace, cmd: list[str]) -> dict[str, str]:
    """The ranks' ZEROMON_BIND and ZEROMON_PORT from --bind and --port, checked here, naming the flag or
    the variable, rather than failing in every rank once the job runs."""
    from zeromon_agent import load_config

    try:
        config = load_config()
    except ZeromonError as exc:  # its hint would say again what the message says (the values accepted)
        raise ZeromonError(exc.message) from None
    endpoint_env: dict[str, str] = {}
    for flag, var, value in (("--bind", "ZEROMON_BIND", args.bind), ("--port", "ZEROMON_PORT", args.port)):
        if value is None:
            continue
        try:
            load_config({var: value})
        except ZeromonError as exc:
            raise ZeromonError(exc.message.replace(f"{var}=", f"{flag} ").replace(var, flag)) from None
        endpoint_env[var] = value  # "" as in the environment: the default
    config = load_config({**os.environ, **endpoint_env})  # what the ranks will see
    if not (config.enabled and config.endpoint):
        return endpoint_env
    bind_from = "--bind" if args.bind is not None else "ZEROMON_BIND"
    check_bind(config.bind, bind_from)
    ranks = _local_ranks(cmd)
    if config.port and ranks is not None and config.port + ranks - 1 > 65535:  # local rank L listens on base + L
        given = f"--port {config.port}" if args.port is not None else f"ZEROMON_PORT={config.port}"
        raise ZeromonError(f"{given}: {ranks} ranks per node would listen on {config.port} to "
                           f"{config.port + ranks - 1}, past the last port (65535)",
                           hint=f"a base port of at most {65536 - ranks}, or 0 (any free port)")
    if not _loopback(config.bind) and not os.environ.get("ZEROMON_TOKEN"):
        print(f"zeromon: warning: the endpoints listen on {config.bind} without ZEROMON_TOKEN: whoever reaches "
              "this machine can read the metrics and snapshots", file=sys.stderr)
    return endpoint_env



def _local_ranks(cmd: list[str]) -> int | None:
    """The ranks per node that a torchrun command line asks for (--nproc-per-node N), else None."""
    for i, arg in enumerate(cmd):
        name, eq, value = arg.partition("=")
        if name in ("--nproc-per-node", "--nproc_per_node"):
            value = value if eq else (cmd[i + 1] if i + 1 < len(cmd) else "")
            return int(value) if value.isdigit() and int(value) > 0 else None  # "gpu", "auto": not known here
    return None


# The files a run writes into its folder (zeromon_agent and --tui); see _set_aside_previous_run. A run set aside
# goes to previous-<stamp>/ beside them.
RUN_FILES = ("rank-*.zmr", "rank-*.jsonl", "oom-snapshot-rank-*.pickle", "launcher.log", ENDPOINTS_DIR, ATTEMPTS_DIR)


def _set_aside_previous_run(out: Path) -> None:
    """A run folder used again: the previous run's files move to ``previous-<its last write>/`` in it,
    so that nothing of it is lost and none of its ranks passes for this run's (a rank it had and this
    one lacks would show in discovery, `zeromon report` and the summary). Refused while an agent that
    registered there still runs on this machine."""
    found = [path for pattern in RUN_FILES for path in sorted(out.glob(pattern))]
    if not any(p.name != "launcher.log" for p in found):
        return
    for entry in read_entries(out / ENDPOINTS_DIR):
        if pid_alive(entry):
            raise ZeromonError(f"--out {out}: a run is still going there (rank {entry.rank}, pid {entry.pid})",
                               hint="give another --out, or wait for that run to end")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(max(_mtime(p) for p in found)))
    aside = out / f"previous-{stamp}"
    n = 1
    while aside.exists():
        n += 1
        aside = out / f"previous-{stamp}-{n}"
    try:
        aside.mkdir()
        for path in found:
            path.rename(aside / path.name)
    except OSError as exc:
        raise ZeromonError(f"--out {out}: it holds a previous run, which cannot be moved to {aside}: "
                           f"{exc.strerror or exc}", hint="give another --out") from None
    print(f"zeromon: {out} held a previous run: moved to {aside}", file=sys.stderr)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _loopback(address: str) -> bool:
    import ipaddress

    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _watch(child: subprocess.Popen[bytes], out: Path) -> None:
    """The TUI on the run's folder until the user quits it; the command goes on either way. When the
    command ends, the TUI shows the run's final state from its recording (the agents are gone)."""
    from zeromon.sources.live import LiveSource
    from zeromon.sources.replay import final_view
    from zeromon.tui.app import ZeromonApp
    from zeromon.views.fleet import JobStatus

    log = out / "launcher.log"

    def job() -> JobStatus:
        return JobStatus(pid=child.pid, log=str(log), exit_code=child.poll())

    try:
        ZeromonApp(LiveSource(run_dir=out), job=job, final_view=functools.partial(final_view, out)).run()
    except Exception as exc:  # the TUI failing must not take the job with it
        print(f"zeromon: the TUI stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
    if child.poll() is None:
        print(f"zeromon: the job goes on (pid {child.pid}, output in {log}); waiting for it to end "
              "(Ctrl-C stops it)", file=sys.stderr)


def _load_summary() -> None:
    """The closing summary's modules, imported while the command starts (its launcher imports torch for most of a
    second, on one core): the summary then only reads the recordings once the command ends (tests/bench/RESULTS.md,
    zeromon run's end)."""
    import zeromon.analysis.hang
    import zeromon.analysis.rank_ends
    import zeromon.analysis.recording_summary  # noqa: F401


def _print_run_summary(out: Path, quiet: bool = False, quiet_when_empty: bool = False) -> bool:
    """The run's summary on stderr (with --quiet, only how ranks died and what their recordings lost);
    whether a rank died. A recording that could not be written to its end (a full disk) is said, but is no
    rank's death: the command's own status stands."""
    files = rank_file_paths(out)
    if not files:
        if quiet_when_empty:  # the job failed, and that was said
            return False
        if not out.is_dir():
            print(f"zeromon: the run folder {out} was removed while the run was going: its recordings are lost",
                  file=sys.stderr)
            return False  # lost recordings, not a rank that died: the command's own status stands
        if quiet:
            return False
        unwritable = _unwritable(out)
        if unwritable is not None:
            print(f"zeromon: no rank recorded in {out}: the folder cannot be written now ({unwritable})",
                  file=sys.stderr)
        else:
            print(f"zeromon: no rank recorded in {out} (did the command create a torch.distributed process "
                  "group? is ZEROMON_ENABLE=0 set?)", file=sys.stderr)
        return False
    try:
        from zeromon.analysis.hang import ended_lines
        from zeromon.analysis.rank_ends import end_lines
        from zeromon.analysis.recording_summary import format_summary, summarize_run

        summary = summarize_run(out, workers=1)  # here: after the TUI's threads (--tui), no fork
        if quiet:
            said = ended_lines(summary.hang) + end_lines(summary.ends)
            for line in said + summary.restarts.lines("the run folder's rank files are"):
                print(f"zeromon: {line}", file=sys.stderr)
        else:
            print(format_summary(summary), file=sys.stderr)
        return any(end.died for end in summary.ends)
    except ZeromonError as exc:
        print(f"zeromon: {exc}", file=sys.stderr)
        return False


def _unwritable(folder: Path) -> str | None:
    """Why no file can be made in ``folder`` now (a read-only or full file system); None if one can."""
    try:
        tempfile.NamedTemporaryFile(dir=folder, prefix=".zeromon-probe-").close()  # noqa: SIM115
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


