"""A trainer that starts its ranks itself (Lightning's and Fabric's launchers, mp.spawn) sets no LOCAL_WORLD_SIZE:
the host's memory is shared by the ranks counted on the process group's store, not given whole to each rank.
Two real processes started by hand (RANK, WORLD_SIZE, MASTER_ADDR/PORT and nothing else), gloo, DDP."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from zeromon.model import read_run

from conftest import REPO, child_env, free_port

pytestmark = pytest.mark.distributed


def test_ranks_started_without_a_launcher_share_the_hosts_memory(tmp_path: Path) -> None:
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = child_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=port, ZEROMON_OUT=str(tmp_path))
        for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "ZEROMON_CPU_CAPACITY"):
            env.pop(name, None)
        procs.append(subprocess.Popen([sys.executable,
                                       str(REPO / "examples" / "ddp_train.py"), "--steps", "5", "--zeromon"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    recordings = read_run(tmp_path)
    assert [r.rank for r in recordings] == [0, 1]
    capacities = set()
    for rec in recordings:
        said = [n.message for n in rec.notices if "counted on the process group's store" in n.message]
        assert len(said) == 1 and " / 2 local ranks = " in said[0], [n.message for n in rec.notices]
        # Before the count, the device notice claims none (it said "/ 1 local rank", which nobody had said).
        counts = re.findall(r" / (\d+) local ranks? = ", " ".join(n.message for n in rec.notices))
        assert counts == ["2"], [n.message for n in rec.notices]
        assert any("until the ranks on this host are counted" in n.message for n in rec.notices)
        capacities |= {m.capacity for m in rec.memory if m.step >= 2 and m.capacity is not None}
    first = [m.capacity for m in recordings[0].memory if m.capacity is not None][0]
    assert len(capacities) == 1 and capacities.pop() == first // 2  # the whole host at the start, then half
