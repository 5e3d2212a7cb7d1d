"""Shared plumbing of the benchmark scripts: interleaved timing, the machine, result rows, RSS.

Not a test module (no ``test_`` prefix: pytest does not collect it). The scripts import it as a
sibling: ``python tests/bench/<name>.py`` puts ``tests/bench`` first on ``sys.path``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent.parent
sys.path.insert(0, str(BENCH_DIR.parent))
from ports import free_port as free_port  # noqa: E402 - the tests' ports (tests/ports.py), for the benchmarks too

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One measured line of RESULTS.md: a baseline, the same thing with the agent, and a target."""

    benchmark: str
    measure: str
    unit: str  # of baseline, agent and added: "ns", "ms", "MB", ...
    baseline: float | None  # without the agent (None where there is no such thing)
    agent: float
    target: str  # in words, e.g. "added <= 1000 ns"
    met: bool | None  # None: informational, no target
    note: str = ""

    @property
    def added(self) -> float | None:
        return None if self.baseline is None else self.agent - self.baseline

    @property
    def ratio(self) -> float | None:
        return None if not self.baseline else self.agent / self.baseline


def write_rows(path: str | None, rows: Sequence[Row], extra: dict[str, Any] | None = None) -> None:
    """Dump the rows as JSON for run_all.py (``--json PATH`` of every script)."""
    if path is None:
        return
    payload = {"rows": [dataclasses.asdict(r) for r in rows], "extra": extra or {}}
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")


def read_rows(path: str | Path) -> tuple[list[Row], dict[str, Any]]:
    payload = json.loads(Path(path).read_text())
    return [Row(**r) for r in payload["rows"]], payload.get("extra", {})


def interleaved(variants: dict[str, Callable[[int], int]], rounds: int, calls: int,
                between: Callable[[], None] | None = None, seed: int = 0) -> dict[str, list[float]]:
    """Per-call ns of each variant: ``rounds`` batches of ``calls`` calls, in a shuffled order each round.

    Each variant is ``run(calls) -> elapsed ns`` (its own loop, so the loop itself is the same for
    every variant). Shuffling the order every round spreads drift (load from other processes, CPU
    frequency, GC generations filling up) evenly over the variants instead of onto one of them.
    ``between`` runs after every round, untimed (draining the agent's buffer).
    """
    rng = random.Random(seed)
    names = list(variants)
    per_call: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            per_call[name].append(variants[name](calls) / calls)
        if between is not None:
            between()
    return per_call


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def bootstrap_ratio_ci(agent: Sequence[float], baseline: Sequence[float], resamples: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of median(agent) / median(baseline): how far noise alone moves the ratio."""
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(agent, k=len(agent))) / statistics.median(rng.choices(baseline, k=len(baseline)))
        for _ in range(resamples))
    return ratios[int(0.025 * resamples)], ratios[int(0.975 * resamples) - 1]


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("ns", "bytes", "events"):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"x{value:.3f}"


def print_rows(title: str, rows: Sequence[Row]) -> None:
    """Side-by-side table on stdout: baseline, with agent, added, ratio, target."""
    print(f"\n== {title}")
    header = f"{'measure':<46} {'unit':>5} {'baseline':>12} {'agent':>12} {'added':>11} {'ratio':>8}  target"
    print(header)
    print("-" * len(header))
    for r in rows:
        verdict = "" if r.met is None else ("  MET" if r.met else "  NOT MET")
        print(f"{r.measure:<46} {r.unit:>5} {fmt(r.baseline, r.unit):>12} {fmt(r.agent, r.unit):>12} "
              f"{fmt(r.added, r.unit):>11} {fmt_ratio(r.ratio):>8}  {r.target}{verdict}")
        if r.note:
            print(f"{'':<46}   ({r.note})")


# --- the machine ----------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """What RESULTS.md names the numbers by: cores, CPU model, Python, torch, load when measured."""
    import torch

    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_1min": os.getloadavg()[0],
    }


def load_note() -> str:
    """The 1-minute load average: this 2-core machine is shared, and load moves the numbers."""
    return f"load avg {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


# --- processes --------------------------------------------------------------------------------------

def example_env(**extra: str) -> dict[str, str]:
    """The environment of a run of the examples under test: this one's without its ZEROMON_* settings, one thread
    a rank, any free endpoint port, the repository's packages and examples importable; ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROMON_")}
    env.update(OMP_NUM_THREADS="1", ZEROMON_PORT="0",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "agents"), str(REPO_ROOT / "examples")]),
               **extra)
    return env




def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm (pages resident, field 2)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE_BYTES


def peak_rss_bytes() -> int:
    """VmHWM: the highest RSS this process has had."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def tree_rss_kb(pid: int) -> int:
    """VmRSS of a process and all its descendants (shared pages counted in each: an upper bound)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    pending.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):  # it exited meanwhile
            continue
    return total


@dataclasses.dataclass(frozen=True, slots=True)
class TreeRun:
    """A command run by run_watched: its wall time, the peak RSS of its process tree, how it ended."""

    wall_s: float
    peak_rss_mb: float
    returncode: int | None  # None: stopped at a limit
    stopped: str | None  # which limit ("time", "memory"), or None
    stdout: str  # its first ``stdout_chars`` characters
    stderr: str
    stdout_bytes: int = 0  # what it wrote to stdout in all


def run_watched(command: Sequence[str], limit_s: float, limit_rss_mb: float, env: dict[str, str] | None = None,
                poll_s: float = 0.05, stdout_chars: int = -1) -> TreeRun:
    """Run a command, sampling the RSS of it and its descendants every ``poll_s`` (from outside); stop
    it (the whole process group) past ``limit_s`` seconds or ``limit_rss_mb`` MB. ``stdout_chars``: how much
    of its stdout to keep (all by default; a command may write gigabytes)."""
    import signal
    import subprocess
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(list(command), stdout=out, stderr=err, text=True, env=env, start_new_session=True)
        peak_kb, stopped = 0, None
        while proc.poll() is None:
            peak_kb = max(peak_kb, tree_rss_kb(proc.pid))
            if peak_kb / 1024 > limit_rss_mb:
                stopped = "memory"
            elif time.perf_counter() - started > limit_s:
                stopped = "time"
            if stopped:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(poll_s)
        wall_s = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return TreeRun(wall_s=wall_s, peak_rss_mb=peak_kb / 1024, returncode=None if stopped else proc.returncode,
                       stopped=stopped, stdout=out.read(stdout_chars), stderr=err.read(),
                       stdout_bytes=os.fstat(out.fileno()).st_size)


MB = 1024 * 1024
