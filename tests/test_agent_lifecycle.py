"""The agent's lifecycle in real processes: SIGTERM flushes, explicit steps, no-code-change injection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from zeromon.model import read_recording, read_run
from zeromon.model.run_end import read_file_end

from conftest import EXAMPLES, child_env, free_port, run_python, torchrun_args


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _count_kind(path: Path, kind: str) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines()[1:] if line.startswith(f'["{kind}"'))


def test_sigterm_through_zeromon_run_flushes_every_rank(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "zeromon", "run", "--out", str(out), "--",
           *torchrun_args(2, EXAMPLES / "fsdp2_train.py", "--steps", "100000")]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for(lambda: all(_count_kind(out / f"rank-{r}.jsonl", "step") >= 3 for r in (0, 1)), 180,
                  "three recorded steps on both ranks")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    runs = read_run(out)
    assert [r.rank for r in runs] == [0, 1]
    for rec in runs:
        assert rec.stats is not None, "the final agent_stats record is written on SIGTERM"
        assert rec.stats.events_dropped == 0 and rec.stats.hook_errors == 0
        assert len(rec.steps) >= 3
        assert rec.corrupt_lines == []


def test_a_sigterm_inside_the_main_threads_write_of_a_notice_ends_the_recording_and_never_hangs(
        tmp_path: Path) -> None:
    # SIGTERM lands at the k-th line the main thread runs inside the agent's locked write of a notice (any
    # file's line: the notice, the writer), k = 1, 2, ... until the write has no k-th line; a fresh agent each
    # time. The handler runs at once (os.kill checks for signals before it returns; the tracer that sends it is
    # not traced). Stopping there took the recorder's locks that the interrupted write held: the rank hung
    # until its launcher killed it, its end unwritten. The handler here, before the agent's, is the one the
    # agent calls after its stop: it notes the signal instead of dying, so one process tries every k.
    script = tmp_path / "sigterm_in_write.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys, torch.distributed as dist
        import zeromon_agent
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        for k in range(1, 1000):
            terminated = []
            signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
            agent = zeromon_agent.attach(out_dir=os.path.join(sys.argv[1], str(k)), endpoint=False)
            lines = []
            def tracer(frame, event, arg):
                if event == "line" and agent.exits.writing_depth:
                    lines.append(frame.f_lineno)
                    if len(lines) == k:
                        os.kill(os.getpid(), signal.SIGTERM)
                return tracer
            sys.settrace(tracer)
            agent.notice("info", "test", f"written at {k}")
            sys.settrace(None)
            if len(lines) < k:  # the write has no k-th line: every line was tried
                zeromon_agent.detach()
                break
            print(k, len(lines), terminated == [signal.SIGTERM], agent.started, flush=True)
        dist.destroy_process_group()
    """))
    out = tmp_path / "runs"
    result = run_python(script, str(out), str(free_port()), timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines()]
    assert len(rows) >= 10, result.stdout  # the write has that many lines for the signal to land at
    for k, _lines, terminated, started in rows:
        assert (terminated, started) == ("True", "False"), (k, result.stdout)  # stopped, then the signal's due
        path = next((out / k).glob("rank-0.*"))
        end = read_file_end(path).end
        assert end is not None and end.how == "signal SIGTERM", (k, end)
        assert f"written at {k}" in [n.message for n in read_recording(path).notices]  # written before the stop


def test_explicit_steps_with_two_optimizers(tmp_path: Path) -> None:
    # Two optimizers step in each iteration (a GAN-like loop): `with zeromon_agent.step()` defines
    # the step, not the optimizer.
    script = tmp_path / "two_opt.py"
    script.write_text(textwrap.dedent("""
        import os, sys, torch, torch.distributed as dist
        import zeromon_agent
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
        opt_a, opt_b = torch.optim.SGD(a.parameters(), 0.1), torch.optim.SGD(b.parameters(), 0.1)
        zeromon_agent.attach(model=a, out_dir=sys.argv[1])
        for i in range(5):
            with zeromon_agent.step():
                for opt, loss_fn in ((opt_a, lambda: a(torch.ones(4, 8)).sum()),
                                     (opt_b, lambda: b(torch.ones(4, 8)).sum())):
                    opt.zero_grad()
                    loss_fn().backward()
                    opt.step()
                t = torch.ones(2)
                dist.all_reduce(t)
        zeromon_agent.detach()
        dist.destroy_process_group()
    """))
    out = run_python(script, str(tmp_path), str(free_port()))
    assert out.returncode == 0, out.stderr[-2000:]
    rec = read_recording(tmp_path / "rank-0.jsonl")
    assert [s.step for s in rec.steps] == [0, 1, 2, 3, 4]
    assert [e.step for e in rec.collectives] == [0, 1, 2, 3, 4]
    assert all(set(s.phase_s) >= {"forward", "backward"} for s in rec.steps)


def test_detach_gives_the_training_back_as_it_was_and_ends_the_recording(tmp_path: Path) -> None:
    """After zeromon_agent.detach() the process runs torch's own code: torch.distributed's functions and
    Work.wait, torch.autograd.backward, no hook of zeromon's on the model, on every module or on every optimizer;
    the recording ends there ("detach"), and training on adds nothing to it (tests/test_trainers_*.py train
    again in the same process without the agent, and compare the losses)."""
    script = tmp_path / "detach.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, torch, torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        import torch.nn.modules.module as module_mod
        import torch.optim.optimizer as optim_mod
        import zeromon_agent
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        def hooks(model):
            return [len(h) for h in (model._forward_pre_hooks, model._forward_hooks, module_mod._global_forward_pre_hooks,
                    module_mod._global_forward_hooks, optim_mod._global_optimizer_pre_hooks,
                    optim_mod._global_optimizer_post_hooks)]
        def train(model, opt):
            for _ in range(3):
                opt.zero_grad()
                model(torch.ones(4, 8)).sum().backward()
                opt.step(lambda: None)
                dist.all_reduce(torch.ones(2))
                dist.all_reduce(torch.ones(2), async_op=True).wait()
        functions = (dist.all_reduce, c10d.all_reduce, c10d.Work.wait, torch.autograd.backward)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), 0.1)
        before = hooks(model)
        zeromon_agent.attach(model=model, optimizer=opt, out_dir=sys.argv[1])
        wrapped = [f is not g for f, g in zip(functions, (dist.all_reduce, c10d.all_reduce, c10d.Work.wait,
                                                          torch.autograd.backward))]
        train(model, opt)
        zeromon_agent.detach()
        after = (dist.all_reduce, c10d.all_reduce, c10d.Work.wait, torch.autograd.backward)
        ended = os.path.getsize(os.path.join(sys.argv[1], "rank-0.jsonl"))
        train(model, opt)
        print(json.dumps({"wrapped": wrapped, "restored": [f is g for f, g in zip(functions, after)],
                          "hooks": [before, hooks(model)], "grown": os.path.getsize(
                              os.path.join(sys.argv[1], "rank-0.jsonl")) - ended}))
        dist.destroy_process_group()
    """))
    out = run_python(script, str(tmp_path), str(free_port()))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["wrapped"] == [True] * 4  # the check below can fail
    assert result["restored"] == [True] * 4
    assert result["hooks"][1] == result["hooks"][0]
    assert result["grown"] == 0
    rec = read_recording(tmp_path / "rank-0.jsonl")
    assert [s.step for s in rec.steps] == [0, 1, 2]
    assert len(rec.collectives) == 6
    end = read_file_end(tmp_path / "rank-0.jsonl").end
    assert end is not None and end.how == "detach"


def test_injection_chains_an_existing_sitecustomize(tmp_path: Path) -> None:
    # A user's own sitecustomize keeps working under `zeromon run`.
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    probe = tmp_path / "probe.py"
    probe.write_text("import os, sys, json\nprint(json.dumps({'user': os.environ.get('USER_SITE_RAN'), "
                     "'hooked': any(type(f).__name__ == 'AfterImport' for f in sys.meta_path)}))\n")
    env = child_env(PYTHONPATH=str(user_site))
    out = subprocess.run([sys.executable, "-m", "zeromon", "run", "--quiet", "--out", str(tmp_path / "r"), "--",
                          sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"user": "yes", "hooked": True}


def test_zeromon_enable_0_injects_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "zeromon", "run", "--quiet", "--out", str(tmp_path / "r"), "--",
         *torchrun_args(2, EXAMPLES / "fsdp2_train.py", "--steps", "2")],
        env=child_env(ZEROMON_ENABLE="0"), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not list((tmp_path / "r").glob("rank-*.jsonl"))


def test_explicit_attach_in_the_examples(tmp_path: Path) -> None:
    # `--zeromon`: the scripts call zeromon_agent.attach(model=, optimizer=) and wrap each step in
    # zeromon_agent.step(); no `zeromon run`, the run folder comes from ZEROMON_OUT.
    cmd = torchrun_args(2, EXAMPLES / "fsdp2_train.py", "--steps", "3", "--zeromon")
    out = subprocess.run(cmd, env=child_env(ZEROMON_OUT=str(tmp_path)), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for rec in read_run(tmp_path):
        assert rec.run_info is not None and rec.run_info.framework == "fsdp2"
        assert rec.run_info.optimizer == "AdamW"
        assert [s.step for s in rec.steps] == [0, 1, 2]
        assert {e.meaning for e in rec.collectives if e.step >= 0} >= {"param_all_gather", "grad_reduce_scatter"}


def test_explicit_attach_of_a_deepspeed_engine(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        import pytest

        pytest.skip("DeepSpeed is an optional extra")
    cmd = torchrun_args(2, EXAMPLES / "deepspeed_train.py", "--stage", "2", "--steps", "3", "--zeromon")
    out = subprocess.run(cmd, env=child_env(ZEROMON_OUT=str(tmp_path)), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for rec in read_run(tmp_path):
        assert rec.run_info is not None and rec.run_info.framework == "deepspeed"
        assert rec.run_info.zero_stage == 2
        assert [s.step for s in rec.steps] == [0, 1, 2]
        # attach() came after deepspeed.initialize: the cached all_gather_into_tensor was re-pointed.
        assert any(e.api == "all_gather_into_tensor" and e.step >= 0 for e in rec.collectives)


def test_the_agents_threads_import_nothing_while_the_training_runs(tmp_path: Path) -> None:
    # An import on one of zeromon's threads in the middle of a step holds the GIL for ~1 ms and the import lock
    # that the training's own first-use imports take: what the recorder's records and the endpoint's answers
    # need is imported as the agent starts. A finder first on sys.meta_path sees every import not yet made.
    script = tmp_path / "imports.py"
    script.write_text(textwrap.dedent("""
        import json, sys, threading, urllib.request
        import torch, torch.distributed as dist
        import zeromon_agent

        late = []

        class Watch:
            def find_spec(self, name, path=None, target=None):
                if threading.current_thread() is not threading.main_thread():
                    late.append((threading.current_thread().name, name))
                return None

        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), 0.1)
        zeromon_agent.attach(model=model, optimizer=opt, out_dir=sys.argv[1])
        sys.meta_path.insert(0, Watch())
        port = zeromon_agent.get_agent().endpoint.entry.port
        for i in range(6):
            opt.zero_grad()
            model(torch.ones(4, 8)).sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            if i == 3:  # a live client reads the rank: its metrics and a snapshot, made on the endpoint's threads
                for path in ("/metrics", "/api/v1/snapshot?steps=4"):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
                        assert answer.status == 200
        zeromon_agent.detach()
        dist.destroy_process_group()
        print(json.dumps(late))
    """))
    out = run_python(script, str(tmp_path), str(free_port()), env=child_env(ZEROMON_PORT="0"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    steps = read_recording(next(tmp_path.glob("rank-0.*"))).steps
    assert [s.step for s in steps] == [0, 1, 2, 3, 4, 5]  # the run was recorded: the watch watched something
