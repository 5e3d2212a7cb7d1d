"""A whole run under ``zeromon run`` against the same run under plain torchrun: wall time and CPU, start to exit.

    python tests/bench/bench_whole_run.py [--pairs 12] [--steps 200] [--json out.json]

The run is examples/fsdp2_train.py's default (3 blocks, 11 collectives a step) on 2 ranks, gloo,
``OMP_NUM_THREADS=1``, ``--steps`` steps. With the agent: ``zeromon run --out DIR -- torchrun ...`` as a user
types it (its closing summary printed, which reads the recording); without: the same torchrun command alone.
Each pair runs both, in alternating order. Measured from this process:

- wall: from the command's start to its exit;
- CPU: user + system of the command and every process under it (``RUSAGE_CHILDREN``), the launcher, the ranks
  and their threads, zeromon run's own included;
- zeromon run's start and end: each rank's script (this file, ``--child``) notes the Unix time as it starts
  and as its training ends (the agent stopped there, under zeromon run); the start is the first rank's start
  less the command's start, the end is the command's exit less the last rank's end. The same figures of the
  plain run say what torchrun itself takes; the difference is zeromon run's.

The result is the median over pairs of each pair's ratio (with the agent over without).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

TARGET_RATIO = 1.02  # issue 44: wall and CPU medians at most x1.02
TARGET_EDGE_S = 0.2  # issue 44: zeromon run's start, and its end, at most 0.2 s (plus reading the recording)


def child(result: str, example_args: list[str]) -> None:
    """One rank: the times it starts and ends its training (the agent stopped, where there is one)."""
    started = time.time()
    sys.path.insert(0, str(benchlib.REPO_ROOT / "examples"))
    import fsdp2_train

    fsdp2_train.main(example_args)
    if "zeromon_agent" in sys.modules:
        sys.modules["zeromon_agent"].detach()
    Path(f"{result}-{os.environ['RANK']}.json").write_text(json.dumps({"start": started, "end": time.time()}))


def run(out: Path, on: bool, steps: int) -> dict[str, float]:
    """One run: its wall time, its processes' CPU, and zeromon run's (or torchrun's) start and end, seconds."""
    env = benchlib.example_env()
    out.mkdir(parents=True)
    result = out / "times"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(benchlib.free_port()), __file__, "--child", str(result), "--", "--steps", str(steps)]
    command = [sys.executable, "-m", "zeromon", "run", "--out", str(out / "run"), "--", *torchrun] if on else torchrun
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=benchlib.REPO_ROOT)
    t1 = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ranks = [json.loads(Path(f"{result}-{rank}.json").read_text()) for rank in range(2)]
    return {"wall_s": t1 - t0, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "start_s": min(r["start"] for r in ranks) - t0, "end_s": t1 - max(r["end"] for r in ranks)}


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--child":
        child(argv[1], argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=12,
                        help="alternated pairs (six cannot tell 1%% apart on a 2-core machine: tests/bench/RESULTS.md, issue 44)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    print(f"{benchlib.load_note()}; {args.pairs} pairs of {args.steps}-step runs", flush=True)
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-whole-") as tmp:
        for pair in range(args.pairs):
            for on in (True, False) if pair % 2 == 0 else (False, True):
                runs[on].append(run(Path(tmp) / f"{pair}-{'on' if on else 'off'}", on, args.steps))
            with_, without = runs[True][-1], runs[False][-1]
            print(f"  pair {pair + 1}: wall {with_['wall_s']:.2f} / {without['wall_s']:.2f} s, "
                  f"CPU {with_['cpu_s']:.2f} / {without['cpu_s']:.2f} s, start {with_['start_s']:.2f} / "
                  f"{without['start_s']:.2f} s, end {with_['end_s']:.2f} / {without['end_s']:.2f} s", flush=True)
    rows: list[benchlib.Row] = []
    note = f"{args.pairs} pairs, alternated; 2 ranks x {args.steps} steps"
    for key, label in (("wall_s", "wall time, the command's start to its exit"),
                       ("cpu_s", "CPU of the command and every process under it")):
        ratios = [a[key] / b[key] for a, b in zip(runs[True], runs[False], strict=True)]
        ratio = statistics.median(ratios)
        rows.append(benchlib.Row("whole run", f"zeromon run against torchrun: {label}", "s",
                                 statistics.median(r[key] for r in runs[False]),
                                 statistics.median(r[key] for r in runs[True]), f"ratio <= x{TARGET_RATIO}",
                                 ratio <= TARGET_RATIO,
                                 f"{note}; median of the pairs' ratios x{ratio:.3f} "
                                 f"({', '.join(f'{r:.3f}' for r in ratios)})"))
    for key, label in (("start_s", "from the command's start to the first rank's start"),
                       ("end_s", "from the last rank's end of training to the command's exit")):
        added = [a[key] - b[key] for a, b in zip(runs[True], runs[False], strict=True)]
        median = statistics.median(added)
        rows.append(benchlib.Row("whole run", f"zeromon run's own time, {label}", "s",
                                 statistics.median(r[key] for r in runs[False]),
                                 statistics.median(r[key] for r in runs[True]), f"added <= {TARGET_EDGE_S} s",
                                 median <= TARGET_EDGE_S,
                                 f"{note}; the pairs' differences {', '.join(f'{d:+.3f}' for d in added)}; the end "
                                 "includes the agent's exit and zeromon run's summary, which reads the recording"))
    benchlib.print_rows("a whole run under zeromon run against plain torchrun", rows)
    benchlib.write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
