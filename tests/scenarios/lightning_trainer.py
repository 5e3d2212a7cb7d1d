"""Lightning's Trainer or Fabric on a tiny GPT-2, 2 CPU ranks on gloo, with DDP or ModelParallelStrategy (FSDP2):
under torchrun (Lightning sees its environment) or under Lightning's own launcher (`python lightning_trainer.py`:
rank 0 starts rank 1 itself, devices=2). Writes the stopwatch of tests/scenarios/trainer_stopwatch.py per rank,
and the trainer's own step count. Each rank trains twice: under zeromon's agent, then detached from it, from the
same seeds (its losses compared bit for bit).

The Trainer runs forward and backward inside optimizer.step(closure); Fabric's loop here is the plain one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_stopwatch import Stopwatch, teardown, tiny_gpt2, token_batches, write  # noqa: E402

MICRO_BATCH = 4


def shard(model: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """FSDP2 over the data-parallel dimension: each GPT-2 block a unit, then the root."""
    from torch.distributed.fsdp import fully_shard

    dp_mesh = mesh["data_parallel"]
    for block in model.transformer.h:  # type: ignore[union-attr]
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def strategy(name: str, api: str) -> Any:
    if name == "ddp":
        return "ddp"
    if api == "fabric":
        from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallel

        return FabricModelParallel(parallelize_fn=shard, data_parallel_size=2, tensor_parallel_size=1)
    from lightning.pytorch.strategies import ModelParallelStrategy

    return ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)


def run_trainer(args: argparse.Namespace, watch: Stopwatch) -> dict[str, Any]:
    import lightning as L

    class TinyGPT(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_gpt2()
            watch.record_losses(self.model)

        def on_train_start(self) -> None:
            # DDP's wrapper is what the Trainer calls; under ModelParallelStrategy, training_step calls the model.
            outer = self.trainer.strategy.model
            watch.time_forwards(outer if outer is not self else self.model)

        def configure_model(self) -> None:
            if args.strategy == "fsdp2":
                shard(self.model, self.device_mesh)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.model(input_ids=batch, labels=batch).loss  # type: ignore[no-any-return]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train() -> Any:
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy(args.strategy, "trainer"),
                            max_steps=args.steps, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=True,
                            default_root_dir=args.root)
        data = torch.utils.data.DataLoader(list(token_batches(args.steps * 2, MICRO_BATCH).reshape(-1, 32)),
                                           batch_size=MICRO_BATCH)
        trainer.fit(TinyGPT(), data)
        return trainer

    trainer = train()
    # A second Trainer joins the process group the first one made (and, under Lightning's launcher, the rank it
    # started): it launches nothing.
    return watch.again_without_agent(watch.taken(trainer.global_rank, global_step=trainer.global_step), train)


def run_fabric(args: argparse.Namespace, watch: Stopwatch) -> dict[str, Any]:
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy(args.strategy, "fabric"))
    fabric.launch()

    def train() -> int:  # one Fabric, a model and optimizer set up for each training
        model = tiny_gpt2()
        watch.record_losses(model)
        if args.strategy == "fsdp2":  # the optimizer is made over the sharded parameters
            model = fabric.setup_module(model)
            optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
        else:
            model, optimizer = fabric.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        watch.time_forwards(model)  # Fabric's _FabricModule, around DDP or the sharded model
        steps = 0
        for tokens in token_batches(args.steps, MICRO_BATCH, seed=1 + fabric.global_rank):
            loss = model(input_ids=tokens, labels=tokens).loss
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
        return steps

    steps = train()
    return watch.again_without_agent(watch.taken(fabric.global_rank, global_step=steps), train)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", choices=["trainer", "fabric"], required=True)
    parser.add_argument("--strategy", choices=["ddp", "fsdp2"], required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", required=True, help="where each rank writes its stopwatch: a {rank} template")
    args = parser.parse_args()
    args.root = str(Path(args.out).parent / "lightning")

    watch = Stopwatch()
    watch.time_updates()
    watch.time_backwards()
    write(args.out, (run_trainer if args.api == "trainer" else run_fabric)(args, watch))
    teardown()


if __name__ == "__main__":
    main()
