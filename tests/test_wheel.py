"""zeromon as a user installs it: a wheel built from this source, installed with pip into a fresh virtual
environment, run from a folder that is not the checkout, with no PYTHONPATH. `zeromon demo` (its
training script and the agent's bootstrap are package data), `doctor`, `plan`, `report` and the agent's
import must work from the installed files alone.

Most of its time is installing torch into the fresh environment (from pip's cache) and removing it at the
end; pip's --no-compile leaves that to unpacking the files. It runs in the test suite rather than as a CI step so
that a developer runs the same check with `pytest tests/test_wheel.py`, and its failures read like the
other tests'.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, child_env

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

# What the source tree holds that a wheel must not be built from (environments, caches, outputs).
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.pyc", "build", "dist", "*.egg-info",
                                     ".mypy_cache", ".ruff_cache", ".pytest_cache", "zeromon-runs", "runs", "*.so",
                                     "test-artifacts", ".whl", "tests")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    bin: Path  # the fresh environment's bin/
    home: Path  # a folder outside the checkout to run in
    install_s: float

    def env(self, **extra: str) -> dict[str, str]:
        """The child environment of the tests, without anything that points into the checkout."""
        env = child_env(**extra)
        for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
            env.pop(name, None)
        # The fresh environment's bytecode is kept where this machine would not keep it (pip installed it
        # --no-compile, below): its first processes compile torch, the demo's ranks read their bytecode.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PATH"] = os.pathsep.join([str(self.bin), env.get("PATH", "")])
        return env

    def run(self, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), cwd=self.home, env=self.env(**env), capture_output=True, text=True,
                              timeout=timeout)


def _pip(python: Path | str, *args: str, timeout: float = 600) -> None:
    result = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout,
                            env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    assert result.returncode == 0, f"pip {' '.join(args)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a copy: building in the checkout would leave build/ and *.egg-info in it
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    _pip(sys.executable, "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(source))
    wheels = list((root / "dist").glob("zeromon-*.whl"))
    assert len(wheels) == 1, wheels
    venv = root / "venv"
    started = time.monotonic()
    # The base interpreter, not this environment's: nothing of the test environment's packages is visible.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # torch pinned to the CPU build, as the README's install says: a bare dependency would resolve to CUDA's.
    # --no-compile: the few processes this test starts compile what they import, and keep it (Installed.env),
    # less than pip compiling all of torch first.
    _pip(venv / "bin" / "python", "install", "-q", "--no-compile", "torch==2.13.0", str(wheels[0]))
    home = root / "home"
    home.mkdir()
    try:
        yield Installed(wheel=wheels[0], bin=venv / "bin", home=home, install_s=time.monotonic() - started)
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # 1.2 GB: not kept with pytest's last three temp folders


def test_the_wheel_ships_the_demo_the_bootstrap_and_the_front_ends_files(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert {"zeromon/demo/train.py", "zeromon/demo/training.py", "zeromon/demo/__init__.py", "zeromon/commands/demo.py",
            "zeromon/commands/doctor.py", "zeromon/tui/app.tcss", "zeromon_agent/bootstrap/site/sitecustomize.py",
            "zeromon_dashboard/assets/zeromon.css"} <= names
    assert not any(name.startswith(("tests/", "examples/")) for name in names)
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)  # the Apache-2.0 text
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "zeromon = zeromon.cli:main" in zipfile.ZipFile(installed.wheel).read(entry_points).decode()


def test_doctor_and_plan_run_from_the_installed_package(installed: Installed) -> None:
    site = installed.bin.parent / "lib"
    result = installed.run("zeromon", "doctor", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["zeromon"]["found"].startswith("zeromon 0.1.0 in " + str(site))  # not the checkout
    assert checks["torch"]["found"].startswith("torch 2.13.0")
    if shutil.which("cc") or shutil.which("gcc"):  # the wheel's build compiled the recorder's C modules
        assert checks["C modules"]["status"] == "ok", checks["C modules"]
    plan = installed.run("zeromon", "plan", "--params", "7B", "--gpus", "8", "--gpu-memory", "80GiB")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith("ZeRO memory plan: 7.00B parameters, 8 GPUs")
    bad = installed.run("zeromon", "plan", "--params", "lots")
    assert bad.returncode == 2 and bad.stderr.startswith("zeromon: error: --params 'lots'") and "Traceback" not in bad.stderr


def test_the_agent_imports_without_the_front_ends(installed: Installed) -> None:
    code = ("import sys, zeromon_agent, zeromon_agent.bootstrap; "
            "print(zeromon_agent.__file__); print(sorted(m for m in ('textual', 'dash', 'plotly') if m in sys.modules))")
    result = installed.run(str(installed.bin / "python"), "-c", code)
    assert result.returncode == 0, result.stderr
    where, ui = result.stdout.splitlines()
    assert where.startswith(str(installed.bin.parent / "lib")) and ui == "[]"


def test_demo_trains_under_the_agent_and_finds_its_problem_then_report_reads_it(installed: Installed) -> None:
    out = installed.home / "demo"
    started = time.monotonic()
    result = installed.run("zeromon", "demo", "--no-tui", "--scenario", "exposed", "--steps", "12", "--out", str(out))
    demo_s = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    # One entry for the ranks alike: "ranks 0-1: 52-53% of step time is exposed communication".
    assert re.search(r"demo exposed: zeromon found it: ranks? [\d, -]*\d: [\d-]+% of step time is exposed", result.stdout), \
        result.stdout
    assert sorted(p.name for p in out.glob("rank-*.jsonl")) == ["rank-0.jsonl", "rank-1.jsonl"]
    report = installed.run("zeromon", "report", str(out))
    assert report.returncode == 0, report.stderr
    assert "of step time is exposed communication" in report.stdout
    assert not (installed.home / "zeromon-runs").exists()  # --out was used
    print(f"installed in {installed.install_s:.0f} s; demo {demo_s:.0f} s")
