"""zeromon beside torch's and DeepSpeed's own tools in the same process: its records stay right and
theirs stay as they are without it.

- torch.profiler around a 2-rank FSDP2 loop (tests/scenarios/coexist_profiler.py), run with zeromon
  attached and without: the profiler's key_averages, its trace's communication events per
  ProfilerStep and its memory allocations are the same; zeromon records the profiled steps exactly
  as the steps before the profiler started. On a GPU (CUDA activities too), the profiler's ops, kernels
  and collectives are the same; its CUDA runtime rows also show zeromon's own calls (CUDA events
  for the GPU clock, mem_get_info).
- DeepSpeed's comms logger in 2-rank ZeRO-2 and ZeRO-3 runs (tests/scenarios/coexist_deepspeed.py),
  under `zeromon run` and without it: DeepSpeed logs the same ops, sizes and counts, and zeromon
  records each of them once.
- CUDA memory history (GPU only, tests/scenarios/coexist_memory_history.py): the program's own
  history settings and entries survive zeromon, with ZEROMON_MEMORY_HISTORY on and off.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from zeromon.model import Recording, read_run
from zeromon_agent.context.config import AgentConfig
from zeromon_agent.hooks.state import timed_step

from conftest import REPO, child_env, free_port, ranks_args, run_python, zeromon

pytestmark = pytest.mark.distributed
SCENARIOS = REPO / "tests" / "scenarios"


def _launch(script: str, *args: str, env: dict[str, str]) -> None:
    """The scenario on 2 ranks; a rank that finishes leaves without the interpreter's finalization, where gloo
    could abort it after its training had ended (tests/scenarios/gloo_exit.py)."""
    out = subprocess.run(ranks_args(2, SCENARIOS / script, *args), env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def _healthy(rec: Recording) -> None:
    assert rec.corrupt_lines == []
    assert rec.stats is not None and rec.stats.hook_errors == 0 and rec.stats.events_dropped == 0, rec.stats


# --- torch.profiler --------------------------------------------------------------------------------

PLAIN_STEPS = 3  # before the profiler starts
PROFILED_STEPS = 5  # wait 1, warmup 1, active 3 (coexist_profiler.py's schedule)
ACTIVE_STEPS = 3


@pytest.fixture(scope="module")
def profiler_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same FSDP2 loop under torch.profiler, with zeromon attached ("on") and without ("off")."""
    runs = {}
    for mode in ("on", "off"):
        out = tmp_path_factory.mktemp(f"profiler-{mode}")
        args = ["--out", str(out), "--plain-steps", str(PLAIN_STEPS)] + (["--agent"] if mode == "on" else [])
        _launch("coexist_profiler.py", *args, env=child_env(ZEROMON_OUT=str(out)))
        runs[mode] = out
    return runs


def _profiler_view(run: Path, rank: int) -> dict[str, Any]:
    return json.loads((run / f"profiler-{rank}.json").read_text())


def test_the_profiler_records_the_same_events_with_zeromon_attached(profiler_runs: dict[str, Path]) -> None:
    for rank in (0, 1):
        on, off = _profiler_view(profiler_runs["on"], rank), _profiler_view(profiler_runs["off"], rank)
        # Not vacuous: every active step holds FSDP2's collectives (7 all-gathers with the root kept
        # unsharded after forward, 4 reduce-scatters), and the profiler saw its steps.
        assert len(off["comm_events"]) == ACTIVE_STEPS and "outside" not in off["comm_events"], off["comm_events"].keys()
        for events in off["comm_events"].values():
            names = Counter(e[0] for e in events)
            assert names["c10d::_allgather_base_"] == 7 and names["c10d::_reduce_scatter_base_"] == 4, names
        assert off["counts"]["ProfilerStep*"] == ACTIVE_STEPS
        assert off["allocations"]
        # zeromon changes none of it: every op's count, each step's collectives with their shapes,
        # every allocation.
        assert on["counts"] == off["counts"]
        assert on["comm_events"] == off["comm_events"]
        assert on["allocations"] == off["allocations"]
        assert on["distributed_info"] == off["distributed_info"]


def test_zeromon_records_profiled_steps_as_it_records_plain_ones(profiler_runs: dict[str, Path]) -> None:
    recordings = read_run(profiler_runs["on"])
    assert [r.rank for r in recordings] == [0, 1]
    for rec in recordings:
        _healthy(rec)
        assert [s.step for s in sorted(rec.steps, key=lambda s: s.step)] == list(range(PLAIN_STEPS + PROFILED_STEPS))
        per_step: dict[int, Counter[tuple[Any, ...]]] = {}
        for e in rec.collectives:
            assert e.step >= 0, e  # FSDP2 issues nothing before the first forward
            per_step.setdefault(e.step, Counter())[(e.op, e.api, e.meaning, e.phase, e.bytes_in, e.bytes_out)] += 1
        plain = per_step[1]
        assert sum(c for (op, *_), c in plain.items() if op == "all_gather") == 7, plain
        assert {(k[2], k[3]) for k in plain if k[0] == "all_gather"} == {("param_all_gather", "forward"),
                                                                          ("param_all_gather", "backward")}
        assert {(k[2], k[3]) for k in plain if k[0] == "reduce_scatter"} == {("grad_reduce_scatter", "backward")}
        assert sum(c for (op, *_), c in plain.items() if op == "reduce_scatter") == 4, plain
        # Each profiled step is recorded as the plain ones are: same calls, sizes, meanings, phases.
        for step in range(PLAIN_STEPS + PROFILED_STEPS):
            assert per_step[step] == plain, (step, per_step[step], plain)
        # The root's all-gather opens each step's forward.
        for step in range(PLAIN_STEPS + PROFILED_STEPS):
            first = min((e for e in rec.collectives if e.step == step), key=lambda e: e.seq)
            assert (first.op, first.meaning, first.phase) == ("all_gather", "param_all_gather", "forward"), first


def test_zeromons_trace_importer_reads_the_profilers_cpu_trace(profiler_runs: dict[str, Path]) -> None:
    """A CPU-only trace has no GPU kernels to overlap: `zeromon report --trace` reads every event of
    it and refuses it with its hint, rather than failing on the file."""
    trace_dir = profiler_runs["on"] / "trace"
    result = zeromon("report", "--trace", str(trace_dir), "--json", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    counts = {_profiler_view(profiler_runs["on"], rank)["trace_events"] for rank in (0, 1)}
    assert any(f"no GPU kernels (no event has args.stream) among {n} events" in result.stderr for n in counts), \
        result.stderr
    assert "hint: profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]" in result.stderr


# The CUDA runtime calls zeromon itself makes on the training thread, which a CUDA-activity profiler
# records like any other: CUDA events on the stream for the GPU clock (each record also asks whether
# the stream is capturing a graph) and mem_get_info for the capacity of each memory sample.
ZEROMON_CUDA_CALLS = {"cudaEventRecordWithFlags", "cudaEventRecord", "cudaStreamIsCapturing", "cudaMemGetInfo",
                      "cudaEventCreateWithFlags", "cudaEventCreate"}
# Calls of other threads (NCCL's watchdog polls its events) and CUPTI's own buffer requests: how many
# fall inside the profiled window varies from run to run, zeromon or not.
BACKGROUND_CALLS = {"cudaEventQuery", "cudaThreadExchangeStreamCaptureMode", "Activity Buffer Request"}


def _gpu_profiled(tmp_path: Path, mode: str) -> dict[str, Any]:
    out = run_python(SCENARIOS / "coexist_profiler_gpu.py", str(tmp_path), str(free_port()), mode, env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_profiler_on_a_gpu_sees_the_same_ops_kernels_and_collectives(tmp_path: Path) -> None:
    """On an H100 (torch 2.11), zeromon added 15 cudaEventRecordWithFlags, 15 cudaStreamIsCapturing
    and 3 cudaMemGetInfo rows per step of this loop to the profiler's CUDA runtime calls, its own;
    every op, kernel and collective was the same."""
    on, off = _gpu_profiled(tmp_path, "on"), _gpu_profiled(tmp_path, "off")
    assert off["counts"]["ProfilerStep*"] == ACTIVE_STEPS
    assert off["counts"]["nccl:all_reduce"] == 4 * ACTIVE_STEPS
    assert any(k.startswith("kernel|") for k in off["events"]), off["events"]
    for key in ("counts", "events"):
        names = set(on[key]) | set(off[key])
        differ = {n for n in names if on[key].get(n, 0) != off[key].get(n, 0)}
        bare = {n.split("|", 1)[-1] for n in differ}
        assert bare <= ZEROMON_CUDA_CALLS | BACKGROUND_CALLS, {n: (on[key].get(n), off[key].get(n)) for n in differ}
        for n in differ:
            if n.split("|", 1)[-1] in ZEROMON_CUDA_CALLS:
                assert on[key].get(n, 0) > off[key].get(n, 0), n  # added by zeromon, never taken away
    # zeromon records the profiled steps as it records the plain ones: the same collectives every step, on the
    # GPU's clock in the steps timed on the device (zeromon_agent.hooks.state.timed_step: of these 8, the first two at
    # the default) and as launched in the others.
    assert on["zeromon_steps"] == list(range(PLAIN_STEPS + PROFILED_STEPS)) and on["hook_errors"] == 0, on
    every = AgentConfig().device_timing_every
    timings, calls = {}, {}
    for step, counts in on["zeromon_per_step"].items():
        timings[int(step)] = {key.rsplit("|", 1)[1] for key in counts}
        calls[int(step)] = Counter()
        for key, n in counts.items():
            calls[int(step)][key.rsplit("|", 1)[0]] += n
    assert all(calls[s] == calls[1] for s in range(PLAIN_STEPS + PROFILED_STEPS)), calls
    assert sum(calls[1].values()) == 4, calls
    expected = {s: {"cuda_event" if timed_step(s, every) else "launch"} for s in range(PLAIN_STEPS + PROFILED_STEPS)}
    assert timings == expected and {"launch"} in expected.values(), timings


# --- DeepSpeed's comms logger ----------------------------------------------------------------------

DS_STEPS = 3
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is an optional extra")
# DeepSpeed logs a call under its log_name; log_summary's barriers are torch barriers.
DS_LOG_NAME_TO_API = {"log_summary_barrier": "barrier"}


def _ds_logged(counts: dict[str, dict[str, int]]) -> Counter[tuple[str, int]]:
    logged: Counter[tuple[str, int]] = Counter()
    for name, sizes in counts.items():
        for size, count in sizes.items():
            logged[(DS_LOG_NAME_TO_API.get(name, name), int(size))] += count
    return logged


@needs_deepspeed
@pytest.mark.deepspeed
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_comms_logger_is_unchanged_and_zeromon_records_each_call_once(tmp_path: Path, stage: int) -> None:
    on, off = tmp_path / "on", tmp_path / "off"
    on.mkdir()
    off.mkdir()
    args = ("--stage", str(stage), "--steps", str(DS_STEPS))
    # `zeromon run` patches torch.distributed before DeepSpeed caches its collectives, as users run it.
    result = zeromon("run", "--quiet", "--out", str(on), "--",
                     *ranks_args(2, SCENARIOS / "coexist_deepspeed.py", "--out", str(on), *args), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    _launch("coexist_deepspeed.py", "--out", str(off), *args, env=child_env())
    recordings = read_run(on)
    assert [r.rank for r in recordings] == [0, 1]
    for rec in recordings:
        with_zeromon = json.loads((on / f"comms-{rec.rank}.json").read_text())
        without = json.loads((off / f"comms-{rec.rank}.json").read_text())
        # Not vacuous: training logged more than initialization did, and the summary has it.
        assert _ds_logged(without["after_train"]).total() > _ds_logged(without["after_init"]).total(), without
        assert without["summary"]
        # DeepSpeed's own record, op by op, size by size, count by count: the same with zeromon.
        assert with_zeromon == without
        # zeromon recorded every call DeepSpeed logged, once (the logger was on from
        # deepspeed.initialize, before any collective): same ops, sizes and counts.
        recorded = Counter((e.api, e.bytes_in) for e in rec.collectives)
        assert recorded == _ds_logged(with_zeromon["after_summary"])
        _healthy(rec)
        assert len(rec.steps) == DS_STEPS
        grads = [e for e in rec.collectives if e.meaning in ("grad_all_reduce", "grad_reduce_scatter")]
        assert len(grads) >= DS_STEPS and {e.phase for e in grads} == {"backward"}, grads
        expected_grad_op = "reduce_scatter" if stage == 3 else "all_reduce"
        assert {e.op for e in grads} == {expected_grad_op}


# --- CUDA memory history (GPU only) ----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("zeromon_history", ["0", "1"])
def test_the_programs_memory_history_survives_zeromon(tmp_path: Path, zeromon_history: str) -> None:
    out = run_python(SCENARIOS / "coexist_memory_history.py", str(tmp_path), str(free_port()),
                     env=child_env(ZEROMON_MEMORY_HISTORY=zeromon_history))
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # Still on, not cleared: the entry from before zeromon attached is there, and training added more.
    assert r["history_on"], r
    assert r["marker_alloc_kept"], r
    assert r["entries_after"] > r["entries_before"] > 0, r
    # Still the program's settings: Python frames only (stacks="python"). zeromon's own call asks for
    # stacks="all", which adds C++ frames to every traceback (6386 of them in this scenario on an H100
    # when zeromon called it over the program's settings).
    assert r["allocs_with_frames"] > 0, r
    assert r["cpp_frames"] == 0, r
    if zeromon_history == "1":
        assert any("allocator history already on" in n for n in r["notices"]), r["notices"]
    # zeromon's memory samples are the allocator's.
    assert r["steps"] == 4 and r["hook_errors"] == 0, r
    assert r["samples"] > 0 and min(r["sample_allocated"]) >= r["marker_bytes"], r
    assert max(r["sample_allocated"]) <= r["peak_now"] and r["sample_peak"] <= r["peak_now"], r
    assert r["capacity"] > r["peak_now"], r
    assert r["optimizer_state"] >= 2 * 4 * r["n_params"], r  # AdamW's two fp32 moments
