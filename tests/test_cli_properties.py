"""Every flag and argument of every subcommand, with any value (hypothesis): a result, or one clear line
and exit code 2, never a traceback, never a hang.

The CLI runs in this process (``main(argv)``), every command to its end: `run` starts a real (tiny) child
command, `attach` stops at its terminal check, `live` at its first poll of a closed port. Only what would
wait for a person is cut short, and said here: `live` and `targets --write` loop until Ctrl-C (their
sleep raises KeyboardInterrupt, as a Ctrl-C would), and the dashboard's web server and Dash app are not
started (they are tested for real in test_dashboard_*.py: here, what runs before anything listens), and
`demo` stops before its training (a real 2-rank run each time; tested for real in test_demo.py). Each
example has an alarm: a call that runs past it is a hang, and fails the test.
"""

from __future__ import annotations

import argparse
import signal
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zeromon.commands.live as live_command
import zeromon.commands.targets as targets_command
from zeromon.cli import build_parser, main

from conftest import REPO

HANG_S = 20  # far beyond any command's answer here (most take milliseconds; `run` a Python start)
CLEAN_CONFIG = str(REPO / "tests" / "data" / "lint" / "clean.json")
# What each command needs besides the flag under test, so that the flag is what decides.
BASE: dict[str, list[str]] = {
    "run": ["--", sys.executable, "-c", "pass"], "summary": ["."], "lint": [CLEAN_CONFIG], "plan": ["--params", "7B"],
    "report": ["."], "whatif": [".", "comm=hidden"], "export": ["."], "targets": [], "live": ["--once", "127.0.0.1:1"], "hang": ["127.0.0.1:1"], "attach": ["127.0.0.1:1"], "dashboard": [],
    "demo": ["--no-tui"], "doctor": [],
}
# Flags whose value is a command line of its own, or that need another flag to mean anything.
NEEDS = {("dashboard", "--speed"): ["--replay", "."], ("attach", "--speed"): ["--replay", "."],
         ("live", "--speed"): ["--replay", "."], ("targets", "--interval"): ["--write", "targets.json"]}


def _value_flags() -> list[tuple[str, str]]:
    """(command, option or POSITIONAL:dest) for every argument that takes a value, read from the parser."""
    parser, _ = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for command, p in sub.choices.items():
        for action in p._actions:
            if action.nargs == 0 or isinstance(action, argparse._HelpAction) or action.nargs == argparse.REMAINDER:
                continue
            out.append((command, action.option_strings[-1] if action.option_strings else f"POSITIONAL:{action.dest}"))
    return out


VALUE_FLAGS = _value_flags()

_words = st.sampled_from([
    "", " ", "-", "--", "0", "-1", "1", "7B", "80GiB", "200GB/s", "nan", "inf", "-inf", "1e400", "1e-9", "0x10", "٣",
    ".", "..", "/", "/nonexistent/x", "~", "tests", "runs/x", "127.0.0.1:1", "[::1]:1", "host:", ":1", "http://[::1",
    "http://127.0.0.1:1", "0.0.0.0", "::", "localhost", "all", "cpu", "nvme", "zero-paper", "a,b,c,d,e",
    "1,1,1,1,1", "os:getcwd", "x.py:f", "tiny.json", "-7e9", "99999999999999999999", "1" * 120,
])
values = st.one_of(_words, st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=24))


class _Hang(Exception):
    pass


@pytest.fixture
def bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch working folder, the loops' sleeps made Ctrl-C, the dashboard's server and app stood in for,
    and an alarm for hangs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZEROMON_REGISTRY", str(tmp_path / "registry"))  # no other run on this machine is found

    def interrupted(_s: float) -> None:
        raise KeyboardInterrupt

    for module in (live_command, targets_command):
        monkeypatch.setattr(module, "time", types.SimpleNamespace(sleep=interrupted, strftime=_strftime,
                                                                  localtime=_localtime))
    import zeromon.commands.dashboard as dashboard_command
    import zeromon_dashboard.app
    import zeromon_dashboard.server

    monkeypatch.setattr(zeromon_dashboard.app, "create_app", lambda feed, **kwargs: object())
    monkeypatch.setattr(zeromon_dashboard.server, "make_server", lambda *args, **kwargs: _Server())
    monkeypatch.setattr(dashboard_command, "_calm_the_collector", lambda: None)
    monkeypatch.setattr(dashboard_command, "_one_malloc_arena", lambda: None)
    import zeromon.commands.demo as demo_command

    monkeypatch.setattr(demo_command, "_train", lambda *args, **kwargs: 0)
    monkeypatch.setattr(demo_command, "_train_with_dashboard", lambda *args, **kwargs: 0)
    monkeypatch.setattr(demo_command, "_verdict", lambda *args, **kwargs: 0)

    def hang(_signum: int, _frame: object) -> None:
        raise _Hang(f"no answer within {HANG_S} s")

    previous = signal.signal(signal.SIGALRM, hang)
    try:
        yield tmp_path
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _strftime(fmt: str, t: Any = None) -> str:
    import time

    return time.strftime(fmt, t) if t is not None else time.strftime(fmt)


def _localtime(t: float | None = None) -> Any:
    import time

    return time.localtime(t)


class _Server:
    server_port = 1

    def serve_forever(self) -> None:
        raise KeyboardInterrupt  # as a Ctrl-C would end it

    def server_close(self) -> None:
        pass


@pytest.mark.parametrize(("command", "option"), VALUE_FLAGS)
@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=values)
def test_any_value_of_any_flag_gives_a_result_or_one_line_and_exit_2(bounded: Path, command: str, option: str,
                                                                     value: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    if option == "POSITIONAL:cmd":  # `run`'s command line: any command is `run`'s to start (test_faults)
        return
    if option.startswith("POSITIONAL:"):  # after "--": a value may start with "-"
        argv = [command, *({"live": ["--once"]}.get(command, [])), "--", value]
    else:
        base = BASE[command] + NEEDS.get((command, option), [])
        cut = base.index("--") if "--" in base else len(base)
        argv = [command, *base[:cut], f"{option}={value}", *base[cut:]]
    signal.alarm(HANG_S)
    try:
        code = main(argv)
    finally:
        signal.alarm(0)
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out, argv
    assert code in (0, 1, 2, 3, 130), (argv, code, err)
    if code == 2:
        lines = err.splitlines()
        errors = [line for line in lines if line.startswith("zeromon: error: ")]
        assert len(errors) == 1 and len(errors[0]) < 600, (argv, err)
        assert all(line.startswith(("zeromon: error: ", "hint: ", "usage: ", "zeromon: warning: ", " "))
                   for line in lines), (argv, err)
