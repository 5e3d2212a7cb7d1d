"""Parsing and formatting of byte sizes and rank lists, shared by the agent's settings, the CLI's flags and the reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


def _runs(ranks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct ranks as runs of consecutive ones, (first, last) each."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return [(a, b) for a, b in runs]


def _run_words(runs: Sequence[tuple[int, int]]) -> list[str]:
    return [str(a) if a == b else f"{a}-{b}" for a, b in runs]


def rank_ranges(ranks: Iterable[int], most: int | None = None) -> str:
    """'rank 3', 'ranks 0-3', 'ranks 0-1, 4, 6-7', 'ranks 0-255 but 17': runs of consecutive ranks as ranges,
    or a range and the ranks it leaves out where those are few (a quarter of the ranks named at most) and it
    says the set in fewer parts. ``most``: the parts written at most; past them '…' and how many ranks in all
    (such a text no longer reads back with parse_rank_ranges)."""
    chosen = sorted(set(ranks))
    runs = _runs(chosen)
    if not runs:
        return "no rank"
    if len(chosen) == 1:
        return f"rank {chosen[0]}"
    holes = _runs(set(range(chosen[0], chosen[-1] + 1)) - set(chosen))
    missing = sum(b - a + 1 for a, b in holes)
    if holes and 1 + len(holes) <= len(runs) and 4 * missing <= len(chosen):
        head, parts = f"{chosen[0]}-{chosen[-1]} but ", _run_words(holes)
    else:
        head, parts = "", _run_words(runs)
    if most is not None and len(parts) > most:
        return f"ranks {head}{', '.join(parts[:max(1, most)])}, … ({len(chosen):,} ranks)"
    return f"ranks {head}{', '.join(parts)}"


def parse_rank_ranges(text: str) -> tuple[int, ...]:
    """rank_ranges' text (without ``most``) read back: the ranks, sorted. ValueError for any other text."""
    words = text.strip()
    if words.startswith("rank "):
        return (int(words[5:]),)
    if not words.startswith("ranks "):
        raise ValueError(f"not a list of ranks: {text!r}")
    span, but, rest = words[6:].partition(" but ")
    if not but:
        return tuple(sorted(_parse_runs(span)))
    first, _, last = span.partition("-")
    return tuple(sorted(set(range(int(first), int(last) + 1)) - _parse_runs(rest)))


def _parse_runs(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(", "):
        first, dash, last = part.partition("-")
        out.update(range(int(first), int(last) + 1) if dash else (int(first),))
    return out
