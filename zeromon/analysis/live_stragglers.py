"""Findings across ranks from live data: a straggler and memory imbalance, from step summaries alone.

The agents find what one rank can see (OOM risk, poor overlap); what needs every rank is found
here (the TUI and the dashboard call it), from what a live view holds: the recent StepSummary of each rank and its memory peak. The
recording analysis (zeromon.analysis.stragglers) matches collectives across ranks by their issue
times; live views carry no collective events, so a straggler is found the other way round: in
data-parallel training every rank waits for the slowest at each collective, so the slowest is the
one that is *busy* (step time minus time blocked in collectives) longest, while its peers spend
that difference blocked. As there, it must be the busiest in more steps than chance explains
(zeromon.analysis.chance), with the recording analysis's thresholds, so both say the same thing.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from zeromon.analysis.chance import CRITICAL_CHANCE, WARN_CHANCE, odds_in_words, wins_chance
from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.stragglers import (
    CAUSED_WAIT_MIN_STEP_S,
    CAUSED_WAIT_SHARE,
    CAUSED_WAIT_SHARE_CRITICAL,
    MEMORY_IMBALANCE_MIN_BYTES,
    MEMORY_IMBALANCE_SHARE,
)
from zeromon.model.events import StepSummary, steps_label
from zeromon.model.units import format_bytes

# The newest steps every rank has finished that the straggler test looks at, and the fewest it needs:
# between two ranks, fewer than 10 steps cannot tell a straggler from a coin flip at WARN_CHANCE.
RECENT_STEPS = 16
MIN_STEPS = 10

_STRAGGLER_REMEDIES = (
    "look for work only this rank does (logging, checkpointing, evaluation on rank 0)",
    "check its host for contention (other jobs, CPU frequency, a slower GPU or link)",
    "balance data loading: uneven batch sizes or sequence lengths slow one rank",
)
_IMBALANCE_REMEDIES = (
    "the rank with more memory is the one that will OOM first: check what only it holds "
    "(rank-0 logging, metrics or checkpoint buffers)",
    "uneven sharding: a parameter count not divisible by the world size pads some shards",
)


def straggler_finding(steps_by_rank: Mapping[int, Sequence[StepSummary]]) -> Finding | None:
    """The rank the others wait for, if one stands out over the newest steps every rank has finished:
    busiest in more of them than chance explains, by a share of a step worth a user's time."""
    if len(steps_by_rank) < 2 or any(not s for s in steps_by_rank.values()):
        return None
    newest_common = min(s[-1].step for s in steps_by_rank.values())
    first = newest_common - RECENT_STEPS + 1
    windows = {rank: {s.step: s for s in steps[-2 * RECENT_STEPS:] if first <= s.step <= newest_common}
               for rank, steps in steps_by_rank.items()}
    common = sorted(set.intersection(*(set(w) for w in windows.values())))
    if len(common) < MIN_STEPS:
        return None
    busy: dict[int, list[float]] = {}
    blocked: dict[int, float] = {}
    for rank, window in windows.items():
        chosen = [window[step] for step in common]
        if any(s.blocked_s is None for s in chosen):  # blocked time unknown (steps read through Prometheus)
            return None
        busy[rank] = [max(0.0, s.duration_s - (s.blocked_s or 0.0)) for s in chosen]
        blocked[rank] = statistics.median(s.blocked_s or 0.0 for s in chosen)
    typical_step_s = statistics.median(statistics.median(windows[r][s].duration_s for s in common) for r in windows)
    if typical_step_s <= 0:
        return None
    median_busy = {rank: statistics.median(values) for rank, values in busy.items()}
    slow = max(median_busy, key=lambda r: (median_busy[r], -r))
    gap_s = median_busy[slow] - statistics.median(b for r, b in median_busy.items() if r != slow)
    share = gap_s / typical_step_s
    peers_blocked_s = statistics.median(b for r, b in blocked.items() if r != slow)
    # The signature of a straggler: its peers are blocked about as much longer than it is as it is
    # busier than they are (ranks that only differ in speed, never waiting for each other, are not).
    if share < CAUSED_WAIT_SHARE or gap_s < CAUSED_WAIT_MIN_STEP_S or peers_blocked_s - blocked[slow] < gap_s / 2:
        return None
    wins, trials = _busiest_counts(busy, len(common))
    odds = wins_chance(wins, trials, len(busy)).get(slow, 1.0)
    if odds >= WARN_CHANCE:
        return None
    critical = odds < CRITICAL_CHANCE and share >= CAUSED_WAIT_SHARE_CRITICAL
    peers = f"rank {min(r for r in busy if r != slow)}" if len(busy) == 2 else "the other ranks"
    would = "that would happen" if len(busy) == 2 else f"one of the {len(busy):,} ranks would do so"
    return Finding(
        kind="straggler", severity=Severity.CRITICAL if critical else Severity.WARN,
        title=f"{peers} wait {gap_s * 1e3:.1f} ms a step for rank {slow} ({share:.0%} of a step)",
        rank=slow, step=newest_common,
        evidence=(f"over {steps_label(common[0], common[-1])}: rank {slow} was the busiest rank (step minus "
                  f"time blocked in collectives) in {wins.get(slow, 0)} of {trials} steps; were no rank slower "
                  f"than the others, {would} {odds_in_words(odds)}",
                  f"median busy time: rank {slow} {median_busy[slow] * 1e3:.1f} ms, the others "
                  f"{(median_busy[slow] - gap_s) * 1e3:.1f} ms; the others are blocked in collectives "
                  f"{peers_blocked_s * 1e3:.1f} ms a step, rank {slow} {blocked[slow] * 1e3:.1f} ms"),
        remedies=_STRAGGLER_REMEDIES,
        metrics={"gap_s": gap_s, "gap_share": share, "peers_blocked_s": peers_blocked_s, "chance": odds,
                 "steps_busiest": float(wins.get(slow, 0)), "steps": float(trials)},
    )


def _busiest_counts(busy: Mapping[int, Sequence[float]], steps: int) -> tuple[dict[int, int], int]:
    """In how many steps each rank was the busiest, and how many steps had one (a tie has none)."""
    wins: dict[int, int] = {}
    trials = 0
    for i in range(steps):
        values = sorted(((b[i], r) for r, b in busy.items()), reverse=True)
        if values[0][0] > values[1][0]:
            wins[values[0][1]] = wins.get(values[0][1], 0) + 1
            trials += 1
    return wins, trials


def memory_imbalance_finding(peaks: Mapping[int, int]) -> Finding | None:
    """Ranks whose memory peaks differ by more than MEMORY_IMBALANCE_SHARE of the largest (and 64 MiB)."""
    if len(peaks) < 2:
        return None
    high = max(peaks, key=lambda r: (peaks[r], -r))
    low = min(peaks, key=lambda r: (peaks[r], r))
    if peaks[high] <= 0:
        return None
    spread = (peaks[high] - peaks[low]) / peaks[high]
    if spread < MEMORY_IMBALANCE_SHARE or peaks[high] - peaks[low] < MEMORY_IMBALANCE_MIN_BYTES:
        return None
    return Finding(
        kind="memory_imbalance", severity=Severity.WARN,
        title=f"rank {high} peaks {spread:.0%} higher in memory than rank {low}",
        rank=high,
        evidence=(f"peak rank {high}: {format_bytes(peaks[high])}, rank {low}: {format_bytes(peaks[low])}",),
        remedies=_IMBALANCE_REMEDIES,
        metrics={"spread": spread, "max_bytes": float(peaks[high]), "min_bytes": float(peaks[low])},
    )
