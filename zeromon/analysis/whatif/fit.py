"""Collective times fitted from the recording itself: t = alpha + beta x bus bytes, per op and group size.

t is measured from the moment the collective could start (its last rank's issue, or the completion of
the collective before it in the group, whichever is later) to its completion on each rank, so that
waiting for a late peer is not counted as transfer. Bus bytes are nccl-tests' S times the op's bus
factor (zeromon.analysis.bandwidth), the quantity a link's bandwidth divides.

The fit is least squares (the mean, not the median: a step's time is a sum of its collectives', and
a sum follows their mean), on the collectives whose completion was measured exactly on the host.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import field

from zeromon.analysis.bandwidth import size_bucket
from zeromon.analysis.whatif.chain import CollectiveKey, CollectiveShape, RankChain
from zeromon.model.classes import frozen

# Sizes within this ratio of each other are one size: a single size cannot split alpha from beta.
_ONE_SIZE_SPREAD = 1.25


@frozen
class CollectiveFit:
    op: str
    group_size: int
    alpha_s: float  # the fixed cost of one collective
    beta_s_per_byte: float  # the time per bus byte: 1 / bus bandwidth
    samples: int
    min_bus_bytes: float  # the sizes the fit saw
    max_bus_bytes: float
    residual_pct: float  # the mean absolute residual of seconds(), as a share of the mean time
    single_size: bool  # one size seen: the line is a bandwidth through the origin (alpha 0)
    # size bucket (zeromon.analysis.bandwidth.size_bucket of the bus bytes) -> (mean bus bytes, mean seconds):
    # within the sizes seen, the time is the bucket's mean moved along the line's slope, which follows the
    # measured times where a line through sizes from 256 B to 1 MiB does not (the line, alpha + beta x bytes,
    # extrapolates and gives the transfer's share to a bandwidth change)
    buckets: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    line_residual_pct: float = 0.0  # the same of the line alone

    def seconds(self, bus_bytes: float) -> float:
        bucket = self.buckets.get(size_bucket(int(bus_bytes)))
        if bucket is None:
            return self.line_seconds(bus_bytes)
        mean_bytes, mean_s = bucket
        return max(0.0, mean_s + self.beta_s_per_byte * (bus_bytes - mean_bytes))

    def line_seconds(self, bus_bytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * bus_bytes

    @property
    def busbw_bytes_per_s(self) -> float | None:
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else None


def channel_order(chain: RankChain) -> list[CollectiveKey]:
    """The rank's collectives in the order it issued them: the order its group runs them in."""
    return sorted(chain.issue_ns, key=chain.issue_ns.__getitem__)


def measured_transfers(chains: Sequence[RankChain],
                       fits: Mapping[tuple[str, int], CollectiveFit] | None = None,
                       ) -> dict[CollectiveKey, dict[int, float]]:
    """Each collective's time on each rank, from when it could start, where its group's completions around it
    were measured. A collective whose end was not measured (async, found already done when waited on) leaves the
    next one's start unknown: without ``fits`` neither is a sample; with them, the collectives between two
    measured completions share the time between them in proportion to their fitted times (the group ran them
    one after the other)."""
    transfers: dict[CollectiveKey, dict[int, float]] = {}
    known: dict[int, int] = {}  # group size -> when its last collective completed on every rank, measured
    pending: dict[int, list[CollectiveKey]] = defaultdict(list)  # its collectives since, their ends unknown
    for key in channel_order(chains[0]) if chains else ():
        issues = [c.issue_ns[key] for c in chains if key in c.issue_ns]
        done = {c.rank: c.complete_ns[key] for c in chains if key in c.complete_ns}
        group = key[2]
        if len(issues) < len(chains):
            continue
        if len(done) < len(chains):
            pending[group].append(key)
            continue
        run = [*pending.pop(group, []), key]
        previous, known[group] = known.get(group, 0), max(done.values())
        if len(run) > 1 and fits is None:
            continue  # its start unknown
        weights = ([shape_seconds(fits, chains[0].shapes[k]) or 0.0 for k in run]
                   if fits is not None and len(run) > 1 else [1.0])
        start = max(max(c.issue_ns[run[0]] for c in chains), previous)
        if len(run) > 1 and (start < max(min(c.issue_ns[k] for c in chains) for k in run) or sum(weights) <= 0):
            run, weights = [key], [1.0]  # the group idled between them, or nothing to share by: the last one alone
            start = max(max(issues), previous)
        total = sum(weights)
        for k, weight in zip(run, weights, strict=True):
            transfers[k] = {rank: max(0, complete - start) / 1e9 * weight / total for rank, complete in done.items()}
    return transfers


def transfer_samples(chains: Sequence[RankChain],
                     transfers: Mapping[CollectiveKey, Mapping[int, float]] | None = None,
                     ) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """(bus bytes, seconds) of each measured collective on each rank, by (op, group size)."""
    samples: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for key, by_rank in (measured_transfers(chains) if transfers is None else transfers).items():
        shape = chains[0].shapes[key]
        samples[(shape.op, shape.group_size)].extend((shape.bus_bytes, t) for t in by_rank.values())
    return samples


def fit_line(points: Sequence[tuple[float, float]], op: str = "", group_size: int = 0) -> CollectiveFit:
    """Least squares of seconds on bus bytes, kept physical: a negative alpha refits through the origin; a
    single size, or a slope that is not positive, takes the mean time as a bandwidth through the origin."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    single = min(xs) <= 0 or max(xs) / min(xs) < _ONE_SIZE_SPREAD
    alpha, beta = 0.0, 0.0
    if not single:
        sxx = sum((x - mean_x) ** 2 for x in xs)
        beta = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
        alpha = mean_y - beta * mean_x
        if beta <= 0:
            single = True
        elif alpha < 0:
            alpha, beta = 0.0, sum(x * y for x, y in points) / sum(x * x for x in xs)
    if single:
        alpha, beta = (0.0, mean_y / mean_x) if mean_x > 0 else (mean_y, 0.0)
    by_bucket: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for x, y in points:
        by_bucket[size_bucket(int(x))].append((x, y))
    buckets = {b: (statistics.fmean(x for x, _ in p), statistics.fmean(y for _, y in p)) for b, p in by_bucket.items()}
    fit = CollectiveFit(op=op, group_size=group_size, alpha_s=alpha, beta_s_per_byte=beta, samples=len(points),
                        min_bus_bytes=min(xs), max_bus_bytes=max(xs), residual_pct=0.0, single_size=single,
                        buckets=buckets)
    share = (lambda error: 100.0 * error / mean_y) if mean_y > 0 else (lambda error: 0.0)
    return dataclasses.replace(
        fit, residual_pct=share(statistics.fmean(abs(y - fit.seconds(x)) for x, y in points)),
        line_residual_pct=share(statistics.fmean(abs(y - fit.line_seconds(x)) for x, y in points)))


def fit_collectives(chains: Sequence[RankChain],
                    transfers: Mapping[CollectiveKey, Mapping[int, float]] | None = None,
                    ) -> dict[tuple[str, int], CollectiveFit]:
    """A fit per (op, group size) seen with measured completions."""
    return {(op, size): fit_line(points, op, size)
            for (op, size), points in sorted(transfer_samples(chains, transfers).items()) if points}


def shape_seconds(fits: Mapping[tuple[str, int], CollectiveFit], shape: CollectiveShape) -> float | None:
    fit = fits.get((shape.op, shape.group_size))
    return None if fit is None else fit.seconds(shape.bus_bytes)
