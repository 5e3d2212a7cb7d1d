"""zeromon's logging callback under Hugging Face's real Trainer: 2 gloo ranks, DDP, a tiny GPT-2.

The callback alone (no `zeromon run`: it starts the agent). Its keys must reach the ``report_to``
integration that HF runs before the callbacks a user passes (TensorBoard, through tensorboardX) and a
callback after it, with the numbers the agent recorded for the step they name (tests/trainer_logs.py).
"""

from __future__ import annotations

import json
import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest

from zeromon.model import read_run

from conftest import REPO, child_env, ranks_args
from trainer_logs import ENV, FLOAT32, SCENARIO, STEPS, check_against_recording, check_recording, tb_events

pytestmark = [pytest.mark.distributed, pytest.mark.trainers,
              pytest.mark.skipif(find_spec("transformers") is None, reason="needs transformers (the trainers extra)"),
              pytest.mark.skipif(find_spec("tensorboardX") is None, reason="needs tensorboardX (the test extra)")]


def test_the_callback_alone_sends_each_ranks_recorded_figures_to_report_to_and_later_callbacks(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = subprocess.run(ranks_args(2, SCENARIO, "hf", str(tmp_path), "--steps", str(STEPS)),
                            env=child_env(ZEROMON_OUT=str(run), **ENV), cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    recordings = read_run(run)
    assert [r.rank for r in recordings] == [0, 1]
    for rec in recordings:
        steps = check_recording(rec)
        logs = json.loads((tmp_path / f"logs-rank-{rec.rank}.json").read_text())
        train_logs = [log for log in logs if "loss" in log]
        assert len(train_logs) == STEPS  # logging_steps=1
        with_figures = [log for log in train_logs if "zeromon/step" in log]
        # The agent's thread summarizes steps as they end: most log points carry a newer step, none a future one.
        assert len({log["zeromon/step"] for log in with_figures}) >= STEPS // 2, with_figures
        assert all(log["zeromon/step"] < log["global_step"] for log in with_figures)
        for log in with_figures:
            check_against_recording(log, steps, {"rel": 1e-9, "abs": 1e-12})
        # Once a trainer step: the end of training's summary, logged at the last step again, gets no figures.
        summary = [log for log in logs if "train_runtime" in log]
        assert summary and not [key for log in summary for key in log if key.startswith("zeromon/")], summary
        if rec.rank == 0:
            # zeromon's callback moved itself ahead of report_to's, so TensorBoard has its keys at the log's own
            # step (HF's integrations write training logs as "train/<key>"), one point a step and key.
            events = tb_events(tmp_path / "tb-hf")
            points = [(step, tag) for step, tag, _ in events if "zeromon/" in tag]
            assert len(points) == len(set(points)), sorted(p for p in points if points.count(p) > 1)
            scalars = {(step, tag): value for step, tag, value in events}
            for log in with_figures:
                for key in ("zeromon/step", "zeromon/exposed_comm_s", "zeromon/exposed_comm_pct",
                            "zeromon/memory_headroom_bytes", "zeromon/oom_risk", "zeromon/findings"):
                    assert scalars[(log["global_step"], f"train/{key}")] == pytest.approx(log[key], **FLOAT32), key
            # A finding counted at a log point is said once, as a warning with its severity, on the main process.
            said = [line for line in result.stderr.splitlines() if line.startswith("zeromon: ") and ": rank 0: " in line]
            assert bool(said) == any(log["zeromon/findings"] > 0 for log in with_figures), said
            assert all(line.split(":")[1].strip() in ("warn", "critical") for line in said), said
