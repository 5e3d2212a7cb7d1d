"""Every number a person types: one family of parsers for flags, ZEROMON_* variables and config files.

Each kind of number is a small frozen spec (``Count``, ``Real``, ``Size``, ``ParamCount``) that reads
text (``parse``) or a value already typed (``check``: an ``attach()`` keyword, a JSON number), refuses
NaN, infinities, values out of its range and sizes without a unit where one is meant, and says what it
accepts in words (``accepts``) for help texts and hints. A refusal is a ``ValueError`` whose text is the
reason alone ("must be seconds from 0.05 to 86400"); ``where`` puts it in the one message shape that
every front end prints::

    --interval '1e-9': must be seconds from 0.05 to 86400
    ZEROMON_FLUSH_INTERVAL='nan': must be seconds from 0.01 to 3600
    ds.json: zero_optimization.reduce_bucket_size inf: must be a finite number

``flag`` turns a spec into an argparse ``type=`` that raises ``ZeromonError`` with that message, so a
bad flag exits with code 2 through the CLI's one error path. Stdlib only: the agent imports it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Protocol, TypeVar

from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen

T = TypeVar("T", covariant=True)

KIB, MIB, GIB, TIB, PIB = 2**10, 2**20, 2**30, 2**40, 2**50

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "p": 1000**5, "pb": 1000**5,
    "kib": KIB, "mib": MIB, "gib": GIB, "tib": TIB, "pib": PIB,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
# Longer texts are not numbers anyone means; Decimal and int() on them cost time for nothing.
_MAX_TEXT = 100


class Parser(Protocol[T]):
    @property
    def accepts(self) -> str: ...

    def parse(self, text: str) -> T: ...


class Checker(Protocol[T]):
    def check(self, value: object) -> T: ...


def where(name: str, text: object) -> str:
    """How a message names the input: ``--flag 'text'`` for a flag, ``VAR='text'`` for a variable."""
    joiner = "=" if name[:1].isupper() else " "
    return f"{name}{joiner}{text!r}"


def flag(name: str, parser: Parser[T], hint: str | None = None) -> Callable[[str], T]:
    """An argparse ``type=`` for ``name``: the parsed value, or ZeromonError ``--name 'text': reason``
    (not ArgumentTypeError, whose message argparse would reword)."""

    def parse(text: str) -> T:
        try:
            return parser.parse(text)
        except ValueError as exc:
            said = parser.accepts in str(exc)  # else the hint says what the flag takes
            raise ZeromonError(f"{where(name, text)}: {exc}",
                               hint=hint or (None if said else f"{name} takes {parser.accepts}")) from None

    parse.__name__ = name.lstrip("-").replace("-", "_")
    return parse


def parse_flag(name: str, parser: Parser[T], text: str | None, hint: str | None = None) -> T | None:
    """``flag(name, parser)(text)`` for a value that did not come through argparse (a form); None stays None."""
    return None if text is None else flag(name, parser, hint)(text)


def checked(name: str, checker: Checker[T], value: object) -> T:
    """``checker.check(value)`` for a value given in code (a source's interval, a replay's speed set by a
    key), or ZeromonError in the same shape as a flag's: ``replay speed 0: must be a speed factor from ...``."""
    try:
        return checker.check(value)
    except ValueError as exc:
        raise ZeromonError(f"{where(name, value)}: {exc}") from None


def _decimal(text: str, accepts: str) -> Decimal:
    """The number in ``text`` (no unit), finite; ValueError otherwise. Decimal, so that 1e400 is not inf."""
    cleaned = text.strip().replace("_", "")
    if not cleaned or len(cleaned) > _MAX_TEXT:
        raise ValueError(f"is not a number: must be {accepts}")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        raise ValueError(f"is not a number: must be {accepts}") from None
    if not value.is_finite():
        raise ValueError(f"is not finite: must be {accepts}")
    # Past any range zeromon accepts, and arithmetic on 1e999999999 would overflow Decimal's context:
    # a stand-in that still compares as too large (or too small) gives the same range message.
    if value and value.adjusted() > 100:
        return Decimal("1e101").copy_sign(value)
    if value and value.adjusted() < -100:
        return Decimal("1e-101").copy_sign(value)
    return value


@frozen
class Count:
    """A whole number from ``minimum`` to ``maximum``; ``zero`` says what 0 means when 0 is allowed below
    the minimum (``zero="off"``)."""

    minimum: int
    maximum: int
    zero: str | None = None

    @property
    def accepts(self) -> str:
        text = f"an integer from {self.minimum} to {self.maximum}"
        return f"{text}, or 0 ({self.zero})" if self.zero else text

    def parse(self, text: str) -> int:
        value = _decimal(text, self.accepts)
        if value != value.to_integral_value():
            raise ValueError(f"must be a whole number: {self.accepts}")
        return self._in_range(int(value))

    def check(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and math.isfinite(value) and value == int(value):
                return self._in_range(int(value))
            raise ValueError(f"must be {self.accepts}")
        return self._in_range(value)

    def _in_range(self, value: int) -> int:
        if value == 0 and self.zero:
            return 0
        if not self.minimum <= value <= self.maximum:
            raise ValueError(f"must be {self.accepts}")
        return value


@frozen
class Real:
    """A finite real number from ``minimum`` to ``maximum`` (seconds, a factor); ``zero`` as in Count."""

    minimum: float
    maximum: float
    unit: str = "a number"  # "seconds": the message says "seconds from 0.05 to 86400"
    zero: str | None = None

    @property
    def accepts(self) -> str:
        text = f"{self.unit} from {self.minimum:g} to {self.maximum:g}"
        return f"{text}, or 0 ({self.zero})" if self.zero else text

    def parse(self, text: str) -> float:
        return self._in_range(float(_decimal(text, self.accepts)))

    def check(self, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be {self.accepts}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"is not finite: must be {self.accepts}")
        return self._in_range(float(value))

    def _in_range(self, value: float) -> float:
        if value == 0 and self.zero:
            return 0.0
        if not self.minimum <= value <= self.maximum:
            raise ValueError(f"must be {self.accepts}")
        return value


def format_size(n: int) -> str:
    """1073741824 -> '1GiB', 10**9 -> '1000000000': exact, for a range in a message."""
    for unit, scale in (("PiB", PIB), ("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


@frozen
class Size:
    """Bytes (or bytes per second, ``per_second``) with a unit: 80GiB, 40GB, 1.5TiB. A bare number under
    ``minimum`` is taken for a forgotten unit ("80" would be 80 bytes) and refused, naming the fix."""

    minimum: int = MIB
    maximum: int = PIB
    what: str = "a size"  # "a device's memory"
    per_second: bool = False

    @property
    def accepts(self) -> str:
        unit = "/s" if self.per_second else ""
        return (f"{self.what} with a unit, from {format_size(self.minimum)}{unit} to "
                f"{format_size(self.maximum)}{unit} (e.g. 80GiB{unit}, 40GB{unit})")

    def parse(self, text: str) -> int:
        body = text.strip()
        if self.per_second:
            body = body.removesuffix("/s")
        if body.startswith("-"):
            raise ValueError(f"must be more than 0 bytes: {self.accepts}")
        match = _SIZE.match(body) if len(body) <= _MAX_TEXT else None
        if not match:
            raise ValueError(f"is not a size: {self.accepts}")
        unit = match.group(2).lower()
        if unit not in _SIZE_UNITS:
            raise ValueError(f"unknown unit {match.group(2)!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
        value = _decimal(match.group(1), self.accepts) * _SIZE_UNITS[unit]
        if value <= 0:
            raise ValueError(f"must be more than 0 bytes: {self.accepts}")
        if value < self.minimum and not unit:
            meant = "GB/s" if self.per_second else "GiB"
            raise ValueError(f"has no unit and would be {int(value)} bytes; did you mean {match.group(1)}{meant}?")
        if not self.minimum <= value <= self.maximum:
            size = f"{int(value)} bytes" if value < 2**70 else "more than 2^70 bytes"
            raise ValueError(f"is {size}; must be {self.accepts}")
        return int(value)

    def check(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be {self.accepts}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"is not finite: must be {self.accepts}")
        if not self.minimum <= value <= self.maximum:
            raise ValueError(f"must be {self.accepts}")
        return int(value)


@frozen
class ParamCount:
    """A parameter count: 7e9, 7B, 1.3b, 350M, 7_000_000_000 (B = billion, not bytes), from 1 to ``maximum``."""

    maximum: int = 10**18

    @property
    def accepts(self) -> str:
        return f"a count from 1 to {self.maximum:.0e}: 7e9, 7B, 1.3b, 350M"

    def parse(self, text: str) -> int:
        cleaned = text.strip().replace("_", "")
        suffix = cleaned[-1:].lower() if cleaned[-1:].isalpha() else ""
        number = cleaned[: len(cleaned) - len(suffix)].strip()
        if suffix not in _COUNT_SUFFIXES or not number:
            raise ValueError("is not a parameter count (examples: 7e9, 7B, 1.3b, 350M)")
        try:
            value = _decimal(number, self.accepts) * _COUNT_SUFFIXES[suffix]
        except ValueError:
            raise ValueError("is not a parameter count (examples: 7e9, 7B, 1.3b, 350M)") from None
        if value < 1:
            raise ValueError("must be at least 1 parameter")
        if value > self.maximum:
            raise ValueError(f"is more than {self.maximum:.0e} parameters")
        return int(value.to_integral_value())


# The ranges zeromon's flags and settings use, named once.
POLL_SECONDS = Real(0.05, 86400.0, "seconds")  # a poller faster than 20 Hz only burns CPU; a day at most
REFRESH_SECONDS = Real(0.25, 86400.0, "seconds")  # a dashboard refresh redraws every open browser
REPLAY_SPEED = Real(0.001, 100000.0, "a speed factor")  # 1 = real time
# How often a source's own thread polls or advances: the flags' ranges, and down to 10 ms for tests
# and the replay's clock (a tick costs a view's rebuild).
SOURCE_SECONDS = Real(0.01, 86400.0, "seconds")
GPU_MEMORY = Size(MIB, PIB, "a device's memory")
CAPACITY = Size(MIB, PIB, "a memory capacity")
# ZEROMON_MAX_DISK: a rank's recording (down to 64 KiB, which tests use to fill one quickly).
RECORDING_SIZE = Size(64 * KIB, PIB, "a recording's size per rank")
BUS_BANDWIDTH = Size(MIB, PIB, "a bus bandwidth", per_second=True)
GPUS_PER_NODE = Count(1, 4096)
NODES = Count(1, 1_000_000)
GPUS = Count(1, 10**8)  # all nodes
PORT = Count(1, 65535, zero="any free port")
LAYER_SIZE = Count(1, 10**8)  # one of --activations' five numbers
PARAMS = ParamCount()
