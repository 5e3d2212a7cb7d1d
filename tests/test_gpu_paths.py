"""GPU-only code paths.

This machine and CI have no GPU. What can run for real here runs for real: NVML without a driver
must degrade to a notice, and the CPU build of torch has no OOM observer. The CUDA-event timing and
the allocator/NVML field mapping are exercised against small fakes of torch.cuda and pynvml (a mock,
because the real thing cannot exist here); `tests/test_gpu_real.py` runs them on a real GPU when
one is present.
"""

from __future__ import annotations

import itertools
import sys
import types
from typing import Any

import pytest
import torch

from zeromon_agent.context.config import AgentConfig
from zeromon_agent.context.device import NvmlDevice
from zeromon_agent.hooks.cuda import CudaTimer, attach_oom_observer, stream_reader
from zeromon_agent.hooks.state import AT_WORK, RAW_COLLECTIVE, RAW_WAIT, HotState, timed_step
from zeromon_agent.memory.readings import CudaMemory
from zeromon_agent.memory.watch import MEMORY_VALUES
from zeromon_agent.recorder.loop import Recorder


class _FakeEvent:
    """A CUDA event whose GPU timestamp is set by the fake clock when it is recorded."""

    clock_ms = 0.0

    def __init__(self, enable_timing: bool = False) -> None:
        self.t_ms: float | None = None

    def record(self, stream: Any = None) -> None:
        _FakeEvent.clock_ms += 1.5
        self.t_ms = _FakeEvent.clock_ms

    def query(self) -> bool:
        return self.t_ms is not None

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: _FakeEvent) -> float:
        assert self.t_ms is not None and other.t_ms is not None
        return other.t_ms - self.t_ms


def _fake_torch() -> Any:
    cuda = types.SimpleNamespace(Event=_FakeEvent, is_available=lambda: True, current_stream=lambda: "stream")
    return types.SimpleNamespace(cuda=cuda)


class _CudaTensor:
    is_cuda = True
    nbytes = 4096
    dtype = torch.bfloat16


def test_cuda_events_time_a_collective_without_host_sync() -> None:
    timer = CudaTimer(_fake_torch(), pool_size=4)
    start = timer.begin((_CudaTensor(),), {})
    pair = timer.end(start, is_async=False)
    assert len(timer.pool) == 2
    state = HotState()
    rec = Recorder(state, rank=0, writer=None, flush_interval_s=1.0, cuda_timer=timer)
    state.raw.append((RAW_COLLECTIVE, 1, "all_reduce", "all_reduce", 100, 200, 4096, 4096, torch.bfloat16, None, False,
                      None, "backward", 0, pair, False, None))
    rec._drain(final=False)
    (event,) = [r for _, r in rec.live.recent_records() if type(r).__name__ == "CollectiveEvent"]
    assert event.timing == "cuda_event"
    # Calibration recorded one more event 1.5 ms after the end event: start = ref - 3 ms, end = ref - 1.5 ms.
    assert event.complete_ns - event.issue_ns == 1_500_000
    assert len(timer.pool) == 4, "events go back to the pool once read"


def test_async_collective_ends_at_its_wait_on_the_stream() -> None:
    timer = CudaTimer(_fake_torch(), pool_size=4)
    start = timer.begin((_CudaTensor(),), {})
    pair = timer.end(start, is_async=True)  # (start, None): the end is recorded at wait()
    state = HotState()
    rec = Recorder(state, rank=0, writer=None, flush_interval_s=1.0, cuda_timer=timer)
    state.raw.append((RAW_COLLECTIVE, 7, "all_gather_single", "all_gather", 100, 200, 4096, 8192, torch.bfloat16, None,
                      True, object(), "forward", 0, pair, False, None))
    state.raw.append((RAW_WAIT, 7, 300, 900, False, timer.after_wait(), None, 0))  # no wait-start event: the pool ran dry
    rec._drain(final=False)
    (event,) = [r for _, r in rec.live.recent_records() if type(r).__name__ == "CollectiveEvent"]
    assert event.timing == "cuda_event" and event.async_op
    assert event.complete_ns - event.issue_ns == 1_500_000
    assert event.blocked_s == pytest.approx(600e-9)
    assert len(timer.pool) == 4


def test_cuda_event_pool_exhaustion_falls_back_to_host_timing() -> None:
    timer = CudaTimer(_fake_torch(), pool_size=1)
    start = timer.begin((_CudaTensor(),), {})
    assert timer.end(start, is_async=False) is None  # no end event left: counted, start returned
    assert timer.exhausted == 1 and len(timer.pool) == 1


def test_only_the_waits_of_cuda_timed_collectives_are_marked_on_the_stream() -> None:
    """make_wait records CUDA events (before and after the wait) for a collective that was timed
    with them, and none for one on CPU tensors in the same process (gloo beside NCCL)."""
    from zeromon_agent.hooks.collectives import make_wait, make_wrapper

    state = HotState()
    state.enabled = True
    state.device_timer = state.cuda_timing = timer = CudaTimer(_fake_torch(), pool_size=8)

    class Work:
        def wait(self) -> bool:
            return True

        def is_completed(self) -> bool:
            return False

    wrapped = make_wrapper(lambda tensor, async_op=False: Work(), "all_reduce", "all_reduce",
                           lambda a, k: (4096, 4096, torch.bfloat16, None, True), state=state)
    wait = make_wait(Work.wait, state=state)
    state.async_sample_every = 0
    wait(wrapped(_CudaTensor(), async_op=True))  # timed: start at issue, two events at the wait
    assert len(timer.pool) == 8 - 3 and not timer.awaiting
    wait(wrapped(torch.ones(2), async_op=True))  # CPU tensors: no event at all
    assert len(timer.pool) == 8 - 3 and not timer.awaiting
    waits = [item for item in state.raw if item[0] == RAW_WAIT]
    assert [w[5] is not None and w[6] is not None for w in waits] == [True, False]


class _Stream:
    def __init__(self, stream_id: int = 0, device_index: int = 0, device_type: int = 1) -> None:
        self.key = (stream_id, device_index, device_type)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream) and other.key == self.key

    __hash__ = None  # type: ignore[assignment]


def _torch_with_streams(current: list[tuple[int, int, int]], private: bool = True,
                        public_offset: int = 0) -> Any:
    """A fake torch whose current stream is ``current[0]``; ``torch._C`` has the private calls when
    ``private``; the public call's stream id is off by ``public_offset`` (a torch whose private API
    means something else)."""
    made: list[tuple[int, int, int]] = []

    def make(**kwargs: int) -> _Stream:
        stream = _Stream(**kwargs)
        made.append(stream.key)
        return stream

    cuda = types.SimpleNamespace(
        Stream=make,
        current_stream=lambda: _Stream(current[0][0] + public_offset, current[0][1], current[0][2]))
    c = types.SimpleNamespace(_cuda_getDevice=lambda: current[0][1],
                              _cuda_getCurrentStream=lambda device: current[0]) if private else types.SimpleNamespace()
    return types.SimpleNamespace(cuda=cuda, _C=c, made=made)


def test_the_stream_reader_gives_the_current_stream_and_makes_each_stream_object_once() -> None:
    """Mock (no GPU here): torch._C's stream calls are faked; tests/test_gpu_real.py holds the
    reader to torch.cuda.current_stream() on a real GPU."""
    current = [(0, 0, 1)]
    fake = _torch_with_streams(current)
    read = stream_reader(fake)
    assert read is not fake.cuda.current_stream, "the private calls agree with the public one: the fast path"
    assert read() == _Stream(0, 0, 1) and read() is read()
    current[0] = (5, 0, 1)  # the program enters `with torch.cuda.stream(s)`
    assert read() == _Stream(5, 0, 1)
    current[0] = (0, 0, 1)
    assert read() == _Stream(0, 0, 1)
    assert fake.made == [(0, 0, 1), (5, 0, 1)], "one Stream object per stream, the check's included"


def test_the_stream_reader_falls_back_to_the_public_call() -> None:
    for fake in (_torch_with_streams([(0, 0, 1)], private=False),
                 _torch_with_streams([(0, 0, 1)], public_offset=1)):
        assert stream_reader(fake) is fake.cuda.current_stream


def test_the_timer_records_a_collectives_events_and_its_waits_on_the_current_stream() -> None:
    """Mock (no GPU here): the events go on the stream the reader gives, read once a collective (its start and
    end) and once a wait (its two marks); without the fast reader, on the public call's stream."""
    for private in (True, False):
        assert _streams_recorded_on(private) == [(3, 0, 1)] * 2 + [(5, 0, 1)] * 3


def _streams_recorded_on(private: bool) -> list[tuple[int, int, int]]:
    current = [(3, 0, 1)]
    fake = _torch_with_streams(current, private=private)
    streams: list[Any] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self, stream: Any = None) -> None:
            streams.append(stream.key)

    fake.cuda.Event = Event
    timer = CudaTimer(fake, pool_size=8)
    begun = timer.begin((_CudaTensor(),), {})
    assert begun is not None
    current[0] = (5, 0, 1)  # the program enters `with torch.cuda.stream(s)` before its next call
    timer.end(begun, is_async=False)  # the end goes where the start went
    stream = timer.current_stream()
    timer.mark(stream), timer.after_wait(stream)
    timer.mark()
    return streams


def test_the_timer_reads_the_stream_only_once_a_cuda_collective_runs() -> None:
    """Reading the stream initializes CUDA on the current device: never at the agent's start."""
    calls: list[int] = []
    fake = _torch_with_streams([(0, 0, 1)])
    fake.cuda.Event = _FakeEvent
    fake.cuda.is_available = lambda: True
    get_stream = fake._C._cuda_getCurrentStream
    fake._C._cuda_getCurrentStream = lambda device: calls.append(device) or get_stream(device)
    timer = CudaTimer(fake, pool_size=4)
    assert timer.begin((torch.ones(2),), {}) is None and timer.mark() is None and calls == []
    timer.end(timer.begin((_CudaTensor(),), {}), is_async=False)
    assert len(calls) == 2, "the check at the first read, then one read per collective"


def test_cpu_tensors_are_not_cuda_timed() -> None:
    timer = CudaTimer(_fake_torch(), pool_size=2)
    assert timer.begin((torch.ones(2),), {}) is None


def test_allocator_totals_are_the_statistics_torch_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """CudaMemory.totals() reads the allocator's nested statistics (no GPU here: a stand-in dict of the shape
    torch._C._cuda_memoryStats gives, every value distinct): the values torch.cuda.memory_stats' own flattening
    names by the dotted keys MemorySample's fields stand for, in MEMORY_VALUES' order; None where the allocator
    gives nothing (before CUDA's initialization)."""
    values = iter(range(1, 1000))
    nested: dict[str, Any] = {
        name: {pool: {field: next(values) for field in ("current", "peak", "allocated", "freed")}
               for pool in ("all", "small_pool", "large_pool")}
        for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                     "active_bytes", "inactive_split_bytes", "requested_bytes")}
    nested.update({"num_alloc_retries": next(values), "num_ooms": next(values), "num_device_alloc": next(values)})
    monkeypatch.setattr(torch.cuda.memory, "memory_stats_as_nested_dict", lambda device=None: nested)
    flat = torch.cuda.memory.memory_stats(0)  # torch's flattening of the same statistics
    answers = {"nested": nested}
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        memory_stats_as_nested_dict=lambda device: answers["nested"], mem_get_info=lambda device: (70, 100)))
    mem = CudaMemory.__new__(CudaMemory)
    mem.torch, mem.device = fake, 0
    dotted = ("allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current",
              "allocated_bytes.all.peak", "reserved_bytes.all.peak", "inactive_split_bytes.all.current",
              "num_alloc_retries", "num_ooms")
    assert MEMORY_VALUES[1:9] == ("allocated", "reserved", "active", "peak_allocated", "peak_reserved",
                                  "inactive_split", "num_alloc_retries", "num_ooms")
    assert mem.totals() == tuple(flat[key] for key in dotted)
    assert mem.capacity() == (100, 70)
    answers["nested"] = {}
    assert mem.totals() == (None,) * 8


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU fallback; this machine has a GPU")
def test_nvml_without_a_driver_degrades_to_a_reason() -> None:
    device = NvmlDevice(cuda_index=0)  # the real pynvml: this machine has no NVIDIA driver
    assert device.available is False
    assert "NVML unavailable" in device.reason
    assert device.read() is None


def test_nvml_field_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pynvml")
    fake.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    fake.NVML_PCIE_UTIL_TX_BYTES, fake.NVML_PCIE_UTIL_RX_BYTES = 0, 1  # type: ignore[attr-defined]
    fake.nvmlInit = lambda: None  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByPciBusId = lambda bus: "h"  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByIndex = lambda i: "h"  # type: ignore[attr-defined]
    fake.nvmlDeviceGetName = lambda h: b"NVIDIA H100"  # type: ignore[attr-defined]
    fake.nvmlDeviceGetIndex = lambda h: 3  # type: ignore[attr-defined]
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=40)  # type: ignore[attr-defined]
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=5 * 2**30, total=80 * 2**30)  # type: ignore[attr-defined]
    fake.nvmlDeviceGetPowerUsage = lambda h: 350_000  # type: ignore[attr-defined]
    fake.nvmlDeviceGetTemperature = lambda h, sensor: 61  # type: ignore[attr-defined]

    def no_pcie(h: Any, counter: int) -> int:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    fake.nvmlDeviceGetPcieThroughput = no_pcie  # type: ignore[attr-defined]
    # NVLink: cumulative KiB counters with a microsecond timestamp, read as a rate between samples.
    fake.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, fake.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139  # type: ignore[attr-defined]
    counters = iter([(1_000_000, 100, 50), (3_000_000, 100 + 2048, 50 + 1024)])

    def field_values(h: Any, ids: list[tuple[int, int]]) -> list[Any]:
        ts, tx, rx = next(counters)
        return [types.SimpleNamespace(nvmlReturn=0, timestamp=ts, value=types.SimpleNamespace(ullVal=v))
                for v in (tx, rx)]

    fake.nvmlDeviceGetFieldValues = field_values  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    device = NvmlDevice(cuda_index=0)
    assert device.available and device.index == 3 and device.name == "NVIDIA H100"
    reading = device.read()
    assert reading is not None
    assert reading["util_gpu_pct"] == 87.0 and reading["power_w"] == 350.0 and reading["temperature_c"] == 61.0
    assert reading["mem_total"] == 80 * 2**30
    assert reading["pcie_tx_bytes_s"] is None, "an unsupported field is None, not an exception"
    assert reading["nvlink_tx_bytes_s"] is None, "a rate needs two readings"
    second = device.read()
    assert second is not None
    assert second["nvlink_tx_bytes_s"] == 2048 * 1024 / 2.0 and second["nvlink_rx_bytes_s"] == 1024 * 1024 / 2.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU fallback; this machine has a GPU")
def test_cpu_build_has_no_oom_observer() -> None:
    assert attach_oom_observer(torch, lambda *a: None) is False


def test_only_the_sampled_steps_are_timed_on_the_device_and_the_others_say_so(tmp_path: Any) -> None:
    """Mock (no GPU here: torch.cuda's events are faked). With ZEROMON_DEVICE_TIMING_EVERY=4 the warm-up, steps 0,
    1 and 4 take CUDA events; steps 2 and 3 take none, and their NCCL collectives are recorded as launched (no
    completion, no duration), their summaries with no communication time nor overlap; a gloo group's
    collectives keep their host times there. The report reads such a recording: its medians are the timed
    steps', and a step's unknown figures are null in its JSON."""
    import json
    import subprocess

    import torch.distributed as dist

    from zeromon.model.codec import RecordingWriter, read_recording
    from zeromon_agent.hooks.collectives import make_wait, make_wrapper
    from zeromon_agent.hooks.state import RAW_STEP_END, RAW_STEP_START

    from conftest import child_env

    state = HotState()
    state.enabled = True
    state.async_sample_every = 0
    state.device_timer = timer = CudaTimer(_fake_torch(), pool_size=64)
    state.device_timing_every = 4
    state.time_step()
    completions: list[int] = []

    class Work:
        def wait(self) -> bool:
            return True

        def is_completed(self) -> bool:
            completions.append(state.step)
            return False

    nccl = object()  # a group whose backend cannot be asked: the GPU's
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        on_nccl = make_wrapper(lambda tensor, async_op=False: Work() if async_op else None, "all_reduce",
                               "all_reduce", lambda a, k: (4096, 4096, torch.bfloat16, nccl, k.get("async_op", False)),
                               state=state)
        on_gloo = make_wrapper(lambda tensor: None, "broadcast", "broadcast",
                               lambda a, k: (64, 64, torch.float32, None, False), state=state)
        wait = make_wait(Work.wait, state=state)
        events_taken = []
        for step in range(6):
            state.step = step
            state.time_step()
            state.control.append((RAW_STEP_START, step, perf_ns_now(), None, "forward"))
            before = len(timer.pool)
            on_nccl(_CudaTensor())
            wait(on_nccl(_CudaTensor(), async_op=True))
            on_gloo(torch.ones(16))
            events_taken.append(before - len(timer.pool))
            state.control.append((RAW_STEP_END, step, perf_ns_now(), None, True))
        path = tmp_path / "rank-0.jsonl"
        recorder = Recorder(state, 0, RecordingWriter(path, 0, job="j", world_size=1), 0.2, cuda_timer=timer)
        recorder.stop()
    finally:
        dist.destroy_process_group()
    assert events_taken == [5, 5, 0, 0, 5, 0]  # a synchronous collective's two, an async one's start and its wait's two
    assert completions == [], "a wait in an untimed step asks no event whether it is done"
    rec = read_recording(path)
    timings = {(c.step, c.op, c.async_op): c.timing for c in rec.collectives}
    for step in range(6):
        timed = step in (0, 1, 4)
        assert timings[(step, "all_reduce", False)] == timings[(step, "all_reduce", True)] == \
            ("cuda_event" if timed else "launch"), step
        assert timings[(step, "broadcast", False)] == "sync"  # gloo: its host times are its own
    assert all(c.complete_ns is None and c.duration_s is None for c in rec.collectives if c.timing == "launch")
    summaries = {s.step: s for s in rec.steps}
    assert sorted(summaries) == list(range(6))
    for step, summary in summaries.items():
        unknown = (summary.comm_union_s, summary.comp_s, summary.overlap_s, summary.exposed_comm_s)
        assert (unknown == (None,) * 4) == (step in (2, 3, 5)), (step, unknown)
        assert summary.collectives == 3 and summary.blocked_s is not None
    report = subprocess.run([sys.executable, "-m", "zeromon", "report", "--json", str(tmp_path)],
                            env=child_env(), capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    (rank,) = json.loads(report.stdout)["ranks"]
    per_step = {s["step"]: s for s in rank["per_step"]}
    assert [per_step[s]["exposed_comm_s"] is None for s in range(6)] == [False, False, True, True, False, True]
    assert per_step[4]["comm_s"] > 0
    text = subprocess.run([sys.executable, "-m", "zeromon", "report", str(tmp_path)], env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and "nan" not in text.stdout.lower(), text.stdout + text.stderr
    assert "communication timed on the device: 3 of 6 steps per rank" in text.stdout, text.stdout
    assert rank["device_timed_steps"] == 3


def perf_ns_now() -> int:
    import time

    return time.perf_counter_ns()


def test_a_short_run_is_timed_on_the_device_densely_and_a_long_run_at_one_step_in_n() -> None:
    """The default schedule: a 100-step check has its communication timed on a dozen steps and more, while a long
    run pays for 1 step in ZEROMON_DEVICE_TIMING_EVERY (what part (f) of tests/bench/bench_collective_overhead.py
    weighs); every=1 times every step, and a small N is kept from the start."""
    every = AgentConfig().device_timing_every
    assert every >= 16  # the long-run cost part (f) measures is set by it

    def timed(first: int, last: int, n: int) -> list[int]:
        return [step for step in range(first, last) if timed_step(step, n)]

    assert timed(-1, 2, every) == [-1, 0, 1]
    assert len(timed(0, 100, every)) >= 12
    long_run = len(timed(0, 1_000_000, every)) / 1_000_000
    assert 1 / every <= long_run < 1.01 / every, long_run
    assert timed(0, 300, 1) == list(range(300))
    assert timed(0, 300, 4) == [0, 1] + list(range(4, 300, 4))
    # The spacing grows from 8 steps to N at step 256 and never exceeds N.
    steps = timed(0, 10_000, every)
    assert max(b - a for a, b in itertools.pairwise(steps)) == every


@pytest.mark.parametrize("step", [2, 4])
def test_the_records_of_a_gpu_step_leave_the_garbage_collectors_care(step: int) -> None:
    """Mock (no GPU: torch.cuda's events are faked). A GPU run's raw records wait in the agent's queue for up to a
    second; a record the garbage collector tracks is carried through its generations meanwhile, and makes its
    collections more frequent and longer (full ones of the whole heap), on the training thread. In a step not
    timed on the device (2) and in one that is (4: its CUDA events named by their numbers in the pool), a
    synchronous collective's record, an async one's (its Work named by id; a timed one's held weakly beside, until
    its wait), its wait record and a phase boundary's hold only objects it does not track, so its first pass
    untracks them (a timed synchronous one's pair of event numbers at its first, the record holding it at its
    second at the latest: before the oldest generation)."""
    import gc

    from zeromon_agent.hooks.collectives import make_wait, make_wrapper
    from zeromon_agent.hooks.state import RAW_PHASE

    state = HotState()
    state.enabled = True
    state.device_timer = timer = CudaTimer(_fake_torch(), pool_size=16)
    timer.active = True  # as after the run's first CUDA collective
    state.device_timing_every = 4
    state.step = step
    state.time_step()
    assert (state.cuda_timing is timer) == (step == 4)

    class Work:
        def wait(self) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

    group = object()
    wrapped = make_wrapper(lambda tensor, async_op=False: Work() if async_op else None, "all_reduce", "all_reduce",
                           lambda a, k: (4096, 4096, torch.bfloat16, group, k.get("async_op", False)), state=state)
    wait = make_wait(Work.wait, state=state)
    wrapped(_CudaTensor())
    work = wrapped(_CudaTensor(), async_op=True)
    seq = state.seq
    assert (seq in timer.refs and timer.refs[seq]() is work) == (step == 4)
    wait(work)
    assert seq not in timer.refs
    state.control.append((RAW_PHASE, "backward", 0, step, timer.mark() if state.cuda_timing is not None else None))
    sync_record, async_record, wait_record = state.raw
    (phase_record,) = state.control
    assert sync_record[0] == async_record[0] == RAW_COLLECTIVE and wait_record[0] == RAW_WAIT
    if step == 4:  # the events' numbers: the start and end of the synchronous one, the boundary's
        assert all(type(e) is int for e in (*sync_record[14], phase_record[4]))
    gc.collect()
    if step == 4:
        assert not gc.is_tracked(sync_record[14])
        gc.collect()
    for record in (sync_record, wait_record, async_record, phase_record):
        assert not gc.is_tracked(record), [type(v) for v in record if gc.is_tracked(v)]
    assert async_record[AT_WORK] == id(work)
