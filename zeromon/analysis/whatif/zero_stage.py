"""DeepSpeed's ZeRO stage as a change (``zero_stage=2`` from stage 1, ``zero_stage=1`` from stage 2): what DeepSpeed
issues and holds at each stage ([Note: DeepSpeed's ZeRO stages as recorded]), applied to a run's chains and memory
samples; and why the other moves are refused.

[Note: DeepSpeed's ZeRO stages as recorded]
DeepSpeed 0.19 on gloo (fp32 parameters, a torch AdamW, no accumulation, no offload), per step, as zeromon records it:
- Stages 1 and 2 issue the same collectives: one all-reduce of the gradients per reduce bucket
  (``reduce_bucket_size`` elements; ``grad_all_reduce``) in the backward; in the optimizer phase a 4-byte all-reduce
  (the overflow check) and the all-gather of the updated parameters (``param_all_gather``: every parameter). Stage 2
  reduces each bucket as it fills, from its gradient hooks inside the backward; stage 1 all of them at the
  backward's end (``reduce_gradients``), its buckets filled in parameter order (their sizes differ, not their sum).
- Memory, as the agent's walk counts it: both hold every parameter and their partition of the optimizer's state.
  Stage 2 copies each gradient into its bucket's buffer (``contiguous_gradients``: ``reduce_bucket_size`` elements,
  allocated at the backward's first gradient and released after the step), so its backward holds the whole buffer
  (the gradients are views of it: the walk counts it as ``unsharded_grads``) where stage 1 holds the model's own
  gradients, every one of them at the backward's end (the ZeRO paper's gΨ, zeromon.analysis.planner).
- Stage 3 issues another set: each module's parameters gathered as the forward reaches it (those of at most
  ``stage3_param_persistence_threshold`` elements kept, and gathered one by one after each update), the gradients
  reduce-scattered per bucket. Which parameters each module holds is not in a recording; and the gradients'
  all-reduce of stages 1 and 2 is not in a stage-3 recording, whose reduce-scatters do not time it (on gloo a
  reduce-scatter of an array takes about 1.5x its all-reduce). Neither way is answered.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

from zeromon.analysis.planner import PlanInputs, plan_stage
from zeromon.analysis.tracked_memory import TrackedSample
from zeromon.analysis.whatif.chain import COMPUTE, RankChain, Segment
from zeromon.analysis.whatif.changes import Change, ChangeError
from zeromon.analysis.whatif.model import SIZE_RANGE, Refused
from zeromon.model.classes import frozen
from zeromon.model.events import Phase, RunInfo, ZeroMeaning

# The gradients' bytes per element in the runs this version answers (fp32 parameters: their gradients and the
# bucket's buffer are fp32 too).
_FP32_BYTES = 4
_BACKWARD_WALK = "backward_peak"  # the walk of the backward's highest moment (zeromon_agent's memory watch)


@frozen
class StageMove:
    """A ZeRO stage change as one recording supports it."""

    before: int
    after: int
    params: int  # Ψ: the parameters, as the optimizer's all-gather of them moves them
    bucket_bytes: int  # the reduce bucket's buffer: reduce_bucket_size fp32 elements
    every_gradient_bytes: int  # what ZeRO-1 holds at the backward's end: the planner's gΨ at stage 1
    gradient_partition_bytes: int  # the rank's partition of the gradients: the planner's g⌈Ψ/N⌉ at stage 2

    @property
    def buckets(self) -> int:
        """How many buckets the gradients fill (each one all-reduce): more than one, and ZeRO-2's backward
        holds its gradient partition besides its bucket, as each full bucket is reduced into it."""
        return -(-self.every_gradient_bytes // self.bucket_bytes)


def stage_move(change: Change, info: RunInfo | None, chain: RankChain, world: int) -> StageMove:
    """The move ``change`` asks of this run; a ChangeError where it is not this run's to make, Refused where the
    recording cannot support it (docs/whatif.md)."""
    framework = info.framework if info is not None else "unknown"
    if info is None or framework != "deepspeed":
        raise ChangeError(f"{change.text!r}: zero_stage is DeepSpeed's; this run is {framework}" + {
            "fsdp2": " (FSDP2: reshard_after_forward)", "fsdp1": " (FSDP1: sharding_strategy)"}.get(framework, ""))
    before, after = info.zero_stage, int(change.value)
    if before is None:
        raise Refused(f"{change.text!r}: the recording does not say the run's ZeRO stage")
    if after == before:
        raise ChangeError(f"{change.text!r}: this run is at ZeRO stage {before} already")
    if 3 in (before, after):
        raise Refused(f"{change.text!r}: " + (_from_stage3(chain) if before == 3 else _to_stage3()))
    if 0 in (before, after):
        raise ChangeError(f"{change.text!r}: from stage {before} to {after} is not answered yet; 1 to 2 and back are")
    _refuse_unmeasured_setups(change, info)
    params = _gathered_params_bytes(chain) // _FP32_BYTES
    if not params:
        raise Refused(f"{change.text!r}: the recording shows no all-gather of the updated parameters, by which "
                      "their size is known")
    inputs = PlanInputs(params=params, gpus_per_node=world, dtype="fp32", optimizer="adam")
    (stage1, _), (stage2, _) = plan_stage(inputs, 1), plan_stage(inputs, 2)
    return StageMove(before, after, params, int(info.knobs["reduce_bucket_size"]) * _FP32_BYTES,
                     stage1.grads_bytes, stage2.grads_bytes)


def _refuse_unmeasured_setups(change: Change, info: RunInfo) -> None:
    """What DeepSpeed does otherwise at stages 1 and 2, where no run of it was measured."""
    knobs = info.knobs
    accumulation = knobs.get("gradient_accumulation_steps")
    offload = knobs.get("offload_optimizer")  # the device, as the agent records it
    if isinstance(offload, dict):  # the config's block, as written
        offload = offload.get("device")
    if isinstance(accumulation, int) and accumulation > 1:
        reason = (f"this run accumulates {accumulation} micro-batches, of which ZeRO-1 reduces the last only: "
                  "answered from a run without accumulation (with grad_accum=N beside it)")
    elif info.param_dtype != "float32":
        reason = (f"its parameters are {info.param_dtype or 'of an unknown dtype'}: with 16-bit parameters ZeRO-1 "
                  "accumulates each gradient in an fp32 copy and reduces in fp32, ZeRO-2 in 16 bits; answered "
                  "for fp32 runs")
    elif offload not in (None, "none"):
        reason = "its optimizer is offloaded, whose gradient buffers differ: answered without offload"
    elif knobs.get("contiguous_gradients") is False:
        reason = "without contiguous_gradients ZeRO-2 holds no bucket buffer: answered with it (DeepSpeed's default)"
    elif not isinstance(knobs.get("reduce_bucket_size"), int | float):
        reason = "the recording does not say reduce_bucket_size, the size of ZeRO-2's gradient buffer"
    else:
        return
    raise Refused(f"{change.text!r}: {reason}")


def _to_stage3() -> str:
    return ("ZeRO-3 gathers each module's parameters as the forward reaches it, and keeps those of at most "
            "stage3_param_persistence_threshold elements gathered (gathered one by one after each update): which "
            "parameters each module holds is not in a recording, so neither the gathers nor their sizes can be told")


def _from_stage3(chain: RankChain) -> str:
    scatters = [s.array_bytes for s in chain.shapes.values() if s.meaning == ZeroMeaning.GRAD_REDUCE_SCATTER]
    largest = max((s.array_bytes for s in chain.shapes.values() if s.op == "all_reduce"), default=0)
    if scatters and largest * SIZE_RANGE < min(scatters):
        return ("ZeRO-1 and ZeRO-2 all-reduce the gradients where ZeRO-3 reduce-scatters them, and this recording "
                f"measured no all-reduce of their size (its largest: {largest:,} bytes); a reduce-scatter's time does "
                "not give an all-reduce's (on gloo one takes about 1.5x the other)")
    return ("from ZeRO-3 is not answered yet: its gathers would go and its gradients' reduce-scatters become "
            "all-reduces, a model no run has checked")


def _gathered_params_bytes(chain: RankChain) -> int:
    """The bytes of parameters the optimizer phase gathers in a step (the median over the chain's steps): every
    parameter, updated by its partition's owner."""
    by_step: dict[int, int] = {}
    for key, shape in chain.shapes.items():
        if shape.meaning == ZeroMeaning.PARAM_ALL_GATHER and chain.phases.get(key) == Phase.OPTIMIZER:
            by_step[key[0]] = by_step.get(key[0], 0) + shape.array_bytes
    return int(statistics.median(by_step.values())) if by_step else 0


def changed_info(change: Change, info: RunInfo | None) -> RunInfo | None:
    """The run's info as ``change`` leaves it, for the changes applied after it (accumulation reduces where the new
    stage does, more ranks shard what it shards)."""
    if change.kind != "zero_stage" or info is None:
        return info
    return dataclasses.replace(info, zero_stage=int(change.value))


# --- the chains ---------------------------------------------------------------------------------------------


def reduced_at_backward_end(chain: RankChain) -> RankChain:
    """ZeRO-1's order: each step's gradient all-reduces one after the other at the backward's end, where its last
    one is (the compute between them before it)."""
    return _per_step(chain, _at_end)


def reduced_as_buckets_fill(chain: RankChain) -> RankChain:
    """ZeRO-2's order: of a step's K gradient all-reduces, the k-th issued after k/K of the backward's compute before
    the last (the gradients come as the backward runs), the last where it is, at the backward's end."""
    return _per_step(chain, _spread)


# Where a step's gradient reductions but the last go: (the step without them, where the last one starts in it,
# each one's segments) -> the step.
_Placer = Callable[[list[Segment], int, list[list[Segment]]], list[Segment]]


def _per_step(chain: RankChain, place: _Placer) -> RankChain:
    out: list[Segment] = []
    segments = chain.segments
    start = 0
    for i in range(1, len(segments) + 1):
        if i < len(segments) and segments[i].step == segments[start].step:
            continue
        step = segments[start:i]
        groups: dict[object, list[Segment]] = {}
        for segment in step:
            if _is_gradient_reduction(chain, segment):
                groups.setdefault(segment.key, []).append(segment)
        *earlier, last = list(groups.values()) or [[]]
        moved = {id(s) for group in earlier for s in group}
        rest = [s for s in step if id(s) not in moved]
        out.extend(place(rest, next(j for j, s in enumerate(rest) if s is last[0]), earlier) if earlier else step)
        start = i
    return dataclasses.replace(chain, segments=tuple(out))


def _is_gradient_reduction(chain: RankChain, segment: Segment) -> bool:
    return segment.key is not None and (chain.shapes[segment.key].meaning == ZeroMeaning.GRAD_ALL_REDUCE
                                        and chain.phases.get(segment.key) == Phase.BACKWARD)


def _at_end(rest: list[Segment], last: int, earlier: list[list[Segment]]) -> list[Segment]:
    return [*rest[:last], *(s for group in earlier for s in group), *rest[last:]]


def _spread(rest: list[Segment], last: int, earlier: list[list[Segment]]) -> list[Segment]:
    def backward_compute(segment: Segment) -> bool:
        return segment.kind == COMPUTE and segment.phase == Phase.BACKWARD

    total = sum(s.seconds for s in rest[:last] if backward_compute(s))
    marks = [total * (k + 1) / (len(earlier) + 1) for k in range(len(earlier))]
    out: list[Segment] = []
    done, placed = 0.0, 0
    for segment in rest[:last]:
        if not backward_compute(segment):
            out.append(segment)
            continue
        left = segment.seconds
        while placed < len(marks) and done + left >= marks[placed]:
            cut = marks[placed] - done
            if cut > 0:
                out.append(dataclasses.replace(segment, seconds=cut))
            left, done = left - cut, done + cut
            out.extend(earlier[placed])
            placed += 1
        if left > 0:
            out.append(dataclasses.replace(segment, seconds=left))
            done += left
    return [*out, *(s for group in earlier[placed:] for s in group), *rest[last:]]


# --- the memory ---------------------------------------------------------------------------------------------


def bucket_held(samples: Sequence[TrackedSample], gradient_bytes: int) -> tuple[TrackedSample, ...]:
    """A rank's samples as ZeRO-2's walk would count them: from the backward's first gradient ``gradient_bytes``
    (its bucket's buffer, whole, with the gradients in it, and where the gradients fill several buckets the rank's
    partition they are reduced into: ``unsharded_grads``, as the walk finds them through the parameters' .grad),
    beside the activations the forward left (the bucket comes at the backward's start)."""
    forward_activations = {s.step: s.categories.get("activations", 0) for s in samples if s.phase == "forward"}

    def activations(sample: TrackedSample, now: int) -> int:
        return max(now, forward_activations.get(sample.walk_step, now))

    return _backward_walks(samples, gradient_bytes, activations)


def every_gradient_held(samples: Sequence[TrackedSample], gradient_bytes: int) -> tuple[TrackedSample, ...]:
    """A rank's samples as ZeRO-1's walk would count them: the backward's highest moment at its end, every gradient
    made (``unsharded_grads``, no bucket buffer yet) and the activations freed; the forward's as measured."""
    return _backward_walks(samples, gradient_bytes, lambda _sample, _now: 0)


def _backward_walks(samples: Sequence[TrackedSample], gradient_bytes: int,
                    activations: Callable[[TrackedSample, int], int]) -> tuple[TrackedSample, ...]:
    """``samples`` with each walk of the backward's highest moment holding ``gradient_bytes`` of gradients and, where
    it counts activations, ``activations(sample, its activations)``; the other samples as measured."""
    out = []
    for sample in samples:
        if sample.walk_phase != _BACKWARD_WALK:
            out.append(sample)
            continue
        categories = {**sample.categories, "unsharded_grads": gradient_bytes}
        if "activations" in categories:
            categories["activations"] = activations(sample, categories["activations"])
        out.append(dataclasses.replace(sample, categories=categories))
    return tuple(out)
