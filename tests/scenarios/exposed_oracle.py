"""A 2-rank gloo training run timed by stopwatches of its own: the oracle of exposed communication.

On the host, a step's exposed communication is the time the training thread spent blocked on
communication within the step: inside every collective call (synchronous calls and the issue of
async ones) and inside ``Work.wait()`` / ``wait_tensor``. The oracle measures exactly that with
``time.perf_counter_ns`` and none of zeromon's code: it wraps every ``torch.distributed`` collective
the frameworks call (in ``torch.distributed`` and ``distributed_c10d``), ``Work.wait``, DTensor's
functional collectives and ``wait_tensor``, and DeepSpeed's cached collectives; it counts the
training thread only, and only the outermost of nested calls (the deprecated aliases call the new
names). The loop sums it per step as zeromon numbers steps: a step ends when the optimizer step
returns (the k-th optimizer step ends step k; the first starts at the root module's first forward),
or is one ``with zeromon_agent.step():`` block.

Two stopwatches, one on each side of zeromon's wrappers:
- ``blocked_s`` (outer, installed after ``zeromon_agent.attach``): the calls as the loop makes them,
  zeromon's wrappers included;
- ``inner_blocked_s`` (installed before): the real calls alone, inside zeromon's wrappers.
zeromon's own time in its wrappers (~10 us a call) is neither computation nor communication, so an
exact answer lies between the two. They differ by more only when the thread is descheduled or
waits for the GIL inside a wrapper (on 2 busy cores, 1-10 ms in a few percent of steps).

--mode picks the loop:
- sync:              forward, a synchronous 16 MB all-reduce, backward, optimizer step;
- async_partial:     a 32 MB async all-reduce issued before a shorter forward, waited after;
- async_hidden:      a 4 MiB async all-reduce issued before a longer forward+backward, waited after;
- async_across_steps: a 16 MB async all-reduce issued before the optimizer step, waited after the
                     next step's forward (issued in one step, waited in the next);
- step_loop:         ``with zeromon_agent.step():`` around plain tensor code (no module, autograd or
                     torch optimizer): an async all-reduce behind matmuls, a synchronous one, an update;
- grad_accum:        4 micro-batches of forward+backward, each followed by an async all-reduce that
                     overlaps the next, all waited before one optimizer step;
- fsdp2_reshard:     FSDP2, reshard_after_forward=True, async all-gathers (_set_unshard_async_op);
- fsdp2_no_reshard:  FSDP2, reshard_after_forward=False, clip_grad_norm_ (a functional all-reduce);
- deepspeed_zero2 / deepspeed_zero3: DeepSpeed ZeRO-2 / ZeRO-3, fp32, a torch AdamW.

Each rank writes TRUTH_DIR/truth-<rank>.json: ``unix_minus_perf_ns`` (to place the calls on a
recording's clock) and per step: ``blocked_s``, ``inner_blocked_s``, the outer stopwatch's calls
(``calls_ns``: [api, start, end] in perf_counter ns) and seconds by API, the loop's own stopwatch
around the collectives it issues and waits on itself (``loop_blocked_s``), the step's wall time
(``step_s``: the block, or from the previous optimizer step's return, for the first from the first
forward) and whether each async all-reduce of the loop was complete before its wait.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from gloo_exit import leave
from stopwatch_oracle import BlockedClock, install_oracle
from torch import nn

import zeromon_agent

MODES = ("sync", "async_partial", "async_hidden", "async_across_steps", "step_loop", "grad_accum", "fsdp2_reshard",
         "fsdp2_no_reshard", "deepspeed_zero2", "deepspeed_zero3")

# --- the model and the loops ----------------------------------------------------------------------


class Block(nn.Module):
    """A transformer-ish MLP block: norm, up-projection, GELU, down-projection, residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class LoopStopwatch:
    """The loop's own stopwatch around the collectives it issues and waits on itself."""

    def __init__(self) -> None:
        self.ns = 0

    @contextmanager
    def blocked(self) -> Iterator[None]:
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            self.ns += time.perf_counter_ns() - t0

    def take(self) -> int:
        ns, self.ns = self.ns, 0
        return ns


def batch(width: int, rows: int, step: int) -> torch.Tensor:
    """Data loading: a little computation outside any module (it counts as computation)."""
    generator = torch.Generator().manual_seed(step * 7 + dist.get_rank())
    x = torch.randn(rows, width, generator=generator)
    return x / x.norm(dim=1, keepdim=True)


class Scenario:
    """One mode's loop: ``step(k)`` is its k-th iteration, one step of zeromon's (``explicit_steps``: run
    inside ``zeromon_agent.step()``; otherwise ending in the optimizer step)."""

    explicit_steps = False

    def __init__(self, width: int, rows: int) -> None:
        self.width, self.rows = width, rows
        self.loop = LoopStopwatch()
        self.done_before_wait: list[bool] = []

    def attach(self) -> None:
        zeromon_agent.attach()

    def root(self) -> nn.Module | None:
        """The module whose first forward starts the first step (without explicit steps)."""
        return None

    def all_reduce(self, payload: torch.Tensor) -> None:
        with self.loop.blocked():
            dist.all_reduce(payload)

    def issue(self, payload: torch.Tensor) -> Any:
        with self.loop.blocked():
            return dist.all_reduce(payload, async_op=True)

    def wait(self, work: Any) -> None:
        self.done_before_wait.append(bool(work.is_completed()))
        with self.loop.blocked():
            work.wait()

    def step(self, k: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """After the last step: wait on what is still in flight."""


class Training(Scenario):
    """A Net trained by a torch optimizer, whose step ends zeromon's step."""

    def __init__(self, width: int, depth: int, rows: int) -> None:
        super().__init__(width, rows)
        torch.manual_seed(0)
        self.model = self.shard(Net(width, depth))
        self.optimizer = self.make_optimizer()

    def shard(self, model: nn.Module) -> nn.Module:
        return model

    def make_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=1e-3)

    def attach(self) -> None:
        zeromon_agent.attach(model=self.model, optimizer=self.optimizer)

    def root(self) -> nn.Module | None:
        return self.model

    def loss(self, k: int) -> torch.Tensor:
        return self.model(batch(self.width, self.rows, k)).square().mean()


class Sync(Training):
    def __init__(self) -> None:
        super().__init__(width=256, depth=3, rows=128)
        self.payload = torch.ones(4_000_000)  # 16 MB

    def step(self, k: int) -> None:
        self.optimizer.zero_grad()
        out = self.model(batch(self.width, self.rows, k))
        self.all_reduce(self.payload)
        out.square().mean().backward()
        self.optimizer.step()


class AsyncPartial(Training):
    def __init__(self) -> None:
        super().__init__(width=256, depth=1, rows=64)
        self.payload = torch.ones(8_000_000)  # 32 MB: outlasts the forward

    def step(self, k: int) -> None:
        self.optimizer.zero_grad()
        work = self.issue(self.payload)
        out = self.model(batch(self.width, self.rows, k))
        self.wait(work)
        out.square().mean().backward()
        self.optimizer.step()


class AsyncAcrossSteps(Training):
    """An async all-reduce issued before the optimizer step, waited after the next step's forward."""

    def __init__(self) -> None:
        super().__init__(width=256, depth=1, rows=64)
        self.payload = torch.ones(4_000_000)  # 16 MB: outlasts the optimizer step and the next forward
        self.in_flight: Any = None

    def step(self, k: int) -> None:
        self.optimizer.zero_grad()
        out = self.model(batch(self.width, self.rows, k))
        if self.in_flight is not None:
            self.wait(self.in_flight)
        out.square().mean().backward()
        self.in_flight = self.issue(self.payload)
        self.optimizer.step()

    def finish(self) -> None:
        if self.in_flight is not None:
            self.in_flight.wait()


class AsyncHidden(Training):
    def __init__(self) -> None:
        super().__init__(width=256, depth=6, rows=256)
        self.payload = torch.ones(1 << 20)  # 4 MiB: done well before the backward is

    def step(self, k: int) -> None:
        self.optimizer.zero_grad()
        work = self.issue(self.payload)
        self.loss(k).backward()
        self.wait(work)
        self.optimizer.step()


class GradAccum(Training):
    MICRO_BATCHES = 4

    def __init__(self) -> None:
        super().__init__(width=256, depth=2, rows=64)
        self.buckets = [torch.ones(1_000_000) for _ in range(self.MICRO_BATCHES)]  # 4 MB each

    def step(self, k: int) -> None:
        self.optimizer.zero_grad()
        works = []
        for micro in range(self.MICRO_BATCHES):
            self.loss(k * self.MICRO_BATCHES + micro).backward()
            works.append(self.issue(self.buckets[micro]))  # overlaps the next micro-batch
        for work in works:
            self.wait(work)
        self.optimizer.step()


class StepLoop(Scenario):
    """A custom loop of plain tensor code: no module forward, no autograd, no torch optimizer."""

    explicit_steps = True

    def __init__(self) -> None:
        super().__init__(width=512, rows=256)
        generator = torch.Generator().manual_seed(0)
        self.weights = [torch.randn(self.width, self.width, generator=generator) / self.width ** 0.5
                        for _ in range(6)]
        self.stats = torch.ones(3_000_000)  # 12 MB, async behind the matmuls
        self.grad = torch.empty(self.width, self.width)  # 1 MB, synchronous

    def step(self, k: int) -> None:
        work = self.issue(self.stats)
        h = batch(self.width, self.rows, k)
        for w in self.weights:
            h = torch.tanh(h @ w)
        self.wait(work)
        torch.matmul(h.T, h, out=self.grad)
        self.all_reduce(self.grad)
        for w in self.weights:  # a custom update
            w.sub_(self.grad, alpha=1e-6)


class Fsdp2(Training):
    def __init__(self, reshard: bool) -> None:
        self.reshard = reshard
        super().__init__(width=256, depth=4, rows=128)

    def shard(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:  # type: ignore[union-attr]
            fully_shard(block, mesh=mesh, reshard_after_forward=self.reshard)
        sharded = fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard)
        assert isinstance(sharded, FSDPModule)
        if self.reshard:
            sharded._set_unshard_async_op(True)  # the all-gathers async, each waited on
        return model

    def make_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def step(self, k: int) -> None:
        self.optimizer.zero_grad()
        self.loss(k).backward()
        if not self.reshard:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)  # DTensor: a functional all-reduce
        self.optimizer.step()


class DeepSpeed(Training):
    def __init__(self, stage: int) -> None:
        import deepspeed

        super().__init__(width=256, depth=4, rows=128)
        config = {"train_micro_batch_size_per_gpu": self.rows, "gradient_accumulation_steps": 1,
                  "train_batch_size": self.rows * dist.get_world_size(), "zero_optimization": {"stage": stage},
                  "steps_per_print": 2**31 - 1, "wall_clock_breakdown": False}
        self.engine, _, _, _ = deepspeed.initialize(model=self.model, optimizer=self.optimizer, config=config)

    def make_optimizer(self) -> torch.optim.Optimizer:
        # A torch AdamW: DeepSpeed's own Adam JIT-compiles an op (about a minute on CPU).
        return torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def attach(self) -> None:
        zeromon_agent.attach(engine=self.engine)

    def root(self) -> nn.Module | None:
        return self.engine  # type: ignore[no-any-return]

    def step(self, k: int) -> None:
        loss = self.engine(batch(self.width, self.rows, k)).square().mean()
        self.engine.backward(loss)
        self.engine.step()


def build(mode: str) -> Scenario:
    if mode.startswith("deepspeed"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    else:
        dist.init_process_group("gloo")
    factories: dict[str, Callable[[], Scenario]] = {
        "sync": Sync, "async_partial": AsyncPartial, "async_hidden": AsyncHidden,
        "async_across_steps": AsyncAcrossSteps, "step_loop": StepLoop,
        "grad_accum": GradAccum, "fsdp2_reshard": lambda: Fsdp2(reshard=True),
        "fsdp2_no_reshard": lambda: Fsdp2(reshard=False), "deepspeed_zero2": lambda: DeepSpeed(stage=2),
        "deepspeed_zero3": lambda: DeepSpeed(stage=3),
    }
    return factories[mode]()


def run(scenario: Scenario, outer: BlockedClock, inner: BlockedClock, steps: int) -> list[dict[str, Any]]:
    def take() -> dict[str, Any]:
        blocked_ns, by_api, calls = outer.take()
        inner_ns, _, _ = inner.take()
        return {"blocked_s": blocked_ns / 1e9, "inner_blocked_s": inner_ns / 1e9, "calls_ns": calls,
                "blocked_s_by_api": {api: ns / 1e9 for api, ns in sorted(by_api.items())},
                "loop_blocked_s": scenario.loop.take() / 1e9}

    take()  # the warm-up's calls belong to no step
    # Without explicit steps the first step starts at the root module's first forward: what came
    # before it in the first iteration is warm-up too.
    first_forward: list[int] = []

    def on_forward(module: nn.Module, args: Any) -> None:
        if not first_forward:
            first_forward.append(time.perf_counter_ns())
            take()

    root = scenario.root()
    handle = None if root is None else root.register_forward_pre_hook(on_forward, prepend=True)
    truth = []
    last_end = 0
    for k in range(steps):
        start = time.perf_counter_ns()
        if scenario.explicit_steps:
            with zeromon_agent.step():
                scenario.step(k)
        else:
            scenario.step(k)
        end = time.perf_counter_ns()
        if scenario.explicit_steps:
            step_ns = end - start  # the block
        else:  # from the previous optimizer step's return (the first forward) to this one's
            step_ns = end - (last_end or first_forward[0])
        last_end = end
        truth.append({"step": k, **take(), "step_s": step_ns / 1e9,
                      "done_before_wait": scenario.done_before_wait[:]})
        scenario.done_before_wait.clear()
    scenario.finish()
    if handle is not None:
        handle.remove()
    return truth


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--truth-dir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scenario = build(args.mode)
    rank = dist.get_rank()
    inner, outer = BlockedClock(), BlockedClock()
    install_oracle(inner)
    scenario.attach()
    install_oracle(outer)
    dist.barrier()  # the warm-up: before the first step, in no step
    truth = run(scenario, outer, inner, args.steps)
    zeromon_agent.detach()
    unix_minus_perf_ns = time.time_ns() - time.perf_counter_ns()
    Path(args.truth_dir, f"truth-{rank}.json").write_text(json.dumps(
        {"mode": args.mode, "unix_minus_perf_ns": unix_minus_perf_ns, "steps": truth}))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    leave()  # without the interpreter's finalization: gloo_exit.py
