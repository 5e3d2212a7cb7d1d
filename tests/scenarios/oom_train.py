"""A small FSDP2 (or DDP) training loop shaped to exercise the OOM forecast (tests/test_oom.py).

    zeromon run --out runs/leak -- torchrun --nproc-per-node 2 tests/scenarios/oom_train.py --leak-mb 8
    zeromon run --out runs/spike -- torchrun --nproc-per-node 2 tests/scenarios/oom_train.py \
        --wrap ddp --width 2048 --layers 8

A stack of bias-free Linear layers trained with AdamW on random data, each layer its own FSDP2 unit
(``--wrap fsdp2``) or the whole stack in DDP (``--wrap ddp``, gradients as views of its buckets, so
they are not held twice).
- ``--leak-mb N``: every step keeps N MiB more alive (filled tensors appended to a list, the way a
  loop that keeps its losses or outputs without ``.item()``/``.detach()`` leaks).
- ``--width``/``--layers``: the parameters. Adam's two moments are twice the rank's parameter shard
  and appear only at the first ``optimizer.step()``; with wide layers and a tiny batch they are the
  largest thing the run allocates.

With FSDP2 the model is built on the meta device and materialized after sharding, so no rank ever
holds the full model (which would leave freed-but-resident pages in the process's RSS).
Prints, from rank 0, one JSON line ``{"param_count": ..., "param_bytes": ...}`` (``param_bytes``: the
parameters this rank's optimizer updates).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from gloo_exit import leave
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel


def _layers(width: int, layers: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wrap", choices=("fsdp2", "ddp"), default="fsdp2")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--leak-mb", type=float, default=0.0, help="MiB kept alive per step")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model: nn.Module
    if args.wrap == "fsdp2":
        mesh = init_device_mesh("cpu", (world,))
        with torch.device("meta"):
            model = _layers(args.width, args.layers)
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        torch.manual_seed(rank)
        with torch.no_grad():
            for layer in model:
                assert isinstance(layer.weight, DTensor)
                nn.init.normal_(layer.weight.to_local(), std=args.width**-0.5)
    else:
        torch.manual_seed(0)
        model = DistributedDataParallel(_layers(args.width, args.layers), gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    kept: list[torch.Tensor] = []
    leak_numel = int(args.leak_mb * 2**20) // 4
    for step in range(args.steps):
        inputs = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(step))
        loss = model(inputs).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if leak_numel:
            kept.append(torch.ones(leak_numel))  # filled: its pages are resident

    if rank == 0:
        count = sum(p.numel() for p in model.parameters())
        # The bytes of parameters this rank's optimizer updates: its FSDP2 shards, or all of them.
        local = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
        param_bytes = sum(t.numel() * t.element_size() for t in local)
        print(json.dumps({"param_count": count, "param_bytes": param_bytes}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave()  # without the interpreter's finalization: gloo_exit.py
