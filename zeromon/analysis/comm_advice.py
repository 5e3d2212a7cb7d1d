"""Findings about exposed communication, with the remedies that apply to the run's framework."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.lint_schema import STATIC_SCHEMA
from zeromon.analysis.step_overlap import StepOverlap, overlap_of_summary
from zeromon.model.events import RunInfo, StepSummary, steps_label

# Exposed communication worth a finding: a share of step time, with the overlap ratio below a bar.
EXPOSED_SHARE_WARN = 0.10
EXPOSED_SHARE_CRITICAL = 0.30
OVERLAP_RATIO_POOR = 0.5
# Exposed communication that is partly waiting for a late peer: said from this share of it on, with a
# named straggler put first among the remedies (prefetching cannot hide a peer's lateness); from the
# second share on, jitter put first where no rank is a straggler.
WAITING_SHARE_NOTED = 0.2
WAITING_SHARE_MOSTLY = 0.5
# reduce_bucket_size and allgather_bucket_size when a config sets neither (elements).
DEEPSPEED_BUCKET_DEFAULT = 5e8
RESHARD_REMEDY = ("keep reshard_after_forward=True only where memory needs it: False removes the backward re-gather "
                  "(at the cost of holding unsharded parameters)")
MICRO_BATCH_REMEDY = "a larger micro-batch (or gradient accumulation) gives each collective more compute to hide behind"


def _deepspeed_overlap_comm(knobs: dict[str, object], stage: int | None) -> bool:
    """overlap_comm as DeepSpeed runs it: the run's value (the agent records the engine's resolved config),
    else DeepSpeed's default for the stage, the one zeromon lint applies (true for stage 3 alone)."""
    value = knobs.get("overlap_comm")
    if value is not None:
        return bool(value)
    stage = stage if stage is not None else knobs.get("stage")  # type: ignore[assignment]
    return isinstance(stage, int) and 0 <= stage <= 3 and STATIC_SCHEMA.overlap_comm_default[stage]


def overlap_remedies(info: RunInfo | None) -> tuple[str, ...]:
    framework = info.framework if info else "unknown"
    knobs = dict(info.knobs) if info else {}
    remedies: list[str] = []
    if info is not None and info.backend == "gloo":
        remedies.append("on CPU with gloo there are no streams: collectives overlap only when issued "
                        "asynchronously, so expect low overlap here; measure on the GPUs that matter")
    if framework == "fsdp2":
        if not knobs.get("forward_prefetch_units"):
            remedies.append("prefetch the next unit's all-gather in forward: "
                            "block.set_modules_to_forward_prefetch([next_block])")
        if knobs.get("reshard_after_forward") is not False:  # True, or "mixed": the root alone kept gathered
            remedies.append(RESHARD_REMEDY)
    elif framework == "fsdp1":
        if not knobs.get("forward_prefetch"):
            remedies.append("forward_prefetch=True: issue the next all-gather before this unit's forward")
        if knobs.get("backward_prefetch") not in ("BACKWARD_PRE",):
            remedies.append("backward_prefetch=BackwardPrefetch.BACKWARD_PRE")
        if knobs.get("limit_all_gathers") is False:
            remedies.append("limit_all_gathers=True keeps the CPU from running too far ahead of the GPU")
    elif framework == "deepspeed":
        if not _deepspeed_overlap_comm(knobs, info.zero_stage if info is not None else None):
            remedies.append("zero_optimization.overlap_comm: true (overlaps gradient reduction with backward)")
        if knobs.get("stage") == 3 or info is not None and info.zero_stage == 3:
            prefetch = knobs.get("stage3_prefetch_bucket_size")
            now = f" (now {prefetch:g})" if isinstance(prefetch, int | float) else ""
            remedies.append(f"raise stage3_prefetch_bucket_size{now} so parameters are gathered ahead of use")
        small = {key: value for key in ("reduce_bucket_size", "allgather_bucket_size")
                 if isinstance(value := knobs.get(key), int | float) and value < DEEPSPEED_BUCKET_DEFAULT}
        if small:  # at DeepSpeed's default or above, larger buckets are seldom what is missing
            sizes = ", ".join(f"{key} {value:g}" for key, value in small.items())
            remedies.append(f"larger buckets ({sizes}; DeepSpeed's default is {DEEPSPEED_BUCKET_DEFAULT:g}): "
                            "fewer, larger collectives")
    elif framework == "ddp":
        remedies.append("bucket_cap_mb: buckets that are too large start reducing late in backward")
    remedies.append(MICRO_BATCH_REMEDY)
    return tuple(remedies)


def overlap_findings(rank: int, steps: Sequence[StepOverlap], info: RunInfo | None) -> tuple[Finding, ...]:
    """A poor-overlap finding for the rank, from its steps after the first (warm-up)."""
    timed = [s for s in steps if s.timed]  # a GPU step not timed on the device says nothing of its overlap
    steady = [s for s in timed if s.step >= 1] or timed
    shares = [s.exposed_share for s in steady if s.exposed_share is not None]
    if not shares:
        return ()
    ratios = [r for s in steady if (r := s.overlap_ratio) is not None]
    return overlap_findings_of_medians(rank, statistics.median(shares),
                                       statistics.median(ratios) if ratios else None,
                                       statistics.median(s.exposed_comm_s for s in steady),
                                       statistics.median(s.step_s for s in steady), info,
                                       window=(steady[0].step, steady[-1].step))


def overlap_findings_of_medians(rank: int, share: float | None, ratio: float | None, exposed_s: float | None,
                                step_s: float | None, info: RunInfo | None,
                                window: tuple[int, int] | None = None) -> tuple[Finding, ...]:
    """overlap_findings from the medians over the steps after the first (a report's RankReport has them):
    of the exposed share, the overlap ratio, the exposed seconds and the step time; ``window``: the first
    and last of those steps (recording indices), which the evidence names."""
    if share is None or exposed_s is None or step_s is None:
        return ()
    if share < EXPOSED_SHARE_WARN or (ratio is not None and ratio >= OVERLAP_RATIO_POOR):
        return ()
    exposed_ms, step_ms = exposed_s * 1e3, step_s * 1e3
    evidence = [f"median{_over(window)}: exposed communication {exposed_ms:.1f} ms of a {step_ms:.1f} ms step "
                f"({share:.0%})"]
    if ratio is not None:
        evidence.append(f"median overlap ratio {ratio:.0%} (overlapped / all communication time)")
    return (Finding(
        kind="poor_overlap", severity=Severity.CRITICAL if share >= EXPOSED_SHARE_CRITICAL else Severity.WARN,
        title=f"rank {rank}: {share:.0%} of step time is exposed communication",
        rank=rank, evidence=tuple(evidence), remedies=overlap_remedies(info),
        metrics={"exposed_share": share, "exposed_comm_s": exposed_ms / 1e3,
                 **({"overlap_ratio": ratio} if ratio is not None else {})},
    ),)


def _over(window: tuple[int, int] | None) -> str:
    """' over steps 2-20 (the first left out)': the steps a median was taken over, numbered from 1 as
    training scripts log them, so that it is not read as the last step's figure."""
    if window is None:
        return ""
    return f" over {steps_label(*window)}" + (" (the first left out)" if window[0] >= 1 else "")


def overlap_findings_of_summaries(rank: int, steps: Sequence[StepSummary],
                                  info: RunInfo | None) -> tuple[Finding, ...]:
    """The same finding from the overlap the agent computed per step (StepSummary's comp_s,
    overlap_s, exposed_comm_s): what live clients have, with no collective events."""
    overlaps = [o for s in steps if (o := overlap_of_summary(s)) is not None]
    return overlap_findings(rank, overlaps, info) if overlaps else ()


def with_waiting_for_peers(finding: Finding, exposed_s: float, waited_s: float,
                           late_ranks: Sequence[int]) -> Finding:
    """A poor-overlap finding that says how much of the rank's exposed communication was waiting for
    a later peer (stragglers' waited time), and, where a straggler is named, that the late rank is the
    first fix. ``exposed_s``: the rank's exposed communication over the steps the waiting was matched in
    (the steps after the first); ``late_ranks``: the ranks found to be stragglers."""
    if finding.kind != "poor_overlap" or exposed_s <= 0 or waited_s <= 0:
        return finding
    share = min(1.0, waited_s / exposed_s)
    if share < WAITING_SHARE_NOTED:
        return finding
    late = [r for r in late_ranks if r != finding.rank]
    whom = (f"rank{'s' if len(late) > 1 else ''} " + ", ".join(map(str, late))) if late else "later peers"
    evidence = (*finding.evidence, f"{waited_s:.3f} s of its {exposed_s:.3f} s of exposed communication "
                                   f"({share:.0%}) was waiting for {whom} to reach the collective")
    remedies = finding.remedies
    if late:  # a named straggler explains this much: it comes before any prefetching
        # No figure of this rank's in the remedy, not even "most" or "some" of it (the evidence has the share):
        # ranks waiting for the same straggler share a remedy, and are one entry where findings are grouped
        # (finding_groups).
        remedies = (f"part of it is waiting for {whom} (the evidence says how much): make "
                    f"{'that rank' if len(late) == 1 else 'them'} faster first (see the straggler finding); "
                    "prefetching or resharding cannot hide a peer's lateness", *remedies)
    elif share >= WAITING_SHARE_MOSTLY:
        remedies = ("most of it is waiting for peers, though no single rank is a straggler (the ranks take turns "
                    "being late): look for per-rank jitter first (data loading, host contention, uneven batches); "
                    "prefetching or resharding cannot hide a peer's lateness", *remedies)
    return dataclasses.replace(finding, evidence=evidence, remedies=remedies,
                               metrics={**finding.metrics, "waited_for_peers_s": waited_s,
                                        "waited_share_of_exposed": share})
