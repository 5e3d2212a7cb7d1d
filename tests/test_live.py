"""Discovery, `zeromon targets`, the live source and the PromQL client.

Most tests poll *simulated* agents: small real HTTP servers (http.server) that answer
``/api/v1/snapshot`` with documents built from zeromon's own model types, as the spec's schema
``zeromon.snapshot/1`` says, and that can be stopped, restarted, made slow or made to answer
garbage. The PromQL client is tested against a real HTTP server that speaks Prometheus's
``/api/v1/query`` JSON; tests/test_prometheus_server.py runs a real Prometheus. The end-to-end test
at the bottom polls the real agents of a real 2-rank gloo training run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.oom import OomForecast
from zeromon.cli import main
from zeromon.commands.live import format_fleet, status_lines
from zeromon.errors import ZeromonError
from zeromon.model.events import AgentStats, MemorySample, PhaseSpan, RunInfo, StepSummary
from zeromon.model.registry import EndpointEntry, read_entry, run_entry_path, user_entry_path, write_entry
from zeromon.sources.discovery import (
    LocalRun,
    file_sd_groups,
    newest_local_run,
    parse_target,
    run_entries,
    run_to_follow,
)
from zeromon.sources.fleet import FleetView, RankView
from zeromon.sources.live import LiveSource
from zeromon.sources.promql import PrometheusFleet

from conftest import REPO, child_env, free_port, ranks_args

HOST = os.uname().nodename


# --- a simulated agent -----------------------------------------------------------------------------


def send_json(handler: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)

class SimAgent:
    """One rank's endpoint, simulated: a real HTTP server answering snapshots of a fake training run."""

    def __init__(self, rank: int, port: int | None = None, token: str | None = None) -> None:
        self.rank, self.token = rank, token
        self.port = port or free_port()
        self.step = 3
        self.start_ns = time.time_ns()
        self.queries: list[dict[str, list[str]]] = []
        self.answer: Callable[[], tuple[int, bytes]] | None = None  # overrides the snapshot
        self.delay_s = 0.0
        self._server: ThreadingHTTPServer | None = None
        self._connections: list[Any] = []

    def start(self) -> SimAgent:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 with Content-Length (the client's HTTP/1.0 request still ends the connection).
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                agent._connections.append(self.connection)

            def do_GET(self) -> None:  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                if agent.delay_s:
                    time.sleep(agent.delay_s)
                if agent.token and self.headers.get("Authorization") != f"Bearer {agent.token}":
                    status, body = 401, b'{"error": "unauthorized"}'
                elif url.path != "/api/v1/snapshot":
                    status, body = 404, b"{}"
                elif agent.answer is not None:
                    status, body = agent.answer()
                else:
                    query = urllib.parse.parse_qs(url.query)
                    agent.queries.append(query)
                    status, body = 200, json.dumps(agent.snapshot(query)).encode()
                send_json(self, status, body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for conn in self._connections:  # a stopped process's keep-alive connections end with it
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._connections.clear()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def entry(self, run_dir: Path, pid: int | None = None, start_ns: int | None = None) -> EndpointEntry:
        return EndpointEntry(run_dir=str(run_dir.resolve()), run_id=run_dir.name, job="sim", host=HOST,
                             address="127.0.0.1", port=self.port, url=f"http://127.0.0.1:{self.port}", rank=self.rank,
                             local_rank=self.rank, world_size=2, pid=pid or os.getpid(),
                             start_ns=start_ns or self.start_ns, token_required=self.token is not None,
                             agent_id=f"a{self.rank}", launch_id="sim")

    # Each step is 100 ms: forward, backward, optimizer phases; the cursor counts 4 events per step.
    def _step(self, s: int) -> StepSummary:
        t0 = self.start_ns + s * 100_000_000
        return StepSummary(rank=self.rank, step=s, start_ns=t0, end_ns=t0 + 100_000_000,
                           phase_s={"forward": 0.03, "backward": 0.05, "optimizer": 0.02}, collectives=12,
                           comm_bytes=3 << 20, comm_bytes_by_op={"all_gather": 2 << 20, "reduce_scatter": 1 << 20},
                           comm_union_s=0.04, blocked_s=0.02, peak_memory=300 << 20, comp_s=0.08, overlap_s=0.03,
                           exposed_comm_s=0.01)

    def _phases(self, s: int) -> list[PhaseSpan]:
        t0 = self.start_ns + s * 100_000_000
        return [PhaseSpan(self.rank, s, "forward", t0, t0 + 30_000_000),
                PhaseSpan(self.rank, s, "backward", t0 + 30_000_000, t0 + 80_000_000),
                PhaseSpan(self.rank, s, "optimizer", t0 + 80_000_000, t0 + 100_000_000)]

    def snapshot(self, query: dict[str, list[str]]) -> dict[str, Any]:
        n_steps = int(query.get("steps", ["64"])[0])
        steps = [self._step(s) for s in range(max(0, self.step - n_steps + 1), self.step + 1)]
        memory = MemorySample(rank=self.rank, step=self.step, phase="optimizer", t_ns=time.time_ns(), device="cpu",
                              allocated=None, reserved=None, active=None, peak_allocated=None, peak_reserved=None,
                              inactive_split=None, num_alloc_retries=None, num_ooms=None, capacity=8 << 30,
                              free=None, rss=(300 + self.step) << 20, categories={"optimizer_state": 1 << 20})
        finding = Finding("poor_overlap", Severity.WARN, "exposed communication is 10% of the step", rank=self.rank,
                          evidence=("step 3: 10 ms",), remedies=("prefetch",), metrics={"exposed_s": 0.01})
        oom = OomForecast(rank=self.rank, risk=Severity.OK, capacity_bytes=8 << 30, current_bytes=300 << 20,
                          peak_bytes=310 << 20, headroom_bytes=(8 << 30) - (310 << 20),
                          predicted_peak_bytes=310 << 20, growth_bytes_per_step=None, steps_to_capacity=None,
                          device="cpu")
        info = RunInfo(rank=self.rank, local_rank=self.rank, world_size=2, host=HOST, pid=os.getpid(), job="sim",
                       framework="fsdp2", framework_version=None, torch_version="2.13.0", backend="gloo",
                       device="cpu", zero_stage=None, fsdp_strategy="FULL_SHARD", param_dtype="float32",
                       reduce_dtype=None, optimizer="AdamW", knobs={"reshard_after_forward": True})
        cursor = 4 * (self.step + 1)
        doc: dict[str, Any] = {
            "schema": "zeromon.snapshot/1", "t_ns": time.time_ns(), "rank": self.rank, "local_rank": self.rank,
            "world_size": 2, "host": HOST, "pid": os.getpid(), "job": "sim", "start_ns": self.start_ns,
            "cursor": cursor, "run_info": dataclasses.asdict(info), "steps": [dataclasses.asdict(s) for s in steps],
            "memory": dataclasses.asdict(memory), "device": None,
            "stats": dataclasses.asdict(AgentStats(self.rank, time.time_ns(), 1000, 0, 0, 0.5)),
            "collectives": [{"op": "all_gather", "meaning": "param_all_gather", "calls": 8 * self.step,
                             "bytes": (2 << 20) * self.step, "seconds": 0.02 * self.step,
                             "blocked_s": 0.01 * self.step, "busbw_bytes_s": 1.5e9, "new_field": 1}],
            "oom": oom.to_dict(), "findings": [finding.to_dict()], "notices": [],
        }
        if "since" in query:
            since = int(query["since"][0])
            events = []
            for s in range(self.step + 1):
                for i, span in enumerate(self._phases(s)):
                    c = 4 * s + i + 1
                    if c > since:
                        events.append({"cursor": c, "kind": "phase", **dataclasses.asdict(span)})
                c = 4 * s + 4
                if c > since:
                    events.append({"cursor": c, "kind": "step", **dataclasses.asdict(self._step(s))})
            if "kinds" in query:  # as the agent: the kinds asked for, and where it looked through to
                events = [e for e in events if e["kind"] in query["kinds"][0].split(",")]
            limit = int(query.get("limit", ["2000"])[0])
            doc["events"] = events[:limit]
            doc["events_through"] = events[limit - 1]["cursor"] if len(events) >= limit else cursor
        return doc


@pytest.fixture
def agents() -> Iterator[list[SimAgent]]:
    started = [SimAgent(0).start(), SimAgent(1).start()]
    yield started
    for agent in started:
        agent.stop()


def wait_for(predicate: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def by_rank(view: Any) -> dict[int | None, RankView]:
    return {r.rank: r for r in view.ranks}


def rank_when(source: LiveSource, rank: int, alive: bool) -> Callable[[], RankView | None]:
    """A wait_for predicate: the rank's view once its alive flag is ``alive``."""
    def check() -> RankView | None:
        view = by_rank(source.latest()).get(rank)
        return view if view is not None and view.alive == alive else None
    return check


# --- targets and discovery ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, host, port", [
    ("127.0.0.1:9470", "127.0.0.1", 9470), ("node-3:9471", "node-3", 9471), ("[::1]:9470", "::1", 9470),
    ("http://10.0.0.2:9472/", "10.0.0.2", 9472),
])
def test_parse_target_accepts_host_port(text: str, host: str, port: int) -> None:
    target = parse_target(text)
    assert (target.host, target.port) == (host, port)
    assert parse_target(str(target)) == target


@pytest.mark.parametrize("text, says", [
    ("host:notaport", "'notaport' is not a number"), ("host", "no port"), ("[::1]", "'(none)' is not a number"), (":9470", "no host"),
    ("host:0", "'0' is not a number from 1 to 65535"), ("host:70000", "from 1 to 65535"),
    ("::1:9470", "IPv6 address needs brackets"),
])
def test_parse_target_refuses_malformed(text: str, says: str) -> None:
    with pytest.raises(ZeromonError) as err:
        parse_target(text)
    assert repr(text) in err.value.message and says in err.value.message


def test_live_with_a_malformed_target_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["live", "--once", "host:notaport"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == ("zeromon: error: TARGET 'host:notaport': the port 'notaport' is not a number "
                                   "from 1 to 65535")
    assert "Traceback" not in err


def test_unreachable_prometheus_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["live", "--once", "--prometheus", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zeromon: error: --prometheus {url}: connection refused")
    assert main(["live", "--once", "--prometheus", "http://host:port"]) == 2
    assert "--prometheus http://host:port: the port is not a number" in capsys.readouterr().err


def test_run_dir_without_endpoints_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["targets", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"RUN_DIR {tmp_path}: no agent endpoints registered in {tmp_path}/endpoints" in err
    assert main(["live", "--once", str(tmp_path)]) == 2
    assert "no agent endpoints registered" in capsys.readouterr().err
    assert main(["targets", str(tmp_path / "missing")]) == 2
    assert f"RUN_DIR {tmp_path / 'missing'}: no such run folder" in capsys.readouterr().err


def test_targets_prints_file_sd_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run-a"
    for rank, port in ((0, 9470), (1, 9471)):
        entry = SimAgent(rank, port=port).entry(run_dir)
        write_entry(run_entry_path(run_dir, rank), entry)
    (run_dir / "endpoints" / "rank-9.json").write_text("{not json")  # skipped, and said so
    assert main(["targets", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    # One group per rank: the agent's id goes into its scrape URL (?agent=), so no other agent passes for it.
    assert json.loads(out) == [{"targets": ["127.0.0.1:9470"], "labels": {"zeromon_run": "run-a", "__param_agent": "a0"}},
                               {"targets": ["127.0.0.1:9471"], "labels": {"zeromon_run": "run-a", "__param_agent": "a1"}}]
    assert "rank-9.json:1: not JSON" in err


def test_file_sd_uses_the_host_name_for_a_wildcard_bind(tmp_path: Path) -> None:
    entry = dataclasses.replace(SimAgent(0, port=9470).entry(tmp_path / "r"), address="0.0.0.0", host="node-7")
    assert file_sd_groups([entry]) == [{"targets": ["node-7:9470"], "labels": {"zeromon_run": "r", "__param_agent": "a0"}}]
    # An entry written before agent ids: scraped without one.
    assert file_sd_groups([dataclasses.replace(entry, agent_id="")]) == [{"targets": ["node-7:9470"],
                                                                        "labels": {"zeromon_run": "r"}}]


def test_newest_local_run_prefers_a_live_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    registry = tmp_path / "registry"
    monkeypatch.setenv("ZEROMON_REGISTRY", str(registry))
    old, new, crashed = tmp_path / "old", tmp_path / "new", tmp_path / "crashed"
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
    for run_dir, pid, start in ((old, os.getpid(), 1), (new, os.getpid(), 2), (crashed, int(dead_pid), 3)):
        agent = SimAgent(0, port=9470 + start)
        write_entry(run_entry_path(run_dir, 0), agent.entry(run_dir, pid=pid, start_ns=start))
        write_entry(user_entry_path(registry, HOST, pid + start), agent.entry(run_dir, pid=pid, start_ns=start))
    newest = newest_local_run()
    assert newest is not None and newest.run_dir == str(new.resolve()) and newest.alive
    assert main(["targets"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["labels"]["zeromon_run"] == "new"


def test_targets_without_any_local_run_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ZEROMON_REGISTRY", str(tmp_path / "empty"))
    assert main(["targets"]) == 2
    err = capsys.readouterr().err
    assert "no local run" in err and str(tmp_path / "empty") in err


def test_targets_write_keeps_the_file_up_to_date(tmp_path: Path) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "sd" / "zeromon.json"
    out.parent.mkdir()
    write_entry(run_entry_path(run_dir, 0), SimAgent(0, port=9470).entry(run_dir))
    proc = subprocess.Popen([sys.executable, "-m", "zeromon", "targets", str(run_dir), "--write", str(out),
                             "--interval", "0.1"], env=child_env(), cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        def targets() -> list[str]:
            try:
                return [t for group in json.loads(out.read_text()) for t in group["targets"]]
            except (OSError, ValueError, KeyError):
                return []

        assert wait_for(targets, what="the first file") == ["127.0.0.1:9470"]
        write_entry(run_entry_path(run_dir, 1), SimAgent(1, port=9471).entry(run_dir))
        wait_for(lambda: len(targets()) == 2, what="rank 1 in the file")
        assert targets() == ["127.0.0.1:9470", "127.0.0.1:9471"]
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "wrote 1 target(s)" in err and "wrote 2 target(s)" in err and "Traceback" not in err
    assert not [p for p in out.parent.iterdir() if p.name != out.name]  # no temporary files left


# --- the live source against simulated agents ----------------------------------------------------------------

def test_live_source_reads_snapshots_into_model_types(agents: list[SimAgent]) -> None:
    source = LiveSource(targets=[a.target for a in agents])
    view = source.poll()
    assert view.alive == 2 and view.error is None and [r.rank for r in view.ranks] == [0, 1]
    rank0 = by_rank(view)[0]
    assert rank0.target == agents[0].target and rank0.alive and rank0.error is None
    assert isinstance(rank0.run_info, RunInfo) and rank0.run_info.fsdp_strategy == "FULL_SHARD"
    assert [s.step for s in rank0.steps] == [0, 1, 2, 3] and rank0.last_step is not None
    assert rank0.last_step.overlap_ratio == pytest.approx(0.75)
    assert isinstance(rank0.memory, MemorySample) and rank0.memory.rss == 303 << 20
    assert isinstance(rank0.oom, OomForecast) and rank0.oom.risk is Severity.OK
    assert rank0.findings[0].severity is Severity.WARN and rank0.findings[0].evidence == ("step 3: 10 ms",)
    assert rank0.collectives[0].busbw_bytes_s == 1.5e9  # the unknown "new_field" was ignored
    assert rank0.host == HOST and rank0.world_size == 2

    agents[0].step = 5
    again = by_rank(source.poll())[0]
    assert [s.step for s in again.steps] == [0, 1, 2, 3, 4, 5]
    assert again.steps[0] is rank0.steps[0]  # steps already seen are reused, not parsed again
    assert again.run_info is rank0.run_info and again.memory != rank0.memory  # so is what did not change
    json.dumps(source.latest().to_dict())  # --json's output is plain JSON
    source.stop()


def test_after_the_first_poll_only_recent_steps_are_asked_and_a_gap_is_filled(agents: list[SimAgent]) -> None:
    source = LiveSource(targets=[agents[0].target])
    source.poll()
    agents[0].step = 5
    rank0 = source.poll().ranks[0]
    asked = int(agents[0].queries[1]["steps"][0])
    # 100 ms steps, polled every second: about twice the steps of a poll interval, not all 64.
    assert agents[0].queries[0]["steps"] == ["64"] and 20 <= asked <= 30
    assert [s.step for s in rank0.steps] == [0, 1, 2, 3, 4, 5]
    agents[0].step = last = 5 + asked + 10  # more steps than asked for: some are missing
    with_gap = source.poll().ranks[0]
    assert with_gap.last_step is not None and with_gap.last_step.step == last
    assert len(with_gap.steps) == 6 + asked
    filled = source.poll().ranks[0]
    assert agents[0].queries[3]["steps"] == ["64"]
    assert [s.step for s in filled.steps] == list(range(last + 1))
    source.stop()


def test_phase_spans_come_from_the_event_stream(agents: list[SimAgent]) -> None:
    source = LiveSource(targets=[agents[0].target])
    source.poll()  # the first poll learns the cursor (16 after steps 0-3)
    assert "since" not in agents[0].queries[0]
    agents[0].step = 4
    rank0 = source.poll().ranks[0]
    assert agents[0].queries[1]["since"] == ["0"]  # a backfill of up to PHASES_BACKFILL events
    assert agents[0].queries[1]["kinds"] == ["phase"]  # the TUI's source draws phases: the agent skips the rest
    assert [(p.step, p.phase) for p in rank0.phases[-3:]] == [(4, "forward"), (4, "backward"), (4, "optimizer")]
    assert all(isinstance(p, PhaseSpan) for p in rank0.phases) and len(rank0.phases) == 15
    agents[0].step = 5
    rank0 = source.poll().ranks[0]
    # only what is new since the last poll: past step 4's summary (cursor 20), which was looked through, not sent
    assert agents[0].queries[2]["since"] == ["20"]
    assert len(rank0.phases) == 18 and rank0.phases[-1].step == 5
    source.stop()


def test_a_source_that_keeps_collectives_asks_for_them_with_the_phases(agents: list[SimAgent]) -> None:
    source = LiveSource(targets=[agents[0].target], keep_collectives=8)  # the dashboard's step timeline
    source.poll()
    agents[0].step = 4
    source.poll()
    assert agents[0].queries[1]["kinds"] == ["phase,collective"]
    source.stop()


def test_a_dead_rank_turns_stale_keeps_its_data_and_comes_back(agents: list[SimAgent]) -> None:
    source = LiveSource(targets=[a.target for a in agents], interval_s=0.1, timeout_s=1.0).start()
    try:
        wait_for(lambda: source.latest().alive == 2, what="both ranks alive")
        agents[1].stop()
        dead = wait_for(rank_when(source, 1, alive=False), what="rank 1 stale")
        # A poll in flight as it stopped sees the connection closed; the polls after it, refused.
        assert any(why in (dead.error or "") for why in ("connection refused", "the connection was closed"))
        assert [s.step for s in dead.steps] == [0, 1, 2, 3]  # its last data stays
        time.sleep(0.3)
        later = by_rank(source.latest())[1]
        assert "connection refused" in (later.error or "")
        assert later.stale_s is not None and dead.stale_s is not None and later.stale_s > dead.stale_s
        assert by_rank(source.latest())[0].alive
        agents[1].step = 7
        agents[1].start()  # the same port again
        back = wait_for(rank_when(source, 1, alive=True), what="rank 1 back")
        assert back.error is None and back.last_step is not None and back.last_step.step == 7
    finally:
        source.stop()


def test_latest_never_waits_on_a_slow_agent(agents: list[SimAgent]) -> None:
    agents[1].delay_s = 3.0
    source = LiveSource(targets=[a.target for a in agents], interval_s=0.1, timeout_s=1.0).start()
    try:
        wait_for(rank_when(source, 0, alive=True), what="rank 0 alive")
        worst = 0.0
        for _ in range(20):
            started = time.perf_counter()
            view = source.latest()
            worst = max(worst, time.perf_counter() - started)
            time.sleep(0.05)
        assert worst < 0.5, f"latest() took {worst * 1e3:.1f} ms"  # waiting on the slow agent would take 1 s (its timeout)
        slow = wait_for(lambda: next((r for r in source.latest().ranks if r.error and "within" in r.error), None),
                        what="the slow agent's timeout")
        assert slow.error == "no answer within 1 s" and not slow.alive and view.ranks
    finally:
        agents[1].delay_s = 0.0
        source.stop()


def test_a_server_that_dribbles_is_cut_off_at_the_deadline() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def dribble() -> None:
            conn, _ = listener.accept()
            with conn:
                with contextlib.suppress(OSError):
                    for byte in b"HTTP/1.0 200 OK\r\nContent-Length: 1000\r\n\r\n" + b" " * 1000:
                        conn.sendall(bytes([byte]))
                        time.sleep(0.05)

        threading.Thread(target=dribble, daemon=True).start()
        target = f"127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        rank = LiveSource(targets=[target], timeout_s=0.5).poll().ranks[0]
        assert time.monotonic() - started < 1.5
        assert not rank.alive and rank.error == "no answer within 0.5 s"


@pytest.mark.parametrize("status, body, says", [
    (200, b"<html>not json</html>", "not a zeromon snapshot"),
    (200, b'{"schema": "other/1"}', "not a zeromon snapshot (schema 'other/1')"),
    (200, b'{"schema": "zeromon.snapshot/2"}', "snapshot schema zeromon.snapshot/2 is not supported"),
    (200, b'[1, 2]', "the answer is not a JSON object"),
    (500, b"boom", "HTTP 500 Internal Server Error: boom"),
    (200, b'{"schema": "zeromon.snapshot/1", "rank": 0, "steps": [{"step": 1}], "memory": 5, "oom": []}', None),
])
def test_bad_answers_are_errors_of_the_rank_not_exceptions(agents: list[SimAgent], status: int, body: bytes,
                                                          says: str | None) -> None:
    agents[0].answer = lambda: (status, body)
    rank = LiveSource(targets=[agents[0].target]).poll().ranks[0]
    if says is None:  # odd but readable: what cannot be read is left out
        assert rank.alive and rank.steps == () and rank.memory is None and rank.oom is None
    else:
        assert not rank.alive and says in (rank.error or "")


def test_a_token_is_sent_and_its_absence_explained(tmp_path: Path) -> None:
    agent = SimAgent(0, token="s3cret").start()
    try:
        refused = LiveSource(targets=[agent.target], token="").poll().ranks[0]
        assert not refused.alive and "requires a bearer token; set ZEROMON_TOKEN" in (refused.error or "")
        wrong = LiveSource(targets=[agent.target], token="nope").poll().ranks[0]
        assert "refused the token" in (wrong.error or "")
        assert LiveSource(targets=[agent.target], token="s3cret").poll().ranks[0].alive
    finally:
        agent.stop()


def test_agents_that_register_later_are_picked_up(tmp_path: Path, agents: list[SimAgent]) -> None:
    run_dir = tmp_path / "run"
    write_entry(run_entry_path(run_dir, 0), agents[0].entry(run_dir))
    source = LiveSource(run_dir=run_dir)
    first = source.poll()
    assert [r.rank for r in first.ranks] == [0] and first.source == f"run {run_dir}"
    write_entry(run_entry_path(run_dir, 1), agents[1].entry(run_dir))
    assert [(r.rank, r.alive) for r in source.poll().ranks] == [(0, True), (1, True)]
    source.stop()


def test_a_reused_run_folder_shows_only_the_newest_launchs_ranks(tmp_path: Path, agents: list[SimAgent]) -> None:
    # A 2-rank launch, then a 1-rank launch into the same folder: rank 1's entry is the first launch's.
    run_dir = tmp_path / "run"
    for agent in agents:
        write_entry(run_entry_path(run_dir, agent.rank),
                    dataclasses.replace(agent.entry(run_dir, start_ns=1), launch_id="first"))
    write_entry(run_entry_path(run_dir, 0), dataclasses.replace(agents[0].entry(run_dir, start_ns=2), launch_id="second"))
    assert [e.rank for e in run_entries(run_dir)] == [0]
    assert [r.rank for r in LiveSource(run_dir=run_dir).poll().ranks] == [0]
    assert agents[0].queries[-1]["agent"] == ["a0"]  # the live source names the agent it means
    # Each host has its own launcher: another host's ranks of the run are not an older launch.
    write_entry(run_entry_path(run_dir, 1), dataclasses.replace(agents[1].entry(run_dir, start_ns=1),
                                                                launch_id="first", host="node-9"))
    assert [e.rank for e in run_entries(run_dir)] == [0, 1]


def test_a_prometheus_given_as_an_agent_target_is_pointed_out() -> None:
    prom = FakePrometheus()
    try:
        view = LiveSource(targets=[prom.url.removeprefix("http://")]).poll()
        assert "not a zeromon agent" in (view.ranks[0].error or "") and "--prometheus" in (view.ranks[0].error or "")
    finally:
        prom.stop()


def test_no_arguments_finds_the_newest_local_run(tmp_path: Path, agents: list[SimAgent],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    registry = tmp_path / "registry"
    monkeypatch.setenv("ZEROMON_REGISTRY", str(registry))
    empty = LiveSource().poll()
    assert empty.ranks == () and empty.error is not None and "no agent found" in empty.error
    assert str(registry) in empty.looked_at[0]
    run_dir = tmp_path / "run"
    for agent in agents:
        write_entry(run_entry_path(run_dir, agent.rank), agent.entry(run_dir))
    write_entry(user_entry_path(registry, HOST, os.getpid()), agents[0].entry(run_dir))
    source = LiveSource()
    view = source.poll()
    assert view.alive == 2 and view.source == f"run {run_dir.resolve()}"
    source.stop()


# --- PromQL ------------------------------------------------------------------------------------------------

class FakePrometheus:
    """A real HTTP server that answers /api/v1/query as Prometheus does, from a table of series."""

    def __init__(self) -> None:
        self.series: list[tuple[dict[str, str], float]] = []
        self.targets: list[dict[str, Any]] = []  # /api/v1/targets' activeTargets
        self.queries: list[str] = []
        self.error: str | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
                fake.queries.append(query)
                status, doc = fake.answer(url.path, query)
                send_json(self, status, json.dumps(doc).encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def answer(self, path: str, query: str) -> tuple[int, dict[str, Any]]:
        if path == "/api/v1/targets":
            return 200, {"status": "success", "data": {"activeTargets": self.targets, "droppedTargets": []}}
        if path != "/api/v1/query":
            return 404, {}
        if self.error is not None:
            return 422, {"status": "error", "errorType": "execution", "error": self.error}
        now = time.time()
        if query == "vector(1)":
            result = [{"metric": {}, "value": [now, "1"]}]
        elif query.startswith("max by (zeromon_run, job)"):
            runs: dict[tuple[str, str], float] = {}
            for labels, value in self.series:
                if labels["__name__"] == "zeromon_agent_start_time_seconds":
                    key = (labels.get("zeromon_run", ""), labels.get("job", ""))
                    runs[key] = max(value, runs.get(key, 0.0))
            result = [{"metric": {"zeromon_run": r, "job": j}, "value": [now, str(v)]} for (r, j), v in runs.items()]
        elif query == 'up{zeromon_run!=""}':
            result = [{"metric": labels, "value": [now, repr(value)]} for labels, value in self.series
                      if labels["__name__"] == "up" and labels.get("zeromon_run")]
        else:
            run = query.split('zeromon_run="')[1].split('"')[0]
            result = [{"metric": labels, "value": [now, repr(value)]} for labels, value in self.series
                      if labels.get("zeromon_run") == run and not labels["__name__"].endswith("_bucket")]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}

    def add_rank(self, rank: int, run: str, start_s: float, step: int) -> None:
        instance = f"127.0.0.1:{9470 + rank}"
        base = {"rank": str(rank), "local_rank": str(rank), "host": "node-1", "job": "train", "instance": instance,
                "zeromon_run": run}
        self.series.append(({"__name__": "up", "instance": instance, "job": "zeromon", "zeromon_run": run}, 1.0))
        for name, value, extra in (
            ("zeromon_run_info", 1.0, {"framework": "deepspeed", "strategy": "zero3", "world_size": "2",
                                       "backend": "nccl", "device": "cuda:0", "param_dtype": "bfloat16",
                                       "framework_version": "0.19.8", "zeromon_version": "0.1.0"}),
            ("zeromon_agent_start_time_seconds", start_s, {}),
            ("zeromon_step", float(step), {}), ("zeromon_last_step_duration_seconds", 0.5, {}),
            ("zeromon_step_comm_seconds", 0.2, {}), ("zeromon_step_exposed_comm_seconds", 0.05, {}),
            ("zeromon_step_overlap_ratio", 0.75, {}),
            ("zeromon_memory_allocated_bytes", 40e9, {}), ("zeromon_memory_reserved_bytes", 44e9, {}),
            ("zeromon_memory_capacity_bytes", 80e9, {}), ("zeromon_memory_peak_bytes", 70e9, {}),
            ("zeromon_memory_headroom_bytes", 6e9, {}), ("zeromon_oom_risk", 1.0, {}),
            ("zeromon_oom_predicted_peak_bytes", 74e9, {}), ("zeromon_allocator_retries_total", 3.0, {}),
            ("zeromon_memory_category_bytes", 1e9, {"category": "optimizer_state"}),
            ("zeromon_collective_calls_total", 100.0, {"op": "all_gather", "meaning": "param_all_gather"}),
            ("zeromon_collective_bytes_total", 4e9, {"op": "all_gather", "meaning": "param_all_gather"}),
            ("zeromon_collective_duration_seconds_sum", 2.5, {"op": "all_gather", "meaning": "param_all_gather"}),
            ("zeromon_collective_duration_seconds_bucket", 100.0,
             {"op": "all_gather", "meaning": "param_all_gather", "le": "+Inf"}),
            ("zeromon_collective_busbw_bytes_per_second", 1.2e11, {"op": "all_gather"}),
            ("zeromon_device_utilization_ratio", 0.9, {}),
            ("zeromon_device_pcie_bytes_per_second", 5e9, {"direction": "tx"}),
            ("zeromon_agent_events_recorded_total", 5000.0, {}), ("zeromon_agent_cpu_seconds_total", 1.5, {}),
        ):
            self.series.append(({"__name__": name, **base, **extra}, value))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300, -1e300])
def test_promql_fleet_reads_values_prometheus_can_hold_but_no_agent_writes(bad: float) -> None:
    """NaN and +Inf are values Prometheus stores (a gauge set so, a rule dividing by zero), and 1e300 a
    finite one: every series of a rank set to one of them gives a view, never an exception."""
    prom = FakePrometheus()
    try:
        prom.add_rank(0, "run", 1000.0, step=3)
        prom.series = [(labels, v if labels["__name__"] in ("up", "zeromon_run_info") else bad)
                       for labels, v in prom.series]
        view = PrometheusFleet(prom.url).poll("prometheus", ("prometheus",))
        assert view.ranks or view.error  # NaN and inf start times name no run: said, not raised
        assert all(r.start_ns is None for r in view.ranks)  # not a Unix time in seconds
        text = format_fleet(view)  # and `zeromon live` prints it, as text and as JSON
        assert "Traceback" not in text and json.dumps(view.to_dict(), default=str)
    finally:
        prom.stop()


def test_promql_fleet_reads_the_newest_run_and_marks_dead_ranks_stale() -> None:
    prom = FakePrometheus()
    try:
        prom.add_rank(0, "old-run", 1000.0, step=90)
        prom.add_rank(0, "run-b", 2000.0, step=10)
        prom.add_rank(1, "run-b", 2000.5, step=10)
        fleet = PrometheusFleet(prom.url)
        view = fleet.poll("prometheus", ("prometheus",))
        assert view.error is None and [(r.rank, r.alive) for r in view.ranks] == [(0, True), (1, True)]
        assert '__name__!~".+_bucket|.+_created",zeromon_run="run-b"' in prom.queries[-1]
        rank1 = by_rank(view)[1]
        assert rank1.target == "127.0.0.1:9471" and rank1.host == "node-1" and rank1.job == "train"
        assert rank1.run_info is not None and rank1.run_info.zero_stage == 3 and rank1.run_info.framework == "deepspeed"
        assert rank1.memory is not None and rank1.memory.allocated == 40_000_000_000
        assert rank1.memory.categories == {"optimizer_state": 1_000_000_000}
        assert rank1.oom is not None and rank1.oom.risk is Severity.WARN and rank1.oom.headroom_bytes == 6_000_000_000
        total = rank1.collectives[0]
        assert (total.op, total.calls, total.bytes, total.seconds, total.busbw_bytes_s) == \
            ("all_gather", 100, 4_000_000_000, 2.5, 1.2e11)
        assert rank1.device is not None and rank1.device.util_gpu_pct == pytest.approx(90.0)
        assert rank1.device.pcie_tx_bytes_s == 5e9 and rank1.device.pcie_rx_bytes_s is None
        assert rank1.last_step is not None and rank1.last_step.step == 10
        assert rank1.last_step.exposed_comm_s == 0.05 and rank1.last_step.overlap_ratio == pytest.approx(0.75)

        # Rank 1's scrape fails: Prometheus keeps `up` (0) and drops its other series.
        prom.series = [(labels, 0.0 if labels["__name__"] == "up" and labels["instance"].endswith("9471") else v)
                       for labels, v in prom.series if labels.get("rank") != "1"]
        stale = by_rank(fleet.poll("prometheus", ()))[1]
        assert not stale.alive and stale.error == "Prometheus cannot scrape its endpoint (up == 0)"
        assert stale.memory is not None and stale.memory.allocated == 40_000_000_000  # its data stays

        prom.error = "query timed out"
        failed = fleet.poll("prometheus", ())
        assert failed.error is not None and "execution: query timed out" in failed.error
        assert not any(r.alive for r in failed.ranks) and len(failed.ranks) == 2

        prom.error = None
        prom.series = [(labels, 0.0) for labels, _ in prom.series if labels["__name__"] == "up"]  # the run ended
        ended = fleet.poll("prometheus", ())
        assert ended.error is None and [(r.rank, r.alive) for r in ended.ranks] == [(0, False), (1, False)]
        assert by_rank(ended)[0].error == "Prometheus cannot scrape its endpoint (up == 0)"
        # Ranks alike are one line across ranks in zeromon live (issue 45), however many there are.
        from zeromon.commands.live import status_lines

        assert status_lines(ended) == ["ranks 0-1: Prometheus cannot scrape its endpoint (up == 0)"]

        prom.add_rank(0, "run-d", 3000.0, step=1)  # a newer run takes over; run-b's ranks are not its ranks
        newer = fleet.poll("prometheus", ())
        assert newer.source == "prometheus: run run-d · per-rank series" and [(r.rank, r.alive) for r in newer.ranks] == [(0, True)]
        fleet.close()
    finally:
        prom.stop()


def test_live_source_through_prometheus(capsys: pytest.CaptureFixture[str]) -> None:
    prom = FakePrometheus()
    try:
        prom.add_rank(0, "run-c", 3000.0, step=4)
        view = LiveSource(prometheus=prom.url).poll()
        assert view.source == f"prometheus {prom.url}: run run-c · per-rank series" and view.alive == 1
        assert main(["live", "--once", "--json", "--prometheus", prom.url]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["ranks"][0]["rank"] == 0 and doc["ranks"][0]["oom"]["risk"] == "warn"
    finally:
        prom.stop()


def test_prometheus_without_zeromon_series_says_so() -> None:
    prom = FakePrometheus()
    try:
        view = LiveSource(prometheus=prom.url).poll()
        assert view.ranks == () and "has no zeromon series" in (view.error or "")
        # Targets listed but all down: how many, and why (Prometheus's last scrape error).
        for port in (9470, 9471):
            instance = f"127.0.0.1:{port}"
            prom.series.append(({"__name__": "up", "instance": instance, "job": "zeromon", "zeromon_run": "r"}, 0.0))
            prom.targets.append({"labels": {"instance": instance, "zeromon_run": "r"}, "health": "down",
                                 "lastError": "server returned HTTP status 401 Unauthorized"})
        error = LiveSource(prometheus=prom.url).poll().error or ""
        assert "2 zeromon target(s), all down: server returned HTTP status 401 Unauthorized (127.0.0.1:9470)" in error
        assert "bearer token" in error
    finally:
        prom.stop()


def test_the_prometheus_view_leaves_unknown_values_empty() -> None:
    # Prometheus has the last step's gauges and the run_info labels; the rest is unknown, not 0.
    prom = FakePrometheus()
    try:
        prom.add_rank(0, "run-d", 3000.0, step=4)
        rank = LiveSource(prometheus=prom.url).poll().ranks[0]
        step = rank.last_step
        assert step is not None and step.step == 4 and step.duration_s == pytest.approx(0.5)
        assert (step.collectives, step.comm_bytes, step.blocked_s) == (None, None, None)
        assert rank.run_info is not None and rank.run_info.pid is None and rank.run_info.torch_version is None
    finally:
        prom.stop()


# --- the `zeromon live` text view ----------------------------------------------------------------------------

def test_live_once_prints_one_line_per_rank(agents: list[SimAgent], capsys: pytest.CaptureFixture[str]) -> None:
    agents[1].stop()
    assert main(["live", "--once", agents[0].target, agents[1].target]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "1 of 2 rank(s) answering" in out[0]
    row0 = next(line for line in out if line.split()[:2] == ["0", "alive"])
    assert "100.0" in row0 and "10.0" in row0 and "75%" in row0 and "303.00 MiB" in row0 and agents[0].target in row0
    assert any(line.startswith(f"rank ? ({agents[1].target}): connection refused") for line in out)
    assert main(["live", "--once", agents[1].target]) == 1  # nobody answered


def test_ranks_that_stopped_answering_alike_are_one_line_each_death_its_own() -> None:
    """The ranks' statuses under the table, the first to end first: a death its own line (its place in the order
    is in its words), then one line per status across ranks; a rank known by its target alone keeps its own."""
    def gone(rank: int | None, error: str, t_s: float | None, target: str = "", died: str | None = None) -> RankView:
        return RankView(rank=rank, target=target or f"rank-{rank}.zmr", alive=False, stale_s=1.0, error=error,
                        t_ns=None if t_s is None else int(t_s * 1e9), died=died)

    ended = "the recording ended"
    ranks = (gone(0, ended, 2.0), gone(1, ended, 2.1), gone(2, ended, 2.2),
             gone(3, "its recording ends 4.0 s into the run", 1.0),
             gone(4, ended, 0.5, died="rank 4 died at step 7 (no end record)"), gone(5, ended, 2.3),
             RankView(rank=6, target="rank-6.zmr", alive=True, stale_s=0.0, error=None, t_ns=3 * 10**9),
             gone(None, "connection refused", None, target="10.0.0.8:9400"),
             gone(None, "connection refused", None, target="10.0.0.9:9400"))
    view = FleetView(t_ns=3 * 10**9, source="replay run", ranks=ranks, looked_at=("run",))
    assert status_lines(view) == ["rank 4 died at step 7 (no end record)",
                                  "rank 3 (rank-3.zmr): its recording ends 4.0 s into the run",
                                  "ranks 0-2, 5: the recording ended",
                                  "rank ? (10.0.0.8:9400): connection refused",
                                  "rank ? (10.0.0.9:9400): connection refused"]
    assert format_fleet(view).splitlines()[-5:] == status_lines(view)


# --- end to end: the real agents of a real 2-rank gloo training run --------------------------------------------

SCENARIO = REPO / "tests" / "scenarios" / "live_train.py"


@pytest.mark.distributed
def test_real_run_discovered_polled_listed_and_stale_after_it_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    registry, run_dir, stop, sd_file = tmp_path / "registry", tmp_path / "run", tmp_path / "STOP", tmp_path / "sd.json"
    monkeypatch.setenv("ZEROMON_REGISTRY", str(registry))  # this side: LiveSource and `zeromon targets`
    env = child_env(ZEROMON_OUT=str(run_dir), ZEROMON_REGISTRY=str(registry), ZEROMON_PORT="0",
                    ZEROMON_JOB="live-e2e")
    # Started before the run: it writes [] first and updates the file when the agents register.
    writer = subprocess.Popen([sys.executable, "-m", "zeromon", "targets", "--write", str(sd_file),
                               "--interval", "0.2"], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    train = subprocess.Popen(ranks_args(2, SCENARIO, "--stop-file", str(stop), "--max-seconds", "120",
                                        "--linger-s", "5"),
                             env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    source = LiveSource(interval_s=0.25)  # no arguments: the newest local run, through the registry
    try:
        assert json.loads(wait_for(lambda: sd_file.exists() and sd_file.read_text(), what="the first file")) == []
        source.start()
        first = wait_for(lambda: (v := source.latest()).alive == 2 and all(r.last_step for r in v.ranks) and v,
                         timeout_s=120, what="both ranks alive with a step")
        assert first.source == f"run {run_dir.resolve()}" and first.error is None
        steps_before = {r.rank: r.last_step.step for r in first.ranks if r.last_step}
        later = wait_for(lambda: (v := source.latest()).alive == 2 and all(
            r.last_step and r.last_step.step >= steps_before[r.rank] + 3 and r.phases for r in v.ranks) and v,
            timeout_s=60, what="three more steps on both ranks, and phase spans")
        for rank in later.ranks:
            assert rank.run_info is not None and rank.run_info.framework == "fsdp2" and rank.job == "live-e2e"
            assert rank.memory is not None and (rank.memory.rss or 0) > 10 * 2**20
            assert rank.oom is not None and rank.oom.risk is Severity.OK
            meanings = {c.meaning for c in rank.collectives}
            assert {"param_all_gather", "grad_reduce_scatter"} <= meanings
            assert {p.phase for p in rank.phases} >= {"forward", "backward", "optimizer"}
            assert rank.stats is not None and rank.stats.events_dropped == 0

        # `zeromon targets RUN_DIR` and without arguments: the two ranks' endpoints as file_sd JSON.
        urls = [r.target for r in later.ranks]  # by rank
        agent_ids = [read_entry(run_entry_path(run_dir, r)).agent_id for r in (0, 1)]
        assert main(["targets", str(run_dir)]) == 0
        groups = json.loads(capsys.readouterr().out)
        assert groups == [{"targets": [url], "labels": {"zeromon_run": "run", "__param_agent": agent_id}}
                          for url, agent_id in zip(urls, agent_ids, strict=True)]
        assert main(["targets"]) == 0
        assert json.loads(capsys.readouterr().out) == groups
        wait_for(lambda: json.loads(sd_file.read_text()) == groups, what="--write to list both ranks")
        assert main(["live", "--once"]) == 0
        assert "2 of 2 rank(s) answering" in capsys.readouterr().out

        stop.touch()
        # The agents stop and write their recordings' ends; the processes go on (--linger-s): the ranks have ended,
        # cleanly, which the source says before the processes exit, not "not answering" as if they could hang.
        gone = wait_for(lambda: (v := source.latest()).alive == 0 and all(r.ended for r in v.ranks) and v,
                        timeout_s=60, what="both ranks ended while their processes linger")
        assert train.poll() is None, "the ranks exited before the source said they ended"
        assert [r.died for r in gone.ranks] == [None, None]
        assert train.wait(timeout=120) == 0
        ended = wait_for(lambda: (v := source.latest()).alive == 0 and v, timeout_s=10, what="both ranks stale")
        assert [r.rank for r in ended.ranks] == [0, 1]  # stale, not dropped
        for rank in ended.ranks:
            assert rank.error is not None and "connection refused" in rank.error
            assert rank.last_step is not None and rank.last_step.step >= steps_before[rank.rank] + 3
        time.sleep(0.6)
        assert all((r.stale_s or 0) > 0.5 for r in source.latest().ranks)
        time.sleep(0.5)  # the writer looks again: an ended run's targets stay listed (up == 0 in Prometheus)
        assert json.loads(sd_file.read_text()) == groups
    finally:
        source.stop()
        stop.touch()
        if train.poll() is None:
            train.kill()
        out = train.communicate(timeout=30)[0]
        writer.send_signal(signal.SIGINT)
        writer.communicate(timeout=10)
    assert writer.returncode == 0, out


def test_the_run_followed_gives_way_to_a_newer_one_or_to_an_older_one_still_going() -> None:
    def run(name: str, start_ns: int, alive: bool) -> LocalRun:
        return LocalRun(run_dir=f"/runs/{name}", start_ns=start_ns, alive=alive, entries=())

    def follow(runs: list[LocalRun], followed: str | None, start_ns: int = -1) -> str | None:
        runs = sorted(runs, key=lambda r: (r.alive, r.start_ns), reverse=True)  # as local_runs orders them
        chosen = run_to_follow(runs, None if followed is None else f"/runs/{followed}", start_ns)
        return None if chosen is None else chosen.run_dir.removeprefix("/runs/")

    long, short = run("long", 100, alive=True), run("short", 200, alive=True)
    assert follow([], None) is None
    assert follow([long], None) == "long"
    assert follow([long, short], "long", 100) == "short"  # a newer run takes over
    assert follow([long, short], "short", 200) is None
    # The short run ended: its leftovers (a crash) or no entries at all (a clean exit) -> back to the long one.
    assert follow([long, run("short", 200, alive=False)], "short", 200) == "long"
    assert follow([long], "short", 200) == "long"
    # An ended run keeps its place against an older run that ended too.
    assert follow([run("long", 100, alive=False), run("short", 200, alive=False)], "short", 200) is None
    assert follow([run("long", 100, alive=False)], "short", 200) is None
