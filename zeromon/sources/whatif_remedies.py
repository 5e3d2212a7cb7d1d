"""The remedies `zeromon report` offers that `zeromon whatif` answers, each with its predicted step time and peak
memory: the run's recordings read once more, every such remedy replayed from them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zeromon.analysis.findings import Finding
from zeromon.analysis.remedy_changes import remedy_change
from zeromon.analysis.whatif import ChangeError, Refused, WhatIf, parse_change, what_if
from zeromon.model.codec import RunDirs
from zeromon.model.run_files import rank_files, read_run
from zeromon.model.units import format_bytes

# The replay holds every rank's chain at once, and reads the recordings again: past these, `zeromon whatif` is the
# way (the report says so), so that a large run's report costs what it did.
MAX_RANKS = 64
MAX_RECORDING_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class RemedyPrediction:
    remedy: str
    change: str
    answer: WhatIf | None
    refused: str | None  # why there is no answer

    @property
    def step_delta_s(self) -> float | None:
        if self.answer is None or self.answer.predicted.median_step_s is None \
                or self.answer.replay.median_step_s is None:
            return None
        return self.answer.predicted.median_step_s - self.answer.replay.median_step_s

    @property
    def peak_delta_bytes(self) -> int | None:
        if self.answer is None or self.answer.predicted.peak_tracked_bytes is None \
                or self.answer.measured.peak_tracked_bytes is None:
            return None
        return self.answer.predicted.peak_tracked_bytes - self.answer.measured.peak_tracked_bytes

    def to_dict(self, capacity: int | None) -> dict[str, Any]:
        answer = self.answer
        replay = answer.replay.median_step_s if answer is not None else None
        peak = answer.predicted.peak_tracked_bytes if answer is not None else None
        return {"remedy": self.remedy, "change": self.change, "refused": self.refused,
                "step_delta_s": self.step_delta_s,
                "step_delta_pct": None if self.step_delta_s is None or not replay else 100.0 * self.step_delta_s / replay,
                "peak_tracked_delta_bytes": self.peak_delta_bytes,
                "left_bytes": capacity - peak if capacity and peak is not None else None,
                "replay_error_pct": answer.replay_error_pct if answer is not None else None}


def answered_remedies(findings: Sequence[Finding]) -> list[tuple[str, str]]:
    """(remedy, change) of each remedy among the findings that `zeromon whatif` answers, once each."""
    seen: dict[str, str] = {}
    for finding in findings:
        for remedy in finding.remedies:
            change = remedy_change(remedy)
            if change is not None and remedy not in seen:
                seen[remedy] = change
    return list(seen.items())


def remedy_predictions(run: RunDirs, findings: Sequence[Finding], ranks: int) -> list[RemedyPrediction]:
    remedies = answered_remedies(findings)
    if not remedies:
        return []
    size = sum(path.stat().st_size for path in rank_files(run))
    if ranks > MAX_RANKS or size > MAX_RECORDING_BYTES:
        why = (f"past {MAX_RANKS} ranks" if ranks > MAX_RANKS
               else f"for a recording of {format_bytes(size)} (past {format_bytes(MAX_RECORDING_BYTES)})")
        return [RemedyPrediction(remedy, change, None, f"not predicted in the report {why}: "
                                                       f"`zeromon whatif RUN_DIR {change}` answers it")
                for remedy, change in remedies]
    recordings = read_run(run)
    out = []
    for remedy, change in remedies:
        try:
            out.append(RemedyPrediction(remedy, change, what_if(recordings, [parse_change(change)]), None))
        except (Refused, ChangeError) as exc:
            out.append(RemedyPrediction(remedy, change, None, str(exc)))
    return out
