"""Stragglers and imbalance across ranks: step-time skew, who arrives last at collectives, memory.

Collectives are matched across ranks by (step, op, occurrence within the step): data-parallel ranks
issue the same collectives in the same order. The rank that issues last makes its peers wait: the
wait it causes a peer is how much earlier the peer issued, bounded by the time the peer was blocked
on that collective (a peer that issued early but kept computing lost nothing). Issue times are host
clocks: exact between ranks of one machine, as good as NTP between machines.
"""

from __future__ import annotations

import statistics
from array import array
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

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
    step_s: tuple[tuple[int, float], ...]  # (step, duration_s) of each step summary, as recorded
    peak_memory: int | None  # the highest level (allocator on GPU, RSS on CPU)


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
    return RankArrivals(
        rank=rec.rank, keys=tuple(by_key), counts=tuple(map(len, by_key.values())),
        issue_ns=_packed("q", list(map(columns.issue_ns.__getitem__, order))),
        blocked_s=_packed("d", list(map(columns.blocked_s.__getitem__, order))),
        step_s=tuple((s.step, s.duration_s) for s in rec.steps),
        peak_memory=max(present) if present else None,
    )


def _packed(typecode: str, values: list[Any]) -> Sequence[Any]:
    """The values as an array: a million of them pickle in milliseconds and take 8 MB, not ~32 MB."""
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
    runs = _matched_runs(tables)
    matched = sum(n for _, n in runs)
    last = dict.fromkeys(ranks, 0)
    caused = dict.fromkeys(ranks, 0.0)
    waited = dict.fromkeys(ranks, 0.0)
    if len(parts) > 1:
        for rank, (n_last, caused_s, waited_s) in zip(keyed, _late_arrivals(tables, runs), strict=True):
            last[rank], caused[rank], waited[rank] = n_last, caused_s, waited_s
    arrivals_out = tuple(RankArrival(rank=r, matched=matched, last_arrivals=last[r], caused_wait_s=caused[r],
                                     waited_s=waited[r]) for r in ranks)

    durations: dict[int, dict[int, float]] = defaultdict(dict)
    for part in parts:
        for step, duration in part.step_s:
            durations[step][part.rank] = duration
    skews = []
    slowest: dict[int, int] = defaultdict(int)
    for per_rank in durations.values():
        if len(per_rank) == len(parts) > 1:
            values = list(per_rank.values())
            median = statistics.median(values)
            if median > 0:
                skews.append((max(values) - min(values)) / median)
            slowest[max(per_rank, key=lambda r: per_rank[r])] += 1
    peaks = {p.rank: p.peak_memory for p in parts if p.peak_memory is not None}
    spread = (max(peaks.values()) - min(peaks.values())) / max(peaks.values()) if len(peaks) > 1 else None

    findings = _findings(parts, arrivals_out, peaks, spread, skews)
    return Imbalance(ranks=arrivals_out, step_skew_median=statistics.median(skews) if skews else None,
                     slowest_rank_counts=dict(slowest), peak_memory=peaks, memory_spread=spread,
                     findings=findings)


def _spans(part: RankArrivals) -> dict[tuple[int, str], tuple[int, int]]:
    """Where each key's collectives start in the rank's lists, and how many it has."""
    spans, start = {}, 0
    for key, count in zip(part.keys, part.counts, strict=True):
        spans[key] = (start, count)
        start += count
    return spans


def _matched_runs(tables: Sequence[RankArrivals]) -> list[tuple[list[int], int]]:
    """The collectives matched on every rank: for each (step, op) all ranks have, in the first rank's
    order (not a set's: the sums come out the same in every process), where its collectives start in
    each rank's lists and how many are matched (the fewest any rank has)."""
    spans = [_spans(t) for t in tables]
    common = set.intersection(*(set(span) for span in spans)) if spans else set()
    runs = []
    for key in tables[0].keys if tables else ():
        if key in common:
            bounds = [span[key] for span in spans]
            runs.append(([start for start, _ in bounds], min(count for _, count in bounds)))
    return runs


def _late_arrivals(tables: Sequence[RankArrivals],
                   runs: list[tuple[list[int], int]]) -> list[tuple[int, float, float]]:
    """Per rank (in the tables' order): how often it issued last, the wait that caused its peers,
    and the time it waited for a later peer."""
    n_ranks = len(tables)
    last_by, caused_by, waited_by = [0] * n_ranks, [0.0] * n_ranks, [0.0] * n_ranks
    for starts, n in runs:
        issue_runs = [t.issue_ns[start:start + n] for t, start in zip(tables, starts, strict=True)]
        blocked_runs = [t.blocked_s[start:start + n] for t, start in zip(tables, starts, strict=True)]
        # Half a million matched collectives: plain comparisons, no call per collective.
        for issues, blocks in zip(zip(*issue_runs, strict=True), zip(*blocked_runs, strict=True), strict=True):
            late, late_issue = 0, issues[0]
            for i in range(1, n_ranks):
                if issues[i] > late_issue:
                    late, late_issue = i, issues[i]
            last_by[late] += 1
            for i, (issue, blocked) in enumerate(zip(issues, blocks, strict=True)):
                lost = (late_issue - issue) / 1e9
                if blocked < lost:
                    lost = blocked
                if i != late and lost > 0:
                    caused_by[late] += lost
                    waited_by[i] += lost
    return list(zip(last_by, caused_by, waited_by, strict=True))


def _findings(parts: Sequence[RankArrivals], arrivals: tuple[RankArrival, ...], peaks: dict[int, int],
              spread: float | None, skews: list[float]) -> tuple[Finding, ...]:
    findings = []
    total_step_s = sum(duration for part in parts for _, duration in part.step_s) / max(1, len(parts))
    for arrival in arrivals:
        if not arrival.matched or total_step_s <= 0:
            continue
        share = arrival.last_arrivals / arrival.matched
        peers = max(1, len(parts) - 1)
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
