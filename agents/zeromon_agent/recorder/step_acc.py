"""What the recorder keeps of a step until its summary: the phase boundaries and spans, the collectives'
intervals and totals; and the summary made of it when the step ends (the recorder's thread only)."""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Iterator, Sequence
from dataclasses import field
from typing import Any

from zeromon.analysis.intervals import merge, total, union_length, union_of_columns
from zeromon.analysis.step_overlap import host_overlap_ns, overlap_in_step, union_in
from zeromon.model.classes import mutable
from zeromon.model.compiled import compiled
from zeromon.model.events import StepSummary, ZeroMeaning, default_maker, record_maker
from zeromon_agent.hooks.issuers import DDP, DTENSOR, USER

# A summary a step, its 14 slots set directly from a tuple in StepSummary's field order (record_maker).
_new_summary = record_maker(StepSummary)
# _sequential_overlap_ns in C (_batch.c's sequential_overlap: the same integers, one call a step), and summarize's
# values of such a step (summarize_host), or None: Python's.
_SEQUENTIAL = getattr(compiled("zeromon_agent.recorder._batch"), "sequential_overlap", None)
_SUMMARIZE_HOST = getattr(compiled("zeromon_agent.recorder._batch"), "summarize_host", None)
_SCALAR_BYTES = 64  # all-reduces this small are flags and norms, not gradients
# A step keeps at most this many collective intervals; beyond it they are folded into a running
# union (exact when intervals arrive in issue order, as synchronous ones do). Bounds the memory
# of a step that never ends (an evaluation loop with collectives and no optimizer step).
MAX_STEP_INTERVALS = 4096


@mutable
class Mark:
    """A phase boundary: the host's time and, on GPU, an event recorded on the stream there."""

    perf: int
    event: Any = None  # a pending CUDA event; None once resolved or given up, or on CPU
    unix: int | None = None  # when the GPU reached it

    @property
    def pending(self) -> bool:
        return self.event is not None


@mutable
class Span:
    phase: str
    step: int
    start: Mark
    end: Mark


@mutable
class StepAcc:
    collectives: int = 0
    comm_bytes: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    intervals: list[tuple[int, int]] = field(default_factory=list)
    folded_union_ns: int = 0  # union length of intervals folded away (see MAX_STEP_INTERVALS)
    blocked: list[tuple[int, int]] = field(default_factory=list)
    compute: list[tuple[int, int]] = field(default_factory=list)  # the stream's compute phases (GPU)
    agent: list[tuple[int, int]] = field(default_factory=list)  # zeromon's own time on the training thread
    on_stream: bool = False  # a phase of the step is on the GPU's clock: the stream's definition applies
    overlap_known: bool = True  # False once intervals were folded or blocked ones not kept
    device_untimed: bool = False  # a GPU step not timed on the device: no communication time, no overlap
    blocked_s: float = 0.0
    peak_memory: int | None = None
    phase_ns: dict[str, int] = field(default_factory=dict)  # whole nanoseconds: seconds() of each is exact
    start_ns: int | None = None
    start: Mark | None = None  # zeromon_agent.step()'s entry, which opens the step
    end: Mark | None = None  # set when the step ended
    ended_at_perf: int = 0
    # The synchronous collectives of the recorder's batches (CollectiveRecords.finalize_sync_batch) not yet in ``intervals`` and
    # ``blocked``, as columns: issue_ns, complete_ns, issue_ns + span_ns(blocked_s), blocked_s. A step of
    # calls one after another inside its window is summarized from them as they are (summarize), without a
    # pair of tuples a collective (a cost on the recorder's thread, the garbage collector's share with
    # it); anything else first moves them into the lists (settle).
    run_issue: list[int] = field(default_factory=list)
    run_complete: list[int] = field(default_factory=list)
    run_end: list[int] = field(default_factory=list)
    run_blocked: list[float] = field(default_factory=list)
    run_blocked_n: int = 0  # how many of run_blocked are > 0: the blocked intervals they stand for
    # The async collectives of the recorder's column batches (CollectiveRecords._account_rows) not yet in
    # ``intervals`` and ``blocked``, as columns: each one's [issue, completion], and the blocked intervals (a wait's,
    # an async call's issue). A step of them is summarized from the columns in numpy's loops (_columns_overlap_ns),
    # without a tuple an interval; anything else first moves them into the lists (settle).
    col_issue: list[int] = field(default_factory=list)
    col_complete: list[int] = field(default_factory=list)
    col_blocked_start: list[int] = field(default_factory=list)
    col_blocked_end: list[int] = field(default_factory=list)


# A step's accumulator, made at its first record: StepAcc() with its 25 slots set in one call (default_maker).
new_acc = default_maker(StepAcc)


_PARAM_ALL_GATHER, _GRAD_REDUCE_SCATTER, _GRAD_ALL_REDUCE, _PARAM_BROADCAST, _MEANING_UNKNOWN = (
    ZeroMeaning.PARAM_ALL_GATHER.value, ZeroMeaning.GRAD_REDUCE_SCATTER.value, ZeroMeaning.GRAD_ALL_REDUCE.value,
    ZeroMeaning.PARAM_BROADCAST.value, ZeroMeaning.UNKNOWN.value)


def meaning_of(op: str, phase: str, nbytes: int, issuer: str | None = None) -> str:
    """The ZeRO/FSDP role of a collective: from what issued it (``issuer_of``), then its op and the phase it
    was issued in. The user's and the trainers' own collectives (``USER``) and DTensor's redistributions (tensor
    parallelism's activations) have none, whatever their op and size; an unknown issuer (None) is judged by op,
    phase and size alone."""
    if issuer == USER or issuer == DTENSOR:
        return _MEANING_UNKNOWN
    if op == "all_gather" and phase in ("forward", "backward", "optimizer", "setup"):
        return _PARAM_ALL_GATHER if issuer != DDP else _MEANING_UNKNOWN  # DDP gathers no parameters
    if op == "reduce_scatter" and phase in ("backward", "optimizer") and nbytes > _SCALAR_BYTES:
        return _GRAD_REDUCE_SCATTER
    if op == "all_reduce" and phase in ("backward", "optimizer") and nbytes > _SCALAR_BYTES:
        return _GRAD_ALL_REDUCE
    if op == "broadcast" and phase == "setup":
        return _PARAM_BROADCAST
    return _MEANING_UNKNOWN


def seconds(ns: int) -> float:
    """round(ns / 1e9, 9) without round() (round() with digits is slow, and this runs twice a collective): for
    a whole number of nanoseconds they are the same double. Where a double's spacing is under 1e-9 (below
    ~4e6 s), ns / 1e9 is the double nearest to ns·1e-9, which rounding to 9 decimals gives back; where it is
    over, the 9-decimal rounding is nearer to ns / 1e9 than half the spacing.
    tests/test_recorder_fast_path.py."""
    return ns / 1e9


def step_runs(steps: Sequence[int]) -> Iterator[tuple[int, slice]]:
    """Each run of one step's rows in a batch's ``steps`` column (a batch holds one step of a large model, tens of a
    small one's), as (the step, its rows' slice of the batch's columns)."""
    start = 0
    for step, run in itertools.groupby(steps):
        end = start + len(list(run))
        yield step, slice(start, end)
        start = end


def settle(acc: StepAcc) -> None:
    """Move a step's batched collectives (StepAcc.run_*, StepAcc.col_*) into its interval lists, as they would
    have been appended one by one (their count was checked against MAX_STEP_INTERVALS as they came)."""
    if acc.col_issue or acc.col_blocked_start:
        acc.intervals.extend(zip(acc.col_issue, acc.col_complete, strict=True))
        if acc.overlap_known:
            acc.blocked.extend(zip(acc.col_blocked_start, acc.col_blocked_end, strict=True))
        acc.col_issue, acc.col_complete, acc.col_blocked_start, acc.col_blocked_end = [], [], [], []
    settle_runs(acc)


def settle_runs(acc: StepAcc) -> None:
    """settle's share of the synchronous batches (StepAcc.run_*)."""
    issue = acc.run_issue
    if not issue:
        return
    acc.intervals.extend(zip(issue, acc.run_complete, strict=True))
    if acc.overlap_known:
        acc.blocked.extend(itertools.compress(zip(issue, acc.run_end, strict=True), acc.run_blocked))
    acc.run_issue, acc.run_complete, acc.run_end, acc.run_blocked, acc.run_blocked_n = [], [], [], [], 0


def add_interval(acc: StepAcc, interval: tuple[int, int]) -> None:
    """A collective's [issue, completion] into its step's intervals, after the batched ones before it (settle),
    folded past MAX_STEP_INTERVALS."""
    if acc.run_issue or acc.col_issue or acc.col_blocked_start:
        settle(acc)
    acc.intervals.append(interval)
    if len(acc.intervals) > MAX_STEP_INTERVALS:
        fold(acc)
        acc.overlap_known = False


def add_blocked(acc: StepAcc, interval: tuple[int, int]) -> None:
    if acc.run_issue or acc.col_issue or acc.col_blocked_start:
        settle(acc)
    acc.blocked_s += (interval[1] - interval[0]) / 1e9
    if acc.overlap_known:
        acc.blocked.append(interval)
        if len(acc.blocked) > MAX_STEP_INTERVALS:
            acc.blocked = []
            acc.overlap_known = False


def fold(acc: StepAcc) -> None:
    """Keep a step's interval list short: all but the last merged interval become a number."""
    settle(acc)
    merged = merge(acc.intervals)
    acc.folded_union_ns += total(merged[:-1])
    acc.intervals = merged[-1:]


def summarize(acc: StepAcc, rank: int, step: int, start_ns: int, end_ns: int) -> StepSummary:
    """The summary of a step that ended, its window [start_ns, end_ns) already on the Unix clock. A step of calls one
    after another on the host, every one in its batched columns (gloo's usual step), in one C call where the package
    built it (_batch.c's summarize_host: the same values, tests/test_recorder_fast_path.py)."""
    if _SUMMARIZE_HOST is not None:
        values = _SUMMARIZE_HOST(acc, rank, step, start_ns, end_ns)
        if values is not None:
            return _new_summary(values)
    comm_s: float | None = None
    comp_s = overlap_s = exposed_s = None
    if not acc.device_untimed:  # a GPU step not timed on the device has no communication time nor overlap
        comm_s, (comp_s, overlap_s, exposed_s) = _communication(acc, start_ns, end_ns)
    return _new_summary((
        rank, step, start_ns, end_ns,
        {k: v / 1e9 for k, v in acc.phase_ns.items()}, acc.collectives,  # phase_s: seconds() of each
        acc.comm_bytes, dict(acc.by_op),
        comm_s,  # comm_union_s
        round(acc.blocked_s, 9), acc.peak_memory, comp_s, overlap_s, exposed_s,
    ))


_Overlap = tuple[float | None, float | None, float | None]  # computation, overlap, exposed communication (s)


def _communication(acc: StepAcc, start_ns: int, end_ns: int) -> tuple[float, _Overlap]:
    """A step's communication seconds and its (computation, overlap, exposed communication), each None where not
    known."""
    comp_s = overlap_s = exposed_s = None
    host_ns: tuple[int, int, int] | None
    host = acc.overlap_known and end_ns > start_ns and not (acc.on_stream and acc.compute)
    sequential = _sequential_overlap_ns(acc, start_ns, end_ns) \
        if host and acc.run_issue and not (acc.intervals or acc.blocked or acc.col_issue or acc.col_blocked_start) \
        else None
    if sequential is not None:  # every collective in the batches' columns, one after another
        comm_ns, host_ns = sequential
    elif (acc.col_issue or acc.col_blocked_start) and (host or not acc.overlap_known):
        comm_ns, host_ns = _columns_overlap_ns(acc, start_ns, end_ns, host)
    else:
        settle(acc)
        comm_ns = union_length(acc.intervals)
        host_ns = host_overlap_ns(acc.intervals, acc.blocked, (start_ns, end_ns), acc.agent) if host else None
    # The step's communication as its overlap counts it (overlap + exposed: the collectives' intervals and, on the
    # host, the thread's time blocked on them, in the window, less zeromon's own), so that exposed never exceeds
    # it; where the overlap is not known, the collectives' intervals alone.
    # seconds() of each, written out (five calls a step fewer)
    if host_ns is not None:
        comp_ns, overlap_ns, exposed_ns = host_ns
        comp_s, overlap_s, exposed_s, comm_s = comp_ns / 1e9, overlap_ns / 1e9, exposed_ns / 1e9, \
            (overlap_ns + exposed_ns) / 1e9
    elif acc.overlap_known:
        overlap = overlap_in_step(acc.intervals, acc.blocked, (start_ns, end_ns), agent=acc.agent,
                                  stream_compute=acc.compute if acc.on_stream else None)
        comp_s, overlap_s, exposed_s = (round(overlap.comp_s, 9), round(overlap.overlap_s, 9),
                                        round(overlap.exposed_comm_s, 9))
        comm_s = round(overlap.comm_s, 9)
    else:
        comm_s = (acc.folded_union_ns + comm_ns) / 1e9
    return comm_s, (comp_s, overlap_s, exposed_s)


def _columns_overlap_ns(acc: StepAcc, start_ns: int, end_ns: int,
                        host: bool) -> tuple[int, tuple[int, int, int] | None]:
    """(the collectives' union, host_overlap_ns or None where not ``host``) of a step with async collectives in its
    columns (StepAcc.col_*), and whatever its lists hold beside them: host_overlap_ns's unions, in numpy's loops
    (union_of_columns: the same integers, tests/test_recorder_fast_path.py)."""
    settle_runs(acc)
    issue, complete = acc.col_issue, acc.col_complete
    if acc.intervals:
        issue, complete = [*issue, *map(_first, acc.intervals)], [*complete, *map(_second, acc.intervals)]
    comm_ns = union_of_columns(issue, complete)
    if not host:
        return comm_ns, None
    blocked_start, blocked_end = acc.col_blocked_start, acc.col_blocked_end
    agent_start, agent_end = list(map(_first, acc.agent)), list(map(_second, acc.agent))
    both_start = [*blocked_start, *map(_first, acc.blocked), *agent_start]
    both_end = [*blocked_end, *map(_second, acc.blocked), *agent_end]
    agent_ns = union_of_columns(agent_start, agent_end, start_ns, end_ns) if agent_start else 0
    both_ns = union_of_columns(both_start, both_end, start_ns, end_ns) if len(both_start) > len(agent_start) \
        else agent_ns
    every_ns = union_of_columns([*both_start, *issue], [*both_end, *complete], start_ns, end_ns) if issue \
        else both_ns
    return comm_ns, ((end_ns - start_ns) - both_ns, every_ns - both_ns, both_ns - agent_ns)


_first, _second = operator.itemgetter(0), operator.itemgetter(1)


def _sequential_overlap_ns(acc: StepAcc, start_ns: int, end_ns: int) -> tuple[int, tuple[int, int, int]] | None:
    """(the collectives' union, host_overlap_ns) of a step whose collectives are all in its batched columns
    (StepAcc.run_*), where they are one after another inside the window [start_ns, end_ns) and no agent span
    overlaps one, as a thread's synchronous calls are: each blocked interval lies in its call's, so the unions
    are sums (collectives C, their blocked time B, the agent's A: L(C) = sum of C, L(B+A) = sum of B + L(A),
    L(C+B+A) = sum of C + L(A)), the same integers as host_overlap_ns's sorted passes
    (tests/test_recorder_fast_path.py). None where the calls are not so: summarize takes the general way."""
    issue, complete, ends = acc.run_issue, acc.run_complete, acc.run_end
    if _SEQUENTIAL is not None:
        made = _SEQUENTIAL(issue, complete, ends, acc.agent, start_ns, end_ns)
        if made is not False:  # False: a value past 64 bits, which Python's integers below take
            return made  # type: ignore[no-any-return]
    if issue[0] < start_ns or complete[-1] > end_ns or not all(map(operator.ge, issue[1:], complete)) \
            or not all(map(operator.le, ends, complete)):
        return None
    for a0, a1 in acc.agent:  # the first call that ends after the span starts must start at or after its end
        i = bisect.bisect_right(complete, a0)
        if a1 > a0 and i < len(issue) and issue[i] < a1:
            return None
    issued = sum(issue)
    comm_ns = sum(complete) - issued
    blocked_ns = sum(ends) - issued
    agent_ns = union_in(acc.agent, start_ns, end_ns) if acc.agent else 0
    return comm_ns, ((end_ns - start_ns) - (blocked_ns + agent_ns), comm_ns - blocked_ns, blocked_ns)
