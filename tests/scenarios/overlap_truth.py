"""A 2-rank gloo run whose communication/computation overlap is known by construction.

Each step: a root module's forward (known compute) and one all-reduce placed by --mode:
- sync:    forward, then a synchronous all-reduce: nothing overlaps (exposed = the all-reduce);
- hidden:  an async all-reduce issued before a forward that outlasts it, waited on after: all of
           it overlaps (exposed ~ 0);
- partial: an async all-reduce issued before a forward shorter than it: the forward overlaps,
           the rest is exposed (the wait).
Exposed is the training thread's own stopwatch around the issue call and the wait (what zeromon
calls exposed on the host); overlap is the rest of the communication: the union of the collective's
issue-to-completion time and the thread's wait, less what is exposed.
The script times its own forward and collective and writes the truth per step to
TRUTH_DIR/truth-<rank>.json, for the test to compare with what zeromon's analysis derives from
the recording.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_exit import leave

import zeromon_agent


class Compute(torch.nn.Module):
    """A stack of matmuls: deterministic CPU work of a chosen length."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("sync", "hidden", "partial"), required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--truth-dir", required=True)
    parser.add_argument("--numel", type=int, default=None, help="the all-reduce's elements (default: the mode's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # The truth's completion time and the agent's are two Python callbacks on gloo's thread, one after the other:
    # between them the training thread can hold the GIL for up to the switch interval, which at its default is
    # not small next to the 10% tolerance of a short all-reduce. A tenth of it keeps that hand-over small.
    sys.setswitchinterval(0.0005)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # hidden: long compute, smaller all-reduce; partial: short compute, large all-reduce. Everything
    # lasts tens of ms at least: a GIL hand-over (up to 5 ms) between the script's clock reads and the
    # agent's must stay small next to what is measured.
    depth = {"sync": 12, "hidden": 96, "partial": 8}[args.mode]
    numel = args.numel or {"sync": 12_000_000, "hidden": 4_000_000, "partial": 16_000_000}[args.mode]
    model = Compute(512, depth)
    x = torch.randn(256, 512)
    payload = torch.ones(numel)
    zeromon_agent.attach(model=model)
    truth = []
    with torch.no_grad():
        for step in range(args.steps):
            with zeromon_agent.step():
                t_issue = time.time_ns()
                if args.mode == "sync":
                    f0 = time.time_ns()
                    model(x)
                    f1 = time.time_ns()
                    c0 = time.time_ns()
                    dist.all_reduce(payload)
                    c1 = time.time_ns()
                    comm_ns = c1 - c0
                    exposed = c1 - c0
                    overlap = 0
                else:
                    work = dist.all_reduce(payload, async_op=True)
                    issued = time.time_ns()
                    done: list[int] = []
                    # The script's own completion time: a callback when the collective completes.
                    work.get_future().add_done_callback(lambda _f, done=done: done.append(time.time_ns()))
                    f0 = time.time_ns()
                    model(x)
                    f1 = time.time_ns()
                    w0 = time.time_ns()
                    work.wait()
                    w1 = time.time_ns()
                    while not done:  # the callback runs on gloo's thread right after completion
                        time.sleep(0.0001)
                    end = done[0]
                    # Communication: the collective's issue to its completion, and the thread's time in
                    # the wait, which may outlast the completion (the thread back on a busy CPU late, or
                    # the wait's own cost): both are communication (zeromon.analysis.step_overlap._parts),
                    # so the truth's is the union of the two. The completion alone made the truth's
                    # overlap short by that tail, which a loaded 2-core CI machine showed (11 ms).
                    comm_ns = (end - t_issue) + (w1 - w0) - max(0, min(end, w1) - max(t_issue, w0))
                    # Exposed: the time this thread could do nothing else, in the issue call and the
                    # wait; the rest of the collective ran on gloo's threads while this one worked.
                    exposed = (issued - t_issue) + (w1 - w0)
                    overlap = comm_ns - exposed
                # The exposed time's two parts by the thread's stopwatch (issue 47: which one zeromon counts short).
                issue_ns, wait_ns = (exposed, 0) if args.mode == "sync" else (issued - t_issue, w1 - w0)
                # And where on the Unix clock (the recording's): the call from the thread's clock read before it to
                # the one after it, so that time lost outside zeromon's wrapper (between these reads and its own)
                # can be told from time lost inside it.
                call = (c0, c1) if args.mode == "sync" else (t_issue, issued)
                truth.append({"step": step, "comm_s": comm_ns / 1e9, "forward_s": (f1 - f0) / 1e9,
                              "exposed_s": exposed / 1e9, "overlap_s": overlap / 1e9,
                              "issue_s": issue_ns / 1e9, "wait_s": wait_ns / 1e9,
                              "call_ns": list(call), "wait_ns": None if args.mode == "sync" else [w0, w1]})
    zeromon_agent.detach()
    Path(args.truth_dir, f"truth-{rank}.json").write_text(json.dumps(truth))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    leave()  # without the interpreter's finalization: gloo_exit.py
