"""A small HTTP/1.0 server that slow, idle or hostile clients cannot stall, for the agent's endpoint.

Nothing here runs on the training thread, and the training thread never waits on it. Threads, all
daemons:

- one I/O thread accepts connections and reads each request's head without blocking, with a deadline
  (READ_TIMEOUT_S from the connection's accept) and a size cap (MAX_HEAD_BYTES). Idle, slow
  (slowloris) and oversized clients therefore cost a socket each and no thread. At most MAX_OPEN
  connections are open at once; past that the oldest one is closed (a scraper sends its head right
  after connecting, so it is never the oldest for long). It answers the paths it is given as inline itself (cached,
  cheap) with non-blocking sends, again under a deadline (WRITE_TIMEOUT_S);
- WORKERS worker threads answer the other requests, taken from a bounded queue (full: 503 at once),
  with a send timeout (WRITE_TIMEOUT_S) for clients that do not read.

One request per connection (HTTP/1.0, Connection: close): keep-alive would let an idle client hold
a connection slot. Requests are parsed by http.server's BaseHTTPRequestHandler, fed the head the I/O
thread read.
"""

from __future__ import annotations

import io
import json
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import field
from email.message import Message
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from zeromon.model.classes import frozen, mutable
from zeromon.model.kinds import json_default, orjson_module
from zeromon_agent.context.config import PORT_TRIES

# The I/O thread's wait with no connection open: stop() wakes it at once through the pipe, so this bounds only a
# stop whose wake could not be sent. Each wakeup costs the thread ~0.1 ms of CPU on this project's virtual
# machine (tests/bench/RESULTS.md): at 5 s they were nearly all of an unscraped endpoint's CPU.
_IDLE_WAKE_S = 60.0

log = logging.getLogger("zeromon.agent")

WORKERS = 4
QUEUE_SIZE = 16
MAX_OPEN = 64
BACKLOG = 16
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 5.0
MAX_HEAD_BYTES = 8192
_ACCEPTS_PER_WAKE = 64  # a connection flood does not starve the reads of those already open


# --- binding -----------------------------------------------------------------------------------------

def bind(address: str, base_port: int, local_rank: int, tries: int = PORT_TRIES) -> tuple[socket.socket, int]:
    """A listening socket on ``base_port + local_rank``, else the next free port up to ``tries`` more.

    ``base_port`` 0: any free port. Returns (socket, port). Raises OSError when none is free or the
    address cannot be bound (the last error).
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    wanted = [0] if base_port == 0 else \
        [p for p in range(base_port + local_rank, base_port + local_rank + tries + 1) if p <= 65535]
    last: OSError = OSError(f"no port to try: base port {base_port} + local rank {local_rank} = "
                            f"{base_port + local_rank}, above 65535 (ZEROMON_PORT, zeromon run --port)")
    for port in wanted:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # Rebinding a port whose previous owner's connections linger in TIME_WAIT; on Linux this
            # does not let two listeners share a port.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(BACKLOG)
        except OSError as exc:
            sock.close()
            last = exc
            if exc.errno not in (98, 13):  # EADDRINUSE, EACCES: try the next port; anything else is final
                raise
            continue
        sock.setblocking(False)
        return sock, int(sock.getsockname()[1])
    raise last


# --- requests and responses ----------------------------------------------------------------------------

@frozen
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Message


@frozen
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


def json_response(status: int, document: Any) -> Response:
    """``document`` as JSON (UTF-8, one line). orjson writes it where it is installed: several times faster
    than json's encoder on a snapshot, which a watching client asks of every rank once a second. orjson writes
    NaN and infinities as null: JSON has no such numbers (RFC 8259, section 6), and the live source's parser
    (orjson.loads) refuses them. json writes what orjson refuses (an integer past 64 bits, a lone
    surrogate)."""
    orjson = orjson_module()
    if orjson:
        try:
            # Keys that are not strings written as json writes them (an int key as "1"); a newline at the end.
            return Response(status, orjson.dumps(document, default=json_default,
                                                 option=orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE))
        except TypeError:  # orjson.JSONEncodeError
            pass
    return Response(status, (json.dumps(document, separators=(",", ":"), default=json_default) + "\n").encode())


class _Handler(BaseHTTPRequestHandler):
    """Parses one request head and writes the whole response into a buffer, for one send."""

    server_version = "zeromon-agent"
    protocol_version = "HTTP/1.0"  # one request per connection

    def setup(self) -> None:
        head, self.wfile, self.owner = self.request
        self.rfile = io.BytesIO(head)

    def handle(self) -> None:
        self.handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if self.request_version == "HTTP/0.9":  # http.server writes no status line or headers for 0.9
            self.request_version = "HTTP/1.0"
        return ok

    def __getattr__(self, name: str) -> Any:
        """Any method but GET and HEAD (POST, PUT, BREW, ...) is 405: http.server answers a method it has
        no do_<METHOD> for with 501, which would tell a client the server lacks it, not that it is refused."""
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def finish(self) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(head_only=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head_only=True)

    def _not_allowed(self) -> None:
        """Every route is read-only: a JSON 405 naming the methods that work, like every other error."""
        body = json_response(405, {"error": f"method {self.command} is not allowed: GET or HEAD"}).body
        self.send_response(405)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Allow", "GET, HEAD")
        self.end_headers()
        self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's errors (a malformed request line, an unknown method: 400, 501, ...) as JSON, not HTML."""
        self.close_connection = True
        self.request_version = "HTTP/1.0"  # a status line even for a request line it could not parse
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = ""
        body = json_response(code, {"error": message or phrase}).body
        self.send_response(code, phrase)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def version_string(self) -> str:
        return self.server_version  # http.server adds " <python version>"; sys_version "" left a trailing space

    def _answer(self, head_only: bool) -> None:
        url = urlsplit(self.path)
        try:
            query = parse_qs(url.query, max_num_fields=16)
        except ValueError:
            query = None
        try:
            if query is None:
                response = json_response(400, {"error": "too many query parameters"})
            else:
                response = self.owner.app(Request(self.command, url.path, query, self.headers))
        except Exception as exc:  # noqa: BLE001 - a bug here must answer 500, not kill the thread
            self.owner.error(f"endpoint {url.path}", exc)
            response = json_response(500, {"error": f"internal error: {exc!r}"})
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in response.headers:
            self.send_header(name, value)
        self.end_headers()
        if not head_only:
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass


def _path_of(head: bytes) -> bytes:
    """The path of a request head's request line (no query), b"" when there is none."""
    parts = head.split(b"\n", 1)[0].split()
    return parts[1].split(b"?", 1)[0] if len(parts) >= 2 else b""


# --- the server ---------------------------------------------------------------------------------------

@mutable
class _Conn:
    sock: socket.socket
    address: Any
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None  # the response still to send, once answered inline


def _say(sock: socket.socket, status: HTTPStatus, error: str) -> None:
    """Best effort, never blocking: a status line and a JSON error for a client about to be dropped."""
    body = json.dumps({"error": error}, separators=(",", ":")).encode() + b"\n"
    try:
        sock.setblocking(False)
        sock.send(f"HTTP/1.0 {status.value} {status.phrase}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


class HttpServer:
    """A bounded HTTP server on a listening socket: one I/O thread, a fixed pool of workers.

    Requests for ``inline_paths`` (cheap, cached answers: /metrics, /healthz) are answered by the I/O
    thread itself, and their response goes out in one non-blocking send: each blocking call hands the
    GIL to a busy training thread and waits up to the interpreter's switch interval to get it
    back, so the fewer threads and system calls a scrape takes, the faster it is under a Python-bound
    training loop. Other requests (the snapshot: its JSON can take tens of ms) go to the workers.
    """

    def __init__(self, sock: socket.socket, app: Callable[[Request], Response], workers: int = WORKERS,
                 queue_size: int = QUEUE_SIZE, max_open: int = MAX_OPEN, read_timeout_s: float = READ_TIMEOUT_S,
                 write_timeout_s: float = WRITE_TIMEOUT_S, max_head_bytes: int = MAX_HEAD_BYTES,
                 inline_paths: frozenset[str] = frozenset(),
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.sock = sock
        # Told of every exception answered with 500 or closing a connection (where, exc): the agent
        # counts them with its hooks' errors (HotState.hook_error) and says each place once.
        self.on_error = on_error
        self.app = app
        self.workers = workers
        self.max_open = max_open
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_head_bytes = max_head_bytes
        self.inline_paths = frozenset(p.encode() for p in inline_paths)
        self.errors = 0  # exceptions answered with 500
        self.refused = 0  # connections closed unanswered: over MAX_OPEN, too slow, head too large, queue full
        self._queue: queue.Queue[tuple[socket.socket, bytes, Any] | None] = queue.Queue(maxsize=queue_size)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._cpu_s = [0.0] * (workers + 1)  # per thread, each written by its own thread only

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def cpu_time_s(self) -> float:
        return sum(self._cpu_s)

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._serve, name="zeromon-endpoint-io", daemon=True)]
        self._threads += [threading.Thread(target=self._work, args=(i + 1,), name=f"zeromon-endpoint-{i}",
                                           daemon=True) for i in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop accepting, close every connection, let the workers go. Waits at most ~timeout_s."""
        if self._stopping:
            return
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        io_thread = self._threads[0] if self._threads else None
        if io_thread is not None and io_thread is not threading.current_thread():
            io_thread.join(timeout_s)
        while True:  # requests not yet answered are dropped; each worker gets its sentinel
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                _close(item[0])
        for _ in range(self.workers):
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break
        _close(self.sock)

    def render(self, head: bytes, address: Any = None) -> bytes:
        """The whole response to one request head."""
        out = io.BytesIO()
        _Handler((head, out, self), address or ("", 0), None)  # type: ignore[arg-type]
        return out.getvalue()

    # --- the I/O thread -----------------------------------------------------------------------------
    def _serve(self) -> None:
        # Waits on the socket and the wake pipe (stop() writes it), so an idle endpoint has no reason to
        # wake: each wakeup of a thread in a training process costs CPU (its memory cold).
        cpu0 = time.thread_time()
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ, "listen")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        conns: dict[int, _Conn] = {}
        try:
            while not self._stopping:
                timeout = _IDLE_WAKE_S
                if conns:
                    timeout = max(0.0, min(min(c.deadline for c in conns.values()) - time.monotonic(), timeout))
                for key, _ in selector.select(timeout):
                    if key.data == "listen":
                        self._accept(selector, conns)
                    elif key.data != "wake":
                        self._ready(selector, conns, key.data)
                now = time.monotonic()
                for conn in [c for c in conns.values() if c.deadline <= now]:
                    # Too slow to send its head (408), or to read its answer (just closed).
                    self._drop(selector, conns, conn, HTTPStatus.REQUEST_TIMEOUT if conn.out is None else None)
                self._cpu_s[0] = time.thread_time() - cpu0
        except Exception as exc:  # noqa: BLE001 - never raise out of a daemon thread into the run
            log.warning("zeromon: the endpoint's I/O thread stopped: %r", exc)
            self.error("endpoint I/O thread", exc)
        finally:
            for conn in list(conns.values()):
                _close(conn.sock)
            selector.close()
            _close(self._wake_r)
            _close(self._wake_w)

    def error(self, where: str, exc: BaseException) -> None:
        """Count an exception the server caught; logged once, or handed to ``on_error``. Never raises."""
        self.errors += 1
        try:
            if self.on_error is not None:
                self.on_error(where, exc)
            elif self.errors == 1:
                log.warning("zeromon: %s error (logged once): %r", where, exc)
        except Exception:  # noqa: BLE001 - the handler of errors must not be one
            pass

    def _accept(self, selector: selectors.BaseSelector, conns: dict[int, _Conn]) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, address = self.sock.accept()
            except OSError:  # BlockingIOError: none left
                return
            if len(conns) >= self.max_open:
                oldest = min(conns.values(), key=lambda c: c.deadline)
                self._drop(selector, conns, oldest, HTTPStatus.SERVICE_UNAVAILABLE)
            sock.setblocking(False)
            try:  # a whole /metrics answer in one send (the kernel doubles this, up to wmem_max)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            except OSError:
                pass
            conn = _Conn(sock, address, time.monotonic() + self.read_timeout_s)
            conns[sock.fileno()] = conn
            selector.register(sock, selectors.EVENT_READ, conn)
            self._ready(selector, conns, conn)  # a scraper's head is usually there already: no second wake

    def _ready(self, selector: selectors.BaseSelector, conns: dict[int, _Conn], conn: _Conn) -> None:
        try:
            if conn.out is not None:
                self._send(selector, conns, conn)
            else:
                self._read(selector, conns, conn)
        except Exception as exc:  # noqa: BLE001 - one bad connection must not stop the others
            self.error("endpoint connection", exc)
            self._drop(selector, conns, conn, None)

    def _read(self, selector: selectors.BaseSelector, conns: dict[int, _Conn], conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._forget(selector, conns, conn)
            _close(conn.sock)
            return
        seen = len(conn.head)
        conn.head += data
        complete = conn.head.find(b"\r\n\r\n", max(0, seen - 3)) >= 0 or conn.head.find(b"\n\n", max(0, seen - 1)) >= 0
        if len(conn.head) > self.max_head_bytes:
            self._drop(selector, conns, conn, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
            return
        if not complete:
            return
        head = bytes(conn.head)
        if _path_of(head) in self.inline_paths:
            conn.out = memoryview(self.render(head, conn.address))
            conn.deadline = time.monotonic() + self.write_timeout_s
            self._send(selector, conns, conn)
            return
        self._forget(selector, conns, conn)
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(self.write_timeout_s)
            self._queue.put_nowait((conn.sock, head, conn.address))
        except queue.Full:
            self.refused += 1
            _say(conn.sock, HTTPStatus.SERVICE_UNAVAILABLE, self._why(HTTPStatus.SERVICE_UNAVAILABLE))
            _close(conn.sock)
        except OSError:
            _close(conn.sock)

    def _send(self, selector: selectors.BaseSelector, conns: dict[int, _Conn], conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:  # the client went away
            self._forget(selector, conns, conn)
            _close(conn.sock)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._forget(selector, conns, conn)
            _close(conn.sock)
        else:  # a client that reads slowly: the rest when it can take it, until the deadline
            selector.modify(conn.sock, selectors.EVENT_WRITE, conn)

    def _why(self, status: HTTPStatus) -> str:
        """Why a connection is dropped unanswered, for the JSON error every answer carries."""
        return {HTTPStatus.REQUEST_TIMEOUT: f"no complete request head within {self.read_timeout_s:g} s",
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE: f"request head larger than {self.max_head_bytes} bytes",
                HTTPStatus.SERVICE_UNAVAILABLE: "too many requests at once; try again"}.get(status, status.phrase)

    def _forget(self, selector: selectors.BaseSelector, conns: dict[int, _Conn], conn: _Conn) -> None:
        conns.pop(conn.sock.fileno(), None)
        try:
            selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, selector: selectors.BaseSelector, conns: dict[int, _Conn], conn: _Conn,
              status: HTTPStatus | None) -> None:
        self.refused += 1
        self._forget(selector, conns, conn)
        if status is not None:
            _say(conn.sock, status, self._why(status))
        _close(conn.sock)

    # --- the workers ----------------------------------------------------------------------------------
    def _work(self, index: int) -> None:
        cpu0 = time.thread_time()
        while True:
            item = self._queue.get()
            if item is None or self._stopping:
                if item is not None:
                    _close(item[0])
                return
            sock, head, address = item
            try:
                sock.sendall(self.render(head, address))  # under the socket's write timeout
            except Exception:  # noqa: BLE001 - a client that went away, a send that timed out
                pass
            finally:
                _close(sock)
                self._cpu_s[index] = time.thread_time() - cpu0
