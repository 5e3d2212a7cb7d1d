"""Parsing and formatting of byte sizes, shared by the agent's settings and the CLI's flags."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """'24GiB' -> 25769803776, '80GB' -> 80e9, '1e9' -> 10**9. Raises ValueError naming the problem."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size (examples: 1073741824, 80GB, 24GiB)")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r} in {text!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return int(number * _UNITS[unit])


def parse_memory_size(text: str, flag: str) -> int:
    """A device's or a rank's memory for ``flag`` (e.g. --gpu-memory 80GiB). Raises ValueError with one line.

    A bare number under 1 MiB is taken for a forgotten unit ("80" is 80 bytes), and refused.
    """
    if text.strip().startswith("-"):  # parse_size has no sign: say what is wrong, not "not a size"
        raise ValueError(f"{flag}: {text!r} must be more than 0 bytes (e.g. {flag} 80GiB)")
    value = parse_size(text)
    if value <= 0:
        raise ValueError(f"{flag}: {text!r} must be more than 0 bytes (e.g. {flag} 80GiB)")
    if value < 2**20:
        match = _SIZE.match(text)
        if match is not None and match.group(2):
            raise ValueError(f"{flag}: {text!r} is {value} bytes, too small for a device's memory (at least 1 MiB)")
        raise ValueError(f"{flag}: {text!r} has no unit and would be {value} bytes; "
                         f"did you mean {flag} {text.strip()}GiB?")
    return value


def format_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} TiB"
