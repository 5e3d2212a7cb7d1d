"""What a trainer scenario measures about itself, with time.perf_counter_ns and none of zeromon's code: each
training forward of the model, each backward, each optimizer update, and the loss of each step. Written per rank
as JSON for the test to hold zeromon's recording against (tests/test_trainers_*.py)."""

from __future__ import annotations

import functools
import gc
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch


class Stopwatch:
    """Durations (s) of each call timed, by kind, in call order; nested calls of a kind time the outermost."""

    def __init__(self) -> None:
        # update: the sum of a step's calls (one a parameter group, or more: ZeRO steps each group on its own),
        # from one training forward to the next, so that an update inside optimizer.step(closure) counts too
        self.seconds: dict[str, list[float]] = {"forward": [], "backward": [], "update": [], "engine_step": []}
        self._update_ns: int | None = None
        self.losses: list[str] = []  # repr() of each training loss: compared exactly with and without the agent
        self.param_bytes = 0  # the model's parameters, whole, as built (before any framework shards them)
        self._depth: dict[str, int] = {}
        self._start: dict[str, int] = {}

    def begin(self, kind: str) -> None:
        depth = self._depth.get(kind, 0)
        self._depth[kind] = depth + 1
        if depth == 0:
            self._start[kind] = time.perf_counter_ns()

    def end(self, kind: str) -> None:
        self._depth[kind] -= 1
        if self._depth[kind] == 0:
            elapsed_ns = time.perf_counter_ns() - self._start[kind]
            if kind == "update":
                self._update_ns = (self._update_ns or 0) + elapsed_ns
            else:
                self.seconds[kind].append(elapsed_ns / 1e9)

    def _close_update(self) -> None:
        if self._update_ns is not None:
            self.seconds["update"].append(self._update_ns / 1e9)
        self._update_ns = None

    def wrap(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.begin(kind)
            try:
                return fn(*args, **kwargs)
            finally:
                self.end(kind)

        return timed

    def time_updates(self) -> None:
        """Around torch.optim.adam.adam, the update AdamW's step makes (Adam.step calls it by its module's name)."""
        from torch.optim import adam as adam_module

        adam_module.adam = self.wrap(adam_module.adam, "update")  # type: ignore[assignment]

    def time_backwards(self) -> None:
        """Around torch.autograd.backward, which loss.backward() calls (whoever calls that: a trainer, a closure)."""
        torch.autograd.backward = self.wrap(torch.autograd.backward, "backward")  # type: ignore[assignment]

    def time_forwards(self, module: torch.nn.Module) -> None:
        """Training forwards (with grad) of the outermost module the training calls (a trainer's wrapper, DDP,
        DeepSpeed's engine), by its own hooks, outside any other: FSDP's unshard before the forward and reshard after
        it are the forward's."""

        def pre(module: Any, args: Any, kwargs: Any) -> None:
            if torch.is_grad_enabled():
                self._close_update()
                self.begin("forward")

        def post(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            if torch.is_grad_enabled():
                self.end("forward")

        module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)
        module.register_forward_hook(post, with_kwargs=True)

    def record_losses(self, model: torch.nn.Module) -> None:
        """The loss of each training forward of the (inner) model, as returned; and the model's size."""
        self.param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

        def post(module: Any, args: Any, output: Any) -> None:
            if torch.is_grad_enabled():
                self.losses.append(repr(output.loss.item()))

        model.register_forward_hook(post)

    def taken(self, rank: int, **extra: Any) -> dict[str, Any]:
        """What was measured so far, copied: a training after this adds nothing to it."""
        self._close_update()
        return {"rank": rank, **{kind: list(seconds) for kind, seconds in self.seconds.items()},
                "losses": list(self.losses), "param_bytes": self.param_bytes, **extra}

    def again_without_agent(self, taken: dict[str, Any], train: Callable[[], Any]) -> dict[str, Any]:
        """``taken`` with the losses of ``train`` (the same training, built again from the same seeds) run after
        zeromon's agent is detached, where one runs: its recording ends there (the end record written), and
        torch's own functions and hooks are back (tests/test_agent_lifecycle.py)."""
        detach_agent()
        self.losses = []
        train()
        return {**taken, "losses_without_agent": self.losses}


def write(path_template: str, taken: dict[str, Any]) -> None:
    path = path_template.format(rank=taken["rank"])
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(taken, f)
    print(f"rank {taken['rank']} losses with the agent {taken['losses']}, without it "
          f"{taken.get('losses_without_agent')}", flush=True)


def detach_agent() -> None:
    try:
        import zeromon_agent
    except ImportError:  # run without zeromon: nothing to detach
        return
    zeromon_agent.detach()


def tiny_gpt2(seed: int = 0) -> torch.nn.Module:
    """GPT-2 of two layers built from its config: no download."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=64,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def token_batches(count: int, batch: int, seq: int = 32, vocab: int = 512, seed: int = 1) -> torch.Tensor:
    """Synthetic tokens, the same on every run: (count, batch, seq)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count, batch, seq), generator=generator)


def teardown() -> None:
    """End the process group here, not in the interpreter's exit, where gloo's threads outliving it abort the
    rank (examples/tinygpt.py's teardown says how)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
