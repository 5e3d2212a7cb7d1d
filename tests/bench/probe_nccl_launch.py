"""Where the agent's microseconds go on an NCCL launch, piece by piece (GPU only; issue 33's first step).

    python tests/bench/probe_nccl_launch.py [--json out.json] [--rounds 15] [--calls 2000]

A world-size-1 NCCL group on GPU 0 and a 16-element CUDA tensor, as in bench_collective_overhead.py part
(f). Every variant is a loop of N calls timed around the loop; the variants alternate in shuffled order
every round (benchlib.interleaved) and each figure is the median over rounds of the per-call mean.

Measured:
- the launch itself: synchronous, async with its wait, on the default group and on a group made with
  ``TORCH_NCCL_ENABLE_TIMING=1`` (ProcessGroupNCCL then records a start event of its own);
- the pieces of the agent's CUDA path one by one: reading the current stream, recording an event with
  and without timing, the pool's pop and push, ``CudaTimer.begin``/``end``/``mark``, ``Work.is_completed``,
  ``weakref.ref(work)``, ``Work._get_duration`` on a finished Work of the timing group;
- the patched call as the agent makes it, with and without its events;
- what PyTorch keeps by itself: whether its Flight Recorder is on in this process, what an entry holds,
  and what a dump costs.
Run it under different environments (``TORCH_FR_BUFFER_SIZE=0``, ...) to compare the launch with PyTorch's
own bookkeeping on and off.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

import benchlib
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from bench_collective_overhead import loop, with_enabled, world_of_one

from zeromon_agent.hooks.cuda import CudaTimer, stream_reader
from zeromon_agent.hooks.state import HotState


def repeat(fn: Callable[[], Any]) -> Callable[[int], int]:
    def run(n: int) -> int:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return time.perf_counter_ns() - t0

    return run


def flight_recorder(report: dict[str, Any]) -> None:
    """Whether PyTorch's Flight Recorder keeps entries in this process, what one holds, a dump's cost."""
    try:
        dump = torch._C._distributed_c10d._dump_nccl_trace
    except AttributeError as exc:
        report["flight_recorder"] = f"no _dump_nccl_trace: {exc}"
        return
    try:
        t0 = time.perf_counter_ns()
        raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        t1 = time.perf_counter_ns()
        trace = pickle.loads(raw)
        entries = trace.get("entries", [])
        report["flight_recorder"] = {
            "version": trace.get("version"), "entries": len(entries), "dump_ns": t1 - t0, "bytes": len(raw),
            "keys": sorted(entries[-1].keys()) if entries else [],
            "last_entry": {k: v for k, v in (entries[-1].items() if entries else []) if k != "frames"},
        }
        t0 = time.perf_counter_ns()
        raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=True)
        report["flight_recorder"]["dump_only_active_ns"] = time.perf_counter_ns() - t0
    except Exception as exc:  # noqa: BLE001
        report["flight_recorder"] = f"dump failed: {type(exc).__name__}: {exc}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TORCH_NCCL", "TORCH_FR", "NCCL_"))},
    }
    torch.cuda.set_device(0)
    state = HotState()
    timer = CudaTimer.create(torch)
    assert timer is not None
    original = c10d.all_reduce
    original_wait = c10d.Work.wait
    with world_of_one("nccl", state):
        patched = dist.all_reduce
        tensor = torch.zeros(16, device="cuda")
        os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"
        timed_group = dist.new_group([0])
        os.environ.pop("TORCH_NCCL_ENABLE_TIMING")
        for group in (None, timed_group):
            original(tensor, group=group)
        torch.cuda.synchronize()

        # Whether a finished Work of each group reports its duration (the process group's own events).
        durations: dict[str, Any] = {}
        for name, group in (("default", None), ("timing", timed_group)):
            work = original(tensor, group=group, async_op=True)
            original_wait(work)
            torch.cuda.synchronize()
            try:
                durations[name] = work._get_duration()
            except Exception as exc:  # noqa: BLE001
                durations[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        report["work_duration_ms"] = durations
        report["work_methods"] = sorted(m for m in dir(work) if not m.startswith("__"))

        stream = torch.cuda.current_stream()
        read = stream_reader(torch)
        timed_event = torch.cuda.Event(enable_timing=True)
        plain_event = torch.cuda.Event(enable_timing=False)
        get_device, get_stream = torch._C._cuda_getDevice, torch._C._cuda_getCurrentStream
        record_c = torch._C._CudaEventBase.record
        timer.active = True
        timer.mark()  # builds the fast stream reader
        done_work = original(tensor, group=timed_group, async_op=True)
        original_wait(done_work)
        torch.cuda.synchronize()

        def begin_end() -> None:
            begun = timer.begin((tensor,), {})
            assert begun is not None, "the event pool ran dry"
            pair = timer.end(begun, False)
            timer.release(*pair)

        def mark_release() -> None:
            timer.release(timer.mark())

        def pool_pop_push() -> None:
            timer.pool.append(timer.pool.popleft())

        def get_duration() -> None:
            done_work._get_duration()

        def sync_timing_group(t: torch.Tensor) -> None:
            original(t, group=timed_group)

        def async_wait(t: torch.Tensor) -> None:
            original_wait(original(t, async_op=True))

        def async_wait_timing_group(t: torch.Tensor) -> None:
            original_wait(original(t, group=timed_group, async_op=True))

        def async_is_completed_weakref(t: torch.Tensor) -> None:
            work = original(t, async_op=True)
            weakref.ref(work)
            work.is_completed()
            original_wait(work)

        def patched_async(t: torch.Tensor) -> None:
            patched(t, async_op=True).wait()

        pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

        def sync_one_event(t: torch.Tensor) -> None:
            original(t)
            pair[1].record(stream)

        def sync_two_events(t: torch.Tensor) -> None:
            pair[0].record(stream)
            original(t)
            pair[1].record(stream)

        def no_events(run: Callable[[int], int]) -> Callable[[int], int]:
            def go(n: int) -> int:
                state.cuda_timing = None
                try:
                    return run(n)
                finally:
                    state.cuda_timing = timer

            return go

        state.device_timer = state.cuda_timing = timer
        variants = {
            "launch: sync": loop(original, tensor),
            "launch: sync, timing group": loop(sync_timing_group, tensor),
            "launch: async+wait": loop(async_wait, tensor),
            "launch: async+wait, timing group": loop(async_wait_timing_group, tensor),
            "launch: async+wait, weakref and is_completed": loop(async_is_completed_weakref, tensor),
            "launch: sync + 1 event after (no agent)": loop(sync_one_event, tensor),
            "launch: sync + 2 events around (no agent)": loop(sync_two_events, tensor),
            "agent: sync patched": with_enabled(state, True, loop(patched, tensor)),
            "agent: sync patched, no events": no_events(with_enabled(state, True, loop(patched, tensor))),
            "agent: async+wait patched": with_enabled(state, True, loop(patched_async, tensor)),
            "agent: async+wait patched, no events": no_events(with_enabled(state, True, loop(patched_async, tensor))),
            "piece: torch.cuda.current_stream()": repeat(torch.cuda.current_stream),
            "piece: stream_reader()": repeat(read),
            "piece: _cuda_getCurrentStream(_cuda_getDevice())": repeat(lambda: get_stream(get_device())),
            "piece: timed event.record(stream)": repeat(lambda: timed_event.record(stream)),
            "piece: untimed event.record(stream)": repeat(lambda: plain_event.record(stream)),
            "piece: _CudaEventBase.record(timed, stream)": repeat(lambda: record_c(timed_event, stream)),
            "piece: timer.current_stream()": repeat(getattr(timer, "current_stream", read)),  # before issue 33: none
            "piece: timer.begin + end + release (2 events)": repeat(begin_end),
            "piece: timer.mark + release (1 event)": repeat(mark_release),
            "piece: pool popleft + append": repeat(pool_pop_push),
            "piece: done_work._get_duration()": repeat(get_duration),
            "piece: done_work.is_completed()": repeat(done_work.is_completed),
            "piece: nothing": repeat(lambda: None),
        }

        def between() -> None:
            torch.cuda.synchronize()
            state.raw.clear()
            state.pending.clear()
            state.works.clear()
            timer.awaiting.clear()
            timer.refs.clear()
            # Every variant's calls find events: the agent's variants take 2 and 3 a call (sync, async) and give none back
            # here. The pool holds the events' numbers in CudaTimer.events: new ones go at its end.
            missing = 6 * args.calls - len(timer.pool)
            if missing > 0:
                first = len(timer.events)
                timer.events.extend(torch.cuda.Event(enable_timing=True) for _ in range(missing))
                timer.pool.extend(range(first, first + missing))

        per_call = benchlib.interleaved(variants, args.rounds, args.calls, between=between)
        torch.cuda.synchronize()
        report["median_ns_per_call"] = {name: round(benchlib.median(v), 1) for name, v in per_call.items()}
        flight_recorder(report)
    width = max(map(len, report["median_ns_per_call"]))
    for name, ns in report["median_ns_per_call"].items():
        print(f"{name:<{width}}  {ns:>10,.1f} ns")
    print(json.dumps({k: v for k, v in report.items() if k != "median_ns_per_call"}, indent=1, default=str))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
