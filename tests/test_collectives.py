"""The collective wrappers in a real (world-size 1 and 2) gloo process group, each in a fresh process.

Every scenario runs in its own interpreter: the agent patches torch.distributed process-wide.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from conftest import child_env, free_port, run_python

PRELUDE = """
import json, os, sys, time, torch, torch.distributed as dist
import zeromon_agent
from zeromon.model import read_recording
def init(rank=0, world=1, port=None):
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
"""


def _run(tmp_path: Path, body: str, timeout: float = 180) -> dict:
    script = tmp_path / "scenario.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    out = run_python(script, str(tmp_path), str(free_port()), env=child_env(), timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_api_is_recorded_once_with_its_bytes(tmp_path: Path) -> None:
    result = _run(tmp_path, """
        out_dir, port = sys.argv[1], int(sys.argv[2])
        init(port=port)
        zeromon_agent.attach(out_dir=out_dir)
        x = torch.ones(256)                       # 1 KiB
        out = torch.empty(256)
        dist.all_reduce(x)
        dist.all_gather_into_tensor(out, x)       # an alias of all_gather_single
        dist._all_gather_base(out, x)             # deprecated alias -> all_gather_into_tensor -> single
        dist.reduce_scatter_tensor(output=out, input=x)   # keywords, as DeepSpeed calls it
        dist.all_gather([torch.empty(256)], x)
        dist.broadcast(x, src=0)
        dist.barrier()
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        zeromon_agent.detach()
        rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
        print(json.dumps([[e.api, e.op, e.bytes_in, e.bytes_out, e.async_op, e.timing, e.group_size,
                           e.dtype] for e in rec.collectives]))
    """)
    assert result == [
        ["all_reduce", "all_reduce", 1024, 1024, False, "sync", 1, "float32"],
        ["all_gather_into_tensor", "all_gather", 1024, 1024, False, "sync", 1, "float32"],
        ["_all_gather_base", "all_gather", 1024, 1024, False, "sync", 1, "float32"],
        ["reduce_scatter_tensor", "reduce_scatter", 1024, 1024, False, "sync", 1, "float32"],
        ["all_gather", "all_gather", 1024, 1024, False, "sync", 1, "float32"],
        ["broadcast", "broadcast", 1024, 1024, False, "sync", 1, "float32"],
        ["barrier", "barrier", 0, 0, False, "sync", 1, ""],
        ["all_reduce", "all_reduce", 1024, 1024, True, result[-1][5], 1, "float32"],
    ]
    assert result[-1][5] in ("wait", "bound", "callback")


def test_async_wait_records_blocked_time_across_two_ranks(tmp_path: Path) -> None:
    # Rank 1 joins the all-reduce 0.3 s late: rank 0's wait() blocks for about that long.
    result = _run(tmp_path, """
        import torch.multiprocessing as mp
        def worker(rank, out_dir, port):
            init(rank, 2, port)
            zeromon_agent.attach(out_dir=out_dir, async_sample_every=0)
            x = torch.ones(1024)
            dist.barrier()  # both ranks past attach(), which a loaded machine can make 0.1 s longer on one
            if rank == 1:
                time.sleep(0.3)
            t0 = time.perf_counter()
            work = dist.all_reduce(x, async_op=True)
            work.wait()
            zeromon_agent.detach()
            dist.destroy_process_group()
        if __name__ == "__main__":
            out_dir, port = sys.argv[1], int(sys.argv[2])
            mp.spawn(worker, args=(out_dir, port), nprocs=2)
            ev = [e for e in read_recording(os.path.join(out_dir, "rank-0.jsonl")).collectives if e.op == "all_reduce"][0]
            print(json.dumps({"blocked": ev.blocked_s, "timing": ev.timing, "async": ev.async_op,
                              "duration": ev.duration_s, "group": ev.group_size,
                              "wait_after_issue": ev.wait_ns is not None and ev.wait_ns >= ev.issue_ns,
                              "wait_ends_at_completion": ev.blocked_interval_ns[1] - ev.complete_ns}))
    """)
    assert result["async"] is True and result["group"] == 2
    assert result["timing"] == "wait"
    assert 0.2 < result["blocked"] < 1.0
    assert result["duration"] >= result["blocked"]
    assert result["wait_after_issue"] is True
    assert abs(result["wait_ends_at_completion"]) < 1000  # ns: the wait ended when it completed


def test_hook_errors_never_reach_training_and_are_counted(tmp_path: Path) -> None:
    result = _run(tmp_path, """
        out_dir, port = sys.argv[1], int(sys.argv[2])
        init(port=port)
        agent = zeromon_agent.attach(out_dir=out_dir)
        class Weird:                      # not a tensor: the extractor fails on it
            pass
        failures = []
        try:
            dist.all_reduce(Weird())      # torch itself rejects it: that error is torch's, not ours
        except Exception as exc:
            failures.append(type(exc).__name__)
        x = torch.ones(4)
        dist.all_reduce(x)                # still recorded after the failure
        errors = agent.state.hook_errors
        zeromon_agent.detach()
        rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
        print(json.dumps({"failures": failures, "errors": errors, "recorded": len(rec.collectives),
                          "stats_errors": rec.stats.hook_errors}))
    """)
    # The user's bad call raises torch's own error (not one from zeromon), once.
    assert len(result["failures"]) == 1 and "zeromon" not in result["failures"][0].lower()
    assert result["errors"] == 1 and result["stats_errors"] == 1
    assert result["recorded"] == 1


def test_bounded_buffer_drops_and_counts(tmp_path: Path) -> None:
    result = _run(tmp_path, """
        out_dir, port = sys.argv[1], int(sys.argv[2])
        init(port=port)
        # A recorder that cannot drain: the buffer fills and then drops the oldest. Its passes are held off by
        # its lock (a pass comes once the buffer is a quarter full, and a loaded machine's loop outlasted the
        # time between two of them), so the count does not depend on how fast the loop runs.
        agent = zeromon_agent.attach(out_dir=out_dir, buffer_events=1024, flush_interval_s=3600.0)
        x = torch.ones(4)
        with agent.recorder._drain_lock:
            for _ in range(3000):
                dist.all_reduce(x)
            state = agent.state
            info = {"len": len(state.raw), "cap": state.raw_capacity, "dropped": state.dropped,
                    "recorded": state.recorded}
        zeromon_agent.detach()
        rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
        info["in_file"] = len(rec.collectives)
        info["file_dropped"] = rec.stats.events_dropped
        print(json.dumps(info))
    """)
    assert result["len"] <= result["cap"] == 1024
    assert result["recorded"] == 3000
    assert result["dropped"] >= 3000 - 1024
    assert result["file_dropped"] == result["dropped"]
    assert result["in_file"] + result["dropped"] >= 3000 - 8  # phase/other records share the buffer


def test_the_queue_does_not_keep_an_async_collectives_tensors_alive(tmp_path: Path) -> None:
    # A gloo Work holds its tensors until the Work is gone. The agent's queue waits up to a second for the
    # recorder's next pass: holding the Work there kept a DDP run's replaced buckets 128 MiB past their end
    # (on a GPU: a model's gradients). Here the recorder is left no pass (flush every hour, nobody reading,
    # its first pass let go by first), so the tensor's life is the training's own.
    result = _run(tmp_path, """
        import gc, weakref
        out_dir, port = sys.argv[1], int(sys.argv[2])
        init(port=port)
        agent = zeromon_agent.attach(out_dir=out_dir, flush_interval_s=3600.0)
        time.sleep(0.5)
        queued_before = len(agent.state.raw)
        x = torch.ones(1 << 16)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        kept = weakref.ref(x)
        queued = len(agent.state.raw) - queued_before  # the collective and its wait, not yet drained
        del x, work
        gc.collect()
        alive = kept() is not None
        # What the queue holds is not tracked by the garbage collector (every field an int, a string or another
        # untracked object): not walked through its generations, nor counted towards its full collections, however
        # long it waits for a pass. The C ring holds the fields themselves, no object a record; the deque's
        # tuples (where the ring is not built) are untracked once the collector has looked.
        raw = agent.state.raw
        # (the C ring refers to its reader's wake too, call_when's callback: not a record)
        held = list(raw._queue)[queued_before:] if hasattr(raw, "_queue") else \
            [item for item in gc.get_referents(raw) if item is not raw.crowded]
        tracked = [gc.is_tracked(item) for item in held]
        x2 = torch.ones(8)
        lost = dist.all_reduce(x2, async_op=True)  # dropped unwaited: still recorded
        del lost
        zeromon_agent.detach()
        rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
        print(json.dumps({"alive": alive, "queued": queued, "tracked": tracked,
                          "timings": sorted(c.timing for c in rec.collectives if c.async_op)}))
    """)
    assert result["queued"] >= 2  # the drain had not come: the queue held the collective while x was dropped
    assert result["alive"] is False
    assert result["tracked"] and not any(result["tracked"]), result["tracked"]
    waited, dropped = sorted(result["timings"], key=lambda t: t not in ("wait", "bound"))
    assert waited in ("wait", "bound") and dropped in ("poll", "unknown"), result["timings"]


def test_functional_collectives_of_dtensor_are_recorded(tmp_path: Path) -> None:
    # Imported after the agent started: patched the moment they are (an import hook), not imported for zeromon.
    result = _run(tmp_path, """
        out_dir, port = sys.argv[1], int(sys.argv[2])
        name = "torch.distributed._functional_collectives"
        init(port=port)
        before = name in sys.modules
        zeromon_agent.attach(out_dir=out_dir)
        after_start = name in sys.modules
        hooked = [type(f).__name__ for f in sys.meta_path if getattr(f, "name", None) == name]
        import torch.distributed._functional_collectives as funcol
        from torch.distributed._functional_collectives import all_reduce  # a name bound by the importer
        y = funcol.all_reduce(torch.ones(64), "sum", dist.group.WORLD)
        total = float(y.sum())            # first use waits on it
        z = all_reduce(torch.ones(8), "sum", dist.group.WORLD)
        total += float(z.sum())
        zeromon_agent.detach()
        left = [f for f in sys.meta_path if getattr(f, "name", None) == name]
        rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
        print(json.dumps({"before": before, "after_start": after_start, "hooked": hooked, "left": len(left),
                          "total": total, "events": [[e.api, e.op, e.bytes_in, e.async_op, e.timing]
                                                     for e in rec.collectives]}))
    """)
    assert (result["before"], result["after_start"], result["hooked"]) == (False, False, ["AfterImport"])
    assert result["left"] == 0
    assert result["total"] == 72.0
    assert result["events"] == [["funcol.all_reduce", "all_reduce", 256, True, "wait"],
                                ["funcol.all_reduce", "all_reduce", 32, True, "wait"]]


def test_functional_collectives_a_stopped_agent_leaves_alone_and_a_new_one_patches_as_it_starts(tmp_path: Path) -> None:
    result = _run(tmp_path, """
        out_dir, port = sys.argv[1], int(sys.argv[2])
        init(port=port)
        hooks = lambda: [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "AfterImport"]
        zeromon_agent.attach(out_dir=out_dir)
        waiting = hooks()
        zeromon_agent.detach()            # before they were imported: the hook goes with the agent
        stopped = hooks()
        import torch.distributed._functional_collectives as funcol
        untouched = not hasattr(funcol.all_reduce, "__zeromon_original__")
        zeromon_agent.attach(out_dir=out_dir)   # imported by now: patched as the agent starts
        patched = hasattr(funcol.all_reduce, "__zeromon_original__")
        zeromon_agent.detach()
        restored = not hasattr(funcol.all_reduce, "__zeromon_original__")
        print(json.dumps([waiting, stopped, untouched, patched, restored, hooks()]))
    """)
    assert result == [["AfterImport"], [], True, True, True, []]


def test_an_explicit_step_opens_at_entry_and_the_issue_call_counts_as_blocked(tmp_path: Path) -> None:
    """`zeromon_agent.step()` around a loop with no module, autograd or optimizer: the step is the
    block (the first one too), and its exposed communication is the thread's time in the issue call
    and the wait, not the collective's length, nor the compute zeromon cannot see."""
    result = _run(tmp_path, """
        out_dir, port = sys.argv[1], int(sys.argv[2])
        init(port=port)
        zeromon_agent.attach(out_dir=out_dir)
        x, a = torch.ones(1 << 16), torch.randn(256, 256)
        walls = []
        for i in range(3):
            t0 = time.time_ns()
            with zeromon_agent.step():
                work = dist.all_reduce(x, async_op=True)
                for _ in range(20):
                    a = torch.tanh(a @ a)        # compute outside any module
                time.sleep(0.02)
                work.wait()
            walls.append(time.time_ns() - t0)
        zeromon_agent.detach()
        rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
        from zeromon.analysis.step_overlap import step_overlaps
        print(json.dumps({
            "walls": walls,
            "steps": [[s.step, s.end_ns - s.start_ns, s.exposed_comm_s, s.blocked_s] for s in rec.steps],
            "analysed": [[o.step, o.exposed_comm_s, o.comp_s] for o in step_overlaps(rec)],
            "events": [[e.step, e.phase, e.issue_s, e.blocked_s] for e in rec.collectives],
        }))
    """)
    assert [s[0] for s in result["steps"]] == [0, 1, 2]
    for (_, length, exposed, blocked), wall, (_, analysed, comp), (_, phase, issue_s, waited) in zip(
            result["steps"], result["walls"], result["analysed"], result["events"], strict=True):
        assert 0.9 * wall <= length <= wall, (length, wall)  # the first step too (it was 0.1 ms long)
        assert phase == "other" and issue_s > 0
        assert abs(exposed - (issue_s + waited)) < 5e-6 and abs(blocked - exposed) < 5e-6, (exposed, issue_s, waited)
        assert abs(analysed - exposed) < 5e-6 and comp > 0.02


def test_an_async_collective_seen_done_at_a_phase_change_is_bounded_there(tmp_path: Path) -> None:
    """Without a completion callback, the first phase change that finds the collective complete
    bounds its end, not the wait that comes much later."""
    result = _run(tmp_path, """
        out_dir, port = sys.argv[1], int(sys.argv[2])
        init(port=port)
        model = torch.nn.Linear(64, 64)
        zeromon_agent.attach(model=model, out_dir=out_dir, async_sample_every=0)
        x = torch.ones(1 << 10)
        for i in range(3):
            work = dist.all_reduce(x, async_op=True)
            while not work.is_completed():        # done before the forward (a loaded machine can hold gloo's
                time.sleep(0.001)                 # thread back longer than any fixed sleep: CI saw it)
            model(torch.randn(8, 64)).sum().backward()
            time.sleep(0.03)
            work.wait()
            model.zero_grad()
        zeromon_agent.detach()
        rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
        forwards = [p.start_ns for p in rec.phases if p.phase == "forward"]
        print(json.dumps([[e.timing, e.complete_ns - e.issue_ns, e.wait_ns - e.complete_ns,
                           min(f - e.complete_ns for f in forwards if f >= e.issue_ns)]
                          for e in rec.collectives]))
    """)
    # Its end is bounded by the forward's start, the first phase change after it completed (a recorder pass polling
    # it meanwhile bounds it sooner), and the wait comes 30 ms or more after it.
    for timing, length, before_wait, before_forward in result:
        assert timing == "bound"
        assert length > 0 and before_wait > 0.03e9, (length, before_wait)
        assert before_forward >= -1e6, before_forward  # by the forward's start (1 ms for the clock pair)


def test_a_wait_queued_behind_a_recorder_pass_is_not_lost_to_its_poll(tmp_path: Path) -> None:
    """A recorder pass takes the queue, then looks for collectives long done and never waited on. A wait the
    training entered between the two (its record queued behind the pass) is the collective's exposed time: the
    pass must leave the collective to it, not finalize it as polled and drop the wait. A loaded CI machine hit
    this window: one step's 12 ms wait went missing from its exposed communication."""
    result = _run(tmp_path, """
        out_dir, port = sys.argv[1], int(sys.argv[2])
        init(port=port)
        agent = zeromon_agent.attach(out_dir=out_dir, async_sample_every=0)
        recorder = agent.recorder
        x = torch.ones(1 << 10)
        with recorder._drain_lock:                    # the recorder's own thread held off: this is its pass
            work = dist.all_reduce(x, async_op=True)
            recorder._drain(final=False)              # the pass takes the queue: the issue, no wait yet
            time.sleep(0.3)                           # older than the poll's age
            while not work.is_completed():            # and done (a loaded machine can hold gloo's thread back)
                time.sleep(0.001)
            work.wait()                               # the training waits; its record queues behind the pass
            recorder.collectives.check_inflight(False)  # the same pass, looking for collectives never waited on
        zeromon_agent.detach()
        rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
        print(json.dumps([[e.timing, e.wait_ns is not None, e.blocked_s] for e in rec.collectives if e.async_op]))
    """)
    assert len(result) == 1, result
    timing, waited, blocked_s = result[0]
    assert waited and timing == "bound", result  # done before its wait, which the recording keeps
    assert blocked_s > 0, result
