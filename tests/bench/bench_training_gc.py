"""Python's garbage collector on each thread of a real run, with the agent and without: what the agent's objects cost
the training thread's collections, which no figure of the agent's own CPU shows.

    python tests/bench/bench_training_gc.py [--steps 600] [--rounds 3] [--variant NAME=VALUE ...] [--json out.json]

The loop is examples/fsdp2_train.py's default (3 blocks: 11 collectives a step) on 2 ranks (gloo,
``OMP_NUM_THREADS=1``): without the agent (plain torchrun), and under ``zeromon run`` as a user runs it. Rank 0 runs
this file as its script (``--child``): ``gc.callbacks`` time each collection on the thread that set it off (thread
CPU), by generation (young, middle, full), from the example's start to its end.

The collector's count of the young generation is every thread's allocations of tracked objects less their frees: the
records the agent's recorder keeps for its live views, and what its hooks queue between two passes, set off
collections on the training thread, and every young and middle collection walks the tracked objects alive in those
generations, the agent's among them. The figure is the training thread's collections' CPU with the agent less without
it, per collective; the recorder's own collections are the agent's CPU (bench_agent_cost.py's part).

``--variant NAME=VALUE`` adds a run of the agent with that setting in each round (an A/B of a change behind a
switch, e.g. ``ZEROMON_NO_COMPILED=1``). Rounds run every variant in a shuffled order; medians are reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import benchlib

GENERATIONS = ("young", "middle", "full")
NO_AGENT, AGENT = "without the agent", "the agent"


def child(result: str, example_args: list[str]) -> None:
    """One rank: the example's main() with each collection timed by thread; rank 0 writes ``result``."""
    sys.path.insert(0, str(benchlib.REPO_ROOT / "examples"))
    import fsdp2_train

    training = threading.get_ident()
    # "<thread>/<generation>": [collections, thread CPU ns, tracked objects in the generations collected]
    tally: dict[str, list[int]] = {}
    started: dict[int, tuple[int, int]] = {}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        ident = threading.get_ident()
        generation = info["generation"]
        if phase == "start":  # the objects it walks counted first (not a full one's: every object), then its clock
            walked = sum(len(gc.get_objects(g)) for g in range(generation + 1)) if generation < 2 else 0
            started[ident] = (walked, time.thread_time_ns())
            return
        who = "training" if ident == training else threading.current_thread().name
        entry = tally.setdefault(f"{who}/{GENERATIONS[generation]}", [0, 0, 0])
        walked, t0 = started.pop(ident, (0, time.thread_time_ns()))
        entry[0] += 1
        entry[1] += time.thread_time_ns() - t0
        entry[2] += walked

    gc.callbacks.append(on_gc)
    fsdp2_train.main(example_args)
    gc.callbacks.remove(on_gc)
    if os.environ.get("RANK") == "0":
        Path(result).write_text(json.dumps(tally))


def run(out: Path, variant: str, env_extra: dict[str, str], steps: int) -> dict[str, list[int]]:
    out.mkdir(parents=True)
    result = out / "gc.json"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(benchlib.free_port()), __file__, "--child", str(result), "--", "--steps", str(steps)]
    command = torchrun if variant == NO_AGENT else [sys.executable, "-m", "zeromon", "run", "--quiet", "--out",
                                                    str(out / "run"), "--", *torchrun]
    subprocess.run(command, env=benchlib.example_env(**env_extra), check=True, capture_output=True,
                   cwd=benchlib.REPO_ROOT)
    tally: dict[str, list[int]] = json.loads(result.read_text())
    return tally


def thread_ms(tally: dict[str, list[int]], thread: str, generation: str | None = None) -> tuple[int, float]:
    """(collections, ms of thread CPU) of ``thread``'s collections (of ``generation``, or all)."""
    picked = [v for k, v in tally.items() if k.split("/")[0] == thread
              and (generation is None or k.split("/")[1] == generation)]
    return sum(v[0] for v in picked), sum(v[1] for v in picked) / 1e6


def walked(tally: dict[str, list[int]], thread: str, generation: str) -> float:
    """The tracked objects a collection of ``generation`` on ``thread`` walked, on average."""
    count, _, objects = tally.get(f"{thread}/{generation}", [0, 0, 0])
    return objects / count if count else 0.0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--child":
        child(argv[1], argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="steps of each run (11 collectives a step)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=VALUE",
                        help="also run the agent with this setting (again for more)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    variants: dict[str, dict[str, str]] = {NO_AGENT: {}, AGENT: {}}
    for setting in args.variant:
        name, _, value = setting.partition("=")
        variants[f"the agent, {setting}"] = {name: value}
    collectives = args.steps * 11  # the example's default: 11 collectives a step, a rank
    print(f"{benchlib.load_note()}; {args.rounds} rounds of {len(variants)} runs, {args.steps} steps each", flush=True)
    tallies: dict[str, list[dict[str, list[int]]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-gc-") as tmp:
        for round_ in range(args.rounds):
            order = list(variants)
            random.Random(round_).shuffle(order)
            for variant in order:
                tally = run(Path(tmp) / f"{round_}-{list(variants).index(variant)}", variant, variants[variant],
                            args.steps)
                tallies[variant].append(tally)
                young, middle = thread_ms(tally, "training", "young"), thread_ms(tally, "training", "middle")
                print(f"  round {round_ + 1}: {variant}: training thread young {young[0]} ({young[1]:.1f} ms, "
                      f"{walked(tally, 'training', 'young'):,.0f} objects each), middle {middle[0]} ({middle[1]:.1f} "
                      f"ms, {walked(tally, 'training', 'middle'):,.0f} objects each); recorder "
                      f"{thread_ms(tally, 'zeromon-recorder')[1]:.1f} ms", flush=True)
    rows: list[benchlib.Row] = []
    baseline = {g: statistics.median(thread_ms(t, "training", g)[1] for t in tallies[NO_AGENT]) for g in GENERATIONS[:2]}
    for variant in variants:
        if variant == NO_AGENT:
            continue
        for generation in GENERATIONS[:2]:
            ms = [thread_ms(t, "training", generation)[1] for t in tallies[variant]]
            counts = [thread_ms(t, "training", generation)[0] for t in tallies[variant]]
            base_counts = [thread_ms(t, "training", generation)[0] for t in tallies[NO_AGENT]]
            base_ms = [thread_ms(t, "training", generation)[1] for t in tallies[NO_AGENT]]
            rows.append(benchlib.Row(
                "training GC", f"{variant}: the training thread's {generation} collections, µs a collective", "µs",
                baseline[generation] * 1e3 / collectives, statistics.median(ms) * 1e3 / collectives, "-", None,
                f"rank 0, {collectives:,} collectives; collections {counts} against {base_counts} without the agent; "
                f"ms {', '.join(f'{v:.1f}' for v in ms)} against {', '.join(f'{v:.1f}' for v in base_ms)}"))
            objects = [walked(t, "training", generation) for t in tallies[variant]]
            base_objects = [walked(t, "training", generation) for t in tallies[NO_AGENT]]
            rows.append(benchlib.Row(
                "training GC", f"{variant}: the tracked objects a {generation} collection walks (training thread)",
                "objects", statistics.median(base_objects), statistics.median(objects), "-", None,
                "the generations it collects, counted at its start; medians of the runs' means"))
        recorder = [thread_ms(t, "zeromon-recorder")[1] for t in tallies[variant]]
        rows.append(benchlib.Row(
            "training GC", f"{variant}: the recorder's collections, µs a collective", "µs", None,
            statistics.median(recorder) * 1e3 / collectives, "-", None,
            f"ms {', '.join(f'{v:.1f}' for v in recorder)} (part of the agent's own CPU)"))
    benchlib.print_rows("Python's garbage collector by thread, with the agent and without", rows)
    if args.json:
        benchlib.write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
