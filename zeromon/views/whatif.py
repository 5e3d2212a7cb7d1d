"""`zeromon whatif`'s answer as the dashboard draws it: a step's waterfall (compute, transfer, waiting for peers)
and the memory by category at the peak, measured beside replayed beside predicted, as plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from zeromon.analysis.whatif import ChangeError, Refused, WhatIf, parse_change, what_if
from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen
from zeromon.model.codec import RunDirs
from zeromon.model.run_files import read_run, run_name
from zeromon.model.units import format_bytes


@frozen
class StepBar:
    label: str  # "measured", "replay", "predicted"
    parts: Mapping[str, float]  # seconds: "compute", "transfer", "waiting" (measured: "compute", "exposed")
    step_s: float | None


@frozen
class MemoryBar:
    label: str
    categories: Mapping[str, int]  # bytes at the peak
    total: int | None


@frozen
class WhatIfView:
    changes: str
    steps: tuple[StepBar, ...]
    memory: tuple[MemoryBar, ...]
    capacity: int | None
    summary: str  # one sentence: the predicted step and peak against the measured
    replay_error_pct: float | None


CHANGES_HINT = ("a change is one of reshard_after_forward=false|true, sharding_strategy=SHARD_GRAD_OP|FULL_SHARD, "
                "zero_stage=1|2, comm=hidden, bandwidth=xK, micro_batch=xK, grad_accum=N, world_size=N "
                "(docs/whatif.md)")


def what_if_of_run(run: RunDirs, change_texts: Sequence[str]) -> WhatIf:
    """The answer, or a ZeromonError whose message says what is wrong with the change or what the recording
    cannot support: the command's and the dashboard's one way to ask."""
    try:
        changes = [parse_change(text) for text in change_texts if text.strip()]
    except ChangeError as exc:
        raise ZeromonError(f"change {exc}", hint=CHANGES_HINT) from exc
    if not changes:
        raise ZeromonError("give a change (NAME=VALUE)", hint=CHANGES_HINT)
    try:
        return what_if(read_run(run), changes)
    except ChangeError as exc:
        raise ZeromonError(f"change {exc}", hint=CHANGES_HINT) from exc
    except Refused as exc:
        raise ZeromonError(f"{run_name(run)}: cannot answer from this recording: {exc}",
                           hint="docs/whatif.md says what one recording can answer") from exc


def delta_words(delta_bytes: int) -> str:
    """'+3.03 MiB', '-2.67 MiB'."""
    return f"{'+' if delta_bytes >= 0 else '-'}{format_bytes(abs(delta_bytes))}"


def capacity_words(left_bytes: int | None) -> str | None:
    """What a predicted peak leaves of the capacity, the same words in every front end; None: no capacity."""
    if left_bytes is None:
        return None
    return f"fits with {format_bytes(left_bytes)} left" if left_bytes >= 0 else \
        f"does not fit: {format_bytes(-left_bytes)} over"


def what_if_view(answer: WhatIf) -> WhatIfView:
    measured, replay, predicted = answer.measured, answer.replay, answer.predicted
    steps = (
        StepBar("measured", {"compute": measured.compute_s or 0.0, "exposed": measured.exposed_s or 0.0},
                measured.median_step_s),
        *(StepBar(label, {"compute": f.compute_s or 0.0, "transfer": f.transfer_s or 0.0,
                          "waiting": f.waiting_s or 0.0}, f.median_step_s)
          for label, f in (("replay", replay), ("predicted", predicted))),
    )
    memory = tuple(MemoryBar(label, dict(f.peak_categories), f.peak_tracked_bytes)
                   for label, f in (("measured", measured), ("predicted", predicted)))
    return WhatIfView(changes=", ".join(c.text for c in answer.changes), steps=steps, memory=memory,
                      capacity=answer.capacity_bytes, summary=_summary(answer),
                      replay_error_pct=answer.replay_error_pct)


def _summary(answer: WhatIf) -> str:
    replay, predicted = answer.replay.median_step_s, answer.predicted.median_step_s
    words = [", ".join(c.text for c in answer.changes) + ":"]
    if replay and predicted is not None and answer.step_change_pct is not None:
        words.append(f"a step {predicted * 1e3:.1f} ms against the replay's {replay * 1e3:.1f} ms "
                     f"({answer.step_change_pct:+.1f}%)")
    error = answer.replay_error_pct
    if error is not None:
        words.append(f"(the replay is {error:+.1f}% from the measured run)")
    before, after = answer.measured.peak_tracked_bytes, answer.predicted.peak_tracked_bytes
    if before is not None and after is not None:
        words.append(f"; peak tracked memory {format_bytes(before)} -> {format_bytes(after)}")
        fits = capacity_words(answer.left_bytes())
        if fits:
            words.append(f"({fits})")
    return " ".join(words).replace(" ;", ";")
