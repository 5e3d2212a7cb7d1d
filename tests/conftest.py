"""Shared fixtures: the repository paths, a clean environment for child processes, launchers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from ports import free_port

REPO = Path(__file__).resolve().parent.parent
# Property tests judge what comes out, never how fast: no deadline for any of them (a loaded 2-core machine ran one
# example of a lint property in 3.8 s; speed is measured in tests/bench/), and pytest-timeout stops a hang.
settings.register_profile("zeromon", deadline=None)
settings.load_profile("zeromon")
# Tests stop zeromon's commands with SIGINT, as Ctrl-C does. A suite started in the background of a
# non-interactive shell (`cmd &`) inherits SIGINT ignored, and so would every child (an ignored signal stays
# ignored across exec): their Ctrl-C would do nothing. A handler here is reset to the default in each child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
TEST_REGISTRY = tempfile.mkdtemp(prefix="zeromon-test-registry-")
EXAMPLES = REPO / "examples"


# What the suite needs beyond `pip install -e ".[test]"`, which CI installs (.ci/run): a test that skips for one of
# these runs in CI. Each: (words its skip reason holds, what installs it).
_SETUP = "DS_BUILD_OPS=0 pip install \"torch==2.13.0\" -e \".[test,deepspeed,trainers]\""
_SYSTEM = "sudo apt-get install prometheus tmux chromium chromium-driver"
CI_COMPONENTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("deepspeed",), _SETUP),
    (("transformers", "lightning", "tensorboardx", "trainers extra"), _SETUP),
    (("holistictraceanalysis", "'hta'"), _SETUP),
    (("accelerate is not installed", "'accelerate'"), _SETUP),
    (("pyarrow", "duckdb", "polars"), _SETUP),
    (("tmux",), _SYSTEM),
    (("prometheus", "promtool"), _SYSTEM),
    (("chromium", "chromedriver", "browser"), _SYSTEM),
)
_missing_for_ci: dict[str, set[str]] = {}  # install command -> the tests it would run


def _ci_install_for(reason: str) -> str | None:
    """The command that installs what a skip's reason says is missing, where CI has it; None for a skip that CI
    makes too (no GPU, a version-specific alternative)."""
    low = reason.lower()
    if "installed:" in low or "installed;" in low:  # "DeepSpeed 0.19 installed: its schema is read from it"
        return None
    for words, install in CI_COMPONENTS:
        if any(word in low for word in words):
            return install
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and isinstance(report.longrepr, (tuple, list)) and len(report.longrepr) == 3:
        install = _ci_install_for(str(report.longrepr[2]))
        if install is not None:
            _missing_for_ci.setdefault(install, set()).add(report.nodeid)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A whole module skipped at its import (pytest.importorskip at module level: tests/test_parquet_export.py),
    counted as its tests would be."""
    pytest_runtest_logreport(report)  # type: ignore[arg-type]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Where a test skipped for a tool or package that CI installs: how many, and the command that installs it, so
    that `python -m pytest` runs what CI runs. ZEROMON_REQUIRE_ALL=1 (CI) makes such a skip fail the run."""
    if not _missing_for_ci:
        return
    terminalreporter.section("tests that CI runs and this machine skipped")
    for install, tests in sorted(_missing_for_ci.items()):
        terminalreporter.write_line(f"{len(tests)} skipped; to run them: {install}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _missing_for_ci and os.environ.get("ZEROMON_REQUIRE_ALL", "") not in ("", "0") and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def refuses_field(exc: Any, key: str) -> bool:
    """Whether a pydantic ValidationError refuses the field ``key`` itself: an error located at it, or at an
    item of it (("passes", 1)). A model validator's (loc ()) weighs several fields; an error inside a nested
    block (("tp", "tp_size")) is that block's field's, not the block's."""
    locations = [tuple(error["loc"]) for error in exc.errors()]
    while any(loc and isinstance(loc[-1], int) for loc in locations):
        locations = [loc[:-1] if loc and isinstance(loc[-1], int) else loc for loc in locations]
    return any(loc and loc[-1] == key for loc in locations)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child training process: one thread per rank on a 2-core machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROMON_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1")
    # The agents' endpoints: any free port, and registered where this test session alone looks, never
    # in the user's ~/.cache/zeromon/agents.
    env.update(ZEROMON_PORT="0", ZEROMON_REGISTRY=TEST_REGISTRY)
    # The tests written for format 1.x open, cut and damage rank-<r>.jsonl lines: their runs keep that
    # form. The agent's default, the compact rank-<r>.zmr, is what child_env(ZEROMON_FORMAT="") or
    # ZEROMON_FORMAT="compact" gives (tests/test_compact_format.py).
    env.update(ZEROMON_FORMAT="jsonl")
    env.update(extra)
    return env


def run_python(script: Path | str, *args: str, env: dict[str, str] | None = None, timeout: float = 300,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], env=env or child_env(), cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout)


def zeromon(*args: str, env: dict[str, str] | None = None, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "zeromon", *args], env=env or child_env(), cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout)


def torchrun_args(nproc: int, script: Path, *args: str) -> list[str]:
    """``nproc`` ranks of ``script`` under torchrun: for the tests of what happens around the launcher (signals,
    failed, killed or restarted ranks, exit codes)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-port", str(free_port()), str(script), *args]


def ranks_args(nproc: int, script: Path, *args: str) -> list[str]:
    """``nproc`` ranks of ``script`` with torchrun's environment, started by tests/launch_ranks.py, which does not
    import torch: for the tests where the launcher plays no part (a third of a small run's CPU is torchrun's)."""
    return [sys.executable, str(REPO / "tests" / "launch_ranks.py"), "--nproc-per-node", str(nproc),
            "--master-port", str(free_port()), str(script), *args]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def fsdp2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank FSDP2 run on gloo (the README's main job, 8 steps), recorded once per session for
    every test that reads a recording (the dashboard's figures and pages)."""
    out = tmp_path_factory.mktemp("fsdp2") / "run"
    result = zeromon("run", "--out", str(out), "--", *ranks_args(2, EXAMPLES / "fsdp2_train.py", "--steps", "8"))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


FLEET_RANKS, FLEET_STEPS = 256, 12  # fleet256_run: a 256-rank run, short in steps (generated in ~0.3 s)


@pytest.fixture(scope="session")
def fleet256_run(fsdp2_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 256-rank run of FLEET_STEPS steps generated from fsdp2_run's rank 0 (tests/bench/gen_fleet_run.py: every
    rank's overlap poor, a straggler, a rank whose memory grows), for the surfaces' tests at fleet scale."""
    sys.path.insert(0, str(REPO / "tests" / "bench"))
    import gen_fleet_run

    out = tmp_path_factory.mktemp("fleet256") / "run"
    gen_fleet_run.generate(fsdp2_run, out, FLEET_RANKS, FLEET_STEPS, workers=1)
    return out
