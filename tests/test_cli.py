"""The CLI as a user meets it: usage errors exit 2 with one clear message and no traceback."""

from __future__ import annotations

import sys
from pathlib import Path

from zeromon.cli import main

from conftest import child_env, zeromon


def test_no_command_prints_usage_and_exits_2(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: zeromon" in err and "a command is required" in err


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
    assert "ZEROMON_ASYNC_SAMPLE_EVERY='often' is not valid" in out.stderr
    assert "an integer >= 0" in out.stderr and "Traceback" not in out.stderr


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
