"""Interval arithmetic and the overlap definition, against brute force on random intervals."""

from __future__ import annotations

import random

import pytest

from zeromon.analysis.intervals import clip, intersect, merge, subtract, total, union_length
from zeromon.analysis.overlap import comm_comp_overlap


def _covered(intervals: list[tuple[int, int]], lo: int, hi: int) -> set[int]:
    return {t for s, e in intervals for t in range(max(s, lo), min(e, hi))}


@pytest.mark.parametrize("seed", range(20))
def test_against_brute_force(seed: int) -> None:
    rng = random.Random(seed)

    def draw() -> list[tuple[int, int]]:
        out = []
        for _ in range(rng.randint(0, 12)):
            s = rng.randint(0, 200)
            out.append((s, s + rng.randint(0, 40)))
        return out

    a, b = draw(), draw()
    ma, mb = merge(a), merge(b)
    sa, sb = _covered(a, 0, 10**6), _covered(b, 0, 10**6)
    assert union_length(a) == len(sa)
    assert total(intersect(ma, mb)) == len(sa & sb)
    assert total(subtract(ma, mb)) == len(sa - sb)
    assert total(clip(ma, (50, 120))) == len(_covered(a, 50, 120))
    result = comm_comp_overlap(a, b, window=(0, 300))
    assert result.comm_s * 1e9 == pytest.approx(len(sa))
    assert result.overlap_s * 1e9 == pytest.approx(len(sa & sb))
    assert result.exposed_comm_s * 1e9 == pytest.approx(len(sa - sb))
    assert result.idle_s * 1e9 == pytest.approx(300 - len(sa | sb))


def test_ratio_and_share() -> None:
    # comm 0..100, compute 50..300 within a 400 ns step: half the communication is hidden.
    result = comm_comp_overlap([(0, 100)], [(50, 300)], window=(0, 400))
    assert result.overlap_ratio == pytest.approx(0.5)
    assert result.exposed_comm_s == pytest.approx(50e-9)
    assert result.exposed_share == pytest.approx(50 / 400)
    assert comm_comp_overlap([], [(0, 5)]).overlap_ratio is None
