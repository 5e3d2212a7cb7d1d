"""A first look at a recorded run: per rank, what was recorded and what a step costs.

Pure: recordings in, dataclasses out; ``format_summary`` renders the text the CLI prints.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from zeromon.analysis.rank_ends import RankEnd, end_lines, rank_ends
from zeromon.model.codec import Recording, RunDirs, read_run, run_name
from zeromon.model.run_end import read_file_ends
from zeromon.model.units import format_bytes


@dataclass(frozen=True, slots=True)
class RankSummary:
    rank: int
    framework: str
    strategy: str
    steps: int
    # Medians over the steps after the first (all steps when there is one), as `zeromon report`'s:
    # the first step holds one-off work (allocation, lazy initialization, the first gathers).
    median_step_s: float | None
    collectives: int
    # Median over the steps after the first of the bytes each step moved, per ZeRO meaning.
    bytes_per_step_by_meaning: dict[str, int] = field(default_factory=dict)
    median_blocked_s: float | None = None
    peak_memory: int | None = None
    capacity: int | None = None
    last_categories: dict[str, int] = field(default_factory=dict)
    events_dropped: int = 0
    hook_errors: int = 0
    corrupt_lines: tuple[int, ...] = ()  # line numbers in the rank file, skipped
    line_errors: dict[int, str] = field(default_factory=dict)  # what was wrong with some (Recording.line_errors)
    notices: tuple[str, ...] = ()
    file: str = ""


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_dir: str
    world_size: int
    ranks: tuple[RankSummary, ...]
    ends: tuple[RankEnd, ...] = ()  # how each rank ended (rank_ends): died, cut off, incomplete


def strategy_label(rec: Recording) -> str:
    """'ZeRO-3', 'FULL_SHARD', ...: how the rank's run shards, in the words of its framework."""
    info = rec.run_info
    if info is None:
        return "-"
    if info.zero_stage is not None:
        return f"ZeRO-{info.zero_stage}"
    return info.fsdp_strategy or "-"


def summarize_recording(rec: Recording) -> RankSummary:
    steady = [s for s in rec.steps if s.step >= 1] or list(rec.steps)
    durations = [s.duration_s for s in steady]
    per_step: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    columns = rec.collective_columns()  # no event objects: a recording holds up to a million
    counts: Counter[int] = Counter()
    for step, meaning, b_in, b_out in zip(columns.step, columns.meaning, columns.bytes_in, columns.bytes_out,
                                          strict=True):
        counts[step] += 1
        if step >= 0:
            per_step[step][meaning] += b_in if b_in > b_out else b_out
    later = [s for s in sorted(per_step) if s >= 1] or sorted(per_step)
    meanings = {m for s in later for m in per_step[s]}
    by_meaning = {m: int(statistics.median(per_step[s].get(m, 0) for s in later)) for m in sorted(meanings)}
    levels = [level for m in rec.memory
              if (level := m.allocated if m.allocated is not None else m.rss) is not None]
    with_categories = [m for m in rec.memory if len(m.categories) > 1]
    capacity = next((m.capacity for m in reversed(rec.memory) if m.capacity), None)
    info = rec.run_info
    return RankSummary(
        rank=rec.rank,
        framework=info.framework if info else "-",
        strategy=strategy_label(rec),
        steps=len(rec.steps),
        median_step_s=statistics.median(durations) if durations else None,
        # A bounded recording's steps whose detail was dropped (all or part): their summaries count them.
        collectives=len(columns) + sum(max(0, (s.collectives or 0) - counts[s.step]) for s in rec.steps),
        bytes_per_step_by_meaning=by_meaning,
        median_blocked_s=statistics.median(waits) if (waits := [s.blocked_s for s in steady
                                                                 if s.blocked_s is not None]) else None,
        peak_memory=max(levels) if levels else None,
        capacity=capacity,
        last_categories=dict(with_categories[-1].categories) if with_categories else {},
        events_dropped=rec.stats.events_dropped if rec.stats else 0,
        hook_errors=rec.stats.hook_errors if rec.stats else 0,
        corrupt_lines=tuple(rec.corrupt_lines),
        line_errors=dict(rec.line_errors),
        notices=tuple(f"{n.level}: {n.message}" for n in rec.notices),
        file=str(rec.path),
    )


def summarize_run(run_dir: RunDirs) -> RunSummary:
    recordings = read_run(run_dir)
    world = max((r.run_info.world_size for r in recordings if r.run_info), default=len(recordings))
    through = {r.rank: max((s.step for s in r.steps), default=None) for r in recordings}
    ends = rank_ends(read_file_ends([r.path for r in recordings]), through, world)
    return RunSummary(run_dir=run_name(run_dir), world_size=world,
                      ranks=tuple(summarize_recording(r) for r in recordings), ends=ends)


def counted(n: int, thing: str) -> str:
    """'1 hook error', '3 hook errors'."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def corrupt_lines_note(file: str, lines: Sequence[int], shown: int = 5, errors: Mapping[int, str] | None = None) -> str:
    """'rank-1.jsonl: 2 corrupt lines skipped (lines 57, 80; line 57: collective.meaning is 7, not a
    string)', with at most ``shown`` line numbers and the first of ``errors`` (line: what was wrong); of a
    compact file (.zmr), record numbers: 'rank-1.zmr: 5 corrupt records skipped (records 6, ...)'."""
    numbers = ", ".join(map(str, lines[:shown]))
    if len(lines) > shown:
        numbers += f" and {len(lines) - shown} more"
    word = "record" if Path(file).suffix == ".zmr" else "line"  # a compact file's records are numbered from 1
    where = f"{word} {numbers}" if len(lines) == 1 else f"{word}s {numbers}"
    first = next(iter(errors.items()), None) if errors else None
    why = f"; {word} {first[0]}: {first[1]}" if first is not None else ""
    return f"{Path(file).name}: {counted(len(lines), 'corrupt ' + word)} skipped ({where}{why})"


def format_summary(summary: RunSummary) -> str:
    lines = [f"zeromon: run {summary.run_dir} ({len(summary.ranks)} of {summary.world_size} ranks recorded)"]
    header = f"{'rank':>4}  {'framework':<10} {'strategy':<14} {'steps':>5} {'step ms':>8} {'blocked ms':>10} " \
             f"{'collectives':>11} {'peak mem':>11}  bytes per step by meaning"
    lines.append(header)
    for r in summary.ranks:
        step_ms = f"{r.median_step_s * 1e3:.1f}" if r.median_step_s is not None else "-"
        blocked = f"{r.median_blocked_s * 1e3:.1f}" if r.median_blocked_s is not None else "-"
        meanings = ", ".join(f"{m}={format_bytes(b)}" for m, b in r.bytes_per_step_by_meaning.items()) or "-"
        lines.append(f"{r.rank:>4}  {r.framework:<10} {r.strategy:<14} {r.steps:>5} {step_ms:>8} {blocked:>10} "
                     f"{r.collectives:>11} {format_bytes(r.peak_memory):>11}  {meanings}")
    lines.append("(step ms, blocked ms and bytes per step: medians over the steps after the first, as in "
                 "`zeromon report`)")
    first = summary.ranks[0] if summary.ranks else None
    if first is not None and first.last_categories:
        cats = ", ".join(f"{k}={format_bytes(v)}" for k, v in first.last_categories.items() if v)
        lines.append(f"rank {first.rank} memory by category (last sample): {cats}")
    for r in summary.ranks:
        lost = [counted(n, thing) + suffix for n, thing, suffix in
                ((r.events_dropped, "event", " dropped"), (r.hook_errors, "hook error", "")) if n]
        if lost:
            lines.append(f"rank {r.rank}: {', '.join(lost)}")
        if r.corrupt_lines:
            lines.append(corrupt_lines_note(r.file, r.corrupt_lines, errors=r.line_errors))
    lines.extend(end_lines(summary.ends))
    seen: set[str] = set()
    for r in summary.ranks:
        for note in r.notices:
            if note not in seen:
                seen.add(note)
                lines.append(f"note: {note}")
    return "\n".join(lines)
