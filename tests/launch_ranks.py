"""A launcher for the tests' multi-process runs that does not import torch: it starts N ranks of a script
with the environment torchrun gives its workers, and ends as torchrun does when one of them fails.

    python tests/launch_ranks.py --nproc-per-node 2 --master-port 29500 script.py [args...]

Why: torchrun imports torch and its elastic agent before it starts a rank (3.4 s of CPU here, a third of
a small 2-rank run's), and the suite makes a hundred such runs on CI's 2 cores. The ranks themselves are
unchanged: real processes joining a real gloo process group. The tests of what the launcher does
(signals, a failed or killed rank, restarts, exit codes: tests/test_faults.py, tests/test_hang.py,
tests/test_rank_ends.py, tests/test_agent_lifecycle.py, tests/test_gloo_exit.py, the trainers) run under
torchrun itself (conftest.torchrun_args).

Failure: when a rank exits with a non-zero status the others get SIGTERM, then SIGKILL after a grace
period, and the launcher exits 1 after saying which rank failed (torchrun's ChildFailedError). SIGINT
and SIGTERM are passed on to the ranks.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid

GRACE_S = 10.0


def _environment(rank: int, world: int, port: int, run_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_NAME="default",
               WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), GROUP_WORLD_SIZE="1", ROLE_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0",
               TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_RUN_ID=run_id)
    env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it
    return env


def _stop(ranks: list[subprocess.Popen[bytes]], sig: int) -> None:
    for proc in ranks:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.monotonic() + GRACE_S
    for proc in ranks:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    run_id = uuid.uuid4().hex
    ranks = [subprocess.Popen([sys.executable, args.script, *args.args],
                              env=_environment(rank, args.nproc_per_node, args.master_port, run_id))
             for rank in range(args.nproc_per_node)]
    received: list[int] = []

    def pass_on(signum: int, _frame: object) -> None:
        received.append(signum)
        for proc in ranks:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGINT, pass_on)
    signal.signal(signal.SIGTERM, pass_on)
    while True:
        codes = [proc.poll() for proc in ranks]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank, code = failed[0]
            print(f"launch_ranks: rank {rank} failed with exit code {code}", file=sys.stderr, flush=True)
            _stop(ranks, signal.SIGTERM)
            return 1
        if all(code == 0 for code in codes):
            return 128 + received[0] if received else 0
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
