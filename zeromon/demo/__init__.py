"""`zeromon demo`'s scenarios as data: what each training does, the environment it runs in, and the
finding zeromon must raise for it. The command and the tests read them here.

The training itself is ``train.py`` beside this file (the launcher, which starts the ranks) and ``training.py``
(what each rank runs), shipped in the package (so the demo runs from an installed wheel, with no checkout) and
started as a script under `zeromon run`; they import torch only, and never zeromon.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import field
from pathlib import Path

from zeromon.analysis.findings import Finding, Severity
from zeromon.model.classes import frozen

TRAIN_SCRIPT = Path(__file__).resolve().with_name("train.py")
RANKS = 2
DEFAULT_STEPS = 60  # ~20 s of training at ~0.32 s a step, after torch's and gloo's start
# The leak's capacity: small enough that 8 MiB a step reaches it within minutes (critical: within 10
# minutes), large enough for a rank's starting RSS (torch and a gloo group).
LEAK_CAPACITY = "1536MiB"


@frozen
class Scenario:
    name: str
    training: str  # what the training does, in one line
    expect: str  # what zeromon raises for it, in the words its views use
    kinds: tuple[str, ...]  # finding kinds that count as that (none: no warning may appear)
    env: Mapping[str, str] = field(default_factory=dict)  # for the ranks, besides the demo's own
    note: str = ""  # said on the terminal before it starts

    def found(self, findings: Iterable[Finding]) -> list[Finding]:
        """The findings (warn or worse) that show this scenario's problem; for ``healthy``, any warning."""
        warnings = [f for f in findings if f.severity.rank >= Severity.WARN.rank]
        if not self.kinds:
            return warnings
        return [f for f in warnings if f.kind in self.kinds]

    def passed(self, findings: Iterable[Finding]) -> bool:
        """Whether the run showed what the scenario is for: its finding, or (healthy) no warning."""
        found = self.found(findings)
        return not found if not self.kinds else bool(found)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", "FSDP2, two ranks: 300 ms of compute and two small collectives a step",
             "no warning: memory flat, communication a small share of the step", kinds=()),
    Scenario("leak", "the healthy run, keeping 8 MiB more alive every step (tensors kept in a list)",
             "an OOM forecast: 'memory grows ~8 MiB per step: capacity in ~N steps'",
             kinds=("memory_growth", "peak_near_capacity", "oom_recorded"),
             env={"ZEROMON_CPU_CAPACITY": LEAK_CAPACITY},
             note=(f"each rank's memory capacity is set to {LEAK_CAPACITY} (ZEROMON_CPU_CAPACITY): on CPU zeromon "
                   "forecasts against the host's RAM shared by its ranks, which the leak would take hours to "
                   "reach")),
    Scenario("exposed", "FSDP2, layers gathered again in backward, 5 ms of compute a step",
             "poor overlap: 'rank r: N% of step time is exposed communication'", kinds=("poor_overlap",)),
    Scenario("straggler", "the healthy run, with rank 1 computing 100 ms more every step",
             "a straggler: rank 1 is the one its peer waits for at every collective", kinds=("straggler",)),
)}
