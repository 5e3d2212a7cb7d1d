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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from typing import Any

from zeromon.analysis.step_table import step_table
from zeromon.analysis.tracked_memory import TrackedSample, highest, tracked_samples
from zeromon.analysis.whatif.apply import apply_change
from zeromon.analysis.whatif.chain import DEVICE_CLOCK, CollectiveKey, RankChain, rank_chain
from zeromon.analysis.whatif.changes import Change
from zeromon.analysis.whatif.fit import CollectiveFit, fit_collectives, measured_transfers
from zeromon.analysis.whatif.model import SIZE_RANGE, Refused, RunModel, SecondsOf
from zeromon.analysis.whatif.replay import ChainsDoNotMatch, Replay, replay
from zeromon.analysis.whatif.zero_stage import changed_info
from zeromon.model.classes import frozen
from zeromon.model.codec import Recording
from zeromon.model.events import DEVICE_TIMINGS, Phase, Timing

# The least steps after the first, with their detail on every rank, to answer from; and the most replayed (the
# last of the stretch): enough for a median, and a long run's answer costs no more than a short one's.
MIN_STEPS = 3
MAX_STEPS = 64
_GPU_TIMINGS = DEVICE_TIMINGS | {Timing.LAUNCH.value}
APPLY_ORDER = ("reshard_after_forward", "sharding_strategy", "zero_stage", "world_size", "micro_batch", "grad_accum",
               "bandwidth", "comm")
# What each change kind missed by, as a share of the real run's median step and tracked peak, when it was
# checked against real runs: tests/bench/bench_whatif.py's medians over rounds, the worse of its two model shapes
# (RESULTS.md). None where it was not: no CPU run can make communication free or the network faster.
VALIDATED_ERROR_PCT: Mapping[str, Mapping[str, float] | None] = {
    # both ways: =false from a run that reshards (6.8%, 0.63%) and =true from one that does not (6.3% at 5 rounds,
    # 14.2% at 3; 1.78%)
    "reshard_after_forward": {"median_step_s": 6.8, "peak_tracked_bytes": 1.78},
    # both ways: SHARD_GRAD_OP (2.9%; 1.3% at 5 rounds, 10.4% at 3) and FULL_SHARD (8.0%, 3.18%)
    "sharding_strategy": {"median_step_s": 8.0, "peak_tracked_bytes": 3.18},
    "micro_batch": {"median_step_s": 31.5, "peak_tracked_bytes": 1.28},  # at a micro-batch of 2 (docs/whatif.md)
    "world_size": {"median_step_s": 9.3, "peak_tracked_bytes": 3.42},  # from 2 ranks to 1
    "grad_accum": {"median_step_s": 8.4, "peak_tracked_bytes": 0.0},  # DeepSpeed ZeRO-2 and ZeRO-3
    "zero_stage": {"median_step_s": 5.5, "peak_tracked_bytes": 5.88},  # DeepSpeed 1 -> 2 and 2 -> 1, 1 to 14 buckets
    "comm": None,
    "bandwidth": None,
}


@frozen
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


@frozen
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
    def step_delta_s(self) -> float | None:
        """The predicted median step less the replay's: the model against itself."""
        predicted, replay = self.predicted.median_step_s, self.replay.median_step_s
        return None if predicted is None or replay is None else predicted - replay

    @property
    def step_change_pct(self) -> float | None:
        return _error_pct(self.predicted.median_step_s, self.replay.median_step_s)

    @property
    def peak_delta_bytes(self) -> int | None:
        """The predicted peak of the tracked categories less the measured one."""
        predicted, measured = self.predicted.peak_tracked_bytes, self.measured.peak_tracked_bytes
        return None if predicted is None or measured is None else predicted - measured

    def left_bytes(self, capacity: int | None = None) -> int | None:
        """What the predicted peak leaves of ``capacity`` (the recording's own by default); negative: over it."""
        capacity = capacity or self.capacity_bytes
        peak = self.predicted.peak_tracked_bytes
        return None if not capacity or peak is None else capacity - peak

    @property
    def samples_factor(self) -> float:
        """How many times the samples a step trains on with the changes (micro-batch times accumulation)."""
        factor = 1.0
        for c in self.changes:
            if c.kind in ("micro_batch", "grad_accum"):
                factor *= c.factor
        return factor

    @property
    def per_sample_change_pct(self) -> float | None:
        """The predicted time a sample takes against the replay's: what a change of the samples a step trains on
        is judged by."""
        predicted, replay = self.predicted.median_step_s, self.replay.median_step_s
        if predicted is None or not replay:
            return None
        return 100.0 * (predicted / self.samples_factor / replay - 1.0)

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
            "samples_per_step_factor": self.samples_factor,
            "per_sample_change_pct": self.per_sample_change_pct,
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


def what_if(recordings: Sequence[Recording], changes: Sequence[Change]) -> WhatIf:
    """The answer for ``changes`` applied together; Refused or ChangeError where the recording cannot say."""
    if not recordings:
        raise Refused("no rank recordings")
    world = max((r.run_info.world_size for r in recordings if r.run_info is not None), default=len(recordings))
    if len(recordings) < world:
        raise Refused(f"{len(recordings)} of the run's {world} ranks were recorded here: the ranks' collectives are "
                      "replayed together, so every rank's recording is needed (a run on several nodes: give "
                      "each node's folder)")
    on_device = device_run(recordings)
    steps = replayable_steps(recordings, on_device)
    chains = tuple(rank_chain(r, steps, on_device) for r in recordings)
    _refuse_subgroups(chains)
    first = measured_transfers(chains)
    if not first and any(c.shapes for c in chains):
        raise Refused("no collective's completion was measured on every rank: nothing to fit its time from")
    fits = fit_collectives(chains, first)
    model = RunModel(chains, fits, measured_transfers(chains, fits),
                   {r.rank: tuple(tracked_samples(r.memory)) for r in recordings})
    assumptions = [f"{len(steps)} steps replayed ({_steps_words(steps)}), from their start on every rank as "
                   "measured",
                   "compute keeps its measured length; each collective its own measured time where the change "
                   "leaves it, the fit of its op and group where it is made anew"]
    if on_device:
        assumptions.append("a GPU run: each rank's chain is its compute stream's, as the CUDA events of the steps "
                           "timed on the device place it (ZEROMON_DEVICE_TIMING_EVERY); the stream's time between "
                           "two collectives is taken as compute, so a run whose GPU waits for the host's launches "
                           "is predicted as if it did not")
    base = _run(model, model.chains, _measured_seconds(model))
    info = recordings[0].run_info
    chains_after, memory_after = model.chains, model.memory
    seconds_of: SecondsOf = _measured_seconds
    # In one order whatever the order given: the resharding reads the run's own units, the accumulation copies the
    # micro-batch as the others left it (and reduces where the new stage does), and the collectives' times change
    # last, the ones the others made too.
    for change in sorted(changes, key=lambda c: APPLY_ORDER.index(c.kind)):
        chains_after, seconds_of, memory_after = apply_change(change, info, model, chains_after, seconds_of, memory_after,
                                                        assumptions)
        info = changed_info(change, info)
    predicted = _run(model, chains_after, seconds_of(model), memory_after)
    capacity = next((m.capacity for r in recordings for m in reversed(r.memory) if m.capacity), None)
    return WhatIf(changes=tuple(changes), measured=_measured(recordings, model, base), replay=base,
                  predicted=predicted, steps=tuple(steps), fits=tuple(fits.values()),
                  assumptions=tuple(assumptions), capacity_bytes=capacity)


def device_run(recordings: Sequence[Recording]) -> bool:
    """Whether the run trained on a GPU: its collectives timed on the device (or launched in a step that was not),
    or its phases timed on the stream (a one-GPU run may issue no collective)."""
    return any(set(rec.collective_columns().timing) & _GPU_TIMINGS
               or any(p.timing == DEVICE_CLOCK for p in rec.phases) for rec in recordings)


def replayable_steps(recordings: Sequence[Recording], on_device: bool = False) -> list[int]:
    """The steps replayed: those every rank summarized and kept the detail of, and whose collectives' groups are
    known (the agent could not size a group DeepSpeed's ZeRO-3 broadcasts to in its first steps: such a step
    cannot be matched across ranks). On the host, the last MAX_STEPS of their longest stretch of consecutive
    steps; in a GPU run, the last MAX_STEPS of those timed on the device on every rank (every collective and
    phase on the stream's clock: [Note: a GPU run's chain] in zeromon.analysis.whatif.chain), which need not
    follow each other."""
    common: set[int] | None = None
    on_host: set[int] = set()  # a GPU run's timed steps that also ran a collective timed on the host
    for rec in recordings:
        columns = rec.collective_columns()
        summarized = {s.step for s in rec.steps if s.step >= 0}
        detailed = {p.step for p in rec.phases} | set(columns.step)
        unknown_groups = {step for step, size in zip(columns.step, columns.group_size, strict=True) if size < 1}
        steps = (summarized & detailed) - unknown_groups
        if on_device:  # CUDA events on the compute stream: the chain's clock (an NCCL hook's times are its stream's)
            off_stream = {step for step, timing in zip(columns.step, columns.timing, strict=True)
                          if timing != DEVICE_CLOCK}
            on_host |= off_stream & {step for step, timing in zip(columns.step, columns.timing, strict=True)
                                     if timing == DEVICE_CLOCK}
            steps -= off_stream
            steps -= {p.step for p in rec.phases if p.phase != Phase.AGENT and p.timing != DEVICE_CLOCK}
        common = steps if common is None else common & steps
    if on_device:
        timed = sorted(common or ())
        if len([s for s in timed if s >= 1]) < MIN_STEPS:
            host = (f"; {len(on_host)} steps timed on the device also ran collectives timed on the host (a gloo "
                    "group beside NCCL), whose clock is not the stream's" if on_host else "")
            raise Refused(f"the ranks share {len(timed)} steps timed on the device (every collective and phase "
                          f"by CUDA events); at least {MIN_STEPS + 1} are needed: a longer run, or "
                          f"ZEROMON_DEVICE_TIMING_EVERY=1 to time every step (docs/settings.md){host}")
        return timed[-MAX_STEPS:]
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


def _measured_seconds(model: RunModel) -> dict[CollectiveKey, dict[int, float]]:
    """Each collective's measured time on each rank, its fit's where that was not measured."""
    seconds: dict[CollectiveKey, dict[int, float]] = {}
    for key, shape in model.chains[0].shapes.items():
        fit = model.fits.get((shape.op, shape.group_size))
        fitted = fit.seconds(shape.bus_bytes) if fit is not None else 0.0
        measured = model.transfers.get(key, {})
        seconds[key] = {c.rank: measured.get(c.rank, fitted) for c in model.chains}
    return seconds


def _run(model: RunModel, chains: Sequence[RankChain], seconds: Mapping[CollectiveKey, Mapping[int, float]],
         memory: Mapping[int, tuple[TrackedSample, ...]] | None = None) -> Figures:
    _refuse_unseen_sizes(model, chains)
    wanted = {k for c in chains for k in c.issue_ns}
    try:
        result = replay(chains, {k: v for k, v in seconds.items() if k in wanted})
    except ChainsDoNotMatch as exc:
        raise Refused(str(exc)) from exc
    return _figures(result, model.memory if memory is None else memory)


def _refuse_unseen_sizes(model: RunModel, chains: Sequence[RankChain]) -> None:
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
    return Figures(median_step_s=result.median_of("step_s"), peak_tracked_bytes=peak, peak_categories=categories,
                   compute_s=result.median_of("compute_s"), transfer_s=result.median_of("transfer_s"),
                   waiting_s=result.median_of("waiting_s"), exposed_s=result.median_of("exposed_s"))


def _peak(memory: Mapping[int, Sequence[TrackedSample]]) -> tuple[int | None, Mapping[str, int]]:
    """The highest sample over the ranks: its tracked bytes and categories."""
    best = highest(s for samples in memory.values() for s in samples)
    return (None, {}) if best is None else (best.total, dict(best.categories))


def _measured(recordings: Sequence[Recording], model: RunModel, base: Figures) -> Figures:
    """The run as recorded: the median step and exposed communication by `zeromon report`'s own tables; the
    compute is the replay's, which keeps every compute segment as measured."""
    tables = [step_table(rec) for rec in recordings]
    peak, categories = _peak(model.memory)
    return Figures(median_step_s=_median_over_ranks(t.steady_median("step_s") for t in tables),
                   peak_tracked_bytes=peak, peak_categories=categories, compute_s=base.compute_s,
                   exposed_s=_median_over_ranks(t.steady_median("exposed_comm_s") for t in tables))


def _median_over_ranks(medians: Iterable[float | None]) -> float | None:
    known = [m for m in medians if m is not None]
    return statistics.median(known) if known else None
