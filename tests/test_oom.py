"""The OOM forecast (zeromon.analysis.oom) on real runs and on constructed GPU samples.

Real runs: 2-rank gloo on CPU through the real `zeromon run` CLI, with a category walk every step
(ZEROMON_MEMORY_EVERY=1). On CPU the level is the process RSS; capacities are set relative to the
RSS a process with torch and a gloo group measures here (``baseline_rss``), not hard-coded.
- a run built to leak (tests/scenarios/oom_train.py --leak-mb 8: 8 MiB more alive every step);
- a run that spikes at the first optimizer step (the same script with DDP and eight 2048×2048
  layers: Adam's state, 256 MiB, is twice the parameters), forecast from its recording cut before
  step 0's optimizer phase, and from the whole recording;
- a run that stays flat (examples/fsdp2_train.py);
- the leaking run without ZEROMON_CPU_CAPACITY: each rank's capacity is its share of the host.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.oom import (
    CRITICAL_SECONDS_TO_CAPACITY,
    CRITICAL_STEPS_TO_CAPACITY,
    MIN_TREND_STEPS,
    TIME_HORIZON_MAX_WINDOWS,
    TRACKED_MIN_SHARE,
    WARN_PEAK_SHARE,
    OomForecast,
    forecast,
    forecast_run,
)
from zeromon.model import MemorySample, OomEvent, Recording, RunInfo, StepSummary, read_run
from zeromon.model.units import format_bytes

from conftest import EXAMPLES, REPO, child_env, free_port, ranks_args, zeromon

SCENARIO = REPO / "tests" / "scenarios" / "oom_train.py"
MiB = 2**20
LEAK_MIB = 8


# --- helpers ----------------------------------------------------------------------------------------

def _record(out: Path, script: Path, *args: str, **env: str) -> tuple[list[Recording], str]:
    result = zeromon("run", "--quiet", "--out", str(out), "--", *ranks_args(2, script, *args),
                     env=child_env(ZEROMON_MEMORY_EVERY="1", **env), timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    recordings = read_run(out)
    assert [r.rank for r in recordings] == [0, 1]
    return recordings, result.stdout


def _scenario_facts(stdout: str) -> dict[str, Any]:
    line = next(line for line in stdout.splitlines() if line.startswith('{"param_count"'))
    return dict(json.loads(line))


def _level(m: MemorySample) -> int:
    level = m.allocated if m.allocated is not None else m.rss
    assert level is not None
    return level


def before_first_optimizer_step(rec: Recording) -> Recording:
    """The recording as it stood when step 0's optimizer phase began: what a live view had then."""
    start = min(p.start_ns for p in rec.phases if p.phase == "optimizer" and p.step == 0)
    return Recording(path=rec.path, header=rec.header, run_info=rec.run_info,
                     memory=[m for m in rec.memory if m.t_ns < start],
                     phases=[p for p in rec.phases if p.end_ns <= start],
                     collectives=[c for c in rec.collectives if c.issue_ns < start])


def _kinds(f: OomForecast) -> dict[str, Finding]:
    return {finding.kind: finding for finding in f.findings}


@pytest.fixture(scope="module")
def baseline_rss() -> int:
    """RSS of a process that imported torch and joined a gloo group: the floor of every rank here."""
    code = ("import os, torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%d', rank=0, world_size=1)\n"
            "print(int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE'))\n")
    result = subprocess.run([sys.executable, "-c", code % free_port()], env=child_env(), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    rss = int(result.stdout.split()[-1])
    assert 50 * MiB < rss < 2048 * MiB
    return rss


# --- real runs --------------------------------------------------------------------------------------

@pytest.mark.distributed
def test_leak_forecasts_steps_to_capacity(tmp_path: Path, baseline_rss: int) -> None:
    capacity = 3 * baseline_rss
    recordings, stdout = _record(tmp_path / "run", SCENARIO, "--leak-mb", str(LEAK_MIB), "--steps", "14",
                                 ZEROMON_CPU_CAPACITY=str(capacity))
    facts = _scenario_facts(stdout)
    for rec in recordings:
        result = forecast(rec)
        assert result.capacity_bytes == capacity  # the capacity the agent recorded
        assert result.device == "cpu"
        assert result.growth_bytes_per_step is not None
        assert result.growth_bytes_per_step == pytest.approx(LEAK_MIB * MiB, rel=0.15)
        # Steps until capacity at the leak's own rate, from the last step's peak.
        last = max((m for m in rec.memory if m.step == rec.steps[-1].step), key=_level)
        expected = (capacity - _level(last)) / (LEAK_MIB * MiB)
        assert result.steps_to_capacity is not None
        assert result.steps_to_capacity == pytest.approx(expected, rel=0.25, abs=3)
        # ~100 steps away: inside the step horizon, and near enough for the time horizon to count.
        assert result.steps_to_capacity <= TIME_HORIZON_MAX_WINDOWS * MIN_TREND_STEPS
        seconds = result.steps_to_capacity * statistics.median(s.duration_s for s in rec.steps)
        critical = (result.steps_to_capacity <= CRITICAL_STEPS_TO_CAPACITY
                    or seconds <= CRITICAL_SECONDS_TO_CAPACITY)
        assert result.risk == (Severity.CRITICAL if critical else Severity.WARN)
        leak = _kinds(result)["memory_growth"]
        assert leak.severity == result.risk
        assert leak.metrics["seconds_to_capacity"] == pytest.approx(seconds)
        assert any(e.startswith(f"{result.risk.value}: capacity is ~") and "or 1 h of training" in e
                   for e in leak.evidence)
        assert "per step" in leak.title and "capacity in" in leak.title
        # The leaked tensors belong to no model or optimizer: the walk says so.
        assert any("outside the model and optimizer" in e for e in leak.evidence)
        assert leak.remedies and leak.metrics["growth_bytes_per_step"] == result.growth_bytes_per_step

        # Before the first optimizer step, the FSDP2 shard's Adam state is predicted exactly; it fits.
        early = forecast(before_first_optimizer_step(rec))
        assert early.pending_optimizer_bytes == 2 * facts["param_bytes"]
        pending = _kinds(early)["optimizer_state_pending"]
        assert pending.severity == Severity.INFO and "sharded_params" in pending.evidence[0]
        assert early.risk == Severity.OK and early.growth_bytes_per_step is None


@pytest.mark.distributed
def test_first_optimizer_step_spike_is_forecast_before_it_happens(tmp_path: Path) -> None:
    # glibc keeps freed memory resident once its mmap threshold adapts upward; a fixed threshold
    # makes RSS follow the live tensors, as the GPU allocator's count does, so the predicted peak
    # can be compared with the one that followed.
    recordings, stdout = _record(tmp_path / "run", SCENARIO, "--wrap", "ddp", "--width", "2048", "--layers", "8",
                                 "--steps", "3", MALLOC_MMAP_THRESHOLD_="131072")
    adam_state = 2 * _scenario_facts(stdout)["param_bytes"]
    for rec in recordings:
        early_rec = before_first_optimizer_step(rec)
        assert early_rec.memory and not early_rec.steps
        seen = max(_level(m) for m in early_rec.memory)
        # Parameters, gradients and activations fit with room to spare; with the optimizer state they do not.
        capacity = int(seen / 0.84)
        assert capacity < seen + adam_state, "the scenario no longer spikes past the capacity"

        early = forecast(early_rec, capacity_bytes=capacity)
        assert early.peak_bytes == seen and seen / capacity < WARN_PEAK_SHARE  # the present alone is fine
        assert early.pending_optimizer_bytes == adam_state
        assert early.risk == Severity.CRITICAL
        spike = _kinds(early)["optimizer_state_pending"]
        assert spike.severity == Severity.CRITICAL and "optimizer state" in spike.title
        assert "will not fit" in spike.title
        assert early.headroom_bytes is not None and early.headroom_bytes < 0
        assert spike.remedies and "shard the model state" in spike.remedies[0]  # DDP: sharding comes first
        assert not any("stage3" in r or "expandable" in r for r in spike.remedies)  # neither ZeRO-3 nor GPU
        # The prediction against what the later steps really reached.
        later = max(_level(m) for m in rec.memory if m.step >= 1)
        assert early.predicted_peak_bytes == pytest.approx(later, rel=0.05)

        full = forecast(rec, capacity_bytes=capacity)
        assert full.risk == Severity.CRITICAL and full.pending_optimizer_bytes == 0
        peak = _kinds(full)["peak_near_capacity"]
        assert peak.severity == Severity.CRITICAL and "optimizer_state" in peak.title
        assert any("before the first optimizer step the peak was" in e for e in peak.evidence)


@pytest.mark.distributed
def test_flat_run_is_ok(tmp_path: Path, baseline_rss: int) -> None:
    capacity = 3 * baseline_rss
    recordings, _ = _record(tmp_path / "run", EXAMPLES / "fsdp2_train.py", "--steps", "16",
                            ZEROMON_CPU_CAPACITY=str(capacity))
    results = forecast_run(recordings)
    assert [f.rank for f in results] == [0, 1]
    for result in results:
        assert result.risk == Severity.OK, [f.title for f in result.findings]
        assert "memory_growth" not in _kinds(result)
        assert result.steps_to_capacity is None
        assert result.growth_bytes_per_step is not None and abs(result.growth_bytes_per_step) < 1 * MiB
        assert result.headroom_bytes is not None and result.headroom_bytes > 0
        assert result.predicted_peak_bytes == result.peak_bytes  # stepped: nothing still to come
        assert not any(f.severity in (Severity.WARN, Severity.CRITICAL) for f in result.findings)


def _host_memory() -> tuple[int, str]:
    """The memory the ranks here share, read independently of the agent: physical memory, or the
    cgroup limit where one is set and lower."""
    found = [(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host RAM")]
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        if os.path.exists(path):
            text = Path(path).read_text().strip()
            if text.isdigit() and int(text) < (1 << 60):
                found.append((int(text), "the cgroup limit"))
    return min(found)


@pytest.mark.distributed
def test_cpu_capacity_is_the_rank_share_of_the_host(tmp_path: Path) -> None:
    """Two ranks on one host fill the same memory: each one's capacity is half of it, and the leak's
    forecast, the report and the device notice all use that share."""
    recordings, _ = _record(tmp_path / "run", SCENARIO, "--leak-mb", str(LEAK_MIB), "--steps", "14")
    total, source = _host_memory()
    share = total // 2
    report = zeromon("report", "--json", str(tmp_path / "run"))
    assert report.returncode == 0, report.stderr[-2000:]
    assert [r["capacity_bytes"] for r in json.loads(report.stdout)["ranks"]] == [share, share]
    for rec in recordings:
        assert {m.capacity for m in rec.memory} == {share}
        notice = next(n for n in rec.notices if n.source == "device")
        assert f"capacity is {source} / 2 local ranks = {format_bytes(share)}" in notice.message
        result = forecast(rec)
        assert result.capacity_bytes == share and result.steps_to_capacity is not None
        last = max((m for m in rec.memory if m.step == rec.steps[-1].step), key=_level)
        assert result.steps_to_capacity == pytest.approx((share - _level(last)) / (LEAK_MIB * MiB), rel=0.25)

        # Against a capacity the leak has already passed, the forecast says so, and the peak is
        # blamed on what is outside the model (the leak and the runtime's RSS), not on its categories.
        assert result.peak_bytes is not None
        over = forecast(rec, capacity_bytes=int(result.peak_bytes / 1.2))
        growth = _kinds(over)["memory_growth"]
        assert over.steps_to_capacity == 0
        assert growth.title.endswith("already over capacity") and "capacity in" not in growth.title
        assert any("already 12" in e for e in growth.evidence)  # 120% give or take the fitted line
        peak = _kinds(over)["peak_near_capacity"]
        assert "mostly outside the model and optimizer" in peak.title and "largest category" not in peak.title
        assert peak.metrics["tracked_share"] < TRACKED_MIN_SHARE
        assert any("the rest is untracked" in e and "torch runtime" in e for e in peak.evidence)
        assert peak.remedies[0].startswith("stop the growth first")
        assert not any(r.startswith(("activation checkpointing", "bf16", "smaller wrapping")) for r in peak.remedies)


# --- constructed recordings -------------------------------------------------------------------------
# No GPU exists here: the allocator-only signals (retries, fragmentation, recorded OOMs, the
# high-water mark, memory outside the allocator) are tested on MemorySample lists built by hand, with
# the field values torch.cuda.memory_stats and mem_get_info report.

GiB = 2**30


def _gpu(step: int, allocated: int, *, t: int | None = None, reserved: int | None = None, retries: int = 0,
         ooms: int = 0, peak: int | None = None, capacity: int = 80 * GiB, free: int | None = None,
         inactive_split: int = 0, categories: dict[str, int] | None = None) -> MemorySample:
    reserved = allocated if reserved is None else reserved
    return MemorySample(rank=0, step=step, phase="other", t_ns=t if t is not None else step * 10**9, device="cuda:0",
                        allocated=allocated, reserved=reserved, active=allocated,
                        peak_allocated=peak if peak is not None else allocated, peak_reserved=reserved,
                        inactive_split=inactive_split, num_alloc_retries=retries, num_ooms=ooms, capacity=capacity,
                        free=capacity - reserved if free is None else free, rss=2 * GiB,
                        categories=categories or {})


def _info(framework: str = "fsdp2", **kwargs: Any) -> RunInfo:
    fields: dict[str, Any] = {"world_size": 8, "zero_stage": None, "fsdp_strategy": None, "param_dtype": "float32",
                              "reduce_dtype": None, "optimizer": "AdamW", "knobs": {}}
    fields.update(kwargs)
    return RunInfo(rank=0, local_rank=0, host="h", pid=1, job="j", framework=framework, framework_version=None,
                   torch_version="2.13.0", backend="nccl", device="cuda:0", **fields)


def _steps(n: int, step_s: float = 0.5) -> list[StepSummary]:
    return [StepSummary(rank=0, step=s, start_ns=s * 10**9, end_ns=s * 10**9 + int(step_s * 1e9), phase_s={},
                        collectives=0, comm_bytes=0, comm_bytes_by_op={}, comm_union_s=0.0, blocked_s=0.0,
                        peak_memory=None) for s in range(n)]


def _rec(memory: list[MemorySample], info: RunInfo | None = None, steps: int = 0,
         ooms: list[OomEvent] | None = None, step_s: float = 0.5) -> Recording:
    return Recording(path=Path("rank-0.jsonl"), header={"rank": 0}, memory=memory, steps=_steps(steps, step_s),
                     run_info=info or _info(), ooms=ooms or [])


def test_growing_retries_are_critical() -> None:
    memory = [_gpu(s, 60 * GiB, reserved=70 * GiB, retries=0 if s < 15 else s - 14) for s in range(20)]
    result = forecast(_rec(memory, steps=20))
    retries = _kinds(result)["alloc_retries"]
    assert result.risk == Severity.CRITICAL and retries.severity == Severity.CRITICAL
    assert retries.metrics == {"num_alloc_retries": 5.0, "recent_retries": 5.0}
    assert retries.remedies[0].startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert any("10.00 GiB cached but unused" in e for e in retries.evidence)


def test_retries_that_stopped_are_a_warning() -> None:
    memory = [_gpu(s, 60 * GiB, retries=3 if s >= 2 else 0) for s in range(30)]
    retries = _kinds(forecast(_rec(memory, steps=30)))["alloc_retries"]
    assert retries.severity == Severity.WARN and "none in the last 10 steps" in retries.evidence[0]


def test_fragmentation_under_pressure() -> None:
    # 10 GiB reserved but unused, and the reservation at 90% of the device.
    memory = [_gpu(s, 62 * GiB, reserved=72 * GiB, inactive_split=3 * GiB) for s in range(10)]
    result = forecast(_rec(memory, steps=10))
    frag = _kinds(result)["fragmentation"]
    assert frag.severity == Severity.WARN and result.risk == Severity.WARN
    assert frag.metrics["fragmentation_bytes"] == 10 * GiB
    assert frag.remedies[0].startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert any("inactive split" in e for e in frag.evidence)
    # Without pressure the same fragmentation is only information.
    relaxed = forecast(_rec([_gpu(s, 12 * GiB, reserved=22 * GiB) for s in range(10)], steps=10))
    assert _kinds(relaxed)["fragmentation"].severity == Severity.INFO and relaxed.risk == Severity.OK


def test_recorded_ooms_are_critical() -> None:
    memory = [_gpu(s, 40 * GiB, ooms=1 if s >= 4 else 0) for s in range(6)]
    event = OomEvent(rank=0, step=4, phase="backward", t_ns=4 * 10**9, device="cuda:0", allocated=79 * GiB,
                     requested=2 * GiB, free=GiB // 2, snapshot_path="/runs/x/oom-snapshot-rank-0-1.pickle")
    result = forecast(_rec(memory, steps=6, ooms=[event]))
    oom = _kinds(result)["oom_recorded"]
    assert result.risk == Severity.CRITICAL and oom.severity == Severity.CRITICAL and oom.step == 4
    assert any("requested 2.00 GiB with 79.00 GiB allocated" in e and "memory_viz" in e for e in oom.evidence)
    assert any(e.startswith("OOM in step 5 (backward)") for e in oom.evidence)  # index 4: the 5th step, as logged
    # The allocator's counter alone, without an observer event, is enough.
    assert forecast(_rec(memory, steps=6)).risk == Severity.CRITICAL


def test_gpu_peak_between_samples_and_memory_outside_the_allocator() -> None:
    """The high-water mark that rose between samples is the step's peak; memory that the CUDA context
    and other processes hold counts against the capacity."""
    memory = [_gpu(0, 50 * GiB, peak=50 * GiB), _gpu(1, 50 * GiB, peak=70 * GiB, free=6 * GiB)]
    result = forecast(_rec(memory, steps=2))
    assert result.peak_bytes == 70 * GiB and result.current_bytes == 50 * GiB
    outside = 80 * GiB - 6 * GiB - 50 * GiB  # capacity − free − reserved
    assert result.predicted_peak_bytes == 70 * GiB + outside
    assert result.headroom_bytes == 80 * GiB - 70 * GiB - outside
    peak = _kinds(result)["peak_near_capacity"]
    assert peak.severity == Severity.CRITICAL  # (70 + 24) / 80
    assert any("held outside PyTorch's allocator" in e for e in peak.evidence)


def test_gpu_first_step_prediction_includes_foreach_temporaries() -> None:
    """FSDP2 on GPU, before the first optimizer step: 2 × the fp32 shard of state, and during the step
    a foreach temporary of the shard's size on top of what backward left."""
    shard = 10 * GiB
    cats = {"sharded_params": shard, "unsharded_params": 0, "activations": 20 * GiB}
    memory = [_gpu(0, 45 * GiB, t=1, categories=cats), _gpu(0, 40 * GiB, t=2)]  # forward end, backward end
    result = forecast(_rec(memory, _info("fsdp2", knobs={"reshard_after_forward": "mixed"})))
    assert result.pending_optimizer_bytes == 2 * shard
    # max(45 + 20, 40 + 20 + 10) GiB
    assert result.predicted_peak_bytes == 70 * GiB
    pending = _kinds(result)["optimizer_state_pending"]
    assert pending.severity == Severity.WARN  # 70 / 80 = 87.5%
    assert any("foreach temporaries" in e for e in pending.evidence)
    # FSDP remedies, none of DeepSpeed's knobs; the FSDP CPU offload comes before activation work.
    assert not any("stage3" in r or "zero_optimization" in r for r in pending.remedies)
    offload = next(i for i, r in enumerate(pending.remedies) if "CPUOffloadPolicy" in r)
    checkpointing = next(i for i, r in enumerate(pending.remedies) if r.startswith("activation checkpointing"))
    assert offload < checkpointing


def test_fsdp2_cpu_offload_policy_keeps_the_state_off_the_gpu() -> None:
    """The agent records FSDP2's offload policy; with CPUOffloadPolicy nothing is predicted on the GPU
    and offload is not suggested again."""
    cats = {"sharded_params": 10 * GiB, "unsharded_params": 0, "activations": 20 * GiB}
    memory = [_gpu(0, 45 * GiB, t=1, categories=cats), _gpu(0, 40 * GiB, t=2)]
    offloaded = forecast(_rec(memory, _info("fsdp2", knobs={"offload_policy": "CPUOffloadPolicy"})))
    assert offloaded.pending_optimizer_bytes == 0
    for finding in offloaded.findings:
        assert not any("CPUOffloadPolicy" in r for r in finding.remedies)


def test_deepspeed_master_weights_and_offloaded_state() -> None:
    """DeepSpeed allocates the fp32 master partition at initialization (seen as optimizer_state); Adam's
    moments, each its size, come at the first step. With offload_optimizer the state is not on the GPU."""
    master = 4 * GiB
    cats = {"sharded_params": 2 * GiB, "optimizer_state": master, "activations": 10 * GiB}
    memory = [_gpu(0, 50 * GiB, t=1, categories=cats)]
    info = _info("deepspeed", zero_stage=2, param_dtype="bfloat16", optimizer="FusedAdam")
    result = forecast(_rec(memory, info))
    assert result.pending_optimizer_bytes == 2 * master
    assert result.predicted_peak_bytes == 58 * GiB  # no foreach temporaries in DeepSpeed's optimizers
    offloaded = _info("deepspeed", zero_stage=2, optimizer="FusedAdam", knobs={"offload_optimizer": "cpu"})
    assert forecast(_rec(memory, offloaded)).pending_optimizer_bytes == 0


def test_zero3_gather_bound_and_remedies_cheapest_first() -> None:
    cats = {"sharded_params": 1 * GiB, "unsharded_params": 2 * GiB, "optimizer_state": 9 * GiB,
            "activations": 20 * GiB}
    memory = [_gpu(s, 60 * GiB, categories=cats) for s in range(4)]
    info = _info("deepspeed", zero_stage=3, param_dtype="float16", world_size=64,
                 knobs={"stage3_max_live_parameters": 6e9, "train_micro_batch_size_per_gpu": 4,
                        "gradient_accumulation_steps": 2})
    result = forecast(_rec(memory, info, steps=4))
    gathers = _kinds(result)["zero3_gather_bound"]
    # 6e9 × 2 bytes, below the whole model (64 × 1 GiB): 60 − 2 seen + 11.18 GiB = 69.2 GiB of 80.
    assert gathers.metrics["gather_bound_bytes"] == 12e9
    assert gathers.severity == Severity.WARN and result.risk == Severity.WARN
    assert result.predicted_peak_bytes == 60 * GiB - 2 * GiB + 12 * 10**9
    assert "stage3_max_live_parameters=6e+09" in gathers.evidence[0]
    order = ["stage3_param_persistence_threshold", "stage3_max_live_parameters", '"offload_param"']
    assert [next(i for i, r in enumerate(gathers.remedies) if key in r) for key in order] == [0, 1, 2]
    # The peak's own remedies: ZeRO-3's gather knobs, then activations, micro-batch, bf16 for fp16.
    full = [r.split(" ")[0] + " " + r.split(" ")[1] for r in _remedies_of(info, cats)]
    assert full == ["lower stage3_param_persistence_threshold", "lower stage3_max_live_parameters",
                    "parameter offload:", "optimizer offload:", "activation checkpointing:",
                    "a smaller", "bf16 instead"]


def _remedies_of(info: RunInfo, cats: dict[str, int]) -> tuple[str, ...]:
    """The remedies of a peak at 95% of capacity for this config."""
    memory = [_gpu(s, 76 * GiB, categories=cats) for s in range(3)]
    return _kinds(forecast(_rec(memory, info, steps=3)))["peak_near_capacity"].remedies


def test_remedies_apply_to_the_framework() -> None:
    cats = {"sharded_params": GiB, "activations": 30 * GiB}
    fsdp1 = _remedies_of(_info("fsdp1", fsdp_strategy="SHARD_GRAD_OP", knobs={"offload_params": False}), cats)
    assert any("sharding_strategy=FULL_SHARD (now SHARD_GRAD_OP)" in r for r in fsdp1)
    assert any("CPUOffload(offload_params=True)" in r for r in fsdp1)
    assert any("MixedPrecision(param_dtype=torch.bfloat16)" in r for r in fsdp1)
    assert not any("stage3" in r or "expandable" in r for r in fsdp1)
    fsdp2 = _remedies_of(_info("fsdp2", param_dtype="bfloat16", knobs={"reshard_after_forward": False,
                                                                       "fsdp_units": 3}), cats)
    assert any("reshard_after_forward=True" in r for r in fsdp2)
    assert any("smaller wrapping units" in r and "now 3 units" in r for r in fsdp2)
    assert not any("bf16" in r for r in fsdp2)  # already bf16
    ds2 = _remedies_of(_info("deepspeed", zero_stage=2, param_dtype="bfloat16",
                             knobs={"offload_optimizer": "cpu"}), cats)
    assert ds2[0] == "a higher ZeRO stage: zero_optimization.stage 3 (shards the parameters too)"
    assert not any("offload_optimizer" in r or "stage3" in r for r in ds2)  # already offloaded; not ZeRO-3


def test_noise_and_one_outlier_are_not_growth() -> None:
    """Theil–Sen and Mann–Kendall: a jittering level and one high step are not a leak."""
    jitter = [0, 3, -2, 1, -3, 2, 0, -1, 3, -2, 1, 0] * 3
    memory = [_gpu(s, 40 * GiB + j * MiB) for s, j in enumerate(jitter)]
    memory[20] = _gpu(20, 60 * GiB)
    result = forecast(_rec(memory, steps=len(jitter)))
    assert result.growth_bytes_per_step is not None and abs(result.growth_bytes_per_step) < MiB
    assert result.steps_to_capacity is None and "memory_growth" not in _kinds(result)
    # A steady climb of the same size is one.
    climbing = forecast(_rec([_gpu(s, 40 * GiB + s * 64 * MiB) for s in range(36)], steps=36, step_s=10.0))
    assert climbing.growth_bytes_per_step == pytest.approx(64 * MiB)
    assert climbing.steps_to_capacity == pytest.approx((80 * GiB - (40 * GiB + 35 * 64 * MiB)) / (64 * MiB))
    assert _kinds(climbing)["memory_growth"].severity == Severity.WARN  # ~605 steps away, 1.7 h at 10 s


def _climb(per_step: int, step_s: float | None, steps: int = 36) -> Finding:
    """The growth finding of a GPU level that climbs from 40 of 80 GiB by ``per_step`` each step."""
    memory = [_gpu(s, 40 * GiB + s * per_step) for s in range(steps)]
    return _kinds(forecast(_rec(memory, steps=steps if step_s else 0, step_s=step_s or 0.5)))["memory_growth"]


@pytest.mark.parametrize(("per_step", "step_s", "severity", "why"), [
    # ~605 steps away: inside the 1000-step horizon whatever the step time; at 0.5 s it is ~5 min away.
    (64 * MiB, 10.0, Severity.WARN, "warn: capacity is ~605 steps away"),
    (64 * MiB, 5.0, Severity.WARN, "warn: capacity is ~605 steps away"),
    (64 * MiB, 0.5, Severity.CRITICAL, "critical: capacity is ~5 min of training away"),
    (64 * MiB, None, Severity.WARN, "(no step time yet: no time horizon)"),
    # ~2525 steps away: past the step horizon; the time horizon decides (2525 s is 42 min).
    (16 * MiB, 2.0, Severity.INFO, "beyond the horizon: warn when capacity is within 1000 steps or 1 h of training"),
    (16 * MiB, 1.0, Severity.WARN, "warn: capacity is ~42 min of training away"),
    (16 * MiB, 0.2, Severity.CRITICAL, "critical: capacity is ~8 min of training away"),
    # ~10200 steps away, 300 windows of 34 steps: too far for the time horizon, however short the step.
    (4 * MiB, 0.01, Severity.INFO, "training time counts only within 3400 steps"),
])
def test_growth_horizon_in_steps_and_in_training_time(per_step: int, step_s: float | None, severity: Severity,
                                                      why: str) -> None:
    growth = _climb(per_step, step_s)
    assert growth.severity == severity
    horizon = next(e for e in growth.evidence if "warn when capacity is within 1000 steps" in e)
    assert why in horizon, horizon
    if step_s is None:
        assert "seconds_to_capacity" not in growth.metrics
    else:
        assert growth.metrics["seconds_to_capacity"] == pytest.approx(growth.metrics["steps_to_capacity"] * step_s)
        assert "of training" in horizon or "counts only within" in horizon


def test_growth_evidence_counts_steps_from_1() -> None:
    growth = _climb(64 * MiB, 10.0)  # recorded steps 0..35; the trend leaves out the first two (warm-up)
    rose = next(e for e in growth.evidence if e.startswith("the per-step peak rose from"))
    assert "(step 3) to" in rose and "(step 36):" in rose, rose  # indices 2 and 35
    assert growth.step == 35  # the data keeps the recording's index


def test_no_growth_no_horizon() -> None:
    """A flat level and one spike have no growth: nothing reaches capacity, however short the step."""
    jitter = [0, 3, -2, 1, -3, 2, 0, -1, 3, -2, 1, 0] * 3
    flat = [_gpu(s, 40 * GiB + j * MiB) for s, j in enumerate(jitter)]
    spike = [_gpu(s, 40 * GiB if s != 20 else 60 * GiB) for s in range(36)]
    for memory in (flat, spike):
        result = forecast(_rec(memory, steps=len(memory), step_s=0.001))
        assert "memory_growth" not in _kinds(result) and result.steps_to_capacity is None
        assert result.risk == Severity.OK, [f.title for f in result.findings]


def test_without_capacity_or_samples() -> None:
    no_capacity = MemorySample(rank=0, step=0, phase="other", t_ns=1, device="cpu", allocated=None, reserved=None,
                               active=None, peak_allocated=None, peak_reserved=None, inactive_split=None,
                               num_alloc_retries=None, num_ooms=None, capacity=None, free=None, rss=300 * MiB)
    result = forecast(_rec([no_capacity], steps=1))
    assert result.capacity_bytes is None and result.headroom_bytes is None and result.risk == Severity.OK
    assert result.current_bytes == result.peak_bytes == 300 * MiB
    assert forecast(_rec([no_capacity], steps=1), capacity_bytes=250 * MiB).risk == Severity.CRITICAL
    empty = forecast(_rec([]))
    assert empty.risk == Severity.OK and empty.peak_bytes is None
    assert [f.kind for f in empty.findings] == ["oom_no_data"]
    assert json.dumps(result.to_dict())  # plain data for --json


def test_gpu_peak_outside_the_categories_asks_for_the_allocator_history() -> None:
    """The categories hold 4 of 76 GiB (the allocator's remainder, ``other``, is not one of them): the
    finding says the memory is elsewhere and leads with finding it, not with sharding or checkpointing."""
    cats = {"sharded_params": GiB, "optimizer_state": 2 * GiB, "activations": GiB, "other": 72 * GiB}
    peak = _remedies_finding([_gpu(s, 76 * GiB, categories=cats) for s in range(3)])
    assert peak.severity == Severity.CRITICAL
    assert "mostly outside the model and optimizer: their categories hold 4.00 GiB of 76.00 GiB" in peak.title
    assert peak.metrics["tracked_share"] == pytest.approx(4 / 76)
    assert "memory_viz" in peak.remedies[0] and "act only on what the categories hold" in peak.remedies[-1]
    assert any("hold 4.00 GiB of the 76.00 GiB" in e for e in peak.evidence)  # how much: the evidence's
    assert not any("CPUOffloadPolicy" in r or r.startswith("activation checkpointing") for r in peak.remedies)
    assert not any("runtime" in e for e in peak.evidence)  # the allocator's count holds no runtime
    # The same peak held mostly by activations: the largest category and the model-state remedies.
    mostly_activations = {"sharded_params": GiB, "activations": 60 * GiB}
    held = _remedies_finding([_gpu(s, 76 * GiB, categories=mostly_activations) for s in range(3)])
    assert "the largest category is activations" in held.title
    assert any(r.startswith("activation checkpointing") for r in held.remedies)


def _remedies_finding(memory: list[MemorySample]) -> Finding:
    return _kinds(forecast(_rec(memory, steps=3)))["peak_near_capacity"]
