"""What tests/test_callback_hf.py and tests/test_callback_lightning.py share: the scenario, reading
TensorBoard's event files, and the check of a log point's zeromon keys against the recording."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from zeromon.model import Recording, StepSummary

from conftest import REPO

SCENARIO = REPO / "tests" / "scenarios" / "trainer_callbacks.py"
STEPS = 8
# A pass of the agent's thread every 0.1 s: steps are summarized while the trainer still logs.
ENV = {"ZEROMON_FLUSH_INTERVAL": "0.1"}
# Loggers that keep float32 (Lightning's self.log, TensorBoard's scalars) against the recording's float64.
FLOAT32 = {"rel": 1e-6, "abs": 1e-9}


def tb_events(folder: Path) -> list[tuple[int, str, Any]]:
    """(step, tag, value) of every summary value in the TensorBoard event files under ``folder``: the
    simple value of a scalar, the string of a text summary. The files are TFRecords: a length (8 bytes),
    its CRC (4), the Event protobuf, its CRC (4)."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for value in event.summary.value:
                text = value.tensor.string_val[0].decode() if value.tensor.string_val else None
                out.append((event.step, value.tag, text if text is not None else value.simple_value))
    return out


def check_recording(rec: Recording) -> dict[int, StepSummary]:
    """The rank's recording is whole, and the callback's hooks counted no error; its steps by index."""
    assert rec.stats is not None and rec.stats.hook_errors == 0, "a callback's error is counted as a hook error"
    assert len(rec.steps) == STEPS, [s.step for s in rec.steps]
    assert rec.run_info is not None and rec.run_info.framework == "ddp", rec.run_info
    return {s.step: s for s in rec.steps}


def check_against_recording(logged: dict[str, float], steps: dict[int, StepSummary], approx: dict[str, float]) -> None:
    """One log point's zeromon keys against the recorded summary of the step they name."""
    summary = steps[int(logged["zeromon/step"])]
    assert logged["zeromon/step_time_s"] == pytest.approx(summary.duration_s, **approx)
    assert logged["zeromon/comm_s"] == pytest.approx(summary.comm_union_s, **approx)
    assert summary.exposed_comm_s is not None
    assert logged["zeromon/exposed_comm_s"] == pytest.approx(summary.exposed_comm_s, **approx)
    assert logged["zeromon/exposed_comm_pct"] == pytest.approx(100 * summary.exposed_comm_s / summary.duration_s,
                                                                 **approx)
    assert logged["zeromon/comm_bytes"] == summary.comm_bytes
    assert logged["zeromon/collectives"] == summary.collectives
    assert logged["zeromon/peak_memory_bytes"] == pytest.approx(summary.peak_memory, **approx)
    # The forecast's own arithmetic, as logged.
    assert logged["zeromon/memory_headroom_bytes"] == pytest.approx(
        logged["zeromon/memory_capacity_bytes"] - logged["zeromon/oom_predicted_peak_bytes"], **approx)
    assert logged["zeromon/oom_risk"] in (0, 1, 2)
