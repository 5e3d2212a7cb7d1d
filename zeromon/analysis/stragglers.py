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
from itertools import pairwise, repeat
from typing import Any

from zeromon.analysis.chance import CRITICAL_CHANCE, WARN_CHANCE, odds_in_words, wins_chance
from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.step_skew import step_times_across_ranks
from zeromon.model.classes import frozen
from zeromon.model.codec import Recording
from zeromon.model.events import StepSummary, steps_label
from zeromon.model.step_records import step_column
from zeromon.model.units import format_bytes

# A rank is a straggler when it computed longest (its step minus its time blocked in collectives) in
# more steps than chance explains (zeromon.analysis.chance: WARN_CHANCE, CRITICAL_CHANCE) and its
# peers' waiting for it cost them at least this share of their own step time (a warning), or the
# second share (critical): both evidence and effect. Not "waited for most": a collective's ranks
# leave it in a fixed order (gloo's rank 1 a few ms after rank 0), so in a healthy run one rank
# reaches the next collective last in nearly every step without computing any longer.
CAUSED_WAIT_SHARE = 0.05
CAUSED_WAIT_SHARE_CRITICAL = 0.20
# And at least this much a step for each waiting peer: in a healthy run a rank can compute a little longer
# in every step (rank 0's extra work), which is real but worth no one's time on a short CPU step.
CAUSED_WAIT_MIN_STEP_S = 0.005
# Memory imbalance: the spread of per-rank peaks over the largest, and a floor in bytes.
MEMORY_IMBALANCE_SHARE = 0.10
MEMORY_IMBALANCE_MIN_BYTES = 64 * 2**20
# Step-time skew: (slowest − fastest) / median, per step; said when one rank has the longest step in
# more steps than chance explains.
STEP_SKEW_SHARE = 0.10


@frozen
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
    steps_busiest: int = 0  # steps in which it computed longest (step minus time blocked), of those with one


@frozen
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
    # The steps after the first with matched collectives: where the waiting was measured (a bounded
    # recording keeps some steps' collectives only), for comparing it with time measured per step.
    waiting_steps: tuple[int, ...] = ()


@frozen
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


@frozen(eq=False)
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
    tallies = _late_arrivals(tables, runs, first_step, _durations(parts, arrays, runs, first_step)) \
        if len(parts) > 1 else {}
    waiting_steps = tuple(sorted({step for step, _, _ in runs if step >= first_step}))
    steady_steps = len(waiting_steps)
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
                     peak_memory=peaks, memory_spread=spread, findings=findings, waiting_steps=waiting_steps)


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


def _durations(parts: Sequence[RankArrivals], arrays: Sequence[tuple[Sequence[int], Sequence[float], Any]],
               runs: list[tuple[int, list[int], int]], first_step: int) -> dict[int, dict[int, float]]:
    """Per rank, the step times of the steps after the first with matched collectives (a few of 10,000
    in a bounded recording: picked out with numpy, not a dict of every step)."""
    import numpy as np

    wanted = np.asarray(sorted({step for step, _, _ in runs if step >= first_step}), dtype=np.int64)
    out = {}
    for part, (steps, seconds, _) in zip(parts, arrays, strict=True):
        steps_a = np.asarray(steps, dtype=np.int64)
        keep = np.isin(steps_a, wanted)
        out[part.rank] = dict(zip(steps_a[keep].tolist(), np.asarray(seconds, dtype=np.float64)[keep].tolist(),
                                  strict=True))
    return out


def _late_arrivals(tables: Sequence[RankArrivals], runs: list[tuple[int, list[int], int]],
                   first_step: int, durations: dict[int, dict[int, float]]) -> dict[int, dict[str, Any]]:
    """Per rank, RankArrival's counts: how often it issued last, the wait that caused its peers and
    the time it waited for a later peer, over all steps and over those from ``first_step`` on; and in
    how many of those steps its peers waited for it the most, and in how many it computed longest
    (``durations``: each rank's step times, by step)."""
    n_ranks = len(tables)
    # [0]: the steps before first_step, [1]: from first_step on.
    last_by = [[0] * n_ranks, [0] * n_ranks]
    caused_by = [[0.0] * n_ranks, [0.0] * n_ranks]
    waited_by = [[0.0] * n_ranks, [0.0] * n_ranks]
    caused_in_step: dict[int, dict[int, float]] = defaultdict(dict)  # steady steps: rank -> wait it caused
    blocked_in_step: dict[int, list[float]] = {}  # steady steps: each rank's time blocked in them
    for step, starts, n in runs:
        window = int(step >= first_step)
        last_w, caused_w, waited_w = last_by[window], caused_by[window], waited_by[window]
        in_step = caused_in_step[step] if window else None
        blocked_step = blocked_in_step.setdefault(step, [0.0] * n_ranks) if window else None
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
            if in_step is not None and blocked_step is not None:
                for i, blocked in enumerate(blocks):
                    blocked_step[i] += blocked
                if caused > 0:
                    in_step[late] = in_step.get(late, 0.0) + caused
    most = [0] * n_ranks
    for per_rank in caused_in_step.values():
        if per_rank:
            most[max(per_rank, key=per_rank.__getitem__)] += 1
    busiest = _busiest(tables, blocked_in_step, durations)
    return {t.rank: {"last_arrivals": last_by[0][i] + last_by[1][i],
                     "caused_wait_s": caused_by[0][i] + caused_by[1][i],
                     "waited_s": waited_by[0][i] + waited_by[1][i],
                     "steady_last_arrivals": last_by[1][i], "steady_caused_wait_s": caused_by[1][i],
                     "steady_waited_s": waited_by[1][i], "steps_most_waited_for": most[i],
                     "steps_busiest": busiest[i]}
            for i, t in enumerate(tables)}


def _busiest(tables: Sequence[RankArrivals], blocked_in_step: dict[int, list[float]],
             durations: dict[int, dict[int, float]]) -> list[int]:
    """In how many steps each rank computed longest (step time minus its time blocked in the step's
    collectives); a step some rank has no time for, or with a tie, counts for none."""
    counts = [0] * len(tables)
    for step, blocked in blocked_in_step.items():
        busy = [durations.get(t.rank, {}).get(step) for t in tables]
        if any(b is None for b in busy):
            continue
        values = [b - w for b, w in zip(busy, blocked, strict=True)]  # type: ignore[operator]
        top = max(values)
        if values.count(top) == 1:
            counts[values.index(top)] += 1
    return counts


@frozen
class _Window:
    """The steps the findings judge (recording step indices) and each rank's time in them."""

    first_step: int
    last_step: int
    steps: int  # steps with matched collectives
    step_s: dict[int, float]  # per rank, the sum of its step times

    def measured(self, collectives: bool = True) -> str:
        """The window, and with ``collectives`` the steps of it the waiting was measured in, where not all
        of them (a bounded recording keeps some steps' collectives)."""
        notes = ["the first left out, as in the per-rank table"] if self.first_step else []
        if collectives and 0 < self.steps < self.last_step - self.first_step + 1:
            notes.append(f"the {self.steps:,} steps whose collectives were recorded")
        return f"{self.label()} ({'; '.join(notes)})" if notes else self.label()

    def label(self) -> str:
        """'steps 2-12', numbered from 1 as training scripts log them."""
        return steps_label(self.first_step, self.last_step)


_STRAGGLER_REMEDIES = ("look for work only this rank does (logging, checkpointing, evaluation on rank 0)",
                       "check its host for contention (other jobs, CPU frequency, a slower GPU or link)",
                       "balance data loading: uneven batch sizes or sequence lengths slow one rank")


def _findings(arrivals: tuple[RankArrival, ...], window: _Window, peaks: dict[int, int], spread: float | None,
              skews: list[float], median_step: dict[int, float], slowest: dict[int, int]) -> tuple[Finding, ...]:
    findings = list(_straggler_findings(arrivals, window))
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
        found = _step_skew_finding(skew, median_step, slowest, window,
                                   straggler=any(f.kind == "straggler" for f in findings))
        findings.extend(found)
    return tuple(findings)


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.0f} ms"


def _would(ranks: int) -> str:
    """What chance would do, as the evidence says it: among many ranks, any of them could have."""
    return "that would happen" if ranks == 2 else f"one of the {ranks:,} ranks would do so"


def _straggler_findings(arrivals: tuple[RankArrival, ...], window: _Window) -> list[Finding]:
    """The ranks that computed longest in more steps than chance explains, at a cost to the others worth a
    user's time. One trial a step, not a collective: one late forward makes a rank last at all of a
    step's collectives, which are not independent draws."""
    # Each step with a time on every rank and no tie has exactly one rank that computed longest.
    trials = sum(a.steps_busiest for a in arrivals)
    chance = wins_chance({a.rank: a.steps_busiest for a in arrivals}, trials, len(arrivals))
    all_step_s = sum(window.step_s.values())
    found = []
    for arrival in arrivals:
        # The waiting peers' own time: the wait as a share of the time they spent in these steps.
        peers_step_s = all_step_s - window.step_s.get(arrival.rank, 0.0)
        if not arrival.steady_matched or not window.steps or peers_step_s <= 0:
            continue
        caused_share = arrival.steady_caused_wait_s / peers_step_s
        odds = chance.get(arrival.rank, 1.0)
        per_peer_step_s = arrival.steady_caused_wait_s / (len(arrivals) - 1) / window.steps
        if odds >= WARN_CHANCE or caused_share < CAUSED_WAIT_SHARE or per_peer_step_s < CAUSED_WAIT_MIN_STEP_S:
            continue
        critical = odds < CRITICAL_CHANCE and caused_share >= CAUSED_WAIT_SHARE_CRITICAL
        found.append(_straggler_finding(arrival, window, len(arrivals), trials, odds, caused_share, critical))
    return found


def _straggler_finding(arrival: RankArrival, window: _Window, ranks: int, trials: int, odds: float,
                       caused_share: float, critical: bool) -> Finding:
    """What the others lost and who made them lose it first; then what was tested, in words."""
    peers, their = ("rank 0" if arrival.rank else "rank 1", "its") if ranks == 2 else ("the other ranks", "their")
    per_peer_step_s = arrival.steady_caused_wait_s / (ranks - 1) / window.steps
    share = arrival.steady_last_arrivals / arrival.steady_matched
    return Finding(
        kind="straggler", severity=Severity.CRITICAL if critical else Severity.WARN,
        title=(f"{peers} waited {_seconds(arrival.steady_caused_wait_s)} for rank {arrival.rank}, "
               f"{caused_share:.0%} of {their} step time"),
        rank=arrival.rank,
        evidence=(f"over {window.measured()}: rank {arrival.rank} computed longest (its step minus its time "
                  f"blocked in collectives) in {arrival.steps_busiest} of {trials} steps; were no rank slower than "
                  "the others, "
                  f"{_would(ranks)} {odds_in_words(odds)}",
                  f"{peers} lost {per_peer_step_s * 1e3:.1f} ms a step waiting for it "
                  f"({_seconds(arrival.steady_caused_wait_s)} in all, {caused_share:.1%} of {their} step time); it "
                  f"arrived last at {arrival.steady_last_arrivals} of {arrival.steady_matched} matched collectives",
                  f"a warning needs odds under 1 in {1 / WARN_CHANCE:,.0f} and a wait of at least "
                  f"{CAUSED_WAIT_SHARE:.0%} of the others' step time and {CAUSED_WAIT_MIN_STEP_S * 1e3:.0f} ms a step; critical, under 1 in "
                  f"{1 / CRITICAL_CHANCE:,.0f} and {CAUSED_WAIT_SHARE_CRITICAL:.0%}"),
        remedies=_STRAGGLER_REMEDIES,
        metrics={"last_share": share, "caused_wait_s": arrival.steady_caused_wait_s, "caused_share": caused_share,
                 "caused_wait_per_step_s": per_peer_step_s,
                 "steps_busiest": float(arrival.steps_busiest), "steps_most_waited_for":
                 float(arrival.steps_most_waited_for), "steps": float(trials),
                 "chance": odds},
    )


def _step_skew_finding(skew: float, median_step: dict[int, float], slowest: dict[int, int], window: _Window,
                       straggler: bool) -> tuple[Finding, ...]:
    """Step times that differ, with the rank whose step was the longest in more steps than chance
    explains; none where the longest step moves from rank to rank (jitter, not a slow rank)."""
    trials = sum(slowest.values())
    chance = wins_chance(slowest, trials, len(median_step))
    slow = min(chance, key=lambda r: (chance[r], -slowest[r], r), default=None)
    if slow is None or chance[slow] >= WARN_CHANCE:
        return ()
    fast = min(median_step, key=median_step.__getitem__)
    return (Finding(
        kind="step_skew", severity=Severity.INFO,
        title=f"step times differ by {skew:.0%} across ranks (median over steps); rank {slow} is the slowest",
        rank=slow,
        evidence=(f"over {window.measured(collectives=False)}: rank {slow} had the longest step in {slowest[slow]} of "
                  f"{trials} steps; were no rank slower than the others, {_would(len(median_step))} "
                  f"{odds_in_words(chance[slow])}",
                  f"median step time: rank {slow} {median_step[slow] * 1e3:.1f} ms, rank {fast} "
                  f"{median_step[fast] * 1e3:.1f} ms",
                  f"said from (slowest - fastest) / median step time of {STEP_SKEW_SHARE:.0%}, the median over "
                  f"steps, with odds under 1 in {1 / WARN_CHANCE:,.0f}",
                  "data-parallel ranks wait for each other, so their step times should agree"),
        remedies=(("see the straggler finding for the rank that makes the others wait",) if straggler else
                  ("no rank makes the others wait in most steps: compare what each rank does between its "
                   "collectives (data loading, logging, uneven batches)",)),
        metrics={"median_skew": skew, "threshold": STEP_SKEW_SHARE, "slowest_median_step_s": median_step[slow],
                 "fastest_median_step_s": median_step[fast], "slowest_steps": float(slowest[slow]),
                 "steps": float(trials), "chance": chance[slow]},
    ),)
