"""Step times across ranks: how much they differ per step, who is slowest, each rank's median.

A large run has millions of durations: a dict per step of a dict per rank (``step_times_python``)
costs the process that combines the ranks several times the time and memory of one ranks x steps
matrix in numpy (the engine chosen against DuckDB and Polars: zeromon.analysis.step_table's docstring).
``step_times_python`` is the per-value reference the matrix must equal (tests/test_fleet_report.py),
and the path for ranks whose recordings repeat a step number (the matrix needs one value a step).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

from zeromon.model.classes import frozen

# A rank's step numbers, their durations (s) and which kept their detail (None: all of them).
RankSteps = tuple[Sequence[int], Sequence[float], Sequence[int] | None]


@frozen
class AcrossRanks:
    """Over the steps from ``first_step`` on."""

    skews: list[float]  # (slowest - fastest) / median step time, of each step every rank summarized
    slowest: dict[int, int]  # rank -> how often it had the longest step, ranks in the order first slowest
    median_step_s: dict[int, float]  # per rank
    detail_step_s: dict[int, float]  # per rank, the sum of its step times in the steps that kept their detail
    last_step: int | None


def step_times_across_ranks(ranks: Sequence[int], arrays: Sequence[RankSteps], first_step: int) -> AcrossRanks:
    """The step times of ``ranks`` (in that order), each rank's (steps, seconds, detail)."""
    import numpy as np

    steps = [np.asarray(a[0], dtype=np.int64) for a in arrays]
    # Steps in rising order (as recorded) are distinct without np.unique's sort, a cost every rank would pay.
    if any(not (np.diff(s) > 0).all() and len(np.unique(s)) != len(s) for s in steps):
        return step_times_python(ranks, arrays, first_step)
    seconds = [np.asarray(a[1], dtype=np.float64) for a in arrays]
    later = [s >= first_step for s in steps]
    median_step = {r: float(np.median(sec[keep])) for r, sec, keep in zip(ranks, seconds, later, strict=True)
                   if keep.any()}
    detail_s = {}
    for r, sec, keep, (_, _, detail) in zip(ranks, seconds, later, arrays, strict=True):
        if keep.any():
            mask = keep if detail is None else keep & np.asarray(detail, dtype=bool)
            detail_s[r] = float(sum(sec[mask].tolist()))  # Python's sum, in step order: as the reference
    present = [s[keep] for s, keep in zip(steps, later, strict=True)]
    last = max((int(s.max()) for s in present if len(s)), default=None)
    skews: list[float] = []
    slowest: dict[int, int] = {}
    if len(ranks) > 1 and all(len(s) for s in present):
        common = present[0]
        same = all(np.array_equal(s, common) for s in present[1:])  # every rank summarized the same steps
        for s in () if same else present[1:]:
            common = common[np.isin(common, s)]  # in the first rank's order, as the reference's dict
        if len(common):
            matrix = np.empty((len(ranks), len(common)))
            for i, (s, sec, keep) in enumerate(zip(steps, seconds, later, strict=True)):
                if same:
                    matrix[i] = sec[keep]
                    continue
                order = np.argsort(s)
                matrix[i] = sec[order[np.searchsorted(s[order], common)]]
            median = np.median(matrix, axis=0)
            spread = matrix.max(axis=0) - matrix.min(axis=0)
            skews = (spread[median > 0] / median[median > 0]).tolist()
            slow = matrix.argmax(axis=0)  # the first of equal maxima, in rank order: as max() of a dict
            firsts, counts = np.unique(slow, return_index=True)[1], np.bincount(slow, minlength=len(ranks))
            for i in sorted(firsts.tolist()):
                slowest[ranks[int(slow[i])]] = int(counts[slow[i]])
    return AcrossRanks(skews=skews, slowest=slowest, median_step_s=median_step, detail_step_s=detail_s, last_step=last)


def step_times_python(ranks: Sequence[int], arrays: Sequence[RankSteps], first_step: int) -> AcrossRanks:
    """step_times_across_ranks, one value at a time."""
    durations: dict[int, dict[int, float]] = defaultdict(dict)
    own_steps: dict[int, list[float]] = defaultdict(list)
    own_detail: dict[int, list[float]] = defaultdict(list)
    for rank, (steps, seconds, detail) in zip(ranks, arrays, strict=True):
        for i, (step, duration) in enumerate(zip(steps, seconds, strict=True)):
            if step >= first_step:
                durations[step][rank] = duration
                own_steps[rank].append(duration)
                if detail is None or detail[i]:
                    own_detail[rank].append(duration)
    skews = []
    slowest: dict[int, int] = defaultdict(int)
    for per_rank in durations.values():
        if len(per_rank) == len(ranks) > 1:
            values = list(per_rank.values())
            median = statistics.median(values)
            if median > 0:
                skews.append((max(values) - min(values)) / median)
            slowest[max(per_rank, key=lambda r: per_rank[r])] += 1
    return AcrossRanks(skews=skews, slowest=dict(slowest),
                     median_step_s={r: statistics.median(own_steps[r]) for r in ranks if own_steps[r]},
                     detail_step_s={r: sum(own_detail[r]) for r in ranks if own_steps[r]},
                     last_step=max(durations, default=None))
