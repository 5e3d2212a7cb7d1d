"""Collective bandwidth as nccl-tests defines it (its doc/PERFORMANCE.md), per collective, op and size.

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
from collections.abc import Iterable

from zeromon.model.classes import frozen
from zeromon.model.codec import CollectiveColumns
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
    return array_size(event.op, event.bytes_in, event.bytes_out)


def array_size(op: str, bytes_in: int, bytes_out: int) -> int:
    """S of a collective given by its op and sizes (the gathered output, the reduce-scatter's whole input)."""
    if op == "all_gather":
        return bytes_out
    return bytes_in if op == "reduce_scatter" else max(bytes_in, bytes_out)


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


def _exact_size(nbytes: int) -> str:
    """A power of four from 1 KiB on, in the largest binary unit that keeps it whole: '4 KiB', '1 MiB'."""
    for unit, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {name}"
    return f"{nbytes} B"


def bucket_label(bucket: int) -> str:
    """The sizes a size_bucket holds: '<= 1 KiB', '4-16 KiB', '256 KiB-1 MiB'."""
    if bucket <= 0:
        return "<= 1 KiB"
    low, high = _exact_size(bucket), _exact_size(4 * bucket)
    low_value, low_unit = low.split(" ")
    high_value, high_unit = high.split(" ")
    return f"{low_value}-{high_value} {high_unit}" if low_unit == high_unit else f"{low}-{high}"


def format_rate(bytes_per_s: float) -> str:
    """A rate in decimal units (nccl-tests' GB/s is 1e9 bytes/s) with three significant figures or so."""
    value, unit = bytes_per_s, "B/s"
    for scale, name in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
        if bytes_per_s >= scale:
            value, unit = bytes_per_s / scale, name
            break
    digits = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{digits}f} {unit}"


def format_share(ratio: float) -> str:
    """A share of a peak: '42%', '4.2%', '<0.1%'."""
    percent = 100 * ratio
    if 0 < percent < 0.1:
        return "<0.1%"
    return f"{percent:.1f}%" if percent < 10 else f"{percent:.0f}%"


@frozen
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


# busbw_by_op's threshold: smaller collectives measure latency, not bandwidth.
LARGE_BYTES = 64 * 1024


@frozen
class BandwidthSamples:
    """The measured collectives of one (op, size bucket, group size).

    Each list is sorted, or made of sorted runs (several ranks' samples): the medians then sort in
    linear time, where sorting a large run's samples three times over would be a cost to notice.
    """

    seconds: list[float]
    algbw: list[float]  # bytes/s
    busbw: list[float]  # bytes/s
    large_busbw: list[float]  # busbw of those of LARGE_BYTES or more
    total_bytes: int

    @classmethod
    def of(cls, seconds: list[float], sizes: list[int], factor: float) -> BandwidthSamples:
        """From each collective's time and size (in any order) and the group's busbw factor."""
        if min(sizes) == max(sizes):  # the usual case: one tensor's collectives
            # size / t falls as t grows (IEEE division is monotonic): one sort orders all three.
            size = sizes[0]
            seconds.sort()
            algbw = [size / t for t in reversed(seconds)]
            busbw = [a * factor for a in algbw]
            large = busbw if size >= LARGE_BYTES else []
        else:
            algbw = [size / t for size, t in zip(sizes, seconds, strict=True)]
            busbw = [a * factor for a in algbw]
            large = sorted(b for size, b in zip(sizes, busbw, strict=True) if size >= LARGE_BYTES)
            seconds.sort()
            algbw.sort()
            busbw.sort()
        return cls(seconds=seconds, algbw=algbw, busbw=busbw, large_busbw=large, total_bytes=sum(sizes))


SampleGroups = dict[tuple[str, int, int], BandwidthSamples]


def bandwidth_samples(columns: CollectiveColumns) -> SampleGroups:
    """Every measured collective's bandwidth (event_bandwidth), grouped by (op, size bucket, group
    size) in the order the groups first occur: computed once, read by bandwidth_table and busbw_by_op."""
    groups: dict[tuple[str, int, int], tuple[list[float], list[int], float]] = {}
    factors: dict[tuple[str, int], float | None] = {}
    buckets: dict[int, int] = {}
    measured = MEASURED_TIMINGS
    # event_bandwidth and array_bytes inlined: a call per event would double the cost of a million.
    for op, bytes_in, bytes_out, n, issue, complete, timing in zip(
            columns.op, columns.bytes_in, columns.bytes_out, columns.group_size, columns.issue_ns,
            columns.complete_ns, columns.timing, strict=True):
        if timing not in measured or complete is None:
            continue
        seconds = (complete - issue) / 1e9
        try:
            factor = factors[(op, n)]
        except KeyError:
            factor = factors[(op, n)] = bus_factor(op, n)
        size = bytes_out if op == "all_gather" else bytes_in if op == "reduce_scatter" else (
            bytes_in if bytes_in >= bytes_out else bytes_out)
        if seconds <= 0 or factor is None or size <= 0:
            continue
        bucket = buckets.get(size)
        if bucket is None:
            bucket = buckets[size] = size_bucket(size)
        group = groups.get((op, bucket, n))
        if group is None:
            group = groups[(op, bucket, n)] = ([], [], factor)
        group[0].append(seconds)
        group[1].append(size)
    return {key: BandwidthSamples.of(*group) for key, group in groups.items()}


def _concat(lists: Iterable[list[float]]) -> list[float]:
    out: list[float] = []
    for values in lists:
        out.extend(values)
    return out


def merge_samples(per_rank: Iterable[SampleGroups]) -> SampleGroups:
    """The groups of several ranks as one, in the order they first occur."""
    merged: dict[tuple[str, int, int], list[BandwidthSamples]] = {}
    for groups in per_rank:
        for key, samples in groups.items():
            merged.setdefault(key, []).append(samples)
    return {key: BandwidthSamples(
        seconds=_concat(s.seconds for s in parts), algbw=_concat(s.algbw for s in parts),
        busbw=_concat(s.busbw for s in parts), large_busbw=_concat(s.large_busbw for s in parts),
        total_bytes=sum(s.total_bytes for s in parts)) for key, parts in merged.items()}


def bandwidth_table(events: Iterable[CollectiveEvent], peak_busbw: float | None = None) -> tuple[BandwidthRow, ...]:
    """Median bandwidth per (op, size bucket, group size), by op, then size, then group size."""
    return table_of_samples(bandwidth_samples(CollectiveColumns.of(list(events))), peak_busbw)


def table_of_samples(groups: SampleGroups, peak_busbw: float | None = None) -> tuple[BandwidthRow, ...]:
    """bandwidth_table, from bandwidth_samples."""
    rows = []
    for (op, bucket, n), samples in groups.items():
        busbws = sorted(samples.busbw)
        median_busbw = statistics.median(busbws)
        rows.append(BandwidthRow(
            op=op, size_bucket_bytes=bucket, group_size=n, count=len(busbws),
            total_bytes=samples.total_bytes, median_time_s=statistics.median(samples.seconds),
            median_algbw=statistics.median(samples.algbw), median_busbw=median_busbw,
            busbw_p10=busbws[int(0.1 * (len(busbws) - 1))],
            peak_share=median_busbw / peak_busbw if peak_busbw else None,
        ))
    return tuple(sorted(rows, key=lambda r: (r.op, r.size_bucket_bytes, r.group_size)))


def busbw_by_op(events: Iterable[CollectiveEvent]) -> dict[str, float]:
    """Median busbw per op, weighted toward what moves bytes: the median over collectives >= 64 KiB
    when there are any (small ones measure latency, not bandwidth)."""
    return busbw_by_op_of_samples(bandwidth_samples(CollectiveColumns.of(list(events))))


def busbw_by_op_of_samples(groups: SampleGroups) -> dict[str, float]:
    """busbw_by_op, from bandwidth_samples."""
    by_op: dict[str, tuple[list[float], list[float]]] = {}
    for (op, _, _), samples in groups.items():
        large, every = by_op.setdefault(op, ([], []))
        large.extend(samples.large_busbw)
        every.extend(samples.busbw)
    return {op: statistics.median(large or every) for op, (large, every) in by_op.items()}
