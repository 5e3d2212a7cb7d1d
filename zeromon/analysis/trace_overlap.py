"""Overlap and temporal breakdown of PyTorch profiler (Kineto) traces, exactly as HTA computes them.

Holistic Trace Analysis (HTA 0.5: ``TraceAnalysis.get_comm_comp_overlap`` and
``get_temporal_breakdown``) works on GPU events only, per rank, over the whole trace. Its rules,
reproduced here because each one moves the numbers:

1. **Which events.** Every event with a ``dur`` and a ``cat`` (``cat == "Trace"`` excluded) whose
   ``args.stream`` is not -1: kernels, memcpy, memset, and anything else Kineto puts on a stream,
   on all streams of the rank together.
2. **Rounding.** When any ``ts`` in the file is not an integer (nanosecond-resolution traces,
   PyTorch >= 2.3) HTA rounds every event inward to whole microseconds: start ``ceil(ts)``, end
   ``floor(ts + dur)``. A kernel shorter than a microsecond can then end before it starts (a
   "negative" interval); HTA keeps those, see 5.
3. **The last iteration is dropped.** When the ranks' events name at least two distinct
   ``ProfilerStep#N`` (counted over all ranks analysed together), HTA keeps a GPU event only if
   the CPU event that launched it (same ``args.correlation``) starts before the start of the rank's
   last CPU-side ProfilerStep, and a CPU-side event only if it starts before it. Kernels launched
   before the first step stay in.
4. **Kinds.** Communication: name matches ``^nccl.*Kernel``. Computation: everything that matches
   neither that, nor ``Memcpy``/``Memset`` anywhere in the name, nor a name starting ``Memset``, nor
   ``Sync`` anywhere. The rest (memory copies, syncs) is neither.
5. **Unions.** Each kind is merged by HTA's ``merge_kernel_intervals``: sorted by start, a new
   group begins when a start is strictly after every end so far; a group spans [first start,
   largest end]. Touching intervals join. A negative interval that starts a group stays a group of
   negative length and counts as such in the totals (it cannot change an intersection). Equal
   starts are taken in file order (HTA's pandas sort leaves their order unspecified; it matters
   only for a negative interval sharing its start with another event of the same kind).
6. **Overlap** = |communication ∩ computation| / |communication| over those unions (HTA's
   +1/-1, +2/-2 sweep), ``comp_comm_overlap_pctg`` = round(100 × ratio, 2); no communication:
   undefined (None here, NaN in HTA). Exposed communication = |communication| − overlap.
7. **Temporal breakdown.** kernel time = end of the last merged group − start of the first, over
   all the events of 1; idle = kernel time − the merged groups' total; compute = the computation
   union; non-compute = kernel time − compute − idle. Percentages: round(100 × x / kernel time, 2).

Per iteration (zeromon's addition; HTA reports the whole trace only): an event belongs to the
iteration HTA's ``add_iteration`` gives it: a GPU event (stream > 0) inherits the iteration of the
CPU event that launched it (the last CPU-side event in the file with its correlation id), whose
start lies in [ProfilerStep start, start + dur). The same rules 4–7 then apply to the iteration's
events. Events outside every step (iteration -1, e.g. launched before the first profiled step)
count in the rank's totals but in no iteration.

Times are integer nanoseconds internally (so the interval arithmetic is exact); the trace is in
microseconds.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import statistics
from array import array
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

from zeromon.analysis.intervals import Interval, intersect
from zeromon.model.classes import frozen

COMMUNICATION, MEMORY, COMPUTATION, OTHER = "communication", "memory", "computation", "other"

_COMM_KERNEL_RE = re.compile(r"^nccl.*Kernel")
_MEMORY_KERNEL_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")  # HTA's, verbatim
_STEP_NUMBER_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
STEP_MARKER = "ProfilerStep"
# Device-wide synchronizations run on the GPU without a stream (HTA's GPUKernelFilter).
DEVICE_SYNC_NAMES = frozenset({"Event Sync", "Context Sync"})


def kernel_kind(name: str) -> str:
    """HTA's ``get_kernel_type``: communication, memory, computation or other, from the name alone."""
    if _COMM_KERNEL_RE.match(name):
        return COMMUNICATION
    if _MEMORY_KERNEL_RE.match(name):
        return MEMORY
    if not _NOT_COMPUTE_RE.match(name):
        return COMPUTATION
    return OTHER


def runs_on_gpu(stream: int, correlation: int, name: str) -> bool:
    """HTA's split of events into GPU side (kernels, syncs) and CPU side (everything else)."""
    return (stream >= 0 and correlation >= 0) or name in DEVICE_SYNC_NAMES


# --- what a trace file contributes (filled by zeromon.sources.kineto) ------------------------------


@frozen(eq=False)
class StreamEvents:
    """The events with an ``args.stream`` other than -1, as columns (a large trace holds many thousands)."""

    name_ids: array[int]  # into RankTrace.names
    streams: array[int]
    correlations: array[int]  # args.correlation, -1 without
    ts_us: array[float]  # as in the file
    dur_us: array[float]
    positions: array[int]  # in traceEvents

    def __len__(self) -> int:
        return len(self.ts_us)


class Launch(NamedTuple):
    """The CPU-side events carrying one correlation id (normally the one cudaLaunchKernel)."""

    first_ts_us: float  # the earliest start: decides whether its kernels are in a kept iteration
    last_ts_us: float  # the last one in the file: decides the kernels' iteration (HTA links to it)
    last_position: int


class StepAnnotation(NamedTuple):
    """An event whose name contains ``ProfilerStep`` (normally ``ProfilerStep#N`` on the CPU)."""

    name: str
    ts_us: float
    dur_us: float
    stream: int
    correlation: int
    position: int  # in traceEvents


@frozen(eq=False)
class RankTrace:
    """One rank's trace, reduced to what the overlap and the temporal breakdown need."""

    path: str
    rank: int  # distributedInfo.rank; -1 when the file has none
    world_size: int | None
    names: tuple[str, ...]
    stream_events: StreamEvents
    launches: dict[int, Launch]  # CPU-side events by correlation id (id -1 excluded)
    first_uncorrelated_cpu_ts_us: float | None  # earliest CPU-side event without a correlation id
    steps: tuple[StepAnnotation, ...]
    step_symbols: frozenset[str]  # distinct names and categories containing "ProfilerStep"
    fractional_ts: bool  # some ts is not an integer: HTA rounds to whole microseconds (rule 2)
    event_count: int


# --- results -------------------------------------------------------------------------------------


def _pctg(part_ns: int, whole_ns: int) -> float | None:
    return round(100 * part_ns / whole_ns, 2) if whole_ns else None


@frozen
class TemporalBreakdown:
    """HTA's temporal breakdown (its column names; its ``(us)`` in seconds, ``_s``, as all of zeromon's JSON)."""

    idle_time_ns: int
    compute_time_ns: int
    non_compute_time_ns: int
    kernel_time_ns: int

    @property
    def idle_time_pctg(self) -> float | None:
        return _pctg(self.idle_time_ns, self.kernel_time_ns)

    @property
    def compute_time_pctg(self) -> float | None:
        return _pctg(self.compute_time_ns, self.kernel_time_ns)

    @property
    def non_compute_time_pctg(self) -> float | None:
        return _pctg(self.non_compute_time_ns, self.kernel_time_ns)

    def to_dict(self) -> dict[str, float | None]:
        return {"idle_time_s": self.idle_time_ns / 1e9, "compute_time_s": self.compute_time_ns / 1e9,
                "non_compute_time_s": self.non_compute_time_ns / 1e9,
                "kernel_time_s": self.kernel_time_ns / 1e9, "idle_time_pctg": self.idle_time_pctg,
                "compute_time_pctg": self.compute_time_pctg,
                "non_compute_time_pctg": self.non_compute_time_pctg}


@frozen
class KernelOverlap:
    """Overlap and temporal breakdown of one set of GPU events: a rank's trace or one iteration."""

    iteration: int | None  # None: the whole trace of the rank
    events: int  # GPU events (stream events) counted
    comm_ns: int  # |communication union| (HTA's merged groups)
    comp_ns: int
    overlap_ns: int
    breakdown: TemporalBreakdown

    @property
    def exposed_comm_ns(self) -> int:
        return self.comm_ns - self.overlap_ns

    @property
    def comm_comp_overlap_pct(self) -> float | None:
        """HTA's ``comp_comm_overlap_pctg``; None without communication."""
        return _pctg(self.overlap_ns, self.comm_ns)

    @property
    def exposed_comm_share(self) -> float | None:
        """Exposed communication / kernel time (the GPU span of these events)."""
        kernel_ns = self.breakdown.kernel_time_ns
        return self.exposed_comm_ns / kernel_ns if kernel_ns > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.iteration is None else {"iteration": self.iteration}
        out.update({"comm_comp_overlap_pct": self.comm_comp_overlap_pct,
                    "exposed_comm_s": self.exposed_comm_ns / 1e9, "comm_s": self.comm_ns / 1e9,
                    "comp_s": self.comp_ns / 1e9, "overlap_s": self.overlap_ns / 1e9,
                    "exposed_comm_share": self.exposed_comm_share,
                    "kernel_time_s": self.breakdown.kernel_time_ns / 1e9, "gpu_events": self.events,
                    "temporal_breakdown": self.breakdown.to_dict()})
        return out


@frozen
class RankTraceOverlap:
    rank: int
    path: str
    world_size: int | None
    total: KernelOverlap
    iterations: tuple[KernelOverlap, ...]
    dropped_step: str | None  # the last ProfilerStep, left out as HTA does (rule 3)

    @property
    def median_iteration_exposed_comm_s(self) -> float | None:
        """The exposed communication of a typical iteration (a recording's is per step); None without any."""
        if not self.iterations:
            return None
        return statistics.median(it.exposed_comm_ns for it in self.iterations) / 1e9

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.rank, "file": self.path, "world_size": self.world_size}
        out.update(self.total.to_dict())
        out["median_iteration_exposed_comm_s"] = self.median_iteration_exposed_comm_s
        out["dropped_step"] = self.dropped_step
        out["iterations"] = [it.to_dict() for it in self.iterations]
        return out


# --- the computation -----------------------------------------------------------------------------


def _hta_groups(intervals: list[Interval]) -> list[Interval]:
    """HTA's ``merge_kernel_intervals`` (rule 5), negative-length groups included."""
    groups: list[Interval] = []
    reach: int | None = None  # the largest end so far
    for start, end in sorted(intervals, key=lambda iv: iv[0]):  # stable: file order on equal starts
        if reach is None or start > reach:
            groups.append((start, end))
        elif end > groups[-1][1]:
            groups[-1] = (groups[-1][0], end)
        reach = end if reach is None else max(reach, end)
    return groups


def _length(groups: list[Interval]) -> int:
    return sum(end - start for start, end in groups)


def kernel_overlap(intervals: Sequence[Interval], kinds: Sequence[str],
                   iteration: int | None = None) -> KernelOverlap:
    """Rules 5–7 over one set of events: ``intervals[i]`` (ns) is of kind ``kinds[i]``."""
    comm = _hta_groups([iv for iv, kind in zip(intervals, kinds, strict=True) if kind == COMMUNICATION])
    comp = _hta_groups([iv for iv, kind in zip(intervals, kinds, strict=True) if kind == COMPUTATION])
    # A negative group lies where no other group of its kind is, so it can only lower the +1/+2 sum
    # of HTA's sweep: the overlap is the intersection of the proper groups.
    overlap = _length(intersect([g for g in comm if g[1] > g[0]], [g for g in comp if g[1] > g[0]]))
    everything = _hta_groups(list(intervals))
    kernel_time = everything[-1][1] - everything[0][0] if everything else 0
    comm_ns, comp_ns, busy = _length(comm), _length(comp), _length(everything)
    idle = kernel_time - busy
    breakdown = TemporalBreakdown(idle_time_ns=idle, compute_time_ns=comp_ns, kernel_time_ns=kernel_time,
                                  non_compute_time_ns=kernel_time - comp_ns - idle)
    return KernelOverlap(iteration=iteration, events=len(intervals), comm_ns=comm_ns, comp_ns=comp_ns,
                         overlap_ns=overlap, breakdown=breakdown)


class _Clock:
    """Trace microseconds to integer nanoseconds, with HTA's inward rounding where it applies (rule 2)."""

    def __init__(self, fractional_ts: bool) -> None:
        self.fractional = fractional_ts

    def start(self, ts: float) -> int:
        return math.ceil(ts) * 1000 if self.fractional else int(ts) * 1000

    def end(self, ts: float, dur: float) -> int:
        return math.floor(ts + dur) * 1000 if self.fractional else int(ts) * 1000 + round(dur * 1000)


class _Steps:
    """The ProfilerStep#N a CPU timestamp falls in (HTA's ``add_iteration``: the last match in the file)."""

    def __init__(self, steps: Sequence[StepAnnotation], clock: _Clock) -> None:
        spans: list[tuple[int, int, int]] = []  # (start, end, number), in file order
        for step in steps:
            m = _STEP_NUMBER_RE.match(step.name)
            if step.name.startswith(STEP_MARKER) and m:
                spans.append((clock.start(step.ts_us), clock.end(step.ts_us, step.dur_us), int(m.group(1))))
        self.spans = spans
        ordered = sorted(spans)
        self.disjoint = all(a[1] <= b[0] for a, b in itertools.pairwise(ordered))
        self.ordered = ordered
        self.starts = [s[0] for s in ordered]

    def iteration(self, ts_ns: int) -> int:
        if self.disjoint:  # the usual case: at most one step contains ts
            i = bisect.bisect_right(self.starts, ts_ns) - 1
            return self.ordered[i][2] if i >= 0 and ts_ns < self.ordered[i][1] else -1
        found = -1
        for start, end, number in self.spans:
            if start <= ts_ns < end:
                found = number
        return found


def analyze_rank(trace: RankTrace, drop_last_step: bool) -> RankTraceOverlap:
    """HTA's numbers for one rank; ``drop_last_step`` is rule 3's condition (see ``analyze_traces``)."""
    clock = _Clock(trace.fractional_ts)
    events = trace.stream_events
    kinds_by_name = [kernel_kind(name) for name in trace.names]
    cpu_steps = [s for s in trace.steps if not runs_on_gpu(s.stream, s.correlation, s.name)]
    cutoff: int | None = None  # events launched at or after it are dropped
    dropped_step: str | None = None
    if drop_last_step:
        if cpu_steps:
            last = max(cpu_steps, key=lambda s: clock.start(s.ts_us))
            cutoff, dropped_step = clock.start(last.ts_us), last.name
        else:
            cutoff = -(10**30)  # HTA: no CPU-side step, nothing survives the filter
    steps = _Steps(trace.steps, clock)
    launches = trace.launches
    uncorrelated = trace.first_uncorrelated_cpu_ts_us

    intervals: list[Interval] = []
    kinds: list[str] = []
    iterations: list[int] = []
    for i in range(len(events)):
        name_id, stream, corr = events.name_ids[i], events.streams[i], events.correlations[i]
        name = trace.names[name_id]
        on_gpu = runs_on_gpu(stream, corr, name)
        launch = launches.get(corr) if corr != -1 else None
        if cutoff is not None:
            if on_gpu:
                first = launch.first_ts_us if launch is not None else (uncorrelated if corr == -1 else None)
                if first is None or clock.start(first) >= cutoff:
                    continue
            elif clock.start(events.ts_us[i]) >= cutoff:
                continue
        ts, dur = events.ts_us[i], events.dur_us[i]
        intervals.append((clock.start(ts), clock.end(ts, dur)))
        kinds.append(kinds_by_name[name_id])
        if stream < 0:
            iterations.append(steps.iteration(clock.start(ts)))
        elif stream > 0 and on_gpu and launch is not None and launch.last_position > 0:
            iterations.append(steps.iteration(clock.start(launch.last_ts_us)))
        else:
            iterations.append(-1)

    by_iteration: dict[int, list[int]] = defaultdict(list)
    for k, n in enumerate(iterations):
        if n >= 0:
            by_iteration[n].append(k)
    per_iteration = [kernel_overlap([intervals[k] for k in picked], [kinds[k] for k in picked], n)
                     for n, picked in sorted(by_iteration.items())]
    return RankTraceOverlap(rank=trace.rank, path=trace.path, world_size=trace.world_size,
                            total=kernel_overlap(intervals, kinds), iterations=tuple(per_iteration),
                            dropped_step=dropped_step)


def analyze_traces(traces: Sequence[RankTrace]) -> tuple[RankTraceOverlap, ...]:
    """Every rank, by rank. Rule 3's "at least two steps" counts the steps of all ranks together, as
    HTA's shared symbol table does when these traces are one ``TraceAnalysis``."""
    step_symbols = frozenset().union(*(t.step_symbols for t in traces))
    drop_last = len(step_symbols) >= 2
    return tuple(analyze_rank(t, drop_last) for t in sorted(traces, key=lambda t: t.rank))


def trace_report_from(traces: Sequence[RankTrace]) -> dict[str, Any]:
    """The JSON-ready report of ``zeromon report --trace``: per rank, the whole trace and each iteration."""
    return trace_report_of(analyze_traces(traces))


def trace_report_of(results: Sequence[RankTraceOverlap]) -> dict[str, Any]:
    """trace_report_from, from analyze_traces' results."""
    return {"source": "kineto", "files": [r.path for r in results],
            "definitions": "Holistic Trace Analysis (get_comm_comp_overlap, get_temporal_breakdown); per rank, "
                           "comm_comp_overlap_pct, exposed_comm_s and temporal_breakdown are over the whole trace, "
                           "median_iteration_exposed_comm_s over its iterations (each in iterations); times in "
                           "seconds",
            "ranks": [r.to_dict() for r in results]}
