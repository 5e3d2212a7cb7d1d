"""Lightning Fabric under `zeromon run -- torchrun`, 2 gloo ranks on CPU, a tiny GPT-2 from its config
(tests/scenarios/lightning_trainer.py --api fabric): DDP, which Fabric wraps as _FabricModule around
DistributedDataParallel, and ModelParallelStrategy (FSDP2). Each run is checked as tests/trainer_checks.py says.
Losses with the agent on and off are compared in tests/test_trainers_lightning.py alone (a baseline run costs as
much as the run itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer_checks import check_all, check_fsdp2_reshard_knob, run_scenario, step_meanings

pytest.importorskip("lightning")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.distributed, pytest.mark.trainers]


@pytest.mark.parametrize(("strategy", "framework", "label", "meanings"), [
    ("ddp", "ddp", "-", {("grad_all_reduce", "backward")}),
    ("fsdp2", "fsdp2", "FULL_SHARD", {("param_all_gather", "forward"), ("param_all_gather", "backward"),
                                      ("grad_reduce_scatter", "backward")}),
])
def test_fabric_under_torchrun(tmp_path: Path, strategy: str, framework: str, label: str,
                               meanings: set[tuple[str, str]]) -> None:
    run = run_scenario(tmp_path, "lightning_trainer.py", "--api", "fabric", "--strategy", strategy)
    check_all(run, framework, label)
    if framework == "fsdp2":
        check_fsdp2_reshard_knob(run)
    assert step_meanings(run) == [meanings] * 2
