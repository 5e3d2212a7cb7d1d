"""Interval arithmetic on [start, end) pairs of integer nanoseconds: unions, intersections, clipping.

Everything is O(n log n) (one sort), so a million collectives stay cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as sorted, disjoint intervals (touching intervals are joined; empty ones dropped)."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total(merged: Sequence[Interval]) -> int:
    """Length of disjoint intervals."""
    return sum(end - start for start, end in merged)


def union_length(intervals: Iterable[Interval]) -> int:
    return total(merge(intervals))


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two sorted disjoint interval lists (outputs of merge), by a two-pointer walk."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """a minus b, both sorted and disjoint."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= end:
                break
            k += 1
        if cur < end:
            out.append((cur, end))
    return out


def clip(merged: Sequence[Interval], window: Interval) -> list[Interval]:
    """The parts of disjoint intervals inside [window)."""
    lo, hi = window
    return [(max(s, lo), min(e, hi)) for s, e in merged if e > lo and s < hi]
