"""Train TinyGPT with FSDP2 (`torch.distributed.fsdp.fully_shard`) on synthetic data.

    torchrun --nproc-per-node 2 examples/fsdp2_train.py --steps 5

Each Block is one FSDP2 unit (one all-gather of its parameters, one reduce-scatter of its
gradients); the root unit owns the embeddings, the final LayerNorm and the LM head.
"""

from __future__ import annotations

import argparse
import itertools
import math

import tinygpt
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, tinygpt.GPTConfig]:
    parser = tinygpt.build_arg_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="free the blocks' gathered parameters after forward and gather them again in "
        "backward (default: on)",
    )
    parser.add_argument(
        "--reshard-root",
        action="store_true",
        help="reshard the root unit after forward too (FSDP2's default keeps the root gathered, "
        "since backward needs it first)",
    )
    parser.add_argument(
        "--async-unshard",
        action="store_true",
        help="issue the parameter all-gathers with async_op=True (model._set_unshard_async_op)",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)",
    )
    parser.add_argument(
        "--prefetch",
        action="store_true",
        help="each block prefetches the next block's all-gather in forward",
    )
    parser.add_argument(
        "--replicate",
        type=int,
        default=1,
        help="hybrid sharding (HSDP): a 2-D mesh of this many replicas x world/replicas shards; the "
        "gradients are reduce-scattered in each shard group, then all-reduced across the replicas",
    )
    args, cfg = tinygpt.parse_common_args(parser, argv)
    if args.replicate < 1:
        parser.error("--replicate must be at least 1")
    return args, cfg


def padded_numel(param: torch.nn.Parameter, world_size: int) -> int:
    """Elements of `param` in FSDP2's all-gather: dim 0 padded up to a multiple of the world."""
    rows = math.ceil(param.shape[0] / world_size) * world_size
    return rows * (param.numel() // param.shape[0])


def main(argv: list[str] | None = None) -> None:
    args, cfg = parse_args(argv)
    env = tinygpt.dist_env_from_environ()
    tinygpt.init_process_group(env)
    try:
        train(args, env, cfg)
    finally:
        tinygpt.teardown()


def train(args: argparse.Namespace, env: tinygpt.DistEnv, cfg: tinygpt.GPTConfig) -> None:
    model = tinygpt.build_model(cfg, args.seed)
    count = tinygpt.param_count(model)
    unit_names = [n for n, m in model.named_modules() if isinstance(m, tinygpt.Block)] + [""]
    padded = {
        name: sum(padded_numel(p, env.world_size // args.replicate) for p in params)
        for name, params in tinygpt.params_by_unit(model, unit_names).items()
    }
    units = tinygpt.sharding_units(model, unit_names, padded)
    model.to(env.device)

    if env.world_size % args.replicate:
        raise SystemExit(f"--replicate {args.replicate} does not divide the world size {env.world_size}")
    shards = env.world_size // args.replicate
    mesh = (init_device_mesh(env.device.type, (env.world_size,)) if args.replicate == 1 else
            init_device_mesh(env.device.type, (args.replicate, shards), mesh_dim_names=("replicate", "shard")))
    compute_dtype = torch.bfloat16 if args.bf16 else torch.float32
    mp_policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if args.bf16
        else MixedPrecisionPolicy()
    )
    # Bottom-up: each block becomes its own unit before the root claims what is left.
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=args.reshard_after_forward, mp_policy=mp_policy)
    # None is FSDP2's default: False for the root, True for any other module.
    fully_shard(
        model,
        mesh=mesh,
        reshard_after_forward=True if args.reshard_root else None,
        mp_policy=mp_policy,
    )
    assert isinstance(model, FSDPModule)

    async_unshard = args.async_unshard and hasattr(model, "_set_unshard_async_op")
    if args.async_unshard and not async_unshard and env.rank == 0:
        print("warning: this torch has no FSDPModule._set_unshard_async_op; ignoring --async-unshard")
    if async_unshard:
        # A private API (torch 2.6+); it applies to every FSDP unit under the root.
        model._set_unshard_async_op(True)
    if args.prefetch:
        for block, next_block in itertools.pairwise(model.blocks):
            assert isinstance(block, FSDPModule) and isinstance(next_block, FSDPModule)
            block.set_modules_to_forward_prefetch([next_block])

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step_context = tinygpt.attach_zeromon(args.zeromon, model=model, optimizer=optimizer)

    def train_step(step: int) -> torch.Tensor:
        inputs, targets = tinygpt.synthetic_batch(
            cfg, args.batch, seed=args.seed, rank=env.rank, step=step, device=env.device
        )
        loss = model(inputs, targets)
        loss.backward()
        if args.clip_grad > 0:
            # The grads are DTensors: the norm needs one all-reduce across the mesh, issued as a
            # functional collective (_c10d_functional.all_reduce) that bypasses torch.distributed.*.
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    strategy = {
        "reshard_after_forward": args.reshard_after_forward,
        "root_reshard_after_forward": args.reshard_root,
        "async_unshard": async_unshard,
        "forward_prefetch": args.prefetch,
        "bf16": args.bf16,
        "clip_grad": args.clip_grad,
    }
    header = f"fsdp2 world={env.world_size} device={env.device} params={count:,} " + " ".join(
        f"{k}={v}" for k, v in strategy.items()
    )
    result = tinygpt.run_training(env, args.steps, train_step, step_context, header=header)

    summary = tinygpt.build_summary(
        framework="fsdp2",
        strategy=strategy,
        env=env,
        cfg=cfg,
        micro_batch=args.batch,
        result=result,
        param_count=count,
        # FSDP2 keeps fp32 shards and gathers (and computes) in param_dtype.
        param_dtype=torch.float32,
        compute_dtype=compute_dtype,
        # Sharded gradients come back in the parameters' own dtype (reduce_dtype is fp32).
        grad_dtype=torch.float32,
        reduce_dtype=torch.float32,
        units=units,
        optimizer=optimizer,
    )
    tinygpt.write_summary(args.summary_json, env.rank, summary)


if __name__ == "__main__":
    main()
