"""`zeromon whatif`: the model's pieces against cases computed by hand, every refusal, the JSON's keys, and a
real 2-rank FSDP2 pair (reshard_after_forward true, predicted false, run false for real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ranks_args, zeromon
from zeromon.analysis.whatif import ChangeError, Refused, parse_change, what_if
from zeromon.analysis.whatif.answer import device_run
from zeromon.analysis.whatif.chain import (
    COMPUTE,
    ISSUE,
    STEP_END,
    STEP_START,
    SYNC,
    WAIT,
    RankChain,
    Segment,
    rank_chain,
)
from zeromon.analysis.whatif.fit import fit_line
from zeromon.analysis.whatif.replay import ChainsDoNotMatch, replay
from zeromon.cli import main
from zeromon.model.codec import Recording
from zeromon.model.events import CollectiveEvent, MemorySample, PhaseSpan, RunInfo, StepSummary
from zeromon_agent.hooks.state import timed_step

MS = 1e-3
KEY = (0, "all_reduce", 2, 0)


def _chain(rank: int, segments: list[Segment], start_ns: int = 0) -> RankChain:
    keys = {s.key for s in segments if s.key is not None}
    return RankChain(rank=rank, start_ns=start_ns, segments=tuple(segments), issue_ns=dict.fromkeys(keys, 0),
                     complete_ns={}, shapes={})


def _step(*middle: Segment) -> list[Segment]:
    return [Segment(STEP_START, 0.0, 0, ""), *middle, Segment(STEP_END, 0.0, 0, "")]


def test_a_late_peer_makes_the_early_rank_wait_and_the_transfer_starts_at_its_issue() -> None:
    early = _chain(0, _step(Segment(COMPUTE, 10 * MS, 0, "forward"), Segment(SYNC, 0.0, 0, "forward", KEY),
                            Segment(COMPUTE, 5 * MS, 0, "backward")))
    late = _chain(1, _step(Segment(COMPUTE, 30 * MS, 0, "forward"), Segment(SYNC, 0.0, 0, "forward", KEY),
                           Segment(COMPUTE, 5 * MS, 0, "backward")))
    result = replay([early, late], {KEY: {0: 4 * MS, 1: 4 * MS}})
    (s0,), (s1,) = result.steps[0], result.steps[1]
    assert s0.step_s == pytest.approx(39 * MS) and s1.step_s == pytest.approx(39 * MS)
    assert s0.waiting_s == pytest.approx(20 * MS) and s0.transfer_s == pytest.approx(4 * MS)
    assert s1.waiting_s == pytest.approx(0.0) and s1.transfer_s == pytest.approx(4 * MS)
    hidden = replay([early, late], {KEY: {0: 0.0, 1: 0.0}})
    assert hidden.steps[0][0].step_s == pytest.approx(35 * MS)
    assert hidden.steps[0][0].waiting_s == pytest.approx(20 * MS)  # overlap cannot hide a late peer


def test_a_groups_async_collectives_run_one_after_the_other_from_their_last_issue() -> None:
    second = (0, "all_gather", 2, 0)

    def rank(r: int) -> RankChain:
        return _chain(r, _step(Segment(ISSUE, 1 * MS, 0, "forward", KEY), Segment(ISSUE, 1 * MS, 0, "forward", second),
                               Segment(COMPUTE, 2 * MS, 0, "forward"), Segment(WAIT, 0.0, 0, "forward", KEY),
                               Segment(WAIT, 0.0, 0, "forward", second)))

    result = replay([rank(0), rank(1)], {KEY: {0: 5 * MS, 1: 5 * MS}, second: {0: 3 * MS, 1: 3 * MS}})
    # the first starts at its issue (0) and ends at 5; the second, issued at 1, waits for the first: 5 + 3 = 8
    (step,) = result.steps[0]
    assert step.step_s == pytest.approx(8 * MS)
    assert step.compute_s == pytest.approx(2 * MS) and step.transfer_s == pytest.approx(6 * MS)
    assert result.collective_start_s[second] == pytest.approx(5 * MS)


def test_collectives_issued_in_another_order_by_a_peer_are_named() -> None:
    other = (0, "all_gather", 2, 0)
    first = _chain(0, _step(Segment(SYNC, 0.0, 0, "forward", KEY), Segment(SYNC, 0.0, 0, "forward", other)))
    second = _chain(1, _step(Segment(SYNC, 0.0, 0, "forward", other), Segment(SYNC, 0.0, 0, "forward", KEY)))
    with pytest.raises(ChainsDoNotMatch, match=r"rank 0 waits for step 1's all_reduce #1 \(group of 2\)"):
        replay([first, second], {KEY: {0: MS, 1: MS}, other: {0: MS, 1: MS}})


def test_resharding_gathers_each_unit_but_the_root_again_before_its_backward() -> None:
    from zeromon.analysis.whatif.chain import CollectiveShape
    from zeromon.analysis.whatif.changes import with_regathers

    gathers = [(0, "all_gather", 2, i) for i in range(3)]  # the root's, then two blocks', in forward order
    reductions = [(0, "reduce_scatter", 2, i) for i in range(3)]  # the blocks' in reverse, the root's last
    segments = _step(*[Segment(SYNC, 0.0, 0, "forward", k) for k in gathers], Segment(COMPUTE, MS, 0, "backward"),
                     Segment(SYNC, 0.0, 0, "backward", reductions[0]), Segment(COMPUTE, MS, 0, "backward"),
                     Segment(SYNC, 0.0, 0, "backward", reductions[1]), Segment(COMPUTE, MS, 0, "backward"),
                     Segment(SYNC, 0.0, 0, "backward", reductions[2]))
    shapes = {k: CollectiveShape("all_gather", 2, 1000 * (i + 1), "param_all_gather", False)
              for i, k in enumerate(gathers)}
    shapes |= {k: CollectiveShape("reduce_scatter", 2, 500, "grad_reduce_scatter", False) for k in reductions}
    order = [*gathers, *reductions]
    chain = RankChain(rank=0, start_ns=0, segments=tuple(segments), issue_ns={k: i for i, k in enumerate(order)},
                      complete_ns={}, shapes=shapes, phases={k: "forward" if k in gathers else "backward"
                                                             for k in order})
    after, added = with_regathers(chain)
    assert [(k, shape.array_bytes) for k, shape in added.items()] == [((0, "all_gather", 2, 3), 3000),
                                                                      ((0, "all_gather", 2, 4), 2000)]
    backward = [(s.kind, s.key) for s in after.segments if s.phase == "backward"]
    assert backward == [("sync", (0, "all_gather", 2, 3)), ("compute", None), ("sync", reductions[0]),
                        ("sync", (0, "all_gather", 2, 4)), ("compute", None), ("sync", reductions[1]),
                        ("compute", None), ("sync", reductions[2])]  # the root's backward: no gather


def test_the_fit_recovers_a_line_through_known_points() -> None:
    points = [(x, 0.001 + 2e-9 * x) for x in (1e4, 1e5, 1e6, 4e6) for _ in range(3)]
    fit = fit_line(points, "all_gather", 2)
    assert fit.alpha_s == pytest.approx(0.001) and fit.beta_s_per_byte == pytest.approx(2e-9)
    assert fit.busbw_bytes_per_s == pytest.approx(5e8) and fit.residual_pct == pytest.approx(0.0, abs=1e-9)
    assert fit.seconds(2e6) == pytest.approx(0.005)  # outside the buckets seen: the line
    assert not fit.single_size and fit.samples == 12


def test_one_size_is_a_bandwidth_through_the_origin_and_a_negative_intercept_refits_through_it() -> None:
    single = fit_line([(1e6, 0.002), (1e6, 0.004)])
    assert single.single_size and single.alpha_s == 0.0 and single.beta_s_per_byte == pytest.approx(3e-9)
    steep = fit_line([(1e5, 0.0001), (1e6, 0.003)])  # the line through both crosses 0 below zero
    assert steep.alpha_s == 0.0 and steep.beta_s_per_byte > 0
    assert steep.beta_s_per_byte == pytest.approx((1e5 * 0.0001 + 1e6 * 0.003) / (1e10 + 1e12))


def test_within_a_size_bucket_the_time_is_the_buckets_mean() -> None:
    # Small collectives that cost far more than the line through the large ones says.
    points = [(512.0, 0.0005), (512.0, 0.0007), (1e5, 0.0006), (1e6, 0.002), (1e6, 0.002)]
    fit = fit_line(points)
    assert fit.seconds(512.0) == pytest.approx(0.0006)
    assert fit.seconds(1e5) == pytest.approx(0.0006)
    assert fit.residual_pct < fit.line_residual_pct


@pytest.mark.parametrize("text, message", [
    ("comm", "a change is NAME=VALUE"),
    ("comm=visible", "comm takes 'hidden'"),
    ("bandwidth=fast", "bandwidth takes a factor greater than 0"),
    ("micro_batch=x0", "micro_batch takes a factor greater than 0"),
    ("reshard_after_forward=maybe", "takes true or false"),
    ("sharding_strategy=HYBRID", "FULL_SHARD, SHARD_GRAD_OP or NO_SHARD"),
    ("zero_stage=4", "zero_stage takes 0, 1, 2 or 3"),
    ("grad_accum=x2", "grad_accum takes a whole number, 1 or more"),
    ("world_size=0", "world_size takes a whole number, 1 or more"),
    ("learning_rate=2", "unknown change 'learning_rate'"),
])
def test_a_change_written_wrong_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(ChangeError, match=message):
        parse_change(text)
    assert parse_change("bandwidth=x2").factor == 2.0 and parse_change("micro_batch=0.5").factor == 0.5


def test_the_remedies_whatif_answers_are_named_by_the_change_they_are_answered_as() -> None:
    from zeromon.analysis.comm_advice import overlap_remedies
    from zeromon.analysis.remedy_changes import remedy_change

    def info(framework: str, **knobs: object) -> RunInfo:
        return RunInfo(rank=0, local_rank=0, world_size=2, host="h", pid=1, job="j", framework=framework,
                       framework_version=None, torch_version=None, backend="nccl", device="cuda:0", zero_stage=None,
                       fsdp_strategy=None, param_dtype=None, reduce_dtype=None, optimizer=None, knobs=knobs)

    answered = {remedy_change(r) for r in overlap_remedies(info("fsdp2", reshard_after_forward="mixed"))}
    assert answered == {"reshard_after_forward=false", "micro_batch=x2", None}
    assert remedy_change("sharding_strategy=FULL_SHARD (now SHARD_GRAD_OP): parameters are sharded between forward "
                         "and backward too") == "sharding_strategy=FULL_SHARD"
    assert remedy_change("sharding_strategy=FULL_SHARD (now NO_SHARD): ...") is None  # not answered: refused
    from zeromon.analysis.memory_remedies import higher_stage_remedy

    assert remedy_change(higher_stage_remedy(1)) == "zero_stage=2"
    assert remedy_change(higher_stage_remedy(2)) is None  # to ZeRO-3: refused


# --- synthetic recordings: two ranks, a synchronous all-reduce in each step ---------------------------------


def _recording(rank: int, steps: int = 6, *, framework: str = "fsdp2", timing: str = "sync", group_size: int = 2,
               detail_every: int = 1, device_every: int | None = None) -> Recording:
    """``device_every``: a GPU run, its collectives and phases timed with CUDA events in the steps the agent times
    at ZEROMON_DEVICE_TIMING_EVERY=device_every, the others' collectives launched (no completion)."""
    step_ns = 10_000_000
    collectives, phases, summaries, memory = [], [], [], []
    for step in range(steps):
        start = step * step_ns
        if device_every is not None:
            timing = "cuda_event" if timed_step(step, device_every) else "launch"
        clock = "cuda_event" if timing == "cuda_event" else "host"
        summaries.append(StepSummary(rank=rank, step=step, start_ns=start, end_ns=start + step_ns,
                                     phase_s={"forward": 0.01}, collectives=1, comm_bytes=1 << 20,
                                     comm_bytes_by_op={"all_reduce": 1 << 20}, comm_union_s=0.002,
                                     blocked_s=0.002, peak_memory=None))
        if step % detail_every:
            continue
        phases.append(PhaseSpan(rank=rank, step=step, phase="forward", start_ns=start, end_ns=start + step_ns,
                                timing=clock))
        collectives.append(CollectiveEvent(
            seq=step, rank=rank, step=step, phase="forward", op="all_reduce", api="all_reduce", bytes_in=1 << 20,
            bytes_out=1 << 20, dtype="float32", group_size=group_size, async_op=False, issue_ns=start + 5_000_000,
            complete_ns=None if timing == "launch" else start + 7_000_000, blocked_s=0.002, timing=timing, meaning="grad_all_reduce",
            wait_ns=start + 5_000_000, issue_s=0.002))
        memory.append(MemorySample(rank=rank, step=step, phase="forward", t_ns=start + 9_000_000, device="cpu",
                                   allocated=None, reserved=None, active=None, peak_allocated=None,
                                   peak_reserved=None, inactive_split=None, num_alloc_retries=None, num_ooms=None,
                                   capacity=1 << 30, free=None, rss=None,
                                   categories={"sharded_params": 1000, "activations": 5000 + rank}))
    info = RunInfo(rank=rank, local_rank=rank, world_size=2, host="h", pid=1, job="j", framework=framework,
                   framework_version=None, torch_version=None, backend="gloo", device="cpu", zero_stage=None,
                   fsdp_strategy=None, param_dtype=None, reduce_dtype=None, optimizer=None)
    return Recording(path=Path(f"rank-{rank}.jsonl"), header={"rank": rank}, collectives=collectives, phases=phases,
                     memory=memory, steps=summaries, run_info=info)


def _pair(**kwargs: object) -> list[Recording]:
    return [_recording(0, **kwargs), _recording(1, **kwargs)]  # type: ignore[arg-type]


def test_the_unchanged_replay_gives_back_a_regular_runs_step_and_peak() -> None:
    answer = what_if(_pair(), [parse_change("comm=hidden")])
    assert answer.measured.median_step_s == pytest.approx(0.010)
    assert answer.replay.median_step_s == pytest.approx(0.010) and answer.replay_error_pct == pytest.approx(0.0)
    assert answer.predicted.median_step_s == pytest.approx(0.008)  # the 2 ms all-reduce hidden
    assert answer.measured.peak_tracked_bytes == 6001 == answer.predicted.peak_tracked_bytes


def test_a_larger_micro_batch_scales_the_forwards_compute_and_the_activations() -> None:
    answer = what_if(_pair(), [parse_change("micro_batch=x2")])
    assert answer.predicted.median_step_s == pytest.approx(0.018)  # 8 ms of forward twice, the 2 ms as it was
    assert answer.samples_factor == 2.0 and answer.per_sample_change_pct == pytest.approx(-10.0)  # 18 / 2 vs 10
    assert answer.predicted.peak_tracked_bytes == 1000 + 2 * 5001


def test_a_faster_network_shortens_only_the_transfer() -> None:
    answer = what_if(_pair(), [parse_change("bandwidth=x2")])
    assert answer.predicted.median_step_s == pytest.approx(0.009)  # one size: all of its 2 ms is transfer


def test_more_ranks_move_each_collective_by_its_fit_and_shard_the_state_finer() -> None:
    answer = what_if(_pair(), [parse_change("world_size=4")])
    # an all-reduce's bus factor 2(n-1)/n: 1 at 2 ranks, 1.5 at 4; one size, so all of its 2 ms is per bus byte
    assert answer.predicted.median_step_s == pytest.approx(0.011)
    assert answer.predicted.peak_tracked_bytes == 500 + 5001  # FSDP's sharded parameters 1/4 instead of 1/2


@pytest.mark.parametrize("framework, step_s", [("fsdp2", 0.020), ("ddp", 0.018)])
def test_accumulation_repeats_the_micro_batch_and_reduces_where_the_framework_does(framework: str,
                                                                                   step_s: float) -> None:
    answer = what_if(_pair(framework=framework), [parse_change("grad_accum=2")])
    # FSDP reduces in every micro-batch: two 10 ms micro-batches; DDP under no_sync at the last only: 8 + 10 ms
    assert answer.predicted.median_step_s == pytest.approx(step_s)
    assert answer.predicted.peak_tracked_bytes == answer.measured.peak_tracked_bytes


def test_one_rank_has_no_collective_and_holds_the_whole_state() -> None:
    answer = what_if(_pair(), [parse_change("world_size=1")])
    assert answer.predicted.median_step_s == pytest.approx(0.008)
    assert answer.predicted.peak_tracked_bytes == 2000 + 5001
    assert answer.predicted.transfer_s == 0.0 and answer.predicted.waiting_s == 0.0


@pytest.mark.parametrize("pair, change, message", [
    (dict(), "world_size=2", "already has 2 ranks"),
    (dict(detail_every=10), "comm=hidden", "consecutive steps with their detail"),
    (dict(timing="launch"), "comm=hidden", "the ranks share 0 steps timed on the device"),
    (dict(steps=12, device_every=8), "comm=hidden", "share 3 steps timed on the device .* ZEROMON_DEVICE_TIMING_EVERY=1"),
    (dict(group_size=4), "comm=hidden", "groups of \\[4\\] ranks among 2"),
    (dict(steps=3), "comm=hidden", "at least 4 are needed"),
    (dict(framework="deepspeed"), "reshard_after_forward=false", "reshard_after_forward is FSDP2's"),
    (dict(framework="fsdp2"), "sharding_strategy=SHARD_GRAD_OP", "sharding_strategy is FSDP1's"),
    (dict(framework="fsdp2"), "reshard_after_forward=false", "no re-gather of parameters in the backward"),
    (dict(framework="fsdp2"), "reshard_after_forward=true", "this run already reshards after the forward"),
    (dict(framework="fsdp1"), "sharding_strategy=NO_SHARD", "is not answered yet; FULL_SHARD to SHARD_GRAD_OP"),
])
def test_what_one_recording_cannot_support_is_refused_with_the_reason(pair: dict[str, object], change: str,
                                                                      message: str) -> None:
    with pytest.raises((Refused, ChangeError), match=message):
        what_if(_pair(**pair), [parse_change(change)])


def test_a_gpu_run_is_replayed_on_its_streams_clock_from_the_steps_timed_on_the_device() -> None:
    every = what_if(_pair(timing="cuda_event"), [parse_change("comm=hidden")])
    assert every.steps == (0, 1, 2, 3, 4, 5) and any("compute stream's" in a for a in every.assumptions)
    assert every.replay.median_step_s == pytest.approx(0.010) and every.replay_error_pct == pytest.approx(0.0)
    assert every.predicted.median_step_s == pytest.approx(0.008)
    # The agent's default: the first two steps, then 1 in 8; the launched steps between them are not replayed,
    # and the time between two timed steps is no step's.
    sampled = what_if(_pair(steps=20, device_every=32), [parse_change("micro_batch=x2")])
    assert sampled.steps == (0, 1, 8, 16)
    assert sampled.replay.median_step_s == pytest.approx(0.010)
    assert sampled.predicted.median_step_s == pytest.approx(0.018)
    # A one-GPU run that issues no collective (FSDP2 on one rank): its phases on the stream make it a GPU run.
    alone = [_recording(0, timing="cuda_event")]
    alone[0].collectives.clear()
    assert device_run(alone) and not device_run(_pair())


def test_a_gpu_run_whose_timed_steps_also_ran_a_gloo_collective_is_refused_saying_so() -> None:
    import dataclasses

    recordings = _pair(timing="cuda_event")
    for rec in recordings:  # a gloo group beside NCCL: a synchronous collective on the host's clock in every step
        rec.collectives.extend(dataclasses.replace(c, seq=100 + c.seq, op="broadcast", api="broadcast",
                                                   timing="sync") for c in list(rec.collectives))
    with pytest.raises(Refused, match="share 0 steps timed on the device.*6 steps timed on the device also ran "
                                      "collectives timed on the host"):
        what_if(recordings, [parse_change("comm=hidden")])


def test_on_the_stream_an_async_issue_costs_nothing_and_a_wait_that_held_it_no_time_is_a_bound() -> None:
    import dataclasses

    def recording(rank: int) -> Recording:
        rec = _recording(rank, timing="cuda_event")
        rec.collectives[:] = [dataclasses.replace(c, async_op=True, issue_s=0.001, wait_ns=c.issue_ns + 1_000_000,
                                                  blocked_s=0.001 if c.step % 2 else 1e-6)
                              for c in rec.collectives]
        return rec

    chain = rank_chain(recording(0), range(6), on_device=True)
    assert [s.seconds for s in chain.segments if s.kind == ISSUE] == [0.0] * 6
    assert sorted(k[0] for k in chain.complete_ns) == [1, 3, 5]  # the stream waited 1 ms: the completion
    host = rank_chain(recording(0), range(6))
    assert [s.seconds for s in host.segments if s.kind == ISSUE] == [0.001] * 6


def test_more_ranks_from_a_one_rank_run_are_refused() -> None:
    import dataclasses

    alone = _recording(0, group_size=1)
    assert alone.run_info is not None
    alone = dataclasses.replace(alone, run_info=dataclasses.replace(alone.run_info, world_size=1))
    with pytest.raises(Refused, match="a 1-rank run issues no collective over the world"):
        what_if([alone], [parse_change("world_size=2")])


def test_a_step_with_a_collective_in_a_group_of_unknown_size_is_left_out_of_the_replay() -> None:
    import dataclasses

    recordings = _pair(steps=7)
    for rec in recordings:  # DeepSpeed's ZeRO-3 broadcasts to a group the agent cannot size in its first steps
        rec.collectives[0] = dataclasses.replace(rec.collectives[0], group_size=-1)
    assert what_if(recordings, [parse_change("comm=hidden")]).steps == (1, 2, 3, 4, 5, 6)


def test_a_run_missing_a_ranks_recording_is_refused() -> None:
    with pytest.raises(Refused, match="1 of the run's 2 ranks were recorded here"):
        what_if(_pair()[:1], [parse_change("comm=hidden")])


def test_a_collective_far_outside_the_sizes_measured_is_refused() -> None:
    recordings = _pair()
    for rec in recordings:  # the last step's all-reduce, 8 times larger and with no measured completion
        last = rec.collectives[-1]
        rec.collectives[-1] = CollectiveEvent(**{**{f: getattr(last, f) for f in last.__slots__},  # type: ignore[index]
                                                 "bytes_in": 8 << 20, "bytes_out": 8 << 20, "timing": "bound"})
    with pytest.raises(Refused, match="more than 2x outside the sizes measured"):
        what_if(recordings, [parse_change("comm=hidden")])


# --- DeepSpeed's ZeRO-1 and ZeRO-2 on synthetic recordings: 1,000 fp32 parameters over two ranks -----------

PARAMS = 1000
PARAM_BYTES = 4 * PARAMS  # the fp32 parameters, and their gradients
OPTIMIZER_BYTES = 12 * PARAMS // 2  # the rank's half of the fp32 master copy and Adam's two moments
FORWARD_ACTIVATIONS, BACKWARD_ACTIVATIONS = 3000, 2500


def _gradient_reduction(rank: int, step: int, seq: int, issue_ns: int, size: int, *, phase: str = "backward",
                        meaning: str = "grad_all_reduce", op: str = "all_reduce", bytes_out: int | None = None,
                        ) -> CollectiveEvent:
    return CollectiveEvent(seq=seq, rank=rank, step=step, phase=phase, op=op, api=op, bytes_in=size,
                           bytes_out=size if bytes_out is None else bytes_out, dtype="float32", group_size=2,
                           async_op=False, issue_ns=issue_ns, complete_ns=issue_ns + 1_000_000, blocked_s=0.001,
                           timing="sync", meaning=meaning, wait_ns=issue_ns, issue_s=0.001)


def _memory(rank: int, step: int, phase: str, t_ns: int, **categories: int) -> MemorySample:
    return MemorySample(rank=rank, step=step, phase=phase, t_ns=t_ns, device="cpu", allocated=None, reserved=None,
                        active=None, peak_allocated=None, peak_reserved=None, inactive_split=None,
                        num_alloc_retries=None, num_ooms=None, capacity=1 << 30, free=None, rss=None,
                        categories=categories)


def _deepspeed_recording(rank: int, stage: int, buckets: int = 1, *, bucket_elements: int = 2000,
                         dtype: str = "float32", **knobs: object) -> Recording:
    """A 20 ms step: 6 ms of forward, 8 of backward holding ``buckets`` 1 ms gradient all-reduces (ZeRO-2: one
    after each share of the backward's compute; ZeRO-1: at its end), then the optimizer's 4-byte all-reduce and its
    all-gather of the updated parameters; the walks at the forward's end and at the backward's highest moment."""
    step_ns, ms = 20_000_000, 1_000_000
    collectives, phases, summaries, memory = [], [], [], []
    for step in range(6):
        start = step * step_ns
        summaries.append(StepSummary(rank=rank, step=step, start_ns=start, end_ns=start + step_ns, phase_s={},
                                     collectives=buckets + 2, comm_bytes=0, comm_bytes_by_op={}, comm_union_s=0.0,
                                     blocked_s=0.0, peak_memory=None))
        for phase, begin, end in (("forward", 0, 6), ("backward", 6, 14), ("optimizer", 14, 20)):
            phases.append(PhaseSpan(rank=rank, step=step, phase=phase, start_ns=start + begin * ms,
                                    end_ns=start + end * ms))
        seq = step * 10
        share = 8 // (buckets + 1) if stage == 2 else 0  # ZeRO-1: no compute between its reductions
        at = 14 - buckets - share * (buckets - 1) - 1  # the last reduction ends 1 ms before the backward's end
        for k in range(buckets):
            size = PARAM_BYTES // buckets
            collectives.append(_gradient_reduction(rank, step, seq + k, start + at * ms, size) if stage < 3 else
                               _gradient_reduction(rank, step, seq + k, start + at * ms, size, op="reduce_scatter",
                                                   meaning="grad_reduce_scatter", bytes_out=size // 2))
            at += 1 + share
        collectives.append(_gradient_reduction(rank, step, seq + 8, start + 15 * ms, 4, phase="optimizer",
                                               meaning="unknown"))
        collectives.append(_gradient_reduction(rank, step, seq + 9, start + 18 * ms, PARAM_BYTES // 2,
                                               phase="optimizer", meaning="param_all_gather", op="all_gather",
                                               bytes_out=PARAM_BYTES))
        held = {"unsharded_params": PARAM_BYTES, "optimizer_state": OPTIMIZER_BYTES}
        gradients = bucket_elements * 4 if stage == 2 else PARAM_BYTES * 3 // 4  # the bucket; most gradients
        memory.append(_memory(rank, step, "forward", start + 6 * ms, **held, activations=FORWARD_ACTIVATIONS))
        memory.append(_memory(rank, step, "backward_peak", start + 7 * ms, **held, unsharded_grads=gradients,
                              activations=BACKWARD_ACTIVATIONS))
    info = RunInfo(rank=rank, local_rank=rank, world_size=2, host="h", pid=1, job="j", framework="deepspeed",
                   framework_version="0.19.8", torch_version=None, backend="gloo", device="cpu", zero_stage=stage,
                   fsdp_strategy=None, param_dtype=dtype, reduce_dtype=None, optimizer="AdamW",
                   knobs={"stage": stage, "contiguous_gradients": True, "reduce_bucket_size": bucket_elements,
                          "gradient_accumulation_steps": 1, **knobs})
    return Recording(path=Path(f"rank-{rank}.jsonl"), header={"rank": rank}, collectives=collectives, phases=phases,
                     memory=memory, steps=summaries, run_info=info)


def _deepspeed_pair(stage: int, buckets: int = 1, **kwargs: object) -> list[Recording]:
    return [_deepspeed_recording(r, stage, buckets, **kwargs) for r in (0, 1)]  # type: ignore[arg-type]


def _gradient_chain(layout: list[tuple[str, float]]) -> RankChain:
    """One step of a rank's chain: ("compute", ms) in the backward, ("reduce", ms) a gradient all-reduce."""
    from zeromon.analysis.whatif.chain import CollectiveShape

    segments, shapes = [Segment(STEP_START, 0.0, 0, "")], {}
    for kind, ms in layout:
        if kind == "compute":
            segments.append(Segment(COMPUTE, ms * MS, 0, "backward"))
            continue
        key = (0, "all_reduce", 2, len(shapes))
        shapes[key] = CollectiveShape("all_reduce", 2, 1000, "grad_all_reduce", False)
        segments.append(Segment(SYNC, ms * MS, 0, "backward", key))
    segments += [Segment(COMPUTE, 2 * MS, 0, "optimizer"), Segment(STEP_END, 0.0, 0, "")]
    return RankChain(rank=0, start_ns=0, segments=tuple(segments), issue_ns=dict.fromkeys(shapes, 0),
                     complete_ns={}, shapes=shapes, phases=dict.fromkeys(shapes, "backward"))


def _layout(chain: RankChain) -> list[tuple[str, float]]:
    return [("reduce" if s.kind == SYNC else s.kind, round(s.seconds / MS, 6)) for s in chain.segments
            if s.phase == "backward"]


def test_zero1_reduces_the_gradients_one_after_the_other_where_zero2s_last_bucket_is() -> None:
    from zeromon.analysis.whatif.zero_stage import reduced_at_backward_end

    zero2 = _gradient_chain([("compute", 2), ("reduce", 1), ("compute", 2), ("reduce", 1), ("compute", 2),
                             ("reduce", 1), ("compute", 0.5)])
    assert _layout(reduced_at_backward_end(zero2)) == [("compute", 2), ("compute", 2), ("compute", 2), ("reduce", 1),
                                                       ("reduce", 1), ("reduce", 1), ("compute", 0.5)]


def test_zero2_reduces_each_bucket_after_its_share_of_the_backwards_compute() -> None:
    from zeromon.analysis.whatif.zero_stage import reduced_as_buckets_fill

    zero1 = _gradient_chain([("compute", 6), ("reduce", 1), ("compute", 0.3), ("reduce", 1), ("compute", 0.3),
                             ("reduce", 1), ("compute", 0.5)])
    # 6.6 ms of compute before the last: the first two after 2.2 and 4.4 ms, the last where it was
    assert _layout(reduced_as_buckets_fill(zero1)) == [("compute", 2.2), ("reduce", 1), ("compute", 2.2),
                                                       ("reduce", 1), ("compute", 1.6), ("compute", 0.3),
                                                       ("compute", 0.3), ("reduce", 1), ("compute", 0.5)]
    one_bucket = _gradient_chain([("compute", 6), ("reduce", 1), ("compute", 0.5)])
    assert reduced_as_buckets_fill(one_bucket) == one_bucket


def test_zero2_from_zero1_holds_the_bucket_beside_the_forwards_activations_and_keeps_the_step() -> None:
    answer = what_if(_deepspeed_pair(1), [parse_change("zero_stage=2")])
    assert answer.measured.peak_tracked_bytes == PARAM_BYTES + OPTIMIZER_BYTES + 3000 + BACKWARD_ACTIVATIONS
    # the bucket's 2,000 fp32 elements whole, from the backward's start, when the forward's activations are held
    assert answer.predicted.peak_tracked_bytes == PARAM_BYTES + OPTIMIZER_BYTES + 8000 + FORWARD_ACTIVATIONS
    assert answer.predicted.peak_categories["unsharded_grads"] == 8000
    assert answer.predicted.median_step_s == pytest.approx(answer.replay.median_step_s)  # the same collectives


def test_zero2_with_several_buckets_holds_its_gradient_partition_besides_the_bucket() -> None:
    answer = what_if(_deepspeed_pair(1, 3, bucket_elements=400), [parse_change("zero_stage=2")])
    # 4,000 bytes of gradients fill 3 buckets of 1,600 bytes; the rank's partition is the planner's 4 x 500
    assert answer.predicted.peak_categories["unsharded_grads"] == 1600 + 2000
    assert answer.predicted.median_step_s == pytest.approx(answer.replay.median_step_s)
    assert any("3 buckets" in a and "(2,000 bytes)" in a for a in answer.assumptions)


def test_zero1_from_zero2_holds_every_gradient_at_the_backwards_end_and_no_bucket() -> None:
    answer = what_if(_deepspeed_pair(2, 3, bucket_elements=400), [parse_change("zero_stage=1")])
    assert answer.measured.peak_tracked_bytes == PARAM_BYTES + OPTIMIZER_BYTES + 1600 + BACKWARD_ACTIVATIONS
    # the planner's g x params for ZeRO-1, the activations freed by the backward's end
    assert answer.predicted.peak_tracked_bytes == PARAM_BYTES + OPTIMIZER_BYTES + PARAM_BYTES
    assert answer.predicted.peak_categories["activations"] == 0
    assert answer.predicted.median_step_s == pytest.approx(answer.replay.median_step_s)


@pytest.mark.parametrize("stage, change, step_s", [(2, "zero_stage=1", 0.033), (1, "zero_stage=2", 0.034)])
def test_accumulation_after_a_stage_change_reduces_where_the_new_stage_does(stage: int, change: str,
                                                                            step_s: float) -> None:
    answer = what_if(_deepspeed_pair(stage), [parse_change("grad_accum=2"), parse_change(change)])
    # 14 ms before the optimizer, 1 of it the gradients' all-reduce: ZeRO-1 reduces at the last micro-batch
    # only (13 + 20 ms), ZeRO-2 in every one (14 + 20 ms)
    assert answer.predicted.median_step_s == pytest.approx(step_s)


@pytest.mark.parametrize("pair, change, message", [
    (dict(stage=2), "zero_stage=2", "this run is at ZeRO stage 2 already"),
    (dict(stage=2), "zero_stage=0", "from stage 2 to 0 is not answered yet; 1 to 2 and back are"),
    (dict(stage=2), "zero_stage=3", "ZeRO-3 gathers each module's parameters .* not in a recording"),
    (dict(stage=3), "zero_stage=2", r"measured no all-reduce of their size \(its largest: 4 bytes\)"),
    (dict(stage=1, dtype="bfloat16"), "zero_stage=2", "its parameters are bfloat16"),
    (dict(stage=1, gradient_accumulation_steps=2), "zero_stage=2", "accumulates 2 micro-batches"),
    (dict(stage=2, offload_optimizer="cpu"), "zero_stage=1", "its optimizer is offloaded"),
    (dict(stage=1, contiguous_gradients=False), "zero_stage=2", "without contiguous_gradients"),
])
def test_a_zero_stage_change_one_recording_cannot_support_is_refused_with_the_reason(
        pair: dict[str, object], change: str, message: str) -> None:
    with pytest.raises((Refused, ChangeError), match=message):
        what_if(_deepspeed_pair(**pair), [parse_change(change)])  # type: ignore[arg-type]


def test_a_run_that_offloads_nothing_is_answered() -> None:
    answer = what_if(_deepspeed_pair(2, offload_optimizer="none"), [parse_change("zero_stage=1")])
    assert answer.predicted.peak_tracked_bytes == PARAM_BYTES + OPTIMIZER_BYTES + PARAM_BYTES


def test_a_zero_stage_change_on_another_framework_names_the_one_it_has() -> None:
    with pytest.raises(ChangeError, match=r"zero_stage is DeepSpeed's; this run is fsdp2 \(FSDP2: reshard_after"):
        what_if(_pair(framework="fsdp2"), [parse_change("zero_stage=2")])


# --- a real pair: FSDP2 with reshard_after_forward true, predicted false, and run false ---------------------


@pytest.fixture(scope="module")
def fsdp2_kept_gathered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's main job (tests/conftest.py's fsdp2_run) with each block's parameters kept gathered."""
    out = tmp_path_factory.mktemp("fsdp2-kept") / "run"
    result = zeromon("run", "--out", str(out), "--", *ranks_args(2, EXAMPLES / "fsdp2_train.py", "--steps", "8",
                                                               "--no-reshard-after-forward"))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_a_real_fsdp2_run_predicts_the_kept_gathered_runs_peak_and_a_shorter_step(
        fsdp2_run: Path, fsdp2_kept_gathered: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(fsdp2_run), "reshard_after_forward=false", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert {"measured", "replay", "predicted", "assumptions", "validated_error_pct"} <= answer.keys()
    for part in ("measured", "replay", "predicted"):
        assert {"median_step_s", "peak_tracked_bytes"} <= answer[part].keys()
    assert "error_pct" in answer["replay"]
    assert answer["validated_error_pct"]["reshard_after_forward"].keys() == {"median_step_s", "peak_tracked_bytes"}
    # The memory is bytes the agent counted, the same on every run of the same model: exact.
    assert main(["report", str(fsdp2_kept_gathered), "--json"]) == 0
    real = json.loads(capsys.readouterr().out)
    assert answer["predicted"]["peak_tracked_bytes"] == max(r["peak_tracked_bytes"] for r in real["ranks"])
    assert answer["predicted"]["peak_tracked_bytes"] > answer["measured"]["peak_tracked_bytes"]
    # The step: the backward's re-gathers gone, shorter than the same model's replay of the run as it was (how
    # close to the real run is the benchmark's to say: tests/bench/bench_whatif.py).
    assert answer["predicted"]["median_step_s"] < answer["replay"]["median_step_s"]
    assert answer["predicted"]["transfer_s"] < answer["replay"]["transfer_s"]
    assert abs(answer["replay"]["error_pct"]) < 5.0  # the unchanged run through its own collectives' times
    assert main(["whatif", str(fsdp2_run), "comm=hidden"]) == 0
    text = capsys.readouterr().out
    assert "replay (unchanged)" in text and "fit all_gather (group of 2)" in text
    # The report's remedy, with the same prediction.
    main(["report", str(fsdp2_run), "--json"])
    (remedy,) = [r for r in json.loads(capsys.readouterr().out)["remedies_predicted"]
                 if r["change"] == "reshard_after_forward=false"]
    assert remedy["refused"] is None
    assert remedy["peak_tracked_delta_bytes"] == (answer["predicted"]["peak_tracked_bytes"]
                                                  - answer["measured"]["peak_tracked_bytes"])
    assert remedy["step_delta_s"] == pytest.approx(answer["predicted"]["median_step_s"]
                                                   - answer["replay"]["median_step_s"])
    main(["report", str(fsdp2_run)])
    assert "  remedy: reshard_after_forward=false: predicted -" in capsys.readouterr().out


def test_any_two_changes_apply_together_in_either_order(fsdp2_run: Path) -> None:
    import itertools

    from zeromon.analysis.whatif.answer import APPLY_ORDER
    from zeromon.analysis.whatif.changes import KINDS
    from zeromon.model.run_files import read_run

    assert sorted(APPLY_ORDER) == sorted(KINDS)  # every change kind has its place in the order
    recordings = read_run(fsdp2_run)
    kinds = ["reshard_after_forward=false", "comm=hidden", "bandwidth=x2", "micro_batch=x2", "grad_accum=2",
             "world_size=4", "world_size=1"]
    for first, second in itertools.permutations(kinds, 2):
        if first.split("=")[0] == second.split("=")[0]:
            continue
        answer = what_if(recordings, [parse_change(first), parse_change(second)])
        again = what_if(recordings, [parse_change(second), parse_change(first)])
        assert answer.predicted.median_step_s == pytest.approx(again.predicted.median_step_s), (first, second)
        assert answer.predicted.peak_tracked_bytes == again.predicted.peak_tracked_bytes, (first, second)
        assert answer.predicted.median_step_s is not None and answer.predicted.median_step_s > 0, (first, second)


def test_the_command_refuses_bad_input_with_exit_2(fsdp2_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(fsdp2_run), "zero_stage=3"]) == 2
    assert "zero_stage is DeepSpeed's; this run is fsdp2" in capsys.readouterr().err
    assert main(["whatif", str(fsdp2_run), "sharding_strategy=SHARD_GRAD_OP"]) == 2
    assert "sharding_strategy is FSDP1's; this run is fsdp2" in capsys.readouterr().err


def test_a_live_run_is_answered_from_its_recording_so_far(tmp_path: Path) -> None:
    """`zeromon whatif` on the folder of a run still training: the steps every rank has written so far."""
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import child_env
    from zeromon.model.run_files import read_run

    out = tmp_path / "run"
    train = subprocess.Popen([sys.executable, "-m", "zeromon", "run", "--quiet", "--out", str(out), "--",
                              *ranks_args(2, EXAMPLES / "fsdp2_train.py", "--steps", "2000")],
                             env=child_env(ZEROMON_FLUSH_INTERVAL="0.2"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                if len(read_run(out)) == 2 and min(len(r.steps) for r in read_run(out)) >= 8:
                    break
            except Exception:  # noqa: BLE001 - the folder and its headers are still being made
                continue
        result = zeromon("whatif", str(out), "comm=hidden", "--json", timeout=120)
        assert train.poll() is None, "the run ended before it was asked: make it longer"
    finally:
        train.send_signal(signal.SIGTERM)
        train.wait(timeout=60)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert len(answer["steps"]) >= 8 and answer["predicted"]["median_step_s"] < answer["replay"]["median_step_s"]
