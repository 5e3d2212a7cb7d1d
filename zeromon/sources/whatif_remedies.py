"""The remedies `zeromon report` offers that `zeromon whatif` answers, each with its predicted step time and peak
memory: the run's recordings read once more, every such remedy replayed from them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zeromon.analysis.findings import Finding
from zeromon.analysis.remedy_changes import remedy_change
from zeromon.analysis.whatif import ChangeError, Refused, WhatIf, parse_change, what_if
from zeromon.model.classes import frozen
from zeromon.model.codec import RunDirs
from zeromon.model.run_files import rank_files, read_run
from zeromon.model.units import format_bytes

# The replay holds every rank's chain at once, and reads the recordings again: past these, `zeromon whatif` is the
# way (the report says so), so that a large run's report costs what it did.
MAX_RANKS = 64
MAX_RECORDING_BYTES = 64 * 2**20


@frozen
class RemedyPrediction:
    remedy: str
    change: str
    answer: WhatIf | None
    refused: str | None  # why there is no answer

    def to_dict(self, capacity: int | None) -> dict[str, Any]:
        answer = self.answer
        return {"remedy": self.remedy, "change": self.change, "refused": self.refused,
                "step_delta_s": answer.step_delta_s if answer else None,
                "step_delta_pct": answer.step_change_pct if answer else None,
                "peak_tracked_delta_bytes": answer.peak_delta_bytes if answer else None,
                "left_bytes": answer.left_bytes(capacity) if answer else None,
                "replay_error_pct": answer.replay_error_pct if answer else None}


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
