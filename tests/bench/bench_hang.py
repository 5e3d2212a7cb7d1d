"""Hang detection: how soon a hang is named, and what watching for one costs.

    python tests/bench/bench_hang.py [--runs 3] [--json out.json]

- *time to the verdict*: real 2-rank FSDP2 runs under `zeromon run` (tests/scenarios/hang.py --mode stuck: rank 1
  sleeps outside any collective at step 4, rank 0 waits in its all-gather), ZEROMON_HANG_AFTER=3; from the
  scenario's "HUNG" line to the first `zeromon live --once` that exits 4 naming rank 1. The target is the issue's:
  within the threshold plus 10 s.
- *a progress report*: what a live client's read (a snapshot, a scrape) adds to the agent's endpoint thread: the
  training thread's frames, the groups' sequence numbers, the newest collectives (ProgressWatch.report), taken
  while the main thread runs gloo all-reduces in a world-size-1 group (inside a collective about half the time).
- *a recorder pass's look*: ProgressWatch.tick, once a pass (a second) on the recorder's thread.
The training thread's hot path has nothing added by this work (the collective wrappers are unchanged):
bench_collective_overhead.py measures it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchlib
import torch
import torch.distributed as dist

from zeromon.model.progress import LIVE
from zeromon_agent.hooks import collectives
from zeromon_agent.hooks.state import HotState
from zeromon_agent.recorder.progress import ProgressWatch

SCENARIO = benchlib.REPO_ROOT / "tests" / "scenarios" / "hang.py"
HANG_AFTER_S = 3.0


def time_to_verdict(out: Path) -> float:
    """Seconds from the hang's start to the first `zeromon live --once` that calls the job hung."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROMON_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ZEROMON_PORT="0", ZEROMON_HANG_AFTER=str(HANG_AFTER_S),
               ZEROMON_REGISTRY=str(out.parent / "registry"))
    command = [sys.executable, "-m", "zeromon", "run", "--out", str(out), "--", sys.executable, "-m",
               "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(benchlib.free_port()),
               str(SCENARIO), "--mode", "stuck", "--rank", "1", "--step", "4"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("HUNG"):
                break
        hung = time.monotonic()
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keeps the pipe drained
        while True:
            live = subprocess.run([sys.executable, "-m", "zeromon", "live", "--once", str(out)], env=env,
                                  capture_output=True, text=True, timeout=60)
            if live.returncode == 4 and "rank 1 has not reached" in live.stdout:
                return time.monotonic() - hung
            if time.monotonic() - hung > 60:
                raise RuntimeError("no verdict within 60 s:\n" + live.stdout)
            time.sleep(0.25)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def report_costs(reports: int) -> tuple[list[float], int]:
    """Microseconds per progress report taken from a thread while the main thread runs all-reduces; how many
    found it inside one."""
    state = HotState()
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{benchlib.free_port()}")
    collectives.install(state)
    state.enabled = True
    watch = ProgressWatch(state, rank=0, threshold_s=30.0)
    stop = threading.Event()
    costs: list[float] = []
    blocked = 0

    def reader() -> None:
        nonlocal blocked
        for _ in range(reports):
            recent = [item for item in state.raw.newest(4096) if item[0] == 0][:256]
            t0 = time.perf_counter_ns()
            report = watch.report(LIVE, recent, set())
            costs.append((time.perf_counter_ns() - t0) / 1e3)
            blocked += report.blocked is not None
            time.sleep(0.002)
        stop.set()

    thread = threading.Thread(target=reader)
    thread.start()
    tensor = torch.zeros(1 << 16)
    try:
        while not stop.is_set():
            dist.all_reduce(tensor)
            if len(state.raw) > 4096:
                state.raw.clear()
    finally:
        thread.join()
        state.enabled = False
        collectives.uninstall()
        dist.destroy_process_group()
    return costs, blocked


def tick_cost(calls: int) -> float:
    """Nanoseconds per ProgressWatch.tick with nothing changed (the usual pass of a waiting run)."""
    watch = ProgressWatch(HotState(), rank=0, threshold_s=30.0)
    t0 = time.perf_counter_ns()
    for i in range(calls):
        watch.tick(7, i)
    return (time.perf_counter_ns() - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-hang-") as tmp:
        verdicts = [time_to_verdict(Path(tmp) / f"run-{i}") for i in range(args.runs)]
    costs, blocked = report_costs(400)
    tick = tick_cost(100_000)
    median = benchlib.median(verdicts)
    rows = [
        benchlib.Row("hang detection", f"time from the hang to the verdict (threshold {HANG_AFTER_S:g} s, "
                     f"median of {args.runs} runs)", "s", HANG_AFTER_S, median,
                     "added <= 10 s", median - HANG_AFTER_S <= 10.0,
                     note="runs: " + ", ".join(f"{v:.1f}" for v in verdicts)),
        benchlib.Row("hang detection", "a progress report while the main thread runs all-reduces (median)", "µs",
                     None, benchlib.median(costs), "informational", None,
                     note=f"{blocked} of {len(costs)} found it inside one; p95 "
                          f"{sorted(costs)[int(len(costs) * 0.95)]:.0f} µs"),
        benchlib.Row("hang detection", "a recorder pass's look for progress (ProgressWatch.tick)", "ns", None, tick,
                     "informational", None),
    ]
    benchlib.print_rows("hang detection", rows)
    benchlib.write_rows(args.json, rows)


if __name__ == "__main__":
    main()
