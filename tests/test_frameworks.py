"""Real 2-rank gloo training runs under `zeromon run`: what each framework must be seen doing.

Each case runs an example from examples/ through the real CLI (`zeromon run -- <launcher> ...`), then
checks the recording against what the framework must do per step, using the sizes the example
reports about its own model (--summary-json):
- parameter all-gathers: the full parameter bytes once for the forward, plus once more for every
  unit that is resharded after forward and re-gathered in backward;
- gradient reduce-scatters: input bytes = the full gradient bytes in the reduce dtype;
- all-reduce of all gradients for DDP, FSDP NO_SHARD and DeepSpeed ZeRO-1/2 (on CPU);
- phases attributed, and memory categories consistent with the model's and optimizer's own sizes.

The model's dimensions are all divisible by the world size, so no shard is padded and byte counts
are exact.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from zeromon.analysis.comm_advice import overlap_remedies
from zeromon.analysis.step_overlap import step_overlaps
from zeromon.model import Recording, read_run

from conftest import EXAMPLES, child_env, ranks_args, zeromon

pytestmark = pytest.mark.distributed

STEPS = 4


def _run(tmp_path: Path, script: str, *args: str, nproc: int = 2) -> tuple[list[Recording], list[dict[str, Any]]]:
    out = tmp_path / "run"
    result = zeromon("run", "--quiet", "--out", str(out), "--",
                     *ranks_args(nproc, EXAMPLES / script, "--steps", str(STEPS),
                                    "--summary-json", str(out / "summary-{rank}.json"), *args),
                     # A category walk every step (the default budget of ~0.25% of step time may skip
                     # the last steps of so short a run).
                     env=child_env(ZEROMON_MEMORY_EVERY="1"), timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    recordings = read_run(out)
    summaries = [json.loads((out / f"summary-{r}.json").read_text()) for r in range(nproc)]
    assert [r.rank for r in recordings] == list(range(nproc))
    for rec in recordings:
        assert rec.corrupt_lines == []
        assert rec.stats is not None and rec.stats.events_dropped == 0 and rec.stats.hook_errors == 0
        for s in rec.steps:  # exposed communication is a part of the step's communication
            assert s.exposed_comm_s is not None and s.comm_union_s is not None
            assert s.exposed_comm_s <= s.comm_union_s + 1e-9, s
        assert len(rec.steps) == STEPS, [s.step for s in rec.steps]
        # zeromon saw every collective the process groups counted (tests/test_unseen_collectives.py: when not).
        assert not [n.message for n in rec.notices if n.source == "collectives"]
    return recordings, summaries


def _per_step(rec: Recording, meaning: str, field: str = "bytes_out") -> dict[int, int]:
    totals: dict[int, int] = defaultdict(int)
    for event in rec.collectives:
        if event.meaning == meaning and event.step >= 0:
            totals[event.step] += getattr(event, field)
    return dict(totals)


def _steady(rec: Recording, meaning: str, field: str = "bytes_out") -> set[int]:
    """The per-step totals after the first step (the first may differ: lazy init, warm-up)."""
    per_step = _per_step(rec, meaning, field)
    return {per_step.get(step, 0) for step in range(1, STEPS)}


def _phases(rec: Recording, meaning: str) -> set[str]:
    return {e.phase for e in rec.collectives if e.meaning == meaning and e.step >= 0}


def _unit_bytes(summary: dict[str, Any], itemsize: int) -> tuple[int, int]:
    """(root unit bytes, sum of the other units' bytes): the root holds what no block holds."""
    units = summary["sharding_units"]
    blocks = sum(u["numel"] for u in units if u["name"] not in ("", "<root>"))
    return (summary["param_count"] - blocks) * itemsize, blocks * itemsize


def _last_categories(rec: Recording) -> dict[str, int]:
    samples = [m for m in rec.memory if len(m.categories) > 1]
    assert samples, "no per-category memory sample"
    return dict(samples[-1].categories)


@pytest.mark.parametrize("reshard", ["--reshard-after-forward", "--no-reshard-after-forward"])
def test_fsdp2(tmp_path: Path, reshard: str) -> None:
    recordings, summaries = _run(tmp_path, "fsdp2_train.py", reshard, "--clip-grad", "1.0")
    summary = summaries[0]
    full = summary["param_bytes_compute_dtype"]
    root, blocks = _unit_bytes(summary, 4)
    assert root + blocks == full
    for rec in recordings:
        assert rec.run_info is not None and rec.run_info.framework == "fsdp2"
        # Forward gathers every unit once; with resharding, backward re-gathers every block (the root
        # stays unsharded after forward by default).
        expected = full + (blocks if reshard == "--reshard-after-forward" else 0)
        assert _steady(rec, "param_all_gather") == {expected}
        assert _phases(rec, "param_all_gather") == ({"forward", "backward"} if blocks and expected > full
                                                    else {"forward"})
        assert _steady(rec, "grad_reduce_scatter", "bytes_in") == {summary["grad_reduce_bytes_full"]}
        assert _phases(rec, "grad_reduce_scatter") == {"backward"}
        # clip_grad_norm_ on DTensor gradients: a functional all-reduce outside backward.
        assert any(e.api == "funcol.all_reduce" for e in rec.collectives)
        cats = _last_categories(rec)
        assert cats["sharded_params"] == pytest.approx(full / 2, rel=0.01)
        assert cats["optimizer_state"] == summaries[rec.rank]["optimizer_state_bytes"]
        assert cats["activations"] > 0
        for step in rec.steps:
            assert set(step.phase_s) >= {"forward", "backward", "optimizer"}


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_fsdp1(tmp_path: Path, strategy: str) -> None:
    recordings, summaries = _run(tmp_path, "fsdp1_train.py", "--strategy", strategy)
    summary = summaries[0]
    full = summary["param_bytes_compute_dtype"]
    root, blocks = _unit_bytes(summary, 4)
    for rec in recordings:
        assert rec.run_info is not None and rec.run_info.framework == "fsdp1"
        assert rec.run_info.fsdp_strategy == strategy
        if strategy == "NO_SHARD":
            assert _steady(rec, "param_all_gather") == {0}
            assert _steady(rec, "grad_all_reduce", "bytes_in") == {summary["grad_reduce_bytes_full"]}
            assert _phases(rec, "grad_all_reduce") == {"backward"}
            continue
        expected = full + (blocks if strategy == "FULL_SHARD" else 0)
        assert _steady(rec, "param_all_gather") == {expected}
        assert _steady(rec, "grad_reduce_scatter", "bytes_in") == {summary["grad_reduce_bytes_full"]}
        assert _phases(rec, "grad_reduce_scatter") == {"backward"}
        cats = _last_categories(rec)
        assert cats["sharded_params"] == pytest.approx(full / 2, rel=0.01)
        assert cats["optimizer_state"] == summaries[rec.rank]["optimizer_state_bytes"]


def test_ddp(tmp_path: Path) -> None:
    # The DDP module inside a trainer's wrapper (Fabric's shape): zeromon sees through it to the framework and
    # its gradient all-reduces (test_ddp_attached_by_the_script_itself has DDP at the root).
    # With the traffic a trainer issues itself (an object broadcast, a counter gathered every step): it has no
    # ZeRO meaning, whatever its op and phase; DDP's own broadcast and all-reduces keep theirs.
    # And forward and backward inside optimizer.step(closure), as Lightning's Trainer runs them: the update after
    # the closure is the optimizer's phase, within the script's stopwatch of it.
    recordings, summaries = _run(tmp_path, "ddp_train.py", "--wrap", "--trainer-traffic", "--closure")
    summary = summaries[0]
    waited_s = 0.0
    for rec in recordings:
        assert rec.run_info is not None and rec.run_info.framework == "ddp"
        assert _steady(rec, "grad_all_reduce", "bytes_in") == {summary["grad_reduce_bytes_full"]}
        assert _phases(rec, "grad_all_reduce") == {"backward"}
        # DDP broadcasts the parameters from rank 0 when it wraps the model.
        setup = [e for e in rec.collectives if e.phase == "setup" and e.meaning == "param_broadcast"]
        assert sum(e.bytes_in for e in setup) >= summary["param_bytes"]
        assert "param_all_gather" not in {e.meaning for e in rec.collectives}  # DDP gathers no parameters
        update_s, besides_s = summaries[rec.rank]["update_s"], summaries[rec.rank]["besides_closure_s"]
        optimizer_s = {s.step: s.phase_s.get("optimizer", 0.0) for s in rec.steps}
        # The phase holds the update (its own stopwatch, around torch.optim.adam.adam) and Adam.step's Python
        # around it, nothing else: no more than optimizer.step(closure)'s time outside the closure. (Against the
        # update alone a loaded machine's Adam.step Python, its parameter lists, came to half the update again.)
        ratios = sorted(optimizer_s[step] / update_s[step] for step in range(1, STEPS))
        assert ratios[len(ratios) // 2] >= 0.9, (optimizer_s, update_s)
        excess = sorted(optimizer_s[step] - besides_s[step] for step in range(1, STEPS))
        assert excess[len(excess) // 2] <= 1e-3, (optimizer_s, besides_s)
        # broadcast_object_list is two broadcasts (its size, then its bytes); DDP's own is _broadcast_coalesced.
        trainer = [e for e in rec.collectives if e.api in ("all_gather", "broadcast")]
        assert len(trainer) == STEPS + 2 and {e.meaning for e in trainer} == {"unknown"}, trainer
        cats = _last_categories(rec)
        assert cats["unsharded_params"] == summary["param_bytes"]
        # DDP waits for its buckets in C++ at the end of backward; the agent's final callback records
        # that wait, so the time the rank sat blocked there is exposed, not counted as compute.
        reduces = [e for e in rec.collectives if e.meaning == "grad_all_reduce"]
        assert reduces and all(e.wait_ns is not None and e.complete_ns is not None for e in reduces)
        assert all(e.issue_ns <= e.wait_ns for e in reduces)  # type: ignore[operator]
        waited_by_step: dict[int, float] = defaultdict(float)
        for e in reduces:  # a bucket done before backward's compute ended was waited on for nothing
            waited_by_step[e.step] += max(0, e.complete_ns - e.wait_ns) / 1e9  # type: ignore[operator]
        waited_s += sum(waited_by_step.values())
        for o in step_overlaps(rec):
            if o.step in waited_by_step:
                assert o.exposed_comm_s >= 0.99 * waited_by_step[o.step] - 1e-6, (o, waited_by_step[o.step])
        assert rec.stats is not None and rec.stats.hook_errors == 0
    # Some rank waited for a bucket (the check above is not empty): the rank ahead waits for its peer's last
    # bucket. A rank behind its peer in every step can find every bucket done by its wait (a clean-clone CI run
    # here had a rank with 0 s in all four steps).
    assert waited_s > 0


def _deepspeed_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


needs_deepspeed = pytest.mark.skipif(not _deepspeed_available(), reason="DeepSpeed is an optional extra")


@needs_deepspeed
@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", [1, 2])
def test_deepspeed_zero_1_2(tmp_path: Path, stage: int) -> None:
    recordings, summaries = _run(tmp_path, "deepspeed_train.py", "--stage", str(stage))
    summary = summaries[0]
    for rec in recordings:
        assert rec.run_info is not None and rec.run_info.framework == "deepspeed"
        assert rec.run_info.zero_stage == stage
        # On CPU, ZeRO-1 and -2 all-reduce all gradients in engine.backward, then the optimizer step
        # all-gathers the updated parameter partitions.
        assert _steady(rec, "grad_all_reduce", "bytes_in") == {summary["grad_reduce_bytes_full"]}
        assert _phases(rec, "grad_all_reduce") == {"backward"}
        assert _steady(rec, "param_all_gather") == {summary["param_bytes"]}
        assert _phases(rec, "param_all_gather") == {"optimizer"}
        cats = _last_categories(rec)
        assert cats["unsharded_params"] == summary["param_bytes"]
        # AdamW's moments for this rank's partition, plus the fp32 master partition DeepSpeed keeps.
        assert cats["optimizer_state"] == summaries[rec.rank]["optimizer_state_bytes"] + summary["param_bytes_fp32"] // 2


@needs_deepspeed
@pytest.mark.deepspeed
def test_deepspeed_zero_3_regathers_in_backward(tmp_path: Path) -> None:
    # Persistence threshold and reuse distance 0: every parameter is released after use and
    # gathered again in backward (the defaults keep this small model's parameters gathered).
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                              "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0},
    }))
    recordings, summaries = _run(tmp_path, "deepspeed_train.py", "--config", str(config))
    summary = summaries[0]
    full = summary["param_bytes"]
    for rec in recordings:
        assert rec.run_info is not None and rec.run_info.zero_stage == 3
        assert rec.run_info.knobs["stage3_max_reuse_distance"] == 0
        # The config as DeepSpeed resolved it: overlap_comm is on for stage 3 by default, so no advice to set it.
        assert rec.run_info.knobs["overlap_comm"] is True and rec.run_info.knobs["reduce_bucket_size"] == 5e8
        assert not any("overlap_comm" in remedy for remedy in overlap_remedies(rec.run_info))
        assert _steady(rec, "param_all_gather") == {2 * full}
        per_phase: dict[str, int] = defaultdict(int)
        for e in rec.collectives:
            if e.meaning == "param_all_gather" and e.step >= 1:
                per_phase[e.phase] += e.bytes_out
        assert per_phase == {"forward": full * (STEPS - 1), "backward": full * (STEPS - 1)}
        assert any(e.async_op for e in rec.collectives if e.meaning == "param_all_gather")
        assert _steady(rec, "grad_reduce_scatter", "bytes_in") == {summary["grad_reduce_bytes_full"]}
        assert _phases(rec, "grad_reduce_scatter") == {"backward"}
        cats = _last_categories(rec)
        assert cats["sharded_params"] == full // 2
        assert cats["optimizer_state"] == summaries[rec.rank]["optimizer_state_bytes"] + summary["param_bytes_fp32"] // 2


def test_fsdp2_bf16_async_unshard(tmp_path: Path) -> None:
    # bf16 mixed precision: parameters are gathered in bf16, gradients reduced in fp32. Async unshard
    # makes the all-gathers async_op=True: their completion comes from Work.wait() or a callback.
    recordings, summaries = _run(tmp_path, "fsdp2_train.py", "--bf16", "--async-unshard")
    summary = summaries[0]
    assert summary["compute_dtype"] == "bfloat16"
    full_bf16 = summary["param_bytes_compute_dtype"]
    _, blocks_bf16 = _unit_bytes(summary, 2)
    for rec in recordings:
        assert rec.run_info is not None and rec.run_info.param_dtype == "bfloat16"
        assert rec.run_info.reduce_dtype == "float32" and rec.run_info.knobs["unshard_async_op"] is True
        gathers = [e for e in rec.collectives if e.meaning == "param_all_gather" and e.step >= 1]
        assert {e.dtype for e in gathers} == {"bfloat16"}
        assert all(e.async_op for e in gathers)
        assert {e.timing for e in gathers} <= {"wait", "bound", "callback"}
        assert all(e.complete_ns is not None and e.complete_ns >= e.issue_ns for e in gathers)
        assert _steady(rec, "param_all_gather") == {full_bf16 + blocks_bf16}
        assert _steady(rec, "grad_reduce_scatter", "bytes_in") == {summary["grad_reduce_bytes_full"]}


def test_fsdp2_hybrid_sharding_on_four_ranks(tmp_path: Path) -> None:
    # A 2-D mesh, 2 replicas x 2 shards: parameters gathered and gradients reduce-scattered in each shard group of
    # 2, the gradients then all-reduced across the replicas. Named hybrid sharding, as FSDP1 and trainers name it.
    recordings, summaries = _run(tmp_path, "fsdp2_train.py", "--replicate", "2", nproc=4)
    full = summaries[0]["param_bytes_compute_dtype"]
    for rec in recordings:
        assert rec.run_info is not None and rec.run_info.world_size == 4
        assert rec.run_info.fsdp_strategy == "HYBRID_SHARD"
        assert rec.run_info.knobs["replicate_size"] == 2 and rec.run_info.knobs["shard_size"] == 2
        steady = [e for e in rec.collectives if e.step >= 0]
        assert {e.group_size for e in steady} == {2}
        assert {e.meaning for e in steady} >= {"param_all_gather", "grad_reduce_scatter", "grad_all_reduce"}
        assert _last_categories(rec)["sharded_params"] == pytest.approx(full / 2, rel=0.01)


def test_ddp_attached_by_the_script_itself(tmp_path: Path) -> None:
    """`zeromon_agent.attach(model=ddp_model)` in the script, no `zeromon run`: the framework is known
    from the model at attach time, and the buckets must still be hooked before the first backward."""
    import subprocess

    out = tmp_path / "run"
    result = subprocess.run(ranks_args(2, EXAMPLES / "ddp_train.py", "--steps", str(STEPS), "--zeromon"),
                            env=child_env(ZEROMON_OUT=str(out)), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for rec in read_run(out):
        assert rec.run_info is not None and rec.run_info.framework == "ddp"
        reduces = [e for e in rec.collectives if e.meaning == "grad_all_reduce"]
        assert len({e.step for e in reduces}) == STEPS, reduces
        assert all(e.wait_ns is not None for e in reduces)
        assert not [n for n in rec.notices if n.source == "ddp"]
