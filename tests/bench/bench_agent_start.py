"""What the agent's start costs a rank, and `zeromon run` its own process: CPU, this tree against another.

    python tests/bench/bench_agent_start.py [--rounds 8] [--against PATH] [--json out.json]

What a whole run pays once, whatever its length (issue 44: a 200-step run's x1.02 leaves ~0.36 s of CPU on 2 ranks,
and these costs are paid by every rank and by the command):

- a rank's agent start: a fresh process imports torch, makes a world-1 gloo group, collects its garbage (so that
  no full collection of torch's objects lands in what is timed), then ``zeromon_agent.attach()``, as `zeromon run`'s
  bootstrap calls it once the group exists. Timed with ``time.process_time`` (the process's CPU, its threads'
  included): the import of the agent's modules, then the start (its threads, the endpoint and its imports, the
  run's files), and how many slotted dataclasses they made and the CPU that took;
- `zeromon run`'s own process around a command that costs nothing (``true``): its CPU (``RUSAGE_CHILDREN`` less
  ``true``'s, which is ~1 ms), from its start to its exit, the closing summary of an empty run included;
- `zeromon run`'s start and end in wall time (issue 44: each at most 0.2 s, plus reading the recording): around a
  command of two Python processes, a launcher and its one child, as torchrun and a rank (each hooked by zeromon run's
  sitecustomize), alternated with the same command alone. The start is the child's first instant less the command's
  start, the end the command's exit less the child's last instant; what zeromon run adds to each is the target's. An
  empty run: the closing summary reads no recording (what reading one costs at its size: bench_analysis.py).

``--against PATH`` runs the same in a second checkout (a ``git worktree`` of another commit, its C modules built
or copied beside its sources), alternated round by round with this one: the change between the two trees, in one
series on one machine. Medians of the rounds.
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

_CHILD = """
import dataclasses, gc, json, os, sys, tempfile, time
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1",
                  ZEROMON_OUT=tempfile.mkdtemp(prefix="zeromon-bench-start-"), ZEROMON_PORT="0")
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
made = [0, 0.0]
def counted(make):
    def timed(*args, **kwargs):
        t = time.process_time()
        try:
            return make(*args, **kwargs)
        finally:
            made[0] += 1
            made[1] += time.process_time() - t
    return timed
# zeromon's own classes are made in zeromon.model.classes._make (loaded here ahead of its package, to be timed whole),
# where it has one; the standard library's in dataclasses._process_class, which _make calls too
import importlib.util
spec = importlib.util.find_spec("zeromon")
classes_file = os.path.join(os.path.dirname(spec.origin), "model", "classes.py")
if os.path.exists(classes_file):
    classes_spec = importlib.util.spec_from_file_location("zeromon.model.classes", classes_file)
    classes = importlib.util.module_from_spec(classes_spec)
    sys.modules["zeromon.model.classes"] = classes
    classes_spec.loader.exec_module(classes)
    classes._make = counted(classes._make)
else:
    dataclasses._process_class = counted(dataclasses._process_class)
gc.collect()
t0 = time.process_time()
import zeromon_agent.agent
t1 = time.process_time()
agent = zeromon_agent.attach()
t2 = time.process_time()
zeromon_agent.detach()
dist.destroy_process_group()
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "start_ms": (t2 - t1) * 1e3, "classes": made[0],
                  "classes_ms": made[1] * 1e3}))
"""


def _env(tree: Path) -> dict[str, str]:
    """The examples' environment (benchlib's), with ``tree``'s packages importable instead of this one's."""
    env = benchlib.example_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "agents")])
    return env


def agent_start(tree: Path) -> dict[str, float]:
    """One rank's agent start in a fresh process of ``tree``: CPU ms of the import, of the start, of its classes."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(benchlib.free_port())], env=_env(tree), cwd=tempfile.gettempdir(),
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def command_cpu(tree: Path) -> float:
    """`zeromon run`'s own CPU in ms around ``true``, in ``tree``."""
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-run-") as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "zeromon", "run", "--out", str(Path(tmp) / "run"), "--", "true"],
                       env=_env(tree), cwd=tmp, check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1e3


# A launcher and its one child, as torchrun and a rank: the child prints the Unix time as it starts and as it ends.
_LAUNCHER = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
             "'import time; print(time.time()); print(time.time())'], check=True)")
TARGET_EDGE_MS = 200.0  # issue 44: zeromon run's start, and its end, at most 0.2 s (plus reading the recording)


def command_edges(tree: Path, under_zeromon: bool) -> tuple[float, float]:
    """The launcher's start (its start to its child's first instant) and end (the child's last instant to its exit),
    ms, alone or under `zeromon run` in ``tree``."""
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-edges-") as tmp:
        command = [sys.executable, "-c", _LAUNCHER]
        if under_zeromon:
            command = [sys.executable, "-m", "zeromon", "run", "--out", str(Path(tmp) / "run"), "--", *command]
        t0 = time.time()
        out = subprocess.run(command, env=_env(tree), cwd=tmp, check=True, capture_output=True, text=True)
        t1 = time.time()
    first, last = map(float, out.stdout.split()[:2])
    return (first - t0) * 1e3, (t1 - last) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--against", type=Path, default=None, help="a second checkout, alternated with this one")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    trees = {"this tree": benchlib.REPO_ROOT}
    if args.against is not None:
        trees[f"{args.against}"] = args.against.resolve()
    print(f"{benchlib.load_note()}; {args.rounds} rounds of {len(trees)} trees", flush=True)
    starts: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    commands: dict[str, list[float]] = {name: [] for name in trees}
    edges: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for round_ in range(args.rounds):
        for under_zeromon in ((False, True) if round_ % 2 == 0 else (True, False)):
            edges[under_zeromon].append(command_edges(benchlib.REPO_ROOT, under_zeromon))
        (alone_start, alone_end), (start_ms, end_ms) = edges[False][-1], edges[True][-1]
        print(f"  round {round_ + 1}: a launcher and its child alone: start {alone_start:.0f} ms, end {alone_end:.0f} "
              f"ms; under zeromon run: start {start_ms:.0f} ms, end {end_ms:.0f} ms", flush=True)
        for name in (list(trees) if round_ % 2 == 0 else list(reversed(trees))):
            start = agent_start(trees[name])
            starts[name].append(start)
            commands[name].append(command_cpu(trees[name]))
            print(f"  round {round_ + 1}: {name}: import {start['import_ms']:.1f} ms, start {start['start_ms']:.1f} ms, "
                  f"{start['classes']:.0f} classes {start['classes_ms']:.1f} ms; zeromon run {commands[name][-1]:.1f} ms",
                  flush=True)
    base = list(trees)[1] if len(trees) > 1 else None
    rows: list[benchlib.Row] = []
    for measure, key in (("the agent's import, ms of CPU", "import_ms"), ("the agent's start after it", "start_ms"),
                         ("of which its slotted classes' making", "classes_ms")):
        values = [s[key] for s in starts["this tree"]]
        rows.append(benchlib.Row(
            "agent start", f"a rank: {measure}", "ms",
            statistics.median(s[key] for s in starts[base]) if base else None, statistics.median(values), "-", None,
            f"{args.rounds} fresh processes a tree; this tree {', '.join(f'{v:.0f}' for v in values)}"
            + (f"; {base} {', '.join(f'{s[key]:.0f}' for s in starts[base])}" if base else "")))
    rows.append(benchlib.Row(
        "agent start", "`zeromon run -- true`: the command's own CPU, ms", "ms",
        statistics.median(commands[base]) if base else None, statistics.median(commands["this tree"]), "-", None,
        f"this tree {', '.join(f'{v:.0f}' for v in commands['this tree'])}"
        + (f"; {base} {', '.join(f'{v:.0f}' for v in commands[base])}" if base else "")))
    for index, edge in ((0, "start: the command's start to its child's"), (1, "end: its child's end to its exit")):
        alone, under = ([e[index] for e in edges[flag]] for flag in (False, True))
        added = statistics.median(under) - statistics.median(alone)
        rows.append(benchlib.Row(
            "agent start", f"`zeromon run`'s {edge}, a launcher and one child (wall), ms", "ms",
            statistics.median(alone), statistics.median(under), f"added <= {TARGET_EDGE_MS:.0f} ms",
            added <= TARGET_EDGE_MS, f"{args.rounds} alternated rounds; alone {', '.join(f'{v:.0f}' for v in alone)}; "
            f"under zeromon run {', '.join(f'{v:.0f}' for v in under)}"))
    benchlib.print_rows("The agent's start in a rank, and zeromon run's own process"
                        + (f" (baseline: {base})" if base else ""), rows)
    if args.json:
        benchlib.write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
