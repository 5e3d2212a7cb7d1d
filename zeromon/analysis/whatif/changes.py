"""The changes `zeromon whatif` answers, as the user writes them (``reshard_after_forward=false``,
``zero_stage=2``, ``comm=hidden``, ``bandwidth=x2``, ``micro_batch=x2``, ``world_size=8``), and what each does to
the chains and the memory.

Each change is applied to what the recording shows, as the framework would change it:
- ``reshard_after_forward=false`` (FSDP2; FSDP1's ``sharding_strategy=SHARD_GRAD_OP``): the backward's
  re-gathers of the parameters go (the collectives whose meaning is ``param_all_gather`` in the backward),
  and each unit's gathered parameters stay from its forward until its backward ends. ``=true`` (FSDP1's
  ``FULL_SHARD``) the other way: each unit but the root gathered again before its backward.
- ``zero_stage=1|2`` (DeepSpeed, from the other): zeromon.analysis.whatif.zero_stage.
- ``world_size=N``: the world's collectives over N ranks, the sharded state 1/N.
- ``comm=hidden``: every collective takes no time; waiting for a later peer stays (overlap cannot hide it).
- ``bandwidth=xK``: each collective's transfer (beta x bus bytes of its fit) K times faster.
- ``micro_batch=xK``: the forward's and backward's compute and the activations K times; the collectives,
  the optimizer and the rest of the step as they were.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from zeromon.analysis.tracked_memory import TrackedSample
from zeromon.analysis.whatif.chain import (
    COMPUTE,
    ISSUE,
    STEP_END,
    STEP_START,
    SYNC,
    WAIT,
    CollectiveKey,
    CollectiveShape,
    RankChain,
    Segment,
)
from zeromon.model.classes import frozen
from zeromon.model.events import Phase, RunInfo, ZeroMeaning


class ChangeError(ValueError):
    """A change that is written wrong, or that this run cannot take: the message names it and says why."""


@frozen
class Change:
    kind: str  # one of KINDS
    value: str  # "false", "hidden", or a factor's number
    text: str  # as the user wrote it

    @property
    def factor(self) -> float:
        return float(self.value)


KINDS = ("reshard_after_forward", "sharding_strategy", "zero_stage", "comm", "bandwidth", "micro_batch", "world_size",
         "grad_accum")
_FACTOR = re.compile(r"^x?(\d+(\.\d*)?|\.\d+)$")


def parse_change(text: str) -> Change:
    name, eq, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not eq or not name or not value:
        raise ChangeError(f"{text!r}: a change is NAME=VALUE, e.g. reshard_after_forward=false, comm=hidden, "
                          "bandwidth=x2, micro_batch=x2")
    if name not in KINDS:
        raise ChangeError(f"{text!r}: unknown change {name!r} (known: {', '.join(KINDS)})")
    if name == "comm":
        if value != "hidden":
            raise ChangeError(f"{text!r}: comm takes 'hidden' (every collective overlapped)")
        return Change(name, value, text)
    if name == "reshard_after_forward":
        if value.lower() not in ("true", "false"):
            raise ChangeError(f"{text!r}: reshard_after_forward takes true or false")
        return Change(name, value.lower(), text)
    if name == "sharding_strategy":
        if value.upper() not in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
            raise ChangeError(f"{text!r}: sharding_strategy takes FULL_SHARD, SHARD_GRAD_OP or NO_SHARD")
        return Change(name, value.upper(), text)
    if name == "zero_stage":
        if value not in ("0", "1", "2", "3"):
            raise ChangeError(f"{text!r}: zero_stage takes 0, 1, 2 or 3")
        return Change(name, value, text)
    if name in ("world_size", "grad_accum"):
        if not value.isdigit() or int(value) < 1:
            raise ChangeError(f"{text!r}: {name} takes a whole number, 1 or more")
        return Change(name, str(int(value)), text)
    match = _FACTOR.match(value)
    if not match or float(match.group(1)) <= 0:
        raise ChangeError(f"{text!r}: {name} takes a factor greater than 0, e.g. {name}=x2 or {name}=x0.5")
    return Change(name, str(float(match.group(1))), text)


def keeps_parameters_gathered(change: Change, info: RunInfo | None) -> bool:
    """True where the change keeps each unit's parameters from its forward to its backward (the backward's
    re-gathers go), False where it reshards them after the forward (re-gathers come); a ChangeError where the run
    cannot take it (another framework, or already so)."""
    framework = info.framework if info is not None else "unknown"
    if change.kind == "reshard_after_forward":
        if framework != "fsdp2":
            raise ChangeError(f"{change.text!r}: reshard_after_forward is FSDP2's (fully_shard); this run is "
                              f"{framework}" + (" (FSDP1: sharding_strategy=SHARD_GRAD_OP or FULL_SHARD)"
                                               if framework == "fsdp1" else ""))
        kept_now = info is not None and info.knobs.get("reshard_after_forward") is False
        if kept_now == (change.value == "false"):
            raise ChangeError(f"{change.text!r}: this run already " + (
                "keeps its parameters gathered after the forward" if kept_now else "reshards after the forward"))
        return change.value == "false"
    if framework != "fsdp1":
        raise ChangeError(f"{change.text!r}: sharding_strategy is FSDP1's; this run is {framework}"
                          + (" (FSDP2: reshard_after_forward)" if framework == "fsdp2" else ""))
    current = (info.fsdp_strategy if info is not None else None) or ""
    moves = {("FULL_SHARD", "SHARD_GRAD_OP"): True, ("SHARD_GRAD_OP", "FULL_SHARD"): False}
    if (current, change.value) not in moves:
        raise ChangeError(f"{change.text!r}: from {current or 'an unknown strategy'} to {change.value} is not "
                          "answered yet; FULL_SHARD to SHARD_GRAD_OP and back are")
    return moves[(current, change.value)]


def regathers(chain: RankChain) -> set[CollectiveKey]:
    """The backward's re-gathers of parameters that the forward gathered and resharded."""
    return {key for key, shape in chain.shapes.items()
            if shape.meaning == ZeroMeaning.PARAM_ALL_GATHER and _phase_of(chain, key) == Phase.BACKWARD}


def _phase_of(chain: RankChain, key: CollectiveKey) -> str:
    return chain.phases.get(key, "")


def without(chain: RankChain, keys: set[CollectiveKey]) -> RankChain:
    """The chain less the segments of these collectives."""
    if not keys:
        return chain
    return dataclasses.replace(
        chain, segments=tuple(s for s in chain.segments if s.key not in keys or s.kind not in (SYNC, ISSUE, WAIT)),
        issue_ns={k: v for k, v in chain.issue_ns.items() if k not in keys},
        complete_ns={k: v for k, v in chain.complete_ns.items() if k not in keys},
        shapes={k: v for k, v in chain.shapes.items() if k not in keys},
        phases={k: v for k, v in chain.phases.items() if k not in keys})


@frozen
class Units:
    """A step's sharding units as its collectives show them: the forward's gathers in order (the first is the
    root's, which FSDP keeps gathered through the backward) and the backward's gradient reduce-scatters."""

    forward_gathers: tuple[CollectiveKey, ...]
    backward_reductions: tuple[CollectiveKey, ...]


def step_units(chain: RankChain, step: int) -> Units:
    def in_order(meaning: str, phase: str) -> tuple[CollectiveKey, ...]:
        keys = [k for k, shape in chain.shapes.items()
                if k[0] == step and shape.meaning == meaning and chain.phases.get(k) == phase]
        return tuple(sorted(keys, key=chain.issue_ns.__getitem__))

    return Units(in_order(ZeroMeaning.PARAM_ALL_GATHER, Phase.FORWARD),
                 in_order(ZeroMeaning.GRAD_REDUCE_SCATTER, Phase.BACKWARD))


def with_regathers(chain: RankChain) -> tuple[RankChain, dict[CollectiveKey, CollectiveShape]]:
    """The chain with each unit but the root gathered again at the start of its backward (before the compute
    that ends in its gradients' reduce-scatter): the backward runs the units in the reverse order. The new
    collectives' shapes are their forward gathers'."""
    added: dict[CollectiveKey, CollectiveShape] = {}
    plan: dict[int, list[tuple[CollectiveKey | None, CollectiveKey]]] = {}  # step -> (after which RS, the new AG)
    for step in sorted({k[0] for k in chain.shapes}):
        units = step_units(chain, step)
        if not units.forward_gathers:
            continue
        if len(units.forward_gathers) != len(units.backward_reductions):
            raise ChangeError(f"step {step + 1}: {len(units.forward_gathers)} gathers in the forward and "
                              f"{len(units.backward_reductions)} gradient reduce-scatters in the backward: its units "
                              "cannot be told apart")
        occurrence = sum(1 for k in chain.shapes if k[0] == step and k[1] == "all_gather")
        steps_plan = []
        backward_units = list(reversed(units.forward_gathers))
        for i, gather in enumerate(backward_units):
            if gather == units.forward_gathers[0]:
                continue  # the root: kept gathered
            key = (step, "all_gather", gather[2], occurrence)
            occurrence += 1
            added[key] = chain.shapes[gather]
            steps_plan.append((units.backward_reductions[i - 1] if i else None, key))
        plan[step] = steps_plan
    segments: list[Segment] = []
    started: set[int] = set()
    for segment in chain.segments:
        todo = plan.get(segment.step, [])
        if segment.phase == Phase.BACKWARD and segment.step not in started and segment.kind == COMPUTE:
            started.add(segment.step)
            segments.extend(_gather(key, segment.step) for after, key in todo if after is None)
        segments.append(segment)
        if segment.kind in (SYNC, ISSUE) and segment.key is not None:
            segments.extend(_gather(key, segment.step) for after, key in todo if after == segment.key)
    issue = dict(chain.issue_ns) | dict.fromkeys(added, 0)
    return dataclasses.replace(chain, segments=tuple(segments), issue_ns=issue,
                               shapes=dict(chain.shapes) | added,
                               phases=dict(chain.phases) | dict.fromkeys(added, Phase.BACKWARD.value)), added


def _gather(key: CollectiveKey, step: int) -> Segment:
    return Segment(SYNC, 0.0, step, Phase.BACKWARD.value, key)


def resharded(sample: TrackedSample, root_bytes: int, unit_bytes: int) -> TrackedSample:
    """A sample as it would read with each unit resharded after its forward: the root's parameters held, and one
    unit's besides at the forward's peak and in the backward, where that unit's gather has its buffer."""
    phase = sample.walk_phase
    if phase not in ("forward", "forward_peak", "backward_peak", "backward"):
        return sample
    categories = dict(sample.categories)
    held = root_bytes if phase == "forward" else root_bytes + unit_bytes
    categories["unsharded_params"] = min(categories.get("unsharded_params", 0), held)
    if phase.startswith("backward"):
        categories["all_gather_buffers"] = max(categories.get("all_gather_buffers", 0), unit_bytes)
    return dataclasses.replace(sample, categories=categories)


def scaled_compute(chain: RankChain, factor: float, phases: Sequence[str]) -> RankChain:
    """The chain with its compute in ``phases`` ``factor`` times as long."""
    return dataclasses.replace(chain, segments=tuple(
        dataclasses.replace(s, seconds=s.seconds * factor) if s.kind == COMPUTE and s.phase in phases else s
        for s in chain.segments))


def gathered_bytes_per_step(chain: RankChain) -> int:
    """The bytes of parameters the forward gathers in a step (its param_all_gather outputs), the median
    over the chain's steps: every unit's unsharded parameters."""
    by_step: dict[int, int] = {}
    for key, shape in chain.shapes.items():
        if shape.meaning == ZeroMeaning.PARAM_ALL_GATHER and _phase_of(chain, key) == Phase.FORWARD:
            by_step[key[0]] = by_step.get(key[0], 0) + shape.array_bytes
    values = sorted(by_step.values())
    return values[len(values) // 2] if values else 0


def kept_gathered(sample: TrackedSample, unsharded_bytes: int, finished_bytes: int) -> TrackedSample:
    """A sample as it would read with each unit's parameters kept from its forward to its backward: from the
    forward's end every unit's unsharded parameters are held, less, in the backward, those of the units whose
    backward had finished (``finished_bytes``: resharded after their gradients' reduce-scatter), and the backward
    gathers nothing (no all-gather buffer). Judged by the walk that counted the sample's categories."""
    if sample.walk_phase not in ("forward", "forward_peak", "backward_peak", "backward"):
        return sample
    categories = dict(sample.categories)
    held = unsharded_bytes
    if sample.walk_phase.startswith("backward"):
        categories.pop("all_gather_buffers", None)
        held = unsharded_bytes - finished_bytes
    categories["unsharded_params"] = max(categories.get("unsharded_params", 0), held)
    return dataclasses.replace(sample, categories=categories)


def finished_units(chain: RankChain, step: int, t_ns: int) -> int:
    """The unsharded bytes of the units whose backward had finished by ``t_ns`` in ``step``: as many as the
    gradients' reduce-scatters issued by then, taken from the forward's gathers in reverse (the backward runs
    the units in the reverse order)."""
    forward = sorted((chain.issue_ns[k], shape.array_bytes) for k, shape in chain.shapes.items()
                     if k[0] == step and shape.meaning == ZeroMeaning.PARAM_ALL_GATHER
                     and chain.phases.get(k) == Phase.FORWARD)
    done = sum(1 for k, shape in chain.shapes.items()
               if k[0] == step and shape.meaning == ZeroMeaning.GRAD_REDUCE_SCATTER and chain.issue_ns[k] <= t_ns)
    return sum(size for _, size in forward[len(forward) - done:]) if done else 0


def reduces_every_micro_batch(info: RunInfo | None) -> bool:
    """Whether the framework reduces the gradients in every micro-batch of an accumulation (FSDP1 and FSDP2
    without no_sync, DeepSpeed ZeRO-2 and ZeRO-3) or at its boundary only (DDP under no_sync, ZeRO-0 and 1)."""
    framework = info.framework if info is not None else "unknown"
    if framework == "deepspeed":
        return (info.zero_stage if info is not None else None) in (2, 3)
    return framework in ("fsdp1", "fsdp2")


_GRADIENT_REDUCTIONS = (ZeroMeaning.GRAD_ALL_REDUCE, ZeroMeaning.GRAD_REDUCE_SCATTER)


def accumulated(chain: RankChain, micro_batches: int, every_micro_batch: bool,
                ) -> tuple[RankChain, dict[CollectiveKey, CollectiveKey]]:
    """The chain with each step's part before its optimizer (forward, backward, the rest) run ``micro_batches``
    times, then the optimizer once. The copies before the last hold every collective of that part, but the
    gradients' reductions where the framework reduces at the boundary only; each copy is a new collective, mapped
    to the one it copies."""
    copies: dict[CollectiveKey, CollectiveKey] = {}
    occurrences: dict[tuple[int, str, int], int] = {}
    for key in chain.shapes:
        occurrences[key[:3]] = max(occurrences.get(key[:3], 0), key[3] + 1)
    segments: list[Segment] = []
    micro: list[Segment] = []
    in_micro = False
    for segment in chain.segments:
        if segment.kind == STEP_START:
            segments.append(segment)
            micro, in_micro = [], True
            continue
        if in_micro and (segment.phase == Phase.OPTIMIZER or segment.kind == STEP_END):
            for _ in range(micro_batches - 1):
                segments.extend(_copied(micro, chain, every_micro_batch, copies, occurrences))
            segments.extend(micro)
            in_micro = False
        (micro if in_micro else segments).append(segment)
    shapes = dict(chain.shapes) | {new: chain.shapes[old] for new, old in copies.items()}
    return dataclasses.replace(
        chain, segments=tuple(segments), shapes=shapes,
        issue_ns=dict(chain.issue_ns) | {new: chain.issue_ns[old] for new, old in copies.items()},
        phases=dict(chain.phases) | {new: chain.phases.get(old, "") for new, old in copies.items()}), copies


def _copied(micro: Sequence[Segment], chain: RankChain, every_micro_batch: bool,
            copies: dict[CollectiveKey, CollectiveKey], occurrences: dict[tuple[int, str, int], int]) -> list[Segment]:
    renamed: dict[CollectiveKey, CollectiveKey] = {}
    out = []
    for segment in micro:
        key = segment.key
        if key is None:
            out.append(segment)
            continue
        if not every_micro_batch and chain.shapes[key].meaning in _GRADIENT_REDUCTIONS:
            continue
        if key not in renamed:
            if segment.kind == WAIT:
                continue  # waited on here, issued before the copied part: not copied
            renamed[key] = (*key[:3], occurrences[key[:3]])  # type: ignore[assignment]
            occurrences[key[:3]] += 1
            copies[renamed[key]] = key
        out.append(dataclasses.replace(segment, key=renamed[key]))
    return out


def sharded_categories(info: RunInfo | None) -> tuple[str, ...]:
    """The memory categories each rank holds 1/N of, N its data-parallel ranks: FSDP's and ZeRO-3's parameters,
    gradients and optimizer state; ZeRO-2's gradients and optimizer state; ZeRO-1's optimizer state; none in
    DDP (the ZeRO paper's model-state memory)."""
    framework = info.framework if info is not None else "unknown"
    if framework in ("fsdp1", "fsdp2"):
        strategy = info.fsdp_strategy if info is not None else None
        return () if strategy == "NO_SHARD" else ("sharded_params", "sharded_grads", "optimizer_state")
    if framework == "deepspeed":
        stage = info.zero_stage if info is not None else None
        return {1: ("optimizer_state",), 2: ("sharded_grads", "optimizer_state"),
                3: ("sharded_params", "sharded_grads", "optimizer_state")}.get(stage or 0, ())
    return ()


def rescaled_shards(sample: TrackedSample, categories: Sequence[str], before: int, after: int) -> TrackedSample:
    """A sample with the sharded categories of ``before`` ranks held by ``after``; at one rank, no all-gather
    buffer (FSDP2 still reduces its gradients through its reduce-scatter buffer there: measured)."""
    scaled = {name: (int(round(value * before / after)) if name in categories else value)
              for name, value in sample.categories.items()}
    if after == 1:
        scaled.pop("all_gather_buffers", None)
    return dataclasses.replace(sample, categories=scaled)


def scaled_activations(sample: TrackedSample, factor: float) -> TrackedSample:
    categories: Mapping[str, int] = sample.categories
    if "activations" not in categories:
        return sample
    return dataclasses.replace(sample, categories={
        **categories, "activations": int(round(categories["activations"] * factor))})
