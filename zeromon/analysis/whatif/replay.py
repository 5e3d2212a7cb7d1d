"""The ranks' chains run together: each collective completes at the last rank's issue (or when the
collective before it in its group completes, whichever is later) plus its duration, and a rank's bound
segment ends there ([Note: the replay's chain] in zeromon.analysis.whatif.chain).

A rank's time blocked on a collective splits in two: before the collective could start it waited for a
later peer (or for the group's previous collective), after it the transfer ran. Overlap cannot hide the
first; a faster network does not shorten it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import field

from zeromon.analysis.whatif.chain import (
    AGENT,
    COMPUTE,
    ISSUE,
    STEP_END,
    STEP_START,
    SYNC,
    WAIT,
    CollectiveKey,
    RankChain,
    Segment,
)
from zeromon.model.classes import frozen, mutable


class ChainsDoNotMatch(ValueError):
    """The ranks' collectives cannot be replayed together: one waits for a collective a peer never issues."""


@mutable
class ReplayStep:
    step: int
    start_s: float = 0.0
    end_s: float = 0.0
    compute_s: float = 0.0  # compute and zeromon's own work
    waiting_s: float = 0.0  # blocked before its collective could start: a later peer, the group's queue
    transfer_s: float = 0.0  # blocked while its collective ran, and in the calls that issued async ones

    @property
    def step_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def exposed_s(self) -> float:
        return self.waiting_s + self.transfer_s


@frozen
class Replay:
    steps: Mapping[int, tuple[ReplayStep, ...]]  # rank -> its steps in order
    collective_start_s: Mapping[CollectiveKey, float] = field(default_factory=dict)

    def median_of(self, value: str) -> float | None:
        """The median over ranks of each rank's median of a ReplayStep's ``value`` over the steps after the first
        (all of them where there is none), as `zeromon report` computes the measured ones."""
        medians = []
        for rank_steps in self.steps.values():
            chosen = [s for s in rank_steps if s.step >= 1] or list(rank_steps)
            if chosen:
                medians.append(statistics.median(float(getattr(s, value)) for s in chosen))
        return statistics.median(medians) if medians else None


def replay(chains: Sequence[RankChain], seconds: Mapping[CollectiveKey, Mapping[int, float]]) -> Replay:
    """Run the chains together, each collective lasting ``seconds[key][rank]`` on each rank from the moment it
    could start; times from the earliest start."""
    origin = min(c.start_ns for c in chains)
    runners = [_Runner(c, (c.start_ns - origin) / 1e9) for c in chains]
    participants: dict[CollectiveKey, int] = {}
    for c in chains:
        for key in c.issue_ns:
            participants[key] = participants.get(key, 0) + 1
    queue = _issue_order(chains[0])
    issued: dict[CollectiveKey, list[float]] = {}
    done: dict[tuple[CollectiveKey, int], float] = {}
    starts: dict[CollectiveKey, float] = {}
    channel_free: dict[int, float] = {}
    head = 0
    while True:
        moved = any([r.run(issued, done, starts) for r in runners])
        while head < len(queue) and len(issued.get(queue[head], ())) >= participants[queue[head]]:
            key = queue[head]
            start = max(max(issued[key]), channel_free.get(key[2], 0.0))
            starts[key] = start
            for rank, duration in seconds[key].items():
                done[(key, rank)] = start + max(0.0, duration)
            channel_free[key[2]] = max((done[(key, r)] for r in seconds[key]), default=start)
            head += 1
            moved = True
        if all(r.finished for r in runners):
            return Replay(steps={r.chain.rank: tuple(r.steps) for r in runners}, collective_start_s=starts)
        if not moved:
            stuck = next(r for r in runners if not r.finished)
            raise ChainsDoNotMatch(f"rank {stuck.chain.rank} waits for {_key_words(stuck.segment.key)}, which "
                                   "not every rank issued in the same order")


def _issue_order(chain: RankChain) -> list[CollectiveKey]:
    """The collectives in the order the chain issues them: the order its group runs them in."""
    return [s.key for s in chain.segments if s.kind in (SYNC, ISSUE) and s.key is not None]


def _key_words(key: CollectiveKey | None) -> str:
    if key is None:
        return "a collective"
    step, op, size, k = key
    return f"step {step + 1}'s {op} #{k + 1} (group of {size})"


class _Runner:
    """One rank going along its chain as far as the collectives' completions allow."""

    def __init__(self, chain: RankChain, clock_s: float) -> None:
        self.chain = chain
        self.clock = clock_s
        self.position = 0
        self.steps: list[ReplayStep] = []
        self.current = ReplayStep(step=-1)
        self.issued_here: set[CollectiveKey] = set()

    @property
    def finished(self) -> bool:
        return self.position >= len(self.chain.segments)

    @property
    def segment(self) -> Segment:
        return self.chain.segments[self.position]

    def run(self, issued: dict[CollectiveKey, list[float]], done: Mapping[tuple[CollectiveKey, int], float],
            starts: Mapping[CollectiveKey, float]) -> bool:
        moved = False
        segments = self.chain.segments
        while self.position < len(segments):
            s = segments[self.position]
            kind = s.kind
            if kind in (COMPUTE, AGENT):
                self.clock += s.seconds
                self.current.compute_s += s.seconds
            elif kind == ISSUE:
                self._issue(s.key, issued)
                self.clock += s.seconds
                self.current.transfer_s += s.seconds
            elif kind in (SYNC, WAIT):
                if kind == SYNC:
                    self._issue(s.key, issued)
                finish = done.get((s.key, self.chain.rank))  # type: ignore[arg-type]
                if finish is None:
                    return moved
                end = max(self.clock, finish)
                waited_until = min(end, max(self.clock, starts[s.key]))  # type: ignore[index]
                self.current.waiting_s += waited_until - self.clock
                self.current.transfer_s += end - waited_until
                self.clock = end
            elif kind == STEP_START:
                self.current = ReplayStep(step=s.step, start_s=self.clock)
            elif kind == STEP_END:
                self.current.end_s = self.clock
                self.steps.append(self.current)
                self.current = ReplayStep(step=s.step + 1, start_s=self.clock)
            self.position += 1
            moved = True
        return moved

    def _issue(self, key: CollectiveKey | None, issued: dict[CollectiveKey, list[float]]) -> None:
        if key is not None and key not in self.issued_here:
            self.issued_here.add(key)
            issued.setdefault(key, []).append(self.clock)
