"""The recorder's work a collective counted, not timed: machine instructions under callgrind, and Python bytecodes.

    python tests/bench/bench_recorder_instructions.py [--against PATH] [--functions 30] [--bytecodes 30] [--json out.json]

The recorder's CPU a collective moves by a quarter from one run to the next on a shared machine, and by more from
one hour to the next (tests/bench/RESULTS.md), which hides a change of a few percent. A count does not move: the
passes of tests/test_agent_cost_budget.py's steady FSDP2 steps on gloo (11 synchronous collectives, seven phase
changes, three memory samples and three agent spans a step, as examples/fsdp2_train.py's rank 0 queues them; 400
steps, a pass a quarter of them, each flushed, then the stop and a read of the live totals) are replayed in a fresh
process of each tree (this tree's test replays them: the same records and passes in each), once and then three times under
valgrind's callgrind: the difference, over the two replays and their collectives, is the instructions a collective
of a warm recorder, every thread of the process counted. Instructions are not time (a cache miss costs more than an
add), but the recorder's work is interpreted Python and the C it calls, where the two go together; where they part,
bench_agent_cost.py times the live loop.

``--functions N``: this tree's N C functions with the most instructions a collective (callgrind_annotate, exclusive
costs: the interpreter's loop, dict look-ups, the allocator, zlib, the project's C modules). ``--bytecodes N``: its N
Python functions with the most bytecodes a collective (``sys.settrace``'s opcode events over one warm replay).
``--against PATH``: the same replay in a second checkout (a ``git worktree`` of another commit, its C modules built
beside its sources). Needs valgrind (``apt-get install valgrind``); says so, exit 2, where it is not installed.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import benchlib

TESTS = benchlib.REPO_ROOT / "tests"
# The child: one tree's recorder (its packages first on the path) replaying the steady steps' queues with
# tests/test_agent_cost_budget.py's replay_passes (this tree's: the same queues and passes for every tree), ``replays``
# times (the first warms its caches and imports, and is in both counts), or with "bytecodes" once warm under an
# opcode tracer.
_CHILD = """
import collections, sys, tempfile
from pathlib import Path
sys.path.insert(1, sys.argv[1])
from test_agent_cost_budget import STEPS, _steady_steps, replay_passes
control, raw = _steady_steps(STEPS)
with tempfile.TemporaryDirectory() as folder:
    if sys.argv[2] == "bytecodes":
        replay_passes(control, raw, Path(folder))
        counts = collections.Counter()
        def trace(frame, event, arg):
            frame.f_trace_opcodes, frame.f_trace_lines = True, False
            if event == "opcode":
                counts[Path(frame.f_code.co_filename).name + ":" + frame.f_code.co_name] += 1
            return trace
        sys.settrace(trace)
        replay_passes(control, raw, Path(folder))
        sys.settrace(None)
        print(repr(counts.most_common()))
    else:
        for _ in range(int(sys.argv[2])):
            replay_passes(control, raw, Path(folder))
"""


def _env(tree: Path) -> dict[str, str]:
    """The examples' environment with ``tree``'s packages first, and one hash seed: a string's hash moves a dict's
    probes, and with them the count, by about a percent from one process to the next."""
    env = benchlib.example_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "agents")])
    env["PYTHONHASHSEED"] = "0"
    return env


def instructions(tree: Path, replays: int, out: Path | None = None) -> int:
    """The instructions callgrind counted in a fresh process of ``tree`` replaying the passes ``replays`` times."""
    result = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out or os.devnull}",
                             sys.executable, "-c", _CHILD, str(TESTS), str(replays)],
                            env=_env(tree), cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True)
    match = re.search(r"Collected : (\d+)", result.stderr)
    if match is None:
        raise RuntimeError(f"callgrind said no count: {result.stderr[-500:]}")
    return int(match.group(1))


def functions(once: Path, thrice: Path) -> dict[str, int]:
    """Each C function's exclusive instructions in ``thrice``'s profile less ``once``'s."""
    def load(path: Path) -> dict[str, int]:
        text = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", "--inclusive=no", str(path)],
                              capture_output=True, text=True, check=True).stdout
        costs: dict[str, int] = {}
        for line in text.splitlines():
            match = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+(\S.*?)(?: \[.*)?$", line)
            if match and "PROGRAM TOTALS" not in line:
                name = re.sub(r"'\d+$", "", match.group(2).rsplit(":", 1)[-1])
                costs[name] = costs.get(name, 0) + int(match.group(1).replace(",", ""))
        return costs

    before, after = load(once), load(thrice)
    return {name: after.get(name, 0) - before.get(name, 0) for name in set(before) | set(after)}


def bytecodes(tree: Path) -> list[tuple[str, int]]:
    """The Python functions of one warm replay in ``tree``, by bytecodes run, most first."""
    result = subprocess.run([sys.executable, "-c", _CHILD, str(TESTS), "bytecodes"], env=_env(tree),
                            cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True)
    counted: list[tuple[str, int]] = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    return counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, default=None, help="a second checkout, counted the same way")
    parser.add_argument("--functions", type=int, default=0, help="this tree's C functions with the most instructions")
    parser.add_argument("--bytecodes", type=int, default=0, help="this tree's Python functions with the most bytecodes")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench_recorder_instructions.py: valgrind is not installed (it counts the instructions under callgrind); "
              "install it (apt-get install valgrind) or time the recorder with bench_recorder_cpu.py", file=sys.stderr)
        return 2
    trees = {"this tree": benchlib.REPO_ROOT}
    if args.against is not None:
        trees[str(args.against)] = args.against.resolve()
    sys.path.insert(0, str(TESTS))
    from test_agent_cost_budget import STEPS, _steady_steps

    collectives = len(_steady_steps(STEPS)[1])
    per: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-instructions-") as tmp:
        for name, tree in trees.items():
            profiles = (Path(tmp) / "1.out", Path(tmp) / "3.out") if args.functions and name == "this tree" \
                else (None, None)
            once, thrice = instructions(tree, 1, profiles[0]), instructions(tree, 3, profiles[1])
            per[name] = (thrice - once) / 2 / collectives
            print(f"  {name}: {per[name]:,.0f} instructions a collective", flush=True)
            if profiles[0] is not None and profiles[1] is not None:
                costs = functions(profiles[0], profiles[1])
                total = sum(costs.values())
                print(f"\n== this tree's C functions, instructions a collective ({total / 2 / collectives:,.0f} in all)")
                for function, cost in sorted(costs.items(), key=lambda item: -item[1])[:args.functions]:
                    print(f"{cost / 2 / collectives:9,.0f}  {100 * cost / total:5.1f}%  {function}")
                print()
    if args.bytecodes:
        counted = bytecodes(benchlib.REPO_ROOT)
        total = sum(count for _, count in counted)
        print(f"\n== this tree's Python functions, bytecodes a collective ({total / collectives:.1f} in all)")
        for function, count in counted[:args.bytecodes]:
            print(f"{count / collectives:8.2f}  {function}")
        print()
    base = list(trees)[1] if len(trees) > 1 else None
    rows = [benchlib.Row(
        "recorder instructions", "the steady passes' instructions a collective (callgrind, warm)", "instructions",
        per[base] if base else None, per["this tree"], "-", None,
        f"{collectives:,} collectives of {STEPS} steady steps a replay; the difference of three replays and one"
        + (f"; baseline {base}" if base else ""))]
    benchlib.print_rows("The recorder's instructions a collective" + (f" (baseline: {base})" if base else ""), rows)
    if args.json:
        benchlib.write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
