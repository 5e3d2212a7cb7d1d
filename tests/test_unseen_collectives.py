"""Collectives zeromon cannot see are said, not silently left out: a real DDP run (gloo, world size 1) whose
gradient all-reduces the reducer issues from C++ (a builtin comm hook was there first, so the agent's own
recording hook is refused). The process group's own count is the evidence (its sequence number)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zeromon.model import read_run

from conftest import REPO, child_env, free_port, run_python

pytestmark = pytest.mark.distributed


def test_a_run_whose_collectives_zeromon_cannot_see_is_told_so(tmp_path: Path) -> None:
    out = run_python(REPO / "tests" / "scenarios" / "unseen_ddp.py", str(tmp_path), str(free_port()), env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    (rec,) = read_run(tmp_path)
    assert rec.run_info is not None and rec.run_info.framework == "ddp"
    by_source = {n.source: n.message for n in rec.notices}
    assert "could not hook DDP's gradient all-reduce" in by_source["ddp"]
    unseen = by_source["collectives"]
    assert "were issued where its patch of torch.distributed does not see them" in unseen, unseen
    assert "zeromon recorded 0:" in unseen and "Framework found: ddp" in unseen, unseen
