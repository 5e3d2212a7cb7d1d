"""Findings across ranks, one entry per problem: what every surface lists (the report's text, JSON and HTML, the
dashboard, the TUI, `zeromon live`, the trainers' loggers).

At 256 ranks a poor overlap is 256 findings with the same evidence and remedies. ``group_findings`` puts together
the findings of one kind, severity and remedies (another remedy says another cause: it is its own entry), and
each group says its ranks compactly ("ranks 0-255 but 17"), the spread of its headline figure over them
("72-80%"), its worst rank (the one to open) with that rank's evidence, and the remedies once. A finding about
the whole job (no rank) stays an entry of its own.

A kind's headline figure is the number its severity follows, read from the finding's ``metrics`` (HEADLINES):
the exposed share, the steps left to capacity, the share of capacity; the worst rank is the one where it is
worst (the highest, or for steps left the fewest), the lowest rank on a tie or where the kind has none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from zeromon.analysis.findings import Finding, Severity, finding_heading
from zeromon.analysis.oom import duration_words
from zeromon.model.classes import frozen
from zeromon.model.units import format_bytes, rank_ranges

__all__ = ["HEADLINES", "RANK_PARTS_SHOWN", "FindingGroup", "Headline", "group_findings", "group_key", "spread_text"]

# The parts of a group's ranks its title writes before "…" (every rank stays in ``ranks`` and the JSON).
RANK_PARTS_SHOWN = 8


def _one(unit: str, value: float) -> str:
    if unit == "share":
        return f"{value:.0%}"
    if unit == "seconds":
        return duration_words(value)
    return format_bytes(value) if unit == "bytes" else f"{value:,.0f}"


def spread_text(unit: str, low: float, high: float) -> str:
    """'72-80%', '8.00-8.41 MiB', '988.27 MiB to 1.02 GiB', '32-35 s', '3-12', or one value where both read the
    same."""
    a, b = _one(unit, low), _one(unit, high)
    if a == b:
        return a
    if unit == "share":
        return f"{a.rstrip('%')}-{b}"
    if unit in ("bytes", "seconds"):
        a_value, _, a_unit = a.partition(" ")
        return f"{a_value}-{b}" if b.endswith(f" {a_unit}") else f"{a} to {b}"
    return f"{a}-{b}"


@frozen
class Headline:
    """A kind's headline figure: the metrics key, its unit ("share", "bytes", "seconds" or "count"), the group's
    title around its spread ('{spread} of step time is exposed communication'), whether a lower value is the worse
    (steps left to capacity), the other figures the title spreads ((metrics key, unit), each '{key}' in
    ``words``) and how one rank's value reads beside its rank ('{value}': '80%'; '~{value} steps to capacity')."""

    key: str
    unit: str
    words: str
    lower_is_worse: bool = False
    also: tuple[tuple[str, str], ...] = ()
    value_words: str = "{value}"

    def fits(self, finding: Finding) -> bool:
        return self.key in finding.metrics and all(key in finding.metrics for key, _ in self.also)

    def title(self, findings: Sequence[Finding]) -> str:
        def spread(key: str, unit: str) -> str:
            values = [f.metrics[key] for f in findings]
            return spread_text(unit, min(values), max(values))

        return self.words.format(spread=spread(self.key, self.unit), **{k: spread(k, u) for k, u in self.also})


# Each kind's headline figures, the first that every finding of a group has taken (a kind's findings made live
# and from a recording carry different keys: the straggler's caused_share and gap_share).
HEADLINES: dict[str, tuple[Headline, ...]] = {
    "poor_overlap": (Headline("exposed_share", "share", "{spread} of step time is exposed communication"),),
    "straggler": (Headline("caused_share", "share", "the other ranks waited for them, {spread} of their step time"),
                  Headline("gap_share", "share", "the other ranks wait for them, {spread} of a step")),
    "step_skew": (Headline("median_skew", "share", "step times differ by {spread} across ranks"),),
    "memory_imbalance": (Headline("spread", "share", "memory peaks {spread} above the lowest rank's"),),
    "peak_near_capacity": (Headline("share", "share", "peak memory at {spread} of capacity"),),
    "memory_growth": (Headline("steps_to_capacity", "count", "memory grows {growth_bytes_per_step} per step: "
                               "capacity in ~{spread} steps (~{seconds_to_capacity})", lower_is_worse=True,
                               also=(("growth_bytes_per_step", "bytes"), ("seconds_to_capacity", "seconds")),
                               value_words="~{value} steps to capacity"),
                      Headline("steps_to_capacity", "count",
                               "memory grows {growth_bytes_per_step} per step: capacity in ~{spread} steps",
                               lower_is_worse=True, also=(("growth_bytes_per_step", "bytes"),),
                               value_words="~{value} steps to capacity"),
                      Headline("growth_bytes_per_step", "bytes", "memory grows {spread} per step")),
    "optimizer_state_pending": (
        Headline("predicted_share", "share",
                 "the first optimizer step's optimizer state: predicted peak {spread} of capacity"),
        Headline("pending_optimizer_bytes", "bytes", "the first optimizer step will add {spread} of optimizer state")),
    "zero3_gather_bound": (Headline("predicted_peak_bytes", "bytes",
                                    "ZeRO-3's parameter gathers may raise the peak to {spread}"),),
    "alloc_retries": (Headline("num_alloc_retries", "count", "the allocator retried {spread} times",
                               value_words="{value} retries"),),
    "fragmentation": (Headline("fragmentation_bytes", "bytes", "allocator fragmentation: {spread} reserved but unused"),),
    "oom_recorded": (Headline("num_ooms", "count", "out of memory: {spread} OOMs recorded", value_words="{value} OOMs"),),
}


def group_key(finding: Finding) -> tuple[object, ...]:
    """What findings must share to be one entry: kind, severity and remedies. A whole-job finding is its own
    entry: only one that reads the same (title and evidence too) joins it."""
    if finding.rank is None:
        return ("job", finding.kind, finding.severity, finding.title, finding.evidence, finding.remedies)
    return ("ranks", finding.kind, finding.severity, finding.remedies)


@frozen
class FindingGroup:
    """Findings of one kind, severity and remedies on one or more ranks (or one finding about the whole job)."""

    findings: tuple[Finding, ...]  # every finding of the group, in the order given
    worst: Finding  # the one to open: its headline figure the worst (the lowest rank on a tie)
    ranks: tuple[int, ...]  # sorted, each once; () for a finding about the whole job
    headline: Headline | None  # the figure the spread is of; None where the kind has none
    low: float | None  # the figure's spread over the group
    high: float | None

    @property
    def key(self) -> tuple[object, ...]:
        return group_key(self.worst)

    @property
    def kind(self) -> str:
        return self.worst.kind

    @property
    def severity(self) -> Severity:
        return self.worst.severity

    @property
    def remedies(self) -> tuple[str, ...]:
        return self.worst.remedies

    @property
    def evidence(self) -> tuple[str, ...]:
        """The worst rank's evidence."""
        return self.worst.evidence

    @property
    def worst_rank(self) -> int | None:
        return self.worst.rank

    @property
    def spread(self) -> str | None:
        """'72-80%': the headline figure over the group's findings."""
        if self.headline is None or self.low is None or self.high is None:
            return None
        return spread_text(self.headline.unit, self.low, self.high)

    @property
    def worst_figure(self) -> str | None:
        """The headline figure of the worst rank: '80%', '~93 steps to capacity'."""
        if self.headline is None:
            return None
        return self.headline.value_words.format(value=_one(self.headline.unit, self.worst.metrics[self.headline.key]))

    def worst_words(self) -> str | None:
        """'worst: rank 3 (80%); the evidence is rank 3's', for a group of several ranks (None for one)."""
        if len(self.ranks) <= 1:
            return None
        rank = self.worst.rank
        figure = f" ({self.worst_figure})" if self.worst_figure is not None else ""
        return f"worst: rank {rank}{figure}; the evidence is rank {rank}'s"

    def ranks_text(self, most: int | None = None) -> str:
        """'ranks 0-255 but 17', 'rank 5'; '' for a whole-job finding. ``most``: rank_ranges' parts at most."""
        return rank_ranges(self.ranks, most) if self.ranks else ""

    @property
    def title(self) -> str:
        """One finding's heading; for several ranks, their ranks and the spread, naming no single rank."""
        if len(self.ranks) <= 1:
            return finding_heading(self.worst)
        ranks = self.ranks_text(RANK_PARTS_SHOWN)
        if self.headline is not None:
            return f"{ranks}: {self.headline.title(self.findings)}"
        rank = self.worst.rank
        title = re.sub(rf"^rank {rank}: ", "", self.worst.title)
        if re.search(rf"\brank {rank}\b", title):  # named inside: the title is the worst rank's own
            return f"{ranks}: {self.kind.replace('_', ' ')} (on rank {rank}: {title})"
        return f"{ranks}: {title}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity.value, "title": self.title,
                "ranks": list(self.ranks), "ranks_text": self.ranks_text(), "worst_rank": self.worst_rank,
                "worst_figure": self.worst_figure,
                "figure": None if self.headline is None else {
                    "metric": self.headline.key, "low": self.low, "high": self.high, "text": self.spread},
                "evidence": list(self.evidence), "remedies": list(self.remedies), "findings": len(self.findings)}


def _headline(group: list[Finding]) -> Headline | None:
    return next((h for h in HEADLINES.get(group[0].kind, ()) if all(h.fits(f) for f in group)), None)


def _made(group: list[Finding]) -> FindingGroup:
    headline = _headline(group)
    ranks = tuple(sorted({f.rank for f in group if f.rank is not None}))
    if headline is None:
        worst = min(group, key=lambda f: f.rank if f.rank is not None else -1)
        return FindingGroup(tuple(group), worst, ranks, None, None, None)
    values = [f.metrics[headline.key] for f in group]
    sign = 1 if headline.lower_is_worse else -1
    worst = min(group, key=lambda f: (sign * f.metrics[headline.key], f.rank if f.rank is not None else -1))
    return FindingGroup(tuple(group), worst, ranks, headline, min(values), max(values))


def _order(group: FindingGroup) -> tuple[int, float, str, int]:
    """Worst severity first; then the whole job, then the most ranks; then the kind and the worst rank."""
    reach = float("inf") if not group.ranks else len(group.ranks)
    return (-group.severity.rank, -reach, group.kind, group.worst_rank if group.worst_rank is not None else -1)


def group_findings(findings: Iterable[Finding]) -> tuple[FindingGroup, ...]:
    """The findings as one entry per problem across ranks (the module's docstring), the worst severity first,
    then the entries that reach the most ranks."""
    groups: dict[tuple[object, ...], list[Finding]] = {}
    for finding in findings:
        groups.setdefault(group_key(finding), []).append(finding)
    return tuple(sorted((_made(group) for group in groups.values()), key=_order))
