"""Live data from running agents, as one immutable FleetView that the TUI and the dashboard draw.

LiveSource finds the agents (``host:port`` targets, a run folder's ``endpoints/``, or by itself
the newest local run in the user-level index; zeromon.sources.discovery), polls each one's
``/api/v1/snapshot`` every ``interval_s`` from one background thread (non-blocking sockets and a
selector: a slow or dead agent holds a socket, never the others), and keeps the newest answer of
each rank. ``latest()`` never touches the network: it copies references under a lock.
With ``prometheus=URL`` it reads the same view through Prometheus's HTTP API instead
(zeromon.sources.promql), for a job that spans machines.

A rank that stops answering stays in the view with its last data, ``alive=False``, ``stale_s``
and the reason in ``error``; one that comes back is picked up, and so are agents that register in
the run's folder later. Nothing a target answers, or fails to, raises out of ``latest()``.

What one poll of a rank costs the client (~0.4 ms of CPU): one HTTP/1.0 request on a new
connection (the endpoint serves one request per connection), one JSON parse, and new objects only
for what changed: after the first poll it asks only for the steps that can have ended since
(``?steps=``) and the events since its cursor (``?since=``), and reuses the steps it has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.oom import OomForecast
from zeromon.errors import ZeromonError
from zeromon.model.codec import FIELDS_OF
from zeromon.model.events import (
    AgentStats,
    DeviceSample,
    MemorySample,
    Notice,
    PhaseSpan,
    RunInfo,
    StepSummary,
)
from zeromon.model.registry import EndpointEntry, registry_dir
from zeromon.sources.discovery import (
    EntryFolder,
    Target,
    entry_target,
    newest_local_run,
    parse_target,
    run_endpoints_folder,
)

SNAPSHOT_SCHEMA = "zeromon.snapshot/1"
STEPS_ASKED = 64  # steps per snapshot (?steps=): the agent's default
EVENTS_LIMIT = 2000  # events per poll (?limit=); a client further behind skips ahead
PHASES_KEPT = 512  # recent phase spans kept per rank
PHASES_BACKFILL = 256  # events asked for before the first cursor: the last step or so
MAX_BODY_BYTES = 32 * 2**20  # an answer larger than this is refused, not read whole


# --- the view --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CollectiveTotal:
    """Totals of one (op, ZeRO meaning) since the agent started."""

    op: str
    meaning: str
    calls: int
    bytes: int
    seconds: float  # sum of measured durations
    blocked_s: float
    busbw_bytes_s: float | None  # median of the recent bus bandwidth samples (nccl-tests' busbw)


@dataclass(frozen=True, slots=True)
class RankView:
    """One rank as the client last saw it. Its data stays when the rank stops answering."""

    rank: int | None  # None: a target that never answered
    target: str  # host:port
    alive: bool  # the last poll got an answer
    stale_s: float | None  # seconds since the last answer; None: never answered
    error: str | None  # why the last poll failed
    run_info: RunInfo | None = None
    steps: tuple[StepSummary, ...] = ()  # newest last
    memory: MemorySample | None = None
    device: DeviceSample | None = None
    stats: AgentStats | None = None
    collectives: tuple[CollectiveTotal, ...] = ()
    oom: OomForecast | None = None
    findings: tuple[Finding, ...] = ()
    phases: tuple[PhaseSpan, ...] = ()  # recent phase spans, oldest first
    notices: tuple[Notice, ...] = ()
    host: str | None = None
    pid: int | None = None
    job: str | None = None
    local_rank: int | None = None
    world_size: int | None = None
    t_ns: int | None = None  # the agent's clock when it answered

    @property
    def last_step(self) -> StepSummary | None:
        return self.steps[-1] if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["oom"] = self.oom.to_dict() if self.oom is not None else None
        out["findings"] = [f.to_dict() for f in self.findings]
        for name in ("run_info", "memory", "device", "stats"):
            value = out[name]
            out[name] = _plain(value) if value is not None else None
        for name in ("steps", "collectives", "phases", "notices"):
            out[name] = [_plain(v) for v in out[name]]
        return out


@dataclass(frozen=True, slots=True)
class FleetView:
    """Every rank of the watched run at one moment, ordered by rank."""

    t_ns: int
    source: str  # what is watched: "run <dir>", "targets ...", "prometheus <url>"
    ranks: tuple[RankView, ...]
    looked_at: tuple[str, ...]  # where agents were looked for (for a "no agent found" message)
    error: str | None = None  # about the source as a whole: no agent found, Prometheus unreachable

    @property
    def alive(self) -> int:
        return sum(1 for r in self.ranks if r.alive)

    def to_dict(self) -> dict[str, Any]:
        return {"t_ns": self.t_ns, "source": self.source, "looked_at": list(self.looked_at), "error": self.error,
                "ranks": [r.to_dict() for r in self.ranks]}


def _plain(record: Any) -> dict[str, Any]:
    return {name: (dict(v) if isinstance(v := getattr(record, name), Mapping) else v)
            for name in (f.name for f in dataclasses.fields(record))}


# --- the snapshot JSON into model types ----------------------------------------------------------------

_NAMES: dict[type, tuple[str, ...]] = {**FIELDS_OF, CollectiveTotal: tuple(f.name for f in dataclasses.fields(CollectiveTotal))}


def _make(cls: type, data: Any) -> Any:
    """A dataclass from a JSON object: known keys only (newer agents may add some); None if it lacks a required one."""
    if not isinstance(data, dict):
        return None
    try:
        return cls(**{k: data[k] for k in _NAMES[cls] if k in data})
    except TypeError:
        return None


def _severity(value: Any) -> Severity:
    try:
        return Severity(value)
    except ValueError:
        return Severity.INFO


def finding_from_dict(data: Any) -> Finding | None:
    """Finding.to_dict() read back."""
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return None
    metrics = data.get("metrics")
    return Finding(kind=data["kind"], severity=_severity(data.get("severity")), title=str(data.get("title", "")),
                   rank=data.get("rank"), step=data.get("step"), evidence=tuple(data.get("evidence") or ()),
                   remedies=tuple(data.get("remedies") or ()),
                   metrics=dict(metrics) if isinstance(metrics, dict) else {})


def forecast_from_dict(data: Any) -> OomForecast | None:
    """OomForecast.to_dict() read back."""
    if not isinstance(data, dict):
        return None
    keys = ("capacity_bytes", "current_bytes", "peak_bytes", "headroom_bytes", "predicted_peak_bytes",
            "growth_bytes_per_step", "steps_to_capacity")
    findings = tuple(f for f in map(finding_from_dict, data.get("findings") or ()) if f is not None)
    return OomForecast(rank=int(data.get("rank", -1)), risk=_severity(data.get("risk", "ok")),
                       **{k: data.get(k) for k in keys}, findings=findings, device=str(data.get("device", "-")),
                       pending_optimizer_bytes=int(data.get("pending_optimizer_bytes") or 0))


def _steps(items: Any, previous: tuple[StepSummary, ...]) -> tuple[StepSummary, ...]:
    """The snapshot's steps, reusing the objects of steps already seen (most of them, every poll)."""
    if not isinstance(items, list):
        return ()
    # The answer holds the agent's newest steps: only as many of the newest known ones can match.
    known: dict[tuple[Any, Any], StepSummary] = {(s.step, s.end_ns): s for s in previous[-len(items):]}
    out = []
    for item in items:
        if isinstance(item, dict):
            step = known.get((item.get("step"), item.get("end_ns"))) or _make(StepSummary, item)
            if step is not None:
                out.append(step)
    return tuple(out)


def check_snapshot(doc: Any) -> dict[str, Any]:
    """The snapshot document, or ValueError saying why it is not one this client reads."""
    if not isinstance(doc, dict):
        raise ValueError("the answer is not a JSON object")
    schema = doc.get("schema")
    if not isinstance(schema, str) or schema.split("/")[0] != SNAPSHOT_SCHEMA.split("/")[0]:
        raise ValueError(f"not a zeromon snapshot (schema {schema!r})")
    if schema.split("/")[-1].split(".")[0] != SNAPSHOT_SCHEMA.split("/")[-1]:
        raise ValueError(f"snapshot schema {schema} is not supported; this zeromon reads {SNAPSHOT_SCHEMA}")
    return doc


def _collectives(items: Any) -> tuple[CollectiveTotal, ...]:
    return tuple(c for c in (_make(CollectiveTotal, d) for d in items or ()) if c is not None)


def _findings(items: Any) -> tuple[Finding, ...]:
    return tuple(f for f in map(finding_from_dict, items or ()) if f is not None)


def _notices(items: Any) -> tuple[Notice, ...]:
    return tuple(n for n in (_make(Notice, d) for d in items or ()) if n is not None)


# Snapshot keys and how each becomes model objects.
_PARTS: dict[str, Callable[[Any], Any]] = {
    "run_info": lambda raw: _make(RunInfo, raw), "memory": lambda raw: _make(MemorySample, raw),
    "device": lambda raw: _make(DeviceSample, raw), "stats": lambda raw: _make(AgentStats, raw),
    "collectives": _collectives, "oom": forecast_from_dict, "findings": _findings, "notices": _notices,
}


def rank_view_from_snapshot(doc: dict[str, Any], target: str, previous: RankView | None = None,
                            phases: tuple[PhaseSpan, ...] = (),
                            parsed: dict[str, tuple[Any, Any]] | None = None) -> RankView:
    """An alive RankView from a checked snapshot document.

    ``previous``: the rank's last view, whose steps are reused. ``parsed``: the rank's (JSON, object)
    of each part last time, updated here: a part whose JSON is unchanged (run info, notices, the
    forecast between steps) keeps its object; comparing the parsed JSON costs less than building it.
    """
    old_steps = previous.steps if previous is not None else ()
    cache = parsed if parsed is not None else {}
    parts: dict[str, Any] = {}
    for name, build in _PARTS.items():
        raw = doc.get(name)
        hit = cache.get(name)
        if hit is None or hit[0] != raw:
            hit = cache[name] = (raw, build(raw))
        parts[name] = hit[1]
    rank = doc.get("rank")

    def opt_int(name: str) -> int | None:
        value = doc.get(name)
        return value if isinstance(value, int) else None

    return RankView(
        rank=rank if isinstance(rank, int) else None, target=target, alive=True, stale_s=0.0, error=None,
        steps=_steps(doc.get("steps"), old_steps), phases=phases, **parts,
        host=doc.get("host") if isinstance(doc.get("host"), str) else None, pid=opt_int("pid"),
        job=doc.get("job") if isinstance(doc.get("job"), str) else None, local_rank=opt_int("local_rank"),
        world_size=opt_int("world_size"), t_ns=opt_int("t_ns"),
    )


# --- HTTP ---------------------------------------------------------------------------------------------

def _json_loads() -> Callable[[bytes], Any]:
    try:
        import orjson
    except ImportError:  # a dependency; json is ~3x slower on a snapshot
        import json

        return json.loads
    loads: Callable[[bytes], Any] = orjson.loads
    return loads


json_loads = _json_loads()


class FetchError(Exception):
    """A request that got no usable answer; the message says why, for RankView.error."""


def describe_os_error(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens there: the agent stopped?)"
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


@dataclass(slots=True, eq=False)
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

    One thread serves any number of agents, a slow or dead one costing a socket, not a thread: 64
    agents a second cost ~30% less CPU than a pool of threads doing the same blocking requests
    (no GIL hand-offs). ``wake()`` interrupts a ``wait()`` from another thread.
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
    if status == 401:
        return ("401: the agent requires a bearer token; set ZEROMON_TOKEN (or --token)" if not has_token
                else "401: the agent refused the token (ZEROMON_TOKEN / --token)")
    detail = body[:200].decode("utf-8", "replace").strip()
    return f"HTTP {status} {reason}" + (f": {detail}" if detail else "")


# --- polling -----------------------------------------------------------------------------------------

@dataclass(slots=True, eq=False)
class _Slot:
    """One watched agent and what was last learnt from it. Mutated under LiveSource._lock."""

    key: str
    target: Target
    rank: int | None
    view: RankView | None = None  # built from the last answer
    last_ok: float | None = None  # time.monotonic() of the last answer
    error: str | None = "not polled yet"
    cursor: int | None = None  # events were read through this cursor
    start_ns: int | None = None  # of the agent that answered (a restarted agent numbers events anew)
    full_steps: bool = True  # ask for all STEPS_ASKED steps next time (first poll, or steps were missed)
    parsed: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)  # see rank_view_from_snapshot
    phases: deque[PhaseSpan] = dataclasses.field(default_factory=lambda: deque(maxlen=PHASES_KEPT))
    due: float = 0.0  # time.monotonic() of its next poll
    in_flight: bool = False  # a request is out: a slow agent is not asked twice


class LiveSource:
    """Polls live agents (or Prometheus) in the background; ``latest()`` is the newest FleetView.

    ``targets``: ``host:port`` strings; else ``run_dir``: the agents registered in that run folder;
    else the newest local run (the user-level index, ZEROMON_REGISTRY). ``prometheus``: a
    Prometheus server's URL instead of agents. ``token``: the agents' bearer token (default
    ZEROMON_TOKEN). Bad arguments raise ZeromonError here; nothing later does.
    """

    def __init__(self, targets: list[str] | None = None, run_dir: str | Path | None = None,
                 prometheus: str | None = None, token: str | None = None, interval_s: float = 1.0,
                 timeout_s: float | None = None, events: bool = True) -> None:
        if not interval_s > 0:
            raise ZeromonError(f"interval {interval_s!r}: must be a number of seconds > 0")
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s) if timeout_s is not None else min(5.0, max(1.0, 2 * self.interval_s))
        self.token = token if token is not None else os.environ.get("ZEROMON_TOKEN") or None
        self.events = events  # read phase spans from the event stream (?since=)
        self._targets = [parse_target(t) for t in targets or ()]
        self._run_dir = Path(run_dir) if run_dir is not None else None
        if self._run_dir is not None and not self._run_dir.is_dir():
            raise ZeromonError(f"run folder {run_dir}: no such folder",
                               hint="a run folder is the --out of `zeromon run` (ZEROMON_OUT)")
        self._prometheus: Any = None
        if prometheus is not None:
            from zeromon.sources.promql import PrometheusFleet

            self._prometheus = PrometheusFleet(prometheus, timeout_s=self.timeout_s)
        self._auto = not self._targets and self._run_dir is None and self._prometheus is None
        self._folder = EntryFolder(run_endpoints_folder(self._run_dir)) if self._run_dir is not None else None
        self._auto_start_ns = -1
        self._registry = EntryFolder(registry_dir()) if self._auto else None
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._problems: tuple[str, ...] = ()
        self._source_error: str | None = None
        self._prom_view: FleetView | None = None
        self._fetcher: HttpFetcher | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        for target in self._targets:
            self._slots[str(target)] = _Slot(str(target), target, None)

    # -- public

    @property
    def looked_at(self) -> tuple[str, ...]:
        if self._prometheus is not None:
            return (f"prometheus {self._prometheus.url}",)
        if self._targets:
            return tuple(f"target {t}" for t in self._targets)
        places = []
        if self._auto:
            places.append(f"{registry_dir()} (the user-level index of local agents, ZEROMON_REGISTRY)")
        if self._run_dir is not None:
            places.append(f"{run_endpoints_folder(self._run_dir)} (the run folder's endpoints)")
        return tuple(places)

    @property
    def source(self) -> str:
        if self._prometheus is not None:
            return f"prometheus {self._prometheus.url}"
        if self._targets:
            return "targets " + " ".join(str(t) for t in self._targets)
        return f"run {self._run_dir}" if self._run_dir is not None else "newest local run (none found yet)"

    def start(self) -> LiveSource:
        """Poll in the background (one daemon thread), every interval_s, until stop()."""
        if self._thread is None:
            self._stop.clear()
            if self._prometheus is None and self._fetcher is None:
                self._fetcher = HttpFetcher()
            self._thread = threading.Thread(target=self._loop, name="zeromon-live-source", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._fetcher is not None:
            self._fetcher.wake()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)
            self._thread = None
        if self._fetcher is not None:
            self._close(self._fetcher)
            self._fetcher = None
        if self._prometheus is not None:
            self._prometheus.close()

    def _close(self, fetcher: HttpFetcher) -> None:
        fetcher.close()
        with self._lock:
            for slot in self._slots.values():
                slot.in_flight = False  # its exchange went with the fetcher

    def __enter__(self) -> LiveSource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def poll(self) -> FleetView:
        """One round now, waiting for its answers (at most timeout_s): for one-shot use and tests.
        Once start()ed, the background thread polls and this is latest()."""
        if self._thread is not None:
            return self.latest()
        if self._prometheus is not None:
            self._poll_prometheus()
            return self.latest()
        self._discover()
        fetcher = HttpFetcher()
        try:
            with self._lock:
                slots = list(self._slots.values())
            for slot in slots:
                self._send(fetcher, slot)
            while fetcher.in_flight:  # each exchange ends by its deadline
                for slot, result in fetcher.wait(self.timeout_s):
                    self._receive(slot, result)
        finally:
            self._close(fetcher)
        return self.latest()

    def latest(self) -> FleetView:
        """The newest view; never blocks on the network."""
        if self._prometheus is not None:
            with self._lock:
                fleet = self._prom_view
            return fleet if fleet is not None else FleetView(time.time_ns(), self.source, (), self.looked_at,
                                                           error="not polled yet")
        now = time.monotonic()
        with self._lock:
            slots = [(s, s.view, s.last_ok, s.error, s.rank) for s in self._slots.values()]
            problems, error = self._problems, self._source_error
        ranks = []
        for slot, view, last_ok, err, rank in slots:
            stale = None if last_ok is None else round(now - last_ok, 3)
            if view is None:
                ranks.append(RankView(rank=rank, target=str(slot.target), alive=False, stale_s=stale, error=err))
            else:
                ranks.append(dataclasses.replace(view, alive=err is None, stale_s=stale, error=err))
        ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.target))
        if error is None and not ranks:
            error = "no agent found (looked at: " + "; ".join(self.looked_at) + ")"
        if error is None and problems:
            error = "; ".join(problems[:3])
        return FleetView(time.time_ns(), self.source, tuple(ranks), self.looked_at, error)

    # -- the loop

    def _loop(self) -> None:
        """Every slot polled every interval_s, each on its own schedule: one slow agent delays no other."""
        next_discover = 0.0
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if self._prometheus is not None:
                    self._poll_prometheus()
                    self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - now)))
                    continue
                fetcher = self._fetcher
                assert fetcher is not None  # made by start()
                if now >= next_discover:
                    self._discover()
                    next_discover = now + self.interval_s
                with self._lock:
                    slots = list(self._slots.values())
                for slot in slots:
                    if not slot.in_flight and now >= slot.due:
                        slot.due = now + self.interval_s
                        self._send(fetcher, slot)
                wake_at = min([next_discover, *(s.due for s in slots if not s.in_flight)])
                for slot, result in fetcher.wait(wake_at - time.monotonic()):
                    self._receive(slot, result)
                self._source_error = None
            except Exception as exc:  # a bug here must not end the polling; it shows in the view
                with self._lock:
                    self._source_error = f"internal error while polling: {type(exc).__name__}: {exc}"
                self._stop.wait(self.interval_s)

    def _poll_prometheus(self) -> None:
        view = self._prometheus.poll(self.source, self.looked_at)
        with self._lock:
            self._prom_view = view

    def _discover(self) -> None:
        """Registered agents to slots: new ranks added, restarted ones (a new address) re-pointed."""
        if self._targets:
            return
        problems: list[str] = []
        if self._auto:
            newest = newest_local_run(self._registry, problems)
            # Only a newer run takes over: when this one ends cleanly its user-level entries go,
            # and an older crashed run's leftovers must not replace it.
            if newest is not None and newest.start_ns > self._auto_start_ns:
                self._auto_start_ns = newest.start_ns
                self._run_dir = Path(newest.run_dir)
                self._folder = EntryFolder(run_endpoints_folder(self._run_dir))
                with self._lock:
                    self._slots = {}
            entries = self._folder.read(problems) if self._folder is not None else []
            if not entries and newest is not None and self._run_dir == Path(newest.run_dir):
                entries = list(newest.entries)  # the run folder is gone: the index still has this host's
        else:
            assert self._folder is not None
            entries = self._folder.read(problems)
        newest_of: dict[int, EndpointEntry] = {}
        for entry in entries:
            if entry.rank not in newest_of or entry.start_ns > newest_of[entry.rank].start_ns:
                newest_of[entry.rank] = entry
        with self._lock:
            self._problems = tuple(problems)
            for rank, entry in newest_of.items():
                key = f"rank {rank}"
                try:
                    target = entry_target(entry)
                except ZeromonError as exc:
                    self._problems += (exc.message,)
                    continue
                slot = self._slots.get(key)
                if slot is None:
                    self._slots[key] = _Slot(key, target, rank)
                elif slot.target != target and not slot.in_flight:
                    slot.target = target  # the rank's agent restarted elsewhere

    def _send(self, fetcher: HttpFetcher, slot: _Slot) -> None:
        n_steps = STEPS_ASKED if slot.full_steps else self._steps_to_ask(slot)
        path = f"/api/v1/snapshot?steps={n_steps}"
        if self.events and slot.cursor is not None:
            path += f"&since={slot.cursor}&limit={EVENTS_LIMIT}"
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        target = slot.target
        slot.in_flight = True
        error = fetcher.start(slot, target.host, target.port, http_request(target.host, target.port, path, headers),
                              self.timeout_s)
        if error is not None:
            self._receive(slot, error)

    def _receive(self, slot: _Slot, result: tuple[int, str, bytes] | BaseException) -> None:
        slot.in_flight = False
        try:
            self._read(slot, result)
        except Exception as exc:  # an answer nobody foresaw: the rank shows it, polling goes on
            self._failed(slot, f"unexpected answer: {type(exc).__name__}: {exc}")

    def _read(self, slot: _Slot, result: tuple[int, str, bytes] | BaseException) -> None:
        if isinstance(result, BaseException):
            self._failed(slot, str(result) if isinstance(result, FetchError)
                         else describe_os_error(result, self.timeout_s))
            return
        status, reason, body = result
        if status != 200:
            self._failed(slot, http_status_error(status, reason, body, bool(self.token)))
            return
        try:
            doc = check_snapshot(json_loads(body))
        except ValueError as exc:  # JSON that does not parse, or not a snapshot
            self._failed(slot, f"not a zeromon snapshot: {exc}")
            return
        target = slot.target
        start_ns = doc.get("start_ns")
        previous = slot.view
        if slot.start_ns is not None and start_ns != slot.start_ns:
            # Another agent process answers for this rank (a restart): its steps and events start anew.
            previous, slot.cursor, slot.full_steps = None, None, True
            slot.phases.clear()
            slot.parsed.clear()
        slot.start_ns = start_ns if isinstance(start_ns, int) else None
        self._read_events(slot, doc)
        view = rank_view_from_snapshot(doc, str(target), previous, tuple(slot.phases), slot.parsed)
        answered = view.steps
        # No steps yet, or a gap after the steps already known: ask for all of them next time.
        slot.full_steps = not answered
        if previous is not None and previous.steps and answered:
            slot.full_steps = answered[0].step > previous.steps[-1].step + 1
            view = dataclasses.replace(view, steps=_merge_steps(previous.steps, answered))
        with self._lock:
            slot.view, slot.error, slot.last_ok = view, None, time.monotonic()
            if view.rank is not None:
                slot.rank = view.rank

    def _steps_to_ask(self, slot: _Slot) -> int:
        """Steps the agent can have finished since the last answer, twice over: 64 steps of 40 KB
        parsed every second are most of a poll's cost when steps take longer than the poll interval."""
        view, last_ok = slot.view, slot.last_ok
        if view is None or last_ok is None or len(view.steps) < 2:
            return STEPS_ASKED
        recent = view.steps[-8:]
        step_s = max(1e-3, (recent[-1].end_ns - recent[0].end_ns) / 1e9 / (len(recent) - 1))
        since_s = time.monotonic() - last_ok + self.interval_s
        return max(4, min(STEPS_ASKED, 2 * math.ceil(since_s / step_s) + 2))

    def _failed(self, slot: _Slot, error: str) -> None:
        with self._lock:
            slot.error = error

    def _read_events(self, slot: _Slot, doc: dict[str, Any]) -> None:
        """Phase spans from the events since the last poll; the cursor moves on (skipping ahead when far behind)."""
        cursor = doc.get("cursor")
        if not self.events or not isinstance(cursor, int):
            return
        if slot.cursor is not None and cursor < slot.cursor:
            slot.cursor = None  # the agent's numbering went back: it is another process
            slot.phases.clear()
        if slot.cursor is None:
            slot.cursor = max(0, cursor - PHASES_BACKFILL)
            return
        newest = slot.cursor
        events = doc.get("events")
        if isinstance(events, list) and events:
            # Most events are collectives, which the view does not keep: only the phases become objects.
            for event in [e for e in events if isinstance(e, dict) and e.get("kind") == "phase"]:
                span = _make(PhaseSpan, event)
                if span is not None:
                    slot.phases.append(span)
            last = events[-1]  # the agent sends them in cursor order
            if isinstance(last, dict) and isinstance(last.get("cursor"), int):
                newest = max(newest, last["cursor"])
        slot.cursor = max(newest, cursor - EVENTS_LIMIT)


def _merge_steps(old: tuple[StepSummary, ...], new: tuple[StepSummary, ...]) -> tuple[StepSummary, ...]:
    """The newest STEPS_ASKED steps of both, by step number (the newer answer wins)."""
    first_new = new[0].step
    kept = [s for s in old if s.step < first_new]
    return (*kept, *new)[-STEPS_ASKED:]
