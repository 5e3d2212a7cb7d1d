"""How likely a rank's record is by chance: the test behind every finding that names one rank of many.

A finding such as "rank 1 is the one its peers wait for" is a claim about a sample of steps. Between
two ranks one of them is always last, so a rank being last in most steps is only worth a warning
when a rank no different from the others would seldom do as well. The test, per kind of finding:

- each step is one trial (the collectives of a step are not independent: one late forward makes a
  rank last at all of them), and a rank "wins" a step when it is the one the finding is about in that
  step (the rank its peers waited for most; the rank with the longest step);
- if no rank differs from the others, each of ``n`` ranks wins a step with probability 1/n, and a
  rank's count of wins over ``m`` steps is binomial(m, 1/n): the chance of a count at least as high is
  the exact upper tail (a one-sided binomial test, the sign test when n = 2);
- a report tests every rank, so the chance that *some* rank looks this good is larger: Holm's
  step-down correction over the ranks (at least as powerful as Bonferroni, with the same guarantee).

The thresholds bound how often a healthy run raises a finding (tests/bench/bench_finding_noise.py
measures it; docs/report.md gives the figures). The exact tail is a few lines with math.lgamma, so
zeromon needs no statistics library for it (scipy is not a dependency, and would be ~100 MB for one
function).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

# The chance of a finding in a healthy run that a report accepts, per kind of statistical finding
# (the straggler and step-skew tests): two kinds at 1 in 200 each keep a healthy report's false
# alarms under 1 in 100. Critical needs a chance under 1 in 10,000 (and a larger effect, per kind).
WARN_CHANCE = 0.005
CRITICAL_CHANCE = 1e-4


def binomial_tail(k: int, m: int, p: float) -> float:
    """P(X >= k) for X ~ binomial(m, p): the chance of at least ``k`` wins in ``m`` trials."""
    if k <= 0:
        return 1.0
    if k > m or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    head = math.lgamma(m + 1)
    terms = [head - math.lgamma(i + 1) - math.lgamma(m - i + 1) + i * log_p + (m - i) * log_q
             for i in range(k, m + 1)]
    top = max(terms)
    # Summed in log space: the terms of a long run are far below the smallest float.
    return min(1.0, math.exp(top) * math.fsum(math.exp(t - top) for t in terms))


def holm(chances: Mapping[int, float], untested: int = 0) -> dict[int, float]:
    """Holm's adjusted chances: for each key, the chance that any of the tests looks at least as
    unusual by chance (monotone, capped at 1). ``untested``: more tests in the family whose chance is
    1 (ranks that won nothing): they sort last, so they only widen the correction."""
    total = len(chances) + untested
    adjusted: dict[int, float] = {}
    running = 0.0
    for i, key in enumerate(sorted(chances, key=chances.__getitem__)):
        running = max(running, min(1.0, (total - i) * chances[key]))
        adjusted[key] = running
    return adjusted


def wins_chance(wins: Mapping[int, int], trials: int, ranks: int) -> dict[int, float]:
    """Each rank's adjusted chance of winning as many of ``trials`` steps as it did, were every one of
    ``ranks`` ranks equally likely to win each step (``wins`` may leave out ranks that won none)."""
    if ranks < 2 or trials <= 0:
        return {rank: 1.0 for rank in wins}
    raw = {rank: binomial_tail(count, trials, 1.0 / ranks) for rank, count in wins.items()}
    return holm(raw, untested=max(0, ranks - len(raw)))


def odds_in_words(chance: float) -> str:
    """'less than once in 10,000 runs', 'about once in 40 runs', 'in about 1 run of 3'."""
    if chance < 1e-4:
        return "less than once in 10,000 runs"
    if chance <= 0.5:
        return f"about once in {_round_odds(1.0 / chance):,} runs"
    return f"in about {chance:.0%} of runs"


def _round_odds(odds: float) -> int:
    """Two significant figures: 'once in 1,300 runs', not 'once in 1,347 runs'."""
    digits = max(0, int(math.floor(math.log10(odds))) - 1)
    return int(round(odds, -digits))
