"""Stragglers and imbalance across ranks: step-time skew, who arrives last at collectives, memory.

Collectives are matched across ranks by (step, op, occurrence within the step): data-parallel ranks
issue the same collectives in the same order. The rank that issues last makes its peers wait: the
wait it causes a peer is how much earlier the peer issued, bounded by the time the peer was blocked
on that collective (a peer that issued early but kept computing lost nothing). Issue times are host
clocks: exact between ranks of one machine, as good as NTP between machines.

The findings judge the steps after the first, the window of `zeromon report`'s per-rank table: the
first step holds one-off work (a rank allocating or loading before its loop, lazy initialization)
that makes a rank late once, which is warm-up, not a straggler.
"""

from __future__ import annotations

import operator
import statistics
from array import array
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise, repeat
from typing import Any

from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.step_skew import step_times_across_ranks
from zeromon.model.codec import Recording
from zeromon.model.events import StepSummary
from zeromon.model.step_records import step_column
from zeromon.model.units import format_bytes

# A rank is a straggler when, over the steps after the first, the wait it causes its peers is at
# least this share of their own step time, at least this many times the wait the other ranks cause
# (everyone is last sometimes), and it made its peers wait the most in more than this share of those
# steps (a persistent pattern, not one long wait).
CAUSED_WAIT_SHARE = 0.05
CAUSED_WAIT_DOMINANCE = 2.0
STRAGGLER_STEPS_SHARE = 0.5
# Memory imbalance: the spread of per-rank peaks over the largest, and a floor in bytes.
MEMORY_IMBALANCE_SHARE = 0.10
MEMORY_IMBALANCE_MIN_BYTES = 64 * 2**20
# Step-time skew: (slowest − fastest) / median, per step.
STEP_SKEW_SHARE = 0.10


@dataclass(frozen=True, slots=True)
class RankArrival:
    rank: int
    matched: int  # collectives matched on every rank (all steps)
    last_arrivals: int
    caused_wait_s: float  # the peers' waiting this rank caused by arriving last
    waited_s: float  # the time this rank waited for a later peer
    # The same over the steps after the first (the window the findings judge), and in how many of
    # those steps this rank made its peers wait the most.
    steady_matched: int = 0
    steady_last_arrivals: int = 0
    steady_caused_wait_s: float = 0.0
    steady_waited_s: float = 0.0
    steps_most_waited_for: int = 0


@dataclass(frozen=True, slots=True)
class Imbalance:
    ranks: tuple[RankArrival, ...]
    # Step times over the steps after the first (the report's window):
    step_skew_median: float | None  # median over steps of (slowest − fastest) / median step time
    slowest_rank_counts: dict[int, int]  # how often each rank had the longest step
    median_step_s: dict[int, float]  # per rank
    steady_steps: int  # steps after the first with matched collectives (the arrivals' window)
    peak_memory: dict[int, int]  # per-rank peak level (allocator on GPU, RSS on CPU)
    memory_spread: float | None  # (max − min) / max of the peaks
    findings: tuple[Finding, ...]


@dataclass(frozen=True, slots=True)
class RankArrivals:
    """What analyze_imbalance needs of one rank, without its recording: flat arrays, cheap to send
    from the worker process that read the rank (`zeromon report` reads and analyses ranks in parallel)."""

    rank: int
    keys: tuple[tuple[int, str], ...]  # (step, op) from step 0 on, in the order of their first collective
    counts: tuple[int, ...]  # how many collectives each key has
    # Each key's collectives in issue (seq) order, the keys one after another: the k-th of a key is
    # the k-th of that op in that step, the collective peers match it with.
    issue_ns: Sequence[int]  # an array('q') (8 bytes a value, sent and received as one block) ...
    blocked_s: Sequence[float]  # ... and an array('d'); lists where the values do not fit one
    step_s: Sequence[tuple[int, float]]  # (step, duration_s) of each step summary, as recorded (a StepTimes)
    peak_memory: int | None  # the highest level (allocator on GPU, RSS on CPU)


@dataclass(frozen=True, slots=True, eq=False)
class StepTimes(Sequence[tuple[int, float]]):
    """(step, duration_s) of each step summary as two arrays: they pickle as their bytes, not as a tuple a
    step, which the process that combines a large run's ranks would hold by the million. ``detail``: 1 where
    the recording kept the step's collectives or phase spans (a bounded recording keeps some steps' only)."""

    steps: array
    seconds: array
    detail: array

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(zip(self.steps[index], self.seconds[index], strict=True))
        return self.steps[index], self.seconds[index]

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]


def _step_arrays(part: RankArrivals) -> tuple[Sequence[int], Sequence[float], Sequence[int] | None]:
    """A rank's step numbers, durations and, where known, which steps kept their detail."""
    if isinstance(part.step_s, StepTimes):
        return part.step_s.steps, part.step_s.seconds, part.step_s.detail
    return [s for s, _ in part.step_s], [d for _, d in part.step_s], None


def rank_arrivals(rec: Recording) -> RankArrivals:
    """One rank's share of analyze_imbalance."""
    columns = rec.collective_columns()
    rows: Sequence[int] = range(len(columns))
    if not all(a <= b for a, b in pairwise(columns.seq)):  # recorded in seq order: sort only if not
        rows = sorted(rows, key=columns.seq.__getitem__)
    steps, ops = columns.step, columns.op
    # Row indices by key: one append per collective, the values gathered after in one pass each.
    by_key: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i in rows:
        step = steps[i]
        if step >= 0:
            by_key[(step, ops[i])].append(i)
    order = [i for indices in by_key.values() for i in indices]
    levels = [m.allocated if m.allocated is not None else m.rss for m in rec.memory]
    present = [v for v in levels if v is not None]
    detail = set(columns.step)
    detail.update(p.step for p in rec.phases)
    return RankArrivals(
        rank=rec.rank, keys=tuple(by_key), counts=tuple(map(len, by_key.values())),
        issue_ns=_packed("q", list(map(columns.issue_ns.__getitem__, order))),
        blocked_s=_packed("d", list(map(columns.blocked_s.__getitem__, order))),
        step_s=_step_times(rec.steps, detail),
        peak_memory=max(present) if present else None,
    )


def _step_times(summaries: Sequence[StepSummary], detail: set[int]) -> StepTimes:
    """The summaries' steps and durations (StepSummary.duration_s's arithmetic, without its call), a
    field at a time (step_column: of a StepRecords, no object made)."""
    steps = step_column(summaries, "step")
    nanoseconds = map(operator.sub, step_column(summaries, "end_ns"), step_column(summaries, "start_ns"))
    return StepTimes(array("q", steps), array("d", map(operator.truediv, nanoseconds, repeat(1e9))),
                     array("b", map(detail.__contains__, steps)))


def _packed(typecode: str, values: list[Any]) -> Sequence[Any]:
    """The values as an array: they pickle as 8 bytes a value, not an object each."""
    try:
        return array(typecode, values)
    except (TypeError, OverflowError):  # a null or a float where an integer belongs: kept as read
        return values


def analyze_imbalance(recordings: Sequence[Recording]) -> Imbalance:
    return combine_imbalance([rank_arrivals(rec) for rec in recordings])


def combine_imbalance(parts: Sequence[RankArrivals]) -> Imbalance:
    """The imbalance across ranks, from each rank's RankArrivals (in rank order)."""
    ranks = [p.rank for p in parts]
    keyed = {p.rank: p for p in parts}
    tables = list(keyed.values())
    # The steps after the first, as the per-rank table; all of them when there is only one.
    arrays = [_step_arrays(p) for p in parts]
    runs = within_steps(_matched_runs(tables), max((max(a[0], default=-1) for a in arrays), default=-1))
    first_step = 1 if any(step >= 1 for step, _, _ in runs) or any(max(a[0], default=-1) >= 1 for a in arrays) else 0
    matched = sum(n for _, _, n in runs)
    steady_matched = sum(n for step, _, n in runs if step >= first_step)
    # One rank alone arrives last at nothing and waits for no one.
    alone: dict[str, Any] = {"last_arrivals": 0, "caused_wait_s": 0.0, "waited_s": 0.0}
    tallies = _late_arrivals(tables, runs, first_step) if len(parts) > 1 else {}
    steady_steps = len({step for step, _, _ in runs if step >= first_step})
    arrivals_out = tuple(RankArrival(rank=r, matched=matched, steady_matched=steady_matched,
                                     **tallies.get(r, alone)) for r in ranks)
    times = step_times_across_ranks(ranks, arrays, first_step)
    peaks = {p.rank: p.peak_memory for p in parts if p.peak_memory is not None}
    spread = (max(peaks.values()) - min(peaks.values())) / max(peaks.values()) if len(peaks) > 1 else None

    last_steps = [*([] if times.last_step is None else [times.last_step]), *(step for step, _, _ in runs)]
    window = _Window(first_step=first_step, last_step=max(last_steps, default=first_step),
                     steps=steady_steps, step_s=times.detail_step_s)
    skews, median_step, slowest = times.skews, times.median_step_s, times.slowest
    findings = _findings(arrivals_out, window, peaks, spread, skews, median_step, dict(slowest))
    return Imbalance(ranks=arrivals_out, step_skew_median=statistics.median(skews) if skews else None,
                     slowest_rank_counts=dict(slowest), median_step_s=median_step, steady_steps=steady_steps,
                     peak_memory=peaks, memory_spread=spread, findings=findings)


def _spans(part: RankArrivals) -> dict[tuple[int, str], tuple[int, int]]:
    """Where each key's collectives start in the rank's lists, and how many it has."""
    spans, start = {}, 0
    for key, count in zip(part.keys, part.counts, strict=True):
        spans[key] = (start, count)
        start += count
    return spans


def within_steps(runs: list[tuple[int, list[int], int]], last_step: int) -> list[tuple[int, list[int], int]]:
    """The runs of the steps that ended: collectives after the last step any rank summarized belong to the
    teardown (a trainer's final logging and saving, issued after its last optimizer step), as those before
    the first belong to the setup, and are no step's. All of them where no step ended (``last_step`` -1)."""
    return runs if last_step < 0 else [run for run in runs if run[0] <= last_step]


def _matched_runs(tables: Sequence[RankArrivals]) -> list[tuple[int, list[int], int]]:
    """The collectives matched on every rank: for each (step, op) all ranks have, in the first rank's
    order (not a set's: the sums come out the same in every process), its step, where its collectives
    start in each rank's lists and how many are matched (the fewest any rank has)."""
    spans = [_spans(t) for t in tables]
    common = set.intersection(*(set(span) for span in spans)) if spans else set()
    runs = []
    for key in tables[0].keys if tables else ():
        if key in common:
            bounds = [span[key] for span in spans]
            runs.append((key[0], [start for start, _ in bounds], min(count for _, count in bounds)))
    return runs


def _late_arrivals(tables: Sequence[RankArrivals], runs: list[tuple[int, list[int], int]],
                   first_step: int) -> dict[int, dict[str, Any]]:
    """Per rank, RankArrival's counts: how often it issued last, the wait that caused its peers and
    the time it waited for a later peer, over all steps and over those from ``first_step`` on; and in
    how many of those steps its peers waited for it the most."""
    n_ranks = len(tables)
    # [0]: the steps before first_step, [1]: from first_step on.
    last_by = [[0] * n_ranks, [0] * n_ranks]
    caused_by = [[0.0] * n_ranks, [0.0] * n_ranks]
    waited_by = [[0.0] * n_ranks, [0.0] * n_ranks]
    caused_in_step: dict[int, dict[int, float]] = defaultdict(dict)  # steady steps: rank -> wait it caused
    for step, starts, n in runs:
        window = int(step >= first_step)
        last_w, caused_w, waited_w = last_by[window], caused_by[window], waited_by[window]
        in_step = caused_in_step[step] if window else None
        issue_runs = [t.issue_ns[start:start + n] for t, start in zip(tables, starts, strict=True)]
        blocked_runs = [t.blocked_s[start:start + n] for t, start in zip(tables, starts, strict=True)]
        # Half a million matched collectives: plain comparisons, no call per collective.
        for issues, blocks in zip(zip(*issue_runs, strict=True), zip(*blocked_runs, strict=True), strict=True):
            late, late_issue = 0, issues[0]
            for i in range(1, n_ranks):
                if issues[i] > late_issue:
                    late, late_issue = i, issues[i]
            last_w[late] += 1
            caused = 0.0
            for i, (issue, blocked) in enumerate(zip(issues, blocks, strict=True)):
                lost = (late_issue - issue) / 1e9
                if blocked < lost:
                    lost = blocked
                if i != late and lost > 0:
                    caused += lost
                    waited_w[i] += lost
            caused_w[late] += caused
            if in_step is not None and caused > 0:
                in_step[late] = in_step.get(late, 0.0) + caused
    most = [0] * n_ranks
    for per_rank in caused_in_step.values():
        if per_rank:
            most[max(per_rank, key=per_rank.__getitem__)] += 1
    return {t.rank: {"last_arrivals": last_by[0][i] + last_by[1][i],
                     "caused_wait_s": caused_by[0][i] + caused_by[1][i],
                     "waited_s": waited_by[0][i] + waited_by[1][i],
                     "steady_last_arrivals": last_by[1][i], "steady_caused_wait_s": caused_by[1][i],
                     "steady_waited_s": waited_by[1][i], "steps_most_waited_for": most[i]}
            for i, t in enumerate(tables)}


@dataclass(frozen=True, slots=True)
class _Window:
    """The steps the findings judge (recording step indices) and each rank's time in them."""

    first_step: int
    last_step: int
    steps: int  # steps with matched collectives
    step_s: dict[int, float]  # per rank, the sum of its step times

    def label(self) -> str:
        """'steps 2-12', numbered from 1 as training scripts log them."""
        first, last = self.first_step + 1, self.last_step + 1
        return f"step {first}" if first >= last else f"steps {first}-{last}"


_STRAGGLER_REMEDIES = ("look for work only this rank does (logging, checkpointing, evaluation on rank 0)",
                       "check its host for contention (other jobs, CPU frequency, a slower GPU or link)",
                       "balance data loading: uneven batch sizes or sequence lengths slow one rank")


def _findings(arrivals: tuple[RankArrival, ...], window: _Window, peaks: dict[int, int], spread: float | None,
              skews: list[float], median_step: dict[int, float], slowest: dict[int, int]) -> tuple[Finding, ...]:
    findings = []
    all_step_s = sum(window.step_s.values())
    left_out = " (the first left out, as in the per-rank table)" if window.first_step else ""
    for arrival in arrivals:
        # The waiting peers' own time: the wait as a share of the time they spent in these steps.
        peers_step_s = all_step_s - window.step_s.get(arrival.rank, 0.0)
        if not arrival.steady_matched or not window.steps or peers_step_s <= 0:
            continue
        caused_share = arrival.steady_caused_wait_s / peers_step_s
        others = [a.steady_caused_wait_s for a in arrivals if a.rank != arrival.rank]
        typical = sum(others) / len(others) if others else 0.0
        persistent = arrival.steps_most_waited_for > STRAGGLER_STEPS_SHARE * window.steps
        if (caused_share >= CAUSED_WAIT_SHARE and arrival.steady_caused_wait_s >= CAUSED_WAIT_DOMINANCE * typical
                and persistent):
            share = arrival.steady_last_arrivals / arrival.steady_matched
            findings.append(Finding(
                kind="straggler", severity=Severity.WARN if caused_share < 0.2 else Severity.CRITICAL,
                title=f"rank {arrival.rank} arrives last at {share:.0%} of collectives",
                rank=arrival.rank,
                evidence=(f"over {window.label()}{left_out}: last at {arrival.steady_last_arrivals} of "
                          f"{arrival.steady_matched} matched collectives; its peers waited for it the most in "
                          f"{arrival.steps_most_waited_for} of {window.steps} steps",
                          f"its peers waited {arrival.steady_caused_wait_s:.3f} s for it in all "
                          f"({caused_share:.1%} of their own step time)",
                          f"threshold: peers waiting at least {CAUSED_WAIT_SHARE:.0%} of their step time for it, "
                          f"{CAUSED_WAIT_DOMINANCE:g}x the wait the other ranks cause, in more than "
                          f"{STRAGGLER_STEPS_SHARE:.0%} of the steps"),
                remedies=_STRAGGLER_REMEDIES,
                metrics={"last_share": share, "caused_wait_s": arrival.steady_caused_wait_s,
                         "caused_share": caused_share, "steps_most_waited_for": float(arrival.steps_most_waited_for),
                         "steps": float(window.steps)},
            ))
    if spread is not None and spread >= MEMORY_IMBALANCE_SHARE:
        high = max(peaks, key=lambda r: peaks[r])
        low = min(peaks, key=lambda r: peaks[r])
        if peaks[high] - peaks[low] >= MEMORY_IMBALANCE_MIN_BYTES:
            findings.append(Finding(
                kind="memory_imbalance", severity=Severity.WARN,
                title=f"rank {high} peaks {spread:.0%} higher in memory than rank {low}",
                rank=high,
                evidence=(f"peak rank {high}: {format_bytes(peaks[high])}, rank {low}: {format_bytes(peaks[low])}",
                          f"threshold: peaks apart by at least {MEMORY_IMBALANCE_SHARE:.0%} of the highest and "
                          f"{format_bytes(MEMORY_IMBALANCE_MIN_BYTES)}"),
                remedies=("the rank with more memory is the one that will OOM first: check what only it holds "
                          "(rank-0 logging, metrics or checkpoint buffers)",
                          "uneven sharding: a parameter count not divisible by the world size pads some shards"),
                metrics={"spread": spread, "max_bytes": float(peaks[high]), "min_bytes": float(peaks[low])},
            ))
    skew = statistics.median(skews) if skews else None
    if skew is not None and skew >= STEP_SKEW_SHARE and len(median_step) > 1:
        findings.append(_step_skew_finding(skew, len(skews), median_step, slowest, window, left_out,
                                           straggler=any(f.kind == "straggler" for f in findings)))
    return tuple(findings)


def _step_skew_finding(skew: float, steps: int, median_step: dict[int, float], slowest: dict[int, int],
                       window: _Window, left_out: str, straggler: bool) -> Finding:
    slow = max(median_step, key=median_step.__getitem__)
    fast = min(median_step, key=median_step.__getitem__)
    times_slowest = slowest.get(slow, 0)
    return Finding(
        kind="step_skew", severity=Severity.INFO,
        title=f"step times differ by {skew:.0%} across ranks (median over steps); rank {slow} is the slowest",
        rank=slow,
        evidence=(f"median step time over {window.label()}{left_out}: rank {slow} {median_step[slow] * 1e3:.1f} ms "
                  f"(the longest step in {times_slowest} of {steps} steps), rank {fast} "
                  f"{median_step[fast] * 1e3:.1f} ms",
                  f"threshold: (slowest - fastest) / median step time of {STEP_SKEW_SHARE:.0%}, the median over "
                  "steps",
                  "data-parallel ranks wait for each other, so their step times should agree"),
        remedies=(("see the straggler finding for the rank that makes the others wait",) if straggler else
                  ("no rank makes the others wait in most steps: compare what each rank does between its "
                   "collectives (data loading, logging, uneven batches)",)),
        metrics={"median_skew": skew, "threshold": STEP_SKEW_SHARE, "slowest_median_step_s": median_step[slow],
                 "fastest_median_step_s": median_step[fast], "slowest_steps": float(times_slowest),
                 "steps": float(steps)},
    )
