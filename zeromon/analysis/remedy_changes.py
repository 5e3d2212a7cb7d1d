"""The remedies the findings offer that `zeromon whatif` answers, and the change each is answered as
(zeromon.analysis.whatif.changes)."""

from __future__ import annotations

from zeromon.analysis.comm_advice import MICRO_BATCH_REMEDY, RESHARD_REMEDY
from zeromon.analysis.memory_remedies import FULL_SHARD_REMEDY, RESHARD_MEMORY_REMEDY, higher_stage_remedy

_EXACT = {RESHARD_REMEDY: "reshard_after_forward=false", MICRO_BATCH_REMEDY: "micro_batch=x2",
          RESHARD_MEMORY_REMEDY: "reshard_after_forward=true", higher_stage_remedy(1): "zero_stage=2"}


def remedy_change(remedy: str) -> str | None:
    """The change a remedy is answered as, None where `zeromon whatif` does not answer it."""
    if remedy in _EXACT:
        return _EXACT[remedy]
    if remedy.startswith(f"{FULL_SHARD_REMEDY} (now SHARD_GRAD_OP)"):
        return "sharding_strategy=FULL_SHARD"
    return None
