"""The run as the what-if holds it before any change (its chains, fits, measured times and memory), and what
one recording cannot answer."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from zeromon.analysis.tracked_memory import TrackedSample
from zeromon.analysis.whatif.chain import CollectiveKey, RankChain
from zeromon.analysis.whatif.fit import CollectiveFit
from zeromon.model.classes import frozen

# A collective whose size is this many times outside the sizes its fit saw is not predicted.
SIZE_RANGE = 2.0
class Refused(ValueError):
    """What one recording cannot answer, and why."""


@frozen
class RunModel:
    """The run as the model holds it, before any change."""

    chains: tuple[RankChain, ...]
    fits: Mapping[tuple[str, int], CollectiveFit]
    transfers: Mapping[CollectiveKey, Mapping[int, float]]
    memory: Mapping[int, tuple[TrackedSample, ...]]  # rank -> its tracked samples


SecondsOf = Callable[[RunModel], dict[CollectiveKey, dict[int, float]]]
