"""How each rank of a run ended, and the lines that say it: pure, from what the files' ends say
(zeromon.model.run_end.FileEnd) and what the recordings hold.

A rank ended cleanly when its end record says "exit" (or "detach": only the agent stopped). It died
when the end record names a signal, an exception or a failure status ("exit 1"), or when there is none (format 1.3 on): the
process was killed, and its last flush interval of records may be lost. A rank whose process still
runs is running, not dead. Files whose header does not promise an end record (older than format 1.3,
or written by other tools) say nothing here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from zeromon.model.events import END_DETACH, END_EXIT, step_number
from zeromon.model.run_end import FileEnd
from zeromon.model.units import format_bytes

# The exit status of `zeromon summary` and `zeromon report` (after printing everything), and of
# `zeromon run` when its command exited 0: a rank died, or its recording is incomplete.
EXIT_RANK_DIED = 3

CLEAN, SIGNAL, EXCEPTION, EXIT_STATUS, CUT_OFF, RUNNING, UNKNOWN, MISSING = (
    "clean", "signal", "exception", "exit_status", "cut_off", "running", "unknown", "missing")


@dataclass(frozen=True, slots=True)
class RankEnd:
    rank: int
    state: str  # one of the names above
    how: str | None  # the end record's words: "exit", "signal SIGTERM", "exception RuntimeError"
    last_step: int | None  # from 0: the last step the agent (else the recording) saw end
    recorded_through: int | None  # from 0: the last step the recording holds
    records_lost: int = 0
    bytes_lost: int = 0
    write_error: str | None = None
    detail: str | None = None
    flush_interval_s: float | None = None

    @property
    def died(self) -> bool:
        return self.state in (SIGNAL, EXCEPTION, EXIT_STATUS, CUT_OFF)

    @property
    def incomplete(self) -> bool:
        return self.records_lost > 0 or self.write_error is not None

    def lines(self) -> list[str]:
        """What to say about this rank's end; none for a clean end with nothing lost."""
        out = []
        at = f"at step {step_number(self.last_step)}" if self.last_step is not None else "before its first step"
        if self.state == CUT_OFF:
            lost = f"{self.flush_interval_s:g} s" if self.flush_interval_s else "moments"
            out.append(f"rank {self.rank} died {at} (no end record; its last {lost} may be lost)")
        elif self.state == SIGNAL:
            out.append(f"rank {self.rank} died {at}: stopped by {(self.how or '').removeprefix('signal ')}")
        elif self.state == EXCEPTION:
            what = (self.how or "").removeprefix("exception ")
            out.append(f"rank {self.rank} died {at}: an exception, {what}" + (f": {_short(self.detail)}" if self.detail else ""))
        elif self.state == EXIT_STATUS:  # sys.exit(1): the script said it failed
            out.append(f"rank {self.rank} died {at}: it exited with status {(self.how or '').removeprefix('exit ')}")
        elif self.state == RUNNING:
            out.append(f"rank {self.rank} is still running (no end record yet)")
        elif self.state == MISSING:
            out.append(f"rank {self.rank} has no recording here (it ran on another node, whose folder holds it; "
                       "or it never created a process group, or ended before the agent started)")
        incomplete = self.incomplete_line()
        if incomplete is not None:
            out.append(incomplete)
        return out

    def incomplete_line(self) -> str | None:
        """'rank 1: the recording is incomplete: 1,234 records (2.1 MiB) could not be written (...)'."""
        if not self.incomplete:
            return None
        why = f" ({self.write_error})" if self.write_error else ""
        held = (f"; it holds steps up to {step_number(self.recorded_through)}"
                if self.recorded_through is not None else "; it holds no step")
        of = f" of {step_number(self.last_step)}" if self.last_step is not None and self.recorded_through is not None \
            and self.last_step > self.recorded_through else ""
        return (f"rank {self.rank}: the recording is incomplete: {self.records_lost:,} records "
                f"({format_bytes(self.bytes_lost)}) could not be written{why}{held}{of}")


def _short(text: str, limit: int = 160) -> str:
    """An exception's message in a line: its first line, cut at ``limit`` characters."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[:limit - 1] + "…"


def _state(file_end: FileEnd) -> str:
    end = file_end.end
    if end is not None:
        if end.how in (END_EXIT, END_DETACH):
            return CLEAN
        if end.how.startswith(f"{END_EXIT} "):  # "exit 1": sys.exit with a failure status
            return EXIT_STATUS
        return SIGNAL if end.how.startswith("signal") else EXCEPTION if end.how.startswith("exception") else CLEAN
    if not file_end.expected:
        return UNKNOWN
    return RUNNING if file_end.running else CUT_OFF


def rank_ends(file_ends: Iterable[FileEnd], recorded_through: Mapping[int, int | None],
              world_size: int | None = None) -> tuple[RankEnd, ...]:
    """Each rank's end, by rank; ``recorded_through``: the last step each rank's recording holds.
    Ranks below ``world_size`` without a file are MISSING."""
    file_ends = list(file_ends)
    ends: dict[int, RankEnd] = {}
    for f in file_ends:
        end = f.end
        through = recorded_through.get(f.rank)
        last = end.last_step if end is not None and end.last_step is not None else through
        ends[f.rank] = RankEnd(
            rank=f.rank, state=_state(f), how=end.how if end is not None else None, last_step=last,
            recorded_through=through, records_lost=(end.records_lost or 0) if end is not None else 0,
            bytes_lost=(end.bytes_lost or 0) if end is not None else 0,
            write_error=end.write_error if end is not None else None,
            detail=end.detail if end is not None else None, flush_interval_s=f.flush_interval_s)
    if ends and world_size is not None and any(f.expected for f in file_ends):
        for rank in range(world_size):
            ends.setdefault(rank, RankEnd(rank=rank, state=MISSING, how=None, last_step=None, recorded_through=None))
    return tuple(ends[r] for r in sorted(ends))


def end_lines(ends: Iterable[RankEnd]) -> list[str]:
    return [line for end in ends for line in end.lines()]


def exit_status(ends: Iterable[RankEnd]) -> int:
    """EXIT_RANK_DIED when a rank died or its recording is incomplete, else 0."""
    return EXIT_RANK_DIED if any(e.died or e.incomplete for e in ends) else 0


def incomplete_line(file_end: FileEnd, recorded_through: int | None) -> str | None:
    """The line that says what a rank's recording could not write, or None when it is whole."""
    (end,) = rank_ends([file_end], {file_end.rank: recorded_through})
    return end.incomplete_line()


def died_line(file_end: FileEnd, recorded_through: int | None) -> str | None:
    """The line that says how a rank died (live views, replays), or None when it did not."""
    (end,) = rank_ends([file_end], {file_end.rank: recorded_through})
    return end.lines()[0] if end.died else None
