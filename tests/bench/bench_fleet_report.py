"""`zeromon report` and `zeromon summary` at fleet scale: 64, 256 and 1,024 ranks x 10,000 steps of a generated run.

Target (issue 13): `zeromon report` of 1,024 ranks x 10,000 steps (a summary every step, the detail of 70
steps a rank) in under 60 s and 2 GB on this 2-core machine. `zeromon summary` (``--commands``) is measured
beside it, on the same runs, with no target of its own: read into one process (before each rank was read
in a worker), the 1,024-rank run took 121 s and 11,913 MB there (measured once with /usr/bin/time, 2026-11-25).
So is `zeromon report --json` (every step of every rank; its stdout to a file): made as one dict and dumped
whole by json's pure-Python encoder (before commit "report --json a rank at a time"), 256 ranks took 182 s and
1,744 MB for 810 MB of JSON, 64 ranks 45.0 s and 475 MB (measured once each, 2026-11-25).

The run is made by gen_fleet_run.py from a real 2-rank FSDP2 recording (recorded once here, ~25 s,
or given with --source), in a folder under /tmp removed at the end: in the agent's default compact
form (rank-<r>.zmr, a segment per 0.2 s flush) at every size, and as JSON lines (format 1.x, what the
generator wrote before) at ``--jsonl-sizes`` for comparison. Each is reported ``--repeat``
times as a user runs it (`python -m zeromon report RUN_DIR`, text to a pipe: no progress bar, its
plain lines on stderr); wall time from start to exit, peak RSS the largest sum of the RSS of the
process and its workers, sampled every 50 ms from outside. A run past 600 s or 8 GB is stopped and said.

    python tests/bench/bench_fleet_report.py [--sizes 64,256,1024] [--jsonl-sizes 1024] [--steps 10000]
                                             [--repeat 3] [--json out.json]

Before the columnar report (commit da28aa1: a StepOverlap object per step sent back from every worker,
10 million of them kept in one process), measured once each on the same generated runs, the machine
loaded (load average 4-6): 64 ranks 41.1 s and 439 MB (8.2 s at a lower load), 256 ranks 147.6 s and
1,501 MB (71.1 s at a lower load), 1,024 ranks 488.2 s and 6,168 MB. Before the report read the compact
form a batch of segments at a time (commit 18b72b2: the generator wrote JSON lines, 3,181 MB at 1,024 ranks;
medians of 3, 2026-11-23 16:43 UTC, load average 2.9-4.2): 64 ranks 9.7 s and 189 MB, 256 ranks 33.5 s and
388 MB, 1,024 ranks 76.4 s (64.6-91.2 s) and 1,314 MB. The same code read the generated compact form
~2x slower than those JSON lines (64 ranks: 10.5 s of CPU against 4.7 s, measured once here).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import benchlib
import gen_fleet_run

LIMIT_S = 600.0
LIMIT_RSS_MB = 8192.0
TARGET_S = 60.0
TARGET_RSS_MB = 2048.0
TARGET_RANKS = 1024
STDOUT_KEPT = 1 << 20  # of what a command prints (report --json prints every step of every rank: gigabytes)
FORMS = {"zmr": "compact, format 2.x", "jsonl": "JSON lines, format 1.x"}


def measure(folder: Path, repeat: int, command: str = "report") -> tuple[list[benchlib.TreeRun], str]:
    """``command``: a zeromon command and its flags ("report --json"), given RUN_DIR last."""
    runs = []
    for _ in range(repeat):
        run = benchlib.run_watched([sys.executable, "-m", "zeromon", *command.split(), str(folder)], LIMIT_S,
                                   LIMIT_RSS_MB, stdout_chars=STDOUT_KEPT)
        state = f"stopped at the {run.stopped} limit" if run.stopped else f"exit {run.returncode}"
        print(f"  {command}: {run.wall_s:.1f} s, peak RSS {run.peak_rss_mb:,.0f} MB, "
              f"{run.stdout_bytes / benchlib.MB:,.0f} MB out ({state})", flush=True)
        runs.append(run)
        if run.stopped or run.returncode not in (0, 3):
            print(run.stderr[-2000:])
            break
    return runs, runs[-1].stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024", help="rank counts, comma-separated (compact form)")
    parser.add_argument("--jsonl-sizes", default="1024", help="rank counts to report as JSON lines too ('' none)")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--commands", default="report,summary,report --json",
                        help="the zeromon commands measured, with their flags, comma-separated")
    parser.add_argument("--source", type=Path, help="a 2-rank run folder (default: record one)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    cases = [("zmr", n) for n in sizes] + [("jsonl", int(n)) for n in args.jsonl_sizes.split(",") if n]
    rows: list[benchlib.Row] = []
    work = Path(tempfile.mkdtemp(prefix="zeromon-fleet-", dir="/tmp"))
    try:
        source = args.source or gen_fleet_run.record_source(work / "source")
        for form, ranks in cases:
            folder = work / f"run-{ranks}-{form}"
            started = time.perf_counter()
            records = gen_fleet_run.generate(source, folder, ranks, args.steps, form=form)
            made_s = time.perf_counter() - started
            size_mb = gen_fleet_run.run_bytes(folder) / benchlib.MB
            print(f"{ranks} ranks x {args.steps:,} steps ({FORMS[form]}): {records:,} records, {size_mb:,.0f} MB "
                  f"written in {made_s:.1f} s ({benchlib.load_note()})", flush=True)
            what = f"{ranks:,} ranks x {args.steps:,} steps" + ("" if form == "zmr" else f" ({FORMS[form]})")
            texts = {}
            for command in args.commands.split(","):
                runs, texts[command] = measure(folder, args.repeat, command)
                done = [r for r in runs if not r.stopped]
                wall = benchlib.median([r.wall_s for r in done]) if done else LIMIT_S
                rss = benchlib.median([r.peak_rss_mb for r in done]) if done else max(r.peak_rss_mb for r in runs)
                stopped = next((r.stopped for r in runs if r.stopped), None)
                target = ranks == TARGET_RANKS and form == "zmr" and command == "report"
                printed_mb = runs[-1].stdout_bytes / benchlib.MB
                note = (f"median of {len(done)} of {len(runs)} runs; {records:,} records, {size_mb:,.0f} MB of "
                        f"recording" + (f", {printed_mb:,.0f} MB printed" if printed_mb >= 1 else "")
                        + f"; {benchlib.load_note()}" + (f"; stopped at the {stopped} limit" if stopped else ""))
                group = f"fleet {command} (zeromon {command})"
                rows += [
                    benchlib.Row(group, f"{what}: wall time", "s", None, wall, f"< {TARGET_S:.0f} s" if target else "",
                                 (wall < TARGET_S and not stopped) if target else None, note),
                    benchlib.Row(group, f"{what}: peak RSS, all processes", "MB", None, rss,
                                 f"< {TARGET_RSS_MB:.0f} MB" if target else "",
                                 (rss < TARGET_RSS_MB and not stopped) if target else None, note),
                ]
            rows.append(benchlib.Row("fleet report (gen_fleet_run)", f"{what}: generate", "s", None, made_s, "", None,
                                     f"{size_mb:,.0f} MB written"))
            text = next(iter(texts.values()))
            if (form, ranks) == ("zmr", sizes[-1]):
                print("\n".join(text.splitlines()[:24]))
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    benchlib.print_rows("zeromon report at fleet scale", rows)
    benchlib.write_rows(args.json, rows)


if __name__ == "__main__":
    main()
