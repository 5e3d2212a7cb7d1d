"""The training `zeromon demo` runs: a small FSDP2 model on CPU (gloo), with one problem built in.

    zeromon run -- python zeromon/demo/train.py --scenario leak

It is an ordinary training script: it does not import zeromon. Under `zeromon run` the agent hooks
it from outside (no code change), as it would any user's job. It starts its ranks itself
(multiprocessing's spawn, with the environment torchrun would give them), so that Ctrl-C stops them
cleanly at the end of a step: torchrun answers Ctrl-C by killing its workers, with tracebacks. This
launcher imports no torch (seconds before the first rank could start); each rank imports the training,
``training.py`` beside this file.

A stack of Linear layers sharded with FSDP2 (``fully_shard``), trained with AdamW on random data. A
forward "computes" by sleeping ``compute_s`` (the compute a GPU would do, without loading a shared
CPU); the scenarios:

- healthy:   two layers of 256 as one FSDP2 unit, 300 ms of compute a step: its two collectives
             (an all-gather, a reduce-scatter, each small on gloo) are a sliver;
- leak:      healthy, and every step keeps ``leak_mib`` MiB more alive (tensors kept in a list, as
             a loop that keeps its outputs without ``.detach()`` leaks), against a small stated capacity;
- exposed:   four layers of 768 gathered again in backward, 5 ms of compute: the all-gathers and
             reduce-scatters of 2.3 MiB layers have nothing to hide behind (on gloo a collective
             blocks the training thread);
- straggler: healthy, and rank 1 computes 100 ms more every step: rank 0 waits for it at every
             collective.

Ends after ``--steps`` steps, ``--seconds`` seconds (rank 0's clock) or Ctrl-C, whichever is first: the
ranks agree every STOP_CHECK_EVERY_STEPS steps through a one-number all-reduce, so both stop at the
same step.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence

from zeromon.model.classes import frozen

GRACE_S = 10.0  # a failed rank's peers get SIGTERM, then SIGKILL after this long (as torchrun does)


@frozen
class Shape:
    width: int
    layers: int
    batch: int
    compute_s: float  # sleep per forward, every rank
    late_rank: int | None = None  # this rank sleeps late_s more per forward
    late_s: float = 0.0
    leak_mib: float = 0.0  # MiB kept alive per step
    per_layer: bool = False  # each layer its own FSDP2 unit (else one unit for the whole model)
    reshard: bool = False  # FSDP2's reshard_after_forward: gather the parameters again in backward


class Flag:
    """Set by a signal handler, read by the training loop, all in the main thread. Not threading.Event:
    its set() takes a lock, and a second Ctrl-C whose handler runs while the first one's set() holds it
    waits for it forever, in the thread that holds it (the demo hung so once, its ranks done)."""

    __slots__ = ("_set", "_sets")

    def __init__(self) -> None:
        self._set = False
        self._sets = itertools.count()

    def set(self) -> bool:
        """Set it; whether this call was the first. Exactly one call is, however handlers nest: next()
        on a count is one C call, between whose start and end no Python handler runs."""
        first = next(self._sets) == 0
        self._set = True
        return first

    def is_set(self) -> bool:
        return self._set


def ctrl_c_handler(flag: Flag, say: str | None = None) -> Callable[[int, object], None]:
    """A SIGINT handler that notes Ctrl-C in ``flag`` and says ``say`` on stderr the first time. Ctrl-C can
    come twice within microseconds (from the terminal, and forwarded by `zeromon run`)."""

    def handler(_sig: int, _frame: object) -> None:
        if flag.set() and say is not None:
            print(say, file=sys.stderr, flush=True)

    return handler


SHAPES = {
    "healthy": Shape(width=256, layers=2, batch=16, compute_s=0.3),
    "leak": Shape(width=256, layers=2, batch=16, compute_s=0.3, leak_mib=8.0),
    "exposed": Shape(width=768, layers=4, batch=4, compute_s=0.005, per_layer=True, reshard=True),
    "straggler": Shape(width=256, layers=2, batch=16, compute_s=0.3, late_rank=1, late_s=0.1),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SHAPES), default="healthy")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    parser.add_argument("--ranks", type=int, default=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Start the ranks (as torchrun would set them up) and wait for them. Ctrl-C reaches every process of
    the terminal: the ranks finish their step and stop together; this one waits for them."""
    args = parse_args(argv)
    port = rendezvous_port()
    # A handler, not KeyboardInterrupt: Ctrl-C comes twice (from the terminal, and forwarded by `zeromon run`),
    # and the second would land in the first one's handling.
    signal.signal(signal.SIGINT, ctrl_c_handler(Flag(), "demo: Ctrl-C: the ranks stop after this step"))
    spawn = multiprocessing.get_context("spawn")
    ranks = [spawn.Process(target=rank_main, args=(rank, args, port), name=f"demo-rank-{rank}")
             for rank in range(args.ranks)]
    for process in ranks:
        process.start()
    return wait_for_ranks(ranks)


def ephemeral_low() -> int:
    """The lowest port the kernel hands out to a connection or a bind to port 0 (ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def rendezvous_port() -> int:
    """A free port for rank 0's rendezvous store (torchrun's default, 29500, may be taken), below the kernel's
    ephemeral range (ip_local_port_range): a port that bind(("127.0.0.1", 0)) returned is handed out again to
    the next outgoing connection or port-0 endpoint, and rank 0 listens on it only once torch is imported,
    seconds later (EADDRINUSE at the rendezvous). Starts at a random port of 20000-32767, and skips what is bound."""
    ceiling = ephemeral_low()
    floor = max(1024, min(20000, ceiling - 1000))
    start = random.randrange(floor, ceiling) if floor < ceiling else floor
    port = first_bindable(itertools.chain(range(start, ceiling), range(floor, start)))
    if port is not None:
        return port
    with socket.socket() as probe:  # every one taken: any the kernel gives
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def first_bindable(ports: Iterable[int]) -> int | None:
    """The first of ``ports`` that 127.0.0.1 can bind now (nothing listens on it); None when none can."""
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return None


def wait_for_ranks(ranks: Sequence[multiprocessing.process.BaseProcess]) -> int:
    """0 once every rank has exited cleanly. When one fails, the others would wait for it in their next
    collective (gloo's timeout is 30 minutes): they get SIGTERM, then SIGKILL after GRACE_S, and this returns 1,
    as torchrun does."""
    running = list(ranks)
    while running:
        multiprocessing.connection.wait([process.sentinel for process in running])
        for process in [p for p in running if p.exitcode is not None]:
            running.remove(process)
            if process.exitcode != 0:
                code = process.exitcode or 0
                how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                print(f"demo: rank {ranks.index(process)} {how}; stopping the other ranks", file=sys.stderr,
                      flush=True)
                _stop(running)
                return 1
    return 0


def _stop(ranks: Sequence[multiprocessing.process.BaseProcess]) -> None:
    for process in ranks:
        process.terminate()
    deadline = time.monotonic() + GRACE_S  # one grace period for all of them
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join()


def rank_main(local_rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(args.ranks),
                      LOCAL_WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    interrupted = Flag()
    # A KeyboardInterrupt between two collectives would leave the peer blocked in the next one (gloo's
    # timeout is 30 minutes): the ranks note Ctrl-C and agree to stop at the end of a step instead.
    signal.signal(signal.SIGINT, ctrl_c_handler(interrupted))
    # The rank's training, beside this file: a spawned rank has this launcher's sys.path, this folder first.
    import training

    training.train(SHAPES[args.scenario], args, interrupted)
    training.let_go_of_the_group()  # train()'s model is unreferenced now: collected with its group


if __name__ == "__main__":
    sys.exit(main())
