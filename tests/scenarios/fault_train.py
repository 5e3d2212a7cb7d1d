"""A small data-parallel training on gloo with faults to inject, for tests/test_faults.py and test_rank_ends.py.

    torchrun --nproc-per-node 2 tests/scenarios/fault_train.py [--attach] [--inject WHAT,...]
        [--die RANK:STEP:HOW] [--message TEXT] [--attempt N] [--vanish STEP] [--no-init] [--steps N]

Each step: forward, backward, a synchronous all_reduce of every gradient, an async all_reduce of the
loss waited on, the optimizer step. Rank 0 prints ``LOSSES [..]`` (the global loss of every step) at
the end: the same numbers with or without zeromon, whatever zeromon meets.

``--attach``: zeromon_agent.attach() explicitly (otherwise `zeromon run` starts the agent, or nothing
does). ``--inject``: make zeromon's own code raise, by monkeypatching its internals before it starts:
collective (the collective wrapper's argument extraction), wait (Work.wait's record), phase (every
phase change), memory (the category walk), endpoint (every /metrics and snapshot: rank 0 scrapes
itself and prints ``SCRAPE <status>``), writer (the recording's file raises ENOSPC from its 5th write).
``--die RANK:STEP:HOW``: that rank, at that step, ends by ``kill`` (SIGKILL), ``term`` (SIGTERM),
``exception`` (RuntimeError; ``--message``: its message), ``corrupt`` (ValueError: corrupt shard 17, raised
outside any collective), ``exception-then-term`` (RuntimeError, and a SIGTERM while the agent ends the
recording), ``exit`` (sys.exit(0) early) or ``fail`` (sys.exit(1)); ``--attempt N``: only in torchelastic's
attempt N (TORCHELASTIC_RESTART_COUNT: 0, then 1 after a restart), and each attempt's process group joins
under a prefix of its own in the launcher's store: torchrun's static rendezvous keeps one store for every
attempt, where a restarted gloo group can read the addresses of the last attempt's ranks (connection
refused, or a hang; without zeromon too). ``--vanish STEP``: rank 0 removes the run
folder then. ``--no-init``: no process group at all (each rank trains alone, no collective).
"""

from __future__ import annotations

import argparse
import datetime
import errno
import json
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import torch
import torch.distributed as dist
from gloo_exit import leave
from scenario_output import say


def inject(what: set[str]) -> None:
    from zeromon.model import codec
    from zeromon_agent.hooks import collectives, state
    from zeromon_agent.live import view as snapshot
    from zeromon_agent.memory import readings as memory

    def boom(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("injected by fault_train.py")

    if "collective" in what:
        op, _extract = collectives.DIST_SPECS["all_reduce"]
        collectives.DIST_SPECS["all_reduce"] = (op, boom)
    broken = {kind for name, kind in (("wait", state.RAW_WAIT), ("phase", state.RAW_PHASE)) if name in what}
    if broken:  # the hooks' own push raising for these kinds, as a mistake in zeromon's hook would
        ring = state.Ring  # the C ring (not subclassable) or the deque's

        class BreakingRing:
            def __init__(self, capacity: int, width: int) -> None:
                self.ring = ring(capacity, width)

            def push(self, *fields: Any) -> None:
                if fields[0] in broken:
                    boom()
                self.ring.push(*fields)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.ring, name)

            def __len__(self) -> int:
                return len(self.ring)

            def __getitem__(self, index: int) -> Any:
                return self.ring[index]

        state.Ring = BreakingRing  # the agent's start makes the raw queue again, at its buffer's size
        state.STATE.raw = BreakingRing(state.STATE.raw_capacity, state.RAW_WIDTH)
        state.STATE.control = BreakingRing(state.CONTROL_CAPACITY, state.CONTROL_WIDTH)
    if "memory" in what:
        memory.Categorizer.walk_still = boom  # type: ignore[method-assign]
        memory.Categorizer.categorize = boom  # type: ignore[method-assign]
    if "endpoint" in what:
        snapshot.LiveData.view = boom  # type: ignore[method-assign]
    if "writer" in what:
        original_init = codec.RecordingWriter.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            self._file = _FullDisk(self._file)

        codec.RecordingWriter.__init__ = init  # type: ignore[method-assign]


class _FullDisk:
    """A file that takes 4 writes, then fails as a full disk does."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.writes = 0

    def write(self, data: bytes) -> int:
        self.writes += 1
        if self.writes > 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(self.handle.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def scrape(agent: Any) -> None:
    endpoint = getattr(agent, "endpoint", None)
    if endpoint is None:
        say("SCRAPE none")
        return
    try:
        with urllib.request.urlopen(endpoint.url + "/metrics", timeout=5) as answer:
            say(f"SCRAPE {answer.status}")
    except urllib.error.HTTPError as exc:
        say(f"SCRAPE {exc.code}")
    except OSError as exc:
        say(f"SCRAPE error {exc}")


def die(how: str, message: str) -> None:
    if how == "kill":  # when, on the recording's clock (unix ns), for the test of what a crash may lose
        say(f"DYING {time.time_ns()}")
    sys.stdout.flush()
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the signal ends the process before this does
    elif how == "exception":
        raise RuntimeError(message)
    elif how == "corrupt":
        raise ValueError("corrupt shard 17: checksum mismatch")
    elif how == "exception-then-term":
        # A SIGTERM that lands while the agent ends the recording at exit, as when the launcher stops the
        # other ranks of a job whose rank failed: sent from inside the recorder's stop, so it lands there.
        import zeromon_agent

        recorder = zeromon_agent.get_agent().recorder
        stop = recorder.stop

        def stop_under_a_sigterm(*args: Any, **kwargs: Any) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            stop(*args, **kwargs)

        recorder.stop = stop_under_a_sigterm
        raise RuntimeError("injected failure in the training loop")
    elif how == "exit":
        sys.exit(0)
    elif how == "fail":
        sys.exit(1)


def init_attempt_group(rank: int, world: int) -> None:
    """The default group, joined under a prefix of this attempt's in the launcher's store."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt_{attempt}", store), rank=rank, world_size=world)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--attach", action="store_true")
    parser.add_argument("--inject", default="")
    parser.add_argument("--die", default="")
    parser.add_argument("--message", default="injected failure in the training loop")
    parser.add_argument("--attempt", type=int, default=None)
    parser.add_argument("--vanish", type=int, default=-1)
    parser.add_argument("--no-init", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    injected = {w for w in args.inject.split(",") if w}
    if injected:
        inject(injected)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.attempt is not None:
        init_attempt_group(rank, world)
    elif not args.no_init:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    agent = None
    if args.attach:
        import zeromon_agent

        agent = zeromon_agent.attach(model=model, optimizer=optimizer)
        say(f"ATTACHED rank {rank} started={agent.started}")
    die_rank, die_step, die_how = (args.die.split(":") + ["", "", ""])[:3] if args.die else ("-1", "-1", "")
    if args.attempt is not None and args.attempt != int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")):
        die_rank = "-1"
    generator = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for step in range(args.steps):
        if rank == int(die_rank) and step == int(die_step):
            die(die_how, args.message)
        if rank == 0 and step == args.vanish:
            shutil.rmtree(os.environ["ZEROMON_OUT"])
            say(f"VANISHED at step {step}")
        x = torch.randn(8, 16, generator=generator)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        total = loss.detach().clone()
        if not args.no_init:
            for p in model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
                p.grad /= world
            work = dist.all_reduce(total, async_op=True)
            assert work is not None
            work.wait()
            del work
            total /= world
        optimizer.step()
        optimizer.zero_grad()
        losses.append(round(float(total), 6))
        if rank == 0 and step == 3 and "endpoint" in injected:
            scrape(agent)
        if args.sleep:
            time.sleep(args.sleep)
    if rank == 0:
        say("LOSSES " + json.dumps(losses))
    if not args.no_init:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave()  # without the interpreter's finalization: gloo_exit.py
