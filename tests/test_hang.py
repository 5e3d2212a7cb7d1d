"""Hangs named while they happen, in real gloo runs left hanging (tests/scenarios/hang.py, a long backend
timeout): which rank, which collective, which line, and who waits, within the threshold plus 10 s, in
`zeromon live`, `zeromon hang`, /metrics and the recording; and a hung rank still stops on SIGTERM.

Each run's threshold is HANG_AFTER (ZEROMON_HANG_AFTER); the automatic one (the larger of 30 s and ten median
steps) is checked without waiting 30 s in tests/test_progress_watch.py. The TUI (in tmux) and the dashboard (in
Chromium) on a hung run are in tests/test_hang_screens.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from zeromon.model.codec import read_recording
from zeromon.model.run_end import read_file_end

from conftest import REPO, child_env, free_port, torchrun_args, zeromon

SCENARIO = REPO / "tests" / "scenarios" / "hang.py"
HANG_AFTER = 3.0  # seconds without progress that make a rank suspect, in these runs
VERDICT_WITHIN = HANG_AFTER + 10  # the issue's promise: the verdict within the threshold plus 10 s
START_TIMEOUT = 90  # a run's start to its cue, on a loaded 2-core machine
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class HungRun:
    """A run under `zeromon run`, its launcher in a process group of its own; its output read as it comes."""

    def __init__(self, out: Path, command: list[str], hang_after: float = HANG_AFTER) -> None:
        self.out = out
        self.lines: list[str] = []
        self.hung_at: float | None = None  # monotonic time of the scenario's "HUNG" cue
        self.proc = subprocess.Popen([sys.executable, "-m", "zeromon", "run", "--out", str(out), "--", *command],
                                     env=child_env(ZEROMON_HANG_AFTER=str(hang_after)), cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if "HUNG" in line and self.hung_at is None:  # a line of another rank's may share it
                self.hung_at = time.monotonic()

    def wait_for_cue(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while self.hung_at is None:
            assert self.proc.poll() is None, "the run ended before it hung:\n" + "\n".join(self.lines[-30:])
            assert time.monotonic() < deadline, "no HUNG cue:\n" + "\n".join(self.lines[-30:])
            time.sleep(0.2)

    def live(self) -> subprocess.CompletedProcess[str]:
        return zeromon("live", "--once", str(self.out), timeout=60)

    def live_json(self) -> dict[str, Any]:
        return json.loads(zeromon("live", "--once", "--json", str(self.out), timeout=60).stdout)

    def until(self, what: str, check: Callable[[], Any]) -> tuple[Any, float]:
        """``check()``'s first truthy answer, and the seconds from the cue to it; fails past VERDICT_WITHIN."""
        assert self.hung_at is not None
        while True:
            answer = check()
            elapsed = time.monotonic() - self.hung_at
            if answer:
                return answer, elapsed
            assert elapsed < VERDICT_WITHIN + 20, f"no {what} {elapsed:.0f} s after the hang began"
            time.sleep(0.5)

    def pid(self, rank: int) -> int:
        return int(json.loads((self.out / "endpoints" / f"rank-{rank}.json").read_text())["pid"])

    def url(self, rank: int) -> str:
        return str(json.loads((self.out / "endpoints" / f"rank-{rank}.json").read_text())["url"])

    def stop(self) -> None:
        """SIGTERM to the launcher's whole group, then SIGKILL to what is left; waits for the output's end."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        self._reader.join(timeout=10)


@contextlib.contextmanager
def hung_run(tmp_path: Path, *args: str, world: int = 2, spawn: bool = False) -> Iterator[HungRun]:
    if spawn:
        command = [sys.executable, str(SCENARIO), "--spawn", str(world), "--master-port", str(free_port()), *args]
    else:
        command = torchrun_args(world, SCENARIO, *args)
    run = HungRun(tmp_path / "run", command)
    try:
        run.wait_for_cue()
        yield run
    finally:
        run.stop()


def hung_verdict(run: HungRun) -> dict[str, Any] | None:
    """The verdict of `zeromon live --once --json` once it says the job is hung."""
    hang = run.live_json().get("hang")
    return hang if hang is not None and hang["hung"] else None


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def hung_when_ended(run: HungRun) -> str:
    """What `zeromon report` says of the hang its stopped ranks were in (the line's text after its head)."""
    text = zeromon("report", str(run.out), timeout=120).stdout
    head = "the job was hung when its ranks ended: "
    line = next((line.strip() for line in text.splitlines() if line.strip().startswith(head)), None)
    assert line is not None, text[-3000:]
    return line.removeprefix(head)


def gone_within(pid: int, seconds: float) -> float | None:
    """Seconds until ``pid`` is gone (a zombie counts as gone), or None if it outlives ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return time.monotonic() - start
        except FileNotFoundError:
            return time.monotonic() - start
        time.sleep(0.02)
    return None


# --- a rank stuck outside any collective (FSDP2, 2 ranks, torchrun) ---------------------------------------

@pytest.fixture(scope="module")
def stuck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HungRun]:
    with hung_run(tmp_path_factory.mktemp("stuck"), "--mode", "stuck", "--rank", "1", "--step", "4") as run:
        yield run


def test_live_names_the_stuck_rank_its_function_and_the_collective_its_peer_waits_in(stuck: HungRun) -> None:
    result, elapsed = stuck.until("hung verdict", lambda: (r := stuck.live()).returncode == 4 and r)
    assert elapsed <= VERDICT_WITHIN
    text = result.stdout
    headline = next(line for line in text.splitlines() if line.startswith("critical: hung: "))
    assert re.search(r"rank 1 has not reached all_gather #\d+ of the default group \(param_all_gather, layers\.0\)",
                     headline), headline
    assert "it is in data_loader_stall (hang.py:" in headline and "outside any collective" in headline
    assert "rank 0 waits in it since" in headline
    states = {line.split()[0]: line.split()[1] for line in text.splitlines() if re.match(r"\s+[01]\s", line)}
    assert states == {"0": "waiting", "1": "stuck"}


def test_the_verdict_is_decided_from_both_ranks_reports_with_the_group_sequence_numbers(stuck: HungRun) -> None:
    hang, _ = stuck.until("hung verdict", lambda: hung_verdict(stuck))
    assert hang["culprits"] == [1] and hang["severity"] == "critical"
    ranks = {r["rank"]: r for r in hang["ranks"]}
    assert ranks[0]["state"] == "waiting" and ranks[0]["waits_for"] == [1] and ranks[0]["op"] == "all_gather"
    assert ranks[1]["state"] == "stuck" and ranks[1]["where"][2] == "data_loader_stall"
    snapshots = [json.loads(_LOCAL.open(f"{stuck.url(r)}/api/v1/snapshot?steps=0", timeout=10).read())
                 for r in (0, 1)]
    waiting, stalled = (s["progress"] for s in snapshots)
    # The peer waits in the default group's collective number N; the stuck rank has issued N - 1 there.
    seq = waiting["blocked"]["call"]["seq"]
    assert ranks[0]["seq"] == seq and seq > 1
    assert [g["issued"] for g in stalled["groups"] if g["desc"] == "default_pg"] == [seq - 1]
    assert stalled["blocked"] is None and stalled["where"][2] == "data_loader_stall"


def test_metrics_say_which_rank_is_stalled_and_what_its_peer_waits_in(stuck: HungRun) -> None:
    stuck.until("hung verdict", lambda: hung_verdict(stuck))
    text = {r: _LOCAL.open(f"{stuck.url(r)}/metrics", timeout=10).read().decode() for r in (0, 1)}

    def value(rank: int, name: str, **labels: str) -> float | None:
        for line in text[rank].splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None

    assert value(0, "zeromon_stalled") == 1 and value(1, "zeromon_stalled") == 1
    assert value(0, "zeromon_collective_inflight_seconds", op="all_gather", meaning="param_all_gather") >= HANG_AFTER
    assert value(1, "zeromon_collective_inflight_seconds") is None  # outside any collective
    seq = value(0, "zeromon_collective_inflight_seq", group="0")
    assert seq is not None and value(1, "zeromon_group_collectives_issued", group="0") == seq - 1
    assert value(1, "zeromon_progress_age_seconds") >= HANG_AFTER


def test_zeromon_hang_prints_the_verdict_and_each_ranks_stack(stuck: HungRun) -> None:
    stuck.until("hung verdict", lambda: hung_verdict(stuck))
    result = zeromon("hang", str(stuck.out), timeout=60)
    assert result.returncode == 4, result.stdout + result.stderr
    out = result.stdout
    assert out.splitlines()[1].startswith("critical: hung: rank 1 has not reached all_gather #")
    assert "the training threads' stacks when they made no progress" in out
    stacks = out.split("the training threads' stacks")[1]
    # The culprit's stack first, ending in the stalled function; rank 0's passes through the model's forward.
    blocks = re.split(r"\n(?=rank \d)", stacks.split(":\n", 1)[1])
    assert blocks[0].startswith("rank 1: in data_loader_stall (hang.py:") and \
        re.search(r'  File ".*hang\.py", line \d+, in data_loader_stall$', blocks[0].rstrip()), blocks[0]
    assert blocks[1].startswith("rank 0: in forward (hang.py:")
    assert re.search(r'  File ".*hang\.py", line \d+, in forward\n', blocks[1])
    threads = zeromon("hang", "--threads", "--json", str(stuck.out), timeout=60)
    names = {t["thread"] for t in json.loads(threads.stdout)["threads"]["1"]}
    assert {"MainThread", "zeromon-recorder"} <= names
    # No frame of zeromon's: rank 0 is inside its all-gather, whose wrapper stands between the model's forward and
    # torch's all_gather; it is not in the verdict's stacks, nor in the endpoint's unless asked for.
    assert "zeromon_agent" not in stacks and "zeromon_collective" not in stacks, stacks

    def main_stack(rank: int, query: str = "") -> list[list[Any]]:
        document = json.loads(_LOCAL.open(f"{stuck.url(rank)}/api/v1/stacks{query}", timeout=10).read())
        return next(t["stack"] for t in document["threads"] if t["thread"] == "MainThread")

    assert not [f for f in main_stack(0) if "/zeromon_agent/" in f[0]], main_stack(0)
    kept = main_stack(0, "?agent_frames=1")
    functions = [f[2] for f in kept]
    assert "zeromon_collective" in functions and functions.index("forward") < functions.index("zeromon_collective")


def test_sigterm_ends_a_rank_blocked_in_a_collective_within_a_second_and_its_recording_says_where(
        stuck: HungRun) -> None:
    stuck.until("hung verdict", lambda: hung_verdict(stuck))
    pid = stuck.pid(0)  # blocked inside the all-gather: Python's own handler cannot run there
    os.kill(pid, signal.SIGTERM)
    assert (took := gone_within(pid, 5.0)) is not None and took < 1.0, took
    end = read_file_end(stuck.out / "rank-0.jsonl").end
    assert end is not None and end.how == "signal SIGTERM"
    last = read_recording(stuck.out / "rank-0.jsonl").progress[-1]
    assert last.reason == "signal SIGTERM" and last.report["blocked"]["call"]["op"] == "all_gather"
    # torchrun stops rank 1 in turn; its report says where it was.
    assert gone_within(stuck.pid(1), 30.0) is not None
    stuck.proc.wait(timeout=30)
    for command in ("report", "summary"):
        text = zeromon(command, str(stuck.out), timeout=120).stdout
        assert re.search(r"the job was hung when its ranks ended: rank 1 has not reached all_gather #\d+ of the "
                         r"default group .*: it is in data_loader_stall \(hang\.py:\d+\)", text), text[-3000:]


# --- the ranks no longer issue the same collectives -------------------------------------------------------

def test_a_rank_that_issues_an_extra_collective_is_named_with_what_each_rank_issued(tmp_path: Path) -> None:
    with hung_run(tmp_path, "--mode", "extra", "--rank", "1", "--step", "3") as run:
        hang, elapsed = run.until("hung verdict", lambda: hung_verdict(run))
        assert elapsed <= VERDICT_WITHIN
        # Both ranks are blocked in their collectives; SIGTERM to torchrun, which forwards it to them.
        pids = [run.pid(0), run.pid(1)]
        os.kill(_parent(pids[0]), signal.SIGTERM)
        assert all((took := gone_within(pid, 10.0)) is not None and took < 3.0 for pid in pids), took
        run.proc.wait(timeout=30)
        for rank, op in ((0, "all_gather"), (1, "all_reduce")):
            assert read_file_end(run.out / f"rank-{rank}.jsonl").end.how == "signal SIGTERM"  # type: ignore[union-attr]
            last = read_recording(run.out / f"rank-{rank}.jsonl").progress[-1]
            assert last.reason == "signal SIGTERM" and last.report["blocked"]["call"]["op"] == op
    line = hang["lines"][0]
    assert re.search(r"^the ranks disagree at #\d+ of the default group: rank 0 issued all_gather \(.*\); "
                     r"rank 1 issued all_reduce \(4 B, float32\)", line), line
    assert {r["state"] for r in hang["ranks"]} == {"desync"}


def test_a_rank_that_skipped_a_step_is_the_odd_one_out_of_four_at_the_final_barrier(tmp_path: Path) -> None:
    with hung_run(tmp_path, "--mode", "skip", "--rank", "2", "--step", "3", "--steps", "5", world=4,
                  spawn=True) as run:
        hang, elapsed = run.until("hung verdict", lambda: hung_verdict(run))
        assert elapsed <= VERDICT_WITHIN
    assert hang["culprits"] == [2]
    assert re.search(r"^rank 2 issued barrier \(0 B\) at #\d+ of the default group where ranks 0-1, 3 issued "
                     r"all_gather", hang["lines"][0]), hang["lines"][0]
    # Stopped by SIGTERM, the ranks' recordings say the same (each wrote where the signal found it).
    assert hung_when_ended(run).startswith(hang["lines"][0].split("; they wait since")[0])


# --- a hang inside one subgroup ---------------------------------------------------------------------------

def test_a_hang_inside_a_subgroup_names_the_stuck_rank_and_the_chain_that_waits_for_it(tmp_path: Path) -> None:
    # FSDP2's all-gathers async here: ranks 0 and 1 wait in the Work.wait of the world's next all-gather.
    with hung_run(tmp_path, "--mode", "subgroup", "--rank", "3", "--step", "3", "--subgroups", "--async-unshard",
                  world=4, spawn=True) as run:
        def whole(hang: dict[str, Any] | None) -> bool:  # each rank past its own threshold, the last waiter too
            return hang is not None and [r["state"] for r in hang["ranks"]] == ["waiting"] * 3 + ["stuck"]

        hang, elapsed = run.until("hung verdict", lambda: (h := hung_verdict(run)) and whole(h) and h)
        assert elapsed <= VERDICT_WITHIN
        snapshot = json.loads(_LOCAL.open(f"{run.url(0)}/api/v1/snapshot?steps=0", timeout=10).read())
        blocked = snapshot["progress"]["blocked"]
        assert blocked["waiting"] and blocked["call"]["op"] == "all_gather" and blocked["call"]["group"] == "0"
    line = hang["lines"][0]
    assert re.search(r"^rank 3 has not reached all_reduce #\d+ of group \d+ .*: it is in data_loader_stall", line), line
    assert "; rank 2 waits in it since" in line
    ranks = {r["rank"]: r for r in hang["ranks"]}
    assert ranks[2]["waits_for"] == [3] and ranks[0]["state"] == ranks[1]["state"] == "waiting"
    assert re.match(r"rank 3 has not reached all_reduce #\d+ of group \d+ .*: it is in data_loader_stall",
                    hung_when_ended(run))


# --- a rank killed while its peers wait ------------------------------------------------------------------------

def test_a_rank_killed_while_its_peer_waits_is_named_first_and_the_failure_it_caused_after(tmp_path: Path) -> None:
    # On gloo the killed rank's connections close, and its peer, inside the next collective, fails at once ("Connection
    # reset by peer"): no hang lingers, so the report says who went first. No launcher between them to stop the peer.
    run = HungRun(tmp_path / "run", [sys.executable, str(SCENARIO), "--spawn", "2", "--master-port", str(free_port()),
                                     "--mode", "kill", "--rank", "1", "--step", "3"])
    try:
        run.proc.wait(timeout=START_TIMEOUT)
    finally:
        run.stop()
    lines = [line.strip() for line in zeromon("report", str(run.out), timeout=120).stdout.splitlines()]
    ended = lines[lines.index("how the ranks ended:") + 1:]
    assert ended[0].startswith("rank 1 died first, ") and "no end record" in ended[0], ended
    assert ended[1].startswith("rank 0 died at step ") and "after rank 1: an exception, RuntimeError" in ended[1]
    assert "(rank 0 may have failed because rank 1 did" in ended[2]


# --- no false alarm ------------------------------------------------------------------------------------------

def test_slow_steps_and_a_checkpoint_shorter_than_the_threshold_raise_no_alarm(tmp_path: Path) -> None:
    # An 8 s checkpoint load on rank 1 before the first step (its peer waits in the broadcast meanwhile), then steps
    # of over 1.5 s and a 3 s checkpoint save on rank 1: at most ~4.5 s without progress once the first step has
    # ended, under a 6 s threshold. The setup is judged by the setup threshold (by default the larger of 300 s
    # and that one): a threshold for steps would call the load hung.
    run = HungRun(tmp_path / "run", torchrun_args(2, SCENARIO, "--mode", "checkpoint", "--rank", "1", "--step", "2",
                                                  "--stall", "3", "--steps", "4", "--step-sleep", "1.5",
                                                  "--setup-stall", "8"),
                  hang_after=6.0)
    seen: list[dict[str, Any]] = []
    try:
        while run.proc.poll() is None:
            if (run.out / "endpoints").is_dir():
                seen.append(run.live_json())
            time.sleep(0.5)
    finally:
        run.stop()
    assert run.proc.returncode == 0, "\n".join(run.lines[-30:])
    assert sum(1 for view in seen if view["ranks"]) >= 5, "too few live views to say anything"
    alarms = [(view["hang"]["lines"], [(r["rank"], r["state"], r["idle_s"], r["where"]) for r in view["hang"]["ranks"]])
              for view in seen if view.get("hang") and view["hang"]["lines"]]
    assert not alarms, "\n".join(map(str, alarms))
    for rank in (0, 1):
        recording = read_recording(run.out / f"rank-{rank}.jsonl")
        assert recording.progress == [] and not [n for n in recording.notices if n.source == "progress"]


# --- a program's own SIGTERM handler ------------------------------------------------------------------------

GRACEFUL = '''
import os, signal, sys, time
import torch.distributed as dist
import zeromon_agent
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:{port}")
zeromon_agent.attach()
stopping = []
signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))  # a trainer's graceful stop
print("READY", flush=True)
while not stopping:
    time.sleep(0.05)
time.sleep(1.5)  # its checkpoint before leaving
print("CLEAN EXIT", flush=True)
zeromon_agent.detach()
dist.destroy_process_group()
os._exit(0)
'''


def test_a_sigterm_handler_the_program_set_after_the_agent_keeps_its_graceful_stop(tmp_path: Path) -> None:
    script = tmp_path / "graceful.py"
    script.write_text(GRACEFUL.replace("{port}", str(free_port())))
    proc = subprocess.Popen([sys.executable, str(script)], env=child_env(ZEROMON_OUT=str(tmp_path / "run")),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("READY"):
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "CLEAN EXIT" in out, out


FORKS = '''
import multiprocessing, os, signal, sys, time
import torch.distributed as dist
import zeromon_agent
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:{port}")
zeromon_agent.attach()
context = multiprocessing.get_context("fork")
worker = context.Process(target=time.sleep, args=(60,))  # a DataLoader worker, say, that its parent terminates
worker.start()
time.sleep(0.5)
worker.terminate()  # SIGTERM
worker.join()
print("WORKER", worker.exitcode, flush=True)
if os.fork() == 0:  # a child that leaves by the interpreter's exit, running the atexit handlers it inherited
    sys.exit(0)
os.wait()
time.sleep(1.0)  # the parent goes on past the watch's grace
print("PARENT DONE", flush=True)
zeromon_agent.detach()
dist.destroy_process_group()
os._exit(0)
'''


def test_a_forked_child_stopped_by_sigterm_or_exiting_touches_neither_its_parent_nor_its_recording(
        tmp_path: Path) -> None:
    script = tmp_path / "forks.py"
    script.write_text(FORKS.replace("{port}", str(free_port())))
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, str(script)], env=child_env(ZEROMON_OUT=str(out)), cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "PARENT DONE" in result.stdout, result.stdout + result.stderr
    assert f"WORKER {-signal.SIGTERM}" in result.stdout  # the child died by the signal, as it would without zeromon
    recording = read_recording(out / "rank-0.jsonl")
    assert read_file_end(out / "rank-0.jsonl").end.how == "detach"  # type: ignore[union-attr]
    assert recording.progress == []
    ends = subprocess.run(["grep", "-c", '^\\["run_end"', str(out / "rank-0.jsonl")], capture_output=True, text=True)
    assert ends.stdout.strip() == "1"
