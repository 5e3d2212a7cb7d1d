"""The agent's HTTP endpoint: /metrics, /api/v1/snapshot, /api/v1/stacks and /healthz on one port per rank, served
by zeromon_agent.serve.httpserver (bounded threads, deadlines; the training thread never waits on it).
Rendering is cached (metrics.RENDER_TTL_S, live.view.VIEW_TTL_S), so a scrape storm costs little.

Bind: 127.0.0.1 unless asked (ZEROMON_BIND). Port: ZEROMON_PORT + local rank, else the next free one
up to PORT_TRIES above it (said in a Notice); 0 picks any free port. ZEROMON_TOKEN, when set, is
required on every route as ``Authorization: Bearer <token>`` (401 otherwise; the scheme's case does
not matter, RFC 7235).

Ports are reused from run to run, so a client says which agent it means: ``?agent=<agent_id>`` (the
id in the agent's registry entry; Prometheus sends it from the file_sd list). Asked for another
agent, this one answers 404: a scrape of a run that ended then fails (``up`` 0) rather than reading
the job that took its port.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zeromon.model import registry
from zeromon_agent.hooks.state import STATE
from zeromon_agent.live.view import Identity, LiveData
from zeromon_agent.serve.httpserver import HttpServer, Request, Response, bind, json_response
from zeromon_agent.serve.metrics import MetricsRenderer
from zeromon_agent.serve.snapshot import SnapshotError, build_snapshot

log = logging.getLogger("zeromon.agent")

INLINE_PATHS = frozenset({"/metrics", "/healthz"})  # cheap and cached: answered by the I/O thread
_READS = frozenset({"/metrics", "/api/v1/snapshot"})  # what a live client reads: the recorder passes every second


# --- the agent's routes ---------------------------------------------------------------------------------

class EndpointApp:
    """Routes: /metrics, /api/v1/snapshot, /api/v1/stacks, /healthz; the agent id and token checks in front of all of them."""

    def __init__(self, live: LiveData, metrics: MetricsRenderer, token: str | None, agent_id: str = "") -> None:
        self.live = live
        self.metrics = metrics
        self.agent_id = agent_id
        self._expected = token.encode() if token else None

    def __call__(self, request: Request) -> Response:
        # Before the token: a client of the run that ended learns that, not that it lacks this job's token.
        asked = request.query.get(registry.AGENT_PARAM)
        if asked is not None and asked[-1] != self.agent_id:
            return json_response(404, {"error": "another agent listens on this port now: the agent asked for "
                                                "has stopped (its run ended or the rank restarted elsewhere)",
                                        "agent_mismatch": True})
        if self._expected is not None and not self._authorized(request.headers.get("Authorization")):
            return Response(401, b'{"error":"a bearer token is required (ZEROMON_TOKEN)"}\n',
                            headers=(("WWW-Authenticate", 'Bearer realm="zeromon"'),))
        if request.path in _READS:
            watched = getattr(self.live.recorder, "watched", None)
            if watched is not None:  # passes a second apart while clients read (recorder.WATCHED_S)
                watched()
        if request.path == "/metrics":
            body, content_type = self.metrics.render(request.headers.get("Accept"))
            return Response(200, body, content_type)
        if request.path == "/api/v1/snapshot":
            try:
                document = build_snapshot(self.live.identity, self.live.view(), request.query)
            except SnapshotError as exc:
                return json_response(400, {"error": str(exc)})
            return json_response(200, document)
        if request.path == "/api/v1/stacks":
            # ?agent_frames=1: the program's threads with the agent's own frames (its collective wrappers) kept.
            return json_response(200, self._stacks(request.query.get("agent_frames", ["0"])[-1] in ("1", "true")))
        if request.path == "/healthz":
            return json_response(200, {"status": "ok", "rank": self.live.identity.rank, "agent": self.agent_id})
        return json_response(404, {"error": f"no such route: {request.path}",
                                   "routes": ["/metrics", "/api/v1/snapshot", "/api/v1/stacks", "/healthz"]})

    def _stacks(self, agent_frames: bool = False) -> dict[str, Any]:
        """Every thread's Python stack, read from this (the endpoint's) thread: no ptrace, no pause of the others;
        the program's threads without the agent's frames unless ``agent_frames``."""
        progress = getattr(self.live.recorder, "progress", None)
        threads = progress.stacks(agent_frames) if progress is not None else []
        return {"rank": self.live.identity.rank, "pid": self.live.identity.pid, "t_ns": time.time_ns(),
                "threads": threads}

    def _authorized(self, header: str | None) -> bool:
        """``Bearer <token>``, the scheme in any case (RFC 7235); the token compared in constant time."""
        assert self._expected is not None
        parts = (header or "").split(None, 1)
        scheme = parts[0] if parts else ""
        given = parts[1].strip().encode("utf-8", "replace") if len(parts) == 2 else b""
        # compare_digest runs even for a wrong scheme, so the answer's timing says nothing about the token.
        return hmac.compare_digest(given, self._expected) and scheme.lower() == "bearer"


# --- the agent's side -------------------------------------------------------------------------------------

def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def launch_id() -> str:
    """The launcher of this rank (torchrun, mpirun's daemon, ...) as ``<pid>-<start time in clock ticks>``:
    the same for every rank it started on this host, another for the next launch (a pid may come back,
    with another start time). Only the pid where /proc is missing."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/stat") as f:
            started = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return str(ppid)
    return f"{ppid}-{started}"


class AgentEndpoint:
    """One agent's endpoint: the server, its live data, and its entries in the registry."""

    def __init__(self, server: HttpServer, entry: registry.EndpointEntry, user_entry: Path | None,
                 live: LiveData | None = None) -> None:
        self.server = server
        self.live = live  # what it serves from: the agent's in-process readers share its views
        self.entry = entry
        self.user_entry = user_entry  # its path in the user-level registry, None if it could not be written

    @property
    def url(self) -> str:
        return self.entry.url

    @classmethod
    def start(cls, recorder: Any, *, rank: int, local_rank: int, world_size: int, job: str, run_dir: Any,
              address: str, base_port: int, token: str | None, registry_folder: str | Path,
              notice: Callable[[str, str, str], None]) -> AgentEndpoint:
        """Bind, serve, register. Raises OSError when no port can be bound; registry failures are notices."""
        sock, port = bind(address, base_port, local_rank)
        wanted = base_port + local_rank
        if base_port and port != wanted:
            message = (f"port {wanted} (ZEROMON_PORT {base_port} + local rank {local_rank}) is taken; "
                       f"the endpoint listens on {port}")
            log.warning("zeromon: rank %d: %s", rank, message)
            notice("warning", "endpoint", message)
        bound = str(sock.getsockname()[0])
        if not token and not _loopback(bound):
            # Said by the agent, whichever way it started (zeromon run, attach(), a bootstrap), so that it is
            # in the recording and `zeromon summary`, not only on the launcher's terminal.
            message = (f"the endpoint listens on {bound}:{port} (ZEROMON_BIND={address}) without ZEROMON_TOKEN: "
                       "whoever reaches this machine can read its metrics and snapshots")
            log.warning("zeromon: rank %d: %s", rank, message)
            notice("warning", "endpoint", message)
        host = os.uname().nodename
        start_ns = time.time_ns()
        agent_id = secrets.token_hex(8)
        identity = Identity(rank=rank, local_rank=local_rank, world_size=world_size, host=host, pid=os.getpid(),
                            job=job, start_ns=start_ns)
        live = LiveData(recorder, identity)
        try:
            server = HttpServer(sock, EndpointApp(live, MetricsRenderer(live), token, agent_id),
                                inline_paths=INLINE_PATHS,
                                on_error=getattr(recorder, "state", STATE).hook_error)
        except BaseException:
            sock.close()
            raise
        live.extra_cpu_s = lambda: server.cpu_time_s  # the endpoint's threads count as the agent's CPU
        server.start()
        try:
            run_path = Path(run_dir).resolve()
            entry = registry.EndpointEntry(
                run_dir=str(run_path), run_id=run_path.name, job=job, host=host, address=bound, port=port,
                url=registry.url_for(bound, port), rank=rank, local_rank=local_rank, world_size=world_size,
                pid=identity.pid, start_ns=start_ns, token_required=bool(token), agent_id=agent_id,
                launch_id=launch_id())
        except BaseException:
            server.stop()
            raise
        paths = (registry.run_entry_path(run_path, rank), registry.user_entry_path(registry_folder, host, identity.pid))
        written = []
        for path in paths:
            try:
                registry.write_entry(path, entry)
                written.append(path)
            except OSError as exc:
                notice("warning", "endpoint", f"cannot register the endpoint in {path}: {exc.strerror or exc}")
        log.info("zeromon: rank %d endpoint on %s", rank, entry.url)
        return cls(server, entry, paths[1] if paths[1] in written else None, live)

    def stop(self) -> None:
        """Stop serving; remove the user-level registry entry (the run folder's stays, as history)."""
        self.server.stop()
        # A forked child (a DataLoader worker) that runs the parent's exit handlers must not remove the
        # parent's entry.
        if self.user_entry is not None and os.getpid() == self.entry.pid:
            try:
                registry.remove_entry(self.user_entry)
            except OSError:
                pass
