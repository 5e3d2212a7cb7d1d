"""What the agent adds to one collective call, on the training thread.

    python tests/bench/bench_collective_overhead.py [--json out.json]

(a) micro: a no-op Python function with ``dist.all_reduce``'s signature, called with a real
    16-element float tensor, against the same function wrapped by
    ``zeromon_agent.hooks.collectives.make_wrapper`` (the extractor reads the tensor's nbytes and dtype,
    the wrapper takes two timestamps and pushes a raw tuple), with the agent enabled and disabled.
(b) real: ``dist.all_reduce`` on a 16-element tensor in a world-size-1 gloo process group, the
    original function against the patched one (``collectives.install``), synchronous and
    ``async_op=True`` + ``.wait()``. The async path includes the ``Work.wait`` wrapper and, on every
    ``async_sample_every``-th call (16 by default), a completion callback; a variant with sampling
    off shows what the callback costs.
(c) where the time goes: the wrapper's pieces (extractor, clock reads, thread-local flag, the
    record-and-push) timed one by one.
(d) cold caches: (a)'s no-op and wrapped no-op, each call after an untimed copy of a buffer (256 KiB,
    4 MiB) that evicts what the call had cached, as a real collective's work between two calls does
    (a 60 µs gloo all-reduce adds several times (a)'s figure on some machines): each call timed alone.
(e) (c)'s pieces around (b)'s real synchronous call, the bare call alternating with each piece call by
    call: which piece a real call pays for.
(g) the GPU paths' Python, on the host (runs anywhere): (a)'s no-op, returning a completed c10d Work when async
    (a real Work and its real wait), called with a stand-in CUDA tensor, the agent's state as on a GPU in a
    step timed on the device (a ``CudaTimer`` over stand-in events: a record is an empty Python call) and in
    one not timed on it. What it shows is the Python that (f)'s rows pay around the launch, without the
    CUDA driver's share (a real event's record, torch's stream look-up), which only (f) measures.
(f) GPU only (skipped without CUDA and NCCL): (b) with NCCL on a 16-element CUDA tensor, world size 1,
    the host's cost of each call (a launch: the GPU runs it later). The agent's wrapper there also
    records two CUDA events on the stream (``CudaTimer``; one more at an async call's wait), which a
    variant with the events off separates from the rest.

Method: every variant runs its own loop of N calls, timed with ``perf_counter_ns`` around the
loop; the variants alternate in a shuffled order every round (so drift from other processes on
this shared machine falls evenly on all), and the result is the median over rounds of the per-call
mean. The garbage collector stays enabled, as in training: the agent's allocations make it run
more often, and that is part of its cost. Between rounds the agent's raw buffer is drained by a
real ``Recorder`` writing a real recording file, untimed for the call path; the drain is timed on
its own and reported as the background cost per event (it runs on the recorder thread in
production, holding the GIL, so it competes with training in Python-heavy code).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import benchlib
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from zeromon.model.codec import RecordingWriter
from zeromon_agent.hooks import collectives
from zeromon_agent.hooks.state import UNTIMED, HotState, perf_ns
from zeromon_agent.recorder.loop import Recorder

MICRO_TARGET_NS = 1000.0  # the issue: <= 1 us added on the synchronous path
ASYNC_TARGET_NS = 5000.0  # the issue: <= 5 us added on the async path
NCCL_SYNC_TARGET_NS = 2000.0  # issue 33: <= 2 us added to a synchronous NCCL launch
NCCL_ASYNC_TARGET_NS = 4000.0  # issue 33: <= 4 us added to an async NCCL launch with its wait


def noop_all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> None:
    """Stands in for dist.all_reduce: same signature, no work, so only the wrapper is measured."""
    return None


def loop(fn: Callable[[Any], Any], arg: Any) -> Callable[[int], int]:
    """A variant for benchlib.interleaved: n calls of fn(arg), elapsed ns."""

    def run(n: int) -> int:
        t0 = perf_ns()
        for _ in range(n):
            fn(arg)
        return perf_ns() - t0

    return run


def in_untimed_step(state: HotState, timer: Any, run: Callable[[int], int]) -> Callable[[int], int]:
    """``run`` in a step not timed on the device (HotState.time_step's state for it), then back to a timed one."""

    def go(n: int) -> int:
        state.cuda_timing, state.untimed = None, UNTIMED
        try:
            return run(n)
        finally:
            state.cuda_timing, state.untimed = timer, None

    return go


def with_enabled(state: HotState, enabled: bool, run: Callable[[int], int]) -> Callable[[int], int]:
    """The same loop with the agent's switch set for its duration (off again afterwards)."""

    def wrapped(n: int) -> int:
        state.enabled = enabled
        try:
            return run(n)
        finally:
            state.enabled = False

    return wrapped


def phase_boundaries(state: HotState, timer: Any, rounds: int, calls: int, out_dir: Path,
                     sync: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Per-call ns of phase boundaries as a step's hooks make them (PhaseTracker.set_phase, alternating two
    phases) in a step timed on the device (an event on the stream each) and in one not, and of an empty loop of the
    same length (without zeromon there is no boundary). Run on their own after the collectives' variants: a round
    of boundaries leaves a step of ``calls`` spans for the recorder, which would weigh on the collectives' rounds.
    Between rounds the step ends (PhaseTracker.end_step: the recorder closes its spans and gives their CUDA events
    back to the pool). The timer is marked active, as a run's first CUDA collective does."""
    from zeromon_agent.hooks.phases import PhaseTracker

    tracker = PhaseTracker(state)
    timer.active = True
    phases = ("forward", "backward")
    drainer = Drainer(state, out_dir, cuda_timer=timer)

    def boundaries(n: int) -> int:
        set_phase = tracker.set_phase
        t0 = perf_ns()
        for i in range(n):
            set_phase(phases[i & 1])
        return perf_ns() - t0

    def between() -> None:
        state.enabled = True
        try:
            tracker.end_step()
        finally:
            state.enabled = False
        if sync is not None:
            sync()
        drainer()

    variants = {
        "empty loop": loop(lambda _: None, None),
        "phase boundary, timed step": with_enabled(state, True, boundaries),
        "phase boundary, untimed step": in_untimed_step(state, timer, with_enabled(state, True, boundaries)),
    }
    per_call = benchlib.interleaved(variants, rounds, calls, between=between)
    drainer.close()
    return per_call


def weighted(timed: float, plain: float, every: int) -> float:
    """A long run's mean per call when 1 step in ``every`` is timed on the device (the first two are too few to count)."""
    return (timed + (every - 1) * plain) / every


def phase_rows(benchmark: str, med: dict[str, float], every: int | None, note: str) -> list[benchlib.Row]:
    """The phase boundary's rows: its cost in a step timed on the device and in one not, over an empty loop of
    the same length (without zeromon there is no boundary), and a long run's mean at 1 step in ``every``."""
    base = med["empty loop"]
    timed, plain = med["phase boundary, timed step"], med["phase boundary, untimed step"]
    rows = [benchlib.Row(benchmark, "phase boundary (set_phase), a step timed on the device", "ns", base, timed, "",
                         None, f"an event on the stream; {note}"),
            benchlib.Row(benchmark, "phase boundary (set_phase), a step not timed on the device", "ns", base, plain,
                         "", None, "no event")]
    if every is not None:
        rows.append(benchlib.Row(benchmark, f"phase boundary (set_phase), 1 step in {every} timed", "ns", base,
                                 weighted(timed, plain, every), "", None,
                                 "the two rows above, weighted; a step has 4-6 boundaries"))
    return rows


class Drainer:
    """Drains the state's raw buffer with a real Recorder (file writer included), timing the drain."""

    def __init__(self, state: HotState, out_dir: Path, cuda_timer: Any = None) -> None:
        self.state = state
        self.writer = RecordingWriter(out_dir / "rank-0.jsonl", 0, job="bench")
        # Not started: drained from the benchmark thread between rounds, never inside a timed loop.
        self.recorder = Recorder(state, 0, self.writer, flush_interval_s=0.2, cuda_timer=cuda_timer)
        self.events = 0
        self.ns = 0

    def __call__(self) -> None:
        n = len(self.state.raw)
        t0 = perf_ns()
        self.recorder._drain(final=False)
        self.writer.flush()
        self.ns += perf_ns() - t0
        self.events += n

    def close(self) -> None:
        self.recorder._drain(final=True)
        self.writer.close()

    @property
    def ns_per_event(self) -> float:
        return self.ns / self.events if self.events else 0.0


# --- (a) micro -------------------------------------------------------------------------------------

def bench_micro(rounds: int, calls: int, out_dir: Path) -> list[benchlib.Row]:
    state = HotState()
    _, extract = collectives.DIST_SPECS["all_reduce"]
    wrapped = collectives.make_wrapper(noop_all_reduce, "all_reduce", "all_reduce", extract, state)
    tensor = torch.zeros(16)
    drainer = Drainer(state, out_dir)
    variants = {
        "no-op": loop(noop_all_reduce, tensor),
        "wrapped, disabled": with_enabled(state, False, loop(wrapped, tensor)),
        "wrapped, enabled": with_enabled(state, True, loop(wrapped, tensor)),
    }
    per_call = benchlib.interleaved(variants, rounds, calls, between=drainer)
    drainer.close()
    base = benchlib.median(per_call["no-op"])
    note = f"{rounds} rounds x {calls} calls; {benchlib.load_note()}"
    return [
        benchlib.Row("collective (micro)", "wrapper, agent enabled: median per call", "ns", base,
                     benchlib.median(per_call["wrapped, enabled"]), f"added <= {MICRO_TARGET_NS:.0f} ns",
                     benchlib.median(per_call["wrapped, enabled"]) - base <= MICRO_TARGET_NS, note),
        benchlib.Row("collective (micro)", "wrapper, agent disabled: median per call", "ns", base,
                     benchlib.median(per_call["wrapped, disabled"]), "", None),
        benchlib.Row("collective (micro)", "wrapper, agent enabled: mean per call", "ns",
                     sum(per_call["no-op"]) / rounds, sum(per_call["wrapped, enabled"]) / rounds, "", None,
                     "mean over rounds: includes the GC collections the agent's allocations trigger"),
        benchlib.Row("collective (micro)", "recorder drain per event (background thread)", "ns", None,
                     drainer.ns_per_event, "", None,
                     f"{drainer.events:,} events, file written; dropped {state.dropped}"),
    ]


# --- (b) real gloo all_reduce ----------------------------------------------------------------------

@contextlib.contextmanager
def world_of_one(backend: str, state: HotState | None = None) -> Iterator[None]:
    """A world-size-1 process group of ``backend``, with the agent's wrappers installed on ``state`` if given;
    both undone on the way out."""
    dist.init_process_group(backend, rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{benchlib.free_port()}")
    try:
        if state is None:
            yield
            return
        original = c10d.all_reduce
        collectives.install(state)
        try:
            assert getattr(dist.all_reduce, "__zeromon_original__", None) is original, \
                "install() did not patch all_reduce"
            yield
        finally:
            collectives.uninstall()
    finally:
        dist.destroy_process_group()


Call = Callable[[torch.Tensor], None]


def all_reduce_calls(original: Any, original_wait: Any, patched: Any) -> tuple[Call, Call, Call, Call]:
    """The original and the patched all-reduce, synchronous and async with its wait, as one-argument calls."""

    def orig_sync(t: torch.Tensor) -> None:
        original(t)

    def patched_sync(t: torch.Tensor) -> None:
        patched(t)

    def orig_async(t: torch.Tensor) -> None:
        original_wait(original(t, async_op=True))  # the unpatched Work.wait

    def patched_async(t: torch.Tensor) -> None:
        patched(t, async_op=True).wait()  # the patched Work.wait, as training calls it

    return orig_sync, patched_sync, orig_async, patched_async


def bench_gloo(rounds: int, calls: int, out_dir: Path) -> list[benchlib.Row]:
    state = HotState()
    original = c10d.all_reduce
    original_wait = c10d.Work.wait
    with world_of_one("gloo", state):
        patched = dist.all_reduce
        tensor = torch.zeros(16)
        drainer = Drainer(state, out_dir)

        orig_sync, patched_sync, orig_async, patched_async = all_reduce_calls(original, original_wait, patched)
        def unsampled(run: Callable[[int], int]) -> Callable[[int], int]:
            def go(n: int) -> int:
                state.async_sample_every = 0
                try:
                    return run(n)
                finally:
                    state.async_sample_every = 16

            return go

        variants = {
            "sync original": loop(orig_sync, tensor),
            "sync patched, disabled": with_enabled(state, False, loop(patched_sync, tensor)),
            "sync patched, enabled": with_enabled(state, True, loop(patched_sync, tensor)),
            "async original": loop(orig_async, tensor),
            "async patched, disabled": with_enabled(state, False, loop(patched_async, tensor)),
            "async patched, enabled": with_enabled(state, True, loop(patched_async, tensor)),
            "async patched, enabled, no callback": unsampled(with_enabled(state, True, loop(patched_async, tensor))),
        }
        # calls is a multiple of 16, so every batch of the sampled variant has calls/16 callbacks.
        per_call = benchlib.interleaved(variants, rounds, calls, between=drainer)
        drainer.close()

    med = {name: benchlib.median(values) for name, values in per_call.items()}
    note = f"{rounds} rounds x {calls} calls; {benchlib.load_note()}"
    sync_added = med["sync patched, enabled"] - med["sync original"]
    async_added = med["async patched, enabled"] - med["async original"]
    return [
        benchlib.Row("collective (gloo, world 1)", "all_reduce sync, agent enabled", "ns", med["sync original"],
                     med["sync patched, enabled"], f"added <= {MICRO_TARGET_NS:.0f} ns",
                     sync_added <= MICRO_TARGET_NS, note),
        benchlib.Row("collective (gloo, world 1)", "all_reduce sync, agent disabled", "ns", med["sync original"],
                     med["sync patched, disabled"], "", None),
        benchlib.Row("collective (gloo, world 1)", "all_reduce async+wait, agent enabled", "ns",
                     med["async original"], med["async patched, enabled"], f"added <= {ASYNC_TARGET_NS:.0f} ns",
                     async_added <= ASYNC_TARGET_NS, "1 in 16 calls gets a completion callback"),
        benchlib.Row("collective (gloo, world 1)", "all_reduce async+wait, enabled, no callback", "ns",
                     med["async original"], med["async patched, enabled, no callback"], "", None,
                     "async_sample_every=0: the difference to the row above is the sampled callback"),
        benchlib.Row("collective (gloo, world 1)", "all_reduce async+wait, agent disabled", "ns",
                     med["async original"], med["async patched, disabled"], "", None),
        benchlib.Row("collective (gloo, world 1)", "recorder drain per event (background thread)", "ns", None,
                     drainer.ns_per_event, "", None, f"{drainer.events:,} events; dropped {state.dropped}"),
    ]


# --- (f) real NCCL all_reduce on a GPU ----------------------------------------------------------------

def bench_nccl(rounds: int, calls: int, out_dir: Path) -> list[benchlib.Row]:
    """(b) on a CUDA tensor with NCCL: the host's cost of launching the collective, with and without
    the agent, in a step timed on the device (CUDA events) and in one that is not (a long run times 1 step in
    ZEROMON_DEVICE_TIMING_EVERY: the cost it pays is the two mixed; zeromon_agent.hooks.state.timed_step).
    Every round ends with ``torch.cuda.synchronize()`` (untimed), so the launch queue never fills and the
    recorder resolves the round's events and gives them back to the pool."""
    from zeromon_agent.context.config import AgentConfig
    from zeromon_agent.hooks.cuda import CudaTimer

    torch.cuda.set_device(0)
    state = HotState()
    timer = CudaTimer.create(torch)
    assert timer is not None, "CudaTimer.create() returned None on a CUDA machine"
    state.device_timer = state.cuda_timing = timer
    every = AgentConfig().device_timing_every
    original = c10d.all_reduce
    original_wait = c10d.Work.wait
    with world_of_one("nccl", state):
        patched = dist.all_reduce
        tensor = torch.zeros(16, device="cuda")
        original(tensor)
        torch.cuda.synchronize()  # NCCL's communicator is made at the first call: outside the timing
        drainer = Drainer(state, out_dir, cuda_timer=timer)

        def between() -> None:
            torch.cuda.synchronize()
            drainer()

        orig_sync, patched_sync, orig_async, patched_async = all_reduce_calls(original, original_wait, patched)

        variants = {
            "sync original": loop(orig_sync, tensor),
            "sync patched, timed step": with_enabled(state, True, loop(patched_sync, tensor)),
            "sync patched, untimed step": in_untimed_step(state, timer,
                                                          with_enabled(state, True, loop(patched_sync, tensor))),
            "sync patched, disabled": with_enabled(state, False, loop(patched_sync, tensor)),
            "async original": loop(orig_async, tensor),
            "async patched, timed step": with_enabled(state, True, loop(patched_async, tensor)),
            "async patched, untimed step": in_untimed_step(state, timer,
                                                           with_enabled(state, True, loop(patched_async, tensor))),
        }
        per_call = benchlib.interleaved(variants, rounds, calls, between=between)
        torch.cuda.synchronize()
        drainer.close()
        per_call |= phase_boundaries(state, timer, rounds, calls, out_dir / "phases", torch.cuda.synchronize)

    med = {name: benchlib.median(values) for name, values in per_call.items()}
    note = f"{rounds} rounds x {calls} calls; {benchlib.load_note()}; {torch.cuda.get_device_name(0)}"
    rows = []
    for kind, target, events in (("sync", NCCL_SYNC_TARGET_NS, "two events on the stream"),
                                 ("async", NCCL_ASYNC_TARGET_NS, "an event at the launch, two at the wait")):
        label = "all_reduce sync launch" if kind == "sync" else "all_reduce async+wait"
        timed, plain = med[f"{kind} patched, timed step"], med[f"{kind} patched, untimed step"]
        mixed = weighted(timed, plain, every)
        added = mixed - med[f"{kind} original"]
        rows += [
            benchlib.Row("collective (NCCL, world 1, GPU)", f"{label}, a step timed on the device", "ns",
                         med[f"{kind} original"], timed, "", None, f"{events}; {note}"),
            benchlib.Row("collective (NCCL, world 1, GPU)", f"{label}, a step not timed on the device", "ns",
                         med[f"{kind} original"], plain, "", None, "no event: recorded as launched"),
            benchlib.Row("collective (NCCL, world 1, GPU)", f"{label}, agent enabled (1 step in {every} timed)",
                         "ns", med[f"{kind} original"], mixed, f"added <= {target:.0f} ns", added <= target,
                         "the two rows above, weighted as a long run mixes them"),
        ]
        # What another ZEROMON_DEVICE_TIMING_EVERY would cost, from the same two rows (a choice to make on them).
        rows += [benchlib.Row("collective (NCCL, world 1, GPU)", f"{label}, were 1 step in {other} timed", "ns",
                              med[f"{kind} original"], weighted(timed, plain, other), "", None,
                              "the same two rows, weighted") for other in (8, 16, 32, 64) if other != every]
    rows += phase_rows("collective (NCCL, world 1, GPU)", med, every, note)
    rows += [
        benchlib.Row("collective (NCCL, world 1, GPU)", "all_reduce sync launch, agent disabled", "ns",
                     med["sync original"], med["sync patched, disabled"], "", None),
        benchlib.Row("collective (NCCL, world 1, GPU)", "recorder drain per event (background thread)", "ns", None,
                     drainer.ns_per_event, "", None,
                     f"{drainer.events:,} events; dropped {state.dropped}; event pool empty {timer.exhausted} times"),
    ]
    return rows


# --- (g) the GPU paths' Python on the host ------------------------------------------------------------

class StandInCudaTensor:
    """What the agent reads of a CUDA tensor: its size, dtype and ``is_cuda`` (no GPU here)."""

    __slots__ = ("nbytes", "dtype", "is_cuda")

    def __init__(self) -> None:
        self.nbytes, self.dtype, self.is_cuda = 64, torch.float32, True


class StandInEvent:
    """A CUDA event whose record is an empty Python call: the driver's share of a real one is (f)'s to measure."""

    __slots__ = ()

    def __init__(self, enable_timing: bool = False) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def stand_in_torch() -> Any:
    """As much of ``torch`` as CudaTimer reads, over stand-in events; no private stream API (the public call is a
    constant here), so the timer reads the stream through ``torch.cuda.current_stream``."""
    from types import SimpleNamespace

    cuda = SimpleNamespace(Event=StandInEvent, is_available=lambda: True, current_stream=lambda: "stream")
    return SimpleNamespace(cuda=cuda, _C=SimpleNamespace())


def bench_gpu_paths_on_host(rounds: int, calls: int, out_dir: Path) -> list[benchlib.Row]:
    from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

    from zeromon_agent.hooks.cuda import CudaTimer

    done: torch.futures.Future[None] = torch.futures.Future()
    done.set_result(None)

    def launch(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        """An NCCL launch's host side without its work: a sync call returns None, an async one a fresh Work."""
        return _create_work_from_future(done) if async_op else None

    state = HotState()
    timer = CudaTimer(stand_in_torch(), pool_size=8192)  # a round's timed async calls take three events each
    state.device_timer = state.cuda_timing = timer
    wrapped = collectives.make_wrapper(launch, "all_reduce", "all_reduce", collectives.DIST_SPECS["all_reduce"][1],
                                       state)
    original_wait = c10d.Work.wait
    tensor = StandInCudaTensor()
    drainer = Drainer(state, out_dir, cuda_timer=timer)

    variants = {
        "sync, no agent": loop(launch, tensor),
        "sync, timed step": with_enabled(state, True, loop(wrapped, tensor)),
        "sync, untimed step": in_untimed_step(state, timer, with_enabled(state, True, loop(wrapped, tensor))),
        "async, no agent": loop(lambda t: original_wait(launch(t, async_op=True)), tensor),
        "async, timed step": with_enabled(state, True, loop(lambda t: wrapped(t, async_op=True).wait(), tensor)),
        "async, untimed step": in_untimed_step(
            state, timer, with_enabled(state, True, loop(lambda t: wrapped(t, async_op=True).wait(), tensor))),
    }
    c10d.Work.wait = collectives.make_wait(original_wait, state)  # type: ignore[method-assign]
    try:
        per_call = benchlib.interleaved(variants, rounds, calls, between=drainer)
    finally:
        c10d.Work.wait = original_wait  # type: ignore[method-assign]
    drainer.close()
    per_call |= phase_boundaries(state, timer, rounds, calls, out_dir / "phases")
    med = {name: benchlib.median(values) for name, values in per_call.items()}
    note = f"{rounds} rounds x {calls} calls; {benchlib.load_note()}"
    rows = []
    for kind, label in (("sync", "sync launch"), ("async", "async launch + wait")):
        for step in ("timed", "untimed"):
            rows.append(benchlib.Row("collective (GPU paths, host share)", f"{label}, a step {step.replace('untimed', 'not timed')} on the device", "ns",
                                     med[f"{kind}, no agent"], med[f"{kind}, {step} step"], "", None, note))
    rows += phase_rows("collective (GPU paths, host share)", med, None, note)
    rows.append(benchlib.Row("collective (GPU paths, host share)", "recorder drain per event (background thread)", "ns",
                             None, drainer.ns_per_event, "", None,
                             f"{drainer.events:,} events; dropped {state.dropped}; event pool empty {timer.exhausted} times"))
    return rows


# --- (c) where the time goes -----------------------------------------------------------------------

PIECE_LABELS = {
    "extract": "extract(args, kwargs): nbytes, dtype, group, async_op",
    "clock": "perf_counter_ns() (the wrapper reads it twice)",
    "flags": "inside/enabled flags: 2 reads + 2 writes",
    "record": "the inline sync record: seq, the ring's push of its 17 fields",
    "push": "the ring's push of a record's fields alone",
}


def wrapper_pieces(state: HotState, tensor: torch.Tensor) -> dict[str, Callable[[Any], None]]:
    """Each piece of the enabled wrapper (PIECE_LABELS) as a one-line function of one ignored argument."""
    _, extract = collectives.DIST_SPECS["all_reduce"]
    args: tuple[Any, ...] = (tensor,)
    kwargs: dict[str, Any] = {}
    dtype = tensor.dtype

    def piece_extract(_: Any) -> None:
        extract(args, kwargs)

    def piece_clock(_: Any) -> None:
        perf_ns()

    def piece_flags(_: Any) -> None:
        if state.inside or not state.enabled:  # the two reads the wrapper does first
            return
        state.inside = True
        state.inside = False

    def piece_record(_: Any) -> None:
        # The synchronous record, as the wrapper writes it out inline.
        state.seq = seq = state.seq + 1
        state.raw.push(0, seq, "all_reduce", "all_reduce", 1, 2, 64, 64, dtype, None, False, None,
                       state.phase, state.step, None, False, None)

    def piece_push(_: Any) -> None:
        state.raw.push(0, 1, "all_reduce", "all_reduce", 1, 2, 64, 64, dtype, None, False, None, "x", 0, None,
                       False, None)

    return {"extract": piece_extract, "clock": piece_clock, "flags": piece_flags, "record": piece_record,
            "push": piece_push}


def bench_pieces(rounds: int, calls: int) -> list[benchlib.Row]:
    """Each piece of the enabled wrapper, called from a one-line function; minus an empty such call."""
    state = HotState()
    state.enabled = True

    def nothing(_: Any) -> None:
        pass

    pieces = {"nothing": nothing, **wrapper_pieces(state, torch.zeros(16))}
    variants = {name: loop(fn, None) for name, fn in pieces.items()}
    per_call = benchlib.interleaved(variants, rounds, calls, between=state.raw.clear)
    base = benchlib.median(per_call["nothing"])
    return [benchlib.Row("wrapper pieces", label, "ns", base, benchlib.median(per_call[name]), "", None)
            for name, label in PIECE_LABELS.items()]


# --- (d) cold caches -------------------------------------------------------------------------------

EVICT_BYTES = (256 * 1024, 4 * 2**20)  # past a core's L2 (512 KiB on the EPYC this was written on); most of an L3


def evicting_loop(fn: Callable[[Any], Any], arg: Any, evict: bytearray) -> Callable[[int], int]:
    """n calls of fn(arg), each after an untimed copy of ``evict``; the calls' own ns, summed."""

    def run(n: int) -> int:
        total = 0
        for _ in range(n):
            bytes(evict)
            t0 = perf_ns()
            fn(arg)
            total += perf_ns() - t0
        return total

    return run


def bench_cold(rounds: int, calls: int) -> list[benchlib.Row]:
    state = HotState()
    state.enabled = True
    _, extract = collectives.DIST_SPECS["all_reduce"]
    wrapped = collectives.make_wrapper(noop_all_reduce, "all_reduce", "all_reduce", extract, state)
    tensor = torch.zeros(16)
    rows = []
    for size in EVICT_BYTES:
        evict = bytearray(size)
        variants = {"no-op": evicting_loop(noop_all_reduce, tensor, evict),
                    "wrapped": evicting_loop(wrapped, tensor, evict)}
        per_call = benchlib.interleaved(variants, rounds, calls, between=state.raw.clear)
        rows.append(benchlib.Row("collective (cold caches)",
                                 f"wrapper, agent enabled, {size // 1024:,} KiB copied between calls: median per call",
                                 "ns", benchlib.median(per_call["no-op"]), benchlib.median(per_call["wrapped"]),
                                 "", None, f"{rounds} rounds x {calls} calls, each call timed alone"))
    return rows


# --- (e) the pieces around a real call ------------------------------------------------------------------

def bench_gloo_pieces(rounds: int, out_dir: Path) -> list[benchlib.Row]:
    """(c)'s pieces, each around a real synchronous gloo all-reduce (world size 1), where the wrapper has it
    (before or after the call), against the bare call; and the whole wrapper.

    The variants alternate call by call, in a shuffled order every round, and each call is timed alone:
    a real call's added cost is a few hundred ns on 60 µs, less than what separate loops drift apart by.
    """
    state = HotState()
    state.enabled = True
    original = c10d.all_reduce
    _, extract = collectives.DIST_SPECS["all_reduce"]
    tensor = torch.zeros(16)
    drainer = Drainer(state, out_dir)
    pieces = wrapper_pieces(state, tensor)

    def around(piece: Callable[[Any], None], before: bool) -> Callable[[torch.Tensor], None]:
        def run(t: torch.Tensor) -> None:
            if before:
                piece(None)
            original(t)
            if not before:
                piece(None)

        return run

    def frame(t: torch.Tensor) -> None:
        original(t)

    def nothing(_: Any) -> None:
        pass

    before = {"nothing": True, "extract": True, "clock": True, "flags": True, "record": False}
    variants: dict[str, Callable[[torch.Tensor], Any]] = {
        "original": original, "frame": frame,
        **{name: around(pieces.get(name, nothing), b) for name, b in before.items()},
        "wrapper": collectives.make_wrapper(original, "all_reduce", "all_reduce", extract, state)}
    labels = {"frame": "a Python function around the call",
              "nothing": "an empty piece before the call (the harness's own calls: subtract it from the pieces)",
              **{name: f"{PIECE_LABELS[name]}, {'before' if b else 'after'} the call" for name, b in before.items()
                 if name in PIECE_LABELS},
              "wrapper": "the whole wrapper, agent enabled"}
    times: dict[str, list[int]] = {name: [] for name in variants}
    order = list(variants)
    rng = random.Random(0)
    with world_of_one("gloo"):
        for round_ in range(rounds):
            rng.shuffle(order)
            for name in order:
                fn = variants[name]
                t0 = perf_ns()
                fn(tensor)
                times[name].append(perf_ns() - t0)
            if round_ % 64 == 63:
                drainer()
        drainer.close()
    base = benchlib.median(times["original"])
    note = f"{rounds:,} calls each, alternating call by call; {benchlib.load_note()}"
    return [benchlib.Row("collective pieces (gloo, world 1, sync)", label, "ns", base, benchlib.median(times[name]),
                         "", None, note) for name, label in labels.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="interleaved rounds of the micro benchmark")
    parser.add_argument("--calls", type=int, default=1000, help="calls per variant per round (micro)")
    parser.add_argument("--gloo-rounds", type=int, default=400, help="interleaved rounds with gloo")
    parser.add_argument("--gloo-calls", type=int, default=64, help="calls per variant per round (gloo), "
                        "a multiple of 16")
    parser.add_argument("--piece-calls", type=int, default=6000, help="timed calls of each variant (e)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON (run_all.py reads them)")
    parser.add_argument("--parts", default="abcdefg", help="which parts to run, as letters (e.g. f: the GPU's alone)")
    args = parser.parse_args(argv)
    if args.gloo_calls % 16:
        parser.error("--gloo-calls must be a multiple of 16 (the default callback sampling period)")

    torch.set_num_threads(1)
    print(f"threads: {threading.active_count()} python, torch {torch.__version__}, {benchlib.load_note()}",
          flush=True)
    parts = set(args.parts)
    rows: list[benchlib.Row] = []
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-") as tmp:
        if "a" in parts:
            micro = bench_micro(args.rounds, args.calls, Path(tmp) / "micro")
            benchlib.print_rows("(a) micro: no-op vs make_wrapper(no-op)", micro)
            rows += micro
        if "b" in parts:
            gloo = bench_gloo(args.gloo_rounds, args.gloo_calls, Path(tmp) / "gloo")
            benchlib.print_rows("(b) real: gloo all_reduce, world size 1", gloo)
            rows += gloo
        if "e" in parts:
            real_pieces = bench_gloo_pieces(args.piece_calls, Path(tmp) / "pieces")
            benchlib.print_rows("(e) the pieces around a real synchronous gloo all_reduce, call by call", real_pieces)
    if "c" in parts:
        pieces = bench_pieces(args.rounds, args.calls)
        benchlib.print_rows("(c) the wrapper's pieces (baseline: an empty call)", pieces)
        rows += pieces
    if "d" in parts:
        cold = bench_cold(max(args.rounds // 10, 5), args.calls)
        benchlib.print_rows("(d) cold caches: the wrapper after a copy that evicts the caches", cold)
        rows += cold
    if "e" in parts:
        rows += real_pieces
    if "g" in parts:
        with tempfile.TemporaryDirectory(prefix="zeromon-bench-") as tmp:
            host_share = bench_gpu_paths_on_host(args.rounds, args.calls, Path(tmp) / "gpu-paths")
        benchlib.print_rows("(g) the GPU paths' Python on the host: stand-in events, a completed c10d Work", host_share)
        rows += host_share
    if "f" not in parts:
        pass
    elif torch.cuda.is_available() and dist.is_nccl_available():
        with tempfile.TemporaryDirectory(prefix="zeromon-bench-") as tmp:
            nccl = bench_nccl(args.gloo_rounds, args.gloo_calls, Path(tmp) / "nccl")
        benchlib.print_rows("(f) real: NCCL all_reduce on the GPU, world size 1 (the host's cost of a launch)", nccl)
        rows += nccl
    else:
        print("\n(f) skipped: no CUDA GPU with NCCL here", flush=True)
    benchlib.write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
