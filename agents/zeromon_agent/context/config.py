"""The agent's settings: keyword arguments to attach(), else ZEROMON_* environment variables.

Every number goes through zeromon.model.numbers (finite, in range, with a unit where one is meant). A bad
keyword to attach() raises ZeromonError naming it; a bad variable does too where a command checks them
(``zeromon run``, before anything starts), but inside a training process it is a notice (on stderr and in
the recording) and the default: a typo in the environment must not stop the training it would watch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import field, fields
from typing import Any

from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen
from zeromon.model.numbers import CAPACITY, GIB, PORT, RECORDING_SIZE, Count, Real, Size

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

BUFFER_EVENTS = Count(1024, 2**24)
FLUSH_SECONDS = Real(0.01, 3600.0, "seconds")  # below 10 ms the writer would wake more than the training steps
ASYNC_SAMPLE_EVERY = Count(1, 10**6, zero="none")
DEVICE_TIMING_EVERY = Count(1, 10**6)
MEMORY_EVERY = Count(1, 10**6)
DEVICE_SECONDS = Real(0.05, 3600.0, "seconds", zero="off")  # an NVML query is slow: at most 20 a second
RECENT_EVENTS = Count(16, 2**20)
HANG_SECONDS = Real(1.0, 7 * 86400.0, "seconds", zero="auto: the larger of 30 s and ten median steps")
HANG_SETUP_SECONDS = Real(1.0, 7 * 86400.0, "seconds", zero="auto: 300 s, or ZEROMON_HANG_AFTER where that is longer")


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("must be one of 1, 0, true, false, yes, no, on, off")


def _check_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _bool(value)
    raise ValueError("must be True or False")


def _memory_every(text: str) -> int:
    if text.strip().lower() == "auto":
        return 0
    try:
        return MEMORY_EVERY.parse(text)
    except ValueError:
        raise ValueError(f"must be 'auto' or {MEMORY_EVERY.accepts}") from None


def _check_memory_every(value: object) -> int:
    if isinstance(value, str):
        return _memory_every(value)
    if value == 0 and not isinstance(value, bool):
        return 0  # the field's own "auto"
    try:
        return MEMORY_EVERY.check(value)
    except ValueError:
        raise ValueError(f"must be 'auto' (0) or {MEMORY_EVERY.accepts}") from None


# The recording's form: "compact" (rank-<r>.zmr, format 2.x, an order of magnitude smaller) or "jsonl"
# (rank-<r>.jsonl, format 1.3, for tools that read the lines as they are written).
RECORD_FORMATS = ("compact", "jsonl")


def _record_format(text: str) -> str:
    value = text.strip().lower()
    if value not in RECORD_FORMATS:
        raise ValueError("must be compact or jsonl")
    return value


def _address(text: str) -> str:
    value = text.strip()
    if not value or any(c.isspace() or c in "/[]" for c in value):
        raise ValueError("must be an IP address or host name such as 127.0.0.1 or 0.0.0.0")
    try:  # what socket.bind does with a name: one it cannot encode fails there with a TypeError
        value.encode("idna")
    except UnicodeError:
        raise ValueError("must be an IP address or host name such as 127.0.0.1 or 0.0.0.0") from None
    return value


def _check_text(parse: Callable[[str], Any]) -> Callable[[object], Any]:
    def check(value: object) -> Any:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        return parse(value)

    return check


def _check_number(spec: Count | Real | Size) -> Callable[[object], Any]:
    def check(value: object) -> Any:
        return spec.parse(value) if isinstance(value, str) else spec.check(value)

    return check


# How many ports a rank tries from its own (port + local rank) up, when that one is taken
# (zeromon_agent.serve.httpserver.bind); zeromon doctor says the range.
PORT_TRIES = 64


@frozen
class AgentConfig:
    enabled: bool = True
    out_dir: str | None = None  # None: ./zeromon-runs/<launch time>-<launcher pid>
    record: bool = True  # write the rank's recording: rank-<r>.zmr (record_format "compact") or rank-<r>.jsonl
    record_format: str = "compact"
    job: str | None = None
    buffer_events: int = 65536  # raw ring-buffer capacity; beyond it the oldest are dropped and counted
    # The recording's flush: what a killed rank may lose. The recorder passes every second all the same (or
    # every flush, if shorter): the live views' age. A flush is a compact segment, which costs a cold start
    # whatever it holds, so the longer the interval, the less the recorder's thread spends a collective
    # (tests/bench/bench_recorder_cpu.py), and longer segments compress better. TensorBoard's SummaryWriter
    # flushes every 120 s.
    flush_interval_s: float = 5.0
    max_disk: int = GIB  # a rank's recording: detail is thinned as it fills (zeromon_agent.recorder.detail)
    async_sample_every: int = 16  # 1 in N async collectives gets an exact completion callback; 0: none
    # GPU: the steps whose collectives and phases are timed with CUDA events: the first two, 1 in 8 up to step 256,
    # then 1 in N (zeromon_agent.hooks.state.timed_step); the others cost a collective no event (docs/agent.md). 32: a long
    # run's timed steps add a fraction of a µs to an untimed step's cost a collective (tests/bench/RESULTS.md)
    device_timing_every: int = 32
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
    hang_after_s: float = 0.0  # no progress for this long makes a rank suspect; 0: auto (zeromon_agent.recorder.progress)

    @property
    def port_tries(self) -> int:
        """How many ports a rank tries for its endpoint, from port + local rank up (PORT_TRIES)."""
        return PORT_TRIES
    hang_after_setup_s: float = 0.0  # the same before the first step ends (loading, compiling); 0: auto


@frozen
class Setting:
    var: str  # the environment variable
    parse: Callable[[str], Any]  # its text -> the value; ValueError with the reason
    check: Callable[[object], Any]  # an attach() keyword's value -> the value; ValueError with the reason
    accepts: str  # in words, for the hint


def _switch(var: str) -> Setting:
    return Setting(var, _bool, _check_bool, "1 or 0")


def _text(var: str, accepts: str, parse: Callable[[str], Any] = str) -> Setting:
    return Setting(var, parse, _check_text(parse), accepts)


def _folder(var: str) -> Setting:
    def check(value: object) -> str:
        if not isinstance(value, str | os.PathLike):
            raise ValueError("must be a folder (a str or a path)")
        return os.fspath(value)  # type: ignore[return-value]

    return Setting(var, str, check, "a folder")


def _number(var: str, spec: Count | Real | Size) -> Setting:
    return Setting(var, spec.parse, _check_number(spec), spec.accepts)


# field -> its setting
ENV: dict[str, Setting] = {
    "enabled": _switch("ZEROMON_ENABLE"),
    "out_dir": _folder("ZEROMON_OUT"),
    "record": _switch("ZEROMON_RECORD"),
    "record_format": _text("ZEROMON_FORMAT", "compact or jsonl", _record_format),
    "job": _text("ZEROMON_JOB", "a name"),
    "buffer_events": _number("ZEROMON_BUFFER_EVENTS", BUFFER_EVENTS),
    "flush_interval_s": _number("ZEROMON_FLUSH_INTERVAL", FLUSH_SECONDS),
    "max_disk": _number("ZEROMON_MAX_DISK", RECORDING_SIZE),
    "async_sample_every": _number("ZEROMON_ASYNC_SAMPLE_EVERY", ASYNC_SAMPLE_EVERY),
    "device_timing_every": _number("ZEROMON_DEVICE_TIMING_EVERY", DEVICE_TIMING_EVERY),
    "memory_every": Setting("ZEROMON_MEMORY_EVERY", _memory_every, _check_memory_every,
                            f"'auto' or {MEMORY_EVERY.accepts}"),
    "activations": _switch("ZEROMON_ACTIVATIONS"),
    "device_interval_s": _number("ZEROMON_DEVICE_INTERVAL", DEVICE_SECONDS),
    "cpu_capacity": _number("ZEROMON_CPU_CAPACITY", CAPACITY),
    "memory_history": _switch("ZEROMON_MEMORY_HISTORY"),
    "recent_events": _number("ZEROMON_RECENT_EVENTS", RECENT_EVENTS),
    "endpoint": _switch("ZEROMON_ENDPOINT"),
    "port": _number("ZEROMON_PORT", PORT),
    "bind": _text("ZEROMON_BIND", "an IP address or host name", _address),
    "token": _text("ZEROMON_TOKEN", "a secret string"),
    "registry": _folder("ZEROMON_REGISTRY"),
    "hang_after_s": _number("ZEROMON_HANG_AFTER", HANG_SECONDS),
    "hang_after_setup_s": _number("ZEROMON_HANG_AFTER_SETUP", HANG_SETUP_SECONDS),
}


def load_config(environ: Mapping[str, str] | None = None, notices: list[str] | None = None,
                **overrides: Any) -> AgentConfig:
    """Settings from the environment, then keyword overrides.

    A bad variable raises ZeromonError naming it (``ZEROMON_FLUSH_INTERVAL='nan': must be seconds from
    0.01 to 3600``), or, when ``notices`` is a list (inside training), is said there and the default
    kept. A bad or unknown keyword always raises ZeromonError naming it: it is the caller's own code.
    """
    environ = os.environ if environ is None else environ
    defaults = AgentConfig()
    values: dict[str, Any] = {}
    for name, setting in ENV.items():
        raw = environ.get(setting.var)
        if raw is None or raw == "":
            continue
        try:
            values[name] = setting.parse(raw)
        except ValueError as exc:
            message = f"{setting.var}={raw!r}: {exc}"
            if notices is None:
                said = setting.accepts in message
                raise ZeromonError(message, hint=None if said else f"{setting.var} takes {setting.accepts}") from None
            default = getattr(defaults, name)
            instead = "its default" if default is None else f"the default, {default}"
            notices.append(f"{message} (zeromon uses {instead}, instead)")
    known = {f.name for f in fields(AgentConfig)}
    for name, value in overrides.items():
        if name not in known:
            raise ZeromonError(f"attach() got an unknown setting {name!r}",
                               hint="settings: " + ", ".join(sorted(known)))
        if value is None:
            continue
        setting = ENV[name]
        try:
            values[name] = setting.check(value)
        except ValueError as exc:
            shown = "..." if name == "token" else repr(value)  # a secret stays off the terminal
            raise ZeromonError(f"attach({name}={shown}): {exc}",
                               hint=f"{name} takes what {setting.var} takes: {setting.accepts}") from None
    return AgentConfig(**values)
