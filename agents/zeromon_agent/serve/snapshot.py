"""The /api/v1/snapshot document, schema ``zeromon.snapshot/1`` (docs/snapshot.md documents it for clients),
rendered from a reader's View (zeromon_agent.live.view) and the records the recorder published last.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from zeromon.model.events import Record
from zeromon.model.kinds import FIELDS_OF, GETTERS, KIND_OF
from zeromon_agent.compact import unmade_type
from zeromon_agent.live.view import Identity, View

SCHEMA = "zeromon.snapshot/1"
DEFAULT_STEPS = 64
DEFAULT_EVENT_LIMIT = 2000
MAX_EVENT_LIMIT = 20000

_SCALAR_TYPES = frozenset(f"{t}{none}" for t in ("int", "float", "str", "bool") for none in ("", " | None"))
# Per record type, the fields that may hold a mapping (those not declared a scalar), the only ones looked
# at; the values read in one call (codec's getters): a snapshot makes up to 2,000 of these a second.
_MAPPING_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls) if str(f.type) not in _SCALAR_TYPES)
                   for cls in FIELDS_OF}


def record_dict(record: Record) -> dict[str, Any]:
    """A record's fields by name (mappings as plain dicts), as the recording's schema names them."""
    cls = type(record)
    return _with_fields({}, cls, GETTERS[cls](record))


def _with_fields(out: dict[str, Any], cls: type, values: Any) -> dict[str, Any]:
    """``out`` with the fields of a ``cls`` record whose values are ``values`` (in field order), mappings as
    plain dicts."""
    out.update(zip(FIELDS_OF[cls], values, strict=True))
    for name in _MAPPING_FIELDS[cls]:
        value = out[name]
        if isinstance(value, Mapping):
            out[name] = dict(value)
    return out


class SnapshotError(ValueError):
    """A bad query parameter (answered with 400)."""


def _int_param(query: Mapping[str, list[str]], name: str, default: int | None, low: int,
               high: int | None = None) -> int | None:
    values = query.get(name)
    if not values:
        return default
    try:
        value = int(values[-1])
    except ValueError:
        raise SnapshotError(f"?{name}={values[-1]!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"from {low} to {high}"
        raise SnapshotError(f"?{name}={value} is out of range (expected {bound})")
    return value


_KINDS = frozenset(KIND_OF.values())


def _kinds_param(query: Mapping[str, list[str]]) -> frozenset[str] | None:
    """``?kinds=phase,collective``: the kinds of record the events are wanted of (None: every kind)."""
    values = query.get("kinds")
    if not values:
        return None
    kinds = frozenset(kind.strip() for kind in values[-1].split(",") if kind.strip())
    unknown = sorted(kinds - _KINDS)
    if unknown or not kinds:
        what = f"unknown kind {', '.join(map(repr, unknown))}" if unknown else "no kind given"
        raise SnapshotError(f"?kinds={values[-1]!r}: {what} (the kinds: {', '.join(sorted(_KINDS))})")
    return kinds


def build_snapshot(identity: Identity, view: View, query: Mapping[str, list[str]]) -> dict[str, Any]:
    """The /api/v1/snapshot document. ``query``: parsed ``steps``, ``since``, ``limit``, ``kinds`` (SnapshotError
    if bad)."""
    n_steps = _int_param(query, "steps", DEFAULT_STEPS, 0, 100_000) or 0
    since = _int_param(query, "since", None, 0)
    limit = _int_param(query, "limit", DEFAULT_EVENT_LIMIT, 1, MAX_EVENT_LIMIT) or DEFAULT_EVENT_LIMIT
    kinds = _kinds_param(query)
    world = view.run_info.world_size if view.run_info is not None else identity.world_size
    snapshot: dict[str, Any] = {
        "schema": SCHEMA, "t_ns": view.t_ns, "rank": identity.rank, "local_rank": identity.local_rank,
        "world_size": world, "host": identity.host, "pid": identity.pid, "job": identity.job,
        "start_ns": identity.start_ns, "cursor": view.cursor,
        "run_info": record_dict(view.run_info) if view.run_info is not None else None,
        "steps": [record_dict(s) for s in view.steps[len(view.steps) - n_steps:]] if n_steps else [],
        "memory": record_dict(view.memory.with_walk(view.categories)) if view.memory is not None else None,
        "device": record_dict(view.device) if view.device is not None else None,
        "stats": record_dict(view.stats),
        "collectives": [{"op": r.op, "meaning": r.meaning, "calls": r.calls, "bytes": r.bytes,
                         "seconds": r.seconds, "blocked_s": r.blocked_s, "busbw_bytes_s": view.busbw.get(r.op)}
                        for r in view.collectives],
        "oom": view.oom.to_dict() if view.oom is not None else None,
        "findings": [f.to_dict() for f in view.findings],
        "notices": [record_dict(n) for n in view.notices],
        "progress": view.progress.to_dict() if view.progress is not None else None,
    }
    if since is not None:
        events, lost, through = events_since(view.recent, view.cursor, since, limit, kinds)
        snapshot["events"] = events
        snapshot["events_through"] = through
        if lost:
            snapshot["events_lost"] = True
    return snapshot


def events_since(recent: tuple[Any, ...], cursor: int, since: int, limit: int,
                 kinds: frozenset[str] | None = None) -> tuple[list[dict[str, Any]], bool, int]:
    """The oldest ``limit`` records with cursor > since (``recent``'s newest numbered ``cursor``) of ``kinds``
    (None: all), whether some after ``since`` are gone, and the cursor they were looked through (the next
    ``since``: ``cursor`` unless the page is full). A kind left out costs a look at its type, no event (a live
    client that draws phases skips the collectives and memory samples, most of what a step publishes)."""
    first = cursor - len(recent) + 1
    start = max(0, since + 1 - first)
    # Lost: the first kept record is not the one right after `since` (the deque has moved past it).
    lost = bool(recent) and first > since + 1
    if kinds is None:
        events = [_event(first + index, entry) for index, entry in enumerate(recent[start:start + limit], start)]
        return events, lost, events[-1]["cursor"] if len(events) == limit else cursor
    events = []
    for index in range(start, len(recent)):
        entry = recent[index]
        cls = unmade_type(entry) if type(entry) is tuple else type(entry)
        if KIND_OF[cls] in kinds:
            events.append(_event(first + index, entry, cls))
            if len(events) == limit:
                return events, lost, first + index
    return events, lost, cursor


def _event(cursor: int, entry: Any, cls: type | None = None) -> dict[str, Any]:
    """An event of the snapshot: the record's cursor, kind and fields (record_dict's). A record the recorder
    left unmade is read from its values (in field order) without making it, at a fraction of the cost,
    for up to 2,000 of them a snapshot. ``cls``: the entry's record type, where the caller has it."""
    if type(entry) is tuple:
        cls = cls or unmade_type(entry)
        values: Any = entry
    else:
        cls = cls or type(entry)
        values = GETTERS[cls](entry)
    return _with_fields({"cursor": cursor, "kind": KIND_OF[cls]}, cls, values)
