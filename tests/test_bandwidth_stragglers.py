"""Bandwidth with nccl-tests' definitions; stragglers and imbalance from a real run built to have them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from zeromon.analysis.bandwidth import bandwidth_table, bus_factor, event_bandwidth, size_bucket
from zeromon.analysis.stragglers import analyze_imbalance
from zeromon.model import CollectiveEvent, read_run

from conftest import REPO, child_env, torchrun_args


def _event(op: str, n: int, b_in: int, b_out: int, seconds: float, timing: str = "sync") -> CollectiveEvent:
    return CollectiveEvent(seq=1, rank=0, step=1, phase="backward", op=op, api=op, bytes_in=b_in, bytes_out=b_out,
                           dtype="float32", group_size=n, async_op=False, issue_ns=0,
                           complete_ns=int(seconds * 1e9), blocked_s=seconds, timing=timing, meaning="unknown")


def test_nccl_tests_factors() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert bus_factor("broadcast", 16) == 1.0
    # all_reduce of 1 GB in 1 s on 8 ranks: algbw 1 GB/s, busbw 1.75 GB/s.
    assert event_bandwidth(_event("all_reduce", 8, 10**9, 10**9, 1.0)) == pytest.approx((1e9, 1.75e9))
    # all_gather: S is the gathered output; reduce_scatter: S is the full input.
    assert event_bandwidth(_event("all_gather", 4, 2.5e8, 10**9, 0.5)) == pytest.approx((2e9, 1.5e9))  # type: ignore[arg-type]
    assert event_bandwidth(_event("reduce_scatter", 4, 10**9, 2.5e8, 0.5)) == pytest.approx((2e9, 1.5e9))  # type: ignore[arg-type]
    # A completion that is only bounded (or never seen) measures nothing.
    assert event_bandwidth(_event("all_reduce", 8, 10**9, 10**9, 1.0, timing="bound")) is None


def test_table_groups_by_op_and_size() -> None:
    events = [_event("all_reduce", 2, 4 * 2**20, 4 * 2**20, t) for t in (0.001, 0.002, 0.004)]
    events.append(_event("all_gather", 2, 2**20, 2**21, 0.001))
    rows = bandwidth_table(events, peak_busbw=4e9)
    (ar,) = [r for r in rows if r.op == "all_reduce"]
    assert ar.count == 3 and ar.size_bucket_bytes == size_bucket(4 * 2**20) == 4**11
    assert ar.median_time_s == pytest.approx(0.002)
    assert ar.median_busbw == pytest.approx(4 * 2**20 / 0.002)  # factor 2(n-1)/n = 1 at n = 2
    assert ar.peak_share == pytest.approx(ar.median_busbw / 4e9)
    assert rows[0].op == "all_reduce", "largest traffic first"


@pytest.mark.distributed
def test_straggler_and_memory_imbalance_are_named(tmp_path: Path) -> None:
    delay, steps = 0.1, 6
    out = subprocess.run(
        torchrun_args(2, REPO / "tests" / "scenarios" / "straggler.py", "--delay", str(delay), "--steps", str(steps)),
        env=child_env(ZEROMON_OUT=str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = analyze_imbalance(read_run(tmp_path))
    by_rank = {a.rank: a for a in result.ranks}
    # Two all-reduces (weight, bias) per step, all matched. Rank 1 is last at every step's first one
    # (the second starts together: who is last there is a coin toss).
    # (On a loaded 2-core machine a rank is now and then descheduled for a while: the bounds leave
    # room for one such hiccup.)
    assert by_rank[1].matched == 2 * steps
    assert by_rank[1].last_arrivals >= steps - 1
    # Rank 0 waits about `delay` per step for it; rank 1 waits far less for rank 0.
    assert by_rank[0].waited_s >= 0.7 * delay * steps
    assert by_rank[1].caused_wait_s == pytest.approx(by_rank[0].waited_s)
    assert by_rank[1].caused_wait_s >= 2 * by_rank[0].caused_wait_s
    kinds = {(f.kind, f.rank) for f in result.findings}
    assert ("straggler", 1) in kinds
    assert ("memory_imbalance", 0) in kinds
    assert result.memory_spread is not None and result.memory_spread > 0.1
