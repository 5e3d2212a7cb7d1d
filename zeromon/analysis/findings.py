"""What the analyses conclude, in one shape every client shows: a finding with evidence and remedies."""

from __future__ import annotations

import re
from dataclasses import field
from enum import Enum

from zeromon.model.classes import frozen


class Severity(str, Enum):
    OK = "ok"
    INFO = "info"
    WARN = "warn"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _ORDER[self]


_ORDER = {Severity.OK: 0, Severity.INFO: 1, Severity.WARN: 2, Severity.CRITICAL: 3}


@frozen
class Finding:
    """One conclusion: what (kind, title), how bad, where (rank, step), why (evidence), what to do."""

    kind: str  # "oom_risk", "poor_overlap", "straggler", "memory_imbalance", ...
    severity: Severity
    title: str
    rank: int | None = None  # None: the whole job
    step: int | None = None
    evidence: tuple[str, ...] = ()
    remedies: tuple[str, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)  # the numbers behind it, for machines

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "severity": self.severity.value, "title": self.title, "rank": self.rank,
                "step": self.step, "evidence": list(self.evidence), "remedies": list(self.remedies),
                "metrics": dict(self.metrics)}


def worst(findings: list[Finding] | tuple[Finding, ...]) -> Severity:
    return max((f.severity for f in findings), key=lambda s: s.rank, default=Severity.OK)


def finding_heading(finding: Finding) -> str:
    """The finding's title, with its rank added where the title does not name it: every client
    shows a rank's finding with the rank, once."""
    if finding.rank is None or re.search(rf"\brank {finding.rank}\b", finding.title):
        return finding.title
    return f"{finding.title} (rank {finding.rank})"
