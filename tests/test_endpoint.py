"""The agent's HTTP endpoint, scraped while a real 2-rank gloo FSDP2 run trains.

One run (tests/scenarios/live_train.py, 2 ranks) serves most tests: /metrics values and labels,
the snapshot and its ``?since=`` cursor, OpenMetrics, promtool, hostile clients. The token, the
port fallback and the read deadline are checked on an endpoint started in this process, in front of
a real Recorder.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from zeromon.cli import main
from zeromon.errors import ZeromonError
from zeromon.model import registry
from zeromon.model.codec import read_recording
from zeromon.sources.live import LiveSource
from zeromon_agent.context.config import AgentConfig, load_config
from zeromon_agent.hooks.state import HotState
from zeromon_agent.recorder.loop import Recorder
from zeromon_agent.serve.endpoint import AgentEndpoint
from zeromon_agent.serve.httpserver import HttpServer, Response, bind

from conftest import REPO, child_env, free_port, ranks_args

SCENARIO = REPO / "tests" / "scenarios" / "live_train.py"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
BASE_LABELS = ("rank", "local_rank", "host", "job")


# --- helpers ---------------------------------------------------------------------------------------------

def fetch(url: str, path: str, method: str = "GET", headers: dict[str, str] | None = None,
          timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request, 4xx/5xx included."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def samples(body: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of a text exposition."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(parsed: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    matches = [v for lab, v in parsed.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(matches) == 1, f"{name}{labels}: {len(matches)} samples in {sorted(parsed)}"
    return matches[0]


def snapshot(url: str, query: str = "") -> dict[str, Any]:
    status, _, body = fetch(url, "/api/v1/snapshot" + query)
    assert status == 200, body
    document: dict[str, Any] = json.loads(body)
    return document


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (OSError, ValueError, KeyError, AssertionError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def steps_total(url: str) -> float:
    return value(samples(fetch(url, "/metrics")[2]), "zeromon_steps_total")


# --- the live 2-rank run --------------------------------------------------------------------------------

@dataclass
class LiveRun:
    proc: subprocess.Popen[str]
    out: Path
    user_registry: Path
    stop_file: Path
    base_port: int

    def entries(self) -> list[registry.EndpointEntry]:
        return registry.read_entries(self.out / registry.ENDPOINTS_DIR)

    def url(self, rank: int) -> str:
        return next(e.url for e in self.entries() if e.rank == rank)

    def stop(self) -> int:
        self.stop_file.touch()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    tmp = tmp_path_factory.mktemp("live")
    base = free_port(2)  # the two ranks' ports under the port rule
    env = child_env(ZEROMON_OUT=str(tmp / "run"), ZEROMON_REGISTRY=str(tmp / "registry"), ZEROMON_PORT=str(base),
                    ZEROMON_JOB="livetest", ZEROMON_RECENT_EVENTS="1024")
    proc = subprocess.Popen(ranks_args(2, SCENARIO, "--stop-file", str(tmp / "STOP"), "--max-seconds", "240"),
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = LiveRun(proc, tmp / "run", tmp / "registry", tmp / "STOP", base)
    try:
        wait_for(lambda: len(run.entries()) == 2 and all(steps_total(run.url(r)) >= 5 for r in (0, 1)), 120,
                 "both ranks' endpoints to report 5 steps")
        yield run
    finally:
        if run.stop() != 0 and proc.stdout is not None:
            print(proc.stdout.read())


# --- /metrics ----------------------------------------------------------------------------------------------

def test_each_rank_serves_its_metrics_on_base_port_plus_local_rank(live: LiveRun) -> None:
    entries = live.entries()
    assert sorted((e.rank, e.port) for e in entries) == [(0, live.base_port), (1, live.base_port + 1)]
    for entry in entries:
        assert entry.address == "127.0.0.1" and entry.url == f"http://127.0.0.1:{entry.port}"
        assert entry.job == "livetest" and entry.world_size == 2 and not entry.token_required
        assert entry.run_dir == str(live.out.resolve()) and entry.run_id == live.out.name
        status, headers, body = fetch(entry.url, "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        parsed = samples(body)
        want = {"rank": str(entry.rank), "local_rank": str(entry.local_rank), "host": entry.host, "job": "livetest"}
        for name, series in parsed.items():
            for labels, _ in series:
                assert {k: labels.get(k) for k in BASE_LABELS} == want, (name, labels)
        info = parsed["zeromon_run_info"][0][0]
        assert info["framework"] == "fsdp2" and info["world_size"] == "2" and info["backend"] == "gloo"
        assert info["strategy"] == "FULL_SHARD"
        assert value(parsed, "zeromon_memory_rss_bytes") > 10 * 2**20
        assert value(parsed, "zeromon_memory_capacity_bytes") > value(parsed, "zeromon_memory_rss_bytes")
        assert value(parsed, "zeromon_memory_category_bytes", category="optimizer_state") > 0
        assert value(parsed, "zeromon_oom_risk") == 0
        for op, meaning in (("all_gather", "param_all_gather"), ("reduce_scatter", "grad_reduce_scatter")):
            calls = value(parsed, "zeromon_collective_calls_total", op=op, meaning=meaning)
            assert calls >= 5 * 3  # three FSDP units per step, at least
            assert value(parsed, "zeromon_collective_bytes_total", op=op, meaning=meaning) > 0
            # Every gloo call completes synchronously: each one is in the duration histogram.
            assert value(parsed, "zeromon_collective_duration_seconds_count", op=op, meaning=meaning) == calls
            assert value(parsed, "zeromon_collective_busbw_bytes_per_second", op=op) > 0
        steps = value(parsed, "zeromon_steps_total")
        assert steps >= 5 and value(parsed, "zeromon_step_duration_seconds_count") == steps
        assert value(parsed, "zeromon_step") >= steps - 1
        assert 0 <= value(parsed, "zeromon_step_overlap_ratio") <= 1
        assert 0 < value(parsed, "zeromon_step_exposed_comm_ratio") <= 1
        assert value(parsed, "zeromon_agent_events_dropped_total") == 0
        assert value(parsed, "zeromon_agent_hook_errors_total") == 0
        assert value(parsed, "zeromon_agent_cpu_seconds_total") > 0
        assert not any(name.startswith("zeromon_device_") for name in parsed)  # no GPU, no NVML series


def test_counters_grow_with_steps(live: LiveRun) -> None:
    url = live.url(0)
    first = samples(fetch(url, "/metrics")[2])
    wait_for(lambda: steps_total(url) >= value(first, "zeromon_steps_total") + 20, 60, "twenty more steps")
    second = samples(fetch(url, "/metrics")[2])
    for name in ("zeromon_collective_bytes_total", "zeromon_collective_calls_total"):
        for meaning, op in (("param_all_gather", "all_gather"), ("grad_reduce_scatter", "reduce_scatter")):
            assert value(second, name, op=op, meaning=meaning) > value(first, name, op=op, meaning=meaning)
    assert value(second, "zeromon_agent_events_recorded_total") > value(first, "zeromon_agent_events_recorded_total")
    # FSDP2 gathers the same bytes every step: the growth per step is what one step summary says.
    steps = value(second, "zeromon_steps_total") - value(first, "zeromon_steps_total")
    grown = (value(second, "zeromon_collective_bytes_total", op="all_gather", meaning="param_all_gather")
             - value(first, "zeromon_collective_bytes_total", op="all_gather", meaning="param_all_gather"))
    per_step = snapshot(url, "?steps=1")["steps"][0]["comm_bytes_by_op"]["all_gather"]
    assert grown / steps == pytest.approx(per_step, rel=0.15)


def test_openmetrics_when_the_scraper_asks_for_it(live: LiveRun) -> None:
    url = live.url(1)
    status, headers, body = fetch(url, "/metrics", headers={"Accept": OPENMETRICS})
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    assert b"# TYPE zeromon_run info\n" in body and b"zeromon_steps_total{" in body
    status, headers, body = fetch(url, "/metrics", headers={"Accept": "text/plain"})
    assert headers["content-type"].startswith("text/plain; version=0.0.4") and not body.endswith(b"# EOF\n")


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian package `prometheus`; .ci/run installs it)")
def test_promtool_accepts_the_exposition(live: LiveRun) -> None:
    for rank in (0, 1):
        body = fetch(live.url(rank), "/metrics")[2]
        check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60)
        assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), \
            (check.stdout + check.stderr).decode()


# --- the snapshot ---------------------------------------------------------------------------------------

def test_snapshot_document(live: LiveRun) -> None:
    url = live.url(1)
    # The metrics counted 5 steps; the snapshot's view may be one taken just before (kept VIEW_TTL_S).
    wait_for(lambda: len(snapshot(url)["steps"]) >= 5, 30, "the snapshot to hold 5 steps")
    doc = snapshot(url)
    assert doc["schema"] == "zeromon.snapshot/1"
    assert (doc["rank"], doc["local_rank"], doc["world_size"], doc["job"]) == (1, 1, 2, "livetest")
    assert doc["pid"] == next(e.pid for e in live.entries() if e.rank == 1)
    assert doc["cursor"] > 0 and doc["t_ns"] > doc["start_ns"] > 0
    assert "events" not in doc
    assert doc["run_info"]["framework"] == "fsdp2" and doc["run_info"]["fsdp_strategy"] == "FULL_SHARD"
    steps = doc["steps"]
    assert 5 <= len(steps) <= 64
    assert [s["step"] for s in steps] == sorted(s["step"] for s in steps)
    last = steps[-1]
    assert last["rank"] == 1 and last["end_ns"] > last["start_ns"] and last["comm_bytes"] > 0
    assert last["comp_s"] > 0 and last["exposed_comm_s"] is not None and last["overlap_s"] is not None
    assert doc["memory"]["rss"] > 0 and doc["memory"]["device"] == "cpu" and doc["device"] is None
    # The newest sample carries the last category walk's bytes, as zeromon_memory_category_bytes does.
    assert doc["memory"]["categories"].get("sharded_params", 0) > 0, doc["memory"]
    assert doc["stats"]["events_dropped"] == 0 and doc["stats"]["events_recorded"] > 0
    rows = {(r["op"], r["meaning"]): r for r in doc["collectives"]}
    gather = rows[("all_gather", "param_all_gather")]
    assert gather["calls"] > 0 and gather["bytes"] > 0 and gather["seconds"] > 0 and gather["busbw_bytes_s"] > 0
    assert doc["oom"]["risk"] == "ok" and doc["oom"]["capacity_bytes"] > doc["oom"]["current_bytes"] > 0
    # On gloo every collective blocks the training thread: exposed communication is a finding.
    assert any(f["kind"] == "poor_overlap" and f["rank"] == 1 for f in doc["findings"])
    assert any(n["source"] == "device" for n in doc["notices"])  # "no CUDA device"
    newest = [s["step"] for s in snapshot(url, "?steps=3")["steps"]]
    assert len(newest) == 3 and newest == list(range(newest[0], newest[0] + 3)) and newest[0] >= last["step"] - 2
    assert snapshot(url, "?steps=0")["steps"] == []


def test_snapshot_events_since_a_cursor(live: LiveRun) -> None:
    url = live.url(0)
    wait_for(lambda: snapshot(url)["cursor"] > 1100, 90, "more events than the 1024 the agent keeps")
    # since=0 is older than the oldest kept event: the client learns it missed some.
    doc = snapshot(url, "?since=0&limit=5")
    assert doc["events_lost"] is True
    cursors = [e["cursor"] for e in doc["events"]]
    assert len(cursors) == 5 and cursors == list(range(cursors[0], cursors[0] + 5)) and cursors[0] > 1
    # Paging from a recent cursor: exactly the events after it, oldest first, at most `limit`.
    c = doc["cursor"]
    page = snapshot(url, f"?since={c - 40}&limit=10")
    assert "events_lost" not in page
    assert [e["cursor"] for e in page["events"]] == list(range(c - 39, c - 29))
    # The kept events (a recorder's pass publishes its memory samples, collectives, phases and summaries in turn).
    kinds = {e["kind"] for e in snapshot(url, f"?since={c - 1000}")["events"]}
    assert {"collective", "phase", "memory", "step"} <= kinds
    collective = next(e for e in snapshot(url, f"?since={c - 1000}")["events"] if e["kind"] == "collective")
    assert collective["rank"] == 0 and collective["op"] and collective["issue_ns"] > 0
    newer = snapshot(url, f"?since={c}")
    assert all(e["cursor"] > c for e in newer["events"]) and newer["cursor"] >= c
    # Of the kinds asked for only (what `zeromon attach` reads: the phases), looked through to the newest record.
    phases = snapshot(url, f"?since={c - 1000}&kinds=phase")
    assert phases["events"] and {e["kind"] for e in phases["events"]} == {"phase"}
    assert phases["events_through"] == phases["cursor"]
    everything = snapshot(url, f"?since={c - 1000}&limit=20000")["events"]  # the run goes on: its oldest may be gone
    both = range(everything[0]["cursor"], phases["cursor"] + 1)
    assert [e for e in phases["events"] if e["cursor"] in both] == \
        [e for e in everything if e["kind"] == "phase" and e["cursor"] in both]


@pytest.mark.parametrize(("query", "message"), [
    ("?since=abc", "?since='abc' is not an integer"),
    ("?limit=0", "?limit=0 is out of range"),
    ("?steps=-1", "?steps=-1 is out of range"),
])
def test_snapshot_refuses_bad_parameters(live: LiveRun, query: str, message: str) -> None:
    status, _, body = fetch(live.url(0), "/api/v1/snapshot" + query)
    assert status == 400 and message in json.loads(body)["error"]


def test_healthz_head_and_unknown_routes(live: LiveRun) -> None:
    entry = next(e for e in live.entries() if e.rank == 1)
    url = entry.url
    status, headers, body = fetch(url, "/healthz")
    assert status == 200 and json.loads(body) == {"status": "ok", "rank": 1, "agent": entry.agent_id}
    assert headers["server"] == "zeromon-agent"  # no trailing space, no Python version
    status, headers, body = fetch(url, "/healthz", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    status, _, body = fetch(url, "/nope")
    assert status == 404 and "/metrics" in json.loads(body)["routes"]
    # Errors are JSON on every path, http.server's own ones included.
    status, headers, body = fetch(url, "/metrics", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD" and "POST" in json.loads(body)["error"], body
    status, headers, body = fetch(url, "/metrics", method="FROB")  # a method http.server does not know: 405 too
    assert status == 405 and headers["content-type"] == "application/json" and "FROB" in json.loads(body)["error"]


def test_a_client_that_names_another_agent_gets_404(live: LiveRun) -> None:
    # Ports are reused from job to job: a scraper of a run that ended names the agent it means.
    entries = {e.rank: e for e in live.entries()}
    assert entries[0].agent_id and entries[0].agent_id != entries[1].agent_id
    assert entries[0].launch_id and entries[0].launch_id == entries[1].launch_id  # one launcher
    url, own = entries[0].url, entries[0].agent_id
    for path in ("/metrics", "/api/v1/snapshot", "/healthz"):
        assert fetch(url, f"{path}?agent={own}")[0] == 200, path
        status, _, body = fetch(url, f"{path}?agent={entries[1].agent_id}")
        assert status == 404 and json.loads(body)["agent_mismatch"] is True, (path, body)
    assert snapshot(url, f"?steps=2&agent={own}")["rank"] == 0  # the parameter does not upset the others


# --- hostile clients --------------------------------------------------------------------------------------

def _trickle(sock: socket.socket, stop: threading.Event, closed_at: list[float], every_s: float = 0.05) -> None:
    """Slowloris: a request head one byte at a time, never finished; notes when the server hangs up."""
    try:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        while not stop.is_set():
            sock.sendall(b"X")
            time.sleep(every_s)
    except OSError:
        closed_at.append(time.monotonic())


def _flood(address: tuple[str, int], stop: threading.Event, opened: list[socket.socket]) -> None:
    """New idle connections, 50 a second, never sending anything."""
    while not stop.is_set():
        try:
            opened.append(socket.create_connection(address, timeout=2))
        except OSError:
            pass
        time.sleep(0.02)


def test_hostile_clients_stall_neither_scrapes_nor_training(live: LiveRun) -> None:
    url = live.url(0)
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 0)
    steps_before = steps_total(url)
    stop = threading.Event()
    idle = [socket.create_connection(address, timeout=2) for _ in range(100)]  # past the 64 open heads
    slow = socket.create_connection(address, timeout=10)
    slow_opened = time.monotonic()
    slow_closed: list[float] = []
    flooded: list[socket.socket] = []
    threads = [threading.Thread(target=_trickle, args=(slow, stop, slow_closed), daemon=True),
               threading.Thread(target=_flood, args=(address, stop, flooded), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        # A huge header is refused at the cap, at once.
        huge = socket.create_connection(address, timeout=10)
        try:
            huge.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 1_000_000)
        except OSError:
            pass  # the server hung up mid-send: refused
        try:
            assert huge.recv(100).startswith(b"HTTP/1.0 431")
        except ConnectionResetError:
            pass
        huge.close()
        # Normal scrapes still answer while all of that hangs, one by one and eight at once.
        for _ in range(3):
            status, _, body = fetch(url, "/metrics", timeout=5)
            assert status == 200 and b"zeromon_steps_total" in body
        answers: list[int] = []
        scrapers = [threading.Thread(target=lambda: answers.append(fetch(url, "/healthz", timeout=5)[0]))
                    for _ in range(8)]
        for thread in scrapers:
            thread.start()
        for thread in scrapers:
            thread.join(10)
        assert len(answers) == 8 and set(answers) <= {200, 503} and 200 in answers
        # Training in the same process goes on: steps keep completing while the attack lasts.
        wait_for(lambda: steps_total(url) >= steps_before + 10, 30, "ten steps during the attack")
        # The slowloris is cut off at the read deadline (5 s from its connect), though it keeps sending.
        wait_for(lambda: bool(slow_closed), 15, "the server to hang up on the slowloris")
        assert slow_closed[0] - slow_opened < 5 + 3
        # The oldest idle connections were closed when more than 64 waited: not held, not served.
        dropped = idle[0].recv(4096)
        assert dropped == b"" or (dropped.startswith(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: "
                                                     b"application/json\r\n") and b'{"error":' in dropped), dropped
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        for sock in idle + flooded + [slow]:
            sock.close()
    assert fetch(url, "/healthz", timeout=5)[0] == 200


def test_clean_exit_removes_the_user_level_entries(live: LiveRun) -> None:
    assert len(registry.read_entries(live.user_registry)) == 2
    assert all(registry.pid_alive(e) for e in registry.read_entries(live.user_registry))
    assert live.stop() == 0
    assert registry.read_entries(live.user_registry) == []
    assert len(live.entries()) == 2  # the run folder keeps them: where the run's endpoints were
    assert not any(registry.pid_alive(e) for e in live.entries())


# --- an endpoint in this process --------------------------------------------------------------------------

@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder(HotState(), rank=0, writer=None, flush_interval_s=0.05)
    rec.start()
    yield rec
    rec.stop()


def _start(recorder: Recorder, tmp_path: Path, **kwargs: Any) -> AgentEndpoint:
    settings: dict[str, Any] = {"rank": 0, "local_rank": 0, "world_size": 1, "job": "unit", "run_dir": tmp_path / "run",
                                "address": "127.0.0.1", "base_port": 0, "token": None,
                                "registry_folder": tmp_path / "registry", "notice": recorder.notice}
    settings.update(kwargs)
    return AgentEndpoint.start(recorder, **settings)


def test_token_is_required_on_every_route(recorder: Recorder, tmp_path: Path) -> None:
    endpoint = _start(recorder, tmp_path, token="s3cret")
    try:
        assert endpoint.entry.token_required
        assert registry.read_entries(tmp_path / "run" / "endpoints")[0].token_required
        for path in ("/metrics", "/api/v1/snapshot", "/healthz", "/nope"):
            status, headers, _ = fetch(endpoint.url, path)
            assert status == 401 and headers["www-authenticate"].startswith("Bearer"), path
            assert fetch(endpoint.url, path, headers={"Authorization": "Bearer wrong"})[0] == 401
            status, _, _ = fetch(endpoint.url, path, headers={"Authorization": "Bearer s3cret"})
            assert status == (404 if path == "/nope" else 200), path
        # The scheme is case-insensitive (RFC 7235); the token is not, and another scheme is refused.
        for header, expected in (("bearer s3cret", 200), ("BEARER  s3cret ", 200), ("Bearer S3CRET", 401),
                                 ("Basic s3cret", 401), ("Bearer", 401), ("s3cret", 401)):
            assert fetch(endpoint.url, "/healthz", headers={"Authorization": header})[0] == expected, header
    finally:
        endpoint.stop()
    assert list((tmp_path / "registry").glob("*.json")) == []


def test_port_falls_to_the_next_free_one_and_says_so(recorder: Recorder, tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    base = taken.getsockname()[1]
    endpoint = None
    try:
        endpoint = _start(recorder, tmp_path, base_port=base)
        port = endpoint.entry.port
        assert base < port <= base + 64
        assert fetch(endpoint.url, "/healthz")[0] == 200
        notices = [n.message for n in recorder.live.notices if n.source == "endpoint"]
        assert any(f"port {base}" in m and "is taken" in m and f"listens on {port}" in m for m in notices), notices
    finally:
        if endpoint is not None:
            endpoint.stop()
        taken.close()


def _hold(ports: range) -> list[socket.socket] | None:
    """Listening sockets on every port of the range, or None (and none held) if one is taken."""
    held: list[socket.socket] = []
    for port in ports:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
        except OSError:
            sock.close()
            for other in held:
                other.close()
            return None
        held.append(sock)
    return held


def test_no_free_port_is_an_error_for_the_caller() -> None:
    base = free_port(3)  # three consecutive ports, all held here
    held = _hold(range(base, base + 3))
    assert held is not None, f"ports {base}-{base + 2} were free a moment ago"
    try:
        with pytest.raises(OSError) as info:
            bind("127.0.0.1", base, 0, tries=2)
        assert info.value.errno == 98  # EADDRINUSE, from the last port tried
    finally:
        for sock in held:
            sock.close()


def test_a_base_port_that_leaves_a_rank_no_port_says_so() -> None:
    with pytest.raises(OSError, match=r"base port 65535 \+ local rank 1 = 65536, above 65535"):
        bind("127.0.0.1", 65535, 1)


def test_live_clients_do_not_take_another_runs_agent_for_the_rank(recorder: Recorder, tmp_path: Path) -> None:
    # Job B's agent listens where run A's rank 0 did (every job starts at the same base port); A's
    # entry is still in A's folder.
    endpoint = _start(recorder, tmp_path, run_dir=tmp_path / "job-b")
    try:
        ended = dataclasses.replace(endpoint.entry, run_dir=str(tmp_path / "run-a"), run_id="run-a",
                                    agent_id="0123456789abcdef")
        registry.write_entry(registry.run_entry_path(tmp_path / "run-a", 0), ended)
        view = LiveSource(run_dir=tmp_path / "run-a").poll()
        assert [(r.rank, r.alive) for r in view.ranks] == [(0, False)], view.ranks
        assert "another agent" in (view.ranks[0].error or ""), view.ranks[0].error
        assert view.ranks[0].run_info is None and not view.ranks[0].steps  # nothing of job B's is shown as A's
        assert main(["live", "--once", str(tmp_path / "run-a")]) == 1
        assert LiveSource(run_dir=tmp_path / "job-b").poll().alive == 1  # B's own entry reaches B
    finally:
        endpoint.stop()


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: only picks the outgoing interface
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_binds_loopback_only_by_default(recorder: Recorder, tmp_path: Path) -> None:
    assert AgentConfig().bind == "127.0.0.1" and load_config({}).bind == "127.0.0.1"
    endpoint = _start(recorder, tmp_path, address=AgentConfig().bind)
    try:
        assert endpoint.server.sock.getsockname()[0] == "127.0.0.1"
        other = _non_loopback_address()
        if other is not None:  # reachable on loopback only
            with pytest.raises(OSError):
                socket.create_connection((other, endpoint.entry.port), timeout=2).close()
    finally:
        endpoint.stop()


def test_read_deadline_cuts_a_client_that_keeps_sending() -> None:
    sock, port = bind("127.0.0.1", 0, 0)
    server = HttpServer(sock, lambda request: Response(200, b"ok"), read_timeout_s=0.5, max_head_bytes=1024)
    server.start()
    stop = threading.Event()
    try:
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        opened = time.monotonic()
        # One byte every 20 ms: a per-read timeout would never fire; the deadline per request does.
        sender = threading.Thread(target=_trickle, args=(client, stop, [], 0.02), daemon=True)
        sender.start()
        reply = client.recv(200)
        elapsed = time.monotonic() - opened
        assert reply.startswith(b"HTTP/1.0 408") and 0.4 < elapsed < 4.0, (reply, elapsed)  # never, without the deadline
        assert server.refused == 1
        assert fetch(f"http://127.0.0.1:{port}", "/")[2] == b"ok"
    finally:
        stop.set()
        server.stop()


def test_endpoint_that_cannot_bind_is_a_notice_and_training_goes_on(tmp_path: Path) -> None:
    # 203.0.113.0/24 is TEST-NET-3: no interface here has it, so the bind fails.
    env = child_env(ZEROMON_OUT=str(tmp_path / "run"), ZEROMON_REGISTRY=str(tmp_path / "registry"),
                    ZEROMON_BIND="203.0.113.7")
    done = subprocess.run(ranks_args(1, SCENARIO, "--steps", "3", "--sleep", "0"), env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    rec = read_recording(tmp_path / "run" / "rank-0.jsonl")
    assert len(rec.steps) == 3
    notices = [n.message for n in rec.notices if n.source == "endpoint"]
    assert notices and "did not start" in notices[0] and "203.0.113.7" in notices[0]
    assert not (tmp_path / "registry").exists()


# --- settings and the registry ---------------------------------------------------------------------------

def test_endpoint_settings() -> None:
    cfg = load_config({"ZEROMON_ENDPOINT": "0", "ZEROMON_PORT": "0", "ZEROMON_BIND": "0.0.0.0",
                       "ZEROMON_TOKEN": "t0ken", "ZEROMON_REGISTRY": "/tmp/x"})
    assert (cfg.endpoint, cfg.port, cfg.bind, cfg.token, cfg.registry) == (False, 0, "0.0.0.0", "t0ken", "/tmp/x")
    assert "t0ken" not in repr(cfg)
    assert AgentConfig().port == 9470 and AgentConfig().endpoint is True
    for var, raw in (("ZEROMON_PORT", "70000"), ("ZEROMON_PORT", "http"), ("ZEROMON_BIND", "a b")):
        with pytest.raises(ZeromonError, match=f"^{var}={raw!r}: "):
            load_config({var: raw})


def test_registry_round_trip_and_unreadable_files(tmp_path: Path) -> None:
    entry = registry.EndpointEntry(
        run_dir="/runs/r1", run_id="r1", job="j", host=socket.gethostname(), address="0.0.0.0", port=9471,
        url=registry.url_for("0.0.0.0", 9471), rank=1, local_rank=1, world_size=2, pid=2**22 + 12345,
        start_ns=1, token_required=True)
    assert entry.url == "http://127.0.0.1:9471" and entry.target == f"{socket.gethostname()}:9471"
    registry.write_entry(tmp_path / "rank-1.json", entry)
    (tmp_path / "broken.json").write_text('{"schema": "zeromon.endpoint/1", "port": "x"}')
    (tmp_path / "notes.txt").write_text("not an entry")
    problems: list[str] = []
    assert registry.read_entries(tmp_path, problems) == [entry]
    assert len(problems) == 1 and "broken.json" in problems[0] and "missing key 'run_dir'" in problems[0]
    assert registry.EndpointEntry.from_dict(json.loads((tmp_path / "rank-1.json").read_text())) == entry
    assert registry.pid_alive(entry) is False  # no such pid
    assert registry.read_entries(tmp_path / "absent") == []
    assert list(tmp_path.glob(".*.tmp")) == []  # the atomic write leaves nothing behind
