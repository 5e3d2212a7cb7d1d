"""What the TUI and the dashboard show, as plain data: FleetView in, rows, header fields, series and
findings out.

No UI library here, and no clock: every time comes from the view (``FleetView.t_ns``), so the same
view always gives the same screen (snapshot tests, replays). The widgets only style these.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Sequence

from zeromon.analysis.finding_groups import FindingGroup, group_findings
from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.live_stragglers import memory_imbalance_finding, straggler_finding
from zeromon.model.classes import frozen
from zeromon.model.events import step_number
from zeromon.sources.fleet import FleetTotals, FleetView, RankView
from zeromon.views.hang import HANG_STATES, hang_states

TREND_STEPS = 60  # steps in the sparklines
RATE_STEPS = 8  # steps over which steps/s is measured
BAR_WIDTH = 10  # characters of the memory bar


# --- numbers as short text ---------------------------------------------------------------------------

def short_bytes(n: float | None, digits: int = 3) -> str:
    """1536 -> '1.5K', 3.2e9 -> '2.98G' (binary units, ``digits`` significant digits): fits a table cell."""
    if n is None:
        return "-"
    sign, n = ("-" if n < 0 else ""), abs(float(n))
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            if unit == "B":
                return f"{sign}{n:.0f}B"
            text = f"{n:.{digits}g}"
            return f"{sign}{f'{n:.0f}' if 'e' in text else text}{unit}"
        n /= 1024
    return "-"  # not reached


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.0%}"


def rate(bytes_s: float | None) -> str:
    """Bandwidth in GB/s (decimal, as nccl-tests prints it)."""
    if bytes_s is None:
        return "-"
    gb_s = bytes_s / 1e9
    return f"{gb_s:.2f}" if gb_s < 10 else f"{gb_s:.1f}" if gb_s < 100 else f"{gb_s:.0f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def short_duration(seconds: float) -> str:
    """Three characters at most (under 100 days): '7s', '59s', '12m', '3h', '2d' (a table cell)."""
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def memory_numbers(used: int | None, peak: int | None, capacity: int | None) -> str:
    """'45.2/71.1/79.6G' (one unit, said once, when all three share it), else '356M/356M/23.5G':
    short_bytes' three digits, as the drill-down shows them, in a table cell."""
    texts = [short_bytes(v) for v in (used, peak, capacity)]
    if "-" not in texts and len({t[-1] for t in texts}) == 1:
        return f"{texts[0][:-1]}/{texts[1][:-1]}/{texts[2]}"
    return "/".join(texts)


def memory_bar(used: int | None, peak: int | None, capacity: int | None, width: int = BAR_WIDTH) -> str:
    """'███▒▒·····': used, then up to the peak, then the rest of the capacity; '?' without a capacity."""
    if used is None or not capacity or capacity <= 0:
        return "?" * width if used is not None else "·" * width
    full = min(width, round(width * used / capacity))
    upto = min(width, max(full, round(width * (peak or used) / capacity)))
    return "█" * full + "▒" * (upto - full) + "·" * (width - upto)


# --- the ranks table ---------------------------------------------------------------------------------

@frozen
class Column:
    key: str
    label: str
    width: int


# The first nine fit an 80-column terminal (state last but whole: staleness must read without colour);
# the rest scroll sideways (the rank column stays).
COLUMNS: tuple[Column, ...] = (
    Column("rank", "rank", 6),
    Column("risk", "risk", 4),
    Column("headroom", "headroom", 8),
    Column("memory", "memory used/peak/cap", 21),
    Column("step_ms", "step ms", 7),
    Column("overlap", "overlap", 7),
    Column("exposed_ms", "exp ms", 6),
    Column("exposed_pct", "exp%", 4),
    Column("state", "state", 9),
    Column("step", "step", 7),
    Column("busbw", "busbw GB/s", 10),
    Column("host", "host", 16),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
WORST_MARK = "▶"  # the worst row's symbol (it is coloured too: the symbol is for those who see no colour)
STALE_MARK = "○"  # a rank not answering (its last data stays); beside WORST_MARK when both apply
MEMORY_BAR_CELLS = 5  # the table's memory bar: the numbers beside it take the rest of the column
RISK_WORDS = {Severity.OK: "ok", Severity.INFO: "ok", Severity.WARN: "warn", Severity.CRITICAL: "crit"}


@frozen
class RankRow:
    """One rank as the table shows it: the values (for sorting and colour) and the cells (for display)."""

    key: str  # stable across polls: "rank 3", or the target for one that never answered
    rank: int | None
    target: str
    host: str
    alive: bool
    stale_s: float | None
    steps_done: int | None  # step_number() of its last step: steps completed
    used: int | None
    peak: int | None
    capacity: int | None
    headroom: int | None
    risk: Severity | None
    step_s: float | None
    overlap: float | None
    exposed_s: float | None
    busbw: float | None
    ended: bool = False  # its process has exited, or its recording has its end: its data is its last
    died: bool = False  # it ended, and not cleanly (RankView.died says how): never taken for a finished run
    final: bool = False  # every rank has ended (the job or the replay finished): its data is the run's final state
    # What the hang verdict says of it while it answers (zeromon.views.hang): "stuck", "waiting", ...; None: ok
    hang: str | None = None
    hang_level: str = "ok"  # "critical": it holds its peers up; "warn": it waits for them, or the job is idle

    @property
    def answering(self) -> bool:
        """Alive, or ended cleanly with the whole run: nothing to warn about."""
        return self.alive or (self.final and not self.died)

    @property
    def exposed_share(self) -> float | None:
        if self.exposed_s is None or not self.step_s:
            return None
        return self.exposed_s / self.step_s

    @property
    def state(self) -> str:
        if self.alive:
            return self.hang or "alive"
        if self.died:
            return "died"
        if self.ended:
            return "ended"
        return "down" if self.stale_s is None else f"stale {short_duration(self.stale_s)}"

    @property
    def headroom_share(self) -> float | None:
        if self.headroom is None or not self.capacity:
            return None
        return self.headroom / self.capacity

    @property
    def level(self) -> str:
        """Colour class: 'critical', 'warn', 'stale' (not answering) or 'ok'; a hang before the OOM risk."""
        if self.hang_level != "ok":
            return self.hang_level
        if self.risk is Severity.CRITICAL:
            return "critical"
        if self.risk is Severity.WARN:
            return "warn"
        return "ok" if self.answering else "stale"

    def cells(self, worst: bool = False) -> tuple[str, ...]:
        """The cells in COLUMNS order; ``worst``: this is the row that stands out (both marks show
        on a worst rank that is stale)."""
        marks = (WORST_MARK if worst else "") + ("" if self.answering else STALE_MARK)
        memory = (f"{memory_bar(self.used, self.peak, self.capacity, MEMORY_BAR_CELLS)} "
                  f"{memory_numbers(self.used, self.peak, self.capacity)}")
        return (f"{marks:>2} {self.rank if self.rank is not None else '?'}",
                RISK_WORDS[self.risk] if self.risk is not None else "-", short_bytes(self.headroom), memory,
                ms(self.step_s), pct(self.overlap), ms(self.exposed_s), pct(self.exposed_share), self.state,
                str(self.steps_done) if self.steps_done is not None else "-", rate(self.busbw), self.host)


def _busbw(rank: RankView) -> float | None:
    """The bus bandwidth of the collective this rank spends most time in (nccl-tests' busbw)."""
    timed = [c for c in rank.collectives if c.busbw_bytes_s is not None]
    if not timed:
        return None
    return max(timed, key=lambda c: c.seconds).busbw_bytes_s


def rank_key(rank: RankView) -> str:
    """A rank's row key, stable across polls: "rank 3", or the target of one that never answered."""
    return f"rank {rank.rank}" if rank.rank is not None else rank.target


def rank_row(rank: RankView, final: bool = False, hang: tuple[str, str] | None = None) -> RankRow:
    """``final``: every rank of the view has ended (rank_rows says); ``hang``: (state, level) of the rank in the
    view's hang verdict, shown while it answers (as `zeromon live` does)."""
    last = rank.last_step
    m, oom = rank.memory, rank.oom
    used = (m.allocated if m.allocated is not None else m.rss) if m is not None else None
    peak = oom.peak_bytes if oom is not None and oom.peak_bytes is not None else (
        m.peak_allocated if m is not None and m.peak_allocated is not None else used)
    if peak is not None and used is not None:
        peak = max(peak, used)  # the forecast's peak can be a sample older than the current level
    capacity = m.capacity if m is not None and m.capacity else (oom.capacity_bytes if oom is not None else None)
    headroom = oom.headroom_bytes if oom is not None else (
        capacity - peak if capacity is not None and peak is not None else None)
    host = rank.host or (rank.run_info.host if rank.run_info is not None else rank.target.rsplit(":", 1)[0])
    return RankRow(
        key=rank_key(rank), rank=rank.rank, target=rank.target,
        host=host, alive=rank.alive, stale_s=rank.stale_s, steps_done=step_number(last.step) if last else None,
        used=used, peak=peak,
        capacity=capacity, headroom=headroom, risk=oom.risk if oom is not None else None,
        step_s=last.duration_s if last else None, overlap=last.overlap_ratio if last else None,
        exposed_s=last.exposed_comm_s if last else None, busbw=_busbw(rank), ended=rank.ended,
        died=rank.died is not None and not rank.alive, final=final and rank.ended,
        hang=hang[0] if hang is not None and rank.alive else None,
        hang_level=hang[1] if hang is not None and rank.alive else "ok")


def run_ended(view: FleetView) -> bool:
    """Every rank's process has exited: what the view holds is the run's final state."""
    return bool(view.ranks) and all(r.ended for r in view.ranks)


def rank_rows(view: FleetView) -> tuple[RankRow, ...]:
    final = run_ended(view)
    states = hang_states(view.hang)
    return tuple(rank_row(r, final, states.get(r.rank) if r.rank is not None else None) for r in view.ranks)


def _badness(row: RankRow) -> tuple[float, ...]:
    """Larger is worse: OOM risk first, then the least headroom, the most exposed share, the longest step."""
    risk = row.risk.rank if row.risk is not None else 0
    headroom = row.headroom_share
    return (risk, -headroom if headroom is not None else -2.0, row.exposed_share or 0.0, row.step_s or 0.0)


def worst_row(rows: Iterable[RankRow]) -> RankRow | None:
    """The row that stands out: the rank closest to trouble among those with data (None without any),
    an answering one while any answers (a stale rank's data is old; it has its own mark)."""
    candidates = [r for r in rows if r.steps_done is not None or r.used is not None]
    answering = [r for r in candidates if r.answering]
    return max(answering or candidates, key=_badness, default=None)


# Sort orders for `s` and the column headers: name, column it belongs to, key (ascending = shown first).
def _nulls_last(value: float | None, descending: bool) -> tuple[bool, float]:
    if value is None:
        return (True, 0.0)
    return (False, -value if descending else value)


SORTS: tuple[tuple[str, str, Callable[[RankRow], object]], ...] = (
    ("rank", "rank", lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.target)),
    ("risk", "risk", lambda r: tuple(-v for v in _badness(r))),
    ("headroom", "headroom", lambda r: _nulls_last(r.headroom_share, descending=False)),
    ("memory", "memory", lambda r: _nulls_last(r.used, descending=True)),
    ("step time", "step_ms", lambda r: _nulls_last(r.step_s, descending=True)),
    ("overlap", "overlap", lambda r: _nulls_last(r.overlap, descending=False)),
    ("exposed", "exposed_ms", lambda r: _nulls_last(r.exposed_share, descending=True)),
    ("busbw", "busbw", lambda r: _nulls_last(r.busbw, descending=False)),
    ("state", "state", lambda r: (r.alive, -(r.stale_s or 0.0))),
)
SORT_NAMES = tuple(name for name, _, _ in SORTS)
SORT_OF_COLUMN = {column: name for name, column, _ in SORTS} | {"exposed_pct": "exposed", "step": "rank",
                                                                 "host": "rank"}


def sort_rows(rows: Sequence[RankRow], sort: str) -> list[RankRow]:
    key = next(k for name, _, k in SORTS if name == sort)
    return sorted(rows, key=lambda r: (key(r), r.rank if r.rank is not None else 1 << 30))  # type: ignore[arg-type]


# --- filtering ---------------------------------------------------------------------------------------

@frozen
class RankFilter:
    """`/` filter: rank numbers ('3', '0-7'), states ('stale', 'alive', 'ended'; the hang verdict's 'stuck',
    'waiting', ...), risks ('ok', 'warn', 'crit'), or any other word as part of the host or target. Several terms:
    a rank matching any is shown."""

    text: str

    def terms(self) -> list[str]:
        return self.text.replace(",", " ").split()

    def matches(self, row: RankRow) -> bool:
        terms = self.terms()
        return not terms or any(_term_matches(t.lower(), row) for t in terms)


def _term_matches(term: str, row: RankRow) -> bool:
    low, dash, high = term.partition("-")
    if low.isdigit() and (not dash or high.isdigit()):
        if row.rank is None:
            return False
        return int(low) <= row.rank <= int(high) if dash else row.rank == int(low)
    if term in ("stale", "down", "dead"):
        return not row.alive
    if term == "ended":
        return row.ended
    if term == "alive":
        return row.alive
    if term in HANG_STATES:
        return row.hang == term
    if term in ("ok", "warn", "crit", "critical"):
        return row.risk is not None and RISK_WORDS[row.risk] == term[:4]
    return term in row.host.lower() or term in row.target.lower()


# --- the header --------------------------------------------------------------------------------------

_FRAMEWORKS = {"deepspeed": "DeepSpeed", "fsdp2": "FSDP2", "fsdp1": "FSDP1", "ddp": "DDP", "none": "torch"}


@frozen
class Header:
    source: str  # what is watched (FleetView.source), shown until a rank says what runs
    known: bool  # a rank told its run info
    job: str
    framework: str  # "DeepSpeed 0.19.8", "FSDP2 (torch 2.13.0)"
    strategy: str  # "ZeRO-3", "FULL_SHARD"
    world: str
    dtypes: str
    step: str
    steps_per_s: str
    uptime: str
    answering: str  # "2/2 ranks answering"
    worst_risk: Severity | None
    worst_risk_text: str
    worst_overlap: float | None
    worst_overlap_text: str


def _steps_per_s(rank: RankView) -> float | None:
    recent = rank.steps[-RATE_STEPS:]
    if len(recent) < 2 or recent[-1].end_ns <= recent[0].end_ns:
        return None
    return (recent[-1].step - recent[0].step) / ((recent[-1].end_ns - recent[0].end_ns) / 1e9)


def header(view: FleetView, rows: Sequence[RankRow], uptime_s: float | None, uptime_exact: bool = True) -> Header:
    infos = [r.run_info for r in view.ranks if r.run_info is not None]
    info = infos[0] if infos else None
    job = next((r.job for r in view.ranks if r.job), None) or (info.job if info else "-")
    if info is None:
        framework, strategy, dtypes = "-", "-", "-"
    else:
        name = _FRAMEWORKS.get(info.framework, info.framework)
        framework = (f"{name} {info.framework_version}" if info.framework == "deepspeed" and info.framework_version
                     else f"{name} (torch {info.torch_version})" if info.torch_version else name)
        strategy = f"ZeRO-{info.zero_stage}" if info.zero_stage is not None else (info.fsdp_strategy or "-")
        dtypes = " ".join(f"{what} {dtype}" for what, dtype in (("param", info.param_dtype),
                                                                 ("reduce", info.reduce_dtype)) if dtype) or "-"
    worlds = {r.world_size for r in view.ranks if r.world_size} | {i.world_size for i in infos}
    world = "/".join(str(w) for w in sorted(worlds)) if worlds else "-"
    steps = [r.steps_done for r in rows if r.steps_done is not None]
    step = "-" if not steps else str(max(steps)) if min(steps) == max(steps) else f"{min(steps)}–{max(steps)}"
    rates = [v for r in view.ranks if r.alive and (v := _steps_per_s(r)) is not None]
    steps_per_s = f"{statistics.median(rates):.2f}" if rates else "-"
    uptime = "-" if uptime_s is None else duration(uptime_s) if uptime_exact else f"≥{duration(uptime_s)}"

    risky = [r for r in rows if r.risk is not None]
    if risky:
        worst = max(risky, key=_badness)
        risk_text = f"{worst.risk.value if worst.risk else '-'}: rank {worst.rank}, headroom {short_bytes(worst.headroom)}"
        worst_risk = worst.risk
    else:
        risk_text, worst_risk = "-", None
    overlapping = [r for r in rows if r.overlap is not None]
    if overlapping:
        low = min(overlapping, key=lambda r: (r.overlap or 0.0, r.rank or 0))
        overlap_text = f"{pct(low.overlap)} (rank {low.rank})"
        worst_overlap = low.overlap
    else:
        overlap_text, worst_overlap = "-", None
    h = Header(source=view.source, known=info is not None, job=job, framework=framework, strategy=strategy, world=world, dtypes=dtypes, step=step,
               steps_per_s=steps_per_s, uptime=uptime, answering=f"{view.alive}/{len(view.ranks)} ranks answering",
               worst_risk=worst_risk, worst_risk_text=risk_text, worst_overlap=worst_overlap,
               worst_overlap_text=overlap_text)
    # The rows are the worst few of a job: its numbers come from Prometheus's rules.
    return job_header(h, view.totals, len(view.ranks)) if view.totals is not None else h


def job_header(h: Header, t: FleetTotals, shown: int) -> Header:
    """The header of a view whose rows are the worst ranks of a job (Prometheus's recording rules): the
    counts, steps, risk and overlap of the whole job. The mode is said here too: the TUI shows the
    source line only until a rank says what runs."""
    step = h.step
    if t.step_min is not None and t.step_max is not None:
        behind, ahead = step_number(t.step_min), step_number(t.step_max)
        step = str(ahead) if behind == ahead else f"{behind}–{ahead}"
    risk_text, worst_risk = h.worst_risk_text, h.worst_risk
    if t.worst_risk is not None:
        counts = ", ".join(f"{n} {RISK_WORDS[s]}" for s in (Severity.CRITICAL, Severity.WARN)
                           if (n := t.risk_ranks.get(s.value, 0)))
        risk_text = f"{risk_text} ({counts} of {t.ranks} ranks)" if counts else f"{t.worst_risk.value} ({t.ranks} ranks)"
        worst_risk = t.worst_risk
    overlap_text, worst_overlap = h.worst_overlap_text, h.worst_overlap
    if t.overlap_min is not None and (worst_overlap is None or t.overlap_min < worst_overlap):
        overlap_text, worst_overlap = f"{pct(t.overlap_min)} (least of {t.ranks} ranks)", t.overlap_min
    return dataclasses.replace(
        h, answering=f"{t.ranks}/{t.ranks_expected} ranks answering · worst {shown} (recorded rules)", step=step,
        worst_risk=worst_risk, worst_risk_text=risk_text, worst_overlap=worst_overlap, worst_overlap_text=overlap_text)


class RunClock:
    """Uptime: since the earliest agent start the ranks report (remembered: a run's final state read
    from its recording says none), else since the start of the earliest step seen, exact once step 0
    has been seen (a view keeps each rank's last 64 steps; attached later, that uptime is a lower bound)."""

    def __init__(self) -> None:
        self.agent_start_ns: int | None = None
        self.first_start_ns: int | None = None
        self.first_step: int | None = None

    def observe(self, view: FleetView) -> tuple[float | None, bool]:
        started = [rank.start_ns for rank in view.ranks if rank.start_ns is not None]
        if started:
            self.agent_start_ns = min(started)
        answered = [rank.t_ns for rank in view.ranks if rank.t_ns is not None]
        now = max(answered) if answered and run_ended(view) else view.t_ns  # an ended run's uptime stops
        if self.agent_start_ns is not None:
            return max(0.0, (now - self.agent_start_ns) / 1e9), True
        for rank in view.ranks:
            if rank.steps:
                first = rank.steps[0]
                if self.first_start_ns is None or first.start_ns < self.first_start_ns:
                    self.first_start_ns, self.first_step = first.start_ns, first.step
        if self.first_start_ns is None:
            return None, True
        return max(0.0, (now - self.first_start_ns) / 1e9), self.first_step == 0


# --- sparklines --------------------------------------------------------------------------------------

@frozen
class Trends:
    """Per step, the largest over the ranks shown: the rank that sets the pace or will OOM first."""

    steps: tuple[int, ...]
    peak_memory: tuple[float, ...]  # bytes
    step_s: tuple[float, ...]
    exposed_s: tuple[float, ...]


def trends(ranks: Iterable[RankView], n: int = TREND_STEPS) -> Trends:
    memory: dict[int, float] = {}
    step_s: dict[int, float] = {}
    exposed: dict[int, float] = {}
    for rank in ranks:
        for s in rank.steps[-n:]:
            if s.step < 0:
                continue
            if s.peak_memory is not None and s.peak_memory > memory.get(s.step, -1.0):
                memory[s.step] = s.peak_memory
            if s.duration_s > step_s.get(s.step, -1.0):
                step_s[s.step] = s.duration_s
            if s.exposed_comm_s is not None and s.exposed_comm_s > exposed.get(s.step, -1.0):
                exposed[s.step] = s.exposed_comm_s
    steps = tuple(sorted(step_s)[-n:])
    return Trends(steps=steps, peak_memory=tuple(memory.get(s, 0.0) for s in steps),
                  step_s=tuple(step_s[s] for s in steps), exposed_s=tuple(exposed.get(s, 0.0) for s in steps))


# --- findings ----------------------------------------------------------------------------------------

@frozen
class FindingItem:
    """One problem across ranks (a FindingGroup), and when the TUI first saw it."""

    group: FindingGroup
    first_seen_ns: int

    @property
    def rank_key(self) -> str | None:
        """The row key of the group's worst rank (the rank to open), None for a finding about the whole job."""
        rank = self.group.worst_rank
        return None if rank is None else f"rank {rank}"


def on_cpu(ranks: Iterable[RankView]) -> bool:
    """Whether the run trains on CPU: every rank whose memory is known samples the host's (gloo, no GPU
    streams, so its overlap is near 0 % by nature: CPU_OVERLAP_NOTE says so beside it)."""
    devices = {r.memory.device for r in ranks if r.memory is not None}
    return devices == {"cpu"}


def fleet_findings(ranks: Sequence[RankView]) -> list[Finding]:
    """Every rank's findings, and those that need all ranks (straggler, memory imbalance)."""
    return [f for r in ranks for f in r.findings] + cross_rank_findings(ranks)


def cross_rank_findings(ranks: Sequence[RankView]) -> list[Finding]:
    """The findings no rank has of its own, found from every rank's steps and peaks: a straggler, memory
    imbalance (zeromon.analysis.live_stragglers)."""
    # While some rank answers, a rank that does not is left out (its steps are stale); once none does, the
    # run has ended and every rank's last steps are its final state: the straggler stays found.
    running = any(r.alive for r in ranks)
    steps = {r.rank: r.steps for r in ranks if r.rank is not None and (r.alive or not running) and r.steps}
    straggler = straggler_finding(steps)
    peaks = {row.rank: row.peak for row in map(rank_row, ranks) if row.rank is not None and row.peak is not None}
    imbalance = memory_imbalance_finding(peaks)
    return [f for f in (straggler, imbalance) if f is not None]


# The kinds whose rank is best seen on the dashboard's Communication page; every other kind is about memory.
COMMUNICATION_KINDS = ("poor_overlap", "straggler", "step_skew")


def finding_page(kind: str) -> str:
    """The dashboard page that shows a finding's rank: "communication" or "memory"."""
    return "communication" if kind in COMMUNICATION_KINDS else "memory"


class FindingsLog:
    """The findings as one entry per problem across ranks (zeromon.analysis.finding_groups), newest first:
    it remembers when each problem (kind, severity, remedies) appeared."""

    def __init__(self) -> None:
        self._first_seen: dict[tuple[object, ...], int] = {}

    def update(self, findings: Iterable[Finding], t_ns: int) -> tuple[FindingItem, ...]:
        groups = group_findings(f for f in findings if f.severity is not Severity.OK)
        self._first_seen = {g.key: self._first_seen.get(g.key, t_ns) for g in groups}  # gone ones start anew
        # Newest first; among those seen at once, the grouping's order (worst severity, most ranks first).
        items = [FindingItem(g, self._first_seen[g.key]) for g in groups]
        items.sort(key=lambda i: -i.first_seen_ns)
        return tuple(items)


# --- no agent ----------------------------------------------------------------------------------------

@frozen
class JobStatus:
    """The command that `zeromon run --tui` started, as the TUI tells it."""

    pid: int
    log: str  # where its output goes
    exit_code: int | None = None  # None while it runs


def no_agent_text(view: FleetView, interval_s: float, job: JobStatus | None = None) -> str:
    """Where it looked, why nothing answers (when that says more than where), and what to do: start
    a run, wait for the job's ranks (`zeromon run --tui`), or check Prometheus."""
    if job is not None and job.exit_code is not None:
        return "\n".join([
            f"The job ended (exit status {job.exit_code}) before any rank registered its agent.", "",
            f"Its output: {job.log}", "",
            "A rank registers when it creates its torch.distributed process group",
            "(unless ZEROMON_ENABLE=0 or ZEROMON_ENDPOINT=0 is set).", "", "q quits."])
    run_folder = view.source.removeprefix("run ") if view.source.startswith("run ") else None
    heading = ("Waiting for the job's ranks to start and register their agents." if job is not None
               else f"Waiting for the ranks of {run_folder} to start and register their agents."
               if run_folder is not None else "No zeromon agent is answering.")
    lines = [heading, "", "Looked at:"]
    lines += [f"  • {place}" for place in view.looked_at] or ["  • (nowhere: no target, run folder or index)"]
    # LiveSource's "no agent found (looked at: ...)" only repeats the list above.
    if view.error and not view.error.startswith("no agent found"):
        lines += ["", f"Why: {view.error}"]
    if job is not None:
        lines += ["", f"The job runs (pid {job.pid}; its output: {job.log}). Each rank registers",
                  "when it creates its torch.distributed process group."]
    elif run_folder is not None:
        lines += ["", "Each rank registers when it creates its torch.distributed process group (unless",
                  "ZEROMON_ENABLE=0 or ZEROMON_ENDPOINT=0 is set). A run folder is the --out of",
                  "  zeromon run --out FOLDER -- torchrun --nproc-per-node 2 train.py"]
    elif view.source.startswith("prometheus"):
        lines += ["", "Check that Prometheus is up at that address and scrapes the ranks' agents:",
                  "  zeromon targets --write FILE",
                  "keeps the file_sd list that its scrape config reads (honor_labels: true)."]
    else:
        lines += ["", "Start a run with the agent in every rank:",
                  "  zeromon run -- torchrun --nproc-per-node 2 train.py",
                  "or attach it in the training script after init_process_group:",
                  "  import zeromon_agent; zeromon_agent.attach(model=model, optimizer=optimizer)"]
    lines += ["", f"Still looking, every {interval_s:g} s…"]
    return "\n".join(lines)
