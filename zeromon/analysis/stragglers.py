"""Stragglers and imbalance across ranks: step-time skew, who arrives last at collectives, memory.

Collectives are matched across ranks by (step, op, occurrence within the step): data-parallel ranks
issue the same collectives in the same order. The rank that issues last makes its peers wait: the
wait it causes a peer is how much earlier the peer issued, bounded by the time the peer was blocked
on that collective (a peer that issued early but kept computing lost nothing). Issue times are host
clocks: exact between ranks of one machine, as good as NTP between machines.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from operator import itemgetter

from zeromon.analysis.findings import Finding, Severity
from zeromon.model.codec import Recording
from zeromon.model.units import format_bytes

# A rank is a straggler when the wait it causes its peers is at least this share of their step
# time, and at least this many times the wait the other ranks cause (everyone is last sometimes).
CAUSED_WAIT_SHARE = 0.05
CAUSED_WAIT_DOMINANCE = 2.0
# Memory imbalance: the spread of per-rank peaks over the largest, and a floor in bytes.
MEMORY_IMBALANCE_SHARE = 0.10
MEMORY_IMBALANCE_MIN_BYTES = 64 * 2**20
# Step-time skew: (slowest − fastest) / median, per step.
STEP_SKEW_SHARE = 0.10


@dataclass(frozen=True, slots=True)
class RankArrival:
    rank: int
    matched: int  # collectives matched on every rank
    last_arrivals: int
    caused_wait_s: float  # the peers' waiting this rank caused by arriving last
    waited_s: float  # the time this rank waited for a later peer


@dataclass(frozen=True, slots=True)
class Imbalance:
    ranks: tuple[RankArrival, ...]
    step_skew_median: float | None  # median over steps of (slowest − fastest) / median step time
    slowest_rank_counts: dict[int, int]  # how often each rank had the longest step
    peak_memory: dict[int, int]  # per-rank peak level (allocator on GPU, RSS on CPU)
    memory_spread: float | None  # (max − min) / max of the peaks
    findings: tuple[Finding, ...]


def _peak(rec: Recording) -> int | None:
    levels = [m.allocated if m.allocated is not None else m.rss for m in rec.memory]
    values = [v for v in levels if v is not None]
    return max(values) if values else None


def _arrivals_by_step_op(rec: Recording) -> dict[tuple[int, str], list[tuple[int, float]]]:
    """(issue_ns, blocked_s) of each collective from step 0 on, by (step, op), in issue (seq) order:
    the k-th of a list is the k-th of that op in that step, the key peers match on."""
    columns = rec.collective_columns()
    rows: Iterable[tuple[int, int, str, int, float]] = zip(
        columns.seq, columns.step, columns.op, columns.issue_ns, columns.blocked_s, strict=True)
    if not all(a <= b for a, b in pairwise(columns.seq)):  # recorded in seq order: sort only if not
        rows = sorted(rows, key=itemgetter(0))
    by_key: dict[tuple[int, str], list[tuple[int, float]]] = defaultdict(list)
    for _, step, op, issue, blocked in rows:
        if step >= 0:
            by_key[(step, op)].append((issue, blocked))
    return by_key


def analyze_imbalance(recordings: Sequence[Recording]) -> Imbalance:
    ranks = [r.rank for r in recordings]
    keyed = {rec.rank: _arrivals_by_step_op(rec) for rec in recordings}
    last = dict.fromkeys(ranks, 0)
    caused = dict.fromkeys(ranks, 0.0)
    waited = dict.fromkeys(ranks, 0.0)
    tables = list(keyed.values())
    common = set.intersection(*(set(t) for t in tables)) if tables else set()
    # Collectives matched on every rank: the first min(count) of each common (step, op).
    matched = sum(min(len(t[key]) for t in tables) for key in common)
    if len(recordings) > 1:
        order = list(keyed)
        last_by, caused_by, waited_by = [0] * len(order), [0.0] * len(order), [0.0] * len(order)
        # Half a million matched collectives: plain comparisons, no call per collective. Keys in the
        # first rank's order, not the set's: the sums come out the same in every process.
        for key in (key for key in tables[0] if key in common):
            for arrivals in zip(*(t[key] for t in tables), strict=False):  # stops at the shortest
                late, late_issue = 0, arrivals[0][0]
                for i in range(1, len(arrivals)):
                    if arrivals[i][0] > late_issue:
                        late, late_issue = i, arrivals[i][0]
                last_by[late] += 1
                for i, (issue, blocked) in enumerate(arrivals):
                    lost = (late_issue - issue) / 1e9
                    if blocked < lost:
                        lost = blocked
                    if i != late and lost > 0:
                        caused_by[late] += lost
                        waited_by[i] += lost
        for i, rank in enumerate(order):
            last[rank], caused[rank], waited[rank] = last_by[i], caused_by[i], waited_by[i]
    arrivals_out = tuple(RankArrival(rank=r, matched=matched, last_arrivals=last[r], caused_wait_s=caused[r],
                                     waited_s=waited[r]) for r in ranks)

    durations: dict[int, dict[int, float]] = defaultdict(dict)
    for rec in recordings:
        for s in rec.steps:
            durations[s.step][rec.rank] = s.duration_s
    skews = []
    slowest: dict[int, int] = defaultdict(int)
    for per_rank in durations.values():
        if len(per_rank) == len(recordings) > 1:
            values = list(per_rank.values())
            median = statistics.median(values)
            if median > 0:
                skews.append((max(values) - min(values)) / median)
            slowest[max(per_rank, key=lambda r: per_rank[r])] += 1
    peaks = {rec.rank: p for rec in recordings if (p := _peak(rec)) is not None}
    spread = (max(peaks.values()) - min(peaks.values())) / max(peaks.values()) if len(peaks) > 1 else None

    findings = _findings(recordings, arrivals_out, peaks, spread, skews)
    return Imbalance(ranks=arrivals_out, step_skew_median=statistics.median(skews) if skews else None,
                     slowest_rank_counts=dict(slowest), peak_memory=peaks, memory_spread=spread,
                     findings=findings)


def _findings(recordings: Sequence[Recording], arrivals: tuple[RankArrival, ...], peaks: dict[int, int],
              spread: float | None, skews: list[float]) -> tuple[Finding, ...]:
    findings = []
    total_step_s = sum(s.duration_s for rec in recordings for s in rec.steps) / max(1, len(recordings))
    for arrival in arrivals:
        if not arrival.matched or total_step_s <= 0:
            continue
        share = arrival.last_arrivals / arrival.matched
        peers = max(1, len(recordings) - 1)
        caused_share = arrival.caused_wait_s / peers / total_step_s
        others = [a.caused_wait_s for a in arrivals if a.rank != arrival.rank]
        typical = sum(others) / len(others) if others else 0.0
        if caused_share >= CAUSED_WAIT_SHARE and arrival.caused_wait_s >= CAUSED_WAIT_DOMINANCE * typical:
            findings.append(Finding(
                kind="straggler", severity=Severity.WARN if caused_share < 0.2 else Severity.CRITICAL,
                title=f"rank {arrival.rank} arrives last at {share:.0%} of collectives",
                rank=arrival.rank,
                evidence=(f"last at {arrival.last_arrivals} of {arrival.matched} matched collectives",
                          f"its peers waited {arrival.caused_wait_s:.3f} s for it in all "
                          f"({caused_share:.1%} of their step time)"),
                remedies=("look for work only this rank does (logging, checkpointing, evaluation on rank 0)",
                          "check its host for contention (other jobs, CPU frequency, a slower GPU or link)",
                          "balance data loading: uneven batch sizes or sequence lengths slow one rank"),
                metrics={"last_share": share, "caused_wait_s": arrival.caused_wait_s,
                         "caused_share": caused_share},
            ))
    if spread is not None and spread >= MEMORY_IMBALANCE_SHARE:
        high = max(peaks, key=lambda r: peaks[r])
        low = min(peaks, key=lambda r: peaks[r])
        if peaks[high] - peaks[low] >= MEMORY_IMBALANCE_MIN_BYTES:
            findings.append(Finding(
                kind="memory_imbalance", severity=Severity.WARN,
                title=f"rank {high} peaks {spread:.0%} higher in memory than rank {low}",
                rank=high,
                evidence=(f"peak rank {high}: {format_bytes(peaks[high])}, rank {low}: {format_bytes(peaks[low])}",),
                remedies=("the rank with more memory is the one that will OOM first: check what only it holds "
                          "(rank-0 logging, metrics or checkpoint buffers)",
                          "uneven sharding: a parameter count not divisible by the world size pads some shards"),
                metrics={"spread": spread, "max_bytes": float(peaks[high]), "min_bytes": float(peaks[low])},
            ))
    if skews and statistics.median(skews) >= STEP_SKEW_SHARE:
        findings.append(Finding(
            kind="step_skew", severity=Severity.INFO,
            title=f"step times differ by {statistics.median(skews):.0%} across ranks (median over steps)",
            evidence=("data-parallel ranks wait for each other, so their step times should agree",),
            remedies=("see the straggler findings for the rank that makes the others wait",),
            metrics={"median_skew": statistics.median(skews)},
        ))
    return tuple(findings)
