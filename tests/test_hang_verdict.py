"""The cross-rank hang verdict (zeromon.analysis.hang.diagnose) on progress reports made by hand: who holds the
job up, decided by the group's majority and never by comparing to one reference rank. The real runs that
produce such reports are in tests/test_hang.py."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from zeromon.analysis.hang import (
    BEHIND,
    DEAD,
    DESYNC,
    IDLE,
    OK,
    STUCK,
    WAITING,
    diagnose,
    progress_notice,
)
from zeromon.model.progress import (
    LIVE,
    RESUMED,
    STALLED,
    Blocked,
    CallInfo,
    GroupState,
    RankProgress,
    StackFrame,
    progress_from_dict,
)

T = 1_800_000_000 * 10**9  # a Unix time in ns
S = 10**9
LOOP = StackFrame("/job/train.py", 40, "main")
FORWARD = StackFrame("/job/model.py", 12, "forward")
STALL = StackFrame("/job/data.py", 17, "data_loader_stall")


def gather(seq: int, nbytes: int = 4096, op: str = "all_gather", group: str = "0") -> CallInfo:
    return CallInfo(group=group, seq=seq, op=op, meaning="param_all_gather" if op == "all_gather" else "other",
                    bytes=nbytes, dtype="float32", phase="forward", step=7)


def report(rank: int, issued: int, idle_s: float = 60.0, blocked: CallInfo | None = None,
           where: StackFrame = FORWARD, groups: tuple[tuple[str, tuple[int, ...], int], ...] | None = None,
           reason: str = LIVE, threshold_s: float = 30.0, world: int = 2) -> RankProgress:
    """Rank ``rank``'s report: ``issued`` collectives in the default group (or ``groups``: (name, ranks, issued)),
    no progress for ``idle_s``, blocked in ``blocked`` since its last progress."""
    t = T + 100 * S
    progress = t - int(idle_s * S)
    if groups is None:
        groups = (("0", tuple(range(world)), issued),)
    states = tuple(GroupState(group=name, desc="default_pg" if name == "0" else "mesh_shard", ranks=ranks,
                              issued=n) for name, ranks, n in groups)
    stack = (LOOP, where)
    return RankProgress(rank=rank, t_ns=t, reason=reason, step=7, collectives=issued, progress_ns=progress,
                        threshold_s=threshold_s,
                        blocked=Blocked(call=blocked, waiting=False, since_ns=progress, module="layers.3")
                        if blocked is not None else None,
                        groups=states, stack=stack, where=where)


def test_a_rank_stuck_outside_any_collective_is_named_with_its_function_and_the_collective_its_peer_waits_in() -> None:
    verdict = diagnose({0: report(0, 341, blocked=gather(341)), 1: report(1, 340, where=STALL)})
    assert verdict.hung and verdict.culprits == (1,)
    assert verdict.of(1).state == STUCK and verdict.of(0).state == WAITING and verdict.of(0).waits_for == (1,)
    line = verdict.lines[0]
    assert line.startswith("rank 1 has not reached all_gather #341 of the default group (param_all_gather, layers.3)")
    assert "it is in data_loader_stall (data.py:17), outside any collective" in line
    assert "rank 0 waits in it since" in line


def test_the_culprit_is_found_whichever_rank_it_is_never_by_comparing_to_rank_0() -> None:
    # Rank 0 is the stuck one: a verdict that compares everyone to the first rank would blame the others.
    reports = {0: report(0, 340, where=STALL, world=4)}
    reports.update({r: report(r, 341, blocked=gather(341), world=4) for r in (1, 2, 3)})
    verdict = diagnose(reports)
    assert verdict.culprits == (0,)
    assert [verdict.of(r).state for r in (1, 2, 3)] == [WAITING] * 3
    assert "ranks 1-3 wait in it since" in verdict.lines[0]


@given(world=st.integers(2, 8), data=st.data())
def test_one_stuck_rank_among_waiting_peers_is_always_the_only_culprit(world: int, data: st.DataObject) -> None:
    stuck = data.draw(st.integers(0, world - 1))
    seq = data.draw(st.integers(1, 10**6))
    reports = {r: report(r, seq - 1, where=STALL, world=world) if r == stuck else
               report(r, seq, blocked=gather(seq), world=world) for r in range(world)}
    verdict = diagnose(reports)
    assert verdict.culprits == (stuck,)
    assert all(verdict.of(r).waits_for == (stuck,) for r in range(world) if r != stuck)


def test_a_rank_that_still_makes_progress_is_behind_not_stuck() -> None:
    verdict = diagnose({0: report(0, 341, blocked=gather(341)), 1: report(1, 338, idle_s=0.5)})
    assert verdict.hung and verdict.of(1).state == BEHIND
    assert "but is still making progress" in verdict.lines[0]


def test_a_rank_idle_since_its_peer_began_to_wait_is_stuck_before_its_own_threshold() -> None:
    # Its agent sees progress a pass late: it may cross its threshold a moment after the rank that waits for it.
    verdict = diagnose({0: report(0, 341, idle_s=31.0, blocked=gather(341)), 1: report(1, 340, idle_s=29.5)})
    assert verdict.of(1).state == STUCK and verdict.culprits == (1,)


def test_a_rank_whose_collective_is_still_in_flight_on_the_device_waits_in_it() -> None:
    # On a GPU the host goes on past an NCCL collective and blocks later (a synchronize, an .item()): what it waits
    # for is the newest collective of its group, not complete.
    host_elsewhere = report(0, 341, where=StackFrame("/job/train.py", 55, "log_loss"))
    group = dataclasses.replace(host_elsewhere.groups[0], last=gather(341), last_done=False)
    waiting = dataclasses.replace(host_elsewhere, groups=(group,))
    verdict = diagnose({0: waiting, 1: report(1, 340, where=STALL)})
    assert verdict.hung and verdict.culprits == (1,) and verdict.of(0).state == WAITING
    assert verdict.lines[0].startswith("rank 1 has not reached all_gather #341 of the default group")
    completed = dataclasses.replace(waiting, groups=(dataclasses.replace(group, last_done=True),))
    assert not diagnose({0: completed, 1: report(1, 340, where=STALL)}).hung  # idle both: nobody waits


def test_a_dead_rank_that_peers_wait_for_is_the_cause() -> None:
    verdict = diagnose({0: report(0, 341, blocked=gather(341)), 1: None},
                       dead={1: "its process has ended"})
    assert verdict.hung and verdict.culprits == (1,) and verdict.of(1).state == DEAD
    assert verdict.lines[0].startswith("rank 1 is dead (its process has ended) and will not reach all_gather #341")


def test_the_majority_decides_which_rank_issued_another_collective() -> None:
    reports = {r: report(r, 90, blocked=gather(90), world=4) for r in (0, 1, 3)}
    reports[2] = report(2, 90, blocked=gather(90, nbytes=4, op="all_reduce"), world=4)
    verdict = diagnose(reports)
    assert verdict.hung and verdict.culprits == (2,) and verdict.of(2).state == DESYNC
    assert [verdict.of(r).state for r in (0, 1, 3)] == [WAITING] * 3
    assert verdict.lines[0].startswith("rank 2 issued all_reduce (4 B, float32) at #90 of the default group where "
                                       "ranks 0-1, 3 issued all_gather (4.00 KiB, float32)")


def test_two_ranks_that_disagree_are_both_named_since_neither_is_the_majority() -> None:
    verdict = diagnose({0: report(0, 9, blocked=gather(9)), 1: report(1, 9, blocked=gather(9, 0, op="barrier"))})
    assert verdict.hung and {verdict.of(0).state, verdict.of(1).state} == {DESYNC}
    assert verdict.lines[0].startswith("the ranks disagree at #9 of the default group: rank 0 issued all_gather")
    assert "rank 1 issued barrier (0 B, float32)" in verdict.lines[0]


def test_a_hang_inside_one_subgroup_follows_the_chain_to_the_stuck_rank() -> None:
    # Groups: "0" the world (4 ranks), "1" ranks 0-1, "2" ranks 2-3. Rank 3 is stuck before its subgroup's
    # all-reduce #12; rank 2 waits in it; ranks 0 and 1 went on and wait in the world's all-gather #50.
    def groups(world_issued: int, pair: str, pair_issued: int) -> tuple[tuple[str, tuple[int, ...], int], ...]:
        return (("0", (0, 1, 2, 3), world_issued), (pair, (0, 1) if pair == "1" else (2, 3), pair_issued))

    reports = {
        0: report(0, 50, blocked=gather(50), groups=groups(50, "1", 12)),
        1: report(1, 50, blocked=gather(50), groups=groups(50, "1", 12)),
        2: report(2, 49, blocked=gather(12, 64, "all_reduce", group="2"), groups=groups(49, "2", 12)),
        3: report(3, 49, where=STALL, groups=groups(49, "2", 11)),
    }
    verdict = diagnose(reports)
    assert verdict.hung and verdict.culprits == (3,)
    assert verdict.of(2).state == WAITING and verdict.of(2).waits_for == (3,)
    assert verdict.of(0).waits_for == (2, 3)
    line = verdict.lines[0]
    assert line.startswith("rank 3 has not reached all_reduce #12 of group shard")
    assert "; rank 2 waits in it since" in line
    assert "; ranks 0-1 wait in all_gather #50 of the default group (param_all_gather, layers.3) since" in line
    assert line.endswith("for ranks 2-3")


def test_ranks_idle_outside_collectives_are_slow_or_paused_not_hung() -> None:
    verdict = diagnose({0: report(0, 10, where=STALL), 1: report(1, 10, where=STALL)})
    assert not verdict.hung and verdict.stalled and verdict.severity == "warn"
    assert {r.state for r in verdict.ranks} == {IDLE}
    assert verdict.lines[0].endswith("the job is slow or paused as a whole, not hung")


def test_nothing_is_said_while_every_rank_makes_progress() -> None:
    verdict = diagnose({0: report(0, 10, idle_s=1.0, blocked=gather(10)), 1: report(1, 9, idle_s=2.0)})
    assert not verdict.hung and not verdict.stalled and verdict.lines == () and verdict.severity is None
    assert {r.state for r in verdict.ranks} == {OK}


def test_slow_steps_raise_the_threshold_so_a_long_wait_below_it_is_no_hang() -> None:
    # Ten median steps of 9 s: a 60 s wait is within the run's own rhythm.
    reports = {0: report(0, 5, blocked=gather(5), threshold_s=90.0), 1: report(1, 4, where=STALL, threshold_s=90.0)}
    assert not diagnose(reports).stalled
    assert diagnose(reports, threshold_s=30.0).hung


def test_a_rank_that_went_on_after_a_stall_is_not_suspect() -> None:
    verdict = diagnose({0: report(0, 10, idle_s=45.0, reason=RESUMED), 1: report(1, 10, idle_s=1.0)})
    assert not verdict.stalled


def test_identical_stacks_are_grouped_the_largest_group_first() -> None:
    reports = {r: report(r, 11, blocked=gather(11), world=4) for r in (0, 1, 3)}
    reports[2] = report(2, 10, where=STALL, world=4)
    stacks = diagnose(reports).stacks
    assert [g.ranks for g in stacks] == [(0, 1, 3), (2,)]
    assert stacks[1].where == STALL


def test_a_report_reads_back_from_its_json() -> None:
    original = dataclasses.replace(report(1, 341, blocked=gather(341)), reason=STALLED, stalled_s=None, host="h",
                                   pid=7)
    assert progress_from_dict(original.to_dict()) == original


def test_a_rank_says_of_itself_where_it_stalled() -> None:
    stuck = dataclasses.replace(report(1, 340, where=STALL), reason=STALLED)
    assert progress_notice(stuck) == "no progress for 60 s: in data_loader_stall (data.py:17), outside any collective"
    waiting = dataclasses.replace(report(0, 341, blocked=gather(341)), reason=STALLED)
    assert progress_notice(waiting).startswith(  # type: ignore[union-attr]
        "no progress for 60 s: blocked in all_gather #341 of the default group (param_all_gather, layers.3) since")


def test_a_recorded_stack_is_read_without_the_agents_frames_wherever_they_stand() -> None:
    """A recording made before the agent left its frames out (its collective wrapper between the user's line and
    torch's, its signal handler innermost): the reader takes them out; a frame of a user's folder named alike
    ("zeromon_agent_tests/") stays, and a stack that is nothing but the agent's (its own thread) stays whole."""
    wrapper = StackFrame("/venv/site-packages/zeromon_agent/hooks/collectives.py", 257, "zeromon_collective")
    handler = StackFrame("/src/agents/zeromon_agent/exits.py", 80, "_on_sigterm")
    barrier = StackFrame("/venv/site-packages/torch/distributed/c10d_logger.py", 81, "wrapper")
    mine = StackFrame("/home/me/zeromon_agent_tests/train.py", 5, "main")
    data = report(0, 3).to_dict()
    data["stack"] = [f.to_list() for f in (mine, LOOP, FORWARD, wrapper, barrier, handler)]
    assert progress_from_dict(data).stack == (mine, LOOP, FORWARD, barrier)
    data["stack"] = [wrapper.to_list(), handler.to_list()]
    assert progress_from_dict(data).stack == (wrapper, handler)
