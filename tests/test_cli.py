"""The CLI as a user meets it: usage errors exit 2 with one clear message and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from bench.bench_analysis import write_recording

from zeromon.cli import main
from zeromon.model.units import parse_memory_size

from conftest import child_env, zeromon


def test_no_command_prints_usage_and_exits_2(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: zeromon" in err and "a command is required" in err


def test_a_command_imports_its_own_module_alone_and_help_lists_them_all(capsys) -> None:  # type: ignore[no-untyped-def]
    import importlib

    from zeromon.cli import build_parser, command_name
    from zeromon.commands import COMMAND_MODULES

    for module_name in COMMAND_MODULES:  # the name the parser gives a command without importing it is its own
        assert importlib.import_module(module_name).NAME == command_name(module_name)
    _, commands = build_parser("report")
    assert list(commands) == ["report"]
    check = ("import sys; from zeromon.cli import main; from zeromon.commands import COMMAND_MODULES; "
             "main(['run', '--out', sys.argv[1], '--', 'true']); "
             "print(sorted(m for m in sys.modules if m in COMMAND_MODULES))")
    out = subprocess.run([sys.executable, "-c", check, "/tmp/unused-zeromon-run-imports"], env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "['zeromon.commands.run']", out.stdout + out.stderr
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    listed_names = {line.split()[0] for line in listed.splitlines() if line.startswith("    ") and line.split()}
    assert {command_name(m) for m in COMMAND_MODULES} <= listed_names, listed


def test_run_without_a_command_is_a_usage_error() -> None:
    out = zeromon("run", "--out", "/tmp/unused-zeromon-run")
    assert out.returncode == 2
    assert "no command given" in out.stderr and "usage: zeromon run" in out.stderr
    assert "Traceback" not in out.stderr


def test_unknown_flag_names_the_flag() -> None:
    out = zeromon("run", "--outt", "x", "--", "true")
    assert out.returncode == 2
    assert "--outt" in out.stderr and "Traceback" not in out.stderr


def test_bad_environment_variable_is_named_with_accepted_values() -> None:
    out = zeromon("run", "--", "true", env=child_env(ZEROMON_ASYNC_SAMPLE_EVERY="often"))
    assert out.returncode == 2
    assert "ZEROMON_ASYNC_SAMPLE_EVERY='often': is not a number" in out.stderr
    assert "an integer from 1 to 1000000, or 0 (none)" in out.stderr and "Traceback" not in out.stderr


def test_command_not_found() -> None:
    out = zeromon("run", "--", "no-such-program-zeromon")
    assert out.returncode == 2 and "command not found: no-such-program-zeromon" in out.stderr


def test_run_passes_the_exit_code_through(tmp_path: Path) -> None:
    out = zeromon("run", "--quiet", "--out", str(tmp_path / "r"), "--", sys.executable, "-c", "raise SystemExit(3)")
    assert out.returncode == 3


def test_summary_of_a_missing_folder() -> None:
    out = zeromon("summary", "/nonexistent/zeromon-run")
    assert out.returncode == 2 and "/nonexistent/zeromon-run: no such run folder" in out.stderr
    assert "Traceback" not in out.stderr


def test_summary_of_a_folder_with_a_foreign_file(tmp_path: Path) -> None:
    (tmp_path / "rank-0.jsonl").write_text("hello\n")
    out = zeromon("summary", str(tmp_path))
    assert out.returncode == 2 and "rank-0.jsonl:1: not a zeromon recording" in out.stderr


def test_run_endpoint_flags_are_checked_and_passed_to_the_ranks(tmp_path: Path) -> None:
    out = zeromon("run", "--port", "70000", "--", sys.executable, "-c", "pass")
    assert out.returncode == 2 and "--port '70000'" in out.stderr and "Traceback" not in out.stderr, out.stderr
    out = zeromon("run", "--bind", "not an address", "--", sys.executable, "-c", "pass")
    assert out.returncode == 2 and "--bind" in out.stderr and "Traceback" not in out.stderr, out.stderr
    show = "import os; print(os.environ['ZEROMON_BIND'], os.environ['ZEROMON_PORT'])"
    out = zeromon("run", "--quiet", "--out", str(tmp_path), "--bind", "0.0.0.0", "--port", "9600", "--",
                  sys.executable, "-c", show)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.0.0.0", "9600"]
    assert "without ZEROMON_TOKEN" in out.stderr  # reachable from other machines with no token: said so
    out = zeromon("run", "--quiet", "--out", str(tmp_path), "--bind", "0.0.0.0", "--", sys.executable, "-c", "pass",
                  env=child_env(ZEROMON_TOKEN="s3cret"))
    assert out.returncode == 0 and "without ZEROMON_TOKEN" not in out.stderr, out.stderr


def test_unknown_flag_points_to_the_subcommands_help() -> None:
    out = zeromon("plan", "--params", "7B", "--bogus")
    assert out.returncode == 2
    assert "unrecognized arguments: --bogus" in out.stderr and "see `zeromon plan --help`" in out.stderr
    out = zeromon("--bogus")
    assert out.returncode == 2 and "see `zeromon --help`" in out.stderr


@pytest.mark.parametrize(("args", "flag"), [
    (["plan", "--params", "-7e9"], "--params"),
    (["plan", "--params", "7B", "--gpu-memory", "-80GiB"], "--gpu-memory"),
    (["lint", "tests/data/lint/clean.json", "--gpu-memory", "-80GiB"], "--gpu-memory"),
    (["report", "tests/data/lint", "--capacity", "-5GiB"], "--capacity"),
    (["report", "tests/data/lint", "--capacity", "-.5GiB"], "--capacity"),
])
def test_a_negative_value_reaches_its_flag(args: list[str], flag: str) -> None:
    """argparse took '-7e9' for an option ("expected one argument"); the flag's own check says what is wrong."""
    out = zeromon(*args)
    assert out.returncode == 2
    first = out.stderr.splitlines()[0]
    assert first.startswith("zeromon: error:") and flag in first and "expected one argument" not in first
    assert "must be" in first and "Traceback" not in out.stderr


# --- memory sizes: plan --gpu-memory, lint --gpu-memory, report --capacity ---------------------------------


def test_memory_size_accepts_a_size_with_a_unit() -> None:
    assert parse_memory_size("80GiB", "--gpu-memory") == 80 * 2**30
    assert parse_memory_size("40GB", "--gpu-memory") == 40 * 10**9
    assert parse_memory_size("1MiB", "--gpu-memory") == 2**20  # the smallest accepted


@pytest.mark.parametrize(("text", "expected"), [
    ("80", "--gpu-memory '80': has no unit and would be 80 bytes; did you mean 80GiB?"),
    ("0", "--gpu-memory '0': must be more than 0 bytes"),
    ("-80GiB", "--gpu-memory '-80GiB': must be more than 0 bytes"),
    ("80KiB", "--gpu-memory '80KiB': is 81920 bytes; must be a device's memory with a unit, from 1MiB to 1PiB"),
    ("1e30GiB", "--gpu-memory '1e30GiB': is more than 2^70 bytes; must be a device's memory"),
    ("eighty", "--gpu-memory 'eighty': is not a size"),
    ("80 parsecs", "unknown unit 'parsecs'"),
])
def test_memory_size_refuses_what_cannot_be_a_devices_memory(text: str, expected: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_memory_size(text, "--gpu-memory")
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_bare_number_memory_flags_exit_2_naming_the_flag(tmp_path: Path) -> None:
    out = zeromon("lint", "tests/data/lint/clean.json", "--params", "1.3B", "--gpus", "8", "--gpu-memory", "80")
    assert out.returncode == 2 and out.stdout == ""
    first = out.stderr.splitlines()[0]
    assert first.startswith("zeromon: error:") and "--gpu-memory" in first and "80GiB" in first
    write_recording(tmp_path, events=400, samples=10)
    assert zeromon("report", str(tmp_path), "--capacity", "80GiB").returncode == 0  # the recording is readable
    out = zeromon("report", str(tmp_path), "--capacity", "80")
    assert out.returncode == 2 and out.stdout == ""
    first = out.stderr.splitlines()[0]
    assert first.startswith("zeromon: error:") and "--capacity" in first and "80GiB" in first
    assert "Traceback" not in out.stderr


# --- the live export: zeromon run's endpoint checks, a reused --out, zeromon live and targets --------------


def _first_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    return stderr.splitlines()[0]


def test_run_checks_the_endpoint_address_and_ports_before_launching(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    for args, env, named in ((["--bind", "bogus.invalid"], {}, "--bind bogus.invalid"),
                             (["--bind", "999.1.1.1"], {}, "--bind 999.1.1.1"),
                             ([], {"ZEROMON_BIND": "999.1.1.1"}, "ZEROMON_BIND=999.1.1.1"),
                             (["--port", "65535"], {}, "--port 65535")):
        torchrun = ["--nproc-per-node", "2"] if "--port" in args else []  # the ranks per node it will start
        out = zeromon("run", "--quiet", "--out", str(tmp_path / "r"), *args, "--", *cmd, *torchrun,
                      env=child_env(**env))
        assert out.returncode == 2, out.stderr
        assert named in _first_error_line(out.stderr), out.stderr
        assert not ran.exists()  # refused before the command started
    assert "65536" in zeromon("run", "--port", "65535", "--", "torchrun", "--nproc-per-node=2", "x.py").stderr
    # An empty --bind is the default (loopback): nothing to warn about.
    show = "import os; print(repr(os.environ['ZEROMON_BIND']))"
    out = zeromon("run", "--quiet", "--out", str(tmp_path / "r"), "--bind", "", "--", sys.executable, "-c", show)
    assert out.returncode == 0 and out.stdout.strip() == "''" and "warning" not in out.stderr, out.stderr
    # The message says what a port may be; no hint line saying it again.
    out = zeromon("run", "--port", "70000", "--", sys.executable, "-c", "pass")
    assert out.returncode == 2 and "from 1 to 65535, or 0" in out.stderr and "hint:" not in out.stderr, out.stderr


@pytest.mark.distributed
def test_a_reused_out_folder_keeps_the_previous_run_aside(tmp_path: Path) -> None:
    import json

    from conftest import REPO, ranks_args

    out = tmp_path / "run"
    scenario = REPO / "tests" / "scenarios" / "live_train.py"
    first = zeromon("run", "--quiet", "--out", str(out), "--",
                    *ranks_args(2, scenario, "--steps", "3", "--sleep", "0"))
    assert first.returncode == 0, first.stderr
    second = zeromon("run", "--quiet", "--out", str(out), "--",
                     *ranks_args(1, scenario, "--steps", "3", "--sleep", "0"))
    assert second.returncode == 0, second.stderr
    aside = [p for p in out.iterdir() if p.name.startswith("previous-")]
    assert len(aside) == 1 and f"moved to {aside[0]}" in second.stderr, second.stderr
    # Nothing of the first run is lost, and none of its ranks passes for the second run's.
    assert sorted(p.name for p in aside[0].glob("rank-*.jsonl")) == ["rank-0.jsonl", "rank-1.jsonl"]
    assert sorted(p.name for p in (aside[0] / "endpoints").iterdir()) == ["rank-0.json", "rank-1.json"]
    assert sorted(p.name for p in out.glob("rank-*.jsonl")) == ["rank-0.jsonl"]
    targets = zeromon("targets", str(out))
    assert targets.returncode == 0 and len(json.loads(targets.stdout)) == 1, targets.stdout


def test_run_refuses_an_out_folder_where_a_run_is_still_going(tmp_path: Path) -> None:
    import os

    from zeromon.model.registry import EndpointEntry, run_entry_path, write_entry

    # This test's own process stands for a rank that still runs there.
    write_entry(run_entry_path(tmp_path, 0), EndpointEntry(
        run_dir=str(tmp_path), run_id=tmp_path.name, job="j", host=os.uname().nodename, address="127.0.0.1",
        port=9470, url="http://127.0.0.1:9470", rank=0, local_rank=0, world_size=1, pid=os.getpid(), start_ns=1,
        token_required=False))
    out = zeromon("run", "--quiet", "--out", str(tmp_path), "--", sys.executable, "-c", "pass")
    assert out.returncode == 2 and "a run is still going there (rank 0" in _first_error_line(out.stderr)
    assert (tmp_path / "endpoints" / "rank-0.json").exists()


def test_live_and_targets_refuse_intervals_and_urls_they_cannot_use(tmp_path: Path) -> None:
    for args in (["live", "--once", "--interval", "inf", str(tmp_path)], ["live", "--interval", "nan"],
                 ["live", "--interval", "1e9"],
                 ["targets", str(tmp_path), "--write", str(tmp_path / "sd.json"), "--interval", "inf"]):
        out = zeromon(*args)
        assert out.returncode == 2 and "--interval" in _first_error_line(out.stderr), (args, out.stderr)
    out = zeromon("targets", str(tmp_path), "--interval", "5")  # without --write it would be ignored
    assert out.returncode == 2 and "--interval goes with --write" in _first_error_line(out.stderr)
    out = zeromon("live", "--once", "--prometheus", "http://[::1")
    assert out.returncode == 2 and "--prometheus http://[::1: not a URL" in _first_error_line(out.stderr)


def test_live_names_what_is_wrong_with_a_path_argument(tmp_path: Path) -> None:
    out = zeromon("live", "--once", "/nonexistent/zeromon-dir")
    assert out.returncode == 2 and "RUN_DIR /nonexistent/zeromon-dir: no such run folder" in out.stderr
    recording = tmp_path / "rank-0.jsonl"
    recording.write_text("")
    for command in ("live", "targets"):
        out = zeromon(command, str(recording))
        first = _first_error_line(out.stderr)
        assert out.returncode == 2 and "a file, not a run folder" in first and f"({tmp_path})" in first, first
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    out = zeromon("live", "--once", str(tmp_path / "a"), str(tmp_path / "b"))
    assert out.returncode == 2 and "RUN_DIR: give one run folder, not 2" in _first_error_line(out.stderr)


def test_live_without_a_run_waits_for_one(tmp_path: Path) -> None:
    import signal
    import subprocess

    from conftest import REPO

    env = child_env(ZEROMON_REGISTRY=str(tmp_path / "empty"))
    out = zeromon("live", "--once", env=env)
    assert out.returncode == 1 and "waiting for a run" in out.stdout and "Traceback" not in out.stderr, out
    proc = subprocess.Popen([sys.executable, "-m", "zeromon", "live", "--interval", "0.2"], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "waiting for a run" in proc.stdout.readline()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err, err


@pytest.mark.parametrize(("argv", "says"), [
    (["summary", "a\nb\x1b[2J"], "zeromon: error: a\\nb\\x1b[2J: no such run folder"),  # one line, no escape sequence
    (["live", "--run=--"], "zeromon: error: --run '--': not a value ('--' ends the options)"),
    (["live", "--token", "sécret"], "zeromon: error: --token: must be printable ASCII without spaces"),
    (["attach", "--token", ""], "zeromon: error: --token: empty"),
    (["dashboard", "--host", "\ue000"], "zeromon: error: --host '\\ue000': neither an IP address nor a host name"),
    (["run", "--bind", "\ue000", "--", "true"], "zeromon: error: --bind '\\ue000': must be an IP address or host name"),
])
def test_what_the_property_tests_found_is_one_line_and_exit_2(argv: list[str], says: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Values test_cli_properties.py found to end in a traceback (a token an HTTP header cannot carry, a
    host name socket cannot encode, argparse's '--' value) or in more than one line (a path's newline)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.split("\n")[0].startswith(says) and "Traceback" not in err, err
