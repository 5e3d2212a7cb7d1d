"""One entry per problem across ranks (zeromon.analysis.finding_groups): the invariants, with any findings
(hypothesis), and the words of a fleet's groups."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromon.analysis.comm_advice import overlap_findings_of_medians, with_waiting_for_peers
from zeromon.analysis.finding_groups import HEADLINES, group_findings, group_key
from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.oom import forecast
from zeromon.model import MemorySample, Recording, RunInfo, StepSummary
from zeromon.model.units import parse_rank_ranges, rank_ranges

REMEDIES = (("prefetch",), ("prefetch", "a larger micro-batch"), ("make rank 8 faster first", "prefetch"), ())
KINDS = ("poor_overlap", "straggler", "memory_growth", "oom_no_data", "a_kind_of_tomorrow")


@st.composite
def _findings(draw: st.DrawFn) -> list[Finding]:
    out = []
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(KINDS))
        rank = draw(st.one_of(st.none(), st.integers(0, 300)))
        keys = {key for h in HEADLINES.get(kind, ()) for key in (h.key, *(k for k, _ in h.also))}
        metrics = {key: draw(st.floats(0, 10, allow_nan=False)) for key in sorted(keys) if draw(st.booleans())}
        out.append(Finding(kind=kind, severity=draw(st.sampled_from(list(Severity))),
                           title=f"rank {rank}: something" if rank is not None else "the job: something",
                           rank=rank, evidence=(f"seen on {rank}",), remedies=draw(st.sampled_from(REMEDIES)),
                           metrics=metrics))
    return out


@settings(max_examples=300, deadline=None)
@given(_findings())
def test_every_finding_is_in_exactly_one_group_and_a_group_never_mixes_kind_severity_or_remedies(
        findings: list[Finding]) -> None:
    groups = group_findings(findings)
    placed = Counter(id(f) for g in groups for f in g.findings)
    assert placed == Counter(id(f) for f in findings)  # each once, none made up
    for g in groups:
        assert {(f.kind, f.severity, f.remedies) for f in g.findings} == {(g.kind, g.severity, g.remedies)}
        assert g.worst in g.findings and g.evidence == g.worst.evidence
        assert g.ranks == tuple(sorted({f.rank for f in g.findings if f.rank is not None}))
        if g.worst.rank is None:  # about the whole job: an entry of its own, or of the same words again
            assert g.ranks == () and {(f.title, f.evidence, f.rank) for f in g.findings} == {
                (g.worst.title, g.worst.evidence, None)}
        if len(g.ranks) > 1:
            assert not re.search(rf"\brank {g.worst_rank}\b", g.title)  # no single rank named for many
        if g.headline is not None:
            values = [f.metrics[g.headline.key] for f in g.findings]
            assert (g.low, g.high) == (min(values), max(values))
            assert g.worst.metrics[g.headline.key] == (min(values) if g.headline.lower_is_worse else max(values))
            assert g.headline == next(h for h in HEADLINES[g.kind] if all(h.fits(f) for f in g.findings))
    # No two groups of ranks that could have been one.
    keys = [g.key for g in groups]
    assert len(keys) == len(set(keys))
    # The worst severity first; within one, the whole job, then the most ranks.
    order = [(-g.severity.rank, -(float("inf") if not g.ranks else len(g.ranks))) for g in groups]
    assert order == sorted(order)


@settings(max_examples=500, deadline=None)
@given(st.sets(st.integers(0, 2000), min_size=1, max_size=300))
def test_the_ranks_text_reads_back_as_the_ranks(ranks: set[int]) -> None:
    text = rank_ranges(ranks)
    assert parse_rank_ranges(text) == tuple(sorted(ranks))
    assert text.startswith("rank " if len(ranks) == 1 else "ranks ")


def test_the_ranks_text_is_compact() -> None:
    assert rank_ranges([5]) == "rank 5"
    assert rank_ranges([3, 0, 2, 1]) == "ranks 0-3"
    assert rank_ranges(r for r in range(256) if r != 17) == "ranks 0-255 but 17"
    assert rank_ranges([0, 2]) == "ranks 0, 2"  # a hole as large as what is named: listed, not left out
    assert rank_ranges([0, 1, 4, 6, 7]) == "ranks 0-1, 4, 6-7"
    assert rank_ranges(range(0, 256, 2), most=4) == "ranks 0, 2, 4, 6, … (128 ranks)"
    with pytest.raises(ValueError):
        parse_rank_ranges("the ranks 0-3")


def _overlap(rank: int, share: float, remedies: tuple[str, ...] = ("prefetch",),
             severity: Severity = Severity.CRITICAL) -> Finding:
    return Finding("poor_overlap", severity, f"rank {rank}: {share:.0%} of step time is exposed communication",
                   rank=rank, evidence=(f"rank {rank}'s median",), remedies=remedies, metrics={"exposed_share": share})


def test_a_fleets_overlap_is_one_entry_with_its_spread_worst_rank_and_remedies_once() -> None:
    findings = [_overlap(r, 0.72 + (r % 9) / 100) for r in range(256) if r not in (17, 40)]
    findings.append(_overlap(17, 0.30, severity=Severity.WARN))  # another severity: its own entry
    findings.append(_overlap(40, 0.75, remedies=("part of it is waiting for rank 17", "prefetch")))  # another cause
    findings.append(Finding("memory_growth", Severity.CRITICAL, "memory grows 8.00 MiB per step", rank=3,
                            remedies=("look for tensors kept across steps",),
                            metrics={"growth_bytes_per_step": 8 * 2**20}))
    findings.append(Finding("oom_no_data", Severity.INFO, "no memory samples recorded: nothing to forecast"))
    first, *rest = group_findings(findings)
    assert first.title == "ranks 0-255 but 17, 40: 72-80% of step time is exposed communication"
    assert first.worst_rank == 8 and first.worst_figure == "80%" and first.evidence == ("rank 8's median",)
    assert first.worst_words() == "worst: rank 8 (80%); the evidence is rank 8's"
    assert first.remedies == ("prefetch",) and len(first.findings) == 254
    assert [(g.severity.value, g.title) for g in rest] == [  # one rank each: by kind
        ("critical", "memory grows 8.00 MiB per step (rank 3)"),
        ("critical", "rank 40: 75% of step time is exposed communication"),
        ("warn", "rank 17: 30% of step time is exposed communication"),
        ("info", "no memory samples recorded: nothing to forecast")]
    assert all(g.worst_words() is None for g in rest)
    document = first.to_dict()
    assert document["ranks_text"] == "ranks 0-255 but 17, 40" and len(document["ranks"]) == 254
    assert document["figure"] == {"metric": "exposed_share", "low": 0.72, "high": pytest.approx(0.80), "text": "72-80%"}


def test_growing_memory_is_worst_where_capacity_is_nearest() -> None:
    findings = [Finding("memory_growth", Severity.CRITICAL, f"memory grows ... (rank {r})", rank=r,
                        remedies=("look for tensors kept across steps",),
                        metrics={"growth_bytes_per_step": growth * 2**20, "steps_to_capacity": steps})
                for r, growth, steps in ((0, 8.0, 120.0), (1, 8.4, 93.0), (2, 8.2, 101.0))]
    (group,) = group_findings(findings)
    assert group.title == "ranks 0-2: memory grows 8.00-8.40 MiB per step: capacity in ~93-120 steps"
    assert group.worst_rank == 1 and group.worst_figure == "~93 steps to capacity"
    assert group.worst_words() == "worst: rank 1 (~93 steps to capacity); the evidence is rank 1's"
    # One without a horizon (already over capacity): the spread of the growth alone.
    over = Finding("memory_growth", Severity.CRITICAL, "memory grows 9.00 MiB per step: already over capacity",
                   rank=3, remedies=findings[0].remedies, metrics={"growth_bytes_per_step": 9 * 2**20})
    (group,) = group_findings([*findings, over])
    assert group.title == "ranks 0-3: memory grows 8.00-9.00 MiB per step" and group.worst_rank == 3


def test_a_kind_without_a_headline_names_its_worst_rank_only_in_its_own_title() -> None:
    findings = [Finding("a_kind_of_tomorrow", Severity.WARN, f"rank {r} does something odd", rank=r) for r in (4, 2)]
    (group,) = group_findings(findings)
    assert group.spread is None and group.worst_rank == 2  # the lowest rank, where no figure says worse
    assert group.title == "ranks 2, 4: a kind of tomorrow (on rank 2: rank 2 does something odd)"
    assert group.worst_words() == "worst: rank 2; the evidence is rank 2's"


def test_the_same_finding_about_the_whole_job_twice_is_one_entry_two_different_are_two() -> None:
    job = Finding("oom_no_data", Severity.INFO, "no memory samples recorded")
    other = Finding("oom_no_data", Severity.INFO, "no step recorded")
    assert group_key(job) == group_key(Finding("oom_no_data", Severity.INFO, "no memory samples recorded"))
    assert len(group_findings([job, job, other])) == 2


# --- the producers' own findings: a rank's figures in its evidence, so that one cause is one entry -----------

GiB = 2**30


def _peak_of(rank: int, allocated: int, categories: dict[str, int]) -> Finding:
    """The peak-near-capacity finding zeromon.analysis.oom makes of a GPU rank that holds ``allocated`` of
    80 GiB at each of 3 steps, walked into ``categories`` (an FSDP2 run in fp32 with AdamW)."""
    info = RunInfo(rank=rank, local_rank=rank % 8, host="h", pid=1, job="j", framework="fsdp2",
                   framework_version=None, torch_version="2.13.0", backend="nccl", device="cuda:0", world_size=4,
                   zero_stage=None, fsdp_strategy=None, param_dtype="float32", reduce_dtype=None, optimizer="AdamW",
                   knobs={})
    memory = [MemorySample(rank=rank, step=s, phase="other", t_ns=s * 10**9, device="cuda:0", allocated=allocated,
                           reserved=allocated, active=allocated, peak_allocated=allocated, peak_reserved=allocated,
                           inactive_split=0, num_alloc_retries=0, num_ooms=0, capacity=80 * GiB,
                           free=80 * GiB - allocated, rss=2 * GiB, categories=categories) for s in range(3)]
    steps = [StepSummary(rank=rank, step=s, start_ns=s * 10**9, end_ns=s * 10**9 + 5 * 10**8, phase_s={},
                         collectives=0, comm_bytes=0, comm_bytes_by_op={}, comm_union_s=0.0, blocked_s=0.0,
                         peak_memory=None) for s in range(3)]
    recording = Recording(path=Path(f"rank-{rank}.jsonl"), header={"rank": rank}, memory=memory, steps=steps,
                          run_info=info)
    (peak,) = [f for f in forecast(recording).findings if f.kind == "peak_near_capacity"]
    return peak


def test_ranks_whose_memory_differs_for_one_cause_are_one_entry_and_another_cause_is_its_own() -> None:
    """Two ranks near capacity by their activations, each with its own figures (the activations, the peak),
    offer the same remedies and are one entry; a rank whose peak is mostly outside the categories (find what
    holds it first) is another cause: its own entry, though of the same kind and severity. Each rank's bytes stay
    in its evidence."""
    held = [_peak_of(0, 70 * GiB, {"sharded_params": GiB, "activations": 30 * GiB}),
            _peak_of(1, 74 * GiB, {"sharded_params": GiB, "activations": 33 * GiB}),
            _peak_of(3, 72 * GiB, {"sharded_params": GiB, "activations": 32 * GiB})]
    untracked = _peak_of(2, 72 * GiB, {"sharded_params": GiB, "activations": 2 * GiB, "other": 69 * GiB})
    assert {f.severity for f in [*held, untracked]} == {Severity.WARN}
    by_activations, elsewhere = group_findings([*held, untracked])
    assert by_activations.ranks == (0, 1, 3) and elsewhere.ranks == (2,)
    assert by_activations.title == "ranks 0-1, 3: peak memory at 88-92% of capacity"
    assert by_activations.worst_rank == 1 and "activations 33.00 GiB" in " ".join(by_activations.evidence)
    assert any(r.startswith("activation checkpointing: ") for r in by_activations.remedies)
    assert not any("GiB" in r for g in (by_activations, elsewhere) for r in g.remedies)  # the figures: evidence
    assert "memory_viz" in elsewhere.remedies[0]
    assert "act only on what the categories hold (the evidence says how much)" in elsewhere.remedies[-1]
    assert any("hold 3.00 GiB of the 72.00 GiB" in e for e in elsewhere.evidence)
    # Two ranks mostly outside their categories, by different amounts, are one entry too.
    other = _peak_of(5, 70 * GiB, {"sharded_params": GiB, "activations": GiB, "other": 68 * GiB})
    (outside,) = group_findings([untracked, other])
    assert outside.ranks == (2, 5)


def test_ranks_waiting_for_one_straggler_by_different_shares_are_one_entry_another_straggler_its_own() -> None:
    """Exposed communication that is 30% or 80% waiting for rank 7 is one cause (the share is each rank's
    evidence); waiting for rank 9 is another."""
    def waiting(rank: int, waited_s: float, late: int) -> Finding:
        (poor,) = overlap_findings_of_medians(rank, 0.4, 0.2, exposed_s=0.04, step_s=0.1, info=None)
        return with_waiting_for_peers(poor, exposed_s=1.0, waited_s=waited_s, late_ranks=[late])

    findings = [waiting(0, 0.3, 7), waiting(1, 0.8, 7), waiting(2, 0.55, 7), waiting(3, 0.8, 9)]
    for_seven, for_nine = group_findings(findings)
    assert for_seven.ranks == (0, 1, 2) and for_nine.ranks == (3,)
    assert for_seven.remedies[0].startswith("part of it is waiting for rank 7 (the evidence says how much)")
    assert for_nine.remedies[0].startswith("part of it is waiting for rank 9")
    assert "(30%) was waiting for rank 7" in findings[0].evidence[-1]
    assert "(80%) was waiting for rank 7" in findings[1].evidence[-1]
