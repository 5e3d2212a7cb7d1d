"""Memory by category at the forward's and the backward's peak, against torch's FSDPMemTracker.

Real 2-rank gloo FSDP2 runs (tests/scenarios/memory_oracle.py) with FSDPMemTracker in the same
process for step 1. FSDPMemTracker snapshots each FSDP unit's memory at the moments zeromon samples
in a walk step: "Before Post-Forward" (a unit's forward is done, its parameters still gathered),
the root's "After Post-Forward" (the forward's end), "After Pre-Backward" and "Before
Post-Backward". zeromon's "forward_peak" and "backward_peak" samples must be FSDPMemTracker's
snapshot at the highest of those moments, byte for byte, where both name the same storages.

Where the definitions differ, and how it is accounted for here:
- activations: FSDPMemTracker's are every tensor made in forward that is still alive, and the input
  batch given to ``track_inputs`` is "inputs"; zeromon's are the storages saved for backward in
  the root's forward (the batch included) that are still alive. So zeromon's activations are
  FSDPMemTracker's activations + inputs - what the loop holds that autograd did not save: the
  model's output once the root's forward has returned it, and in backward also the loss and its
  seed gradient.
- unsharded gradients: FSDPMemTracker names a unit's unsharded gradients only when its
  post-backward starts, and counts them as temporaries until then; zeromon counts them from the
  moment they exist. In this model only the output layer's exist earlier: they are the first
  gradients backward makes and belong to the root unit, whose post-backward is the backward's last.
- temporaries (gradients of activations, a kernel's workspace): FSDPMemTracker sees each
  allocation; on CPU zeromon cannot (on GPU they are in "other", the allocator's remainder).
- an op-level peak inside a unit (FSDPMemTracker's "Peak Forward" / "Peak Backward") is between
  zeromon's moments: it holds what the nearest moment holds plus that op's temporaries.
"""

from __future__ import annotations

import json
import subprocess
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from zeromon.model import Recording, read_run
from zeromon_agent.hooks.phases import PhaseTracker
from zeromon_agent.hooks.state import HotState

from conftest import REPO, child_env, ranks_args

SCENARIO = REPO / "tests" / "scenarios" / "memory_oracle.py"
TRACKED_STEP = 1
STEPS = 4
BLOCKS = 3
BATCH, WIDTH = 96, 64  # the scenario's
# Categories both sides name by the same storages.
SAME = ("sharded_params", "unsharded_params", "buffers", "sharded_grads", "optimizer_state",
        "all_gather_buffers", "reduce_scatter_buffers")
FORWARD, AFTER_FORWARD = "Before Post-Forward", "After Post-Forward"
AFTER_PRE_BACKWARD, BEFORE_POST_BACKWARD = "After Pre-Backward", "Before Post-Backward"


def _run(out: Path, agent: str) -> tuple[list[dict[str, Any]], list[Recording]]:
    out.mkdir(parents=True)
    result = subprocess.run(ranks_args(2, SCENARIO, "--out", str(out), "--agent", agent),
                            env=child_env(ZEROMON_OUT=str(out), ZEROMON_ENDPOINT="0"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    oracles = [json.loads((out / f"oracle-{rank}.json").read_text()) for rank in range(2)]
    return oracles, (read_run(out) if agent != "none" else [])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[dict[str, Any]], list[Recording]]]:
    base = tmp_path_factory.mktemp("memory-oracle")
    return {agent: _run(base / agent, agent) for agent in ("none", "before", "inside")}


def _nonzero(cats: Mapping[str, int]) -> dict[str, int]:
    return {k: v for k, v in cats.items() if v}


def _zeromon_view(snapshot: Mapping[str, int], sizes: Mapping[str, int], held: int,
                  head_grads_untagged: bool) -> dict[str, int]:
    """An FSDPMemTracker snapshot in zeromon's definitions (the module docstring)."""
    view = {k: snapshot.get(k, 0) for k in SAME}
    view["unsharded_grads"] = snapshot.get("unsharded_grads", 0) + (sizes["head_grads"] if head_grads_untagged else 0)
    view["activations"] = snapshot["activations"] + snapshot["inputs"] - held
    if head_grads_untagged:  # they are among FSDPMemTracker's temporaries until then
        assert snapshot["temporaries"] >= sizes["head_grads"]
    return _nonzero(view)


def _moments(oracle: dict[str, Any], backward: bool) -> list[tuple[str, dict[str, int]]]:
    """The moments zeromon looks at, in the order they happen, as FSDPMemTracker saw them."""
    sizes, snaps = oracle["sizes"], oracle["snapshots"]
    blocks = [f"blocks.{i}" for i in range(BLOCKS)]
    if not backward:
        order = [(b, FORWARD) for b in blocks] + [("", FORWARD), ("", AFTER_FORWARD)]
        return [(f"{m or 'root'} {state}",
                 _zeromon_view(snaps[m][state][0], sizes, sizes["output"] if m == "" else 0, False))
                for m, state in order]
    held = sizes["output"] + sizes["loss"] + sizes["seed"]
    order = [("", AFTER_PRE_BACKWARD)]
    for b in reversed(blocks):
        order += [(b, AFTER_PRE_BACKWARD), (b, BEFORE_POST_BACKWARD)]
    order.append(("", BEFORE_POST_BACKWARD))
    # The output layer's gradients exist from just after the root's pre-backward (the first thing
    # backward computes) to the root's post-backward (the last).
    return [(f"{m or 'root'} {state}", _zeromon_view(snaps[m][state][0], sizes, held, m != ""))
            for m, state in order]


def _highest(moments: list[tuple[str, dict[str, int]]]) -> tuple[str, dict[str, int]]:
    ranked = sorted(moments, key=lambda m: sum(m[1].values()), reverse=True)
    assert sum(ranked[0][1].values()) > sum(ranked[1][1].values()), "the scenario must have one highest moment"
    return ranked[0]


def _first_step(agent: str) -> int:
    """The scenario's step where zeromon's recording starts (its step 0)."""
    return 0 if agent == "before" else TRACKED_STEP


def _sample(rec: Recording, agent: str, phase: str, step: int = TRACKED_STEP) -> dict[str, int]:
    """zeromon's sample ``phase`` in the scenario's step ``step``."""
    step -= _first_step(agent)
    found = [m for m in rec.memory if m.step == step and m.phase == phase]
    assert len(found) == 1, (phase, step, [(m.step, m.phase) for m in rec.memory])
    return _nonzero(found[0].categories)


@pytest.mark.distributed
@pytest.mark.parametrize("agent", ["before", "inside"])
def test_forward_peak_is_fsdpmemtrackers_highest_forward_moment(runs: dict[str, Any], agent: str) -> None:
    oracles, recordings = runs[agent]
    for rec, oracle in zip(recordings, oracles, strict=True):
        moments = _moments(oracle, backward=False)
        name, expected = _highest(moments)
        assert _sample(rec, agent, "forward_peak") == expected, name
        # The forward's end: the root's "After Post-Forward" (zeromon's forward hook runs after FSDP's).
        assert _sample(rec, agent, "forward") == moments[-1][1]
        # FSDPMemTracker's own forward peak is inside a unit's forward, between two of zeromon's
        # moments: a Linear's output is alive while the ReLU after it runs, then freed.
        op_peak = _zeromon_view(oracle["snapshots"][""]["Peak Forward"][0], oracle["sizes"], 0, False)
        assert {k: op_peak[k] - expected.get(k, 0) for k in op_peak if op_peak[k] != expected.get(k, 0)} == \
            {"activations": BATCH * WIDTH * 4}


@pytest.mark.distributed
@pytest.mark.parametrize("agent", ["before", "inside"])
def test_backward_peak_is_fsdpmemtrackers_highest_backward_moment(runs: dict[str, Any], agent: str) -> None:
    oracles, recordings = runs[agent]
    for rec, oracle in zip(recordings, oracles, strict=True):
        name, expected = _highest(_moments(oracle, backward=True))
        peak = _sample(rec, agent, "backward_peak")
        assert peak == expected, name
        # Gathered parameters, unsharded and sharded gradients, the prefetched all-gather and the
        # reduce-scatter buffer kept from the previous unit: the backward peak holds them all.
        assert {"unsharded_params", "unsharded_grads", "sharded_grads", "all_gather_buffers",
                "reduce_scatter_buffers", "activations"} <= set(peak)
        # FSDPMemTracker's peak of the whole step is in that unit's backward: the same storages, and
        # the temporaries of the op it was in, which zeromon does not see on CPU.
        held = sum(oracle["sizes"][k] for k in ("output", "loss", "seed"))
        assert _zeromon_view(oracle["peak"], oracle["sizes"], held, True) == peak
        assert oracle["peak"]["temporaries"] > oracle["sizes"]["head_grads"]


@pytest.mark.distributed
def test_fsdpmemtracker_numbers_are_the_same_with_zeromon_attached(runs: dict[str, Any]) -> None:
    plain, _ = runs["none"]
    for agent in ("before", "inside"):
        oracles, _ = runs[agent]
        assert oracles == plain, agent  # every snapshot of every unit, temporaries included


@pytest.mark.distributed
@pytest.mark.parametrize("agent", ["before", "inside"])
def test_phases_stay_right_while_and_after_fsdpmemtracker_runs(runs: dict[str, Any], agent: str) -> None:
    _, recordings = runs[agent]
    first = _first_step(agent)
    for rec in recordings:
        assert rec.stats is not None and rec.stats.hook_errors == 0 and rec.stats.events_dropped == 0
        by_step: dict[int, list[tuple[str, str, str]]] = {}
        for e in sorted(rec.collectives, key=lambda e: e.seq):
            by_step.setdefault(e.step, []).append((e.op, e.phase, e.meaning))
        assert sorted(by_step) == list(range(STEPS - first))
        # The root's all-gather opens each step's forward: in phase "forward", a parameter
        # all-gather, inside FSDPMemTracker (step 1) and after it has exited (steps 2, 3) alike.
        expected = ([("all_gather", "forward", "param_all_gather")] * (1 + BLOCKS)
                    + [("all_gather", "backward", "param_all_gather")] * 2
                    + [("reduce_scatter", "backward", "grad_reduce_scatter"), ("all_gather", "backward", "param_all_gather")]
                    + [("reduce_scatter", "backward", "grad_reduce_scatter")] * 3)
        for step, calls in by_step.items():
            assert calls == expected, step
        # zeromon's forward end comes after FSDP's root post-forward, which frees the last unit's
        # all-gather buffer; and its moments in FSDP2's units are back after FSDPMemTracker's exit.
        for step in range(first, STEPS):
            assert "all_gather_buffers" not in _sample(rec, agent, "forward", step)
        for phase in ("forward_peak", "backward_peak"):
            assert {json.dumps(_sample(rec, agent, phase, step), sort_keys=True) for step in range(TRACKED_STEP, STEPS)} \
                == {json.dumps(_sample(rec, agent, phase), sort_keys=True)}


def test_root_hooks_stay_first_and_last_when_others_register_later() -> None:
    """FSDPMemTracker's enter and exit remove FSDP2's forward hooks and register them again, prepended
    and appended: zeromon's pre-hook stays first and its forward hook last."""
    tracker = PhaseTracker(HotState())
    root = torch.nn.Linear(2, 2)
    calls: list[str] = []
    root.register_forward_pre_hook(lambda m, a: calls.append("fsdp pre"), prepend=True)
    root.register_forward_hook(lambda m, a, o: calls.append("fsdp post"))
    tracker.set_root(root)
    ours_pre, ours_post = tracker._handles[0].id, tracker._handles[1].id
    handles = [root.register_forward_pre_hook(lambda m, a: calls.append("tracker pre"), prepend=True),
               root.register_forward_hook(lambda m, a, o: calls.append("tracker post"), always_call=True)]
    assert next(iter(root._forward_pre_hooks)) == ours_pre
    assert next(reversed(root._forward_hooks)) == ours_post
    root(torch.ones(2))
    assert calls == ["tracker pre", "fsdp pre", "fsdp post", "tracker post"]
    for handle in handles:  # the handles still remove what they registered
        handle.remove()
    assert len(root._forward_pre_hooks) == len(root._forward_hooks) == 2
    # Hooks put into the dicts directly: set right at the next forward's end.
    root._forward_hooks[10**9] = lambda m, a, o: None
    pre_hooks = cast("OrderedDict[int, Any]", root._forward_pre_hooks)
    pre_hooks[10**9] = lambda m, a: None
    pre_hooks.move_to_end(10**9, last=False)
    tracker._on_forward_post(root, (), None)
    assert next(iter(root._forward_pre_hooks)) == ours_pre
    assert next(reversed(root._forward_hooks)) == ours_post
    tracker.close()
    assert "register_forward_pre_hook" not in root.__dict__ and "register_forward_hook" not in root.__dict__
    assert isinstance(root._forward_pre_hooks, OrderedDict) and ours_pre not in root._forward_pre_hooks


GPU_SCENARIO = REPO / "tests" / "scenarios" / "memory_peaks_gpu.py"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_peaks_are_where_the_allocator_is_highest(tmp_path: Path) -> None:
    """On GPU the allocator's allocated bytes pick the moment; the categories walked there are
    FSDPMemTracker's at that moment (one rank, so no collective buffers), and ``other`` is the rest
    of allocated (cuBLAS workspaces, the gradients of activations)."""
    import sys

    result = subprocess.run([sys.executable, str(GPU_SCENARIO), "--out", str(tmp_path)],
                            env=child_env(ZEROMON_OUT=str(tmp_path / "run"), ZEROMON_ENDPOINT="0"),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    oracle = json.loads((tmp_path / "oracle.json").read_text())
    (rec,) = read_run(tmp_path / "run")
    assert rec.stats is not None and rec.stats.hook_errors == 0
    samples = {m.phase: m for m in rec.memory if m.step == TRACKED_STEP}
    at = oracle["allocated_at"]
    forward_moments = BLOCKS + 1
    assert samples["forward_peak"].allocated == max(at[:forward_moments] + [samples["forward"].allocated])
    backward = at[forward_moments:]
    peak = samples["backward_peak"]
    assert peak.allocated == max(backward)
    names = [("", AFTER_PRE_BACKWARD)]
    for b in reversed([f"blocks.{i}" for i in range(BLOCKS)]):
        names += [(b, AFTER_PRE_BACKWARD), (b, BEFORE_POST_BACKWARD)]
    module, state = names[backward.index(max(backward))]
    sizes = oracle["sizes"]
    expected = _zeromon_view(oracle["snapshots"][module][state][0], sizes, sizes["loss"] + sizes["seed"], module != "")
    cats = dict(peak.categories)
    other = cats.pop("other")
    assert peak.allocated is not None and other == peak.allocated - sum(cats.values())
    # AdamW's step counters are CPU tensors: in zeromon's optimizer state, in FSDPMemTracker's CPU snapshot.
    cats["optimizer_state"] -= sizes["cpu_optimizer_state"]
    assert _nonzero(cats) == expected, (module, state)
