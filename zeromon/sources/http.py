"""The client side of the agents' HTTP endpoints: one-request HTTP/1.0 exchanges on non-blocking
sockets (many agents polled from one thread), bounded bodies and deadlines, and errors worded for
RankView.error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import selectors
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

from zeromon.errors import ZeromonError
from zeromon.model.classes import mutable

MAX_BODY_BYTES = 32 * 2**20  # an answer larger than this is refused, not read whole


# --- HTTP ---------------------------------------------------------------------------------------------

def _json_loads() -> Callable[[bytes], Any]:
    try:
        import orjson
    except ImportError:  # a dependency; json is several times slower on a snapshot
        import json

        return json.loads
    loads: Callable[[bytes], Any] = orjson.loads
    return loads


json_loads = _json_loads()


def check_token(token: str, name: str) -> str:
    """A bearer token as an HTTP header carries it: printable ASCII, no spaces (RFC 6750's b64token is
    stricter; the agents compare any such string). ZeromonError naming ``name``, never the secret: a
    token the header cannot hold would fail in every poll with a UnicodeEncodeError."""
    if not token.strip():
        raise ZeromonError(f"{name}: empty; give the secret, or leave {name} out")
    if not all("!" <= c <= "~" for c in token):
        raise ZeromonError(f"{name}: must be printable ASCII without spaces (an HTTP header carries it)",
                           hint="e.g. a token from `python -c 'import secrets; print(secrets.token_urlsafe())'`")
    return token


class FetchError(Exception):
    """A request that got no usable answer; the message says why, for RankView.error."""


def describe_os_error(exc: BaseException, timeout_s: float, server: str = "the agent") -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused (nothing listens there: {server} stopped?)"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror})"
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return "the connection was closed before an answer"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def http_request(host: str, port: int, path: str, headers: Mapping[str, str]) -> bytes:
    """An HTTP/1.0 GET: the server answers and closes, so there is no connection to keep, nor chunking."""
    lines = [f"GET {path} HTTP/1.0", f"Host: {host}:{port}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1")


class _Answer:
    """An HTTP answer arriving in pieces: done when the server closes, or at Content-Length."""

    __slots__ = ("chunks", "received", "head_end", "length")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.received = 0
        self.head_end = -1
        self.length = -1

    def feed(self, data: bytes) -> bool:
        """Add what recv() gave (b"" at the end); True when the answer is complete."""
        if not data:
            return True
        self.chunks.append(data)
        self.received += len(data)
        if self.received > MAX_BODY_BYTES:
            raise FetchError(f"the answer is larger than {MAX_BODY_BYTES // 2**20} MiB")
        if self.head_end < 0:
            joined = b"".join(self.chunks)
            self.chunks = [joined]
            self.head_end = joined.find(b"\r\n\r\n")
            if self.head_end >= 0:
                self.length = _content_length(joined[:self.head_end])
        # All of it, from a server that would keep the connection open.
        return self.head_end >= 0 and 0 <= self.length <= self.received - self.head_end - 4

    def result(self) -> tuple[int, str, bytes]:
        """(status, reason, body), or FetchError."""
        raw = b"".join(self.chunks)
        if self.head_end < 0:
            raise FetchError("the connection was closed before a complete HTTP answer" if raw
                             else "the connection was closed before an answer")
        status_line = raw[:raw.find(b"\r\n")].decode("latin-1").split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/") or not status_line[1].isdigit():
            raise FetchError("not an HTTP answer")
        body = raw[self.head_end + 4:]
        if self.length >= 0:
            if len(body) < self.length:
                raise FetchError(f"the answer was cut short ({len(body)} of {self.length} bytes)")
            body = body[:self.length]
        return int(status_line[1]), status_line[2] if len(status_line) > 2 else "", body


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return -1


def http_get(host: str, port: int, path: str, headers: Mapping[str, str], timeout_s: float,
             https: bool = False) -> tuple[int, str, bytes]:
    """One blocking GET (HTTP/1.0, HTTPS too), the whole exchange within ``timeout_s``: for Prometheus.
    OSError or FetchError when there is no answer."""
    deadline = time.monotonic() + timeout_s
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        if https:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        sock.sendall(http_request(host, port, path, headers))
        answer = _Answer()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
            if answer.feed(sock.recv(1 << 18)):
                return answer.result()
    finally:
        sock.close()


@mutable(eq=False)
class _Exchange:
    """One request in flight on a non-blocking socket."""

    key: Any
    sock: socket.socket
    out: bytes  # the request, what is left of it to send
    deadline: float
    connecting: bool = True
    answer: _Answer = dataclasses.field(default_factory=_Answer)


class HttpFetcher:
    """Many HTTP/1.0 GETs at once, in the calling thread: non-blocking sockets and one selector.

    One thread serves any number of agents, a slow or dead one costing a socket, not a thread, and less CPU
    than a pool of threads doing the same blocking requests (no GIL hand-offs). ``wake()`` interrupts a
    ``wait()`` from another thread.
    """

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._addresses: dict[tuple[str, int], tuple[int, Any]] = {}
        self._exchanges: dict[int, _Exchange] = {}  # by file descriptor (cheaper to walk than the selector's map)

    @property
    def in_flight(self) -> int:
        return len(self._exchanges)

    def start(self, key: Any, host: str, port: int, request: bytes, timeout_s: float) -> BaseException | None:
        """Begin a request; the error when it fails at once (a host that does not resolve)."""
        try:
            family, address = self._address(host, port)
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            return exc
        sock.setblocking(False)
        err = sock.connect_ex(address)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            self._addresses.pop((host, port), None)
            return OSError(err, os.strerror(err))
        exchange = _Exchange(key, sock, request, time.monotonic() + timeout_s)
        self._selector.register(sock, selectors.EVENT_WRITE, exchange)
        self._exchanges[sock.fileno()] = exchange
        return None

    def _address(self, host: str, port: int) -> tuple[int, Any]:
        # Resolved once per target: a name lookup blocks, and the agents' addresses do not move.
        cached = self._addresses.get((host, port))
        if cached is None:
            family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            cached = self._addresses[(host, port)] = (family, address)
        return cached

    def wait(self, timeout_s: float) -> list[tuple[Any, tuple[int, str, bytes] | BaseException]]:
        """The exchanges that ended within ``timeout_s`` (answered, failed or past their deadline)."""
        done: list[tuple[Any, tuple[int, str, bytes] | BaseException]] = []
        if self._exchanges:
            timeout_s = min(timeout_s, min(ex.deadline for ex in self._exchanges.values()) - time.monotonic())
        for key, mask in self._selector.select(max(0.0, timeout_s)):
            exchange = key.data
            if exchange is None:  # wake()
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
                continue
            result: tuple[int, str, bytes] | BaseException | None
            try:
                result = self._step(exchange, mask)
            except (OSError, FetchError) as exc:
                result = exc
            if result is not None:
                self._end(exchange)
                done.append((exchange.key, result))
        now = time.monotonic()
        for ex in [ex for ex in self._exchanges.values() if now >= ex.deadline]:
            self._end(ex)
            done.append((ex.key, TimeoutError()))
        return done

    def _step(self, ex: _Exchange, mask: int) -> tuple[int, str, bytes] | None:
        if mask & selectors.EVENT_WRITE:
            if ex.connecting:
                err = ex.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))  # ConnectionRefusedError, ...
                ex.connecting = False
            try:
                ex.out = ex.out[ex.sock.send(ex.out):]
            except BlockingIOError:
                return None
            if not ex.out:
                self._selector.modify(ex.sock, selectors.EVENT_READ, ex)
            return None
        try:
            data = ex.sock.recv(1 << 18)
        except BlockingIOError:
            return None
        return ex.answer.result() if ex.answer.feed(data) else None

    def _end(self, ex: _Exchange) -> None:
        del self._exchanges[ex.sock.fileno()]
        self._selector.unregister(ex.sock)
        ex.sock.close()

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def close(self) -> None:
        for ex in list(self._exchanges.values()):
            self._end(ex)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


def http_status_error(status: int, reason: str, body: bytes, has_token: bool) -> str:
    """What an agent's non-200 answer means, for RankView.error."""
    if status == 401:
        return ("401: the agent requires a bearer token; set ZEROMON_TOKEN (or --token)" if not has_token
                else "401: the agent refused the token (ZEROMON_TOKEN / --token)")
    detail = body[:200].decode("utf-8", "replace").strip()
    if status == 404:
        doc = _json_object(body)
        if doc is None or not isinstance(doc.get("error"), str):  # an agent's 404 is JSON with an "error"
            return (f"HTTP 404 {reason}" + (f": {detail}" if detail else "") + ": not a zeromon agent (a "
                    "Prometheus server? read it with --prometheus URL)")
        if doc.get("agent_mismatch") is True:  # asked with ?agent=: the rank's agent is gone, another has its port
            return "its agent has stopped: another agent (another run's) listens on its port now"
    return f"HTTP {status} {reason}" + (f": {detail}" if detail else "")


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json_loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
