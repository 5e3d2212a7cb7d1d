"""Where the live agents are: one small JSON file per rank's HTTP endpoint (stdlib only).

Each agent writes its entry twice, atomically (a temporary file renamed over the target, so a
reader never sees half a file): in the run folder, ``<run_dir>/endpoints/rank-<R>.json``, which
`zeromon targets RUN_DIR` reads, and in the user-level index (``ZEROMON_REGISTRY``, by default
``~/.cache/zeromon/agents``) as ``<host>-<pid>.json``, which lets a client find the newest local
run by itself. The user-level file is removed when the agent stops cleanly; a crashed agent leaves
one behind, which ``pid_alive`` tells apart on the same host.

Ports are reused: once a run ends, another job's rank may listen on its old port. Each entry
therefore carries the agent's ``agent_id``, which clients send as ``?agent=<id>`` (Prometheus too,
through the file_sd group's ``__param_agent`` label); an agent asked for another id answers 404.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

from zeromon.model.classes import frozen

SCHEMA = "zeromon.endpoint/1"
ENDPOINTS_DIR = "endpoints"  # inside a run folder
DEFAULT_REGISTRY = "~/.cache/zeromon/agents"
REGISTRY_ENV = "ZEROMON_REGISTRY"
AGENT_PARAM = "agent"  # the query parameter that names the agent a client means (its agent_id)


@frozen
class EndpointEntry:
    """One rank's endpoint: where it listens and which run and process it belongs to."""

    run_dir: str  # absolute path of the run folder
    run_id: str  # the run folder's name
    job: str
    host: str
    address: str  # the address the server is bound to ("127.0.0.1", "0.0.0.0", ...)
    port: int
    url: str  # http://<address, or 127.0.0.1 for a wildcard bind>:<port>
    rank: int
    local_rank: int
    world_size: int
    pid: int
    start_ns: int  # Unix ns when the endpoint started
    token_required: bool
    # Keys added later; an entry written without them reads as "" (unknown).
    agent_id: str = ""  # random, this agent's own: an agent asked for another one answers 404
    launch_id: str = ""  # the process that started the ranks on this host (pid and start time): one per launch

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any) -> EndpointEntry:
        """Raises ValueError naming the first missing or mistyped key."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        schema = data.get("schema")
        if not isinstance(schema, str) or schema.split("/")[0] != SCHEMA.split("/")[0]:
            raise ValueError(f"schema {schema!r} is not {SCHEMA!r}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.default is not MISSING:
                    continue
                raise ValueError(f"missing key {f.name!r}")
            value = data[f.name]
            want = {"int": int, "bool": bool, "str": str}[str(f.type)]
            # bool is an int subclass: a port of `true` is refused, a token_required of 1 too.
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ValueError(f"key {f.name!r} should be {want.__name__}, got {type(value).__name__}")
            values[f.name] = value
        return cls(**values)

    @property
    def target(self) -> str:
        """``host:port`` as a scraper on another machine reaches it (the bound address when specific)."""
        reach = self.host if self.address in ("0.0.0.0", "::", "") else self.address
        return f"{reach}:{self.port}"


def url_for(address: str, port: int) -> str:
    host = "127.0.0.1" if address in ("0.0.0.0", "") else "::1" if address == "::" else address
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def registry_dir(environ: dict[str, str] | None = None) -> Path:
    """The user-level index folder: ZEROMON_REGISTRY, else ~/.cache/zeromon/agents."""
    env = os.environ if environ is None else environ
    # os.path's: '~name' of an unknown user stays as written, where Path.expanduser raises RuntimeError
    return Path(os.path.expanduser(env.get(REGISTRY_ENV) or DEFAULT_REGISTRY))


def run_entry_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / ENDPOINTS_DIR / f"rank-{rank}.json"


def user_entry_path(folder: str | Path, host: str, pid: int) -> Path:
    return Path(folder) / f"{host}-{pid}.json"


def write_entry(path: str | Path, entry: EndpointEntry) -> None:
    """Write ``entry`` to ``path`` atomically, creating the folder. Raises OSError."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(entry.to_dict(), handle, indent=1)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_entry(path: str | Path) -> None:
    """Remove an entry; one that is already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()


def read_entry(path: str | Path) -> EndpointEntry:
    """One entry. Raises ValueError with the file's name and what is wrong with it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    try:
        return EndpointEntry.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: not a zeromon endpoint entry: {exc}") from None


def read_entries(folder: str | Path, problems: list[str] | None = None) -> list[EndpointEntry]:
    """Every readable entry in ``folder`` (``*.json``, not recursive), ordered by (run, rank).

    A missing folder gives no entries. Unreadable files are skipped; each one's reason is appended
    to ``problems`` when given (a file being replaced at that moment reads whole, thanks to the rename).
    """
    folder = Path(folder)
    try:
        paths = sorted(p for p in folder.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        if problems is not None:
            problems.append(f"{folder}: cannot list: {exc.strerror or exc}")
        return []
    entries: list[EndpointEntry] = []
    for path in paths:
        try:
            entries.append(read_entry(path))
        except ValueError as exc:
            if problems is not None:
                problems.append(str(exc))
    return sorted(entries, key=lambda e: (e.run_dir, e.rank, e.pid))


def pid_alive(entry: EndpointEntry) -> bool | None:
    """Whether the entry's process still runs: True/False on this host, None for another host."""
    if entry.host != socket.gethostname() and entry.host != os.uname().nodename:
        return None
    if entry.pid <= 0:
        return False
    try:
        os.kill(entry.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True
