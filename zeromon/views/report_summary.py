"""`zeromon report` for many ranks, as plain data: the worst ranks first, the rest in one line.

At 1,024 ranks a line per rank and a finding per rank bury the few that matter. The text report
shows the ``shown`` ranks furthest from the run's typical rank (by OOM risk, then by how far their
step time or exposed share is from the median), says how far the rest are from the median at most,
and lists the ranks that made their peers wait (the findings, one entry per problem across ranks, are
zeromon.analysis.finding_groups'). ``zeromon report --all-ranks`` and ``--json`` keep every rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from zeromon.analysis.findings import Severity
from zeromon.analysis.recording_summary import RANKS_SHOWN
from zeromon.analysis.report import RankReport, RunReport
from zeromon.analysis.stragglers import RankArrival
from zeromon.model.classes import frozen


@frozen
class Spread:
    """How far the ranks not shown are from the median of all ranks, at most (shares of the median)."""

    median_step_s: float | None
    step_within: float | None  # |step time - median| / median, the largest of the rest
    median_exposed_share: float | None
    exposed_within: float | None  # |exposed share - median|, in points of share, the largest of the rest
    risks: dict[str, int]  # the rest's OOM risk: how many ranks of each


@frozen
class RanksShown:
    shown: tuple[RankReport, ...]  # worst first
    rest: int  # ranks not shown
    spread: Spread
    stragglers: tuple[RankArrival, ...]  # the ranks whose lateness cost their peers the most, most first
    stragglers_rest: int  # ranks that made their peers wait, not shown


def risk_of(r: RankReport) -> Severity | None:
    """The OOM risk; None where there was nothing to forecast (no memory samples, no OOM recorded)."""
    return None if r.peak_memory is None and r.oom.risk is Severity.OK else r.oom.risk


def _distance(value: float | None, median: float | None, relative: bool) -> float:
    if value is None or median is None:
        return 0.0
    if not relative:
        return abs(value - median)
    return abs(value - median) / median if median > 0 else 0.0


def summarise_ranks(report: RunReport, shown: int = RANKS_SHOWN) -> RanksShown:
    ranks = report.ranks
    median_step = _median([r.median_step_s for r in ranks])
    median_share = _median([r.median_exposed_share for r in ranks])

    def badness(r: RankReport) -> tuple[float, float, int]:
        risk = risk_of(r)
        off = max(_distance(r.median_step_s, median_step, True), _distance(r.median_exposed_share, median_share, False))
        return (-(risk.rank if risk is not None else 0), -off, r.rank)

    ordered = sorted(ranks, key=badness)
    head, tail = tuple(ordered[:shown]), ordered[shown:]
    risks: dict[str, int] = {}
    for r in tail:
        name = (risk_of(r) or Severity.OK).value
        risks[name] = risks.get(name, 0) + 1
    spread = Spread(
        median_step_s=median_step, median_exposed_share=median_share, risks=risks,
        step_within=max((_distance(r.median_step_s, median_step, True) for r in tail), default=None),
        exposed_within=max((_distance(r.median_exposed_share, median_share, False) for r in tail), default=None))
    waiting = sorted((a for a in report.imbalance.ranks if a.steady_caused_wait_s > 0),
                     key=lambda a: (-a.steady_caused_wait_s, a.rank))
    return RanksShown(shown=head, rest=len(tail), spread=spread, stragglers=tuple(waiting[:shown]),
                       stragglers_rest=max(0, len(waiting) - shown))


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
