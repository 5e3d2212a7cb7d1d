"""A rank's training thread as a chain of segments, read from its recording: [Note: the replay's chain].

[Note: the replay's chain]
A rank's training thread, from the start of its first replayed step to the end of its last, is a
sequence of segments, each either its own (compute in a phase, zeromon's own work, the call that
issues an async collective) or bound to its peers (a synchronous collective, a wait on an async one).
Its own segments keep their measured length; a bound segment ends when its collective completes, which
the replay decides from every rank's issue (zeromon.analysis.whatif.replay). The compute between two
bound segments is the gap between them on the thread's clock, less zeromon's own spans within it.

Collectives are matched across ranks as the straggler analysis matches them: by step, op, group size
and occurrence within the step (data-parallel ranks issue the same collectives in the same order).

[Note: a GPU run's chain]
On a GPU the training thread only launches work; what takes a step's time is the compute stream. In the
steps timed on the device (ZEROMON_DEVICE_TIMING_EVERY) the agent records CUDA events on that stream: at
each phase change, at the step's ends, around each synchronous collective (the stream waits for it from
the first to the second) and around each wait on an async one; so a collective's issue and completion, the
stream's time blocked on it, the phases and the steps are all on the stream's clock, placed on the host's
by a reference event. The chain of such a step is the stream's: the same segments as the thread's, except
that issuing an async collective costs the stream nothing, and zeromon's own spans (host work) are not on
it. An async collective's completion is exact where the stream waited for it; one already done when the
stream reached its wait has a bound, as on the host. The stream's time between two collectives is compute,
also where the stream was idle waiting for the host's launches. The steps replayed are the timed ones,
which need not follow each other: the time between two of them is kept as measured, in no phase.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import field

from zeromon.analysis.bandwidth import MEASURED_TIMINGS, array_size, bus_factor
from zeromon.model.classes import frozen
from zeromon.model.codec import Recording
from zeromon.model.events import DEVICE_TIMINGS, Phase, StepSummary, Timing, span_ns

# Segment kinds. COMPUTE, AGENT and ISSUE last their measured time; SYNC and WAIT until their collective
# completes (SYNC: the call issues it, then blocks); STEP_START and STEP_END mark a step's ends (no time).
COMPUTE = "compute"
AGENT = "agent"
ISSUE = "issue"
SYNC = "sync"
WAIT = "wait"
STEP_START = "step_start"
STEP_END = "step_end"

CollectiveKey = tuple[int, str, int, int]  # (step, op, group_size, occurrence of that op and size in the step)


@frozen
class Segment:
    kind: str
    seconds: float  # measured: the segment's length on the thread (for SYNC and WAIT, the time blocked)
    step: int
    phase: str  # the phase the segment ran in (compute), or the collective's
    key: CollectiveKey | None = None


@frozen
class CollectiveShape:
    """What a matched collective is, the same on every rank: its op, group, full array size (nccl-tests'
    S) and what it is for."""

    op: str
    group_size: int
    array_bytes: int
    meaning: str
    async_op: bool

    @property
    def bus_bytes(self) -> float:
        """S times the op's bus factor: the bytes a link carries, the fit's variable."""
        return self.bus_bytes_over(self.group_size)

    def bus_bytes_over(self, ranks: int) -> float:
        """The bus bytes of the same collective over ``ranks`` ranks."""
        return self.array_bytes * (bus_factor(self.op, ranks) or 1.0)


@frozen
class RankChain:
    rank: int
    start_ns: int  # the start of its first replayed step
    segments: tuple[Segment, ...]
    issue_ns: dict[CollectiveKey, int]  # when each collective was issued (the call's start), measured
    complete_ns: dict[CollectiveKey, int]  # when it completed on this rank, where that was measured exactly
    shapes: dict[CollectiveKey, CollectiveShape]
    phases: dict[CollectiveKey, str] = field(default_factory=dict)  # the phase each was issued in


# Completion times measured exactly on the host: the measured ones less the device's clocks (a GPU run's chain
# is the stream's, not the thread's).
EXACT_HOST_TIMINGS = MEASURED_TIMINGS - DEVICE_TIMINGS
# PhaseSpan.timing of a span on the stream's clock ([Note: a GPU run's chain]).
DEVICE_CLOCK = Timing.CUDA_EVENT.value
# An async collective's wait that held the stream no longer than this found it done: a bound on its completion,
# not the completion (recording an event and the wait's own launch take the stream about a microsecond).
STREAM_BOUND_S = 2e-6
# The phase of the time between two replayed steps that do not follow each other (a GPU run's timed steps).
BETWEEN_STEPS = ""


def _exact_completion(timing: str, async_op: bool, blocked_s: float, on_device: bool) -> bool:
    if not on_device:
        return timing in EXACT_HOST_TIMINGS
    return timing == DEVICE_CLOCK and (not async_op or blocked_s > STREAM_BOUND_S)


def rank_chain(rec: Recording, steps: Sequence[int], on_device: bool = False) -> RankChain:
    """The chain of ``steps`` (step indices in order, each with its summary and detail) of one rank: its training
    thread's, or on a GPU (``on_device``) its compute stream's ([Note: a GPU run's chain])."""
    wanted = set(steps)
    summaries = sorted((s for s in rec.steps if s.step in wanted), key=lambda s: s.step)
    blocks: list[tuple[int, int, int, Segment]] = []  # (start, order, end, segment): order breaks ties
    columns = rec.collective_columns()
    occurrences: Counter[tuple[int, str, int]] = Counter()
    issue_ns: dict[CollectiveKey, int] = {}
    complete_ns: dict[CollectiveKey, int] = {}
    shapes: dict[CollectiveKey, CollectiveShape] = {}
    phases: dict[CollectiveKey, str] = {}
    for i in sorted(range(len(columns)), key=columns.seq.__getitem__):
        step = columns.step[i]
        if step not in wanted:
            continue
        op, size = columns.op[i], columns.group_size[i]
        key = (step, op, size, occurrences[(step, op, size)])
        occurrences[(step, op, size)] += 1
        start, phase, blocked = columns.issue_ns[i], columns.phase[i], columns.blocked_s[i]
        issue_ns[key] = start
        phases[key] = phase
        if columns.complete_ns[i] is not None and _exact_completion(columns.timing[i], bool(columns.async_op[i]),
                                                                    blocked, on_device):
            complete_ns[key] = columns.complete_ns[i]  # type: ignore[assignment]
        shapes[key] = CollectiveShape(op, size, array_size(op, columns.bytes_in[i], columns.bytes_out[i]),
                                      columns.meaning[i], bool(columns.async_op[i]))
        if not columns.async_op[i]:
            blocks.append((start, 1, start + span_ns(blocked), Segment(SYNC, blocked, step, phase, key)))
            continue
        issue_s = 0.0 if on_device else columns.issue_s[i] or 0.0  # the stream does not wait for a launch
        blocks.append((start, 1, start + span_ns(issue_s), Segment(ISSUE, issue_s, step, phase, key)))
        wait = columns.wait_ns[i]
        if wait is not None:
            blocks.append((wait, 2, wait + span_ns(blocked), Segment(WAIT, blocked, step, phase, key)))
    phase_marks: list[tuple[int, str]] = []
    for span in rec.phases:
        if span.step not in wanted:
            continue
        if span.phase == Phase.AGENT:
            if on_device:  # the host's work, not the stream's
                continue
            blocks.append((span.start_ns, 0, span.end_ns, Segment(AGENT, span.duration_s, span.step, span.phase)))
        else:
            phase_marks.append((span.start_ns, span.phase))
    for summary in summaries:
        blocks.append((summary.start_ns, -1, summary.start_ns, Segment(STEP_START, 0.0, summary.step, "")))
        blocks.append((summary.end_ns, -2, summary.end_ns, Segment(STEP_END, 0.0, summary.step, "")))
    blocks.sort(key=lambda b: (b[0], b[1]))
    phase_marks.sort()
    return RankChain(rank=rec.rank, start_ns=summaries[0].start_ns if summaries else 0,
                     segments=tuple(_with_compute(blocks, phase_marks, summaries)),
                     issue_ns=issue_ns, complete_ns=complete_ns, shapes=shapes, phases=phases)


def _with_compute(blocks: list[tuple[int, int, int, Segment]], phase_marks: list[tuple[int, str]],
                  summaries: Sequence[StepSummary]) -> list[Segment]:
    """The blocks in time order with the thread's time between them as compute segments, one per phase it
    crosses. Blocks that overlap the one before (a wait inside zeromon's span) start where it ended."""
    segments: list[Segment] = []
    if not summaries:
        return segments
    cursor, step = summaries[0].start_ns, summaries[0].step
    marks = iter(phase_marks)
    mark = next(marks, None)
    phase = Phase.OTHER.value
    ended: int | None = None  # the step the last STEP_END closed
    for begin, _, end, segment in blocks:
        while mark is not None and mark[0] <= begin:
            if mark[0] > cursor:
                segments.append(Segment(COMPUTE, (mark[0] - cursor) / 1e9, step, phase))
                cursor = mark[0]
            phase = mark[1]
            mark = next(marks, None)
        if begin > cursor:
            skipped = segment.kind == STEP_START and ended is not None and segment.step != ended + 1
            segments.append(Segment(COMPUTE, (begin - cursor) / 1e9, step, BETWEEN_STEPS if skipped else phase))
        if segment.kind in (AGENT, ISSUE):
            segment = Segment(segment.kind, max(0, end - max(begin, cursor)) / 1e9, segment.step, segment.phase,
                              segment.key)
        segments.append(segment)
        cursor = max(cursor, end)
        step = segment.step if segment.kind in (STEP_START, STEP_END) else step
        ended = segment.step if segment.kind == STEP_END else ended
    return segments
