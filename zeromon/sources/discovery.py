"""Finding the live agents: ``host:port`` targets, a run folder's endpoints, the newest local run.

Every agent registers its endpoint (zeromon.model.registry) in its run folder,
``<run_dir>/endpoints/rank-<R>.json``, and in the user-level index (``ZEROMON_REGISTRY``). The run
folder lists every rank of a run (all of them when the folder is on a shared file system); the
user-level index lists the agents of this machine, which is how a client with no arguments finds
the newest local run. This module reads both and writes Prometheus's file_sd target lists.

A run folder used again keeps the entries of the launch before (a rank that the new launch does not
have): of each host's entries for a run folder, only the newest launch's count (``launch_id``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen
from zeromon.model.registry import (
    AGENT_PARAM,
    ENDPOINTS_DIR,
    EndpointEntry,
    pid_alive,
    read_entry,
    registry_dir,
)

_TARGET_HINT = "a target is host:port, e.g. 127.0.0.1:9470 (an IPv6 address in brackets: [::1]:9470)"


@frozen
class Target:
    """Where one agent's endpoint listens."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_target(text: str, what: str = "target") -> Target:
    """``host:port`` (``http://`` and a trailing ``/`` are tolerated). ZeromonError naming ``what``."""
    spec = text.strip()
    for prefix in ("http://", "https://"):
        if spec.startswith(prefix):
            spec = spec[len(prefix):]
    spec = spec.rstrip("/")
    if spec.startswith("["):  # [v6]:port
        host, sep, rest = spec[1:].partition("]")
        port_text = rest[1:] if sep and rest.startswith(":") else ""
    elif ":" not in spec:
        raise ZeromonError(f"{what} {text!r}: no port", hint=_TARGET_HINT)
    else:
        host, _, port_text = spec.rpartition(":")
        if ":" in host:
            raise ZeromonError(f"{what} {text!r}: an IPv6 address needs brackets", hint=_TARGET_HINT)
    if not host:
        raise ZeromonError(f"{what} {text!r}: no host", hint=_TARGET_HINT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        shown = port_text or "(none)"
        raise ZeromonError(f"{what} {text!r}: the port {shown!r} is not a number from 1 to 65535",
                           hint=_TARGET_HINT)
    return Target(host, int(port_text))


def this_host(host: str) -> bool:
    return host in (socket.gethostname(), os.uname().nodename)


def entry_target(entry: EndpointEntry) -> Target:
    """Where a client reaches an entry's endpoint: from this host its URL (127.0.0.1 for a wildcard
    bind); from another host the bound address, or the host's name for a wildcard bind."""
    where = entry.url if this_host(entry.host) else entry.target
    return parse_target(where, what=f"endpoint of rank {entry.rank} ({entry.run_dir})")


def agent_query(entry: EndpointEntry | None) -> str:
    """``&agent=<agent_id>`` for a request to ``entry``'s agent (any other agent on that port answers
    404); "" without an entry or an id."""
    if entry is None or not entry.agent_id:
        return ""
    return f"&{AGENT_PARAM}={urllib.parse.quote(entry.agent_id, safe='')}"


class EntryFolder:
    """A registry folder, read again cheaply: a file is parsed only when its size or mtime changed.

    A poller that looks for new agents every second reads a few stat() results, not 64 JSON files.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._cache: dict[str, tuple[tuple[int, int], EndpointEntry | None, str | None]] = {}

    def read(self, problems: list[str] | None = None) -> list[EndpointEntry]:
        """The readable entries of each run folder's newest launch per host (``current_launches``),
        ordered by (run, rank, pid); unreadable ones named in ``problems``."""
        try:
            listing = [e for e in os.scandir(self.folder) if e.name.endswith(".json") and not e.name.startswith(".")]
        except (FileNotFoundError, NotADirectoryError):
            self._cache.clear()
            return []
        except OSError as exc:
            if problems is not None:
                problems.append(f"{self.folder}: cannot list: {exc.strerror or exc}")
            return []
        cache: dict[str, tuple[tuple[int, int], EndpointEntry | None, str | None]] = {}
        for item in listing:
            try:
                st = item.stat()
            except OSError:  # removed between the listing and now: an agent that just stopped
                continue
            key = (st.st_mtime_ns, st.st_size)
            cached = self._cache.get(item.name)
            if cached is None or cached[0] != key:
                try:
                    cached = (key, read_entry(item.path), None)
                except ValueError as exc:
                    cached = (key, None, str(exc))
            cache[item.name] = cached
        self._cache = cache
        entries: list[EndpointEntry] = []
        for _key, entry, problem in cache.values():
            if entry is not None:
                entries.append(entry)
            elif problem is not None and problems is not None:
                problems.append(problem)
        return sorted(current_launches(entries), key=lambda e: (e.run_dir, e.rank, e.pid))


def current_launches(entries: list[EndpointEntry]) -> list[EndpointEntry]:
    """The entries of the newest launch (the one whose agent started last) of each run folder on each
    host: a rank that only the launch before had is not one of this run's. A launch spans hosts, and
    each host's launcher has its own id, hence one newest launch per host."""
    newest: dict[tuple[str, str], EndpointEntry] = {}
    for entry in entries:
        key = (entry.run_dir, entry.host)
        if key not in newest or entry.start_ns > newest[key].start_ns:
            newest[key] = entry
    return [e for e in entries if e.launch_id == newest[(e.run_dir, e.host)].launch_id]


def run_endpoints_folder(run_dir: str | Path) -> Path:
    return Path(run_dir) / ENDPOINTS_DIR


@frozen
class LocalRun:
    """A run found through the user-level index."""

    run_dir: str
    start_ns: int  # its newest agent's start
    alive: bool  # at least one of its agents' processes is still running (or runs on another host): always,
    # as local_runs skips the entries of agents whose process is gone
    entries: tuple[EndpointEntry, ...]  # its agents in the user-level index whose process runs (or may)


def local_runs(registry: str | Path | EntryFolder | None = None, problems: list[str] | None = None) -> list[LocalRun]:
    """The runs that have live agents in the user-level index, newest first. Entries whose process is
    gone from this host (a killed agent's, left behind) are skipped.

    ``registry``: the index folder (default ZEROMON_REGISTRY), or an EntryFolder of it to read again cheaply.
    """
    folder = registry if isinstance(registry, EntryFolder) else EntryFolder(registry_dir() if registry is None
                                                                            else Path(registry))
    by_run: dict[str, list[EndpointEntry]] = {}
    for entry in folder.read(problems):
        # A killed agent leaves its user-level entry behind (a clean stop removes it): one whose process
        # is gone from this host is skipped, so that a dead run is never the newest one followed.
        if pid_alive(entry) is not False:
            by_run.setdefault(entry.run_dir, []).append(entry)
    runs = [LocalRun(run_dir=run_dir, start_ns=max(e.start_ns for e in entries), alive=True, entries=tuple(entries))
            for run_dir, entries in by_run.items()]
    return sorted(runs, key=lambda r: r.start_ns, reverse=True)


def newest_local_run(registry: str | Path | EntryFolder | None = None,
                     problems: list[str] | None = None) -> LocalRun | None:
    runs = local_runs(registry, problems)
    return runs[0] if runs else None


def run_to_follow(runs: list[LocalRun], followed: str | Path | None, followed_start_ns: int) -> LocalRun | None:
    """Of ``runs`` (local_runs), the one a client following "the newest local run" should watch now;
    None: keep ``followed``.

    A run that starts later takes over. A run that has ended keeps its place against older runs'
    leftovers (its ranks then read as down), but gives way to an older run whose processes are still
    running: a short run started beside a long one must not leave the long one unwatched.
    """
    if not runs:  # local_runs: live runs first, newest first
        return None
    best = runs[0]
    if followed is None or best.start_ns > followed_start_ns:
        return best if followed is None or Path(best.run_dir) != Path(followed) else None
    if Path(best.run_dir) == Path(followed) or not best.alive:
        return None
    current = next((r for r in runs if Path(r.run_dir) == Path(followed)), None)
    return best if current is None or not current.alive else None


def run_entries(run_dir: str | Path, problems: list[str] | None = None) -> list[EndpointEntry]:
    """The endpoints registered in a run folder, one per rank: the newest entry where a rank has two."""
    newest: dict[int, EndpointEntry] = {}
    for entry in EntryFolder(run_endpoints_folder(run_dir)).read(problems):
        if entry.rank not in newest or entry.start_ns > newest[entry.rank].start_ns:
            newest[entry.rank] = entry
    return [newest[r] for r in sorted(newest)]


def resolve_run_dir(run_dir: str | None, what: str = "RUN_DIR") -> Path:
    """The run folder to use: ``run_dir`` itself, else the newest local run in the user-level index.

    ZeromonError when ``run_dir`` is not a folder or, without it, when the index lists no agent.
    """
    if run_dir is not None:
        path = Path(run_dir)
        if path.is_file():
            raise ZeromonError(f"{what} {run_dir}: a file, not a run folder; give the folder it is in "
                               f"({path.parent})")
        if not path.is_dir():
            raise ZeromonError(f"{what} {run_dir}: no such run folder",
                               hint="a run folder is the --out of `zeromon run` (ZEROMON_OUT)")
        return path
    registry = registry_dir()
    problems: list[str] = []
    newest = newest_local_run(registry, problems)
    if newest is None:
        detail = f"; unreadable: {problems[0]}" if problems else ""
        raise ZeromonError(f"no local run found: {registry} (the user-level index of local agents, "
                           f"ZEROMON_REGISTRY) lists no agent{detail}",
                           hint=f"name the run folder ({what}), or start a run with the agent's endpoint on "
                                "(ZEROMON_ENDPOINT=1, the default)")
    return Path(newest.run_dir)


def file_sd_groups(entries: list[EndpointEntry]) -> list[dict[str, Any]]:
    """Prometheus file_sd groups: one per rank, its ``host:port`` as the target, by run and rank.

    The metrics carry ``rank``, ``job`` and ``host`` themselves; the scrape config keeps them with
    ``honor_labels: true``. The ``zeromon_run`` label tells runs apart in PromQL. ``__param_agent``
    makes Prometheus scrape ``/metrics?agent=<agent_id>``: once the rank has ended, whatever agent
    takes its port (the next job's: every job starts at the same base port) answers 404, so the
    target is down (``up`` 0) instead of filing another job's series under this run.
    """
    groups = []
    for entry in sorted(entries, key=lambda e: (e.run_id, e.rank)):
        labels = {"zeromon_run": entry.run_id}
        if entry.agent_id:  # an entry from before agent ids: scraped without one
            labels[f"__param_{AGENT_PARAM}"] = entry.agent_id
        groups.append({"targets": [entry.target], "labels": labels})
    return groups


def write_atomically(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` by a rename, so that a reader (Prometheus's file_sd) never sees half of it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def file_sd_text(entries: list[EndpointEntry]) -> str:
    return json.dumps(file_sd_groups(entries), indent=2) + "\n"
