"""How each rank of a run ended, and the lines that say it: pure, from what the files' ends say
(zeromon.model.run_end.FileEnd) and what the recordings hold.

A rank ended cleanly when its end record says "exit" (or "detach": only the agent stopped). It died
when the end record names a signal, an exception or a failure status ("exit 1"), or when there is none (format 1.3 on): the
process was killed, and its last flush interval of records may be lost. A rank whose process still
runs is running, not dead. Files whose header does not promise an end record (older than format 1.3,
or written by other tools) say nothing here.

When several ranks died, the first to end is said first and the ranks that died within
FOLLOWED_WITHIN_S after it next, each with how long after it (end_order): one rank's failure (an
exception) makes its peers fail in turn (a lost connection), and a reader wants the cause first. That
is an order in time, and the lines say so rather than claim a cause. A rank cut off has no end time:
its last record's stands in for it, and is said to be approximate.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from zeromon.model.classes import frozen
from zeromon.model.events import END_DETACH, END_EXIT, step_number
from zeromon.model.run_end import FileEnd
from zeromon.model.units import format_bytes

# The exit status of `zeromon summary` and `zeromon report` (after printing everything), and of
# `zeromon run` when its command exited 0: a rank died, or its recording is incomplete.
EXIT_RANK_DIED = 3

CLEAN, SIGNAL, EXCEPTION, EXIT_STATUS, CUT_OFF, RUNNING, UNKNOWN, MISSING = (
    "clean", "signal", "exception", "exit_status", "cut_off", "running", "unknown", "missing")

# The ranks that died this soon after the first are said to have followed it: a launcher stops the
# other ranks within seconds of a failure and kills them after its grace period (torchrun's: 30 s), and a
# peer blocked in a collective fails as soon as the failed rank's connections close.
FOLLOWED_WITHIN_S = 60.0
# Past this many, the ranks that followed are counted by how they ended rather than named one a line.
FOLLOWERS_SHOWN = 8


@frozen
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
    ended_ns: int | None = None  # Unix ns: its end record's time, else (cut off) its last record's
    ended_by_last_record: bool = False  # no end record: ended_ns is a lower bound, the end came after it

    @property
    def died(self) -> bool:
        return self.state in (SIGNAL, EXCEPTION, EXIT_STATUS, CUT_OFF)

    @property
    def incomplete(self) -> bool:
        return self.records_lost > 0 or self.write_error is not None

    def lines(self) -> list[str]:
        """What to say about this rank's end; none for a clean end with nothing lost."""
        out = []
        if self.died:
            out.append(f"rank {self.rank} died {self.at_step()}{self.how_words()}")
        elif self.state == RUNNING:
            out.append(f"rank {self.rank} is still running (no end record yet)")
        elif self.state == MISSING:
            out.append(f"rank {self.rank} has no recording here (it ran on another node, whose folder holds it; "
                       "or it never created a process group, or ended before the agent started)")
        incomplete = self.incomplete_line()
        if incomplete is not None:
            out.append(incomplete)
        return out

    def at_step(self) -> str:
        return f"at step {step_number(self.last_step)}" if self.last_step is not None else "before its first step"

    @property
    def _named(self) -> str:
        """What the end record's words name: the signal, the exception's type, the exit status."""
        return (self.how or "").partition(" ")[2]

    def how_words(self, no_end_record: str = "") -> str:
        """How a rank that died ended, as its line goes on: ': stopped by SIGTERM', ' (no end record; ...)';
        ``no_end_record``: said after "no end record" (of a rank cut off)."""
        if self.state == CUT_OFF:
            lost = f"{self.flush_interval_s:g} s" if self.flush_interval_s else "moments"
            return f" (no end record{no_end_record}; its last {lost} may be lost)"
        if self.state == SIGNAL:
            return f": stopped by {self._named}"
        if self.state == EXCEPTION:
            return f": an exception, {self._named}" + (f": {_short(self.detail)}" if self.detail else "")
        if self.state == EXIT_STATUS:  # sys.exit(1): the script said it failed
            return f": it exited with status {self._named}"
        return ""

    def kind_words(self) -> str:
        """How it died in a few words, alike for ranks that died alike: 'by an exception, RuntimeError'."""
        return {CUT_OFF: "with no end record", SIGNAL: f"stopped by {self._named}",
                EXCEPTION: f"by an exception, {self._named}",
                EXIT_STATUS: f"exiting with status {self._named}"}.get(self.state, self.state)

    def cause_words(self) -> str:
        """What this rank did, as the cause of a restart: 'rank 1 raised RuntimeError: transient: NIC flap'."""
        if self.state == EXCEPTION:
            return f"rank {self.rank} raised {self._named}" + (f": {_short(self.detail)}" if self.detail else "")
        if self.state == SIGNAL:
            return f"rank {self.rank} was stopped by {self._named}"
        if self.state == EXIT_STATUS:
            return f"rank {self.rank} exited with status {self._named}"
        return f"rank {self.rank} was killed (no end record)"

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


def clock(t_ns: int) -> str:
    """'06:31:20': a time of day on this machine's clock."""
    return time.strftime("%H:%M:%S", time.localtime(t_ns / 1e9))


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
        through = recorded_through.get(f.rank, f.last_step_in_tail)
        last = end.last_step if end is not None and end.last_step is not None else through
        state = _state(f)
        ends[f.rank] = RankEnd(
            rank=f.rank, state=state, how=end.how if end is not None else None, last_step=last,
            recorded_through=through, records_lost=(end.records_lost or 0) if end is not None else 0,
            bytes_lost=(end.bytes_lost or 0) if end is not None else 0,
            write_error=end.write_error if end is not None else None,
            detail=end.detail if end is not None else None, flush_interval_s=f.flush_interval_s,
            ended_ns=end.t_ns if end is not None else f.last_record_ns if state == CUT_OFF else None,
            ended_by_last_record=end is None and state == CUT_OFF and f.last_record_ns is not None)
    if ends and world_size is not None and any(f.expected for f in file_ends):
        for rank in range(world_size):
            ends.setdefault(rank, RankEnd(rank=rank, state=MISSING, how=None, last_step=None, recorded_through=None))
    return tuple(ends[r] for r in sorted(ends))


@frozen
class EndOrder:
    """The ranks that died, by when they ended: the first, those that died within FOLLOWED_WITHIN_S after
    it, those that died later, and (by rank) those whose end time is not known."""

    first: RankEnd | None
    followed: tuple[RankEnd, ...] = ()
    later: tuple[RankEnd, ...] = ()
    untimed: tuple[RankEnd, ...] = ()

    @property
    def ordered(self) -> bool:
        """Whether there is an order to say: two ranks or more died at known times."""
        return self.first is not None and bool(self.followed or self.later)


def end_order(ends: Iterable[RankEnd]) -> EndOrder:
    died = [e for e in ends if e.died]
    timed = sorted((e for e in died if e.ended_ns is not None), key=lambda e: (e.ended_ns or 0, e.rank))
    untimed = tuple(e for e in died if e.ended_ns is None)
    if not timed:
        return EndOrder(None, untimed=untimed)
    first, rest = timed[0], timed[1:]
    limit = (first.ended_ns or 0) + int(FOLLOWED_WITHIN_S * 1e9)
    return EndOrder(first, tuple(e for e in rest if (e.ended_ns or 0) <= limit),
                    tuple(e for e in rest if (e.ended_ns or 0) > limit), untimed)


def _seconds(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 0.1 else f"{seconds:.1f} s" if seconds < 60 else f"{seconds:.0f} s"


def _first_line(first: RankEnd) -> str:
    """'rank 1 died first, at step 8 (06:31:20): an exception, ValueError: corrupt shard 17'."""
    assert first.ended_ns is not None
    at = f"rank {first.rank} died first, {first.at_step()}"
    if first.ended_by_last_record:  # when it was last heard of: it died after that
        return at + first.how_words(f", its last record at {clock(first.ended_ns)}")
    return f"{at} ({clock(first.ended_ns)}){first.how_words()}"


def _after_line(end: RankEnd, first: RankEnd) -> str:
    """'rank 0 died at step 8, 0.4 s after rank 1: an exception, RuntimeError: ...'."""
    assert end.ended_ns is not None and first.ended_ns is not None
    about = "about " if end.ended_by_last_record or first.ended_by_last_record else ""
    after = f"{about}{_seconds(max(0, end.ended_ns - first.ended_ns) / 1e9)} after rank {first.rank}"
    if end.ended_ns - (first.ended_ns or 0) > FOLLOWED_WITHIN_S * 1e9:
        after += f" ({clock(end.ended_ns)})"
    return f"rank {end.rank} died {end.at_step()}, {after}{end.how_words()}"


def died_lines(ends: Iterable[RankEnd]) -> dict[int, str]:
    """Each dead rank's line, by rank: with its place in the order where two ranks or more died at known
    times ("rank 1 died first, ...", "rank 0 died at step 8, 0.4 s after rank 1: ..."), else as it says it."""
    ends = list(ends)
    order = end_order(ends)
    lines = {e.rank: e.lines()[0] for e in ends if e.died}
    if order.ordered and order.first is not None:
        lines[order.first.rank] = _first_line(order.first)
        lines.update((e.rank, _after_line(e, order.first)) for e in (*order.followed, *order.later))
    return lines


def end_lines(ends: Iterable[RankEnd]) -> list[str]:
    """What `zeromon run`, `summary` and `report` say of how the ranks ended: where two ranks or more died,
    the first to end first, the ranks that followed it, the ranks that died later; then the rest by rank."""
    ends = list(ends)
    order = end_order(ends)
    if not order.ordered or order.first is None:
        return [line for end in ends for line in end.lines()]
    by_rank = died_lines(ends)
    first = order.first
    lines = _with_incomplete([first], by_rank)
    shown, more = order.followed[:FOLLOWERS_SHOWN], order.followed[FOLLOWERS_SHOWN:]
    if len(more) == 1:  # a line that counts one rank says no less than the rank's own line
        shown, more = order.followed, ()
    lines += _with_incomplete(shown, by_rank)
    if more:
        lines.append(_more_followed_line(more, first))
    if order.followed and first.state == SIGNAL and all(e.state == SIGNAL for e in order.followed):
        lines.append("(a signal stopped each of them, one after another: the job was stopped from outside, by its "
                     "launcher or scheduler, rather than by one rank's failure)")
    elif order.followed:
        who = f"rank {order.followed[0].rank}" if len(order.followed) == 1 else "the ranks that followed"
        lines.append(f"({who} may have failed because rank {first.rank} did: the order in time suggests it, "
                     "it does not prove it)")
    lines += _with_incomplete(order.later, by_rank)
    said = {e.rank for e in (first, *order.followed, *order.later)}
    lines += [line for end in ends if end.rank not in said for line in end.lines()]
    return lines


def _with_incomplete(ends: Sequence[RankEnd], by_rank: Mapping[int, str]) -> list[str]:
    """Each rank's line from ``by_rank``, followed by what its recording could not write, if anything."""
    out = []
    for end in ends:
        out.append(by_rank[end.rank])
        incomplete = end.incomplete_line()
        if incomplete is not None:
            out.append(incomplete)
    return out


def _more_followed_line(more: Sequence[RankEnd], first: RankEnd) -> str:
    """'… and 1,015 more ranks died within 2.1 s after rank 1: 1,000 stopped by SIGTERM, 15 by an exception'."""
    assert first.ended_ns is not None
    within = max((e.ended_ns or 0) - first.ended_ns for e in more) / 1e9
    hows = Counter(e.kind_words() for e in more)
    said = ", ".join(f"{n:,} {how}" for how, n in hows.most_common())
    return f"… and {len(more):,} more ranks died within {_seconds(within)} after rank {first.rank}: {said}"


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
