"""The event model every part of zeromon shares: what the agent records and the clients read.

All records are frozen, slotted dataclasses. Times are Unix-epoch nanoseconds (``*_ns``) so that
ranks on different machines line up; sizes are bytes; durations in seconds carry ``_s``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import field
from enum import Enum
from typing import Any, TypeVar

from zeromon.model.classes import factory_code, frozen
from zeromon.model.compiled import compiled

_R = TypeVar("_R")


class Phase(str, Enum):
    """Where in a training step something happened."""

    # The warm-up, before the first step (step -1): model wrapping, parameter broadcasts, ZeRO-3 init,
    # and whatever a loop does before the first forward of its root module (or before its first
    # ``zeromon_agent.step()``).
    SETUP = "setup"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"  # the rest of a step: data loading, loss, zero_grad, clipping, a loop's own code
    AGENT = "agent"  # zeromon's own work on the training thread (memory samples, category walks)


def phase_words(phase: str) -> str:
    """A phase as a user reads it: its own name, but "zeromon's own work" for the agent's (a word a user
    would have to look up)."""
    return "zeromon's own work" if phase == Phase.AGENT else phase


class ZeroMeaning(str, Enum):
    """What a collective does for ZeRO/FSDP, where the framework and phase make it knowable."""

    PARAM_ALL_GATHER = "param_all_gather"
    GRAD_REDUCE_SCATTER = "grad_reduce_scatter"
    GRAD_ALL_REDUCE = "grad_all_reduce"
    PARAM_BROADCAST = "param_broadcast"
    UNKNOWN = "unknown"


class Timing(str, Enum):
    """How a collective's completion time was obtained, from exact to bounded."""

    SYNC = "sync"  # a synchronous call on the host: issue to return
    WAIT = "wait"  # async; the caller blocked in Work.wait() until it completed
    CALLBACK = "callback"  # async; a (sampled) completion callback gave the exact time
    BOUND = "bound"  # async; already complete when waited on: completion <= the wait's start
    POLL = "poll"  # async, never waited on; seen complete by the agent's background thread
    CUDA_EVENT = "cuda_event"  # GPU: CUDA events on the stream around the collective
    NCCL_HOOK = "nccl_hook"  # GPU: ProcessGroupNCCL's on-completion hook
    # GPU, a step not timed on the device (ZEROMON_DEVICE_TIMING_EVERY): the host times of its launch and of
    # its wait; when it ran on the GPU is not known (no completion, no duration)
    LAUNCH = "launch"
    UNKNOWN = "unknown"


# Memory categories, named as torch's FSDPMemTracker names them (torch.distributed._tools.fsdp2_mem_tracker).
MEMORY_CATEGORIES: tuple[str, ...] = (
    "sharded_params",
    "unsharded_params",
    "buffers",
    "sharded_grads",
    "unsharded_grads",
    "optimizer_state",
    "activations",
    "temporaries",
    "all_gather_buffers",
    "reduce_scatter_buffers",
    "other",
)

# Canonical collective op names (nccl-tests' vocabulary); the API that was called is kept apart.
COLLECTIVE_OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "gather",
    "scatter",
    "send",
    "recv",
    "barrier",
)


@frozen
class CollectiveEvent:
    """One collective call as the rank saw it."""

    seq: int  # per-rank sequence number of recorded collectives
    rank: int
    step: int  # -1 before the first step
    phase: str  # a Phase value
    op: str  # canonical op (COLLECTIVE_OPS)
    api: str  # what was called: "all_gather_single", "funcol.all_reduce", ...
    bytes_in: int
    bytes_out: int
    dtype: str
    group_size: int
    async_op: bool
    issue_ns: int
    complete_ns: int | None  # None when the completion was never observed
    blocked_s: float  # time the calling thread was blocked waiting on it
    timing: str  # a Timing value
    meaning: str  # a ZeroMeaning value
    # When the calling thread started to block on it: the issue for a synchronous call, the start of
    # Work.wait() for an async one; None if nobody waited. [wait_ns, wait_ns + blocked_s] is the
    # time the rank could not compute because of this collective.
    wait_ns: int | None = None
    # Seconds the calling thread spent inside the call that issued it, on the host's clock (for a
    # synchronous call, its whole duration). None in recordings older than format 1.2.
    issue_s: float | None = None

    @property
    def blocked_interval_ns(self) -> tuple[int, int] | None:
        if self.wait_ns is None or self.blocked_s <= 0:
            return None
        return self.wait_ns, self.wait_ns + span_ns(self.blocked_s)

    @property
    def thread_blocked_s(self) -> float:
        """The time this collective cost its caller (on GPU, the stream): its wait, and for an async
        call on the host the issue call too (a synchronous call's is its wait)."""
        if self.async_op and self.issue_interval_ns is not None and self.issue_s:
            return self.blocked_s + self.issue_s
        return self.blocked_s

    @property
    def issue_interval_ns(self) -> tuple[int, int] | None:
        """The issuing call on the host's clock; None where issue_ns is on the GPU's (the stream does
        not wait for the host to issue) or the call's length is unknown."""
        return issue_interval(self.issue_ns, self.issue_s, self.timing)

    @property
    def duration_s(self) -> float | None:
        if self.complete_ns is None:
            return None
        return max(0.0, (self.complete_ns - self.issue_ns) / 1e9)


# The longest span a recorded duration is taken for: a collective blocked for more than a week is a
# damaged value, and 1e300 s would overflow int(seconds * 1e9) (OverflowError) in every analysis.
MAX_SPAN_S = 7 * 86400.0


def span_ns(seconds: float) -> int:
    """Nanoseconds of a recorded duration (seconds >= 0), at most MAX_SPAN_S's."""
    return int(seconds * 1e9) if seconds < MAX_SPAN_S else int(MAX_SPAN_S * 1e9)


# Timings whose issue_ns is the GPU's clock, not the host call's.
DEVICE_TIMINGS = frozenset({Timing.CUDA_EVENT.value, Timing.NCCL_HOOK.value})


def issue_interval(issue_ns: int, issue_s: float | None, timing: str) -> tuple[int, int] | None:
    """CollectiveEvent.issue_interval_ns from the three columns it reads."""
    if not issue_s or issue_s <= 0 or timing in DEVICE_TIMINGS:
        return None
    return issue_ns, issue_ns + span_ns(issue_s)


@frozen
class PhaseSpan:
    rank: int
    step: int
    phase: str
    start_ns: int
    end_ns: int
    # "host": the training thread's clock at the phase changes. "cuda_event": CUDA events recorded
    # on the current stream at the phase changes, so the span is when the GPU ran the phase's work.
    # None in recordings older than format 1.1 (host).
    timing: str | None = "host"

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


# MemorySample phases of the highest moments inside a forward and a backward (in the steps that walk
# the categories only).
PEAK_PHASES = frozenset({"forward_peak", "backward_peak"})


@frozen
class MemorySample:
    """Memory of one rank at one moment: allocator totals, categories, capacity, process RSS.

    Allocator fields are None where no allocator reports them (CPU). ``categories`` holds bytes per
    MEMORY_CATEGORIES name; storages are counted once.
    """

    rank: int
    step: int
    # The phase that just ended: "forward", "backward", "optimizer" (the step's end); or, in the steps
    # that walk the categories, "forward_peak" / "backward_peak": the highest moment inside that phase.
    phase: str
    t_ns: int
    device: str  # "cuda:0", "cpu"
    allocated: int | None
    reserved: int | None
    active: int | None
    peak_allocated: int | None
    peak_reserved: int | None
    inactive_split: int | None
    num_alloc_retries: int | None
    num_ooms: int | None
    capacity: int | None  # device total (mem_get_info) or, on CPU, a rank's share: host RAM (or cgroup limit) / local ranks
    free: int | None  # device free bytes as the driver reports them (includes other processes)
    rss: int | None  # process resident set size
    categories: Mapping[str, int] = field(default_factory=dict)

    @property
    def fragmentation(self) -> int | None:
        if self.reserved is None or self.allocated is None:
            return None
        return self.reserved - self.allocated

    @property
    def walked(self) -> bool:
        """Whether the agent walked the categories for this sample (every few steps, within its
        time budget), not only counted the activations."""
        return any(name != "activations" for name in self.categories)

    def with_walk(self, walk: Mapping[str, int]) -> MemorySample:
        """This sample, with the categories of the last walk when it was not one itself: what live
        clients show between walks (the endpoint, the replay, zeromon_memory_category_bytes)."""
        if self.walked or not walk:
            return self
        return dataclasses.replace(self, categories=dict(walk))


@frozen
class DeviceSample:
    """One NVML reading of the rank's GPU."""

    rank: int
    t_ns: int
    index: int
    name: str
    util_gpu_pct: float | None
    util_mem_pct: float | None
    mem_used: int | None
    mem_total: int | None
    power_w: float | None
    temperature_c: float | None
    pcie_tx_bytes_s: float | None
    pcie_rx_bytes_s: float | None
    nvlink_tx_bytes_s: float | None
    nvlink_rx_bytes_s: float | None


@frozen
class OomEvent:
    """An out-of-memory seen by the allocator's OOM observer (CUDA builds only)."""

    rank: int
    step: int
    phase: str
    t_ns: int
    device: str
    allocated: int | None
    requested: int | None
    free: int | None
    snapshot_path: str | None


def step_number(index: int) -> int:
    """A step as training scripts log it (`step 400/400` is the 400th): recordings number steps from 0."""
    return index + 1


def steps_label(first: int, last: int) -> str:
    """'steps 2-12' (or 'step 5') for the recording's step indices ``first``..``last``, numbered as
    training scripts log them."""
    a, b = step_number(first), step_number(last)
    return f"step {a}" if a >= b else f"steps {a}-{b}"


@frozen
class StepSummary:
    """What one rank did in one step, aggregated by the agent as the step ends."""

    rank: int
    step: int
    start_ns: int
    end_ns: int
    phase_s: Mapping[str, float]  # seconds per phase
    # The agent always knows these three; a step seen through Prometheus (its last step's gauges) does not.
    collectives: int | None
    comm_bytes: int | None  # sum of the larger of bytes in/out per collective
    comm_bytes_by_op: Mapping[str, int]
    # communication time as the step's overlap counts it (overlap_s + exposed_comm_s: the union of the collectives'
    # intervals and, on the host, of the time the thread was blocked on them, in the step, less zeromon's own);
    # where the overlap is not known, the union of the collectives' intervals; None: a GPU step whose
    # collectives were not timed on the device (Timing.LAUNCH)
    comm_union_s: float | None
    blocked_s: float | None  # time the training thread was blocked in collectives
    peak_memory: int | None  # highest allocator (GPU) or RSS (CPU) reading seen in the step
    # Overlap within the step, as zeromon.analysis.step_overlap defines it, computed by the agent
    # so that live clients need no events. None where unknown (a step with too many collectives to
    # keep their intervals, or a recording older than format 1.1).
    comp_s: float | None = None
    overlap_s: float | None = None
    exposed_comm_s: float | None = None

    @property
    def overlap_ratio(self) -> float | None:
        """overlap / communication union, as HTA defines it; None without communication."""
        if self.overlap_s is None or self.comm_union_s is None or self.comm_union_s <= 0:
            return None
        return self.overlap_s / self.comm_union_s

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@frozen
class RunInfo:
    """What is being trained and how: framework, sharding, dtypes and the knobs that matter."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int | None  # None: not known (read through Prometheus, whose labels do not carry it)
    job: str
    framework: str  # "deepspeed", "fsdp2", "fsdp1", "ddp", "none", "unknown"
    framework_version: str | None
    torch_version: str | None  # None: as for pid
    backend: str | None  # "gloo", "nccl"
    device: str
    zero_stage: int | None
    fsdp_strategy: str | None  # FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, ...
    param_dtype: str | None
    reduce_dtype: str | None
    optimizer: str | None
    knobs: Mapping[str, Any] = field(default_factory=dict)  # overlap_comm, bucket sizes, ...


@frozen
class Notice:
    """Something the agent wants the user to know once: a missing capability, a hook error."""

    rank: int
    t_ns: int
    level: str  # "info", "warning", "error"
    source: str  # "nvml", "cuda", "hooks", ...
    message: str


@frozen
class AgentStats:
    """The agent's own health, written periodically and at exit."""

    rank: int
    t_ns: int
    events_recorded: int
    events_dropped: int
    hook_errors: int
    cpu_time_s: float  # CPU time of the agent's own background thread
    # What the recording writer could not write (a full disk, a read-only or vanished folder): records
    # and their bytes. None in recordings older than format 1.3.
    records_lost: int | None = None
    bytes_lost: int | None = None


@frozen
class ProgressReport:
    """Where the rank was in its collectives (zeromon.model.progress.RankProgress as a dict): written when it
    made no progress for its threshold, when it went on after that, and when a signal stopped it."""

    rank: int
    t_ns: int
    reason: str  # zeromon.model.progress: "stalled", "resumed", or the rank's end ("signal SIGTERM")
    report: Mapping[str, Any]  # RankProgress.to_dict()


# RunEnd.how, besides "exception <type>" and "signal <name>".
END_EXIT = "exit"  # the interpreter exited (the script returned, or called sys.exit)
END_DETACH = "detach"  # zeromon_agent.detach(): the agent stopped, the training may have gone on


@frozen
class RunEnd:
    """How a rank's recording ended: its last record. A recording without one was cut off (the process
    was killed, or the file could not be written to its end)."""

    rank: int
    t_ns: int
    how: str  # END_EXIT, END_DETACH, "exit 1" (sys.exit's status), "signal SIGTERM", "exception RuntimeError"
    last_step: int | None  # the last step summarized (from 0); None: no step ended
    records_lost: int  # records the writer could not write (AgentStats.records_lost)
    bytes_lost: int
    detail: str | None = None  # the exception's message
    write_error: str | None = None  # why the writer stopped writing (the first error), if it did

    @property
    def clean(self) -> bool:
        """The program ended normally (or only the agent stopped): nothing to warn about."""
        return self.how in (END_EXIT, END_DETACH)


Record = (
    CollectiveEvent
    | PhaseSpan
    | MemorySample
    | DeviceSample
    | OomEvent
    | StepSummary
    | RunInfo
    | Notice
    | AgentStats
    | RunEnd
    | ProgressReport
)


def default_maker(cls: type[_R]) -> Callable[[], _R]:
    """``cls()`` for a slotted dataclass whose every field has a default or a factory and that has no
    ``__post_init__`` (the recorder's StepAcc, made once a step): its slots set in one C call (_planes.c's
    make_record) from a tuple that a generated function builds (a list or dict factory as its literal, another
    factory called, a default as it is), where ``__init__`` runs a line a field. ``cls`` itself where the package did
    not build its C modules, or for any other class. The same instance (tests/test_recorder_fast_path.py)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    make_record = getattr(compiled("zeromon.model._planes"), "make_record", None)
    if make_record is None or "__slots__" not in cls.__dict__ or hasattr(cls, "__post_init__") \
            or any(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING for f in fields):
        return cls
    namespace: dict[str, Any] = {"make": make_record, "cls": cls, "slots": tuple(getattr(cls, f.name) for f in fields)}
    values = []
    for i, f in enumerate(fields):
        made = factory_code(f, f"factory_{i}", namespace)
        if not made:  # a default, as it is
            namespace[f"default_{i}"] = f.default
            made = f"default_{i}"
        values.append(made)
    exec(f"def new():\n    return make(cls, slots, ({', '.join(values)},))\n", namespace)  # noqa: S102 - from the fields
    new: Callable[[], _R] = namespace["new"]
    return new


def record_maker(cls: type[_R]) -> Callable[[tuple[Any, ...]], _R]:
    """A constructor of ``cls`` (a frozen dataclass with slots and no ``__post_init__``) from all its
    field values in field order, for the agent's recorder: the slots set directly from a tuple it already has.
    A class made by zeromon.model.classes' ``@frozen`` sets its slots directly in ``__init__`` too, so
    ``cls(*values)`` costs the same now (tests/bench/RESULTS.md, "Slotted classes without compiling their
    methods"), and where the package built its C modules the maker is C (_planes.c's make_record: the slots set
    in one call, where a generated function calls each slot's ``__set__``). The record is the same: equal, same
    fields, same encoding (tests/test_recorder_fast_path.py)."""
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
            and "__slots__" in cls.__dict__) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: record_maker takes a frozen dataclass with slots and no __post_init__")
    names = [f.name for f in dataclasses.fields(cls)]
    make_record = getattr(compiled("zeromon.model._planes"), "make_record", None)
    if make_record is not None:  # the same in C (_planes.c): the slots set at a C call's cost, not a call each
        return functools.partial(make_record, cls, tuple(getattr(cls, name) for name in names))
    setters = {f"set_{i}": getattr(cls, name).__set__ for i, name in enumerate(names)}
    body = "".join(f"    set_{i}(record, values[{i}])\n" for i in range(len(names)))
    source = (f"def make(values, new=new, cls=cls, {', '.join(f'{k}={k}' for k in setters)}):\n"
              f"    if len(values) != {len(names)}:\n"
              f"        raise TypeError('{cls.__name__} takes {len(names)} values')\n"
              f"    record = new(cls)\n{body}    return record\n")
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls, **setters}
    exec(source, namespace)  # noqa: S102 - generated from the dataclass's own field names
    make: Callable[[tuple[Any, ...]], _R] = namespace["make"]
    return make
