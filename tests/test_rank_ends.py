"""How a run's ranks ended, the first failure first, and a restarted run's every attempt.

Pure tests of the order (zeromon.analysis.rank_ends, restarts) on RankEnds made here; the end of a rank
file cut off, read from its tail; the agent's setting aside of an earlier attempt's file on real files; and
two real 2-rank torchrun runs on gloo under `zeromon run` (tests/scenarios/fault_train.py), each read by
several tests: a rank that raised and its peer that lost its connection after it, and a run that
torchelastic restarted once after a rank raised.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from zeromon.analysis.rank_ends import (
    CLEAN,
    CUT_OFF,
    EXCEPTION,
    FOLLOWED_WITHIN_S,
    FOLLOWERS_SHOWN,
    RUNNING,
    SIGNAL,
    RankEnd,
    clock,
    died_lines,
    end_lines,
    end_order,
)
from zeromon.analysis.restarts import AttemptEnd, Restarts, restarts
from zeromon.model.attempts import ATTEMPTS_DIR, header_attempt, read_attempts
from zeromon.model.codec import RecordingWriter, read_file_header
from zeromon.model.events import RunEnd, StepSummary
from zeromon.model.run_end import read_file_end
from zeromon.model.segments import CompactWriter
from zeromon.views.overview import died_banners
from zeromon.views.run_data import recording_data
from zeromon_agent.context.attempts import start_attempt

from conftest import REPO, child_env, free_port, torchrun_args, zeromon

SCENARIO = REPO / "tests" / "scenarios" / "fault_train.py"
T0 = 1_795_450_680_000_000_000  # Unix ns
S = 1_000_000_000


def _end(rank: int, state: str = EXCEPTION, t_s: float | None = 0.0, how: str | None = None,
         detail: str | None = None, step: int | None = 7, approx: bool = False) -> RankEnd:
    how = how or {EXCEPTION: "exception RuntimeError", SIGNAL: "signal SIGTERM", CLEAN: "exit"}.get(state)
    return RankEnd(rank=rank, state=state, how=how, last_step=step, recorded_through=step, detail=detail,
                   flush_interval_s=0.2, ended_ns=None if t_s is None else T0 + int(t_s * S),
                   ended_by_last_record=approx)


CAUSE = _end(1, how="exception ValueError", detail="corrupt shard 17: checksum mismatch", t_s=0.0)
PEER = _end(0, detail="Connection closed by peer [127.0.0.1]:29500", t_s=0.4)


# --- the order, pure ------------------------------------------------------------------------------------

def test_the_rank_that_ended_first_is_said_first_and_its_peer_after_it_with_the_delay() -> None:
    lines = end_lines([PEER, CAUSE])  # by rank, as every reader gives them
    assert lines[0] == (f"rank 1 died first, at step 8 ({clock(CAUSE.ended_ns or 0)}): an exception, ValueError: "
                        "corrupt shard 17: checksum mismatch")
    assert lines[1] == ("rank 0 died at step 8, 0.4 s after rank 1: an exception, RuntimeError: Connection closed "
                        "by peer [127.0.0.1]:29500")
    assert "may have failed because rank 1 did" in lines[2] and "does not prove it" in lines[2]
    assert len(lines) == 3


def test_one_rank_that_died_is_said_as_before_with_no_order() -> None:
    assert end_lines([_end(0, CLEAN), CAUSE]) == [
        "rank 1 died at step 8: an exception, ValueError: corrupt shard 17: checksum mismatch"]


def test_a_rank_that_died_long_after_the_first_did_not_follow_it() -> None:
    late = _end(2, SIGNAL, t_s=FOLLOWED_WITHIN_S + 42)
    order = end_order([PEER, CAUSE, late])
    assert order.first == CAUSE and order.followed == (PEER,) and order.later == (late,)
    lines = end_lines([PEER, CAUSE, late])
    assert lines[-1] == f"rank 2 died at step 8, 102 s after rank 1 ({clock(late.ended_ns or 0)}): stopped by SIGTERM"
    alone = end_lines([CAUSE, late])  # nothing followed: no word of a cause
    assert len(alone) == 2 and not any("may have failed" in line for line in alone)


def test_a_rank_cut_off_is_placed_by_its_last_record_and_said_to_be_approximate() -> None:
    killed = _end(1, CUT_OFF, t_s=0.0, approx=True)
    peer = _end(0, SIGNAL, t_s=0.3)
    first, then, _ = end_lines([peer, killed])
    assert first == (f"rank 1 died first, at step 8 (no end record, its last record at {clock(killed.ended_ns or 0)}; "
                     "its last 0.2 s may be lost)")
    assert then == "rank 0 died at step 8, about 0.3 s after rank 1: stopped by SIGTERM"


def test_ranks_that_did_not_die_come_after_the_order_by_rank() -> None:
    running = _end(3, RUNNING, t_s=None)
    no_time = _end(2, SIGNAL, t_s=None)
    lines = end_lines([PEER, CAUSE, no_time, running, _end(4, CLEAN)])
    assert [line.split(",")[0].split(" died")[0] for line in lines[:2]] == ["rank 1", "rank 0"]
    assert lines[3:] == ["rank 2 died at step 8: stopped by SIGTERM", "rank 3 is still running (no end record yet)"]


def test_many_ranks_that_followed_are_counted_by_how_they_ended() -> None:
    stopped = [_end(r, SIGNAL, t_s=0.1 + r / 100) for r in range(2, 22)]
    lines = end_lines([CAUSE, *stopped])
    named = [line for line in lines if line.startswith("rank ") and "after rank 1" in line]
    assert len(named) == FOLLOWERS_SHOWN
    assert f"… and {20 - FOLLOWERS_SHOWN} more ranks died within 0.3 s after rank 1: " \
           f"{20 - FOLLOWERS_SHOWN} stopped by SIGTERM" in lines


def test_each_dead_ranks_own_line_says_where_it_stands_for_the_views() -> None:
    lines = died_lines([PEER, CAUSE, _end(2, CLEAN)])
    assert sorted(lines) == [0, 1]
    assert lines[1].startswith("rank 1 died first, at step 8") and lines[0].startswith("rank 0 died at step 8, 0.4 s")


# --- an attempt's end, pure -----------------------------------------------------------------------------

def test_an_earlier_attempt_ended_when_its_first_rank_failed() -> None:
    flap = _end(1, detail="transient: NIC flap", t_s=0.0)
    attempt = AttemptEnd(0, ("runs/x/attempts/0",), (_end(0, SIGNAL, t_s=0.8), flap))
    assert attempt.cause == flap
    assert attempt.line() == f"attempt 0 ended at step 8 ({clock(T0)}) when rank 1 raised RuntimeError: transient: NIC flap"
    restarts = Restarts((attempt,), last=1, last_steps=20)
    assert restarts.lines("the report above is") == [
        "the run restarted 1 time (torchelastic); the report above is of its last attempt (attempt 1, which ran 20 "
        "steps):",
        f"  {attempt.line()} (its report: zeromon report runs/x/attempts/0)"]
    assert Restarts().lines("the report above is") == []  # a run that never restarted says nothing


def test_an_attempt_whose_ranks_all_ended_cleanly_says_so_rather_than_a_cause() -> None:
    attempt = AttemptEnd(0, ("r/attempts/0",), (_end(0, CLEAN, step=3), _end(1, CLEAN, step=3)))
    assert attempt.cause is None
    assert attempt.line().startswith("attempt 0 ended at step 4") and "none of its recordings says" in attempt.line()


# --- the tail of a rank file cut off --------------------------------------------------------------------

def _step(step: int, end_s: float) -> StepSummary:
    return StepSummary(rank=0, step=step, start_ns=T0 + step, end_ns=T0 + int(end_s * S), phase_s={"forward": 0.5},
                       collectives=4, comm_bytes=1024, comm_bytes_by_op={"all_gather": 1024}, comm_union_s=0.1,
                       blocked_s=0.1, peak_memory=1, comp_s=0.5, overlap_s=0.0, exposed_comm_s=0.1)


@pytest.mark.parametrize("writer_type", [RecordingWriter, CompactWriter])
def test_a_file_cut_off_says_when_its_rank_was_last_heard_of(tmp_path: Path, writer_type: type) -> None:
    path = tmp_path / ("rank-0.zmr" if writer_type is CompactWriter else "rank-0.jsonl")
    writer = writer_type(path, 0, job="j", world_size=2, end_record=True, flush_interval_s=0.2)
    for step in range(3):
        writer.write(_step(step, step + 0.5))
    writer.flush()  # and never closed: killed
    end = read_file_end(path)
    assert end.end is None and end.last_record_ns == T0 + int(2.5 * S) and end.last_step_in_tail == 2
    writer.close(RunEnd(rank=0, t_ns=T0 + 3 * S, how="exit", last_step=2, records_lost=0, bytes_lost=0))
    assert read_file_end(path).last_record_ns is None  # its end record has the time


# --- the agent sets an earlier attempt's file aside -----------------------------------------------------

def _rank_file(folder: Path, rank: int, **header: object) -> Path:
    path = folder / f"rank-{rank}.jsonl"
    RecordingWriter(path, rank, job="j", **header).close()
    return path


def test_a_restarted_rank_moves_its_earlier_attempts_file_aside_and_says_its_attempt(tmp_path: Path) -> None:
    for rank in range(3):
        _rank_file(tmp_path, rank, attempt=0)
    restarted = {"TORCHELASTIC_RESTART_COUNT": "1"}
    assert start_attempt(tmp_path, 1, world_size=2, environ=restarted) == {"attempt": 1}
    kept = tmp_path / ATTEMPTS_DIR / "0"
    assert sorted(p.name for p in kept.iterdir()) == ["rank-1.jsonl"]  # its own file only
    assert start_attempt(tmp_path, 0, world_size=2, environ=restarted) == {"attempt": 1}
    # rank 0 also moves the file of rank 2, which this attempt (2 ranks) no longer has
    assert sorted(p.name for p in kept.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl", "rank-2.jsonl"]
    assert header_attempt(kept / "rank-2.jsonl") == 0 and not list(tmp_path.glob("rank-*"))


def test_a_file_of_this_attempt_stays_and_outside_torchelastic_nothing_moves(tmp_path: Path) -> None:
    _rank_file(tmp_path, 0, attempt=1)
    assert start_attempt(tmp_path, 0, world_size=1, environ={"TORCHELASTIC_RESTART_COUNT": "1"}) == {"attempt": 1}
    _rank_file(tmp_path, 1)
    assert start_attempt(tmp_path, 1, world_size=2, environ={}) == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]


def test_a_file_whose_header_does_not_say_its_attempt_is_kept_as_the_one_before(tmp_path: Path) -> None:
    _rank_file(tmp_path, 0)
    start_attempt(tmp_path, 0, world_size=1, environ={"TORCHELASTIC_RESTART_COUNT": "3"})
    assert (tmp_path / ATTEMPTS_DIR / "2" / "rank-0.jsonl").exists()


def test_a_rank_file_left_from_an_earlier_attempt_is_named_beside_the_last(tmp_path: Path) -> None:
    """Rank 1 ended before its agent started in attempt 1: its file of attempt 0 stayed in place."""
    _rank_file(tmp_path, 0, attempt=1)
    _rank_file(tmp_path, 1, attempt=0)
    (tmp_path / ATTEMPTS_DIR / "0").mkdir(parents=True)
    writer = RecordingWriter(tmp_path / ATTEMPTS_DIR / "0" / "rank-0.jsonl", 0, job="j", attempt=0, end_record=True)
    writer.close(RunEnd(rank=0, t_ns=T0, how="exception OSError", last_step=4, records_lost=0, bytes_lost=0,
                        detail="disk quota exceeded"))
    attempts = read_attempts(tmp_path)
    assert attempts.last == 1 and attempts.behind == ((1, 0),)
    lines = restarts(attempts, last_steps=None).lines("the report above is")
    assert lines[1].startswith("  attempt 0 ended at step 5 (") and "when rank 0 raised OSError: disk quota" in lines[1]
    assert lines[2] == ("  rank 1's recording here is of attempt 0, not 1: in attempt 1 the rank ended before its "
                        "agent started")


# --- real runs ------------------------------------------------------------------------------------------

def _zeromon_run(out: Path, launcher: list[str]) -> subprocess.CompletedProcess[str]:
    """`zeromon run --out out -- launcher`; the launcher's process group and the ranks' (torchrun starts each
    in a session of its own) are killed if they overstay."""
    proc = subprocess.Popen([sys.executable, "-m", "zeromon", "run", "--out", str(out), "--", *launcher],
                            env=child_env(ZEROMON_FORMAT="compact"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out_text, err_text = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        _kill_ranks(out)
        os.killpg(proc.pid, signal.SIGKILL)
        out_text, err_text = proc.communicate()
        pytest.fail(f"the run overstayed: {err_text[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out_text, err_text)


def _kill_ranks(out: Path) -> None:
    for path in out.glob("rank-*.zmr"):
        pid = read_file_header(path).get("pid")
        if isinstance(pid, int):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def corrupt_shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Rank 1 raises ValueError (a corrupt shard) at step 8 outside any collective; rank 0, waiting for it in
    an all_reduce, loses its connection."""
    out = tmp_path_factory.mktemp("corrupt") / "run"
    result = _zeromon_run(out, torchrun_args(2, SCENARIO, "--die", "1:8:corrupt", "--sleep", "0.05"))
    assert result.returncode != 0 and "corrupt shard 17" in result.stderr, result.stderr[-3000:]
    return out, result


def _ended_lines(text: str) -> list[str]:
    return [line.strip().removeprefix("zeromon: ") for line in text.splitlines() if " died " in line]


@pytest.mark.distributed
def test_the_rank_that_failed_first_is_named_first_by_run_summary_and_report(
        corrupt_shard: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, run = corrupt_shard
    for text in (run.stderr, zeromon("summary", str(out)).stdout, zeromon("report", str(out)).stdout):
        first, then = _ended_lines(text)[:2]
        assert first.startswith("rank 1 died first, at step 8 (") and first.endswith(
            "an exception, ValueError: corrupt shard 17: checksum mismatch"), text[-2000:]
        assert then.startswith("rank 0 died at step 8, ") and " after rank 1" in then, then
        assert "(rank 0 may have failed because rank 1 did" in text
    said = json.loads(zeromon("report", str(out), "--json").stdout)
    assert said["first_died"] == 1 and said["restarts"]["count"] == 0


@pytest.mark.distributed
def test_the_views_banners_put_the_first_failure_first(
        corrupt_shard: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = corrupt_shard
    banners = died_banners(recording_data(out, workers=1))
    assert [b.rank for b in banners] == [1, 0]
    live = zeromon("live", "--once", "--replay", str(out))
    died = [line for line in live.stdout.splitlines() if line.startswith("rank ") and " died " in line]
    assert live.returncode == 3 and died[0].startswith("rank 1 died first, at step 8"), live.stdout + live.stderr
    assert died[1].startswith("rank 0 died at step 8, ") and " after rank 1" in died[1]


def _restart_launcher(*args: str) -> list[str]:
    """torchrun restarting the workers once when one fails (the default, static rendezvous)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
            "--master-port", str(free_port()), str(SCENARIO), *args]


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Rank 1 raises at step 8 of the first attempt only; torchrun restarts both ranks, which run 20 steps."""
    out = tmp_path_factory.mktemp("restart") / "run"
    result = _zeromon_run(out, _restart_launcher("--die", "1:8:exception", "--attempt", "0", "--message",
                                                 "transient: NIC flap", "--steps", "20", "--sleep", "0.02"))
    assert result.returncode == 0 and "LOSSES" in result.stdout, result.stderr[-3000:]
    return out, result


@pytest.mark.distributed
def test_a_restart_keeps_the_earlier_attempt_beside_the_last(
        restarted: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = restarted
    assert sorted(p.name for p in out.glob("rank-*")) == ["rank-0.zmr", "rank-1.zmr"]
    assert [header_attempt(out / f"rank-{r}.zmr") for r in (0, 1)] == [1, 1]
    kept = out / ATTEMPTS_DIR / "0"
    assert [header_attempt(kept / f"rank-{r}.zmr") for r in (0, 1)] == [0, 0]
    attempts = read_attempts(out)
    assert [a.number for a in attempts.earlier] == [0] and attempts.last == 1


@pytest.mark.distributed
def test_report_and_summary_say_that_the_run_restarted_when_and_why(
        restarted: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, run = restarted
    why = "when rank 1 raised RuntimeError: transient: NIC flap"
    report = zeromon("report", str(out))
    assert report.returncode == 0, report.stderr  # the run, restarted, ended well
    assert f"zeromon report: {out} (2 of 2 ranks)" in report.stdout  # the earlier attempt is no extra rank
    for text in (report.stdout, zeromon("summary", str(out)).stdout, run.stderr):
        assert "the run restarted 1 time (torchelastic)" in text and "(attempt 1, which ran 20 steps)" in text, text
        line = next(line.strip() for line in text.splitlines() if line.strip().startswith("attempt 0 ended"))
        assert line.startswith("attempt 0 ended at step 8 (") and why in line, line
        assert line.endswith(f"(its report: zeromon report {out / ATTEMPTS_DIR / '0'})")
    said = json.loads(zeromon("report", str(out), "--json").stdout)["restarts"]
    assert said["count"] == 1 and said["earlier"][0]["cause_rank"] == 1 and said["earlier"][0]["last_step"] == 7


@pytest.mark.distributed
def test_an_earlier_attempt_is_a_run_folder_of_its_own(
        restarted: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = restarted
    report = zeromon("report", str(out / ATTEMPTS_DIR / "0"))
    assert report.returncode == 3, report.stderr  # its ranks died
    assert report.stdout.startswith(f"this is attempt 0 of the run in {out}, which restarted after it")
    assert "rank 1 died first, at step 8 (" in report.stdout and "transient: NIC flap" in report.stdout


@pytest.mark.distributed
def test_a_run_folder_used_again_sets_the_attempts_aside_with_the_run(
        restarted: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    out = tmp_path / "again"
    shutil.copytree(restarted[0], out)
    result = zeromon("run", "--out", str(out), "--", sys.executable, "-c", "print('ran')")
    assert result.returncode == 0, result.stderr
    (aside,) = out.glob("previous-*")
    assert (aside / ATTEMPTS_DIR / "0" / "rank-1.zmr").exists() and not (out / ATTEMPTS_DIR).exists()
