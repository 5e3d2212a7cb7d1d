"""Exposed communication equals what the training thread lost, in every kind of loop (issue 10).

Real 2-rank gloo runs of tests/scenarios/exposed_oracle.py, one per loop: synchronous and async
all-reduces (partly and fully hidden, and one issued in a step and waited in the next), a
``zeromon_agent.step()`` loop of plain tensor code, gradient accumulation, FSDP2 with and without
resharding, DeepSpeed ZeRO-2 and ZeRO-3. The script's oracle times, with perf_counter_ns and no
code of zeromon, every call in which the training thread blocks on communication; per step,
zeromon's exposed communication, from the recording (``step_overlaps``) and live
(``StepSummary.exposed_comm_s``), must meet it:

- the median over steps of |zeromon - oracle| <= max(5% of the oracle, 0.2 ms), the oracle being
  the stopwatch around the calls as the loop makes them (zeromon's wrappers included);
- the 95th percentile of zeromon's distance from [inner, outer] <= 1 ms, where inner is a second
  stopwatch inside zeromon's wrappers: zeromon's own time in them is neither computation nor
  communication, and the two stopwatches part only when the thread is descheduled or waits for the
  GIL inside a wrapper (1-10 ms, in a few percent of steps on 2 busy cores).

Step 0 is compared on its own (its first iteration runs the lazy initializations); the test of the
main acceptance starts at step 1.
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from zeromon.analysis.step_overlap import step_overlaps
from zeromon.model import read_run

from conftest import REPO, child_env, ranks_args

pytestmark = pytest.mark.distributed

SCENARIO = REPO / "tests" / "scenarios" / "exposed_oracle.py"
STEPS = 10
MS = 1e-3

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is an optional extra")
_DEEPSPEED = (needs_deepspeed, pytest.mark.deepspeed)
MODES = [
    "sync", "async_partial", "async_hidden", "async_across_steps", "step_loop", "grad_accum", "fsdp2_reshard",
    "fsdp2_no_reshard", pytest.param("deepspeed_zero2", marks=_DEEPSPEED), pytest.param("deepspeed_zero3", marks=_DEEPSPEED),
]
# The modes whose loop issues and waits on every collective itself (its own stopwatch sees them all).
LOOP_ISSUED = frozenset({"sync", "async_partial", "async_hidden", "async_across_steps", "step_loop", "grad_accum"})


@dataclass(frozen=True, slots=True)
class Step:
    """One rank's step: the oracle's truth beside zeromon's numbers (seconds)."""

    rank: int
    step: int
    oracle_s: float  # the stopwatch around the calls as the loop makes them
    inner_s: float  # the stopwatch inside zeromon's wrappers
    analysis_s: float  # step_overlaps(rec)[i].exposed_comm_s
    live_s: float | None  # StepSummary.exposed_comm_s
    loop_blocked_s: float  # the loop's own stopwatch around the collectives it issues and waits on
    wall_s: float  # the loop's step: the block, or from the previous optimizer step's return
    duration_s: float  # zeromon's StepSummary.duration_s
    blocked_s_by_api: dict[str, float]
    done_before_wait: tuple[bool, ...]  # each of the loop's async all-reduces: complete before its wait

    def distance_s(self, zeromon_s: float) -> float:
        """How far zeromon is from [inner, outer]: 0 in between."""
        low = min(self.inner_s, self.oracle_s)
        return max(low - zeromon_s, zeromon_s - self.oracle_s, 0.0)


Run = list[list[Step]]  # per rank, per step


def _run(mode: str, out: Path) -> Run:
    result = subprocess.run(ranks_args(2, SCENARIO, "--mode", mode, "--steps", str(STEPS), "--truth-dir", str(out)),
                            env=child_env(ZEROMON_OUT=str(out)), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = []
    recordings = read_run(out)
    assert [rec.rank for rec in recordings] == [0, 1]
    for rec in recordings:
        assert rec.stats is not None and rec.stats.events_dropped == 0 and rec.stats.hook_errors == 0, rec.stats
        truth = json.loads((out / f"truth-{rec.rank}.json").read_text())["steps"]
        overlaps = step_overlaps(rec)
        summaries = sorted(rec.steps, key=lambda s: s.step)
        assert [o.step for o in overlaps] == [s.step for s in summaries] == list(range(STEPS)), \
            f"rank {rec.rank}: zeromon's steps {[o.step for o in overlaps]}, the loop's 0..{STEPS - 1}"
        ranks.append([
            Step(rank=rec.rank, step=t["step"], oracle_s=t["blocked_s"], inner_s=t["inner_blocked_s"],
                 analysis_s=o.exposed_comm_s, live_s=s.exposed_comm_s, loop_blocked_s=t["loop_blocked_s"],
                 wall_s=t["step_s"], duration_s=s.duration_s, blocked_s_by_api=t["blocked_s_by_api"],
                 done_before_wait=tuple(t["done_before_wait"]))
            for t, o, s in zip(truth, overlaps, summaries, strict=True)
        ])
    return ranks


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Run]]:
    """One run per mode, shared by the tests of that mode (a failed one is not run again)."""
    cache: dict[str, Run | str] = {}

    def get(mode: str) -> Run:
        if mode not in cache:
            try:
                run = _run(mode, tmp_path_factory.mktemp(mode))
                if not _claim_holds(mode, run):  # a busy machine made the loop another case (gloo's threads late)
                    run = _run(mode, tmp_path_factory.mktemp(mode))
                cache[mode] = run
            except AssertionError as exc:
                cache[mode] = f"the {mode} run: {exc}"
        run = cache[mode]
        if isinstance(run, str):
            pytest.fail(run)
        return run

    yield get


def _claim_holds(mode: str, run: Run) -> bool:
    """Whether every rank's loop is what CLAIMS says of the mode, in the oracle's own numbers."""
    _, holds = CLAIMS[mode]
    return all(holds(Facts.of(rank[1:])) for rank in run)


def _p95(values: Sequence[float]) -> float:
    """The nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def _table(steps: Sequence[Step]) -> str:
    rows = [f"{'step':>4} {'oracle':>8} {'inner':>8} {'analysis':>8} {'live':>8}  (ms)  oracle by API"]
    for s in steps:
        live = f"{s.live_s / MS:8.3f}" if s.live_s is not None else f"{'-':>8}"
        by_api = ", ".join(f"{api} {v / MS:.2f}" for api, v in s.blocked_s_by_api.items())
        rows.append(f"{s.step:>4} {s.oracle_s / MS:8.3f} {s.inner_s / MS:8.3f} {s.analysis_s / MS:8.3f} {live}"
                    f"  {by_api}")
    return "\n".join(rows)


def _check_agreement(steps: Sequence[Step], which: str) -> str | None:
    """None if zeromon's `which` numbers meet the oracle's; else why not."""
    measured = [s.analysis_s if which == "analysis" else s.live_s for s in steps]
    if any(m is None for m in measured):
        return f"{which}: a step without exposed_comm_s"
    values = [m for m in measured if m is not None]
    median_error = statistics.median(abs(m - s.oracle_s) for m, s in zip(values, steps, strict=True))
    allowed = max(0.05 * statistics.median(s.oracle_s for s in steps), 0.2 * MS)
    tail = _p95([s.distance_s(m) for m, s in zip(values, steps, strict=True)])
    if median_error <= allowed and tail <= 1 * MS:
        return None
    return (f"{which}: median |zeromon - oracle| {median_error / MS:.3f} ms (allowed {allowed / MS:.3f}), "
            f"p95 distance from [inner, oracle] {tail / MS:.3f} ms (allowed 1)")


@pytest.mark.parametrize("mode", MODES)
def test_exposed_communication_is_the_training_threads_blocked_time(mode: str, runs: Callable[[str], Run]) -> None:
    for rank in runs(mode):
        steps = rank[1:]  # step 0: test_the_first_step_counts_what_the_thread_lost_in_it
        failures = [f for f in (_check_agreement(steps, "analysis"), _check_agreement(steps, "live")) if f]
        assert not failures, f"{mode}, rank {rank[0].rank}: " + "; ".join(failures) + "\n" + _table(steps)


@pytest.mark.parametrize("mode", MODES)
def test_the_first_step_counts_what_the_thread_lost_in_it(mode: str, runs: Callable[[str], Run]) -> None:
    """Step 0 starts at the first forward (or the block's entry): a collective issued before it is
    warm-up, its wait in step 0 is not."""
    for rank in runs(mode):
        first = rank[0]
        allowed = max(0.05 * first.oracle_s, 0.2 * MS)
        for which, value in (("analysis", first.analysis_s), ("live", first.live_s)):
            assert value is not None and first.distance_s(value) <= allowed, \
                f"{mode}, rank {first.rank}, step 0: {which} {value} s\n" + _table([first])


@dataclass(frozen=True, slots=True)
class Facts:
    """What the oracle saw of one rank's steps (from step 1), to say which loop ran."""

    oracle_ms: float  # medians over steps
    wall_ms: float
    wait_ms: float  # in Work.wait
    apis: frozenset[str]  # every API the thread blocked in
    waits_per_step: frozenset[int]  # how many of the loop's own async all-reduces each step waited on
    done_share: float  # of those, the share complete before their wait

    @classmethod
    def of(cls, steps: Sequence[Step]) -> Facts:
        done = [d for s in steps for d in s.done_before_wait]
        return cls(oracle_ms=_median_ms([s.oracle_s for s in steps]), wall_ms=_median_ms([s.wall_s for s in steps]),
                   wait_ms=_median_ms([s.blocked_s_by_api.get("Work.wait", 0.0) for s in steps]),
                   apis=frozenset().union(*(s.blocked_s_by_api for s in steps)),
                   waits_per_step=frozenset(len(s.done_before_wait) for s in steps),
                   done_share=sum(done) / len(done) if done else 0.0)


def _median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) / MS


# What each loop must be, in the oracle's own numbers, for agreeing with it to mean something.
CLAIMS: dict[str, tuple[str, Callable[[Facts], bool]]] = {
    "sync": ("a synchronous all-reduce of milliseconds, nothing else",
             lambda f: f.apis == {"all_reduce"} and f.oracle_ms > 2),
    "async_partial": ("the all-reduce outlasts the forward: still running at its wait, which blocks for ms",
                      lambda f: f.waits_per_step == {1} and f.done_share <= 0.2 and f.wait_ms > 1),
    "async_hidden": ("done before its wait in most steps (gloo's threads are sometimes late on 2 busy cores): "
                     "the wait costs microseconds, exposed is mostly the issue call",
                     lambda f: f.waits_per_step == {1} and f.done_share > 0.5 and f.wait_ms < 0.1
                     and f.oracle_ms < 0.2 * f.wall_ms),
    # On 2 busy cores a rank descheduled between its issue and its wait finds its all-reduce done there: seen in
    # 2 of 9 steps of a loaded run. The claim holds while most waits block for milliseconds.
    "async_across_steps": ("issued in the previous step, still running at its wait in most steps",
                           lambda f: f.waits_per_step == {1} and f.done_share <= 1 / 3 and f.wait_ms > 1),
    "step_loop": ("an async and a synchronous all-reduce behind plain tensor code, most of the step computing",
                  lambda f: f.apis == {"all_reduce", "Work.wait"} and f.oracle_ms < 0.8 * f.wall_ms),
    "grad_accum": ("four micro-batches, four all-reduces waited on before the optimizer step",
                   lambda f: f.waits_per_step == {4} and f.wait_ms > 0.5),
    "fsdp2_reshard": ("FSDP2's all-gathers async (_set_unshard_async_op) and waited on, its reduce-scatters",
                      lambda f: {"all_gather_single", "reduce_scatter_single", "Work.wait"} <= f.apis),
    "fsdp2_no_reshard": ("FSDP2's synchronous all-gathers and reduce-scatters, clip_grad_norm_'s functional "
                         "all-reduce and its wait_tensor",
                         lambda f: {"all_gather_single", "reduce_scatter_single", "funcol.all_reduce",
                                    "funcol.wait_tensor"} <= f.apis and "Work.wait" not in f.apis),
    "deepspeed_zero2": ("ZeRO-2 on CPU: an all-reduce of the gradients, an all-gather of the parameters",
                        lambda f: {"all_reduce", "all_gather_into_tensor"} <= f.apis),
    "deepspeed_zero3": ("ZeRO-3: async all-gathers waited on, reduce-scatters",
                        lambda f: {"all_gather_into_tensor", "reduce_scatter_tensor", "Work.wait"} <= f.apis),
}


@pytest.mark.parametrize("mode", MODES)
def test_the_oracle_measures_the_loop_it_claims(mode: str, runs: Callable[[str], Run]) -> None:
    for rank in runs(mode):
        steps = rank[1:]
        facts = Facts.of(steps)
        table = f"{mode}, rank {rank[0].rank}: {facts}\n{_table(steps)}"
        # Tens of ms, next to which a GIL hand-over (up to 5 ms) stays small.
        assert facts.wall_ms >= 10, table
        assert all(s.inner_s <= s.oracle_s for s in steps), table  # the inner stopwatch is inside the outer
        if mode in LOOP_ISSUED:
            # The oracle sees every call the loop makes: its stopwatch is inside the loop's own, which also holds
            # the oracle's own code around each call: the more calls a step makes (grad_accum's eight), the more.
            gap_ms = _median_ms([s.loop_blocked_s - s.oracle_s for s in steps])
            limit_ms = max(0.1, 0.05 * max(facts.waits_per_step, default=1))
            assert 0 <= gap_ms <= limit_ms, f"the loop's stopwatch - the oracle's: {gap_ms:.3f} ms\n{table}"
        claim, holds = CLAIMS[mode]
        assert holds(facts), f"{claim}\n{table}"


def test_an_explicit_step_lasts_its_block(runs: Callable[[str], Run]) -> None:
    """zeromon_agent.step() around plain tensor code: each step, the first included, is the block."""
    # Every step within the tolerance but one, which may be off by a GIL hand-over more (sys.getswitchinterval():
    # the recorder's thread holding the interpreter when the training thread takes its mark, on a loaded machine).
    switch_s = sys.getswitchinterval()
    for rank in runs("step_loop"):
        pairs = [(s.step, round(s.wall_s / MS, 3), round(s.duration_s / MS, 3)) for s in rank]
        off = [s for s in rank if abs(s.duration_s - s.wall_s) > max(0.03 * s.wall_s, 1 * MS)]
        assert len(off) <= 1, f"rank {rank[0].rank} (step, the block's ms, zeromon's ms): {pairs}"
        assert all(abs(s.duration_s - s.wall_s) <= max(0.03 * s.wall_s, 1 * MS) + switch_s for s in off), pairs
