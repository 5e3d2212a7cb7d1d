"""Collective bandwidth as nccl-tests defines it (DESIGN.md), per collective and per op and size.

algbw = S / t, with S the full array size (for all_gather the gathered output, for reduce_scatter
the full input); busbw = algbw × factor: 2(n−1)/n for all_reduce, (n−1)/n for all_gather,
reduce_scatter and all_to_all, 1 for broadcast, reduce and point-to-point. busbw is comparable
with the hardware's link bandwidth whatever the collective and the group size.

DeepSpeed's comms logger uses other factors (e.g. 2·S/t for all_reduce's busbw whatever n): its
numbers are not these. Only collectives whose completion time was measured are used (timings
sync, wait, callback, cuda_event, nccl_hook); `t` is issue to completion, so it includes the time
spent waiting for the slowest peer, as in nccl-tests.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from zeromon.model.events import CollectiveEvent

MEASURED_TIMINGS = frozenset({"sync", "wait", "callback", "cuda_event", "nccl_hook"})


def bus_factor(op: str, n: int) -> float | None:
    if n < 1:
        return None
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "send", "recv", "gather", "scatter"):
        return 1.0
    return None


def array_bytes(event: CollectiveEvent) -> int:
    """S in nccl-tests' terms: the full array's size."""
    if event.op == "all_gather":
        return event.bytes_out
    return event.bytes_in if event.op == "reduce_scatter" else max(event.bytes_in, event.bytes_out)


def event_bandwidth(event: CollectiveEvent) -> tuple[float, float] | None:
    """(algbw, busbw) in bytes/s, or None when its duration was not measured or the op has none."""
    if event.timing not in MEASURED_TIMINGS or event.complete_ns is None:
        return None
    seconds = (event.complete_ns - event.issue_ns) / 1e9
    factor = bus_factor(event.op, event.group_size)
    size = array_bytes(event)
    if seconds <= 0 or factor is None or size <= 0:
        return None
    algbw = size / seconds
    return algbw, algbw * factor


def size_bucket(nbytes: int) -> int:
    """The power-of-four bucket a size falls in (its lower bound): 1 KiB, 4 KiB, 16 KiB, ..."""
    if nbytes <= 1024:
        return 0
    return 4 ** int(math.log(nbytes, 4))


@dataclass(frozen=True, slots=True)
class BandwidthRow:
    op: str
    size_bucket_bytes: int  # lower bound of the bucket (0: up to 1 KiB)
    group_size: int
    count: int
    total_bytes: int
    median_time_s: float
    median_algbw: float  # bytes/s
    median_busbw: float  # bytes/s
    busbw_p10: float
    peak_share: float | None  # median busbw / the peak, when a peak is known


def bandwidth_table(events: Iterable[CollectiveEvent], peak_busbw: float | None = None) -> tuple[BandwidthRow, ...]:
    """Median bandwidth per (op, size bucket, group size), largest traffic first."""
    groups: dict[tuple[str, int, int], list[tuple[float, float, float, int]]] = defaultdict(list)
    for event in events:
        bw = event_bandwidth(event)
        if bw is None:
            continue
        size = array_bytes(event)
        seconds = (event.complete_ns - event.issue_ns) / 1e9  # type: ignore[operator]
        groups[(event.op, size_bucket(size), event.group_size)].append((seconds, bw[0], bw[1], size))
    rows = []
    for (op, bucket, n), samples in groups.items():
        busbws = sorted(s[2] for s in samples)
        median_busbw = statistics.median(busbws)
        rows.append(BandwidthRow(
            op=op, size_bucket_bytes=bucket, group_size=n, count=len(samples),
            total_bytes=sum(s[3] for s in samples), median_time_s=statistics.median(s[0] for s in samples),
            median_algbw=statistics.median(s[1] for s in samples), median_busbw=median_busbw,
            busbw_p10=busbws[int(0.1 * (len(busbws) - 1))],
            peak_share=median_busbw / peak_busbw if peak_busbw else None,
        ))
    return tuple(sorted(rows, key=lambda r: (-r.total_bytes, r.op)))


def busbw_by_op(events: Iterable[CollectiveEvent]) -> dict[str, float]:
    """Median busbw per op, weighted toward what moves bytes: the median over collectives >= 64 KiB
    when there are any (small ones measure latency, not bandwidth)."""
    by_op: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for event in events:
        bw = event_bandwidth(event)
        if bw is not None:
            by_op[event.op].append((array_bytes(event), bw[1]))
    out = {}
    for op, samples in by_op.items():
        large = [b for size, b in samples if size >= 64 * 1024]
        out[op] = statistics.median(large or [b for _, b in samples])
    return out
