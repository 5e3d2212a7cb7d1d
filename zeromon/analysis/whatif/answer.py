"""What a change would do to this run: measured, the unchanged run replayed through the model, predicted.

The model ([Note: the replay's chain] in zeromon.analysis.whatif.chain): each rank's chain of segments from
its recording, the collectives' times fitted (zeromon.analysis.whatif.fit), the chains run together
(zeromon.analysis.whatif.replay). A collective keeps its own measured time where the change leaves it as
it was (its fit plus its residual: the scheduling noise of that collective on that rank), and takes the
fit where the change makes it anew. The replay of the unchanged run says how far the model is from the
run; it is printed beside every answer, with the fit's residual and what each change kind missed by
when it was checked against real runs (VALIDATED_ERROR_PCT).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zeromon.analysis.bandwidth import bus_factor
from zeromon.analysis.tracked_memory import TrackedSample, tracked_samples
from zeromon.analysis.whatif.chain import CollectiveKey, RankChain, rank_chain
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
from zeromon.analysis.whatif.fit import CollectiveFit, filled_transfers, fit_collectives, measured_transfers
from zeromon.analysis.whatif.replay import ChainsDoNotMatch, Replay, replay
from zeromon.model.codec import Recording
from zeromon.model.events import DEVICE_TIMINGS, Phase, StepSummary, Timing

# The least steps after the first, with their detail on every rank, to answer from; and the most replayed (the
# last of the stretch): enough for a median, and a long run's answer costs no more than a short one's.
MIN_STEPS = 3
MAX_STEPS = 64
# A collective whose size is this many times outside the sizes its fit saw is not predicted.
SIZE_RANGE = 2.0
# What each change kind missed by, as a share of the real run's median step and tracked peak, when it was
# checked against real runs: tests/bench/bench_whatif.py's medians over rounds, the worse of its two model shapes
# (RESULTS.md). None where it was not: no CPU run can make communication free or the network faster.
VALIDATED_ERROR_PCT: Mapping[str, Mapping[str, float] | None] = {
    # both ways: =false from a run that reshards (6.8%, 0.63%) and =true from one that does not (14.2%, 1.78%)
    "reshard_after_forward": {"median_step_s": 14.2, "peak_tracked_bytes": 1.78},
    "sharding_strategy": {"median_step_s": 10.4, "peak_tracked_bytes": 3.18},
    "micro_batch": {"median_step_s": 31.5, "peak_tracked_bytes": 1.28},  # at a micro-batch of 2 (docs/whatif.md)
    "world_size": {"median_step_s": 9.3, "peak_tracked_bytes": 3.42},  # from 2 ranks to 1
    "grad_accum": {"median_step_s": 8.4, "peak_tracked_bytes": 0.0},  # DeepSpeed ZeRO-2 and ZeRO-3
    "comm": None,
    "bandwidth": None,
}


class Refused(ValueError):
    """What one recording cannot answer, and why."""


@dataclass(frozen=True, slots=True)
class Figures:
    median_step_s: float | None  # the median over ranks of each rank's median step, steps after the first
    peak_tracked_bytes: int | None  # the largest over ranks of the peak of the tracked categories
    peak_categories: Mapping[str, int] = field(default_factory=dict)  # at that peak
    # The waterfall of a step, medians over ranks of each rank's median (they need not add up to the step):
    compute_s: float | None = None
    transfer_s: float | None = None  # blocked while a collective ran (and in the calls that issued async ones)
    waiting_s: float | None = None  # blocked before it could start: a later peer, the group's queue
    exposed_s: float | None = None  # all the time blocked in collectives (measured: `zeromon report`'s exposed)

    def to_dict(self) -> dict[str, Any]:
        return {"median_step_s": self.median_step_s, "peak_tracked_bytes": self.peak_tracked_bytes,
                "peak_categories_bytes": dict(self.peak_categories), "compute_s": self.compute_s,
                "transfer_s": self.transfer_s, "waiting_s": self.waiting_s, "exposed_s": self.exposed_s}


@dataclass(frozen=True, slots=True)
class WhatIf:
    changes: tuple[Change, ...]
    measured: Figures
    replay: Figures
    predicted: Figures
    steps: tuple[int, ...]  # the recording's steps replayed
    fits: tuple[CollectiveFit, ...]
    assumptions: tuple[str, ...]
    capacity_bytes: int | None

    @property
    def replay_error_pct(self) -> float | None:
        return _error_pct(self.replay.median_step_s, self.measured.median_step_s)

    @property
    def validated_error_pct(self) -> dict[str, Mapping[str, float] | None]:
        return {c.kind: VALIDATED_ERROR_PCT.get(c.kind) for c in self.changes}

    def to_dict(self) -> dict[str, Any]:
        return {
            "changes": [c.text for c in self.changes],
            "measured": self.measured.to_dict(),
            "replay": self.replay.to_dict() | {"error_pct": self.replay_error_pct},
            "predicted": self.predicted.to_dict(),
            "assumptions": list(self.assumptions),
            "validated_error_pct": self.validated_error_pct,
            "capacity_bytes": self.capacity_bytes,
            "steps": list(self.steps),
            "fits": [{"op": f.op, "group_size": f.group_size, "alpha_s": f.alpha_s,
                      "busbw_bytes_per_s": f.busbw_bytes_per_s, "samples": f.samples,
                      "residual_pct": f.residual_pct, "line_residual_pct": f.line_residual_pct,
                      "min_bus_bytes": f.min_bus_bytes, "max_bus_bytes": f.max_bus_bytes} for f in self.fits],
        }


def _error_pct(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return 100.0 * (value - reference) / reference


@dataclass(frozen=True, slots=True)
class _Model:
    """The run as the model holds it, before any change."""

    chains: tuple[RankChain, ...]
    fits: Mapping[tuple[str, int], CollectiveFit]
    transfers: Mapping[CollectiveKey, Mapping[int, float]]
    memory: Mapping[int, tuple[TrackedSample, ...]]  # rank -> its tracked samples


def what_if(recordings: Sequence[Recording], changes: Sequence[Change]) -> WhatIf:
    """The answer for ``changes`` applied together; Refused or ChangeError where the recording cannot say."""
    if not recordings:
        raise Refused("no rank recordings")
    world = max((r.run_info.world_size for r in recordings if r.run_info is not None), default=len(recordings))
    if len(recordings) < world:
        raise Refused(f"{len(recordings)} of the run's {world} ranks were recorded here: the ranks' collectives are "
                      "replayed together, so every rank's recording is needed (a run on several nodes: give "
                      "each node's folder)")
    _refuse_device_timing(recordings)
    steps = replayable_steps(recordings)
    chains = tuple(rank_chain(r, steps) for r in recordings)
    _refuse_subgroups(chains)
    first = measured_transfers(chains)
    if not first and any(c.shapes for c in chains):
        raise Refused("no collective's completion was measured on every rank: nothing to fit its time from")
    fits = fit_collectives(chains, first)
    model = _Model(chains, fits, filled_transfers(chains, fits),
                   {r.rank: tuple(tracked_samples(r.memory)) for r in recordings})
    assumptions = [f"{len(steps)} steps replayed ({_steps_words(steps)}), from their start on every rank as "
                   "measured",
                   "compute keeps its measured length; each collective its own measured time where the change "
                   "leaves it, the fit of its op and group where it is made anew"]
    base = _run(model, model.chains, _measured_seconds(model))
    info = recordings[0].run_info
    chains_after, memory_after = model.chains, model.memory
    seconds_of: SecondsOf = _measured_seconds
    for change in changes:
        chains_after, seconds_of, memory_after = _apply(change, info, model, chains_after, seconds_of, memory_after,
                                                        assumptions)
    predicted = _run(model, chains_after, seconds_of(model), memory_after)
    capacity = next((m.capacity for r in recordings for m in reversed(r.memory) if m.capacity), None)
    return WhatIf(changes=tuple(changes), measured=_measured(recordings, model), replay=base,
                  predicted=predicted, steps=tuple(steps), fits=tuple(fits.values()),
                  assumptions=tuple(assumptions), capacity_bytes=capacity)


def replayable_steps(recordings: Sequence[Recording]) -> list[int]:
    """The last MAX_STEPS of the longest stretch of consecutive steps that every rank summarized and kept the
    detail of."""
    common: set[int] | None = None
    for rec in recordings:
        summarized = {s.step for s in rec.steps if s.step >= 0}
        detailed = {p.step for p in rec.phases} | set(rec.collective_columns().step)
        steps = summarized & detailed
        common = steps if common is None else common & steps
    stretch: list[int] = []
    best: list[int] = []
    for step in sorted(common or ()):
        stretch = [*stretch, step] if stretch and stretch[-1] == step - 1 else [step]
        best = stretch if len(stretch) > len(best) else best
    if len([s for s in best if s >= 1]) < MIN_STEPS:
        raise Refused(f"the ranks share {len(best)} consecutive steps with their detail (collectives and phases); "
                      f"at least {MIN_STEPS + 1} are needed (the disk budget thins a long run's detail: "
                      "ZEROMON_MAX_DISK, docs/recording-format.md)")
    return best[-MAX_STEPS:]


def _refuse_device_timing(recordings: Sequence[Recording]) -> None:
    for rec in recordings:
        timings = set(rec.collective_columns().timing)
        if Timing.LAUNCH.value in timings:
            raise Refused(f"rank {rec.rank}: its collectives were not timed on the device in most steps "
                          "(ZEROMON_DEVICE_TIMING_EVERY): when they ran on the GPU is not known")
        if timings & DEVICE_TIMINGS:
            raise Refused(f"rank {rec.rank}: a GPU run's chain is its stream's; this version replays the host's "
                          "(a CPU run)")


def _refuse_subgroups(chains: Sequence[RankChain]) -> None:
    world = len(chains)
    sizes = {shape.group_size for c in chains for shape in c.shapes.values()}
    if sizes - {1, world}:
        raise Refused(f"collectives in groups of {sorted(sizes - {1, world})} ranks among {world}: the recording "
                      "does not say which ranks each group holds, so their peers cannot be matched")
    counts = {c.rank: len(c.issue_ns) for c in chains}
    if len(set(counts.values())) > 1:
        detail = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
        raise Refused(f"the ranks recorded different collectives in the replayed steps ({detail})")


def _steps_words(steps: Sequence[int]) -> str:
    return f"steps {steps[0] + 1}-{steps[-1] + 1}" if len(steps) > 1 else f"step {steps[0] + 1}"


SecondsOf = Callable[[_Model], dict[CollectiveKey, dict[int, float]]]


def _measured_seconds(model: _Model) -> dict[CollectiveKey, dict[int, float]]:
    """Each collective's measured time on each rank, its fit's where that was not measured."""
    seconds: dict[CollectiveKey, dict[int, float]] = {}
    for key, shape in model.chains[0].shapes.items():
        fit = model.fits.get((shape.op, shape.group_size))
        fitted = fit.seconds(shape.bus_bytes) if fit is not None else 0.0
        measured = model.transfers.get(key, {})
        seconds[key] = {c.rank: measured.get(c.rank, fitted) for c in model.chains}
    return seconds


def _apply(change: Change, info: Any, model: _Model, chains: tuple[RankChain, ...], seconds_of: SecondsOf,
           memory: Mapping[int, tuple[TrackedSample, ...]], assumptions: list[str],
           ) -> tuple[tuple[RankChain, ...], SecondsOf, Mapping[int, tuple[TrackedSample, ...]]]:
    if change.kind in ("reshard_after_forward", "sharding_strategy"):
        if not keeps_parameters_gathered(change, info):
            return _resharded(change, model, chains, seconds_of, memory, assumptions)
        gone = regathers(chains[0])
        if not gone:
            raise ChangeError(f"{change.text!r}: the recording shows no re-gather of parameters in the backward")
        unsharded = gathered_bytes_per_step(chains[0])
        assumptions.append(f"{change.text}: the backward's {len(gone) // len(_steps_of(gone))} re-gathers a step go; "
                           f"every unit's unsharded parameters ({unsharded:,} bytes, what the forward gathers) are "
                           "held from the forward's end, each until its backward ends (its gradients' reduce-scatter); "
                           "the gathers' copies' compute is kept")
        by_rank = {c.rank: c for c in model.chains}
        return (tuple(without(c, gone) for c in chains), seconds_of,
                {r: tuple(kept_gathered(s, unsharded, finished_units(by_rank[r], s.walk_step, s.walk_t_ns))
                          if r in by_rank else s for s in samples) for r, samples in memory.items()})
    if change.kind == "comm":
        assumptions.append("comm=hidden: every collective takes no time; waiting for a later peer stays")
        return chains, lambda m: {k: dict.fromkeys(v, 0.0) for k, v in seconds_of(m).items()}, memory
    if change.kind == "bandwidth":
        factor = change.factor
        assumptions.append(f"{change.text}: each collective's transfer (its fit's bus bytes / bus bandwidth) "
                           f"{factor:g} times faster, its fixed cost and its noise as measured")
        return chains, lambda m: _faster(m, seconds_of(m), factor), memory
    if change.kind == "world_size":
        return _other_world(change, info, model, chains, seconds_of, memory, assumptions)
    if change.kind == "grad_accum":
        return _accumulated(change, info, chains, seconds_of, memory, assumptions)
    factor = change.factor
    assumptions.append(f"{change.text}: forward and backward compute and activations {factor:g} times, the "
                       "collectives, the optimizer and the rest of the step as measured")
    phases = (Phase.FORWARD.value, Phase.BACKWARD.value)
    return (tuple(scaled_compute(c, factor, phases) for c in chains), seconds_of,
            {r: tuple(scaled_activations(s, factor) for s in samples) for r, samples in memory.items()})


def _resharded(change: Change, model: _Model, chains: tuple[RankChain, ...], seconds_of: SecondsOf,
               memory: Mapping[int, tuple[TrackedSample, ...]], assumptions: list[str],
               ) -> tuple[tuple[RankChain, ...], SecondsOf, Mapping[int, tuple[TrackedSample, ...]]]:
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

    def seconds(m: _Model) -> dict[CollectiveKey, dict[int, float]]:
        out = seconds_of(m)
        for key, shape in added.items():
            fit = m.fits.get((shape.op, shape.group_size))
            out[key] = dict.fromkeys((c.rank for c in m.chains), fit.seconds(shape.bus_bytes) if fit else 0.0)
        return out

    return (tuple(c for c, _ in made), seconds,
            {r: tuple(resharded(s, root, unit) for s in samples) for r, samples in memory.items()})


def _accumulated(change: Change, info: Any, chains: tuple[RankChain, ...], seconds_of: SecondsOf,
                 memory: Mapping[int, tuple[TrackedSample, ...]], assumptions: list[str],
                 ) -> tuple[tuple[RankChain, ...], SecondsOf, Mapping[int, tuple[TrackedSample, ...]]]:
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

    def seconds(m: _Model) -> dict[CollectiveKey, dict[int, float]]:
        out = seconds_of(m)
        for new, old in copies.items():
            out[new] = dict(out[old])
        return out

    return tuple(c for c, _ in made), seconds, memory


def _other_world(change: Change, info: Any, model: _Model, chains: tuple[RankChain, ...], seconds_of: SecondsOf,
                 memory: Mapping[int, tuple[TrackedSample, ...]], assumptions: list[str],
                 ) -> tuple[tuple[RankChain, ...], SecondsOf, Mapping[int, tuple[TrackedSample, ...]]]:
    """The same per-rank batch on ``after`` ranks: the world's collectives over ``after`` ranks (at one, none),
    the sharded memory 1/``after``."""
    before, after = len(model.chains), int(change.value)
    if after == before:
        raise ChangeError(f"{change.text!r}: the run already has {before} ranks")
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
        new_bus = shapes[key].array_bytes * (bus_factor(shapes[key].op, after) or 1.0)
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

    def seconds(m: _Model) -> dict[CollectiveKey, dict[int, float]]:
        out = seconds_of(m)
        for key in world_keys:
            fit = m.fits[(shapes[key].op, before)]
            moved = (fit.seconds(shapes[key].array_bytes * (bus_factor(shapes[key].op, after) or 1.0))
                     - fit.seconds(shapes[key].bus_bytes))
            out[key] = {rank: max(0.0, s + moved) for rank, s in out[key].items()}
        return out

    return chains, seconds, scaled_memory


def _steps_of(keys: set[CollectiveKey]) -> set[int]:
    return {k[0] for k in keys} or {0}


def _faster(model: _Model, seconds: dict[CollectiveKey, dict[int, float]], factor: float,
            ) -> dict[CollectiveKey, dict[int, float]]:
    shapes = model.chains[0].shapes
    out: dict[CollectiveKey, dict[int, float]] = {}
    for key, by_rank in seconds.items():
        fit = model.fits.get((shapes[key].op, shapes[key].group_size))
        saved = fit.beta_s_per_byte * shapes[key].bus_bytes * (1.0 - 1.0 / factor) if fit is not None else 0.0
        out[key] = {rank: max(0.0, s - saved) for rank, s in by_rank.items()}
    return out


def _run(model: _Model, chains: Sequence[RankChain], seconds: Mapping[CollectiveKey, Mapping[int, float]],
         memory: Mapping[int, tuple[TrackedSample, ...]] | None = None) -> Figures:
    _refuse_unseen_sizes(model, chains)
    wanted = {k for c in chains for k in c.issue_ns}
    try:
        result = replay(chains, {k: v for k, v in seconds.items() if k in wanted})
    except ChainsDoNotMatch as exc:
        raise Refused(str(exc)) from exc
    return _figures(result, model.memory if memory is None else memory)


def _refuse_unseen_sizes(model: _Model, chains: Sequence[RankChain]) -> None:
    for key, shape in chains[0].shapes.items():
        fit = model.fits.get((shape.op, shape.group_size))
        if key in model.transfers:
            continue
        if fit is None:
            raise Refused(f"no {shape.op} in a group of {shape.group_size} had its time measured: nothing to fit "
                          "its time from")
        if not fit.min_bus_bytes / SIZE_RANGE <= shape.bus_bytes <= fit.max_bus_bytes * SIZE_RANGE:
            raise Refused(f"a {shape.op} of {shape.bus_bytes:,.0f} bus bytes is more than {SIZE_RANGE:g}x outside "
                          f"the sizes measured ({fit.min_bus_bytes:,.0f} to {fit.max_bus_bytes:,.0f})")


def _figures(result: Replay, memory: Mapping[int, tuple[TrackedSample, ...]]) -> Figures:
    peak, categories = _peak(memory)
    return Figures(median_step_s=result.median_step_s(), peak_tracked_bytes=peak, peak_categories=categories,
                   compute_s=result.median_of("compute_s"), transfer_s=result.median_of("transfer_s"),
                   waiting_s=result.median_of("waiting_s"), exposed_s=result.median_of("exposed_s"))


def _peak(memory: Mapping[int, Sequence[TrackedSample]]) -> tuple[int | None, Mapping[str, int]]:
    best: TrackedSample | None = None
    for samples in memory.values():
        for sample in samples:
            if best is None or sample.total > best.total:
                best = sample
    return (None, {}) if best is None else (best.total, dict(best.categories))


def _measured(recordings: Sequence[Recording], model: _Model) -> Figures:
    """The run as recorded, by the same definitions (its steps after the first, as `zeromon report`)."""
    peak, categories = _peak(model.memory)
    return Figures(median_step_s=_median_of_ranks(recordings, lambda s: s.duration_s),
                   peak_tracked_bytes=peak, peak_categories=categories,
                   compute_s=_median_of_ranks(recordings, lambda s: s.duration_s - (s.blocked_s or 0.0)),
                   exposed_s=_median_of_ranks(recordings, lambda s: s.exposed_comm_s))


def _median_of_ranks(recordings: Sequence[Recording], value: Callable[[StepSummary], float | None]) -> float | None:
    medians = []
    for rec in recordings:
        steps = [s for s in rec.steps if s.step >= 1] or list(rec.steps)
        values = [v for s in steps if (v := value(s)) is not None]
        if values:
            medians.append(statistics.median(values))
    return statistics.median(medians) if medians else None
