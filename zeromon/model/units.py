"""Parsing and formatting of byte sizes and rank lists, shared by the agent's settings, the CLI's flags and the reports."""

from __future__ import annotations

from collections.abc import Iterable

from zeromon.model.numbers import GPU_MEMORY, Size, where

# Any size at all, from one byte to 2^60 (an EiB): what parse_size reads, bare numbers included.
_ANY_SIZE = Size(1, 2**60, "a size")


def parse_size(text: str) -> int:
    """'24GiB' -> 25769803776, '80GB' -> 80e9, '1e9' -> 10**9. Raises ValueError naming the problem
    (finite, more than 0 bytes; see zeromon.model.numbers for sizes of a given kind)."""
    try:
        return _ANY_SIZE.parse(text)
    except ValueError as exc:
        raise ValueError(f"{text!r} {exc}") from None


def parse_memory_size(text: str, flag: str) -> int:
    """A device's or a rank's memory for ``flag`` (e.g. --gpu-memory 80GiB), from 1 MiB to 1 PiB. Raises
    ValueError with one line, ``--gpu-memory '80': has no unit and would be 80 bytes; did you mean 80GiB?``.
    """
    try:
        return GPU_MEMORY.parse(text)
    except ValueError as exc:
        raise ValueError(f"{where(flag, text)}: {exc}") from None


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


def rank_ranges(ranks: Iterable[int]) -> str:
    """'rank 3', 'ranks 0-3', 'ranks 0-1, 4, 6-7': runs of consecutive ranks as ranges."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    words = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {words}" if len(spans) == 1 and spans[0][0] == spans[0][1] else f"ranks {words}"
