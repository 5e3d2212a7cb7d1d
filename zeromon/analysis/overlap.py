"""Communication/computation overlap and exposed communication, as Holistic Trace Analysis defines them.

overlap ratio = |comm ∩ comp| / |comm|, over the unions of communication and computation intervals
(Holistic Trace Analysis's definition, computed as a sweep over +1/-1 communication and +2/-2 computation markers, overlap where the sum
is 3, which is exactly the intersection of the two unions). Exposed communication = |comm| - overlap:
the time the window would shrink if communication were free.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from zeromon.analysis.intervals import Interval, clip, intersect, merge, total
from zeromon.model.classes import frozen


@frozen
class Overlap:
    window_s: float  # the span analysed (a step), 0 if none was given and nothing happened
    comm_s: float  # union of communication
    comp_s: float  # union of computation
    overlap_s: float  # communication and computation at the same time
    exposed_comm_s: float  # comm_s - overlap_s
    idle_s: float  # window with neither (0 without a window)

    @property
    def overlap_ratio(self) -> float | None:
        """overlap / communication (HTA's comp_comm_overlap_pctg / 100); None without communication."""
        return self.overlap_s / self.comm_s if self.comm_s > 0 else None

    @property
    def exposed_share(self) -> float | None:
        """Exposed communication as a share of the window (step time)."""
        return self.exposed_comm_s / self.window_s if self.window_s > 0 else None


def comm_comp_overlap(comm: Iterable[Interval], comp: Iterable[Interval],
                      window: Interval | None = None) -> Overlap:
    """Overlap of communication and computation intervals (ns), optionally clipped to a window."""
    comm_u = merge(comm)
    comp_u = merge(comp)
    if window is not None:
        comm_u = clip(comm_u, window)
        comp_u = clip(comp_u, window)
    return overlap_of_merged(comm_u, comp_u, window)


def overlap_of_merged(comm_u: Sequence[Interval], comp_u: Sequence[Interval],
                      window: Interval | None = None) -> Overlap:
    """The same, for unions already merged (and clipped to the window): callers that cut many windows
    from one merged list skip the per-window merge."""
    comm_ns, comp_ns, overlap_ns = total(comm_u), total(comp_u), total(intersect(comm_u, comp_u))
    window_ns = (window[1] - window[0]) if window is not None else 0
    busy_ns = comm_ns + comp_ns - overlap_ns
    return Overlap(window_s=window_ns / 1e9, comm_s=comm_ns / 1e9, comp_s=comp_ns / 1e9,
                   overlap_s=overlap_ns / 1e9, exposed_comm_s=(comm_ns - overlap_ns) / 1e9,
                   idle_s=max(0, window_ns - busy_ns) / 1e9 if window is not None else 0.0)
