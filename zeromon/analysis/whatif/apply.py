"""What each change does to the run as the model holds it: its chains, its collectives' times and its memory
samples ([Note: the replay's chain] in zeromon.analysis.whatif.chain; the changes' rules in
zeromon.analysis.whatif.changes)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from zeromon.analysis.tracked_memory import TrackedSample
from zeromon.analysis.whatif.chain import CollectiveKey, CollectiveShape, RankChain
from zeromon.analysis.whatif.changes import (
    Change,
    ChangeError,
    accumulated,
    finished_units,
    gathered_bytes_per_step,
    keeps_parameters_gathered,
    kept_gathered,
    reduces_every_micro_batch,
    regathers,
    rescaled_shards,
    resharded,
    scaled_activations,
    scaled_compute,
    sharded_categories,
    step_units,
    with_regathers,
    without,
)
from zeromon.analysis.whatif.model import SIZE_RANGE, Refused, RunModel, SecondsOf
from zeromon.analysis.whatif.zero_stage import (
    bucket_held,
    every_gradient_held,
    reduced_as_buckets_fill,
    reduced_at_backward_end,
    stage_move,
)
from zeromon.model.events import Phase

Applied = tuple[tuple[RankChain, ...], SecondsOf, Mapping[int, tuple[TrackedSample, ...]]]


def apply_change(change: Change, info: Any, model: RunModel, chains: tuple[RankChain, ...], seconds_of: SecondsOf,
                 memory: Mapping[int, tuple[TrackedSample, ...]], assumptions: list[str]) -> Applied:
    """The chains, the collectives' times and the memory samples with ``change`` applied to them (what earlier
    changes left); the change's assumption appended to ``assumptions``."""
    if change.kind in ("reshard_after_forward", "sharding_strategy"):
        if keeps_parameters_gathered(change, info):
            return _kept_gathered(change, info, model, chains, seconds_of, memory, assumptions)
        return _resharded(change, info, model, chains, seconds_of, memory, assumptions)
    return _HANDLERS[change.kind](change, info, model, chains, seconds_of, memory, assumptions)


def _kept_gathered(change: Change, info: Any, model: RunModel, chains: tuple[RankChain, ...],
                   seconds_of: SecondsOf, memory: Mapping[int, tuple[TrackedSample, ...]],
                   assumptions: list[str]) -> Applied:
    """Each unit's parameters kept from its forward to its backward: the backward's re-gathers go."""
    gone = regathers(chains[0])
    if not gone:
        raise ChangeError(f"{change.text!r}: the recording shows no re-gather of parameters in the backward")
    unsharded = gathered_bytes_per_step(model.chains[0])
    assumptions.append(f"{change.text}: the backward's {len(gone) // len({k[0] for k in gone})} re-gathers a step "
                       f"go; every unit's unsharded parameters ({unsharded:,} bytes, what the forward gathers) are "
                       "held from the forward's end, each until its backward ends (its gradients' reduce-scatter); "
                       "the gathers' copies' compute is kept")
    by_rank = {c.rank: c for c in model.chains}
    return (tuple(without(c, gone) for c in chains), seconds_of,
            {r: tuple(kept_gathered(s, unsharded, finished_units(by_rank[r], s.walk_step, s.walk_t_ns))
                      if r in by_rank else s for s in samples) for r, samples in memory.items()})


def _hidden(change: Change, info: Any, model: RunModel, chains: tuple[RankChain, ...], seconds_of: SecondsOf,
            memory: Mapping[int, tuple[TrackedSample, ...]], assumptions: list[str]) -> Applied:
    assumptions.append("comm=hidden: every collective takes no time; waiting for a later peer stays")
    return chains, lambda m: {k: dict.fromkeys(v, 0.0) for k, v in seconds_of(m).items()}, memory


def _faster_network(change: Change, info: Any, model: RunModel, chains: tuple[RankChain, ...],
                    seconds_of: SecondsOf, memory: Mapping[int, tuple[TrackedSample, ...]],
                    assumptions: list[str]) -> Applied:
    factor = change.factor
    assumptions.append(f"{change.text}: each collective's transfer (its fit's bus bytes / bus bandwidth) "
                       f"{factor:g} times faster, its fixed cost and its noise as measured")
    shapes = dict(chains[0].shapes)
    return chains, lambda m: _faster(m, shapes, seconds_of(m), factor), memory


def _larger_micro_batch(change: Change, info: Any, model: RunModel, chains: tuple[RankChain, ...],
                        seconds_of: SecondsOf, memory: Mapping[int, tuple[TrackedSample, ...]],
                        assumptions: list[str]) -> Applied:
    factor = change.factor
    assumptions.append(f"{change.text}: forward and backward compute and activations {factor:g} times, the "
                       "collectives, the optimizer and the rest of the step as measured")
    phases = (Phase.FORWARD.value, Phase.BACKWARD.value)
    return (tuple(scaled_compute(c, factor, phases) for c in chains), seconds_of,
            {r: tuple(scaled_activations(s, factor) for s in samples) for r, samples in memory.items()})


def _resharded(change: Change, info: Any, model: RunModel, chains: tuple[RankChain, ...], seconds_of: SecondsOf,
               memory: Mapping[int, tuple[TrackedSample, ...]], assumptions: list[str]) -> Applied:
    """Each unit but the root resharded after its forward: its parameters gathered again in its backward."""
    if regathers(chains[0]):
        raise ChangeError(f"{change.text!r}: the recording already shows re-gathers of parameters in the backward")
    made = [with_regathers(c) for c in chains]
    added = made[0][1]
    if not added:
        raise ChangeError(f"{change.text!r}: the recording shows no unit besides the root to reshard")
    steps = {k[0] for k in added}
    first = min(steps)
    units = step_units(chains[0], first)
    root = chains[0].shapes[units.forward_gathers[0]].array_bytes
    unit = max(chains[0].shapes[k].array_bytes for k in units.forward_gathers[1:])
    assumptions.append(f"{change.text}: {len(added) // len(steps)} re-gathers a step in the backward, each unit but "
                       "the root's gathered again before the compute that ends in its gradients' reduce-scatter, "
                       "timed by the fit of its forward gather's size; the root's parameters "
                       f"({root:,} bytes) held, and one unit's ({unit:,} bytes) besides at the forward's peak and "
                       "in the backward, with its gather's buffer")

    def seconds(m: RunModel) -> dict[CollectiveKey, dict[int, float]]:
        out = seconds_of(m)
        for key, shape in added.items():
            fit = m.fits.get((shape.op, shape.group_size))
            out[key] = dict.fromkeys((c.rank for c in m.chains), fit.seconds(shape.bus_bytes) if fit else 0.0)
        return out

    return (tuple(c for c, _ in made), seconds,
            {r: tuple(resharded(s, root, unit) for s in samples) for r, samples in memory.items()})


def _accumulated(change: Change, info: Any, model: RunModel, chains: tuple[RankChain, ...], seconds_of: SecondsOf,
                 memory: Mapping[int, tuple[TrackedSample, ...]], assumptions: list[str]) -> Applied:
    """``grad_accum`` micro-batches a step from a run without accumulation."""
    micro_batches = int(change.value)
    current = info.knobs.get("gradient_accumulation_steps") if info is not None else None
    if isinstance(current, int) and current > 1:
        raise ChangeError(f"{change.text!r}: this run accumulates {current} micro-batches already; grad_accum is "
                          "answered from a run without accumulation")
    if micro_batches == 1:
        raise ChangeError(f"{change.text!r}: this run has no accumulation already")
    every = reduces_every_micro_batch(info)
    made = [accumulated(c, micro_batches, every) for c in chains]
    copies = made[0][1]
    assumptions.append(f"{change.text}: each step's forward, backward and the rest before the optimizer "
                       f"{micro_batches} times, each copy's compute and collectives as measured, the optimizer once; "
                       + ("the gradients reduced in every micro-batch (the framework does, without no_sync)"
                          if every else "the gradients reduced at the last micro-batch only (no_sync; "
                                        "DeepSpeed ZeRO-0/1)")
                       + "; memory as measured (the gradients accumulate in place)")

    def seconds(m: RunModel) -> dict[CollectiveKey, dict[int, float]]:
        out = seconds_of(m)
        for new, old in copies.items():
            out[new] = dict(out[old])
        return out

    return tuple(c for c, _ in made), seconds, memory


def _other_world(change: Change, info: Any, model: RunModel, chains: tuple[RankChain, ...], seconds_of: SecondsOf,
                 memory: Mapping[int, tuple[TrackedSample, ...]], assumptions: list[str]) -> Applied:
    """The same per-rank batch on ``after`` ranks: the world's collectives over ``after`` ranks (at one, none),
    the sharded memory 1/``after``."""
    before, after = len(model.chains), int(change.value)
    if after == before:
        raise ChangeError(f"{change.text!r}: the run already has {before} ranks")
    if before == 1:
        raise Refused(f"{change.text!r}: a 1-rank run issues no collective over the world, so none can be rescaled "
                      "or fitted: record it on 2 ranks or more")
    world_keys = {k for k, shape in chains[0].shapes.items() if shape.group_size == before}
    categories = sharded_categories(info)
    scaled_memory = {r: tuple(rescaled_shards(s, categories, before, after) for s in samples)
                     for r, samples in memory.items()}
    sharded = f"; {', '.join(categories)} 1/{after} instead of 1/{before}" if categories else ""
    if after == 1:
        assumptions.append(f"{change.text}: every collective over the world goes (a group of one moves nothing)"
                           f"{sharded}; compute as measured (the same per-rank batch)")
        return tuple(without(c, world_keys) for c in chains), seconds_of, scaled_memory
    shapes = chains[0].shapes
    for key in world_keys:
        fit = model.fits.get((shapes[key].op, before))
        new_bus = shapes[key].bus_bytes_over(after)
        if fit is None:
            raise Refused(f"no {shapes[key].op} had its time measured: nothing to fit it over {after} ranks from")
        if not fit.min_bus_bytes / SIZE_RANGE <= new_bus <= fit.max_bus_bytes * SIZE_RANGE:
            raise Refused(f"over {after} ranks a {shapes[key].op} moves {new_bus:,.0f} bus bytes, more than "
                          f"{SIZE_RANGE:g}x outside the sizes measured ({fit.min_bus_bytes:,.0f} to "
                          f"{fit.max_bus_bytes:,.0f})")
    assumptions.append(f"{change.text}: the world's collectives over {after} ranks, each its measured time moved "
                       f"by its fit's difference at its new bus bytes (the bus bandwidth measured at {before} "
                       f"ranks holds at {after}){sharded}; compute as measured (the same per-rank batch); each "
                       f"recorded rank stands for {after / before:g} of the new world's (waiting for peers as "
                       "measured: more ranks may wait longer)")

    def seconds(m: RunModel) -> dict[CollectiveKey, dict[int, float]]:
        out = seconds_of(m)
        for key in world_keys:
            fit = m.fits[(shapes[key].op, before)]
            moved = fit.seconds(shapes[key].bus_bytes_over(after)) - fit.seconds(shapes[key].bus_bytes)
            out[key] = {rank: max(0.0, s + moved) for rank, s in out[key].items()}
        return out

    return chains, seconds, scaled_memory


def _faster(model: RunModel, shapes: Mapping[CollectiveKey, CollectiveShape],
            seconds: dict[CollectiveKey, dict[int, float]], factor: float) -> dict[CollectiveKey, dict[int, float]]:
    out: dict[CollectiveKey, dict[int, float]] = {}
    for key, by_rank in seconds.items():
        if key not in shapes:  # a collective another change took away
            out[key] = by_rank
            continue
        fit = model.fits.get((shapes[key].op, shapes[key].group_size))
        saved = fit.beta_s_per_byte * shapes[key].bus_bytes * (1.0 - 1.0 / factor) if fit is not None else 0.0
        out[key] = {rank: max(0.0, s - saved) for rank, s in by_rank.items()}
    return out


def _other_zero_stage(change: Change, info: Any, model: RunModel, chains: tuple[RankChain, ...],
                      seconds_of: SecondsOf, memory: Mapping[int, tuple[TrackedSample, ...]],
                      assumptions: list[str]) -> Applied:
    """DeepSpeed's ZeRO-1 from ZeRO-2 or back: the same collectives, the gradients' reductions placed as the stage
    issues them; the backward's gradients held as the stage holds them ([Note: DeepSpeed's ZeRO stages as
    recorded] in zeromon.analysis.whatif.zero_stage)."""
    move = stage_move(change, info, model.chains[0], len(model.chains))
    reductions = "the same collectives, each its measured time"
    if move.after == 1:
        assumptions.append(
            f"{change.text}: {reductions}, the gradients' all-reduces at the backward's end (ZeRO-1's "
            f"reduce_gradients); the backward's highest moment at its end: every gradient held "
            f"({move.every_gradient_bytes:,} bytes, {move.params:,} fp32 parameters), no bucket buffer, the "
            "activations freed")
        return (tuple(reduced_at_backward_end(c) for c in chains), seconds_of,
                {r: every_gradient_held(samples, move.every_gradient_bytes) for r, samples in memory.items()})
    held = move.bucket_bytes + (move.gradient_partition_bytes if move.buckets > 1 else 0)
    partition = (f" and, the gradients filling {move.buckets} buckets, the rank's partition they are reduced into "
                 f"({move.gradient_partition_bytes:,} bytes)" if move.buckets > 1 else "")
    assumptions.append(
        f"{change.text}: {reductions}, each bucket's all-reduce as it fills in the backward (after its share of "
        f"the backward's compute; on a CPU no reduction overlaps it); from its first gradient the backward holds "
        f"the bucket's buffer whole ({move.bucket_bytes:,} bytes: reduce_bucket_size fp32 elements, the gradients "
        f"copied into it){partition}, beside the forward's activations")
    return (tuple(reduced_as_buckets_fill(c) for c in chains), seconds_of,
            {r: bucket_held(samples, held) for r, samples in memory.items()})


_HANDLERS: Mapping[str, Callable[..., Applied]] = {
    "comm": _hidden, "bandwidth": _faster_network, "micro_batch": _larger_micro_batch, "grad_accum": _accumulated,
    "world_size": _other_world, "zero_stage": _other_zero_stage}
