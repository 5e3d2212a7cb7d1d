"""Findings across ranks from live data: a straggler and memory imbalance, from step summaries alone.

The agents find what one rank can see (OOM risk, poor overlap); what needs every rank is found
here (the TUI and the dashboard call it), from what a live view holds: the recent StepSummary of each rank and its memory peak. The
recording analysis (zeromon.analysis.stragglers) matches collectives across ranks by their issue
times; live views carry no collective events, so a straggler is found the other way round: in
data-parallel training every rank waits for the slowest at each collective, so the slowest is the
one that is *busy* (step time minus time blocked in collectives) longest, while its peers spend
that difference blocked. Thresholds are the recording analysis's, so both say the same thing.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.stragglers import CAUSED_WAIT_SHARE, MEMORY_IMBALANCE_MIN_BYTES, MEMORY_IMBALANCE_SHARE
from zeromon.model.events import StepSummary
from zeromon.model.units import format_bytes

RECENT_STEPS = 8  # steps per rank the straggler test looks at (the newest common ones)

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
    """The rank the others wait for, if one stands out over the newest steps every rank has finished."""
    if len(steps_by_rank) < 2:
        return None
    newest_common = min((s[-1].step for s in steps_by_rank.values() if s), default=None)
    if newest_common is None or any(not s for s in steps_by_rank.values()):
        return None
    first = newest_common - RECENT_STEPS + 1
    busy: dict[int, float] = {}
    blocked: dict[int, float] = {}
    step_s: list[float] = []
    for rank, steps in steps_by_rank.items():
        window = [s for s in steps[-2 * RECENT_STEPS:] if first <= s.step <= newest_common]
        waits = [s.blocked_s for s in window if s.blocked_s is not None]
        if not window or len(waits) < len(window):  # blocked time unknown (steps read through Prometheus)
            return None
        busy[rank] = statistics.median(max(0.0, s.duration_s - w) for s, w in zip(window, waits, strict=True))
        blocked[rank] = statistics.median(waits)
        step_s.append(statistics.median(s.duration_s for s in window))
    typical_step_s = statistics.median(step_s)
    if typical_step_s <= 0:
        return None
    slow = max(busy, key=lambda r: (busy[r], -r))
    others = [b for r, b in busy.items() if r != slow]
    gap_s = busy[slow] - statistics.median(others)
    share = gap_s / typical_step_s
    peers_blocked_s = statistics.median(b for r, b in blocked.items() if r != slow)
    # The signature of a straggler: its peers are blocked about as much longer than it is as it is
    # busier than they are (ranks that only differ in speed, never waiting for each other, are not).
    if share < CAUSED_WAIT_SHARE or peers_blocked_s - blocked[slow] < gap_s / 2:
        return None
    return Finding(
        kind="straggler", severity=Severity.WARN if share < 0.2 else Severity.CRITICAL,
        title=f"rank {slow} computes {gap_s * 1e3:.1f} ms longer per step than its peers ({share:.0%} of a step)",
        rank=slow, step=newest_common,
        evidence=(f"median busy time (step minus blocked in collectives) over steps {first}..{newest_common}: "
                  f"rank {slow} {busy[slow] * 1e3:.1f} ms, the others {statistics.median(others) * 1e3:.1f} ms",
                  f"the others are blocked in collectives {peers_blocked_s * 1e3:.1f} ms per step, "
                  f"rank {slow} {blocked[slow] * 1e3:.1f} ms"),
        remedies=_STRAGGLER_REMEDIES,
        metrics={"gap_s": gap_s, "gap_share": share, "peers_blocked_s": peers_blocked_s},
    )


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
