"""GPU-only paths: collective timing with CUDA events, and the allocator's OOM observer.

No host synchronization: events are recorded on the current stream around each collective (for an
async one, the end event is recorded when the caller waits, i.e. when its stream is made to wait on
the collective, and one more just before that wait), and at every phase boundary, so that phases
too are timed on the GPU; the events are read later by the agent's background thread with ``Event.query()``. Events come
from a bounded pool; when it is empty the collective is recorded with host timing only. What the hooks queue is an
event's number in the pool (an int), not the event: a queued record of ints is no object the garbage collector
tracks, where one holding an event went through the collector's generations while it waited for the recorder's
pass, and brought on full collections of the whole heap (tests/bench/bench_gpu_drain.py part a).

Only some steps are timed so (ZEROMON_DEVICE_TIMING_EVERY, zeromon_agent.hooks.state.timed_step): two events
cost a synchronous NCCL launch several times what the rest of the agent does, and a collective's time on
the GPU is what the other steps repeat. A collective of another step is recorded as launched (timing
``launch``: its host times, no duration), and its step has no communication time nor overlap.

GPU event times are placed on the host clock by one reference event per calibration, which the
background thread (never the training thread) waits on.

These paths need a CUDA build and a GPU; without one, ``CudaTimer.create()`` returns None.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any, cast


class CudaTimer:
    def __init__(self, torch: Any, pool_size: int = 4096) -> None:
        self.torch = torch
        # The events, by number (from 1: a number is never falsy), and the numbers of those free to record.
        self.events: list[Any] = [None, *(torch.cuda.Event(enable_timing=True) for _ in range(pool_size))]
        self.pool: collections.deque[int] = collections.deque(range(1, pool_size + 1))
        self.exhausted = 0
        # Phase boundaries are marked on the stream only once a collective has run on CUDA tensors:
        # a CPU (gloo) job on a machine with a GPU keeps host phases.
        self.active = False
        # Async collectives timed with CUDA events whose wait is still to come (by seq): only their
        # waits are marked on the stream. Bounded by the caller; emptied as they are waited on or
        # finalized.
        self.awaiting: set[int] = set()
        # Their Works by seq, until their wait: weakly (a Work holds its tensors), for the recorder's poll of one
        # never waited on (CollectiveRecords._work_of). Emptied with ``awaiting``.
        self.refs: dict[int, Any] = {}
        # Async collectives of steps not timed on the device (HotState.time_step), until their wait: it needs
        # no completion check. Emptied as they are waited on or finalized.
        self.untimed_waits: set[int] = set()
        self._ref_event: Any = None
        self._ref_unix_ns = 0
        # The current stream, as torch.cuda.current_stream() gives it (stream_reader); made at the first call,
        # when a CUDA collective has run (never at the agent's start: reading the stream initializes CUDA on
        # the current device, which may not be the one the program picks next).
        self.current_stream: Callable[[], Any] = self._first_stream

    def _first_stream(self) -> Any:
        self.current_stream = stream_reader(self.torch)
        return self.current_stream()

    @classmethod
    def create(cls, torch: Any) -> CudaTimer | None:
        try:
            if not torch.cuda.is_available():
                return None
            return cls(torch)
        except Exception:  # noqa: BLE001
            return None

    # Training thread -------------------------------------------------------------------------------
    def begin(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, Any] | None:
        """(the start event's number, recorded on the current stream, that stream) for a collective on CUDA tensors;
        None for one on CPU tensors, or when the pool is empty. The stream is read once a collective: its
        end event goes on the same one (the collective's launch does not change the current stream)."""
        tensor = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(tensor, (list, tuple)):
            tensor = tensor[0] if tensor else None
        if tensor is None or not getattr(tensor, "is_cuda", False):
            return None
        self.active = True
        try:
            start = self.pool.popleft()
        except IndexError:
            self.exhausted += 1
            return None
        stream = self.current_stream()
        self.events[start].record(stream)
        return start, stream

    def end(self, begun: tuple[int, Any], is_async: bool) -> tuple[int, int | None] | None:
        """(start, end) of a synchronous collective, its end event recorded now; (start, None) for an async
        one, which ends at its wait (the wait's events, ``mark``). Events' numbers."""
        start, stream = begun
        if is_async:
            return (start, None)
        try:
            end = self.pool.popleft()
        except IndexError:
            self.pool.append(start)
            self.exhausted += 1
            return None
        self.events[end].record(stream)
        return (start, end)

    def mark(self, stream: Any = None) -> int | None:
        """The number of an event recorded now on ``stream`` (the current stream if None): a phase boundary, the
        start or end of a wait. None before the first CUDA collective, when the pool is empty or when CUDA
        refuses (never raises into training)."""
        if not self.active:
            return None
        try:
            event = self.pool.popleft()
        except IndexError:
            self.exhausted += 1
            return None
        try:
            self.events[event].record(stream if stream is not None else self.current_stream())
        except Exception:  # noqa: BLE001
            self.pool.append(event)
            return None
        return event

    def can_mark(self, events: int) -> bool:
        """Whether ``events`` marks would find events in the pool now (the training thread alone takes them)."""
        return self.active and len(self.pool) >= events

    after_wait = mark

    # Background thread -----------------------------------------------------------------------------
    def calibrate(self) -> None:
        """Pin GPU event time to the host clock: wait (in this thread only) for a fresh event."""
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        event.synchronize()
        self._ref_event = event
        self._ref_unix_ns = time.time_ns()

    def resolve(self, start: int | None, end: int | None) -> tuple[int, int] | None:
        """(start, end) in Unix ns once both events (by number) completed; None while pending. The caller
        gives the events back with ``release`` once done with them."""
        if start is None or end is None or not self.events[end].query():
            return None
        if self._ref_event is None:
            self.calibrate()
        ref = self._ref_event
        start_ns = self._ref_unix_ns + int(ref.elapsed_time(self.events[start]) * 1e6)
        end_ns = self._ref_unix_ns + int(ref.elapsed_time(self.events[end]) * 1e6)
        return start_ns, end_ns

    def resolve_one(self, event: int | None) -> int | None:
        """When the GPU reached event number ``event``, in Unix ns; None while it has not."""
        if event is None or not self.events[event].query():
            return None
        if self._ref_event is None:
            self.calibrate()
        return self._ref_unix_ns + int(self._ref_event.elapsed_time(self.events[event]) * 1e6)

    def release(self, *events: int | None) -> None:
        """The events (by number) back to the pool."""
        for event in events:
            if event is not None:
                self.pool.append(event)


def stream_reader(torch: Any) -> Callable[[], Any]:
    """A function giving what ``torch.cuda.current_stream()`` gives, in a few hundred ns.

    ``Event.record()`` with no stream calls ``torch.cuda.current_stream()``, whose Python layers (the device
    index's parsing, a new ``Stream`` object each call) cost more than the record itself: most of what the
    agent added to an NCCL launch (tests/bench/probe_nccl_launch.py). This one reads the stream's (id, device,
    type) from ``torch._C``, the same calls ``current_stream`` makes, and keeps one ``Stream`` object per
    stream. It falls back to ``current_stream`` where those calls are missing or give another stream, checked
    at the first call.
    """
    public = torch.cuda.current_stream
    try:
        get_device = torch._C._cuda_getDevice
        get_stream = torch._C._cuda_getCurrentStream
        make = torch.cuda.Stream
    except AttributeError:
        return cast(Callable[[], Any], public)
    streams: dict[Any, Any] = {}

    def current() -> Any:
        key = get_stream(get_device())
        stream = streams.get(key)
        if stream is None:
            if len(streams) >= 64:  # streams a program makes and drops: keep the cache bounded
                streams.clear()
            stream = streams[key] = make(stream_id=key[0], device_index=key[1], device_type=key[2])
        return stream

    try:
        if current() == public():
            return current
    except Exception:  # noqa: BLE001 - another torch's private API: the public call it is
        pass
    return cast(Callable[[], Any], public)


def attach_oom_observer(torch: Any, callback: Any) -> bool:
    """Call ``callback(device, alloc, device_alloc, device_free)`` on every CUDA OOM (CUDA builds)."""
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None or not torch.cuda.is_available():
        return False
    attach(callback)
    return True


def dump_snapshot(torch: Any, path: str) -> bool:
    """Write the allocator snapshot (needs memory history, ZEROMON_MEMORY_HISTORY=1)."""
    try:
        torch.cuda.memory._dump_snapshot(path)
        return True
    except Exception:  # noqa: BLE001
        return False
