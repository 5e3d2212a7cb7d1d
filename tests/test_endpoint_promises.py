"""Every status and body docs/endpoint.md (the live endpoint) promises, one by one, from a real agent
endpoint started in this process in front of a real Recorder, spoken to over real sockets."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeromon_agent.hooks.state import HotState
from zeromon_agent.recorder.loop import Recorder
from zeromon_agent.serve.endpoint import AgentEndpoint
from zeromon_agent.serve.httpserver import HttpServer, Response, bind


def exchange(port: int, raw: bytes, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) for raw request bytes: what a client of any kind gets back."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


def request(port: int, method: str, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode())


def json_error(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert headers["content-type"] == "application/json", headers
    document: dict[str, Any] = json.loads(body)
    assert isinstance(document.get("error"), str) and document["error"], document
    return document


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[AgentEndpoint]:
    recorder = Recorder(HotState(), rank=0, writer=None, flush_interval_s=0.05)
    recorder.start()
    started = AgentEndpoint.start(recorder, rank=0, local_rank=0, world_size=1, job="promises",
                                  run_dir=tmp_path / "run", address="127.0.0.1", base_port=0, token=None,
                                  registry_folder=tmp_path / "registry", notice=recorder.notice)
    yield started
    started.stop()
    recorder.stop()


def test_metrics_is_prometheus_text_and_openmetrics_when_asked(endpoint: AgentEndpoint) -> None:
    port = endpoint.entry.port
    status, headers, body = request(port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    assert b"zeromon_agent_start_time_seconds" in body
    status, headers, body = request(port, "GET", "/metrics", Accept="application/openmetrics-text")
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_snapshot_is_json_and_a_bad_parameter_is_a_400_naming_it(endpoint: AgentEndpoint) -> None:
    port = endpoint.entry.port
    status, headers, body = request(port, "GET", "/api/v1/snapshot?steps=4")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body)["schema"] == "zeromon.snapshot/1"
    for query, name in (("steps=many", "steps"), ("since=-1", "since"), ("since=0&limit=0", "limit"),
                        ("steps=nan", "steps"), ("limit=1e400&since=0", "limit"), ("since=0&kinds=phase,nope", "kinds"),
                        ("since=0&kinds=,", "kinds")):
        status, headers, body = request(port, "GET", f"/api/v1/snapshot?{query}")
        assert status == 400 and name in json_error(headers, body)["error"], (query, body)


def test_healthz_answers_get_and_head(endpoint: AgentEndpoint) -> None:
    port = endpoint.entry.port
    status, headers, body = request(port, "GET", "/healthz")
    assert status == 200 and json.loads(body) == {"status": "ok", "rank": 0, "agent": endpoint.entry.agent_id}
    status, headers, body = request(port, "HEAD", "/healthz")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


def test_anything_else_is_a_json_404(endpoint: AgentEndpoint) -> None:
    status, headers, body = request(endpoint.entry.port, "GET", "/nope")
    assert status == 404 and "/nope" in json_error(headers, body)["error"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "BREW",
                                    "PROPFIND"])
def test_every_method_but_get_and_head_is_a_json_405(endpoint: AgentEndpoint, method: str) -> None:
    for path in ("/metrics", "/api/v1/snapshot", "/healthz", "/nope"):
        status, headers, body = request(endpoint.entry.port, method, path, Content_Length="0")
        assert status == 405, (method, path, status)
        assert headers["allow"] == "GET, HEAD" and method in json_error(headers, body)["error"]


def test_another_agents_id_is_a_json_404_that_says_so(endpoint: AgentEndpoint) -> None:
    for path in ("/metrics", "/api/v1/snapshot", "/healthz"):
        status, headers, body = request(endpoint.entry.port, "GET", f"{path}?agent=someone-else")
        assert status == 404 and json_error(headers, body)["agent_mismatch"] is True
        assert request(endpoint.entry.port, "GET", f"{path}?agent={endpoint.entry.agent_id}")[0] == 200


def test_a_token_makes_every_route_a_json_401_without_it(tmp_path: Path) -> None:
    recorder = Recorder(HotState(), rank=0, writer=None, flush_interval_s=0.05)
    recorder.start()
    endpoint = AgentEndpoint.start(recorder, rank=0, local_rank=0, world_size=1, job="t", run_dir=tmp_path / "run",
                                   address="127.0.0.1", base_port=0, token="s3cret",
                                   registry_folder=tmp_path / "registry", notice=recorder.notice)
    try:
        for path in ("/metrics", "/api/v1/snapshot", "/healthz", "/nope"):
            status, headers, body = request(endpoint.entry.port, "GET", path)
            assert status == 401 and headers["www-authenticate"].startswith("Bearer")
            json_error(headers, body)
            assert request(endpoint.entry.port, "GET", path, Authorization="bEaReR s3cret")[0] in (200, 404)
    finally:
        endpoint.stop()
        recorder.stop()


def test_malformed_requests_get_a_status_line_and_a_json_error(endpoint: AgentEndpoint) -> None:
    port = endpoint.entry.port
    for raw, expected in ((b"garbage\r\n\r\n", 400), (b"GET / HTTP/2.0\r\n\r\n", 505),
                          (b"GET /healthz HTTP/x\r\n\r\n", 400)):
        status, headers, body = exchange(port, raw)
        assert status == expected, raw
        json_error(headers, body)
    status, headers, body = exchange(port, b"GET /healthz\r\n\r\n")  # HTTP/0.9: still a status line and headers
    assert status == 200 and json.loads(body)["status"] == "ok"


def test_a_head_over_8_kib_is_a_json_431(endpoint: AgentEndpoint) -> None:
    status, headers, body = exchange(endpoint.entry.port, b"GET /healthz HTTP/1.0\r\nX: " + b"a" * 9000 + b"\r\n\r\n")
    assert status == 431 and "8192" in json_error(headers, body)["error"]


def test_a_request_head_not_sent_in_time_is_a_json_408() -> None:
    sock, port = bind("127.0.0.1", 0, 0)
    server = HttpServer(sock, lambda request: Response(200, b"{}"), read_timeout_s=0.3)
    server.start()
    try:
        opened = time.monotonic()
        status, headers, body = exchange(port, b"GET /healthz HTTP/1.0\r\n")  # the head never ends
        assert status == 408 and time.monotonic() - opened < 5
        assert "0.3 s" in json_error(headers, body)["error"]
    finally:
        server.stop()


def test_a_full_queue_is_a_json_503() -> None:
    sock, port = bind("127.0.0.1", 0, 0)

    def slow(request: Any) -> Response:
        time.sleep(0.5)
        return Response(200, b"{}")

    server = HttpServer(sock, slow, workers=1, queue_size=1)
    server.start()
    clients = []
    try:
        for _ in range(3):  # one in the worker, one queued: the third finds the queue full
            client = socket.create_connection(("127.0.0.1", port), timeout=10)
            client.sendall(b"GET /api/v1/snapshot HTTP/1.0\r\n\r\n")
            clients.append(client)
            time.sleep(0.1)
        data = b""
        while chunk := clients[-1].recv(4096):
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 503") and b"application/json" in head
        assert json.loads(body)["error"]
    finally:
        for client in clients:
            client.close()
        server.stop()


def test_a_wildcard_bind_without_a_token_is_a_warning_notice(tmp_path: Path) -> None:
    recorder = Recorder(HotState(), rank=0, writer=None, flush_interval_s=0.05)
    recorder.start()
    endpoint = AgentEndpoint.start(recorder, rank=0, local_rank=0, world_size=1, job="t", run_dir=tmp_path / "run",
                                   address="0.0.0.0", base_port=0, token=None, registry_folder=tmp_path / "registry",
                                   notice=recorder.notice)
    try:
        warned = [n for n in recorder.live.notices if n.source == "endpoint" and "without ZEROMON_TOKEN" in n.message]
        assert len(warned) == 1 and warned[0].level == "warning" and "0.0.0.0" in warned[0].message
    finally:
        endpoint.stop()
    with_token = AgentEndpoint.start(recorder, rank=0, local_rank=0, world_size=1, job="t",
                                     run_dir=tmp_path / "run", address="0.0.0.0", base_port=0, token="t",
                                     registry_folder=tmp_path / "registry", notice=recorder.notice)
    with_token.stop()
    loopback = AgentEndpoint.start(recorder, rank=0, local_rank=0, world_size=1, job="t", run_dir=tmp_path / "run",
                                   address="127.0.0.1", base_port=0, token=None, registry_folder=tmp_path / "registry",
                                   notice=recorder.notice)
    loopback.stop()
    recorder.stop()
    assert len([n for n in recorder.live.notices if "without ZEROMON_TOKEN" in n.message]) == 1


# --- any request at all (hypothesis) ---------------------------------------------------------------------

_methods = st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "BREW", "get", "", "G\x00T"])
_paths = st.one_of(st.sampled_from(["/metrics", "/healthz", "/api/v1/snapshot", "/", "//", "*", "/metrics?x=1",
                                    "/api/v1/snapshot?steps=", "/api/v1/snapshot?since=1e400&limit=nan",
                                    "/api/v1/snapshot?steps=-1&steps=2", "/%ff%fe", "/../../etc/passwd",
                                    "/api/v1/snapshot?" + "a=1&" * 300, "http://x/metrics"]),
                   st.text(max_size=40).map(lambda t: "/" + t))
_versions = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "HTTP/9.9", "", "HTTP/1.1 extra", "http/1.1"])
_headers = st.lists(st.tuples(st.sampled_from(["Host", "Accept", "Authorization", "Content-Length", "X",
                                               "Transfer-Encoding", "Connection", ""]),
                              st.one_of(st.sampled_from(["application/openmetrics-text", "Bearer x", "-1", "1e400",
                                                         "chunked", "keep-alive", "99999999999999999999"]),
                                        st.text(max_size=20))), max_size=5)


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=300))  # anything a socket can carry
    line = f"{draw(_methods)} {draw(_paths)} {draw(_versions)}".rstrip()
    head = "\r\n".join([line, *(f"{k}: {v}" for k, v in draw(_headers))]) + "\r\n\r\n"
    return head.encode("utf-8", "surrogatepass") + draw(st.binary(max_size=40))  # a body nobody asked for


def _answer(port: int, raw: bytes) -> bytes:
    """What the endpoint sends back for ``raw`` once the client has said all it will (a half-close, so that
    an incomplete head ends now rather than at the read timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=raw_requests())
def test_any_request_gets_a_status_line_and_a_json_error_or_its_answer_and_the_endpoint_stays_up(
        endpoint: AgentEndpoint, raw: bytes) -> None:
    port = endpoint.entry.port
    data = _answer(port, raw)
    if data:  # else closed unanswered: a connection that sent nothing whole
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        version, status_text = lines[0].split()[:2]
        status = int(status_text)
        assert version in ("HTTP/1.0", "HTTP/1.1") and 200 <= status < 600 and status != 500, (raw, lines[0])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        assert int(headers["content-length"]) == len(body) or raw.startswith(b"HEAD "), (raw, headers, len(body))
        if status >= 400 and body:
            json_error(headers, body)
    assert endpoint.server.errors == 0  # nothing reached an exception handler
    assert request(port, "GET", "/healthz")[0] == 200
