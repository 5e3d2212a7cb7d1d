"""zeromon's logging callback under Lightning's real Trainer: 2 gloo ranks, DDP, a small MLP.

Under `zeromon run` (the agent already started: the callback gives it the trainer's model and
optimizer). Its keys must reach the CSVLogger in the loss's rows at the trainer's cadence, with the
numbers the agent recorded for the step they name (tests/trainer_logs.py), and new findings the
TensorBoardLogger as text.
"""

from __future__ import annotations

import csv
from importlib.util import find_spec
from pathlib import Path

import pytest

from zeromon.model import read_run

from conftest import child_env, ranks_args, zeromon
from trainer_logs import ENV, FLOAT32, SCENARIO, STEPS, check_against_recording, check_recording, tb_events

pytestmark = [pytest.mark.distributed, pytest.mark.trainers,
              pytest.mark.skipif(find_spec("lightning") is None, reason="needs lightning (the trainers extra)"),
              pytest.mark.skipif(find_spec("tensorboardX") is None, reason="needs tensorboardX (the test extra)")]


def test_the_callback_under_zeromon_run_logs_the_recorded_figures_at_the_trainers_cadence(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = zeromon("run", "--quiet", "--out", str(run), "--",
                     *ranks_args(2, SCENARIO, "lightning", str(tmp_path), "--steps", str(STEPS)),
                     env=child_env(**ENV), timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    recordings = read_run(run)
    assert [r.rank for r in recordings] == [0, 1]
    steps = [check_recording(rec) for rec in recordings]
    with open(tmp_path / "csv" / "version_0" / "metrics.csv") as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    train_rows = [row for row in rows if "loss" in row]
    assert len(train_rows) == STEPS  # log_every_n_steps=1
    with_figures = [row for row in train_rows if "zeromon/step" in row]
    assert len({row["zeromon/step"] for row in with_figures}) >= STEPS // 2, with_figures
    assert all(row["zeromon/step"] <= row["step"] for row in with_figures)  # Lightning's step counts from 0
    for row in with_figures:
        check_against_recording(row, steps[0], FLOAT32)  # the loggers write on global rank 0
    # New findings as text in TensorBoard (a CSV takes numbers only: the count is in its rows).
    texts = [value for _, tag, value in tb_events(tmp_path / "tb") if tag.startswith("zeromon/findings_text")]
    assert bool(texts) == any(row["zeromon/findings"] > 0 for row in with_figures), texts
    assert all(text.split(":")[0] in ("warn", "critical") for text in texts), texts
