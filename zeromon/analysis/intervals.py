"""Interval arithmetic on [start, end) pairs of integer nanoseconds: unions, intersections, clipping.

Everything is O(n log n) (one sort), so a million collectives stay cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union as sorted, disjoint intervals (touching intervals are joined; empty ones dropped)."""
    merged: list[Interval] = []
    # The interval being grown lives in two locals: no tuple is made until it is complete.
    cur_start = cur_end = 0
    growing = False
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if growing and start <= cur_end:
            if end > cur_end:
                cur_end = end
        else:
            if growing:
                merged.append((cur_start, cur_end))
            cur_start, cur_end, growing = start, end, True
    if growing:
        merged.append((cur_start, cur_end))
    return merged


def total(merged: Sequence[Interval]) -> int:
    """Length of disjoint intervals."""
    return sum(end - start for start, end in merged)


def union_length(intervals: Iterable[Interval]) -> int:
    return total(merge(intervals))


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two sorted disjoint interval lists (outputs of merge), by a two-pointer walk."""
    out: list[Interval] = []
    if not a or not b:
        return out
    i = j = 0
    a_start, a_end = a[0]
    b_start, b_end = b[0]
    while True:
        start = a_start if a_start > b_start else b_start
        end = a_end if a_end < b_end else b_end
        if start < end:
            out.append((start, end))
        if a_end < b_end:
            i += 1
            if i == len(a):
                return out
            a_start, a_end = a[i]
        else:
            j += 1
            if j == len(b):
                return out
            b_start, b_end = b[j]


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


def union_of_columns(starts: Any, ends: Any, lo: int | None = None, hi: int | None = None) -> int:
    """union_length of the intervals [starts[i], ends[i]) (numpy int64 arrays, or sequences of ints), clipped to
    [lo, hi) where given (lo < hi): the same integer, in numpy's loops. Sorted by start, each interval adds what
    it reaches past the furthest end before it; an empty one (end <= start) adds nothing. Cheaper than merge's
    loop from a few dozen intervals up (the recorder's step summaries: tests/test_step_overlap_fast.py). numpy is
    imported at the first call: the agent's modules load in every process `zeromon run` starts, most of which never
    summarize a step (torch has imported it by then in those that do)."""
    import numpy as np

    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if not len(s):
        return 0
    if lo is not None and hi is not None:
        s = np.clip(s, lo, hi)
        e = np.clip(e, lo, hi)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)  # the furthest end up to each interval
    before = np.empty_like(reach)
    before[0] = s[0]
    before[1:] = reach[:-1]
    return int(np.maximum(e - np.maximum(s, before), 0).sum())
