"""The memory the categories account for, sample by sample, and its peak: one definition for `zeromon
report --json`'s ``peak_tracked_bytes`` and `zeromon whatif`'s, so that a prediction is held against a
real run figure by figure.

A sample's tracked bytes are the sum of its categories, ``other`` (on a GPU, the allocator's remainder)
left out, as the OOM forecast counts them. The agent walks every category every few steps and counts the
activations in every sample: a sample that is no walk takes the other categories from the last walk.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from zeromon.model.classes import frozen
from zeromon.model.events import MemorySample

UNTRACKED = "other"


@frozen
class TrackedSample:
    step: int
    phase: str  # MemorySample.phase: the phase that just ended, or forward_peak / backward_peak
    categories: Mapping[str, int]  # without "other"
    # The walk its categories other than its own came from: its step, phase and moment (the sample's own when it
    # is a walk). What a change does to a category depends on when the walk counted it.
    walk_step: int = 0
    walk_phase: str = ""
    walk_t_ns: int = 0

    @property
    def total(self) -> int:
        return sum(v for v in self.categories.values() if v > 0)


def tracked_samples(samples: Sequence[MemorySample]) -> Iterator[TrackedSample]:
    """Each sample from the first walk on, with every category it holds or the last walk held."""
    walk: MemorySample | None = None
    for sample in samples:
        if sample.walked:
            walk = sample
        if walk is None:
            continue
        categories = {k: v for k, v in walk.categories.items() if k != UNTRACKED} | {
            k: v for k, v in sample.categories.items() if k != UNTRACKED}
        yield TrackedSample(sample.step, sample.phase, categories, walk.step, walk.phase, walk.t_ns)


def highest(samples: Iterable[TrackedSample]) -> TrackedSample | None:
    """The sample whose tracked bytes are the highest (the first of equals); None without one."""
    return max(samples, key=lambda s: s.total, default=None)


def peak_tracked(samples: Sequence[MemorySample]) -> TrackedSample | None:
    """The recording's highest sample; None before the agent's first walk."""
    return highest(tracked_samples(samples))


def peak_tracked_bytes(samples: Sequence[MemorySample]) -> int | None:
    peak = peak_tracked(samples)
    return None if peak is None else peak.total
