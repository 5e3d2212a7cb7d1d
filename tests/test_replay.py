"""ReplaySource: a real 2-rank gloo recording played back as FleetViews on a virtual clock.

The recording is made once per module by the real CLI (`zeromon run -- <launcher> ... fsdp2_train.py`);
the replay is then checked against what read_recording says the files hold.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from zeromon.analysis.oom import forecast
from zeromon.cli import main
from zeromon.errors import ZeromonError
from zeromon.model.codec import Recording, read_recording, read_run
from zeromon.sources.fleet import FleetView
from zeromon.sources.replay import ReplaySource, final_view

from conftest import EXAMPLES, child_env, ranks_args, zeromon

STEPS = 8
T = TypeVar("T")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay") / "run"
    result = zeromon("run", "--quiet", "--out", str(out), "--",
                     *ranks_args(2, EXAMPLES / "fsdp2_train.py", "--steps", str(STEPS)),
                     env=child_env(ZEROMON_ENDPOINT="0"), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in out.glob("rank-*.jsonl")) == ["rank-0.jsonl", "rank-1.jsonl"]
    return out


def wait_for(check: Callable[[], T | None], timeout_s: float = 10.0, what: str = "") -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def record_times(rec: Recording) -> list[int]:
    """When the agent published each record, as the replay orders them."""
    return ([c.complete_ns if c.complete_ns is not None else c.issue_ns for c in rec.collectives]
            + [s.end_ns for s in rec.steps] + [m.t_ns for m in rec.memory] + [p.end_ns for p in rec.phases]
            + [n.t_ns for n in rec.notices] + ([rec.stats.t_ns] if rec.stats else []))


def collective_totals(rec: Recording) -> dict[tuple[str, str], tuple[int, int]]:
    calls: Counter[tuple[str, str]] = Counter()
    nbytes: Counter[tuple[str, str]] = Counter()
    for c in rec.collectives:
        calls[(c.op, c.meaning)] += 1
        nbytes[(c.op, c.meaning)] += max(c.bytes_in, c.bytes_out)
    return {key: (calls[key], nbytes[key]) for key in calls}


@pytest.mark.distributed
def test_plays_to_the_end_with_steps_advancing_and_the_recordings_totals(run_dir: Path) -> None:
    recordings = read_run(run_dir)
    source = ReplaySource(run_dir, speed=1.0, interval_s=0.02)
    source.speed = source.duration_ns / 1.5e9  # the whole run in 1.5 s of wall time
    assert source.looked_at == (str(run_dir),) and source.position_ns == 0 and not source.finished
    first = source.latest()
    assert [r.rank for r in first.ranks] == [0, 1] and all(not r.steps for r in first.ranks)

    seen: list[FleetView] = []
    with source:
        deadline = time.monotonic() + 30
        while not source.finished and time.monotonic() < deadline:
            seen.append(source.latest())
            time.sleep(0.01)
        assert source.finished
        end = wait_for(lambda: (v := source.latest()).alive == 0 and v, what="the view at the end")

    assert len({v.t_ns for v in seen}) >= 20  # it played, a view per tick, not one jump to the end
    for rank in (0, 1):
        last_steps = [r.last_step.step if r.last_step else -1 for v in seen for r in v.ranks if r.rank == rank]
        calls = [sum(c.calls for c in r.collectives) for v in seen for r in v.ranks if r.rank == rank]
        assert last_steps == sorted(last_steps) and calls == sorted(calls)  # never backwards
        assert len(set(last_steps)) >= 4  # and through the steps one by one, not all at once
    assert [v.t_ns for v in seen] == sorted(v.t_ns for v in seen)

    for view, rec in zip(end.ranks, recordings, strict=True):
        assert view.rank == rec.rank and not view.alive and view.error == "the recording ended"
        assert view.t_ns == max(record_times(rec))
        assert [s.step for s in view.steps] == [s.step for s in rec.steps] == list(range(STEPS))
        assert view.steps[-1] == rec.steps[-1]
        # The last sample, with the last category walk's bytes when it was not a walk itself.
        last = max(rec.memory, key=lambda m: m.t_ns)
        last_walk = max((m for m in rec.memory if m.walked), key=lambda m: m.t_ns)
        assert view.memory == dataclasses.replace(last, categories=last_walk.categories if not last.walked
                                                  else last.categories)
        assert view.memory is not None and view.memory.categories.get("sharded_params", 0) > 0
        assert view.run_info == rec.run_info and view.job == "fsdp2_train" and view.world_size == 2
        assert view.stats == rec.stats
        got = {(c.op, c.meaning): (c.calls, c.bytes) for c in view.collectives}
        assert got == collective_totals(rec)
        assert {"param_all_gather", "grad_reduce_scatter"} <= {c.meaning for c in view.collectives}
        for total in view.collectives:
            measured = [c for c in rec.collectives if (c.op, c.meaning) == (total.op, total.meaning)]
            assert total.seconds == pytest.approx(sum(c.duration_s or 0.0 for c in measured))
            assert total.blocked_s == pytest.approx(sum(c.blocked_s for c in measured))
            assert total.busbw_bytes_s is not None and total.busbw_bytes_s > 0
        expected = forecast(rec)
        assert view.oom is not None and view.oom.risk == expected.risk
        assert (view.oom.peak_bytes, view.oom.capacity_bytes) == (expected.peak_bytes, expected.capacity_bytes)
        assert {p.phase for p in view.phases} >= {"forward", "backward", "optimizer"}
        assert all(f.rank == rec.rank for f in view.findings)


@pytest.mark.distributed
def test_pause_stops_the_clock_and_speed_scales_it(run_dir: Path) -> None:
    source = ReplaySource(run_dir, speed=1.0, interval_s=0.02)
    with source:
        source.paused = True
        held = source.position_ns
        time.sleep(0.3)
        assert source.position_ns == held and source.paused
        view = wait_for(lambda: (v := source.latest()).t_ns == source.start_ns + held and v, what="a paused view")
        time.sleep(0.1)
        assert source.latest().t_ns == view.t_ns  # the views stop too

        for speed in (1.0, 4.0):
            source.seek(0)
            source.speed = speed
            source.paused = False
            # each read is bracketed by wall-clock reads, so a busy machine widens the bounds, not the error
            before0, pos0, after0 = time.monotonic(), source.position_ns, time.monotonic()
            # A third of the run at this speed, at most 0.2 s: the recorded run is ~0.75 s long on this
            # machine, which 0.2 s at 4x would overrun (seen once in CI).
            time.sleep(min(0.2, source.duration_ns / 1e9 / speed / 3))
            before1, pos1, after1 = time.monotonic(), source.position_ns, time.monotonic()
            source.paused = True
            assert pos1 < source.duration_ns  # not stopped by the end of the run
            virtual_s = (pos1 - pos0) / 1e9
            assert (before1 - after0) * speed * 0.99 <= virtual_s <= (after1 - before0) * speed * 1.01
        assert not source.finished and 0 < source.position_ns < source.duration_ns
    with pytest.raises(ZeromonError, match="replay speed 0"):
        source.speed = 0
    with pytest.raises(ZeromonError, match="replay speed 'fast'"):
        ReplaySource(run_dir, speed="fast")  # type: ignore[arg-type]


@pytest.mark.distributed
def test_a_rank_whose_recording_ends_early_turns_stale(run_dir: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut"
    shutil.copytree(run_dir, cut)
    lines = (cut / "rank-1.jsonl").read_text().splitlines(keepends=True)
    third_step = next(i for i, line in enumerate(lines) if line.startswith('["step",1,2,'))
    (cut / "rank-1.jsonl").write_text("".join(lines[:third_step + 1]))  # rank 1 died after its third step
    rank1_end = max(record_times(read_recording(cut / "rank-1.jsonl")))
    rank0_end = max(record_times(read_recording(cut / "rank-0.jsonl")))
    source = ReplaySource(cut)
    assert source.start_ns + source.duration_ns == rank0_end > rank1_end  # rank 0 went on for 5 steps
    later_ns = (rank0_end - rank1_end) // 2  # a moment while rank 0 still runs, however fast the steps were

    before = source.view_at(rank1_end - source.start_ns)
    assert [r.alive for r in before.ranks] == [True, True]
    after = source.view_at(rank1_end - source.start_ns + later_ns)
    rank0, rank1 = after.ranks
    assert rank0.alive and rank0.error is None and rank0.stale_s == 0.0
    assert not rank1.alive and rank1.stale_s == pytest.approx(later_ns / 1e9, abs=1e-3)
    assert rank1.error is not None and "recording ends" in rank1.error
    assert rank1.t_ns == rank1_end and rank1.steps == before.ranks[1].steps  # its last data stays
    assert rank0.last_step is not None and rank1.last_step is not None
    assert rank0.last_step.step > rank1.last_step.step
    end = source.view_at(source.duration_ns)
    assert [r.alive for r in end.ranks] == [False, False]
    assert end.ranks[1].stale_s == pytest.approx((rank0_end - rank1_end) / 1e9, abs=1e-3)


@pytest.mark.distributed
def test_the_final_view_made_a_rank_at_a_time_is_the_replays_at_its_end(run_dir: Path, tmp_path: Path) -> None:
    """final_view makes each rank's part where the rank is read (a worker process) and holds no track: the
    same FleetView as a ReplaySource at its end, for a whole run, a rank cut short (no end record: died), a
    skipped line, and a rank whose file holds its header only (no records)."""
    cases = {"whole": run_dir}
    cut = cases["cut"] = tmp_path / "cut"
    shutil.copytree(run_dir, cut)
    lines = (cut / "rank-1.jsonl").read_text().splitlines(keepends=True)
    third_step = next(i for i, line in enumerate(lines) if line.startswith('["step",1,2,'))
    (cut / "rank-1.jsonl").write_text("".join(lines[:third_step + 1]))
    skipped = cases["skipped"] = tmp_path / "skipped"
    shutil.copytree(run_dir, skipped)
    lines = (skipped / "rank-0.jsonl").read_text().splitlines(keepends=True)
    (skipped / "rank-0.jsonl").write_text("".join([*lines[:5], "not a record\n", *lines[5:]]))
    empty = cases["empty"] = tmp_path / "empty"
    shutil.copytree(run_dir, empty)
    (empty / "rank-1.jsonl").write_text((empty / "rank-1.jsonl").read_text().splitlines(keepends=True)[0])
    for name, folder in cases.items():
        source = ReplaySource(folder)
        expected = source.view_at(source.duration_ns)
        for workers in (1, 2):
            assert final_view(folder, workers=workers) == expected, (name, workers)
    views = {name: final_view(folder) for name, folder in cases.items()}
    assert views["cut"].ranks[1].died is not None and views["cut"].ranks[1].stale_s > 0
    assert views["skipped"].error is not None and "rank-0.jsonl" in views["skipped"].error
    assert views["empty"].ranks[1].error == "the recording holds no records"
    assert [r.last_step.step for r in views["whole"].ranks if r.last_step] == [STEPS - 1, STEPS - 1]


@pytest.mark.distributed
def test_loop_starts_over_and_seek_goes_back(run_dir: Path) -> None:
    source = ReplaySource(run_dir, loop=True, interval_s=0.02)
    source.speed = source.duration_ns / 0.5e9  # a lap in half a second
    positions = []
    with source:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not any(b < a for a, b in zip(positions, positions[1:], strict=False)):
            positions.append(source.position_ns)
            time.sleep(0.01)
        assert any(b < a for a, b in zip(positions, positions[1:], strict=False)), "the clock never wrapped"
        assert not source.finished
        source.paused = True
        source.seek(source.duration_ns)
        wait_for(lambda: source.latest().ranks[0].last_step, what="a view with steps")
        source.seek(0)
        back = wait_for(lambda: (v := source.latest()).t_ns == source.start_ns and v, what="the view at 0")
    assert all(not r.steps and not r.collectives and r.oom is None for r in back.ranks)
    assert back.ranks[0].alive or back.ranks[1].alive  # the one with the first record


def test_bad_run_folders_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach", "--replay", str(tmp_path)]) == 2  # before the screen is taken
    err = capsys.readouterr().err
    assert f"zeromon: error: replay {tmp_path}: no rank-<r>.zmr (or .jsonl) recordings in this folder" in err
    assert "hint: record a run with `zeromon run --out DIR -- CMD ...`" in err

    with pytest.raises(ZeromonError, match=f"replay {tmp_path / 'nope'}: no such run folder"):
        ReplaySource(tmp_path / "nope")
    with pytest.raises(ZeromonError, match=re.escape("no rank-<r>.zmr (or .jsonl) recordings")):
        ReplaySource(tmp_path)
    (tmp_path / "rank-0.jsonl").write_text("hello\n")
    with pytest.raises(ZeromonError, match="rank-0.jsonl:1: not a zeromon recording"):
        ReplaySource(tmp_path)
    (tmp_path / "rank-0.jsonl").write_text('{"format": "zeromon-recording", "version": "1.1", "rank": 0, '
                                           '"schemas": {}}\n')
    with pytest.raises(ZeromonError, match="hold no records"):
        ReplaySource(tmp_path)


@pytest.mark.distributed
def test_a_folder_holding_another_runs_rank_file_is_refused(run_dir: Path, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(run_dir, mixed)
    shutil.copy(mixed / "rank-0.jsonl", mixed / "rank-1.jsonl")  # rank 0's file under rank 1's name
    with pytest.raises(ZeromonError, match="rank-1.jsonl"):
        ReplaySource(mixed)


def test_live_played_to_the_end_prints_the_final_view_once_prints(run_dir: Path) -> None:
    """`zeromon live --replay` played through ends on the run's final state: the view `--once` prints (made
    from the ranks the replay already read, not from a second read of the files)."""
    played = zeromon("live", "--json", "--replay", str(run_dir), "--speed", "1000", "--interval", "0.25")
    once = zeromon("live", "--once", "--json", "--replay", str(run_dir))
    assert played.returncode == once.returncode == 0, played.stderr + once.stderr
    last, final = json.loads(played.stdout.splitlines()[-1]), json.loads(once.stdout.splitlines()[-1])
    for view in (last, final):
        view.pop("t_ns")
        for rank in view["ranks"]:
            rank.pop("stale_s", None)
    assert last == final
    assert [r["steps"][-1]["step"] for r in final["ranks"]] == [STEPS - 1, STEPS - 1]
