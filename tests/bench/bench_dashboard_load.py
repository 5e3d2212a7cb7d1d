"""`zeromon dashboard` opening a fleet's recording, and its replay: 256 ranks x 10,000 steps of a generated run.

No target of its own (issue 13 sets the report's: 1,024 ranks in under 60 s and 2 GB); measured so that what
the dashboard holds of a large run is on record. For each of `zeromon dashboard RUN_DIR` and `zeromon
dashboard --replay RUN_DIR`, started as a user starts it: the time until its page answers (the run is read
and analysed before the server starts), the peak RSS of the process and its workers (the largest sum of
their RSS, sampled every 50 ms from outside; a forked worker's pages shared with its parent count in both),
and that RSS 3 s after the page answered (what it holds while it serves).

The run is made by gen_fleet_run.py from a real 2-rank FSDP2 recording (recorded once here, ~25 s, or given
with --source), in a folder under /tmp removed at the end.

    python tests/bench/bench_dashboard_load.py [--ranks 256] [--steps 10000] [--repeat 3] [--json out.json]

At 1,024 ranks (``--ranks 1024 --repeat 1``, 2026-11-25 13:43 UTC, measured once): a recording opened in
153.4 s, 4,797 MB at its peak and 3,050 MB once open; a replay in 115.8 s, 2,493 MB and 2,407 MB.

Before (measured the same way, on the same kind of run, 2026-11-25): a recording opened in 53 s,
2.1 GB at its peak, 828 MB once open, while the loader read every rank a second time for the run's final
state (before commit c60c258); a replay in 49.1 / 52.1 s and 3.5 GB at its peak and once open, while it held every
rank's records as objects beside the replay's own tables (before commit 21e9780).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import benchlib
import gen_fleet_run

LIMIT_S = 600.0
SETTLE_S = 3.0
MODES = {"recording": (), "replay": ("--replay",)}


def open_once(folder: Path, mode: str) -> tuple[float, float, float]:
    """One start of the dashboard: seconds until its page answers, peak RSS and RSS once open (MB)."""
    port = benchlib.free_port()
    command = [sys.executable, "-m", "zeromon", "dashboard", *MODES[mode], str(folder), "--port", str(port)]
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    peak_kb, opened = 0, None
    try:
        while proc.poll() is None and time.perf_counter() - started < LIMIT_S:
            peak_kb = max(peak_kb, benchlib.tree_rss_kb(proc.pid))
            now = time.perf_counter()
            if opened is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as response:
                        if response.status == 200:
                            opened = now - started
                except OSError:
                    pass
            elif now - started > opened + SETTLE_S:
                break
            time.sleep(0.05)
        settled_kb = benchlib.tree_rss_kb(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    if opened is None:
        raise SystemExit(f"zeromon dashboard ({mode}) did not open in {LIMIT_S:.0f} s "
                         f"(exit {proc.returncode}):\n{err[-2000:]}")
    return opened, peak_kb / 1024, settled_kb / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--source", type=Path, help="a 2-rank run folder (default: record one)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    rows: list[benchlib.Row] = []
    work = Path(tempfile.mkdtemp(prefix="zeromon-dashload-", dir="/tmp"))
    try:
        source = args.source or gen_fleet_run.record_source(work / "source")
        folder = work / "run"
        records = gen_fleet_run.generate(source, folder, args.ranks, args.steps)
        size_mb = gen_fleet_run.run_bytes(folder) / benchlib.MB
        what = f"{args.ranks:,} ranks x {args.steps:,} steps"
        print(f"{what}: {records:,} records, {size_mb:,.0f} MB ({benchlib.load_note()})", flush=True)
        for mode in MODES:
            runs = []
            for _ in range(args.repeat):
                runs.append(open_once(folder, mode))
                print(f"  {mode}: open in {runs[-1][0]:.1f} s, peak {runs[-1][1]:,.0f} MB, "
                      f"{runs[-1][2]:,.0f} MB once open", flush=True)
            note = f"median of {len(runs)}; {records:,} records, {size_mb:,.0f} MB of recording; {benchlib.load_note()}"
            group = f"dashboard load (zeromon dashboard{' --replay' if mode == 'replay' else ''})"
            rows += [
                benchlib.Row(group, f"{what}: time until the page answers", "s", None,
                             benchlib.median([r[0] for r in runs]), "", None, note),
                benchlib.Row(group, f"{what}: peak RSS, all processes", "MB", None,
                             benchlib.median([r[1] for r in runs]), "", None, note),
                benchlib.Row(group, f"{what}: RSS once open, all processes", "MB", None,
                             benchlib.median([r[2] for r in runs]), "", None, note),
            ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    benchlib.print_rows("zeromon dashboard opening a fleet's recording and its replay", rows)
    benchlib.write_rows(args.json, rows)


if __name__ == "__main__":
    main()
