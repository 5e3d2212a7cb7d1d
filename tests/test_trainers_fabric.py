"""Lightning Fabric under `zeromon run`, 2 gloo ranks on CPU, a tiny GPT-2 from its config
(tests/scenarios/lightning_trainer.py --api fabric): DDP, which Fabric wraps as _FabricModule around
DistributedDataParallel, under Fabric's own launcher (`python script.py`, devices=2: rank 0 starts rank 1, no
LOCAL_WORLD_SIZE anywhere); ModelParallelStrategy (FSDP2) under torchrun. Between them and
tests/test_trainers_lightning.py (DDP under torchrun, FSDP2 under Lightning's launcher) each strategy runs under
each launcher once. Each run is checked as tests/trainer_checks.py says, losses with the agent and without it
included."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest

from trainer_checks import check_all, check_fsdp2_reshard_knob, run_scenario, step_meanings

# find_spec, not importorskip: collecting the file imports none of the trainers (each xdist worker collects it).
pytestmark = [pytest.mark.distributed, pytest.mark.trainers,
              pytest.mark.skipif(find_spec("lightning") is None, reason="needs lightning (the trainers extra)"),
              pytest.mark.skipif(find_spec("transformers") is None, reason="needs transformers (the trainers extra)")]


def test_fabric_with_ddp_under_its_own_launcher(tmp_path: Path) -> None:
    run = run_scenario(tmp_path, "lightning_trainer.py", "--api", "fabric", "--strategy", "ddp", launcher="fabric")
    check_all(run, "ddp", "-")
    assert step_meanings(run) == [{("grad_all_reduce", "backward")}] * 2


def test_fabric_with_fsdp2_under_torchrun(tmp_path: Path) -> None:
    run = run_scenario(tmp_path, "lightning_trainer.py", "--api", "fabric", "--strategy", "fsdp2")
    check_all(run, "fsdp2", "FULL_SHARD")
    check_fsdp2_reshard_knob(run)
    assert step_meanings(run) == [{("param_all_gather", "forward"), ("param_all_gather", "backward"),
                                   ("grad_reduce_scatter", "backward")}] * 2
