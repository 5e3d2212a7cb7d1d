"""Which rank holds a job up, and where: the cross-rank verdict over the ranks' progress reports.

One function, ``diagnose``, decides live (the agents' snapshots) and after the run (the recordings'
progress records), from what every rank reported of itself (zeromon.model.progress.RankProgress):

- a rank that waits inside a collective of a group at sequence number k waits for the group's ranks
  that have not issued k collectives in it yet;
- such a rank is **stuck** when it made no progress for the threshold outside any collective (its stack
  says where), **behind** while it still makes progress, **waiting** itself when it is blocked in a
  collective of another group (and the cause is followed there), **dead** when its process is gone;
- ranks that all reached k but issued different collectives there (op, size or dtype) are
  **desynchronized**: the group's majority decides which are the odd ones, never one reference rank;
  where there is no majority (two ranks), each is named with what it issued;
- a job where no rank made progress for the threshold and none waits in a collective is **idle**: slow
  or paused as a whole (an evaluation, a filesystem), not hung.

A rank is suspect only after its threshold without progress (ZEROMON_HANG_AFTER, by default the larger of 30 s
and ten median steps; before its first step ends ZEROMON_HANG_AFTER_SETUP, by default the larger of 5 minutes and
ZEROMON_HANG_AFTER): a run whose steps are slow, or whose setup is long, is not hung.
A rank its peers wait for is stuck when it has made no progress since they began to wait, behind when it has.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from zeromon.model.classes import frozen
from zeromon.model.events import ProgressReport
from zeromon.model.progress import (
    RESUMED,
    STALLED,
    CallInfo,
    GroupState,
    ProgressFormatError,
    RankProgress,
    StackFrame,
    progress_from_dict,
)
from zeromon.model.units import format_bytes, rank_ranges

# RankVerdict.state
OK = "ok"  # made progress within its threshold, or waits for nobody in particular
WAITING = "waiting"  # blocked in a collective for a peer that has not reached it
STUCK = "stuck"  # outside any collective, no progress for the threshold, and peers wait for it
BEHIND = "behind"  # has not reached the collective its peers wait in, but still makes progress
DESYNC = "desync"  # at the sequence number its peers wait at, it issued another collective
DEAD = "dead"  # its process is gone (its endpoint does not answer, or its recording ended without an end)
IDLE = "idle"  # no progress for the threshold, waiting for nobody and nobody waiting for it
UNKNOWN = "unknown"  # it did not report

CAUSES = (STUCK, DEAD, DESYNC, BEHIND, UNKNOWN)  # the states that hold others up, the surest first

# The exit status of `zeromon live --once` and `zeromon hang` when the job is hung (3 stays: a rank died).
EXIT_HUNG = 4
# A rank's progress is seen by its agent within a recorder pass (a second), and the ranks' reports are read within
# a poll of each other: a rank idle for all but this much of the time its peers have waited has not moved since.
PROGRESS_SEEN_WITHIN_S = 2.0


@frozen
class RankVerdict:
    rank: int
    state: str
    idle_s: float | None  # seconds without progress when it reported (None: no report)
    call: CallInfo | None = None  # WAITING, DESYNC: the collective it is in; STUCK, BEHIND, DEAD: the one it has not reached
    group: str | None = None  # that collective's group, in words ("the default group", "group dp")
    since_ns: int | None = None  # WAITING, DESYNC: when it began to wait
    where: StackFrame | None = None  # the innermost frame of the program's own code
    waits_for: tuple[int, ...] = ()  # WAITING: the ranks it waits for
    detail: str | None = None  # DEAD: how it ended; DESYNC: what the others issued
    module: str | None = None  # the model's submodule its collective serves


@frozen
class StackGroup:
    """Ranks whose training threads stand at the same stack."""

    ranks: tuple[int, ...]
    stack: tuple[StackFrame, ...]  # outermost first
    where: StackFrame | None


@frozen
class HangVerdict:
    """The job's state, from every rank's report: who holds it up, where, and who waits."""

    hung: bool  # a rank waits in a collective past the threshold for a rank that is stuck, behind, dead or desynchronized
    stalled: bool  # some rank made no progress for the threshold
    threshold_s: float
    ranks: tuple[RankVerdict, ...]
    lines: tuple[str, ...]  # the verdict in words, the cause first; empty when the job makes progress
    stacks: tuple[StackGroup, ...]  # the ranks' stacks, identical ones grouped, the largest group first

    @property
    def culprits(self) -> tuple[int, ...]:
        """The ranks that hold the others up, the surest first."""
        order = {state: i for i, state in enumerate(CAUSES)}
        causes = [r for r in self.ranks if r.state in order]
        return tuple(r.rank for r in sorted(causes, key=lambda r: (order[r.state], r.rank)))

    @property
    def severity(self) -> str | None:
        """"critical" when hung, "warn" when only stalled (idle), None when the job makes progress."""
        return "critical" if self.hung else "warn" if self.stalled else None

    @property
    def headline(self) -> str | None:
        return self.lines[0] if self.lines else None

    def of(self, rank: int) -> RankVerdict | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    def to_dict(self) -> dict[str, object]:
        return {
            "hung": self.hung, "stalled": self.stalled, "severity": self.severity, "threshold_s": self.threshold_s,
            "culprits": list(self.culprits), "lines": list(self.lines),
            "ranks": [{"rank": r.rank, "state": r.state, "idle_s": r.idle_s,
                       "group": r.group, "seq": r.call.seq if r.call else None, "op": r.call.op if r.call else None,
                       "meaning": r.call.meaning if r.call else None, "since_ns": r.since_ns,
                       "where": r.where.to_list() if r.where else None, "waits_for": list(r.waits_for),
                       "detail": r.detail, "module": r.module} for r in self.ranks],
            "stacks": [{"ranks": list(g.ranks), "where": g.where.to_list() if g.where else None,
                        "stack": [f.to_list() for f in g.stack]} for g in self.stacks],
        }


# --- deciding ---------------------------------------------------------------------------------------

@frozen
class _Wait:
    """One group's collective that ranks wait in past the threshold, and the group's ranks judged against it."""

    group: GroupState  # as the first waiter sees it
    call: CallInfo  # the collective, as the first waiter issued it
    waiters: tuple[int, ...]
    missing: tuple[int, ...] = ()  # the group's ranks that have not issued it
    at_seq: Mapping[int, CallInfo] | None = None  # what each rank that did issued as that number
    odd: frozenset[int] = frozenset()  # the ranks whose collective there is not the majority's (all: no majority)
    majority: tuple[str, int, str] | None = None


def diagnose(reports: Mapping[int, RankProgress | None], dead: Mapping[int, str] | None = None,
             threshold_s: float | None = None) -> HangVerdict:
    """The verdict over every rank's newest report (None: the rank did not report). ``dead``: the ranks whose
    process is gone, with how ("its endpoint does not answer"). ``threshold_s``: the ranks' own if None."""
    dead = dict(dead or {})
    present = {rank: r for rank, r in reports.items() if r is not None}
    threshold = threshold_s if threshold_s is not None else max((r.threshold_s for r in present.values()),
                                                                 default=0.0)
    stalled = {rank for rank, r in present.items() if r.idle_s >= threshold and r.reason != RESUMED}
    waits = [_members(wait, present, dead) for wait in _waits(present, stalled)]
    verdicts: dict[int, RankVerdict] = {}
    for wait in waits:  # who waits, and who issued another collective where they wait
        for rank in sorted(set(wait.waiters) | wait.odd):
            verdicts[rank] = _verdict_in_wait(rank, present[rank], wait)
    for wait in waits:  # why the others have not come
        waited_s = max((present[r].t_ns - since) / 1e9 for r in wait.waiters
                       if (since := _since(present[r])) is not None)
        for rank in wait.missing:
            if rank not in verdicts:
                verdicts[rank] = _verdict_missing(rank, present.get(rank), dead, stalled, wait, waited_s)
    all_ranks = sorted(set(reports) | set(dead))
    for rank in all_ranks:
        if rank in verdicts:
            continue
        report = present.get(rank)
        if rank in dead:
            verdicts[rank] = RankVerdict(rank, DEAD, _idle(report), detail=dead[rank])
        elif report is None:
            verdicts[rank] = RankVerdict(rank, UNKNOWN, None)
        else:
            verdicts[rank] = RankVerdict(rank, IDLE if rank in stalled else OK, _idle(report), where=report.where)
    ranks = tuple(verdicts[rank] for rank in all_ranks)
    hung = any(r.state in (WAITING, DESYNC) for r in ranks)
    return HangVerdict(hung=hung, stalled=bool(stalled), threshold_s=threshold, ranks=ranks, lines=_lines(ranks, hung),
                       stacks=group_stacks(present) if stalled else ())


def waiting_in(report: RankProgress) -> tuple[CallInfo, int] | None:
    """The collective a rank waits in and since when: the one its training thread is blocked in, else the newest
    of a group that has not completed (on a GPU the host goes on past a collective it waits for on the stream, to
    block later in a synchronize or a copy: the collective stays in flight)."""
    if report.blocked is not None:
        return report.blocked.call, report.blocked.since_ns
    for group in report.groups:
        last = group.last
        if last is not None and not group.last_done and last.seq == group.issued:
            return last, report.progress_ns
    return None


def _idle(report: RankProgress | None) -> float | None:
    return round(report.idle_s, 1) if report is not None else None


def _waits(present: Mapping[int, RankProgress], stalled: set[int]) -> list[_Wait]:
    """The collectives that ranks wait in past the threshold, by group and sequence number, the longest first."""
    found: dict[tuple[str, int], list[tuple[int, CallInfo, int]]] = {}
    for rank in sorted(stalled):
        waiting = waiting_in(present[rank])
        if waiting is not None and waiting[0].group and waiting[0].seq > 0:
            call, since = waiting
            found.setdefault((call.group, call.seq), []).append((rank, call, since))
    waits = []
    for (name, _), waiters in found.items():
        first_rank, first_call, _ = waiters[0]
        group = present[first_rank].group(name)
        if group is not None:
            since = min(since for _, _, since in waiters)
            waits.append((since, _Wait(group, first_call, tuple(rank for rank, _, _ in waiters))))
    return [wait for _, wait in sorted(waits, key=lambda pair: pair[0])]


def _since(report: RankProgress) -> int | None:
    waiting = waiting_in(report)
    return waiting[1] if waiting is not None else None


def _members(wait: _Wait, present: Mapping[int, RankProgress], dead: Mapping[int, str]) -> _Wait:
    """The group's ranks against one waited-in collective: who has not issued it, who issued what there."""
    name, seq = wait.group.group, wait.call.seq
    missing: list[int] = []
    at_seq: dict[int, CallInfo] = {}
    for rank in wait.group.ranks or tuple(sorted(present)):
        report = present.get(rank)
        if report is None or rank in dead:
            missing.append(rank)
            continue
        call = _call_at(report, name, seq)
        group = report.group(name)
        if call is not None:
            at_seq[rank] = call
        elif group is None or 0 <= group.issued < seq:
            missing.append(rank)
    odd, majority = _odd_ones(at_seq)
    return _Wait(wait.group, wait.call, wait.waiters, tuple(missing), at_seq, frozenset(odd), majority)


def _call_at(report: RankProgress, group: str, seq: int) -> CallInfo | None:
    """What a rank issued as the group's collective number ``seq``, where its report shows it."""
    blocked = report.blocked
    if blocked is not None and blocked.call.group == group and blocked.call.seq == seq:
        return blocked.call
    state = report.group(group)
    if state is not None and state.last is not None and state.last.seq == seq:
        return state.last
    return None


def _odd_ones(at_seq: Mapping[int, CallInfo]) -> tuple[set[int], tuple[str, int, str] | None]:
    """The ranks whose collective differs from the majority's (every rank where none has a majority), and the
    majority's signature."""
    by_signature: dict[tuple[str, int, str], list[int]] = {}
    for rank, call in at_seq.items():
        by_signature.setdefault(call.signature, []).append(rank)
    if len(by_signature) <= 1:
        return set(), next(iter(by_signature), None)
    ranked = sorted(by_signature.items(), key=lambda kv: -len(kv[1]))
    if len(ranked[0][1]) * 2 > len(at_seq):
        return {rank for _, ranks in ranked[1:] for rank in ranks}, ranked[0][0]
    return set(at_seq), None


def _verdict_in_wait(rank: int, report: RankProgress, wait: _Wait) -> RankVerdict:
    """A rank that issued the waited-in collective's number: waiting for the missing, or desynchronized."""
    label, blocked, at_seq = wait.group.label, report.blocked, wait.at_seq or {}
    since = _since(report)
    module = blocked.module if blocked is not None else None
    if rank in wait.odd:
        call = at_seq[rank]
        detail = None  # no majority: each rank's own collective says it
        if wait.majority is not None:
            others = sorted(r for r, c in at_seq.items() if c.signature == wait.majority)
            detail = f"{rank_ranges(others)} issued {_what(at_seq[others[0]])}"
        return RankVerdict(rank, DESYNC, _idle(report), call=call, group=label, since_ns=since, where=report.where,
                           detail=detail, module=module)
    call = blocked.call if blocked is not None else wait.call
    return RankVerdict(rank, WAITING, _idle(report), call=call, group=label, since_ns=since, where=report.where,
                       waits_for=wait.missing or tuple(sorted(wait.odd)), module=module)


def _verdict_missing(rank: int, report: RankProgress | None, dead: Mapping[int, str], stalled: set[int],
                     wait: _Wait, waited_s: float) -> RankVerdict:
    """A rank that has not issued the collective its peers wait in: dead, silent, stuck (it has made no progress
    since they began to wait, or for its threshold) or behind (it has, and is on its way)."""
    call, label = wait.call, wait.group.label
    if rank in dead:
        return RankVerdict(rank, DEAD, _idle(report), call=call, group=label, detail=dead[rank])
    if report is None:
        return RankVerdict(rank, UNKNOWN, None, call=call, group=label)
    still = rank in stalled or report.idle_s >= waited_s - PROGRESS_SEEN_WITHIN_S
    state = STUCK if still and waiting_in(report) is None else BEHIND
    return RankVerdict(rank, state, _idle(report), call=call, group=label, where=report.where)


def _label_of(report: RankProgress, call: CallInfo) -> str:
    group = report.group(call.group)
    return group.label if group is not None else f"group {call.group}"


def group_stacks(reports: Mapping[int, RankProgress]) -> tuple[StackGroup, ...]:
    """The ranks' training-thread stacks, identical ones together, the largest group first."""
    groups: dict[tuple[StackFrame, ...], list[int]] = {}
    for rank in sorted(reports):
        groups.setdefault(reports[rank].stack, []).append(rank)
    out = [StackGroup(tuple(ranks), stack, reports[ranks[0]].where) for stack, ranks in groups.items()]
    return tuple(sorted(out, key=lambda g: (-len(g.ranks), g.ranks)))


# --- words ------------------------------------------------------------------------------------------

def clock(t_ns: int) -> str:
    """06:31:20, local time."""
    return time.strftime("%H:%M:%S", time.localtime(t_ns / 1e9))


def seconds_words(s: float) -> str:
    """42 s, 5 min 12 s, 2 h 3 min."""
    s = max(0, round(s))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _what(call: CallInfo) -> str:
    """all_gather (4.0 KiB, float32)"""
    size = format_bytes(call.bytes)
    return f"{call.op} ({size}, {call.dtype})" if call.dtype else f"{call.op} ({size})"


def collective_words(call: CallInfo, label: str, module: str | None = None) -> str:
    """How the verdict names a collective: all_gather #341 of group dp (param_all_gather, layers.3)."""
    context = ", ".join(part for part in (call.meaning if call.meaning not in ("", "unknown") else "",
                                          module or "") if part)
    return f"{call.op} #{call.seq} of {label}" + (f" ({context})" if context else "")


def _in(where: StackFrame | None) -> str:
    return f"{where.function} ({where.where})" if where is not None else "code zeromon cannot see"


def _lines(ranks: tuple[RankVerdict, ...], hung: bool) -> tuple[str, ...]:
    """The verdict in words: each cause with the ranks that wait for it, then the waits whose cause is elsewhere."""
    out: list[str] = []
    waiting = [r for r in ranks if r.state == WAITING]
    explained: set[int] = set()
    for cause in (STUCK, DEAD, BEHIND, UNKNOWN):
        for r in (r for r in ranks if r.state == cause):
            waiters = [w for w in waiting if r.rank in w.waits_for]
            if waiters or cause in (STUCK, BEHIND):
                explained.update(w.rank for w in waiters)
                out.append(_cause_line(r, waiters))
    desync = [r for r in ranks if r.state == DESYNC]
    if desync:
        out.append(_desync_line(desync, waiting))
        odd = {d.rank for d in desync}
        explained.update(w.rank for w in waiting if set(w.waits_for) & odd)
    for w in waiting:
        if w.rank not in explained and w.call is not None:
            whom = (f"for {rank_ranges(w.waits_for)}" if w.waits_for else
                    "with every rank of the group in it: the collective does not complete (the backend or the network)")
            out.append(f"rank {w.rank} waits in {collective_words(w.call, w.group or '', w.module)} since "
                       f"{clock(w.since_ns or 0)} ({seconds_words(w.idle_s or 0)}) {whom}")
    idle = [r for r in ranks if r.state == IDLE]
    if idle and not hung:
        longest = max(r.idle_s or 0 for r in idle)
        out.append(f"{rank_ranges([r.rank for r in idle])} made no progress for {seconds_words(longest)} and none "
                   f"waits in a collective ({_places(idle)}): the job is slow or paused as a whole, not hung")
    return tuple(out)


def _places(ranks: Iterable[RankVerdict]) -> str:
    by_place: dict[str, list[int]] = {}
    for r in ranks:
        by_place.setdefault(_in(r.where), []).append(r.rank)
    return "; ".join(f"{rank_ranges(rs)} in {place}" for place, rs in by_place.items())


def _by_call(waiters: list[RankVerdict]) -> list[list[RankVerdict]]:
    """Waiters grouped by the collective they wait in, those that wait for fewest ranks (the nearest) first."""
    groups: dict[tuple[str, int], list[RankVerdict]] = {}
    for w in waiters:
        key = (w.call.group, w.call.seq) if w.call is not None else ("", 0)
        groups.setdefault(key, []).append(w)
    return sorted(groups.values(), key=lambda ws: (len(ws[0].waits_for), min(w.since_ns or 0 for w in ws)))


def _waiting_words(waiters: list[RankVerdict], first: bool) -> str:
    """'; ranks 0-2 wait in it since 06:31:20', or for a wait further along the chain,
    '; ranks 0-1 wait in all_gather #50 of the default group since 06:31:22 for ranks 2-3'."""
    since = clock(min(w.since_ns or 0 for w in waiters))
    who = rank_ranges([w.rank for w in waiters])
    verb = "waits" if len(waiters) == 1 else "wait"
    if first:
        return f"; {who} {verb} in it since {since}"
    w = waiters[0]
    what = collective_words(w.call, w.group or "", w.module) if w.call is not None else "a collective"
    return f"; {who} {verb} in {what} since {since} for {rank_ranges(w.waits_for)}"


def _cause_line(r: RankVerdict, waiters: list[RankVerdict]) -> str:
    waits = _by_call(waiters)
    nearest = waits[0][0] if waits else None
    target = nearest.call if nearest is not None else r.call
    module = nearest.module if nearest is not None else None
    group = nearest.group if nearest is not None else r.group
    waited = max((w.idle_s or 0 for w in waits[0]), default=r.idle_s or 0) if waits else r.idle_s or 0
    what = collective_words(target, group or "", module) if target is not None else "the collective its peers wait in"
    tail = "".join(_waiting_words(ws, i == 0) for i, ws in enumerate(waits))
    if r.state == STUCK:
        return (f"rank {r.rank} has not reached {what} for {seconds_words(waited)}: it is in {_in(r.where)}, "
                f"outside any collective, with no progress for {seconds_words(r.idle_s or 0)}{tail}")
    if r.state == DEAD:
        how = f" ({r.detail})" if r.detail else ""
        return f"rank {r.rank} is dead{how} and will not reach {what}{tail}"
    if r.state == BEHIND:
        return (f"rank {r.rank} has not reached {what} for {seconds_words(waited)}, but is still making progress "
                f"(in {_in(r.where)}): it is behind{tail}")
    return f"rank {r.rank} did not report where it is; it has not reached {what}{tail}"


def _desync_line(desync: list[RankVerdict], waiting: list[RankVerdict]) -> str:
    """The ranks whose collective differs at one sequence number: from the majority's, or from each other's."""
    first = desync[0]
    where = f"#{first.call.seq} of {first.group}" if first.call is not None else f"a collective of {first.group}"
    since = min((r.since_ns for r in desync + waiting if r.since_ns), default=None)
    tail = f"; they wait since {clock(since)}" if since else ""
    if all(d.detail for d in desync):
        issued = "; ".join(f"{rank_ranges([d.rank])} issued {_what(d.call)}" for d in desync if d.call is not None)
        return f"{issued} at {where} where {first.detail}: the ranks' collectives no longer match{tail}"
    parts = "; ".join(f"rank {d.rank} issued {_what(d.call)}" for d in desync if d.call is not None)
    return f"the ranks disagree at {where}: {parts}: their collectives no longer match{tail}"


# --- one rank's own words ---------------------------------------------------------------------------

def progress_notice(report: RankProgress) -> str | None:
    """What a rank's agent says of itself when it stalls or goes on again (a Notice in its recording)."""
    if report.reason == STALLED:
        if report.blocked is not None:
            call = report.blocked.call
            label = _label_of(report, call)
            return (f"no progress for {seconds_words(report.idle_s)}: blocked in "
                    f"{collective_words(call, label, report.blocked.module)} since {clock(report.blocked.since_ns)}")
        return f"no progress for {seconds_words(report.idle_s)}: in {_in(report.where)}, outside any collective"
    if report.reason == RESUMED and report.stalled_s is not None:
        return f"made no progress for {seconds_words(report.stalled_s)}, then went on"
    return None


# --- after the run ----------------------------------------------------------------------------------

def last_report(progress: Sequence[ProgressReport]) -> RankProgress | None:
    """A rank's newest readable progress report in its recording (its ProgressReport records, oldest first)."""
    for record in reversed(progress):
        try:
            return progress_from_dict(record.report)
        except ProgressFormatError:
            continue
    return None


def recorded_verdict(last: Mapping[int, RankProgress | None], cut_off: Iterable[int] = ()) -> HangVerdict | None:
    """The verdict over a run's recordings: each rank's newest progress report (written when it stalled, went on,
    or was stopped by a signal) and the ranks whose recording ended without an end record (killed). None where no
    rank reported a stall or a signal: the recordings have nothing to say about a hang."""
    if not any(r is not None and r.reason != RESUMED for r in last.values()):
        return None
    return diagnose(last, dead={rank: "killed: its recording ended without an end record" for rank in cut_off})


def ended_lines(verdict: HangVerdict | None) -> list[str]:
    """What `report`, `summary` and `zeromon run` say, under how the ranks ended, of the hang (or the stall) the
    ranks' last progress reports show; none where they show none."""
    if verdict is None or not verdict.lines:
        return []
    head = "the job was hung when its ranks ended: " if verdict.hung else "the ranks had stalled when they ended: "
    return [head + verdict.lines[0], *("  " + line for line in verdict.lines[1:])]
