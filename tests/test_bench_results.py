"""tests/bench/run_all.py --only rewrites a benchmark's part of tests/bench/RESULTS.md and nothing else: the
sections written by hand (a before-and-after, a study of false alarms) stay where they are."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent / "bench"
sys.path.insert(0, str(BENCH))

import run_all  # noqa: E402 - tests/bench is not a package

MACHINE = {"date": "2026-11-27 05:40 UTC", "loadavg_1min": 0.5}
NEW_HANG = """## Targets

| Benchmark | Measure | Target | Runs met | Met |
|---|---|---|---|---|
| hang detection | time from the hang to the verdict | <= 13 s | 2/2 | yes |

## `python tests/bench/bench_hang.py`

measured again
"""


def _headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("## ")]


def test_a_benchmark_measured_again_replaces_its_section_and_keeps_the_hand_written_ones() -> None:
    old = (BENCH / "RESULTS.md").read_text()
    hand_written = [h for h in _headings(old) if not h.startswith("## `") and h != "## Targets"]
    assert "## Finding noise: false alarms and detection power (issue 35, item 1)" in hand_written
    assert any(h.startswith("## The collective's issuer") for h in hand_written)

    out = run_all.splice(old, NEW_HANG, MACHINE)
    assert _headings(out) == _headings(old)  # every section, in its place
    _, _, sections = run_all._sections(out)
    hang = "\n".join(sections["## `python tests/bench/bench_hang.py`"])
    assert "measured again" in hang and "Measured again on its own on 2026-11-27 05:40 UTC" in hang
    assert "3.57" not in hang  # the old measurement is gone from it
    _, _, before = run_all._sections(old)
    for heading in hand_written:
        assert sections[heading] == before[heading], heading
