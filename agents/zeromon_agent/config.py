"""The agent's settings: keyword arguments to attach(), else ZEROMON_* environment variables.

A bad value is refused with a message that names the variable and what it accepts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from zeromon.errors import ZeromonError
from zeromon.model.units import parse_size

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected one of 1, 0, true, false, yes, no, on, off")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer >= {minimum}") from None
        if value < minimum:
            raise ValueError(f"expected an integer >= {minimum}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("expected a number of seconds >= 0") from None
    if value < 0:
        raise ValueError("expected a number of seconds >= 0")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise ValueError("expected a number of seconds > 0")
    return value


def _memory_every(text: str) -> int:
    if text.strip().lower() == "auto":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise ValueError("expected 'auto' or an integer >= 1") from None
    if value < 1:
        raise ValueError("expected 'auto' or an integer >= 1")
    return value


def _size(text: str) -> int:
    return parse_size(text)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("expected a port from 0 to 65535 (0: any free port)") from None
    if not 0 <= value <= 65535:
        raise ValueError("expected a port from 0 to 65535 (0: any free port)")
    return value


def _address(text: str) -> str:
    value = text.strip()
    if not value or any(c.isspace() or c in "/[]" for c in value):
        raise ValueError("expected an IP address or host name such as 127.0.0.1 or 0.0.0.0")
    return value


@dataclass(frozen=True, slots=True)
class AgentConfig:
    enabled: bool = True
    out_dir: str | None = None  # None: ./zeromon-runs/<launch time>-<launcher pid>
    record: bool = True  # write rank-<r>.jsonl
    job: str | None = None
    buffer_events: int = 65536  # raw ring-buffer capacity; beyond it the oldest are dropped and counted
    flush_interval_s: float = 0.2
    async_sample_every: int = 16  # 1 in N async collectives gets an exact completion callback; 0: none
    memory_every: int = 0  # category walk every N steps; 0 = auto (<= ~1% of step time)
    activations: bool = True
    device_interval_s: float = 1.0  # NVML sampling period; 0 turns it off
    cpu_capacity: int | None = None  # override of the CPU memory capacity in bytes
    memory_history: bool = False  # CUDA: record allocator history so an OOM can write a snapshot
    recent_events: int = 4096  # finalized events kept in memory for live clients
    endpoint: bool = True  # serve /metrics, /api/v1/snapshot, /healthz over HTTP
    port: int = 9470  # base port: a rank listens on port + local rank (else the next free); 0: any free port
    bind: str = "127.0.0.1"  # the endpoint's address; another one only when asked
    token: str | None = field(default=None, repr=False)  # when set, every route needs "Authorization: Bearer <token>"
    registry: str | None = None  # user-level endpoint index; None: ~/.cache/zeromon/agents


# field -> (environment variable, parser, accepted values for the message)
ENV: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "enabled": ("ZEROMON_ENABLE", _bool, "1 or 0"),
    "out_dir": ("ZEROMON_OUT", str, "a folder"),
    "record": ("ZEROMON_RECORD", _bool, "1 or 0"),
    "job": ("ZEROMON_JOB", str, "a name"),
    "buffer_events": ("ZEROMON_BUFFER_EVENTS", _int_at_least(1024), "an integer >= 1024"),
    "flush_interval_s": ("ZEROMON_FLUSH_INTERVAL", _positive_seconds, "seconds > 0"),
    "async_sample_every": ("ZEROMON_ASYNC_SAMPLE_EVERY", _int_at_least(0), "an integer >= 0"),
    "memory_every": ("ZEROMON_MEMORY_EVERY", _memory_every, "'auto' or an integer >= 1"),
    "activations": ("ZEROMON_ACTIVATIONS", _bool, "1 or 0"),
    "device_interval_s": ("ZEROMON_DEVICE_INTERVAL", _seconds, "seconds >= 0 (0 = off)"),
    "cpu_capacity": ("ZEROMON_CPU_CAPACITY", _size, "a size such as 24GiB or 80GB"),
    "memory_history": ("ZEROMON_MEMORY_HISTORY", _bool, "1 or 0"),
    "recent_events": ("ZEROMON_RECENT_EVENTS", _int_at_least(16), "an integer >= 16"),
    "endpoint": ("ZEROMON_ENDPOINT", _bool, "1 or 0"),
    "port": ("ZEROMON_PORT", _port, "a port from 0 to 65535"),
    "bind": ("ZEROMON_BIND", _address, "an IP address or host name"),
    "token": ("ZEROMON_TOKEN", str, "a secret string"),
    "registry": ("ZEROMON_REGISTRY", str, "a folder"),
}


def load_config(environ: Mapping[str, str] | None = None, **overrides: Any) -> AgentConfig:
    """Settings from the environment, then keyword overrides. Raises ZeromonError naming the variable."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, (var, parse, accepted) in ENV.items():
        raw = environ.get(var)
        if raw is None or raw == "":
            continue
        try:
            values[name] = parse(raw)
        except ValueError as exc:
            raise ZeromonError(f"{var}={raw!r} is not valid: {exc}", hint=f"{var} accepts {accepted}") from None
    known = {f.name for f in fields(AgentConfig)}
    for name, value in overrides.items():
        if name not in known:
            raise ZeromonError(f"attach() got an unknown setting {name!r}",
                               hint="settings: " + ", ".join(sorted(known)))
        if value is not None:
            values[name] = value
    return AgentConfig(**values)
