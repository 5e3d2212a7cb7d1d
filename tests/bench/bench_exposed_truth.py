"""Exposed communication against the training thread's own stopwatch, run after run (issue 47).

    python tests/bench/bench_exposed_truth.py [--runs 20] [--parallel 2] [--mode hidden] [--off-ms 0.5]

Each run is tests/scenarios/overlap_truth.py on 2 ranks (gloo, 12 steps, every async completion with its
callback): the script times its issue call and its wait around each step's all-reduce (its exposed time, and the
two parts of it), zeromon records the run. ``--parallel`` runs go at once, the load a CI machine's two test
workers put on its two cores. A step is off where the thread lost more (or less) than zeromon counts as exposed
by over ``--off-ms``; each is printed with its run, rank and step, the part (the issue call or the wait) where
the two differ, and how much of it the thread lost outside zeromon's wrapper (between the script's clock reads and
the wrapper's first and last: the caller's own code, as the script times it on the Unix clock). The exit status is
1 where a step is off by more than that: zeromon short (or long) inside its own calls; the failure names the runs
and the steps.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

sys.path.insert(0, str(benchlib.REPO_ROOT / "tests"))

from exposed_truth import outside_wrapper_s  # noqa: E402

from conftest import child_env, ranks_args  # noqa: E402 - the tests' launcher of ranks

SCENARIO = benchlib.REPO_ROOT / "tests" / "scenarios" / "overlap_truth.py"


def one_run(index: int, mode: str, folder: Path) -> list[dict[str, float | int]]:
    """A run's steps (after the first): the thread's exposed, issue and wait against zeromon's, seconds."""
    from zeromon.model import read_run

    out = subprocess.run(ranks_args(2, SCENARIO, "--mode", mode, "--steps", "12", "--truth-dir", str(folder)),
                         env=child_env(ZEROMON_OUT=str(folder), ZEROMON_ASYNC_SAMPLE_EVERY="1"),
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"run {index} failed: {out.stderr[-2000:]}")
    rows = []
    for rec in read_run(folder):
        truth = {t["step"]: t for t in json.loads((folder / f"truth-{rec.rank}.json").read_text())}
        calls = {c.step: c for c in rec.collectives if c.op == "all_reduce"}
        for summary in rec.steps:
            t, call = truth.get(summary.step), calls.get(summary.step)
            if t is None or call is None or summary.step < 1 or summary.exposed_comm_s is None:
                continue
            zeromon_issue = call.issue_s if call.async_op else call.blocked_s
            zeromon_wait = call.blocked_s if call.async_op else 0.0
            rows.append({"run": index, "rank": rec.rank, "step": summary.step, "thread_s": t["exposed_s"],
                         "zeromon_s": summary.exposed_comm_s, "thread_issue_s": t["issue_s"],
                         "zeromon_issue_s": zeromon_issue, "thread_wait_s": t["wait_s"], "zeromon_wait_s": zeromon_wait,
                         "outside_s": outside_wrapper_s(t, call)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (the load of CI's two test workers)")
    parser.add_argument("--mode", default="hidden", choices=("sync", "hidden", "partial"))
    parser.add_argument("--off-ms", type=float, default=0.5, help="a step off by more than this is printed")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    print(f"{benchlib.load_note()}; {args.runs} runs of {args.mode}, {args.parallel} at once", flush=True)
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-exposed-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        runs = list(pool.map(lambda i: one_run(i, args.mode, Path(tmp) / str(i)), range(args.runs)))
    steps = [row for rows in runs for row in rows]
    off = [r for r in steps if abs(float(r["thread_s"]) - float(r["zeromon_s"])) * 1e3 > args.off_ms]
    # Off by what zeromon's calls hold: the difference less the thread's time outside the wrapper (between the
    # script's clock reads and the wrapper's: the caller's own code, which no wrapper can time).
    inside = [r for r in off if abs(float(r["thread_s"]) - float(r["zeromon_s"])) - float(r["outside_s"])
              > args.off_ms / 1e3]
    for r in off:
        part = ("the issue call" if abs(float(r["thread_issue_s"]) - float(r["zeromon_issue_s"]))
                >= abs(float(r["thread_wait_s"]) - float(r["zeromon_wait_s"])) else "the wait")
        where = "inside zeromon's wrapper" if r in inside else "outside zeromon's wrapper"
        print(f"  run {r['run']} rank {r['rank']} step {r['step']}: the thread lost {float(r['thread_s']) * 1e3:.2f} ms, "
              f"zeromon counts {float(r['zeromon_s']) * 1e3:.2f} ms exposed; most of the difference in {part} "
              f"(issue {float(r['thread_issue_s']) * 1e3:.2f} / {float(r['zeromon_issue_s']) * 1e3:.2f} ms, wait "
              f"{float(r['thread_wait_s']) * 1e3:.2f} / {float(r['zeromon_wait_s']) * 1e3:.2f} ms: thread / zeromon), "
              f"{float(r['outside_s']) * 1e3:.2f} ms of it {where}")
    rows = [benchlib.Row("exposed truth", f"steps whose exposed communication is off the thread's stopwatch by over "
                         f"{args.off_ms:g} ms ({args.mode})", "steps", None, len(off), "-", None,
                         f"{len(steps)} steps of {args.runs} runs, {args.parallel} at once; runs with a step off: "
                         f"{sorted({int(r['run']) for r in off}) or 'none'}"),
            benchlib.Row("exposed truth", f"of which off inside zeromon's wrapper ({args.mode})", "steps", None,
                         len(inside), "0", not inside,
                         f"the rest lost the time in the caller's code, between its clock reads and the wrapper's; "
                         f"runs: {sorted({int(r['run']) for r in inside}) or 'none'}")]
    benchlib.print_rows("exposed communication against the thread's stopwatch", rows)
    benchlib.write_rows(args.json, rows)
    return 1 if inside else 0


if __name__ == "__main__":
    sys.exit(main())
