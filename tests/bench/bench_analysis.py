"""Analysis of a large recording: 1,000,000 collective events and 10,000 memory samples.

Target (issue 3): the whole analysis (reading the rank files, per-step overlap, bandwidth,
stragglers, OOM forecast: what `zeromon report --json` does) in under 5 s and under 1 GB.

A synthetic 2-rank recording is written with zeromon's own writer: 5,000 steps, 100 collectives
(half of them async) and 4 phase spans per step per rank, 5,000 memory samples per rank. Time is
measured in a fresh process (`--child`) that runs what `zeromon report RUN_DIR --json` runs (each rank
read and analysed in a worker process, one per CPU); peak memory is the largest sum of the RSS of
that process and its workers, sampled every 10 ms (pages they share counted once per process).

    python tests/bench/bench_analysis.py [--events 1000000] [--samples 10000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zeromon.model import CollectiveEvent, MemorySample, PhaseSpan, RecordingWriter, RunInfo, StepSummary

RANKS = 2


def write_recording(folder: Path, events: int, samples: int) -> None:
    per_rank = events // RANKS
    steps = per_rank // 100
    samples_per_rank = samples // RANKS
    rng = random.Random(0)
    for rank in range(RANKS):
        writer = RecordingWriter(folder / f"rank-{rank}.jsonl", rank)
        writer.write(RunInfo(rank=rank, local_rank=rank, world_size=RANKS, host="bench", pid=1, job="bench",
                             framework="fsdp2", framework_version="2.13.0", torch_version="2.13.0",
                             backend="nccl", device=f"cuda:{rank}", zero_stage=None, fsdp_strategy="FULL_SHARD",
                             param_dtype="bfloat16", reduce_dtype="float32", optimizer="AdamW", knobs={}))
        t = 1_800_000_000_000_000_000
        seq = 0
        sample_every = max(1, steps // samples_per_rank)
        written_samples = 0
        for step in range(steps):
            start = t
            phases = [("forward", 30_000_000), ("backward", 60_000_000), ("optimizer", 5_000_000), ("other", 5_000_000)]
            cursor = t
            for phase, length in phases:
                writer.write(PhaseSpan(rank=rank, step=step, phase=phase, start_ns=cursor, end_ns=cursor + length))
                cursor += length
            for i in range(100):
                seq += 1
                issue = start + i * 900_000 + rng.randint(0, 100_000)
                duration = rng.randint(200_000, 2_000_000)
                is_async = i % 2 == 0
                writer.write(CollectiveEvent(
                    seq=seq, rank=rank, step=step, phase="forward" if i < 33 else "backward",
                    op="all_gather" if i < 66 else "reduce_scatter", api="all_gather_single",
                    bytes_in=2**20, bytes_out=2**21, dtype="bfloat16", group_size=RANKS, async_op=is_async,
                    issue_ns=issue, complete_ns=issue + duration, blocked_s=0.0 if is_async else duration / 1e9,
                    timing="wait" if is_async else "sync", meaning="param_all_gather",
                    wait_ns=None if is_async else issue))
            if step % sample_every == 0 and written_samples < samples_per_rank:
                written_samples += 1
                writer.write(MemorySample(
                    rank=rank, step=step, phase="forward", t_ns=start + 30_000_000, device=f"cuda:{rank}",
                    allocated=40 * 2**30 + step * 1000, reserved=50 * 2**30, active=40 * 2**30,
                    peak_allocated=45 * 2**30, peak_reserved=50 * 2**30, inactive_split=2**28,
                    num_alloc_retries=0, num_ooms=0, capacity=80 * 2**30, free=30 * 2**30, rss=2**31,
                    categories={"sharded_params": 2**33, "unsharded_params": 2**32, "optimizer_state": 2**34,
                                "activations": 2**33}))
            writer.write(StepSummary(rank=rank, step=step, start_ns=start, end_ns=cursor, phase_s={"forward": 0.03},
                                     collectives=100, comm_bytes=100 * 2**21, comm_bytes_by_op={}, comm_union_s=0.05,
                                     blocked_s=0.02, peak_memory=40 * 2**30))
            t = cursor
        writer.close()


def child(folder: str) -> None:
    """What `zeromon report RUN_DIR --json` runs: every rank read and analysed in a worker process
    (one per CPU), the ranks combined in this one."""
    t0 = time.perf_counter()
    from zeromon.sources.run_analysis import analyse_run

    report = analyse_run(Path(folder))
    json.dumps(report.to_dict(), default=str)
    total_s = time.perf_counter() - t0
    with open("/proc/self/status") as f:
        parent_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
    print(json.dumps({"total_s": total_s, "parent_rss_mb": parent_kb / 1024,
                      "workers": min(len(report.ranks), len(os.sched_getaffinity(0))),
                      "events": sum(b.count for b in report.bandwidth), "ranks": len(report.ranks)}))


def measure(folder: Path) -> dict[str, float]:
    """One run of child() in a fresh process; the RSS of it and its workers together sampled from
    here every 10 ms (from outside: no thread of ours in the process that forks the workers)."""
    sys.path.insert(0, str(Path(__file__).parent))  # benchlib, also when a test imports this module
    import benchlib

    proc = subprocess.Popen([sys.executable, __file__, "--child", str(folder)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak_kb = 0
    while proc.poll() is None:
        peak_kb = max(peak_kb, benchlib.tree_rss_kb(proc.pid))
        time.sleep(0.01)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"the analysis failed:\n{err}")
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    result["peak_rss_mb"] = max(peak_kb / 1024, result["parent_rss_mb"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--child", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        write_recording(folder, args.events, args.samples)
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"wrote {args.events:,} events, {args.samples:,} samples: {size / 2**20:.0f} MB in "
              f"{time.perf_counter() - t:.1f} s")
        runs = [measure(folder) for _ in range(args.repeat)]
        runs.sort(key=lambda r: r["total_s"])
        median = runs[len(runs) // 2]
        for r in runs:
            print(f"  total {r['total_s']:.2f} s  peak RSS {r['peak_rss_mb']:.0f} MB (all processes; this one "
                  f"{r['parent_rss_mb']:.0f} MB)  ({r['events']:,} collectives analysed, {r['ranks']} ranks, "
                  f"{r['workers']} workers)")
        met = median["total_s"] < 5 and median["peak_rss_mb"] < 1024
        print(f"median total {median['total_s']:.2f} s (target < 5 s), peak RSS {median['peak_rss_mb']:.0f} MB "
              f"(target < 1024 MB): {'MET' if met else 'NOT MET'}")
        if args.json:
            import benchlib

            note = f"{args.events:,} events, {args.samples:,} memory samples, 2 ranks; read and analysed " \
                   f"in {median['workers']} worker processes"
            benchlib.write_rows(args.json, [
                benchlib.Row("analysis (zeromon report)", "read + analyse a recording", "s", None,
                             median["total_s"], "< 5 s", median["total_s"] < 5, note),
                benchlib.Row("analysis (zeromon report)", "peak RSS of the analysing processes", "MB", None,
                             median["peak_rss_mb"], "< 1024 MB", median["peak_rss_mb"] < 1024,
                             f"this process and its {median['workers']} workers together, sampled every 10 ms; "
                             f"this process alone {median['parent_rss_mb']:.0f} MB"),
            ])


if __name__ == "__main__":
    main()
