"""`zeromon doctor` on this machine, as a user runs it (the real CLI in a subprocess): what it sees, what
it says is missing and why, its exit codes, --json, a dead or silent Prometheus, taken ports, a stale
registry entry, a real Prometheus server and a real terminal (tmux)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from zeromon.model.registry import EndpointEntry, user_entry_path, write_entry
from zeromon.sources.doctor import Check, bounded

from conftest import child_env, free_port, zeromon

CUDA = False
try:
    import torch

    CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a dependency
    pass


def doctor(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return zeromon("doctor", *args, env=child_env(**env), timeout=120)


def checks(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    body = json.loads(result.stdout)
    return {c["name"]: c for c in body["checks"]}


@pytest.mark.skipif(CUDA, reason="checks what a machine without a GPU is told")
def test_without_a_gpu_it_names_what_is_missing_and_what_that_costs_and_exits_0(tmp_path: Path) -> None:
    result = doctor(ZEROMON_REGISTRY=str(tmp_path / "registry"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    out = result.stdout
    assert out.startswith("zeromon doctor: what zeromon can see on this machine")
    lines = out.splitlines()

    def line(name: str) -> str:
        return next(x for x in lines if f"  {name}  " in x)

    assert line("torch").split()[0] == "ok" and "(essential)" in line("torch")
    assert line("backend gloo").split()[0] == "ok"
    assert line("cuda").split()[0] == "MISSING"
    assert line("nvml").split()[0] == "MISSING"
    # What a missing GPU costs, in the user's terms, and the fix.
    assert "no allocator stats" in out and "memory is each rank's process RSS" in out
    assert "no device metrics (utilization, power, temperature" in out
    assert "fix: on a machine with NVIDIA GPUs, install the NVIDIA driver" in out
    assert out.rstrip().endswith("essentials: all there (Python, torch with torch.distributed and a backend)")


def test_json_has_every_check_with_its_status_and_the_verdict(tmp_path: Path) -> None:
    result = doctor("--json", ZEROMON_REGISTRY=str(tmp_path / "registry"))
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["essentials_ok"] is True
    found = checks(result)
    assert {"python", "zeromon", "C modules", "torch", "backend gloo", "backend nccl", "backend mpi", "cuda", "nvml",
            "deepspeed", "agent ports", "registry", "terminal"} <= set(found)
    for check in body["checks"]:
        assert set(check) == {"name", "status", "essential", "found", "costs", "fix"}
        assert check["status"] in ("ok", "missing", "warn", "info")
        assert check["found"]
        if check["status"] == "missing":
            assert check["costs"] and check["fix"], check  # missing: what it costs and how to get it
    assert [n for n, c in found.items() if c["essential"]] == ["python", "torch", "backend gloo"]
    assert found["cuda"]["status"] == ("ok" if CUDA else "missing")
    assert found["terminal"]["status"] == "info"  # stdout is a pipe here
    assert found["registry"]["found"].startswith(str(tmp_path / "registry"))


def test_a_dead_prometheus_is_reported_and_exits_1_a_silent_one_within_its_time_limit(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = doctor("--json", "--prometheus", dead)
    assert result.returncode == 1, result.stdout + result.stderr
    prometheus = checks(result)["prometheus"]
    assert prometheus["status"] == "missing" and prometheus["essential"] is True
    assert "connection refused" in prometheus["found"] and dead in prometheus["found"]

    # One that accepts the connection and never answers: the probe gives up, doctor does not hang.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = doctor("--prometheus", url)
        took_s = time.monotonic() - started
    assert result.returncode == 1
    assert f"{url} does not answer: no answer within 3 s" in result.stdout
    assert "essentials missing: prometheus" in result.stderr
    assert took_s < 30, took_s


@pytest.mark.parametrize(("args", "said"), [
    (["--prometheus", "localhost:9090"], "zeromon: error: --prometheus 'localhost:9090': not an http(s) URL"),
    (["--prometheus", "http://host:99999"], "zeromon: error: --prometheus 'http://host:99999': Port out of range"),
    (["--bogus"], "zeromon: error: zeromon doctor: unrecognized arguments: --bogus"),
])
def test_a_bad_flag_exits_2_with_one_error_line(args: list[str], said: str) -> None:
    result = doctor(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith(said), result.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: ")


def test_taken_agent_ports_and_a_crashed_agents_registry_entry_are_said(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    entry = EndpointEntry(run_dir=str(tmp_path / "run"), run_id="run", job="x", host=os.uname().nodename,
                          address="127.0.0.1", port=1, url="http://127.0.0.1:1", rank=0, local_rank=0, world_size=1,
                          pid=int(dead.stdout), start_ns=0, token_required=False)
    write_entry(user_entry_path(registry, entry.host, entry.pid), entry)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        base = taken.getsockname()[1]
        result = doctor("--json", ZEROMON_PORT=str(base), ZEROMON_REGISTRY=str(registry))
    assert result.returncode == 0, result.stderr
    found = checks(result)
    ports = found["agent ports"]
    assert ports["status"] == "warn" and f"127.0.0.1:{base}-" in ports["found"] and f": {base}" in ports["found"]
    assert "zeromon run --port N" in ports["fix"]
    assert found["registry"]["status"] == "info"
    assert "0 agents running, 1 entry of crashed agents" in found["registry"]["found"]


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="no prometheus binary (the CI installs it: .ci/run)")
def test_a_real_prometheus_server_is_found_with_its_version(tmp_path: Path) -> None:
    from test_prometheus_server import PrometheusServer

    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    folder = tmp_path / "prometheus"
    folder.mkdir()
    server = PrometheusServer(folder, targets)
    server.start()
    try:
        result = doctor("--json", "--prometheus", server.url)
    finally:
        server.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    prometheus = checks(result)["prometheus"]
    assert prometheus["status"] == "ok" and prometheus["found"].startswith(f"{server.url}: Prometheus 2.")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (the CI installs it: .ci/run)")
def test_in_a_terminal_it_says_its_size_and_colours(tmp_path: Path) -> None:
    from test_tui_tmux import Tmux, tui_env, wait_for, zeromon_cli

    pane = Tmux(zeromon_cli("doctor"), tui_env(ZEROMON_REGISTRY=str(tmp_path / "registry")), tmp_path / "status",
                width=100, height=40)
    try:
        wait_for(lambda: pane.exit_status() is not None, pane, 60, "doctor to finish")
        screen = pane.tmux("capture-pane", "-p", "-J", "-S", "-100", "-t", "t")
    finally:
        pane.kill()
    terminal = next(line for line in screen.splitlines() if "  terminal  " in line)
    assert terminal.split()[0] == "ok"
    assert "100x40, 256 colours; from 150 columns the TUI shows memory and findings beside" in terminal


def test_a_probe_that_hangs_is_given_up_after_its_time_limit_and_one_that_fails_is_a_finding() -> None:
    started = time.monotonic()
    hung = bounded("nvml", lambda: [Check("nvml", "ok", "never")] if time.sleep(30) is None else [], 0.5)
    assert time.monotonic() - started < 5
    assert [(c.name, c.status, c.found) for c in hung] == [("nvml", "warn", "no answer within 0.5 s")]

    def broken() -> list[Check]:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    failed = bounded("nvml", broken, 5)
    assert [(c.status, c.found) for c in failed] == [
        ("warn", "the probe failed: OSError: libnvidia-ml.so.1: cannot open shared object file")]


def test_the_c_modules_are_said_built_or_not_with_what_that_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's optional C modules (zeromon.model.compiled.MODULES): built here (a C compiler is on this machine,
    and the install builds them); where the install found no compiler, a warning with what that costs and the fix."""
    import importlib.util

    from zeromon.sources import doctor

    if shutil.which("cc") or shutil.which("gcc"):
        assert doctor._compiled_modules().status == "ok"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    check = doctor._compiled_modules()
    assert (check.status, check.essential) == ("warn", False)
    assert "Python paths" in check.costs and "reinstall zeromon" in check.fix
    assert all(name in check.found for name in ("zeromon.model._planes", "zeromon_agent.recorder._batch",
                                                 "zeromon_agent.hooks._ring", "zeromon_agent.live._totals")), check.found
