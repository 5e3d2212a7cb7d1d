"""Parts (g) and (f) of bench_collective_overhead.py for two versions of the agent in one process, alternated.

    git worktree add /tmp/before <commit>
    python tests/bench/ab_gpu_paths.py --before /tmp/before/agents [--real] [--rounds N] [--calls N] [--json PATH]

What the GPU paths' hot code adds per call, before and after a change to it, for both versions side by side:
sync and async with its wait, in a step timed on the device and in one not timed on it.
- By default, part (g)'s variants: a no-op launch returning a completed c10d Work when async, a stand-in CUDA
  tensor, a ``CudaTimer`` over stand-in events: the Python around the launch, on any machine.
- ``--real``: part (f)'s, a real NCCL ``all_reduce`` of 16 floats on GPU 0 (world size 1) and real CUDA events,
  each round ending with ``torch.cuda.synchronize()``. Without a GPU it runs gloo on the CPU instead, to check
  the script (its tensors are on the CPU, so no step is timed on the device there).

Why one process: this machine's speed drifts between processes, and within minutes, by more than such a change
moves a call (part (g)'s baseline took 59 ns in one run and 98 ns in the next). Here every variant of both sides
runs in a shuffled order every round (benchlib.interleaved), so the drift falls on both alike. The other
version's ``zeromon_agent`` is loaded as ``zeromon_agent_before``, a copy with its imports renamed, so that each
side runs its own hot path, state, event timer and recorder (which drains its side between rounds, untimed).

The two sides share one garbage collector, which a change to what the hot path leaves tracked moves for both:
without a collection between loops, a change that left untimed steps' records untracked measured +0.4-0.7 µs on
the timed steps' async calls here (four runs, either version loaded as the other), and nothing when each version
ran in its own process. So every loop starts with ``gc.collect(1)`` (untimed): with its young generations empty,
each loop pays for the collections its own calls bring about, not for what the variant before it left.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchlib
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from bench_collective_overhead import StandInCudaTensor, stand_in_torch, world_of_one
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

from zeromon.model.codec import RecordingWriter
from zeromon_agent.hooks.state import perf_ns

BEFORE = "zeromon_agent_before"


def load_before(agents_dir: Path, into: Path) -> str:
    """Copy ``agents_dir``'s zeromon_agent to ``into`` as BEFORE, its imports of itself renamed; import it."""
    source = agents_dir / "zeromon_agent"
    # The agent's modules were one folder deep before its subpackages (hooks/collectives.py since).
    if not any((source / where).is_file() for where in ("hooks/collectives.py", "collectives.py")):
        raise SystemExit(f"--before {agents_dir}: no zeromon_agent/hooks/collectives.py there (give a checkout's agents/)")
    target = into / BEFORE
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in target.rglob("*.py"):
        path.write_text(re.sub(r"\bzeromon_agent\b", BEFORE, path.read_text()))
    sys.path.insert(0, str(into))
    importlib.import_module(BEFORE)
    return BEFORE


_DONE: torch.futures.Future[None] = torch.futures.Future()
_DONE.set_result(None)


def stand_in_launch(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
    """An NCCL launch's host side without its work: a sync call returns None, an async one a fresh Work."""
    return _create_work_from_future(_DONE) if async_op else None


# Where each module is in the agent's subpackages; a checkout from before them has it one folder deep.
_LAYOUT = {"collectives": "hooks.collectives", "state": "hooks.state", "cuda": "hooks.cuda", "recorder": "recorder.loop"}


def _module(package: str, name: str) -> Any:
    try:
        return importlib.import_module(f"{package}.{_LAYOUT[name]}")
    except ModuleNotFoundError:
        return importlib.import_module(f"{package}.{name}")


class Side:
    """One version of the agent: its state, its event timer, its wrappers and recorder."""

    def __init__(self, package: str, out_dir: Path, launch: Callable[..., Any], tensor: Any, on_gpu: bool) -> None:
        collectives = _module(package, "collectives")
        state_module = _module(package, "state")
        cuda = _module(package, "cuda")
        recorder = _module(package, "recorder")
        self.state = state = state_module.HotState()
        self.untimed = state_module.UNTIMED
        self.tensor = tensor
        # A round's timed async calls take three events each.
        self.timer = cuda.CudaTimer(torch if on_gpu else stand_in_torch(), pool_size=8192)
        state.device_timer = state.cuda_timing = self.timer
        self.wrapped = collectives.make_wrapper(launch, "all_reduce", "all_reduce",
                                                collectives.DIST_SPECS["all_reduce"][1], state)
        self.wait = collectives.make_wait(ORIGINAL_WAIT, state)
        self.writer = RecordingWriter(out_dir / f"{package}.jsonl", 0, job="ab")
        self.recorder = recorder.Recorder(state, 0, self.writer, flush_interval_s=0.2, cuda_timer=self.timer)

    def variant(self, is_async: bool, timed: bool) -> Callable[[int], int]:
        state, wrapped, tensor = self.state, self.wrapped, self.tensor

        def run(n: int) -> int:
            c10d.Work.wait = self.wait  # type: ignore[method-assign]  # the class's: each side's own wrapper, for its loops
            state.enabled = True
            if not timed:
                state.cuda_timing, state.untimed = None, self.untimed
            gc.collect(1)  # each loop starts with empty young generations (the module's docstring)
            try:
                t0 = perf_ns()
                if is_async:
                    for _ in range(n):
                        wrapped(tensor, async_op=True).wait()
                else:
                    for _ in range(n):
                        wrapped(tensor)
                return perf_ns() - t0
            finally:
                state.enabled = False
                state.cuda_timing, state.untimed = self.timer, None
                c10d.Work.wait = ORIGINAL_WAIT  # type: ignore[method-assign]

        return run

    def drain(self, final: bool = False) -> None:
        self.recorder._drain(final=final)
        self.writer.flush()


ORIGINAL_WAIT = c10d.Work.wait


def bare(launch: Callable[..., Any], tensor: Any, is_async: bool) -> Callable[[int], int]:
    def run(n: int) -> int:
        gc.collect(1)
        t0 = perf_ns()
        if is_async:
            for _ in range(n):
                ORIGINAL_WAIT(launch(tensor, async_op=True))
        else:
            for _ in range(n):
                launch(tensor)
        return perf_ns() - t0

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="another checkout's agents/ directory")
    parser.add_argument("--real", action="store_true", help="part (f)'s real NCCL calls on GPU 0 (gloo without one)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 300; with --real 400, as part (f))")
    parser.add_argument("--calls", type=int, help="calls per variant per round (default 1000; with --real 64)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (400 if args.real else 300)
    args.calls = args.calls or (64 if args.real else 1000)
    torch.set_num_threads(1)
    on_gpu = args.real and torch.cuda.is_available() and dist.is_nccl_available()
    with tempfile.TemporaryDirectory(prefix="zeromon-ab-") as tmp, \
            (world_of_one("nccl" if on_gpu else "gloo") if args.real else contextlib.nullcontext()):
        if args.real:
            launch: Callable[..., Any] = c10d.all_reduce  # the original: each side wraps it itself
            if on_gpu:
                torch.cuda.set_device(0)
            tensor: Any = torch.zeros(16, device="cuda" if on_gpu else "cpu")
            launch(tensor)  # NCCL makes its communicator at the first call: outside the timing
        else:
            launch, tensor = stand_in_launch, StandInCudaTensor()
        before = Side(load_before(args.before.resolve(), Path(tmp)), Path(tmp), launch, tensor, on_gpu)
        after = Side("zeromon_agent", Path(tmp), launch, tensor, on_gpu)
        cases = [(is_async, timed) for is_async in (False, True) for timed in (True, False)]
        variants: dict[str, Callable[[int], int]] = {"sync, no agent": bare(launch, tensor, False),
                                                     "async, no agent": bare(launch, tensor, True)}
        for name, side in (("before", before), ("after", after)):
            for is_async, timed in cases:
                variants[f"{'async' if is_async else 'sync'}, {'timed' if timed else 'untimed'}, {name}"] = \
                    side.variant(is_async, timed)

        def between() -> None:
            if on_gpu:
                torch.cuda.synchronize()  # the launch queue never fills; the recorders find the events complete
            before.drain()
            after.drain()

        per_call = benchlib.interleaved(variants, args.rounds, args.calls, between=between)
        between()
        before.drain(final=True)
        after.drain(final=True)
    med = {name: benchlib.median(values) for name, values in per_call.items()}
    where = ("NCCL on " + torch.cuda.get_device_name(0)) if on_gpu else ("gloo on the CPU" if args.real else
                                                                         "stand-ins on the host")
    note = f"{where}; {args.rounds} rounds x {args.calls} calls; {benchlib.load_note()}"
    rows = [benchlib.Row("GPU paths: the call alone", f"{kind} call, no agent", "ns", None, med[f"{kind}, no agent"],
                         "", None, note) for kind in ("sync", "async")]
    for is_async, timed in cases:
        kind = "async" if is_async else "sync"
        label = f"{'async launch + wait' if is_async else 'sync launch'}, a step {'timed' if timed else 'not timed'} on the device"
        base = med[f"{kind}, no agent"]
        added_before = med[f"{kind}, {'timed' if timed else 'untimed'}, before"] - base
        added_after = med[f"{kind}, {'timed' if timed else 'untimed'}, after"] - base
        rows.append(benchlib.Row("GPU paths' host share, added per call: before -> after", label, "ns",
                                 added_before, added_after, "", None, note))
    benchlib.print_rows("the GPU paths' Python on the host, added per call (baseline: before; agent: after)", rows)
    benchlib.write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
