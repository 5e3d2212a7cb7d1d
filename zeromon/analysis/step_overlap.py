"""Overlap and exposed communication per rank and step, from zeromon's own recordings.

Exposed communication is the step time that communication costs. zeromon measures it on the clock
of whatever communication holds up:

- **On the host (CPU, gloo; any step whose phases are on the host's clock).** The training thread
  is either blocked on communication or doing something else. Blocked is the time inside every
  collective call (a synchronous call's whole length, an async call's issue), inside
  ``Work.wait()`` / ``wait_tensor``, and in DDP's wait for its buckets. Everything else the thread
  does inside the step is computation, whether or not zeromon knows its phase (a module's forward,
  autograd, an optimizer, data loading, a custom update, an inference loop). zeromon's own time on
  the training thread (the ``agent`` phase: memory samples and category walks) is neither, and is
  taken out of both. So exposed communication is exactly the time the thread was blocked, and
  overlap is the rest of the communication (collectives running on gloo's threads meanwhile).
- **On the GPU (steps whose phases carry CUDA events).** As Holistic Trace Analysis defines it, on
  the stream: the agent marks phase boundaries and collectives with CUDA events on the current
  stream, computation is the stream's time in the forward, backward and optimizer phases minus the
  time the stream waited for a collective, and exposed communication is the communication union
  minus that (PhaseSpan.timing and CollectiveEvent.timing say which clock each interval is on). A
  step with none of those phases (a ``zeromon_agent.step()`` loop of plain tensor code) counts the
  stream's whole step but its waits as computation.

Communication is each collective's [issue, completion] interval, and on the host also the time the
thread spent in its calls. Everything is clipped to the step's window: a step opens where the
previous one ended (or at the first forward of the root module, or at the entry of
``zeromon_agent.step()``) and ends when its optimizer step returns (or at the block's exit).
Collectives before the first step are the warm-up (step -1) and belong to no step. Collectives
whose completion was never observed (timing ``unknown``) count only for the time the thread spent
in them. The overlap follows HTA's definition (``zeromon.analysis.overlap``).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from zeromon.analysis.intervals import Interval, clip, intersect, merge, subtract, total
from zeromon.analysis.overlap import Overlap, overlap_of_merged
from zeromon.model.classes import frozen
from zeromon.model.codec import CollectiveColumns, Recording
from zeromon.model.events import StepSummary, issue_interval, span_ns

COMPUTE_PHASES = frozenset({"forward", "backward", "optimizer"})  # the stream's computation on GPU
# Said wherever a CPU run's overlap shows: its 0 % is no fault of the run's sharding (docs/definitions.md).
CPU_OVERLAP_NOTE = ("overlap on CPU (gloo): there are no GPU streams to overlap communication on, so an overlap "
                    "near 0% is expected; the exposed share says what communication costs")
AGENT_PHASE = "agent"
DEVICE_CLOCK = "cuda_event"  # PhaseSpan.timing of a span on the GPU's clock
HOST_CLOCK = "host"  # PhaseSpan.timing of a span on the host's clock (the training thread's)


@frozen
class StepOverlap:
    rank: int
    step: int
    step_s: float
    comm_s: float
    comp_s: float
    overlap_s: float
    exposed_comm_s: float
    idle_s: float
    blocked_s: float  # time the training thread (on GPU: the stream) was blocked in collectives
    agent_s: float = 0.0  # zeromon's own time on the training thread, neither computation nor communication

    @property
    def overlap_ratio(self) -> float | None:
        return self.overlap_s / self.comm_s if self.comm_s > 0 else None

    @property
    def exposed_share(self) -> float | None:
        return self.exposed_comm_s / self.step_s if self.step_s > 0 and self.timed else None

    @property
    def timed(self) -> bool:
        """Whether its communication is known: False for a GPU step not timed on the device (untimed_step)."""
        return not math.isnan(self.comm_s)


def step_overlaps(rec: Recording, summaries: Sequence[StepSummary] | None = None) -> tuple[StepOverlap, ...]:
    """One StepOverlap per summarized step of one rank's recording (or per one of ``summaries``), in
    step order, from the collectives and phase spans in each step's window (see
    zeromon.analysis.step_table for steps whose detail was not kept)."""
    stream_compute: dict[int, list[Interval]] = defaultdict(list)
    agent: dict[int, list[Interval]] = defaultdict(list)
    for span in rec.phases:
        if span.step < 0:
            continue
        if span.phase == AGENT_PHASE:
            agent[span.step].append((span.start_ns, span.end_ns))
        elif span.timing == DEVICE_CLOCK:
            # Any span on the GPU's clock puts its step on the stream's definition.
            compute = stream_compute[span.step]
            if span.phase in COMPUTE_PHASES:
                compute.append((span.start_ns, span.end_ns))
    # One pass over a few columns: a recording holds up to a million collectives.
    columns = rec.collective_columns()
    comm_u = merge([(issue, complete) for issue, complete in zip(columns.issue_ns, columns.complete_ns, strict=True)
                    if complete is not None and complete > issue])
    blocked_u = merge(blocked_intervals(columns))
    out = []
    for summary in sorted(rec.steps if summaries is None else summaries, key=lambda s: s.step):
        window = summary.start_ns, summary.end_ns
        if summary.comm_union_s is None:  # a GPU step not timed on the device: its communication is not known
            out.append(untimed_step(rec.rank, summary))
            continue
        result, blocked_s, agent_s = _overlap(_within(comm_u, window), _within(blocked_u, window),
                                              agent.get(summary.step, ()), window,
                                              stream_compute.get(summary.step))
        out.append(StepOverlap(
            rank=rec.rank, step=summary.step, step_s=result.window_s, comm_s=result.comm_s,
            comp_s=result.comp_s, overlap_s=result.overlap_s, exposed_comm_s=result.exposed_comm_s,
            idle_s=result.idle_s, blocked_s=blocked_s, agent_s=agent_s,
        ))
    return tuple(out)


def untimed_step(rank: int, s: StepSummary) -> StepOverlap:
    """A GPU step whose collectives were not timed on the device (Timing.LAUNCH): its length alone, every other
    figure NaN (StepTable's None; the medians leave it out)."""
    nan = math.nan
    return StepOverlap(rank=rank, step=s.step, step_s=s.duration_s, comm_s=nan, comp_s=nan, overlap_s=nan,
                       exposed_comm_s=nan, idle_s=nan, blocked_s=nan, agent_s=s.phase_s.get("agent", 0.0))


def has_overlap(s: StepSummary) -> bool:
    """Whether the summary carries the overlap the agent computed (format 1.1 on)."""
    return not (s.comp_s is None or s.overlap_s is None or s.exposed_comm_s is None or s.blocked_s is None
                or s.comm_union_s is None)


def overlap_of_summary(s: StepSummary) -> StepOverlap | None:
    """One step's overlap as the agent computed it as the step ended; None where the summary lacks it.
    The one-step reference of zeromon.analysis.step_table.summary_columns."""
    comm, comp, overlap, exposed, blocked = s.comm_union_s, s.comp_s, s.overlap_s, s.exposed_comm_s, s.blocked_s
    if comm is None or comp is None or overlap is None or exposed is None or blocked is None:
        return None
    step_s = s.duration_s
    busy = comm + comp - overlap
    return StepOverlap(rank=s.rank, step=s.step, step_s=step_s, comm_s=comm, comp_s=comp,
                       overlap_s=overlap, exposed_comm_s=exposed, idle_s=max(0.0, step_s - busy),
                       blocked_s=blocked, agent_s=s.phase_s.get("agent", 0.0))


@frozen
class WarmUp:
    """The collectives outside every step: before the first (step -1: model wrapping, parameter broadcasts,
    ZeRO-3's initial gathers, whatever a loop does before its first step), or after the last one that ended
    (a teardown: a trainer's final logging, gathers and saves after its last optimizer step). No step
    counts them."""

    collectives: int
    bytes: int  # the larger of bytes in and out, summed
    blocked_s: float  # the training thread's time in their calls and waits


def warmup(columns: CollectiveColumns) -> WarmUp:
    """The collectives before the first step."""
    return outside_steps(columns, lambda step: step < 0)


def teardown(columns: CollectiveColumns, last_step: int) -> WarmUp:
    """The collectives after ``last_step``, the last step that ended; none where no step ended (-1)."""
    return outside_steps(columns, lambda step: step > last_step) if last_step >= 0 else WarmUp(0, 0, 0.0)


def outside_steps(columns: CollectiveColumns, outside: Callable[[int], bool]) -> WarmUp:
    count = moved = 0
    blocked: list[Interval] = []
    for step, b_in, b_out, issue, issue_s, timing, wait, waited in zip(
            columns.step, columns.bytes_in, columns.bytes_out, columns.issue_ns, columns.issue_s, columns.timing,
            columns.wait_ns, columns.blocked_s, strict=True):
        if not outside(step):
            continue
        count += 1
        moved += b_in if b_in > b_out else b_out
        if wait is not None and waited > 0:
            blocked.append((wait, wait + span_ns(waited)))
        if issue_s and (interval := issue_interval(issue, issue_s, timing)) is not None:
            blocked.append(interval)
    return WarmUp(collectives=count, bytes=moved, blocked_s=total(merge(blocked)) / 1e9)


def blocked_intervals(columns: CollectiveColumns) -> list[Interval]:
    """Every interval in which the calling thread (on GPU: the stream) was blocked on a collective:
    its wait (CollectiveEvent.blocked_interval_ns) and, on the host, its issuing call
    (CollectiveEvent.issue_interval_ns), for every event at once."""
    out = [(wait, wait + span_ns(blocked))
           for wait, blocked in zip(columns.wait_ns, columns.blocked_s, strict=True)
           if wait is not None and blocked > 0]
    for issue, issue_s, timing in zip(columns.issue_ns, columns.issue_s, columns.timing, strict=True):
        if issue_s and (interval := issue_interval(issue, issue_s, timing)) is not None:
            out.append(interval)
    return out


def overlap_in_step(comm: Iterable[Interval], blocked: Iterable[Interval], window: Interval,
                    agent: Iterable[Interval] = (), stream_compute: Iterable[Interval] | None = None) -> Overlap:
    """One step's overlap from its raw intervals: what the agent computes live as each step ends.

    ``stream_compute``: the stream's compute phases for a step on the GPU's clock; None on the host."""
    return _overlap(clip(merge(comm), window), clip(merge(blocked), window), agent, window, stream_compute)[0]


def host_overlap_ns(comm: Iterable[Interval], blocked: Iterable[Interval], window: Interval,
                    agent: Iterable[Interval] = ()) -> tuple[int, int, int]:
    """(computation, overlap, exposed communication) in ns of a step on the host: overlap_in_step's
    numbers (stream_compute None) without its intervals, for the agent's summary of every step.

    On the host computation is the window less blocked (B) and agent (A) time, and communication is
    collectives (C) and blocked time less agent time, so with L the union length inside the window:
    comp = |W| - L(B+A), overlap = L(C+B+A) - L(B+A), exposed = L(B+A) - L(A). Three union lengths of
    de-duplicated intervals (a synchronous collective's [issue, completion] is its blocked interval too)
    instead of overlap_in_step's ~25 merges, subtractions and clips: several times cheaper a step. Exactly its
    integers (tests/test_step_overlap_fast.py); a window of no length: None."""
    lo, hi = window
    agent_set = set(agent)
    both = agent_set.union(blocked)
    every = both.union(comm)
    agent_ns = union_in(agent_set, lo, hi) if agent_set else 0
    both_ns = union_in(both, lo, hi) if len(both) > len(agent_set) else agent_ns
    every_ns = union_in(every, lo, hi) if len(every) > len(both) else both_ns
    return (hi - lo) - both_ns, every_ns - both_ns, both_ns - agent_ns


def union_in(intervals: Iterable[Interval], lo: int, hi: int) -> int:
    """The length of the union of ``intervals`` inside [lo, hi) (lo < hi), in one sorted pass."""
    length = 0
    cur_start = cur_end = lo
    for start, end in sorted(intervals):
        if start < lo:
            start = lo
        if end > hi:
            end = hi
        if end <= start:
            continue
        if start <= cur_end:
            if end > cur_end:
                cur_end = end
        else:
            length += cur_end - cur_start
            cur_start, cur_end = start, end
    return length + (cur_end - cur_start)


def _overlap(comm_in_window: Sequence[Interval], blocked_in_window: Sequence[Interval], agent: Iterable[Interval],
             window: Interval, stream_compute: Iterable[Interval] | None) -> tuple[Overlap, float, float]:
    """(the overlap, the blocked seconds, the agent's seconds) of one step's merged, clipped intervals."""
    parts = _parts(comm_in_window, blocked_in_window, agent, window, stream_compute)
    return (overlap_of_merged(parts.comm, parts.comp, window), total(parts.blocked) / 1e9,
            total(parts.agent) / 1e9)


def _parts(comm_in_window: Sequence[Interval], blocked_in_window: Sequence[Interval], agent: Iterable[Interval],
           window: Interval, stream_compute: Iterable[Interval] | None) -> StepIntervals:
    agent_u = clip(merge(agent), window)
    blocked = subtract(blocked_in_window, agent_u)
    # The thread's time in a collective's calls is communication too (a wait on a collective that
    # was already done, an issue call that outlasts nothing).
    comm = subtract(merge([*comm_in_window, *blocked]), agent_u)
    on_stream = merge(stream_compute) if stream_compute is not None else []
    if not on_stream:
        # On the host: all of the thread's time that is neither blocked nor zeromon's. Likewise on the
        # stream for a step with no forward, backward or optimizer phase (a zeromon_agent.step() loop
        # of plain tensor code): the stream's whole step but its waits.
        comp = subtract(subtract([window], blocked), agent_u)
    else:
        comp = subtract(clip(subtract(on_stream, blocked), window), agent_u)
    return StepIntervals(window=window, comm=tuple(comm), comp=tuple(comp),
                         overlap=tuple(intersect(comm, comp)), exposed=tuple(subtract(comm, comp)),
                         blocked=tuple(blocked), agent=tuple(agent_u))


def _within(merged: list[Interval], window: Interval) -> list[Interval]:
    """The disjoint intervals that touch the window, clipped to it (two binary searches: only the
    first and the last can stick out)."""
    lo, hi = window
    i = bisect.bisect_left(merged, (lo,))
    if i > 0 and merged[i - 1][1] > lo:
        i -= 1
    out = merged[i:bisect.bisect_left(merged, (hi,), lo=i)]
    if out:
        if out[0][0] < lo:
            out[0] = (lo, out[0][1])
        if out[-1][1] > hi:
            out[-1] = (out[-1][0], hi)
    return out


@frozen
class StepIntervals:
    """One step's intervals (ns) as its overlap is computed: what a timeline draws."""

    window: Interval
    comm: tuple[Interval, ...]  # union of the collectives and the thread's time in them, clipped
    comp: tuple[Interval, ...]  # computation: see the module's docstring for each clock
    overlap: tuple[Interval, ...]  # communication hidden behind computation
    exposed: tuple[Interval, ...]  # communication not hidden: comm minus comp
    blocked: tuple[Interval, ...]  # the training thread (GPU: the stream) blocked in collectives
    agent: tuple[Interval, ...] = ()  # zeromon's own time on the training thread


def step_intervals(comm: Iterable[Interval], blocked: Iterable[Interval], window: Interval,
                   agent: Iterable[Interval] = (), stream_compute: Iterable[Interval] | None = None) -> StepIntervals:
    """The intervals behind overlap_in_step's numbers: total(exposed) / 1e9 is its exposed_comm_s."""
    return _parts(clip(merge(comm), window), clip(merge(blocked), window), agent, window, stream_compute)
