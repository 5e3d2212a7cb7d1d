"""The test against chance behind the straggler and step-skew findings: the exact binomial tail, Holm's
correction over ranks, and a fair coin flagged at most as often as the threshold allows."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from zeromon.analysis.chance import WARN_CHANCE, binomial_tail, holm, odds_in_words, wins_chance


@given(st.integers(1, 60), st.integers(0, 61), st.floats(0.01, 0.99))
def test_the_binomial_tail_is_the_sum_of_its_terms(m: int, k: int, p: float) -> None:
    exact = sum(math.comb(m, i) * p**i * (1 - p) ** (m - i) for i in range(k, m + 1))
    assert math.isclose(binomial_tail(k, m, p), min(1.0, exact), rel_tol=1e-9, abs_tol=1e-15)


@settings(deadline=None, max_examples=40)
@given(st.integers(1, 200), st.integers(2, 1024), st.sampled_from([WARN_CHANCE, 1e-4, 0.05]))
def test_ranks_no_different_from_the_others_are_flagged_at_most_at_the_threshold(m: int, ranks: int,
                                                                               alpha: float) -> None:
    """Each rank's test is valid: under chance, the counts whose tail (times the ranks, the correction's
    largest factor) is below alpha happen at most alpha / ranks of the time, so any rank at most alpha."""
    p = 1.0 / ranks
    flagged = next((k for k in range(m + 1) if ranks * binomial_tail(k, m, p) < alpha), None)
    if flagged is not None:
        size = sum(math.comb(m, i) * p**i * (1 - p) ** (m - i) for i in range(flagged, m + 1))
        assert size <= alpha / ranks * (1 + 1e-9)


def test_a_fair_coin_over_many_runs_flags_a_rank_less_often_than_the_threshold() -> None:
    rng = random.Random(35)
    runs, flagged = 4_000, 0
    for _ in range(runs):
        steps = 19
        ones = sum(rng.random() < 0.5 for _ in range(steps))
        chance = wins_chance({0: steps - ones, 1: ones}, steps, 2)
        flagged += min(chance.values()) < WARN_CHANCE
    # At most the threshold, give or take three standard deviations of a sample this size.
    assert flagged <= runs * WARN_CHANCE + 3 * math.sqrt(runs * WARN_CHANCE)


def test_holm_is_bonferroni_for_the_smallest_and_never_below_the_raw_chance() -> None:
    raw = {0: 0.001, 1: 0.02, 2: 0.04, 3: 0.5}
    adjusted = holm(raw)
    assert adjusted[0] == 4 * 0.001
    assert adjusted[1] == 3 * 0.02 and adjusted[2] == 2 * 0.04 and adjusted[3] == 0.5
    assert all(adjusted[r] >= raw[r] for r in raw)
    # Ranks that won nothing still count in the family.
    assert holm({0: 1e-5}, untested=1023)[0] == 1024 * 1e-5


def test_a_coin_flip_between_two_ranks_is_not_a_straggler_and_eighteen_of_nineteen_is() -> None:
    """The issue's case: 10 of 19 steps is chance itself; 18 of 19 is not."""
    assert wins_chance({1: 10, 0: 9}, 19, 2)[1] == 1.0
    strong = wins_chance({1: 18, 0: 1}, 19, 2)[1]
    assert strong < 1e-4 and odds_in_words(strong) == "less than once in 10,000 runs"
    assert odds_in_words(1 / 1347) == "about once in 1,300 runs"
    assert odds_in_words(0.7) == "in about 70% of runs"
