"""A restarted run's earlier attempts, and why each ended, in the words `report` and `summary` print
("the run restarted 1 time ...: attempt 0 ended at step 8 (06:31:20) when rank 1 raised RuntimeError:
transient: NIC flap"). Pure: the attempts' file ends in (zeromon.model.attempts), lines out.

An attempt's cause is its first rank to die (rank_ends.end_order): the restart followed from it, and
the ranks that died after it (a lost connection, the launcher's SIGTERM) are its own report's to tell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zeromon.analysis.rank_ends import RankEnd, clock, end_order, rank_ends
from zeromon.model.attempts import EarlierAttempt, RunAttempts
from zeromon.model.classes import frozen
from zeromon.model.events import step_number


@frozen
class AttemptEnd:
    """How an earlier attempt ended: its number, its folders and each rank's end."""

    number: int
    folders: tuple[str, ...]
    ends: tuple[RankEnd, ...]

    @property
    def cause(self) -> RankEnd | None:
        """The first rank to die (by time; else the lowest that died, its time not known)."""
        order = end_order(self.ends)
        return order.first or next(iter(order.untimed), None)

    @property
    def last_step(self) -> int | None:
        """From 0: the last step a rank of the attempt is known to have ended."""
        return max((e.last_step for e in self.ends if e.last_step is not None), default=None)

    @property
    def ended_ns(self) -> int | None:
        cause = self.cause
        if cause is not None:
            return cause.ended_ns
        return max((e.ended_ns for e in self.ends if e.ended_ns is not None), default=None)

    def line(self) -> str:
        """'attempt 0 ended at step 8 (06:31:20) when rank 1 raised RuntimeError: transient: NIC flap'."""
        cause = self.cause
        step = cause.last_step if cause is not None and cause.last_step is not None else self.last_step
        at = f"at step {step_number(step)}" if step is not None else "before its first step"
        ended = self.ended_ns
        about = "about " if cause is not None and cause.ended_by_last_record else ""
        when = f" ({about}{clock(ended)})" if ended is not None else ""
        why = f" when {cause.cause_words()}" if cause is not None else "; none of its recordings says that a rank failed"
        return f"attempt {self.number} ended {at}{when}{why}"

    def to_dict(self) -> dict[str, Any]:
        cause = self.cause
        return {"attempt": self.number, "folders": list(self.folders), "last_step": self.last_step,
                "ended_ns": self.ended_ns, "cause": cause.cause_words() if cause is not None else None,
                "cause_rank": cause.rank if cause is not None else None}


def attempt_end(attempt: EarlierAttempt) -> AttemptEnd:
    """How an earlier attempt ended, from its files' ends (a rank cut off: its step from its file's tail)."""
    return AttemptEnd(attempt.number, tuple(map(str, attempt.folders)), rank_ends(attempt.file_ends, {}))


@frozen
class Restarts:
    """A run's restarts: its earlier attempts' ends, the attempt read (the last) and the steps it ran;
    where the folder read is itself an earlier attempt, whose."""

    earlier: tuple[AttemptEnd, ...] = ()
    last: int | None = None
    last_steps: int | None = None
    attempt_in: tuple[Path, int] | None = None
    behind: tuple[tuple[int, int], ...] = ()  # (rank, attempt): a rank file of an attempt before the last

    @property
    def count(self) -> int:
        """How many times the run restarted: the last attempt's number, where its files say it."""
        return max(self.last or 0, len(self.earlier)) if self.earlier else 0

    def lines(self, shown: str) -> list[str]:
        """What to say of the restarts; none for a run that never restarted. ``shown``: what was printed of
        the last attempt, with its verb ("the report above is")."""
        if not self.earlier:
            return []
        n = self.count
        ran = (f", which ran {self.last_steps:,} step{'s' if self.last_steps != 1 else ''}"
               if self.last_steps is not None else "")
        which = f"attempt {self.last}" if self.last is not None else "the last"
        lines = [f"the run restarted {n} time{'s' if n != 1 else ''} (torchelastic); {shown} of its last "
                 f"attempt ({which}{ran}):"]
        for attempt in self.earlier:
            lines.append(f"  {attempt.line()} (its report: zeromon report {' '.join(attempt.folders)})")
        lines.extend(f"  rank {rank}'s recording here is of attempt {number}, not {self.last}: in attempt {self.last} "
                     "the rank ended before its agent started" for rank, number in self.behind)
        return lines

    @property
    def note(self) -> str | None:
        """What a report of an earlier attempt says first: which run's attempt it is."""
        if self.attempt_in is None:
            return None
        folder, number = self.attempt_in
        return (f"this is attempt {number} of the run in {folder}, which restarted after it "
                f"(its last attempt: zeromon report {folder})")

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "last_attempt": self.last, "earlier": [a.to_dict() for a in self.earlier],
                "attempt_of": str(self.attempt_in[0]) if self.attempt_in is not None else None}


def restarts(attempts: RunAttempts, last_steps: int | None) -> Restarts:
    """A run's restarts from what its folders keep (zeromon.model.attempts.read_attempts)."""
    return Restarts(tuple(map(attempt_end, attempts.earlier)), attempts.last, last_steps, attempts.attempt_in,
                    attempts.behind)
